// One suite, three transports: ZeroMQ over tcp, ZeroMQ over ipc, and the
// in-memory network must behave the same (routing by identity, queueing
// before a server exists, server restart, client handover, polling, PUB/SUB),
// and the fault-injection decorator must work over each.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/transport/fault_injection.h"
#include "troupe/transport/memory_network.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::transport {
namespace {

using testing::EchoText;
using testing::MakeEcho;
using testing::TempDir;

// Makes networks (one per actor) and endpoints for one transport.
class Env {
 public:
  explicit Env(std::string kind) : kind_(std::move(kind)) {}
  std::unique_ptr<Network> Net(const std::string& actor) {
    if (kind_ == "memory") return fabric_.NewNetwork(NetworkIdentity{actor, 0});
    ZmqNetworkOptions o;
    o.identity.actor_id = actor;
    auto n = NewZmqNetwork(o);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return std::move(n).value();
  }
  // A fresh endpoint to bind ("port 0" for tcp).
  std::string Fresh() {
    if (kind_ == "tcp") return "tcp://127.0.0.1:0";
    if (kind_ == "ipc") return dir_.Ipc("s" + std::to_string(n_++));
    return "mem://s" + std::to_string(n_++);
  }
  // An endpoint that can be bound again after its server dies.
  std::string Reusable() {
    if (kind_ == "memory") return "mem://r" + std::to_string(n_++);
    return dir_.Ipc("r" + std::to_string(n_++));
  }
  MemoryFabric& fabric() { return fabric_; }
  bool memory() const { return kind_ == "memory"; }

