// The broadcast protocol over transport::MemoryNetwork and
// FaultInjectingNetwork: the learner and its receivers are actors of one
// in-process MemoryFabric (each its own network), so faults are injected with
// the transport's own decorator, exactly as the data path is tested:
//
//   * every backend runs unchanged on the memory network (gloo's pairs still
//     use loopback TCP; its rendezvous is a transport socket like the rest);
//   * a dropped chunk is a gap the receiver reports, and the retry repairs it;
//   * an acknowledgement delayed past the timeout fails an attempt without
//     losing the member; one delayed within it costs nothing;
//   * a receiver killed (its sockets crash) mid-transfer is dropped, the rest
//     get the version; restarted, it replaces its dead connection;
//   * the caller's deadline bounds a broadcast to a blackholed member, which
//     rejoins (catch-up) once the partition heals;
//   * a second connection claiming a live member's id cannot take its place,
//     a forged chunk (wrong sender, or right sender without the transfer's
//     token) is refused and counted, and so is a message of a foreign kind;
//   * the gloo rendezvous store answers the epoch's members only, and only
//     under its secret prefix.
//
// No sleeps: phases are synchronised on versions, members and hooks; every
// wait is bounded. The fabric must hold no socket after each test.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>

#include "../common/test_seed.h"
#include "chunk_stream.h"
#include "protocol.h"
#include "rendezvous.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/transport/fault_injection.h"
#include "troupe/transport/memory_network.h"
#include "troupe/transport/zmq_network.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::MakeWeights;
using testing::WeightsSpec;
using transport::FaultAction;
using transport::RejectReason;
using transport::SendEvent;

const WeightsSpec kSpec{4, 32, 64, 256};
constexpr int64_t kTimeoutMs = 2000;

uint64_t Seed() {
  return test_support::TestSeed("broadcast_protocol_test");
}

bool IsKind(const SendEvent& ev, transport::MessageKind kind) {
  return ev.envelope.getBody().which() == kind;
}

// One actor on the fabric: its network, optionally behind a fault injector.
struct Actor {
  std::unique_ptr<transport::Network> base;
  std::unique_ptr<transport::FaultInjectingNetwork> faults;
  transport::Network& net() { return faults ? *faults : *base; }
};

// A receiver that checks every version it gets against MakeWeights(seed, version).
struct Checked {
  Actor actor;
  std::unique_ptr<WeightReceiver> receiver;
  std::atomic<int> mismatches{0};
};

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override { Seed(); }
  void TearDown() override {
    receivers_.clear();
    sender_.reset();
    learner_.faults.reset();
    learner_.base.reset();
    others_.clear();
    EXPECT_EQ(fabric_.live_sockets(), 0u) << "a socket outlived its owner";
  }

  Actor MakeActor(const std::string& id, bool faulty = false) {
    Actor a;
    a.base = fabric_.NewNetwork({id, 0});
    if (faulty) a.faults = std::make_unique<transport::FaultInjectingNetwork>(a.base.get());
    return a;
  }

  BroadcastConfig Config(Backend backend) {
    BroadcastConfig c;
    c.backend = backend;
    c.control_endpoint = "inproc://learner-weights";
    c.bucket_bytes = 64 * 1024;
    c.chunk_bytes = 16 * 1024;
    c.timeout_ms = kTimeoutMs;
    c.heartbeat_ms = 50;
    c.member_timeout_ms = 4 * kTimeoutMs;
    c.checksum = true;
    c.shm_prefix = fmt::format("/troupe-p{}", ::getpid());
    return c;
  }

  void StartSender(const BroadcastConfig& cfg, bool faulty = false) {
    learner_ = MakeActor("learner", faulty);
    auto s = WeightSender::Create(cfg, learner_.net());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    sender_ = std::move(s).value();
  }

  Checked* AddReceiver(const std::string& id, bool faulty = false, ReceiverHooks hooks = {}) {
    auto r = std::make_unique<Checked>();
    r->actor = MakeActor(id, faulty);
    ReceiverConfig rc;
    rc.learner_endpoint = sender_->endpoint();
    rc.heartbeat_ms = 50;
    rc.learner_timeout_ms = 4 * kTimeoutMs;
    Checked* self = r.get();
    auto made = WeightReceiver::Create(
        rc, r->actor.net(),
        [self](const ReceivedWeights& w) {
          Status st = CompareWeights(w.named, MakeWeights(Seed(), w.version, kSpec), w.wire_dtype);
          if (!st.ok()) ++self->mismatches;
          return st;
        },
        std::move(hooks));
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return nullptr;
    r->receiver = std::move(made).value();
    receivers_.push_back(std::move(r));
    return self;
  }

  Status Send(uint64_t version, int64_t deadline_ms = 30000) {
    return sender_->Broadcast(version, MakeWeights(Seed(), version, kSpec),
                              Deadline::InMs(deadline_ms));
  }

  transport::MemoryFabric fabric_;
  Actor learner_;
  std::unique_ptr<WeightSender> sender_;
  std::vector<std::unique_ptr<Checked>> receivers_;
  std::vector<Actor> others_;  // strangers' networks
};

