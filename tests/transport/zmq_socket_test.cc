// ZmqNetwork: real sockets over tcp loopback and ipc. Round trips, reported
// endpoints, zero-copy receive by address, bad input from a raw ZeroMQ peer
// (the socket keeps serving), polling several sockets, concurrent senders,
// backpressure with deadlines, PUB/SUB.
#include <zmq.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include <capnp/schema.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::transport {
namespace {

using testing::EchoText;
using testing::MakeEcho;
using testing::TempDir;

std::unique_ptr<Network> MakeNet(const std::string& actor) {
  ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  auto n = NewZmqNetwork(o);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return std::move(n).value();
}

SocketOptions Client(const std::string& id) {
  SocketOptions o;
  o.identity = id;
  return o;
}

Result<Incoming> RecvGood(Socket& s, int64_t ms = 10000) {
  return s.Recv(Deadline::InMs(ms));
}

class ZmqTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Endpoint() {
    if (GetParam() == "tcp") return "tcp://127.0.0.1:0";
    return dir_.Ipc("server");
  }
  TempDir dir_;
};

TEST_P(ZmqTest, RoundTripAndReply) {
  auto net = MakeNet("srv");
  auto server = net->Bind(SocketKind::kServer, Endpoint());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string ep = (*server)->endpoint();
  if (GetParam() == "tcp") {
    EXPECT_EQ(ep.rfind("tcp://127.0.0.1:", 0), 0u);
    EXPECT_NE(ep, "tcp://127.0.0.1:0");
  }
  auto cnet = MakeNet("cli");
  auto client = cnet->Connect(SocketKind::kClient, ep, Client("client-1"));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Send(MakeEcho("ping", 10), Deadline::InMs(5000)).ok());
  auto in = RecvGood(**server);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->peer, "client-1");
  EXPECT_EQ(EchoText(in->message), "ping");
  EXPECT_EQ(in->message.sender(), "cli");
  EXPECT_EQ(in->message.incarnation(), cnet->identity().incarnation);
  ASSERT_TRUE((*server)->SendTo(in->peer, MakeEcho("pong"), Deadline::InMs(5000)).ok());
  auto back = RecvGood(**client);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EchoText(back->message), "pong");
  EXPECT_EQ(back->message.sender(), "srv");
  // Unknown peer: an error, never a silent drop.
  Status st = (*server)->SendTo("nobody", MakeEcho("x"), Deadline::InMs(100));
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("no connected peer 'nobody'"), std::string::npos);
  // Wrong-kind calls are errors.
  EXPECT_EQ((*server)->Send(MakeEcho("x"), Deadline::Now()).code(), Code::kInvalidArgument);
  EXPECT_EQ((*client)->Subscribe("t").code(), Code::kInvalidArgument);
}

TEST_P(ZmqTest, ReceivedTensorIsAViewOverTheFrame) {
  auto net = MakeNet("srv");
  auto server = net->Bind(SocketKind::kServer, Endpoint());
  ASSERT_TRUE(server.ok());
  auto client = net->Connect(SocketKind::kClient, (*server)->endpoint(), Client("c"));
  ASSERT_TRUE(client.ok());
  const size_t n = (1 << 20) + 3;  // 4 MiB + 12 bytes of int32
  ASSERT_TRUE((*client)->Send(MakeEcho("big", n, 11), Deadline::InMs(5000)).ok());
  auto in = RecvGood(**server);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto t = ReadTensor(in->message.envelope().getBody().getEcho().getPayload(), "payload");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->numel, static_cast<int64_t>(n));
  EXPECT_EQ(t->as<int32_t>()[n - 1], 11 + static_cast<int32_t>(n - 1));
  // The tensor's bytes lie inside one of the received ZeroMQ frames, and no
  // segment was copied on the way.
  bool inside = false;
  const char* p = static_cast<const char*>(t->data);
  for (const auto& f : in->message.frames()) {
    const char* b = static_cast<const char*>(f.data);
    if (p >= b && p + t->bytes <= b + f.size) inside = true;
  }
  EXPECT_TRUE(inside) << "tensor data is not inside any received frame";
  // Only the small root segment may have been copied (ZeroMQ carves small
  // frames out of its receive buffer at unaligned offsets); never the tensor.
  EXPECT_LE(in->message.copied_segments(), 1u);
  EXPECT_LT(net->counters().unaligned_copy_bytes.load(), 4096u);
}

INSTANTIATE_TEST_SUITE_P(Transports, ZmqTest, ::testing::Values("tcp", "ipc"));

// ---------------------------------------------------------------- bad input

// A raw ZeroMQ DEALER that sends arbitrary frames.
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) {
    ctx_ = zmq_ctx_new();
    s_ = zmq_socket(ctx_, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s_, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s_, ZMQ_ROUTING_ID, "raw", 3);
    EXPECT_EQ(zmq_connect(s_, endpoint.c_str()), 0);
  }
  ~RawClient() {
    zmq_close(s_);
    zmq_ctx_term(ctx_);
  }
  void Send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      ASSERT_GE(
          zmq_send(s_, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0),
          0);
    }
  }

 private:
  void* ctx_;
  void* s_;
};