 private:
  std::string kind_;
  MemoryFabric fabric_;
  TempDir dir_;
  int n_ = 0;
};

SocketOptions Id(const std::string& id) {
  SocketOptions o;
  o.identity = id;
  return o;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  Conformance() : env_(GetParam()) {}
  Env env_;
};

TEST_P(Conformance, RoutesByIdentityAndReplies) {
  auto sn = env_.Net("server");
  auto server = sn->Bind(SocketKind::kServer, env_.Fresh());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto cn = env_.Net("clients");
  auto a = cn->Connect(SocketKind::kClient, (*server)->endpoint(), Id("a"));
  auto b = cn->Connect(SocketKind::kClient, (*server)->endpoint(), Id("b"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Send(MakeEcho("from-a"), Deadline::InMs(5000)).ok());
  ASSERT_TRUE((*b)->Send(MakeEcho("from-b"), Deadline::InMs(5000)).ok());
  std::map<std::string, std::string> got;
  for (int i = 0; i < 2; ++i) {
    auto in = (*server)->Recv(Deadline::InMs(10000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    got[in->peer] = EchoText(in->message);
  }
  EXPECT_EQ(got["a"], "from-a");
  EXPECT_EQ(got["b"], "from-b");
  ASSERT_TRUE((*server)->SendTo("b", MakeEcho("to-b"), Deadline::InMs(5000)).ok());
  auto rb = (*b)->Recv(Deadline::InMs(10000));
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(EchoText(rb->message), "to-b");
  EXPECT_EQ(rb->peer, "");
  EXPECT_EQ((*a)->Recv(Deadline::InMs(20)).status().code(), Code::kTimeout);
  EXPECT_EQ((*server)->SendTo("c", MakeEcho("x"), Deadline::InMs(100)).code(), Code::kUnavailable);
  EXPECT_EQ(sn->counters().messages_received.load(), 2u);
  EXPECT_EQ(cn->counters().messages_sent.load(), 2u);
}

TEST_P(Conformance, ClientQueuesUntilAServerBinds) {
  const std::string ep = env_.Reusable();
  auto cn = env_.Net("client");
  auto c = cn->Connect(SocketKind::kClient, ep, Id("early"));
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*c)->Send(MakeEcho("m" + std::to_string(i)), Deadline::InMs(1000)).ok());
  }
  auto sn = env_.Net("server");
  auto server = sn->Bind(SocketKind::kServer, ep);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  for (int i = 0; i < 3; ++i) {
    auto in = (*server)->Recv(Deadline::InMs(10000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    EXPECT_EQ(EchoText(in->message), "m" + std::to_string(i));
  }
}

TEST_P(Conformance, AServerRestartedAtTheSameEndpointGetsNewMessages) {
  const std::string ep = env_.Reusable();
  auto cn = env_.Net("client");
  auto c = cn->Connect(SocketKind::kClient, ep, Id("c"));
  ASSERT_TRUE(c.ok());
  {
    auto sn = env_.Net("server-1");
    auto server = sn->Bind(SocketKind::kServer, ep);
    ASSERT_TRUE(server.ok());
    ASSERT_TRUE((*c)->Send(MakeEcho("first"), Deadline::InMs(1000)).ok());
    auto in = (*server)->Recv(Deadline::InMs(10000));
    ASSERT_TRUE(in.ok());
    EXPECT_EQ(EchoText(in->message), "first");
  }
  auto sn = env_.Net("server-2");
  auto server = sn->Bind(SocketKind::kServer, ep);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // The client reconnects by itself; a message may be lost in the gap (that is
  // what reliable delivery is for), so resend until one arrives.
  Result<Incoming> in = Timeout("none");
  for (int i = 0; i < 100 && !in.ok(); ++i) {
    ASSERT_TRUE((*c)->Send(MakeEcho("second"), Deadline::InMs(1000)).ok());
    in = (*server)->Recv(Deadline::InMs(100));
  }
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(EchoText(in->message), "second");
  EXPECT_EQ(in->message.sender(), "client");
}

TEST_P(Conformance, ARestartedClientWithTheSameIdentityTakesOver) {
  auto sn = env_.Net("server");
  auto server = sn->Bind(SocketKind::kServer, env_.Fresh());
  ASSERT_TRUE(server.ok());
  const std::string ep = (*server)->endpoint();
  {
    auto cn = env_.Net("rollout-0");
    auto c = cn->Connect(SocketKind::kClient, ep, Id("rollout-0"));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->Send(MakeEcho("old"), Deadline::InMs(1000)).ok());
    ASSERT_TRUE((*server)->Recv(Deadline::InMs(10000)).ok());
  }
  auto cn = env_.Net("rollout-0");
  auto c = cn->Connect(SocketKind::kClient, ep, Id("rollout-0"));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("new"), Deadline::InMs(1000)).ok());
  auto in = (*server)->Recv(Deadline::InMs(10000));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(EchoText(in->message), "new");
  EXPECT_EQ(in->message.incarnation(), cn->identity().incarnation);
  ASSERT_TRUE((*server)->SendTo("rollout-0", MakeEcho("reply"), Deadline::InMs(1000)).ok());
  auto r = (*c)->Recv(Deadline::InMs(10000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(EchoText(r->message), "reply");
}

TEST_P(Conformance, PollerReportsReadableSocketsAndWakes) {
  auto n = env_.Net("n");
  auto s1 = n->Bind(SocketKind::kServer, env_.Fresh());
  auto s2 = n->Bind(SocketKind::kServer, env_.Fresh());
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto c2 = n->Connect(SocketKind::kClient, (*s2)->endpoint(), Id("c2"));
  ASSERT_TRUE(c2.ok());
  auto poller = n->NewPoller();
  poller->Add(s1->get());
  poller->Add(s2->get());
  EXPECT_EQ(poller->Wait(Deadline::InMs(10)).status().code(), Code::kTimeout);
  std::thread sender([&] { (void)(*c2)->Send(MakeEcho("hi"), Deadline::InMs(5000)); });
  auto ready = poller->Wait(Deadline::InMs(10000));
  sender.join();
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ASSERT_EQ(ready->size(), 1u);
  EXPECT_EQ((*ready)[0], s2->get());
  ASSERT_TRUE((*ready)[0]->Recv(Deadline::Now()).ok());
  poller->Wake();
  auto woke = poller->Wait(Deadline::InMs(10000));
  ASSERT_TRUE(woke.ok());
  EXPECT_TRUE(woke->empty());
  poller->Remove(s1->get());
  poller->Remove(s2->get());
}

TEST_P(Conformance, PublisherReachesMatchingSubscribers) {
  auto n = env_.Net("learner");
  auto pub = n->Bind(SocketKind::kPublisher, env_.Fresh());
  ASSERT_TRUE(pub.ok());
  SocketOptions so;
  so.topics = {"policy"};
  auto sub = n->Connect(SocketKind::kSubscriber, (*pub)->endpoint(), so);
  ASSERT_TRUE(sub.ok());
  Result<Incoming> in = Timeout("none");
  for (int i = 0; i < 500 && !in.ok(); ++i) {
    ASSERT_TRUE((*pub)->SendTo("other", MakeEcho("no"), Deadline::InMs(100)).ok());
    ASSERT_TRUE((*pub)->SendTo("policy", MakeEcho("yes"), Deadline::InMs(100)).ok());
    in = (*sub)->Recv(Deadline::InMs(20));
  }
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->peer, "policy");
  EXPECT_EQ(EchoText(in->message), "yes");
}

TEST_P(Conformance, FaultInjectorDropsDuplicatesDelaysFailsAndKills) {
  auto inner_s = env_.Net("server");
  auto inner_c = env_.Net("client");
  FaultInjectingNetwork faulty(inner_c.get());
  auto server = inner_s->Bind(SocketKind::kServer, env_.Fresh());
  ASSERT_TRUE(server.ok());
  auto c = faulty.Connect(SocketKind::kClient, (*server)->endpoint(), Id("c"));
  ASSERT_TRUE(c.ok());
  auto recv_text = [&](int64_t ms) -> std::string {
    auto in = (*server)->Recv(Deadline::InMs(ms));
    return in.ok() ? EchoText(in->message) : "<" + std::string(CodeName(in.status().code())) + ">";
  };
  faulty.DropNext(1);
  ASSERT_TRUE((*c)->Send(MakeEcho("dropped"), Deadline::InMs(1000)).ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("kept"), Deadline::InMs(1000)).ok());
  EXPECT_EQ(recv_text(10000), "kept");
  faulty.DuplicateNext(1);
  ASSERT_TRUE((*c)->Send(MakeEcho("twice"), Deadline::InMs(1000)).ok());
  EXPECT_EQ(recv_text(10000), "twice");
  EXPECT_EQ(recv_text(10000), "twice");
  faulty.FailNext(1);
  EXPECT_EQ((*c)->Send(MakeEcho("fail"), Deadline::InMs(1000)).code(), Code::kUnavailable);
  // A delayed message is overtaken by a later one.
  faulty.DelayNext(1, 50);
  ASSERT_TRUE((*c)->Send(MakeEcho("late"), Deadline::InMs(1000)).ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("early"), Deadline::InMs(1000)).ok());
  EXPECT_EQ(recv_text(10000), "early");
  EXPECT_EQ(recv_text(10000), "late");
  // Named hook: drop every message whose text starts with "secret".
  faulty.SetHook("no-secrets", [](const SendEvent& ev) {
    if (ev.envelope.getBody().isEcho() &&
        std::string(ev.envelope.getBody().getEcho().getText().cStr()).rfind("secret", 0) == 0) {
      return FaultAction::Drop();
    }
    return FaultAction::Pass();
  });
  ASSERT_TRUE((*c)->Send(MakeEcho("secret-1"), Deadline::InMs(1000)).ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("public"), Deadline::InMs(1000)).ok());
  EXPECT_EQ(recv_text(10000), "public");
  faulty.RemoveHook("no-secrets");
  // Killing the server's endpoint blackholes everything to it.
  faulty.KillPeer((*server)->endpoint());
  ASSERT_TRUE((*c)->Send(MakeEcho("void"), Deadline::InMs(1000)).ok());
  faulty.RevivePeer((*server)->endpoint());
  ASSERT_TRUE((*c)->Send(MakeEcho("back"), Deadline::InMs(1000)).ok());
  EXPECT_EQ(recv_text(10000), "back");
  auto st = faulty.stats();
  EXPECT_EQ(st.dropped, 2u);
  EXPECT_EQ(st.duplicated, 1u);
  EXPECT_EQ(st.delayed, 1u);
  EXPECT_EQ(st.failed, 1u);
  EXPECT_EQ(st.killed_out, 1u);
  EXPECT_EQ((*server)->Recv(Deadline::InMs(20)).status().code(), Code::kTimeout);
}

