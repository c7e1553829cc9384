// CURVE: per-job keys, Z85 helpers, and a server that talks to the keyed
// client while refusing a plain client, a client with an unknown key and a
// client that has the wrong server key (each refusal is observed in the
// server's counters, and nothing from those clients ever arrives).
#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/transport/curve.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::transport {
namespace {

using testing::EchoText;
using testing::MakeEcho;

TEST(Curve, KeysAndZ85) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  auto kp = GenerateCurveKeyPair();
  ASSERT_TRUE(kp.ok());
  EXPECT_EQ(kp->public_key.size(), 40u);
  EXPECT_TRUE(kp->Validate().ok());
  auto pub = CurvePublicKey(kp->secret_key);
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(*pub, kp->public_key);
  auto other = GenerateCurveKeyPair();
  ASSERT_TRUE(other.ok());
  CurveKeyPair mixed{kp->public_key, other->secret_key};
  EXPECT_NE(mixed.Validate().message().find("does not belong"), std::string::npos);
  CurveKeyPair short_key{"abc", kp->secret_key};
  EXPECT_NE(short_key.Validate().message().find("40 Z85 characters"), std::string::npos);
  auto raw = Z85Decode(kp->public_key);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 32u);
  auto back = Z85Encode(*raw);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, kp->public_key);
  EXPECT_FALSE(Z85Encode("abc").ok());
  EXPECT_FALSE(Z85Decode("abcd").ok());
  CurveOptions opts;
  opts.enabled = true;
  EXPECT_FALSE(opts.Validate().ok());  // no server key
}

struct Job {
  CurveKeyPair server, client;
};

std::unique_ptr<Network> CurveNet(const std::string& actor, const CurveOptions& curve) {
  ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  o.curve = curve;
  auto n = NewZmqNetwork(o);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? std::move(n).value() : nullptr;
}

// Receives until `counter` exceeds `before` (the refusal was observed),
// failing if any message arrives meanwhile.
void ExpectRefusal(Socket& server, const std::atomic<uint64_t>& counter, uint64_t before,
                   const char* what) {
  auto deadline = Deadline::InMs(20000);
  while (counter.load() <= before && !deadline.expired()) {
    auto in = server.Recv(Deadline::InMs(50));
    EXPECT_FALSE(in.ok()) << what
                          << ": a refused client's message arrived: " << EchoText(in->message);
  }
  EXPECT_GT(counter.load(), before) << what << ": refusal not observed";
}

TEST(Curve, KeyedClientWorksOthersAreRefused) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  Job job{*GenerateCurveKeyPair(), *GenerateCurveKeyPair()};
  CurveOptions server_opts;
  server_opts.enabled = true;
  server_opts.server = job.server;
  server_opts.allowed_client_public_keys = {job.client.public_key};
  auto sn = CurveNet("learner", server_opts);
  ASSERT_NE(sn, nullptr);
  auto server = sn->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string ep = (*server)->endpoint();
  SocketOptions co;
  co.identity = "client";
  co.reconnect_ivl_ms = 50;

  // 1. A plain (unencrypted) client: refused at the handshake.
  {
    auto plain = CurveNet("plain", CurveOptions{});
    auto c = plain->Connect(SocketKind::kClient, ep, co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Send(MakeEcho("plain"), Deadline::InMs(1000)).ok());
    ExpectRefusal(**server, sn->counters().handshake_failures, 0, "plain client");
  }
  // 2. A client that knows the server's public key but has its own keypair:
  //    the ZAP handler denies it.
  {
    CurveOptions stranger;
    stranger.enabled = true;
    stranger.server.public_key = job.server.public_key;
    stranger.client = *GenerateCurveKeyPair();
    auto net = CurveNet("stranger", stranger);
    auto c = net->Connect(SocketKind::kClient, ep, co);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Send(MakeEcho("stranger"), Deadline::InMs(1000)).ok());
    ExpectRefusal(**server, sn->counters().auth_denied, 0, "unknown client key");
  }
  // 3. A client with the right client keys but the wrong server key.
  {
    CurveOptions wrong;
    wrong.enabled = true;
    wrong.server.public_key = GenerateCurveKeyPair()->public_key;
    wrong.client = job.client;
    auto net = CurveNet("wrong-server-key", wrong);
    auto c = net->Connect(SocketKind::kClient, ep, co);
    ASSERT_TRUE(c.ok());
    const uint64_t before = sn->counters().handshake_failures.load();
    ASSERT_TRUE((*c)->Send(MakeEcho("wrong"), Deadline::InMs(1000)).ok());
    ExpectRefusal(**server, sn->counters().handshake_failures, before, "wrong server key");
  }
  // 4. The keyed client: encrypted round trip both ways.
  CurveOptions keyed;
  keyed.enabled = true;
  keyed.server.public_key = job.server.public_key;
  keyed.client = job.client;
  auto cn = CurveNet("rollout", keyed);
  auto c = cn->Connect(SocketKind::kClient, ep, co);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("secret batch", 4096), Deadline::InMs(1000)).ok());
  auto in = (*server)->Recv(Deadline::InMs(20000));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(EchoText(in->message), "secret batch");
  EXPECT_EQ(in->message.sender(), "rollout");
  ASSERT_TRUE((*server)->SendTo(in->peer, MakeEcho("ack"), Deadline::InMs(1000)).ok());
  auto back = (*c)->Recv(Deadline::InMs(20000));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EchoText(back->message), "ack");
}

TEST(Curve, BindingWithoutTheServerSecretIsAnError) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  CurveOptions client_only;
  client_only.enabled = true;
  client_only.server.public_key = GenerateCurveKeyPair()->public_key;
  client_only.client = *GenerateCurveKeyPair();
  auto net = CurveNet("c", client_only);
  auto r = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("curve.server.secret_key"), std::string::npos);
}

}  // namespace
}  // namespace troupe::transport