// The frames of a sealed message as strings.
std::vector<std::string> FramesOf(const OutMessage& m) {
  m.Seal(SealInfo{"raw", 1});
  std::vector<std::string> out(1);
  EncodeHeader(m, 0, &out[0]);
  for (auto s : Segments(m)) out.emplace_back(static_cast<const char*>(s.data), s.size);
  return out;
}

TEST(ZmqBadInput, EveryCaseIsRejectedCountedAndTheSocketKeepsServing) {
  auto net = MakeNet("srv");
  SocketOptions so;
  so.limits.max_message_bytes = 256 * 1024;
  so.limits.traversal_limit_words = 1 << 20;
  auto server = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0", so);
  ASSERT_TRUE(server.ok());
  RawClient raw((*server)->endpoint());
  std::mt19937_64 rng(testing::TestSeed());

  auto good = FramesOf(MakeEcho("good"));
  std::string junk(64, '\0');
  for (auto& c : junk) c = static_cast<char>(rng());
  junk[0] = 'J';  // never the magic
  auto wrong_version = FramesOf(MakeEcho("v"));
  {
    // Patch schemaVersion (first two bytes of the root struct's data).
    uint16_t v = wire::SCHEMA_VERSION + 1;
    std::memcpy(&wrong_version[1][8], &v, 2);
  }
  auto unknown_kind = FramesOf(MakeEcho("k"));
  {
    auto body = capnp::Schema::from<wire::Envelope::Body>();
    uint16_t k = 250;
    std::memcpy(&unknown_kind[1][8 + 2 * body.getProto().getStruct().getDiscriminantOffset()], &k,
                2);
  }
  auto too_big = FramesOf(MakeEcho("big", 100000));
  auto past_end = FramesOf(MakeEcho("p"));
  {
    uint32_t words;
    std::memcpy(&words, &past_end[0][kHeaderFixedBytes], 4);
    words += 7;
    std::memcpy(&past_end[0][kHeaderFixedBytes], &words, 4);
  }
  auto truncated = FramesOf(MakeEcho("t"));
  truncated[1].resize(truncated[1].size() / 2);

  struct Case {
    const char* name;
    std::vector<std::string> frames;
    RejectReason reason;
    const char* needle;
  };
  std::vector<Case> cases = {
      {"one frame", {good[0]}, RejectReason::kTruncated, "1 frame(s)"},
      {"random bytes", {junk, junk}, RejectReason::kBadMagic, "not a Troupe message"},
      {"wrong schema version", wrong_version, RejectReason::kSchemaVersion, "schema version"},
      {"unknown kind", unknown_kind, RejectReason::kUnknownKind, "unknown message kind"},
      {"over the size limit", too_big, RejectReason::kTooLarge, "over the limit of 262144 bytes"},
      {"segment table past the end", past_end, RejectReason::kSegmentTable, "points past the end"},
      {"truncated segment", truncated, RejectReason::kSegmentTable, "points past the end"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t before = net->counters().rejected_count(c.reason);
    raw.Send(c.frames);
    raw.Send(good);
    auto bad = RecvGood(**server);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(IsBadInput(bad.status())) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find(c.needle), std::string::npos) << bad.status().ToString();
    EXPECT_NE(bad.status().message().find("from raw"), std::string::npos)
        << bad.status().ToString();
    EXPECT_EQ(net->counters().rejected_count(c.reason), before + 1);
    auto next = RecvGood(**server);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(EchoText(next->message), "good");
  }
  EXPECT_EQ(net->counters().rejected_total(), cases.size());
}

// ---------------------------------------------------------------- threads, polling