TEST(MemoryNetwork, CrashLosesQueuedMessagesAndFailsLaterSends) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"reward-0", 0});
  auto cn = fabric.NewNetwork({"rollout-0", 0});
  auto server = sn->Bind(SocketKind::kServer, "tcp://10.0.0.1:0");
  ASSERT_TRUE(server.ok());
  EXPECT_NE((*server)->endpoint(), "tcp://10.0.0.1:0");  // a fake port was assigned
  auto c = cn->Connect(SocketKind::kClient, (*server)->endpoint(), Id("rollout-0"));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Send(MakeEcho("queued"), Deadline::InMs(100)).ok());
  EXPECT_EQ(fabric.live_sockets(), 2u);
  EXPECT_EQ(fabric.Crash("reward-0"), 1u);
  EXPECT_EQ((*server)->Recv(Deadline::InMs(10)).status().code(), Code::kUnavailable);
  EXPECT_EQ(fabric.live_sockets(), 1u);
  // With the server gone the client queues again (ZeroMQ semantics).
  ASSERT_TRUE((*c)->Send(MakeEcho("later"), Deadline::InMs(100)).ok());
  auto sn2 = fabric.NewNetwork({"reward-0", 0});
  auto server2 = sn2->Bind(SocketKind::kServer, (*server)->endpoint());
  ASSERT_TRUE(server2.ok()) << server2.status().ToString();
  auto in = (*server2)->Recv(Deadline::InMs(1000));
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(EchoText(in->message), "later");
  EXPECT_EQ(fabric.Unbind("mem://none").code(), Code::kNotFound);
}