// ----------------------------------------------------------------- every backend

struct Case {
  Backend backend;
  ZmqTopology zmq = ZmqTopology::kChain;
};

class OverMemory : public ProtocolTest, public ::testing::WithParamInterface<Case> {};

TEST_P(OverMemory, ThreeReceiversGetEveryVersionBitExact) {
  BroadcastConfig cfg = Config(GetParam().backend);
  cfg.zmq_topology = GetParam().zmq;
  StartSender(cfg);
  for (int i = 0; i < 3; ++i) ASSERT_NE(AddReceiver("r" + std::to_string(i)), nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(3, Deadline::InMs(20000)).ok());
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_TRUE(Send(v).ok()) << v;
  EXPECT_EQ(sender_->last_report().attempts, 1);
  for (auto& r : receivers_) {
    EXPECT_EQ(r->receiver->version(), 3u);
    EXPECT_EQ(r->mismatches.load(), 0);
  }
  // Every message went through the transport: counted there, nothing refused.
  auto& c = learner_.net().counters();
  EXPECT_GT(c.messages_sent.load(), 0u);
  EXPECT_EQ(c.rejected_total(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, OverMemory,
                         ::testing::Values(Case{Backend::kZmq},
                                           Case{Backend::kZmq, ZmqTopology::kStar},
                                           Case{Backend::kShm}, Case{Backend::kGloo}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = BackendName(info.param.backend);
                           if (info.param.backend == Backend::kZmq)
                             n += std::string("_") + ZmqTopologyName(info.param.zmq);
                           return n;
                         });

// ----------------------------------------------------------------- faults

TEST_F(ProtocolTest, ADroppedChunkIsAGapTheReceiverReportsAndTheRetryRepairs) {
  StartSender(Config(Backend::kZmq), /*faulty=*/true);
  for (int i = 0; i < 3; ++i) ASSERT_NE(AddReceiver("r" + std::to_string(i)), nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(3, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  // Lose one chunk (not the first) of version 2 on its way to the chain's head.
  learner_.faults->DropNext(1, [](const SendEvent& ev) {
    if (!IsKind(ev, transport::MessageKind::WEIGHTS_CHUNK)) return false;
    auto c = ev.envelope.getBody().getWeightsChunk();
    return c.getVersion() == 2 && c.getOffset() > 0;
  });
  ASSERT_TRUE(Send(2).ok());
  auto report = sender_->last_report();
  EXPECT_EQ(report.attempts, 2);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_NE(report.failures[0].find("(expected"), std::string::npos) << report.failures[0];
  EXPECT_EQ(learner_.faults->stats().dropped, 1u);
  for (auto& r : receivers_) EXPECT_EQ(r->receiver->version(), 2u);
  for (auto& r : receivers_) EXPECT_EQ(r->mismatches.load(), 0);
}

TEST_F(ProtocolTest, AnAckDelayedWithinTheTimeoutCostsNothingOnePastItOneAttempt) {
  StartSender(Config(Backend::kZmq));
  Checked* slow = AddReceiver("slow", /*faulty=*/true);
  ASSERT_NE(AddReceiver("r1"), nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(2, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  auto is_ack = [](const SendEvent& ev) { return IsKind(ev, transport::MessageKind::ACK); };
  slow->actor.faults->DelayNext(1, kTimeoutMs / 4, is_ack);
  ASSERT_TRUE(Send(2).ok());
  EXPECT_EQ(sender_->last_report().attempts, 1);
  // Past the timeout: that attempt fails, the member is not lost (it echoes the next epoch)
  // and the retry, which it takes part in without re-delivering, succeeds.
  slow->actor.faults->DelayNext(1, kTimeoutMs + 500, is_ack);
  ASSERT_TRUE(Send(3).ok());
  auto report = sender_->last_report();
  EXPECT_EQ(report.attempts, 2);
  ASSERT_FALSE(report.failures.empty());
  EXPECT_NE(report.failures[0].find("no acknowledgement"), std::string::npos);
  EXPECT_EQ(report.members.size(), 2u);
  EXPECT_EQ(slow->actor.faults->stats().delayed, 2u);
  EXPECT_EQ(slow->receiver->stats().delivered, 3u);  // version 3 once, not twice
}

TEST_F(ProtocolTest, AReceiverKilledMidTransferIsDroppedAndItsRestartIsAdmitted) {
  StartSender(Config(Backend::kZmq));
  std::atomic<bool> crashed{false};
  ReceiverHooks hooks;
  hooks.on_progress = [&](uint64_t version, uint64_t received, uint64_t total) {
    if (version == 2 && received >= total / 2 && !crashed.exchange(true))
      fabric_.Crash("victim");  // every socket of the actor dies at once, like SIGKILL
  };
  ASSERT_NE(AddReceiver("r0"), nullptr);
  ASSERT_NE(AddReceiver("victim", false, hooks), nullptr);
  ASSERT_NE(AddReceiver("r2"), nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(3, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  ASSERT_TRUE(Send(2).ok());
  auto report = sender_->last_report();
  EXPECT_TRUE(crashed.load());
  EXPECT_EQ(report.attempts, 2);
  EXPECT_EQ(report.dropped, std::vector<std::string>{"victim"});
  std::sort(report.members.begin(), report.members.end());
  EXPECT_EQ(report.members, (std::vector<std::string>{"r0", "r2"}));
  // The actor restarts (a new process: new network, same id). Its old connection is gone,
  // so the new one is admitted at once, caught up, and joins.
  ASSERT_NE(AddReceiver("victim"), nullptr);
  Checked* reborn = receivers_.back().get();
  ASSERT_TRUE(reborn->receiver->WaitForVersion(2, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(sender_->WaitForMembers(3, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(3).ok());
  EXPECT_EQ(reborn->receiver->version(), 3u);
  EXPECT_EQ(reborn->mismatches.load(), 0);
  EXPECT_EQ(sender_->stats().takeovers_refused, 0u);
}

TEST_F(ProtocolTest, TheDeadlineBoundsABroadcastToABlackholedMemberWhichRejoinsLater) {
  BroadcastConfig cfg = Config(Backend::kZmq);
  cfg.zmq_topology = ZmqTopology::kStar;  // members do not depend on each other
  StartSender(cfg);
  Checked* cut = AddReceiver("cut", /*faulty=*/true);
  ASSERT_NE(AddReceiver("r1"), nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(2, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  // A partition: nothing from the learner reaches it, nothing of it reaches the learner.
  cut->actor.faults->KillPeer("learner");
  cut->actor.faults->KillPeer(sender_->endpoint());
  Status st = Send(2, /*deadline_ms=*/kTimeoutMs / 2);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  ASSERT_TRUE(Send(3).ok());  // time enough: re-formed without it
  EXPECT_EQ(sender_->last_report().members, std::vector<std::string>{"r1"});
  EXPECT_EQ(cut->receiver->version(), 1u);
  // The partition heals: the learner does not know it any more, it registers again, is
  // caught up with version 3 and joins.
  cut->actor.faults->RevivePeer("learner");
  cut->actor.faults->RevivePeer(sender_->endpoint());
  ASSERT_TRUE(cut->receiver->WaitForVersion(3, Deadline::InMs(30000)).ok());
  ASSERT_TRUE(sender_->WaitForMembers(2, Deadline::InMs(30000)).ok());
  ASSERT_TRUE(Send(4).ok());
  EXPECT_EQ(cut->receiver->version(), 4u);
  EXPECT_EQ(cut->mismatches.load(), 0);
}

// ----------------------------------------------------------------- impostors and strangers

TEST_F(ProtocolTest, ASecondConnectionCannotTakeALiveMembersPlace) {
  StartSender(Config(Backend::kZmq));
  Checked* real = AddReceiver("rollout-0");
  ASSERT_NE(real, nullptr);
  ASSERT_TRUE(sender_->WaitForMembers(1, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  // Another process using the same actor id (a full receiver implementation, so it keeps
  // registering as a real one would).
  Checked* impostor = AddReceiver("rollout-0");
  ASSERT_NE(impostor, nullptr);
  Deadline until = Deadline::InMs(20000);
  while (sender_->stats().takeovers_refused == 0 && !until.expired())
    ASSERT_TRUE(Send(sender_->version() + 1).ok());
  EXPECT_GT(sender_->stats().takeovers_refused, 0u);
  EXPECT_GT(learner_.net().counters().rejected_count(RejectReason::kUnexpected), 0u);
  ASSERT_TRUE(Send(sender_->version() + 1).ok());
  EXPECT_EQ(sender_->last_report().members, std::vector<std::string>{"rollout-0"});
  EXPECT_EQ(real->receiver->version(), sender_->version());  // the member kept its place
  EXPECT_EQ(impostor->receiver->version(), 0u);              // and the impostor got nothing
  EXPECT_EQ(real->mismatches.load(), 0);
}

TEST_F(ProtocolTest, ForgedChunksAndForeignMessagesAreRefusedAndCounted) {
  StartSender(Config(Backend::kZmq), /*faulty=*/true);
  // The real chunks of version 2 after the first are held back a little, so the forgeries
  // (sent when the first one lands) arrive in the middle of the transfer.
  learner_.faults->DelayNext(1000, 200, [](const SendEvent& ev) {
    if (!IsKind(ev, transport::MessageKind::WEIGHTS_CHUNK)) return false;
    auto c = ev.envelope.getBody().getWeightsChunk();
    return c.getVersion() == 2 && (c.getBucket() > 0 || c.getOffset() > 0);
  });
  others_.push_back(MakeActor("mallory"));
  transport::Network& mallory = others_.back().net();
  std::unique_ptr<transport::Socket> to_data, to_control;
  std::atomic<bool> sent{false};
  Checked* victim = nullptr;
  ReceiverHooks hooks;
  hooks.on_progress = [&](uint64_t version, uint64_t received, uint64_t) {
    if (version != 2 || received == 0 || sent.exchange(true)) return;
    // During a real transfer: chunks that claim the learner's name (without the transfer's
    // token) and mallory's own name, and a message of a foreign kind.
    proto::ChunkMsg c{2, 0, 0, received, false, 0, {}};
    for (const char* who : {"learner", "mallory"}) {
      c.transfer = sender_->epoch();
      auto forged = proto::EncodeChunk({who, 7}, c, transport::TensorBytes::Copy("evil!!!!", 8));
      ASSERT_TRUE(forged.ok());
      ASSERT_TRUE(to_data->Send(*forged, Deadline::InMs(1000)).ok());
    }
    transport::OutMessage echo;
    echo.envelope().initBody().initEcho().setText("not weights");
    ASSERT_TRUE(to_data->Send(echo, Deadline::InMs(1000)).ok());
  };
  victim = AddReceiver("r0", false, hooks);
  ASSERT_NE(victim, nullptr);
  auto d = mallory.Connect(transport::SocketKind::kClient, victim->receiver->data_endpoint(),
                           transport::SocketOptions{.identity = "mallory-data"});
  ASSERT_TRUE(d.ok());
  to_data = std::move(d).value();
  ASSERT_TRUE(sender_->WaitForMembers(1, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(Send(1).ok());
  ASSERT_TRUE(Send(2).ok());
  EXPECT_TRUE(sent.load());
  EXPECT_EQ(victim->receiver->version(), 2u);
  EXPECT_EQ(victim->mismatches.load(), 0);  // bit-exact despite the forgeries
  EXPECT_EQ(victim->receiver->stats().refused, 3u);
  EXPECT_EQ(victim->actor.net().counters().rejected_count(RejectReason::kUnexpected), 3u);
  // On the learner's control socket: a foreign kind, and a heartbeat whose sender is not
  // the connection's (mallory's connection claiming to be r0).
  auto c = mallory.Connect(transport::SocketKind::kClient, sender_->endpoint(),
                           transport::SocketOptions{.identity = UnguessableIdentity("mallory")});
  ASSERT_TRUE(c.ok());
  to_control = std::move(c).value();
  transport::OutMessage batch;
  batch.envelope().initBody().initRolloutBatch().setBatchId("evil");
  ASSERT_TRUE(to_control->Send(batch, Deadline::InMs(1000)).ok());
  ASSERT_TRUE(to_control
                  ->Send(proto::EncodeHeartbeat({"r0", 1}, {proto::PeerState::kExited, 0}),
                         Deadline::InMs(1000))
                  .ok());
  Deadline until = Deadline::InMs(10000);
  while (sender_->stats().refused < 2 && !until.expired())
    ASSERT_TRUE(Send(sender_->version() + 1).ok());
  EXPECT_EQ(sender_->stats().refused, 2u);
  EXPECT_EQ(sender_->last_report().members, std::vector<std::string>{"r0"});  // r0 not "exited"
  to_data.reset();
  to_control.reset();
}

// ----------------------------------------------------------------- data sockets over ZeroMQ

// A data socket is flow-controlled by its queue: a chain member that reads slowly stops taking
// input at the HWM. If the peer then goes away (a member killed mid-transfer), a ZMTP heartbeat
// falling due on that connection made libzmq 4.3.4 abort the whole process 2 s later
// ("!_io_error", stream_engine_base.cpp:331; seen in JoinMidRunGetsCatchUpThenNextEpoch over
// zmq_chain). The data sockets run without ZMTP heartbeats: this process must outlive that.
TEST(ChunkStreamZmq, APeerThatFillsTheQueueAndGoesAwayKillsNothing) {
  transport::ZmqNetworkOptions ro;
  ro.identity = {"r1", 1};
  auto rnet = transport::NewZmqNetwork(ro);
  ASSERT_TRUE(rnet.ok()) << rnet.status().ToString();
  auto rx = ChunkReceiver::Bind(rnet->get(), "tcp://127.0.0.1:0", /*hwm_chunks=*/2);
  ASSERT_TRUE(rx.ok()) << rx.status().ToString();
  {
    transport::ZmqNetworkOptions po;
    po.identity = {"r0", 1};
    auto pnet = transport::NewZmqNetwork(po);
    ASSERT_TRUE(pnet.ok()) << pnet.status().ToString();
    auto to = ConnectDataSocket(pnet->get(), (*rx)->endpoint(), "r0", /*hwm_chunks=*/2);
    ASSERT_TRUE(to.ok()) << to.status().ToString();
    // Nobody reads: the receiver's queue and both TCP buffers fill, then a send times out
    // (256 KiB chunks: a few dozen fill them).
    const std::vector<uint8_t> bytes(256 << 10, 7);
    int sent = 0;
    for (; sent < 10000; ++sent) {
      auto chunk = proto::EncodeChunk({"r0", 1}, proto::ChunkMsg{1, 1, 0, 0, false, 0, {}},
                                      transport::TensorBytes::Copy(bytes.data(), bytes.size()));
      ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
      if (!(*to)->Send(*chunk, Deadline::InMs(300)).ok()) break;
    }
    ASSERT_LT(sent, 10000) << "the receiver's queue never filled";
    ASSERT_GT(sent, 2);
  }  // the peer's socket and network close (linger 0): its connection is gone
  // Two heartbeat intervals (1000 ms each by default) and a margin: the abort came at the
  // second.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  // Still serving: what was queued can be read.
  auto first = (*rx)->socket()->Recv(Deadline::InMs(2000));
  EXPECT_TRUE(first.ok()) << first.status().ToString();
}

// ----------------------------------------------------------------- the gloo rendezvous

// Store values (torch 2.x adds a set(key, std::string) overload: a bare {1, 2} is ambiguous).
using Bytes = std::vector<uint8_t>;

TEST_F(ProtocolTest, TheRendezvousStoreAnswersMembersOnlyAndOnlyUnderItsPrefix) {
  Actor learner = MakeActor("learner"), member = MakeActor("r0"), stranger = MakeActor("eve");
  auto server = RendezvousServer::Start(&learner.net(), "127.0.0.1", {"learner", 1},
                                        "troupe/weights/1/secret", {"r0"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto t = std::chrono::milliseconds(500);
  {
    auto store = ConnectRendezvous(&member.net(), (*server)->endpoint(), {"r0", 2}, t, nullptr);
    store->set("troupe/weights/1/secret/a", Bytes{1, 2, 3});
    EXPECT_EQ(store->get("troupe/weights/1/secret/a"), (std::vector<uint8_t>{1, 2, 3}));
    EXPECT_EQ(store->add("troupe/weights/1/secret/n", 5), 5);
    // The learner's side sees the same map, and a value set there is seen by the member.
    auto local = (*server)->LocalStore(t, nullptr);
    EXPECT_EQ(local->get("troupe/weights/1/secret/a"), (std::vector<uint8_t>{1, 2, 3}));
    local->set("troupe/weights/1/secret/b", Bytes{9});
    EXPECT_EQ(store->get("troupe/weights/1/secret/b"), std::vector<uint8_t>{9});
    try {
      store->get("troupe/weights/2/other");
      ADD_FAILURE() << "a key outside the prefix was served";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
    }
    try {
      store->get("troupe/weights/1/secret/missing");
      ADD_FAILURE() << "a missing key did not time out";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
  }
  {
    // Someone who is not a member of the epoch gets no answer at all.
    auto store = ConnectRendezvous(&stranger.net(), (*server)->endpoint(), {"eve", 3},
                                   std::chrono::milliseconds(100), nullptr);
    try {
      store->get("troupe/weights/1/secret/a");
      ADD_FAILURE() << "a stranger was answered";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ((*server)->refused(), 2u);  // the foreign key and the stranger
  EXPECT_EQ(learner.net().counters().rejected_count(RejectReason::kUnexpected), 2u);
}

// Newer torch clones stores (c10d::Store::clone) to use them from its own threads: a clone of
// either side sees and changes the same map, over its own connection for a member.
TEST_F(ProtocolTest, ClonedRendezvousStoresShareTheMap) {
  Actor learner = MakeActor("learner"), member = MakeActor("r0");
  auto server = RendezvousServer::Start(&learner.net(), "127.0.0.1", {"learner", 1},
                                        "troupe/weights/1/secret", {"r0"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto t = std::chrono::milliseconds(2000);
  auto store = ConnectRendezvous(&member.net(), (*server)->endpoint(), {"r0", 2}, t, nullptr);
  auto local = (*server)->LocalStore(t, nullptr);
  auto remote_clone = CloneRendezvousStore(*store);
  auto local_clone = CloneRendezvousStore(*local);
  remote_clone->set("troupe/weights/1/secret/x", Bytes{4, 2});
  EXPECT_EQ(store->get("troupe/weights/1/secret/x"), (std::vector<uint8_t>{4, 2}));
  EXPECT_EQ(local_clone->get("troupe/weights/1/secret/x"), (std::vector<uint8_t>{4, 2}));
  local_clone->set("troupe/weights/1/secret/y", Bytes{7});
  EXPECT_EQ(remote_clone->get("troupe/weights/1/secret/y"), std::vector<uint8_t>{7});
  EXPECT_EQ(remote_clone->add("troupe/weights/1/secret/n", 3), 3);
  EXPECT_EQ(store->add("troupe/weights/1/secret/n", 1), 4);
  // The clone lives on after the original is gone.
  store.reset();
  EXPECT_EQ(remote_clone->get("troupe/weights/1/secret/y"), std::vector<uint8_t>{7});
  EXPECT_EQ((*server)->refused(), 0u);
}

}  // namespace
}  // namespace troupe::broadcast