TEST(ZmqSockets, ConcurrentSendersKeepPerThreadOrder) {
  auto net = MakeNet("srv");
  auto server = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  auto client = net->Connect(SocketKind::kClient, (*server)->endpoint(), Client("c"));
  ASSERT_TRUE(client.ok());
  const int kThreads = 4, kPer = 300;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        if (!(*client)->Send(MakeEcho(fmt::format("{}:{}", t, i)), Deadline::InMs(10000)).ok()) {
          ++failures;
        }
      }
    });
  }
  std::map<int, int> next;
  for (int k = 0; k < kThreads * kPer; ++k) {
    auto in = RecvGood(**server);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    int t, i;
    ASSERT_EQ(std::sscanf(EchoText(in->message).c_str(), "%d:%d", &t, &i), 2);
    EXPECT_EQ(i, next[t]) << "thread " << t << " out of order";
    next[t] = i + 1;
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ZmqSockets, ReceiverBlockedInRecvWakesForAnotherThreadsSend) {
  // Both directions on one client socket: a thread blocks in Recv while the
  // main thread sends on the same socket.
  auto net = MakeNet("n");
  auto server = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  auto client = net->Connect(SocketKind::kClient, (*server)->endpoint(), Client("c"));
  ASSERT_TRUE(client.ok());
  const int kRounds = 200;
  std::thread echo([&] {
    for (int i = 0; i < kRounds; ++i) {
      auto in = (*server)->Recv(Deadline::InMs(10000));
      if (!in.ok()) return;
      (void)(*server)->SendTo(in->peer, MakeEcho(EchoText(in->message)), Deadline::InMs(5000));
    }
  });
  std::atomic<int> got{0};
  std::thread reader([&] {
    for (int i = 0; i < kRounds; ++i) {
      auto in = (*client)->Recv(Deadline::InMs(10000));
      if (!in.ok()) return;
      ++got;
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE((*client)->Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  }
  reader.join();
  echo.join();
  EXPECT_EQ(got.load(), kRounds);
}

TEST(ZmqSockets, PollerWaitsOnSeveralSocketsAndWakes) {
  auto net = MakeNet("n");
  auto a = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  auto b = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(a.ok() && b.ok());
  auto ca = net->Connect(SocketKind::kClient, (*a)->endpoint(), Client("ca"));
  auto cb = net->Connect(SocketKind::kClient, (*b)->endpoint(), Client("cb"));
  ASSERT_TRUE(ca.ok() && cb.ok());
  auto poller = net->NewPoller();
  poller->Add(a->get());
  poller->Add(b->get());
  auto none = poller->Wait(Deadline::InMs(20));
  EXPECT_EQ(none.status().code(), Code::kTimeout);
  ASSERT_TRUE((*cb)->Send(MakeEcho("to-b"), Deadline::InMs(1000)).ok());
  auto ready = poller->Wait(Deadline::InMs(10000));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ASSERT_EQ(ready->size(), 1u);
  EXPECT_EQ((*ready)[0], b->get());
  auto in = (*ready)[0]->Recv(Deadline::Now());
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(EchoText(in->message), "to-b");
  // Wake from another thread returns an empty set.
  std::thread waker([&] { poller->Wake(); });
  auto woke = poller->Wait(Deadline::InMs(10000));
  waker.join();
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_TRUE(woke->empty());
}

TEST(ZmqSockets, FullQueueBlocksUntilTheDeadline) {
  auto net = MakeNet("n");
  TempDir dir;
  SocketOptions o = Client("c");
  o.send_hwm = 2;
  // Nobody is bound there: messages queue in the client up to the HWM.
  auto client = net->Connect(SocketKind::kClient, dir.Ipc("nobody"), o);
  ASSERT_TRUE(client.ok());
  int sent = 0;
  Status st;
  for (int i = 0; i < 10 && st.ok(); ++i) {
    st = (*client)->Send(MakeEcho("x"), Deadline::InMs(50));
    if (st.ok()) ++sent;
  }
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("send_hwm 2"), std::string::npos) << st.message();
  EXPECT_GE(sent, 2);
  EXPECT_LE(sent, 4);
}

TEST(ZmqSockets, PubSubFiltersByTopic) {
  auto net = MakeNet("learner");
  auto pub = net->Bind(SocketKind::kPublisher, "tcp://127.0.0.1:0");
  ASSERT_TRUE(pub.ok());
  SocketOptions so;
  so.topics = {"version"};
  auto sub = net->Connect(SocketKind::kSubscriber, (*pub)->endpoint(), so);
  ASSERT_TRUE(sub.ok());
  // Subscriptions propagate asynchronously: publish until one arrives.
  Result<Incoming> in = Timeout("none");
  for (int i = 0; i < 500 && !in.ok(); ++i) {
    ASSERT_TRUE((*pub)->SendTo("other", MakeEcho("wrong topic"), Deadline::InMs(100)).ok());
    ASSERT_TRUE((*pub)->SendTo("version", MakeEcho("v"), Deadline::InMs(100)).ok());
    in = (*sub)->Recv(Deadline::InMs(20));
  }
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->peer, "version");
  EXPECT_EQ(EchoText(in->message), "v");
}

TEST(ZmqSockets, BadOptionsAndEndpointsAreErrors) {
  auto net = MakeNet("n");
  auto r = net->Bind(SocketKind::kServer, "http://x");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  r = net->Connect(SocketKind::kClient, "tcp://127.0.0.1:1", SocketOptions{});
  EXPECT_NE(r.status().message().find("identity"), std::string::npos) << r.status().ToString();
  r = net->Bind(SocketKind::kClient, "tcp://127.0.0.1:0");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  r = net->Bind(SocketKind::kServer, "ipc:///" + std::string(200, 'x'));
  EXPECT_NE(r.status().message().find("107-byte"), std::string::npos) << r.status().ToString();
  auto a = net->Bind(SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  auto dup = net->Bind(SocketKind::kServer, (*a)->endpoint());
  EXPECT_EQ(dup.status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace troupe::transport