TEST(MemoryNetwork, BoundedQueuesBlockSendersUntilTheDeadline) {
  MemoryFabric fabric;
  auto n = fabric.NewNetwork({"n", 0});
  auto server = n->Bind(SocketKind::kServer, "mem://s");
  ASSERT_TRUE(server.ok());
  SocketOptions o = Id("c");
  o.send_hwm = 3;
  auto c = n->Connect(SocketKind::kClient, "mem://s", o);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*c)->Send(MakeEcho("x"), Deadline::InMs(100)).ok());
  Status st = (*c)->Send(MakeEcho("x"), Deadline::InMs(20));
  EXPECT_EQ(st.code(), Code::kTimeout);
  // Receiving one frees a slot for a blocked sender.
  std::thread t([&] { st = (*c)->Send(MakeEcho("y"), Deadline::InMs(10000)); });
  ASSERT_TRUE((*server)->Recv(Deadline::InMs(1000)).ok());
  t.join();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(MemoryNetwork, TensorsArriveByReference) {
  MemoryFabric fabric;
  auto n = fabric.NewNetwork({"n", 0});
  auto server = n->Bind(SocketKind::kServer, "mem://s");
  auto c = n->Connect(SocketKind::kClient, "mem://s", Id("c"));
  ASSERT_TRUE(server.ok() && c.ok());
  OutMessage m = MakeEcho("t", 50000, 3);
  const void* sent = m.reader().getBody().getEcho().getPayload().getData().begin();
  ASSERT_TRUE((*c)->Send(m, Deadline::InMs(100)).ok());
  auto in = (*server)->Recv(Deadline::InMs(1000));
  ASSERT_TRUE(in.ok());
  auto t = ReadTensor(in->message.envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data, sent);
}

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::Values("tcp", "ipc", "memory"));

}  // namespace
}  // namespace troupe::transport
