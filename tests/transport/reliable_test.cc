// Reliable delivery over the in-memory network with injected faults: FIFO
// and no duplicates under drops/duplicates/delays (both directions), a
// bounded outbox that blocks and then fails loudly, rejections that are not
// retried, re-routing away from dead peers, receiver restarts, and
// exactly-once with Snapshot/Restore.
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/transport/fault_injection.h"
#include "troupe/transport/memory_network.h"
#include "troupe/transport/reliable.h"

namespace troupe::transport {
namespace {

using testing::EchoText;
using testing::MakeEcho;

ReliableSenderOptions FastOptions() {
  ReliableSenderOptions o;
  o.retransmit_timeout_ms = 30;
  o.max_retransmit_timeout_ms = 200;
  o.dead_after_timeouts = 0;
  return o;
}

int IdOf(const Delivery& d) {
  return std::stoi(EchoText(d.message));
}

// Receives on a server socket in a thread, acking (or rejecting) each message
// after recording it, until stopped.
class ReceiverThread {
 public:
  ReceiverThread(Socket* server, std::function<bool(int)> accept = nullptr,
                 ReliableReceiverOptions options = {})
      : receiver_(server, options), accept_(std::move(accept)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ReceiverThread() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<int> ids() {
    std::lock_guard<std::mutex> g(mu_);
    return ids_;
  }
  // Waits until `n` messages were received (bounded).
  bool WaitFor(size_t n, int64_t ms = 20000) {
    std::unique_lock<std::mutex> g(mu_);
    return cv_.wait_for(g, std::chrono::milliseconds(ms), [&] { return ids_.size() >= n; });
  }
  ReliableReceiver& receiver() { return receiver_; }

 private:
  void Run() {
    while (!stop_) {
      auto d = receiver_.Recv(Deadline::InMs(20));
      if (!d.ok()) continue;
      if (!d->sequenced()) continue;
      const int id = IdOf(*d);
      {
        std::lock_guard<std::mutex> g(mu_);
        ids_.push_back(id);
      }
      cv_.notify_all();
      if (accept_ && !accept_(id)) {
        receiver_.Reject(*d, "odd ids are invalid");
      } else {
        receiver_.Ack(*d);
      }
    }
    (void)receiver_.FlushAcks(Deadline::InMs(100));
  }

  ReliableReceiver receiver_;
  std::function<bool(int)> accept_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> ids_;
  std::thread thread_;
};

void ExpectFifoNoDuplicates(const std::vector<int>& ids) {
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_LT(ids[i - 1], ids[i]) << "order broken or duplicate at position " << i;
  }
}

TEST(Reliable, FifoAndNoDuplicatesUnderDropsDuplicatesAndDelays) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"reward", 0});
  auto cn = fabric.NewNetwork({"rollout", 0});
  FaultInjectingNetwork faulty_s(sn.get()), faulty_c(cn.get());
  std::mt19937_64 rng(testing::TestSeed());
  std::mutex rng_mu;
  auto chaos = [&](const SendEvent&) {
    std::lock_guard<std::mutex> g(rng_mu);
    const int r = static_cast<int>(rng() % 100);
    if (r < 8) return FaultAction::Drop();
    if (r < 14) return FaultAction::Duplicate();
    if (r < 20) return FaultAction::Delay(static_cast<int64_t>(rng() % 40));
    return FaultAction::Pass();
  };
  faulty_s.SetHook("chaos", chaos);  // acks are lost/duplicated/delayed too
  faulty_c.SetHook("chaos", chaos);
  auto server = faulty_s.Bind(SocketKind::kServer, "mem://reward");
  ASSERT_TRUE(server.ok());
  ReceiverThread rt(server->get());
  ReliableSender sender(&faulty_c, FastOptions());
  ASSERT_TRUE(sender.ConnectPeer("reward", "mem://reward").ok());
  const int kN = 1500;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(
        sender.Send(MakeEcho(std::to_string(i), i % 3 == 0 ? 3000 : 0), Deadline::InMs(20000))
            .ok());
  }
  Status flushed = sender.Flush(Deadline::InMs(60000));
  ASSERT_TRUE(flushed.ok()) << flushed.ToString();
  rt.Stop();
  auto ids = rt.ids();
  ASSERT_EQ(ids.size(), static_cast<size_t>(kN));
  ExpectFifoNoDuplicates(ids);
  auto st = sender.stats();
  EXPECT_EQ(st.acked, static_cast<uint64_t>(kN));
  EXPECT_EQ(st.in_flight, 0u);
  EXPECT_GT(st.retransmits, 0u);
  EXPECT_GT(rt.receiver().stats().duplicates, 0u);
  EXPECT_GT(faulty_c.stats().dropped + faulty_s.stats().dropped, 0u);
}

TEST(Reliable, FullOutboxBlocksThenFailsLoudly) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"learner", 0});
  auto cn = fabric.NewNetwork({"reward", 0});
  auto server = sn->Bind(SocketKind::kServer, "mem://learner");
  ASSERT_TRUE(server.ok());
  ReliableSenderOptions o = FastOptions();
  o.max_outbox_messages = 4;
  ReliableSender sender(cn.get(), o);
  ASSERT_TRUE(sender.ConnectPeer("learner", "mem://learner").ok());
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::Now()).ok());
  Status st = sender.Send(MakeEcho("4"), Deadline::InMs(30));
  EXPECT_EQ(st.code(), Code::kResourceExhausted);
  EXPECT_NE(st.message().find("max_outbox_messages 4"), std::string::npos) << st.message();
  EXPECT_EQ(sender.stats().in_flight, 4u);
  // Once the receiver acks, a blocked Send goes through.
  ReceiverThread rt(server->get());
  ASSERT_TRUE(sender.Send(MakeEcho("4"), Deadline::InMs(20000)).ok());
  ASSERT_TRUE(sender.Flush(Deadline::InMs(20000)).ok());
  rt.Stop();
  EXPECT_EQ(rt.ids(), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_GE(sender.stats().send_blocked, 1u);
}

TEST(Reliable, RejectedMessagesAreReportedAndNotRetried) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"learner", 0});
  auto cn = fabric.NewNetwork({"reward", 0});
  auto server = sn->Bind(SocketKind::kServer, "mem://learner");
  ASSERT_TRUE(server.ok());
  ReceiverThread rt(server->get(), [](int id) { return id % 2 == 0; });
  ReliableSender sender(cn.get(), FastOptions());
  std::mutex mu;
  std::vector<std::pair<int, std::string>> rejected;
  sender.SetOutcomeCallback([&](const DeliveryOutcome& o) {
    if (o.accepted) return;
    std::lock_guard<std::mutex> g(mu);
    rejected.emplace_back(std::stoi(o.message.reader().getBody().getEcho().getText().cStr()),
                          o.reason);
  });
  ASSERT_TRUE(sender.ConnectPeer("learner", "mem://learner").ok());
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  ASSERT_TRUE(sender.Flush(Deadline::InMs(20000)).ok());
  rt.Stop();
  EXPECT_EQ(rt.ids().size(), 10u);
  auto st = sender.stats();
  EXPECT_EQ(st.acked, 5u);
  EXPECT_EQ(st.rejected, 5u);
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(rejected.size(), 5u);
  EXPECT_EQ(rejected[0].first % 2, 1);
  EXPECT_EQ(rejected[0].second, "odd ids are invalid");
}

TEST(Reliable, RejectionsSurviveLostAcks) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"learner", 0});
  auto cn = fabric.NewNetwork({"reward", 0});
  FaultInjectingNetwork faulty(sn.get());
  // Lose the first acks: the rejections in them must still reach the sender
  // (they are repeated until the sender's floor passes them).
  faulty.DropNext(3, [](const SendEvent& e) { return e.envelope.getBody().isAck(); });
  auto server = faulty.Bind(SocketKind::kServer, "mem://learner");
  ASSERT_TRUE(server.ok());
  ReceiverThread rt(server->get(), [](int id) { return id % 2 == 0; });
  ReliableSender sender(cn.get(), FastOptions());
  ASSERT_TRUE(sender.ConnectPeer("learner", "mem://learner").ok());
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  ASSERT_TRUE(sender.Flush(Deadline::InMs(20000)).ok());
  rt.Stop();
  EXPECT_EQ(faulty.stats().dropped, 3u);
  EXPECT_EQ(sender.stats().rejected, 10u);
  EXPECT_EQ(sender.stats().acked, 10u);
}

TEST(Reliable, ReroutesToAnotherPeerWhenOneIsDeclaredDead) {
  MemoryFabric fabric;
  auto an = fabric.NewNetwork({"reward-a", 0});
  auto bn = fabric.NewNetwork({"reward-b", 0});
  auto cn = fabric.NewNetwork({"rollout", 0});
  auto a = an->Bind(SocketKind::kServer, "mem://a");
  auto b = bn->Bind(SocketKind::kServer, "mem://b");
  ASSERT_TRUE(a.ok() && b.ok());
  ReliableSender sender(cn.get(), FastOptions());
  ASSERT_TRUE(sender.ConnectPeer("a", "mem://a").ok());
  ASSERT_TRUE(sender.ConnectPeer("b", "mem://b").ok());
  // Nobody serves a or b yet: messages spread over both.
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::Now()).ok());
  EXPECT_EQ(sender.stats().in_flight, 10u);
  // a is declared dead (e.g. the head says so): its share moves to b.
  sender.MarkPeerDead("a");
  EXPECT_EQ(sender.live_peers(), std::vector<std::string>{"b"});
  ReceiverThread rb(b->get());
  ASSERT_TRUE(rb.WaitFor(10));
  ASSERT_TRUE(sender.Flush(Deadline::InMs(20000)).ok());
  rb.Stop();
  auto ids = rb.ids();
  std::set<int> unique(ids.begin(), ids.end());
  EXPECT_EQ(unique.size(), 10u);
  EXPECT_EQ(ids.size(), 10u);
  auto st = sender.stats();
  EXPECT_EQ(st.rerouted, 5u);
  EXPECT_EQ(st.peers_declared_dead, 1u);
  // New messages avoid a; reviving it brings it back.
  sender.MarkPeerAlive("a");
  EXPECT_EQ(sender.live_peers().size(), 2u);
}

TEST(Reliable, SilentPeerIsDeclaredDeadByTimeoutsAndItsMessagesMove) {
  MemoryFabric fabric;
  auto an = fabric.NewNetwork({"reward-a", 0});
  auto bn = fabric.NewNetwork({"reward-b", 0});
  auto cn = fabric.NewNetwork({"rollout", 0});
  auto a = an->Bind(SocketKind::kServer, "mem://a");
  auto b = bn->Bind(SocketKind::kServer, "mem://b");
  ASSERT_TRUE(a.ok() && b.ok());
  ReliableSenderOptions o = FastOptions();
  o.dead_after_timeouts = 2;
  ReliableSender sender(cn.get(), o);
  ASSERT_TRUE(sender.ConnectPeer("a", "mem://a").ok());
  ASSERT_TRUE(sender.ConnectPeer("b", "mem://b").ok());
  ReceiverThread rb(b->get());
  fabric.Crash("reward-a");  // a's process is gone; nobody tells the sender
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  ASSERT_TRUE(sender.Flush(Deadline::InMs(30000)).ok());
  rb.Stop();
  std::set<int> unique;
  for (int id : rb.ids()) unique.insert(id);
  EXPECT_EQ(unique.size(), 20u);
  EXPECT_EQ(sender.stats().peers_declared_dead, 1u);
  EXPECT_GT(sender.stats().rerouted, 0u);
}

TEST(Reliable, ReceiverRestartLosesNothingAndNeverDuplicatesWithinALifetime) {
  MemoryFabric fabric;
  auto cn = fabric.NewNetwork({"rollout", 0});
  ReliableSender sender(cn.get(), FastOptions());
  ASSERT_TRUE(sender.ConnectPeer("reward", "mem://reward").ok());
  std::vector<int> first, second;
  {
    auto sn = fabric.NewNetwork({"reward", 0});
    auto server = sn->Bind(SocketKind::kServer, "mem://reward");
    ASSERT_TRUE(server.ok());
    ReliableReceiver r(server->get());
    for (int i = 0; i < 30; ++i)
      ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
    // Process (and ack) 10; 5 more are delivered but not acked when it dies.
    for (int i = 0; i < 15; ++i) {
      auto d = r.Recv(Deadline::InMs(10000));
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      first.push_back(IdOf(*d));
      if (i < 10) r.Ack(*d);
    }
    ASSERT_TRUE(r.FlushAcks(Deadline::InMs(1000)).ok());
    fabric.Crash("reward");
  }
  for (int i = 30; i < 40; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  auto sn = fabric.NewNetwork({"reward", 0});
  auto server = sn->Bind(SocketKind::kServer, "mem://reward");
  ASSERT_TRUE(server.ok());
  ReceiverThread rt(server->get());
  ASSERT_TRUE(sender.Flush(Deadline::InMs(30000)).ok());
  rt.Stop();
  second = rt.ids();
  ExpectFifoNoDuplicates(first);
  ExpectFifoNoDuplicates(second);
  std::set<int> all(first.begin(), first.end());
  all.insert(second.begin(), second.end());
  EXPECT_EQ(all.size(), 40u);
  // Everything not acked by the first lifetime arrived in the second.
  for (int i = 10; i < 40; ++i) {
    EXPECT_TRUE(std::find(second.begin(), second.end(), i) != second.end()) << i;
  }
  EXPECT_GE(sender.stats().receiver_restarts + sender.stats().retransmits, 1u);
}

// A sender that restarts reuses its actor id, so the receiver's ROUTER hands
// the routing id to the new process: acks the receiver still owes the old
// process (for the old stream's seqs, with the old stream's processedThrough)
// reach the new one. Taking them resolved the new process's messages with the
// same seqs as accepted before the receiver had seen them (chaos test: four
// batches answered that no learner ever decided).
TEST(Reliable, AcksForAPreviousIncarnationOfTheSenderAreIgnored) {
  MemoryFabric fabric;
  auto sn = fabric.NewNetwork({"learner", 0});
  auto server = sn->Bind(SocketKind::kServer, "mem://learner");
  ASSERT_TRUE(server.ok());
  ReliableReceiver r(server->get());
  std::vector<Delivery> old_deliveries;
  {
    auto old_net = fabric.NewNetwork({"reward", 0});
    ReliableSender old_sender(old_net.get(), FastOptions());
    ASSERT_TRUE(old_sender.ConnectPeer("learner", "mem://learner").ok());
    for (int i = 0; i < 10; ++i)
      ASSERT_TRUE(old_sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
    for (int i = 0; i < 10; ++i) {
      auto d = r.Recv(Deadline::InMs(10000));
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      old_deliveries.push_back(std::move(d).value());
    }
    fabric.Crash("reward");
  }
  auto new_net = fabric.NewNetwork({"reward", 0});
  ReliableSender sender(new_net.get(), FastOptions());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> accepted;
  sender.SetOutcomeCallback([&](const DeliveryOutcome& o) {
    std::lock_guard<std::mutex> g(mu);
    if (o.accepted)
      accepted.push_back(std::stoi(std::string(o.message.reader().getBody().getEcho().getText())));
    cv.notify_all();
  });
  ASSERT_TRUE(sender.ConnectPeer("learner", "mem://learner").ok());
  for (int i = 100; i < 105; ++i)
    ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
  std::vector<Delivery> fresh;
  for (int i = 0; i < 5; ++i) {
    auto d = r.Recv(Deadline::InMs(10000));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    fresh.push_back(std::move(d).value());
  }
  // The receiver acknowledges the old process's ten messages (its routing id
  // now reaches the new process), then one message of the new one.
  for (const auto& d : old_deliveries) r.Ack(d);
  ASSERT_TRUE(r.FlushAcks(Deadline::InMs(1000)).ok());
  r.Ack(fresh[2]);
  ASSERT_TRUE(r.FlushAcks(Deadline::InMs(1000)).ok());
  std::unique_lock<std::mutex> g(mu);
  ASSERT_TRUE(cv.wait_for(g, std::chrono::seconds(10), [&] { return !accepted.empty(); }));
  EXPECT_EQ(accepted, std::vector<int>({102})) << "acks for the old process resolved new messages";
  EXPECT_GE(sender.stats().foreign_acks, 1u);
}

TEST(Reliable, SnapshotRestoreMakesItExactlyOnceAcrossRestarts) {
  MemoryFabric fabric;
  auto cn = fabric.NewNetwork({"reward", 0});
  ReliableSender sender(cn.get(), FastOptions());
  ASSERT_TRUE(sender.ConnectPeer("learner", "mem://learner").ok());
  std::vector<int> processed;
  std::vector<StreamState> checkpoint;
  {
    auto sn = fabric.NewNetwork({"learner", 0});
    FaultInjectingNetwork faulty(sn.get());
    faulty.DropNext(1000, [](const SendEvent& e) { return e.envelope.getBody().isAck(); });
    auto server = faulty.Bind(SocketKind::kServer, "mem://learner");
    ASSERT_TRUE(server.ok());
    ReliableReceiver r(server->get());
    for (int i = 0; i < 20; ++i)
      ASSERT_TRUE(sender.Send(MakeEcho(std::to_string(i)), Deadline::InMs(5000)).ok());
    // Processes 12 and checkpoints; every ack is lost, then it crashes.
    for (int i = 0; i < 12; ++i) {
      auto d = r.Recv(Deadline::InMs(10000));
      ASSERT_TRUE(d.ok());
      processed.push_back(IdOf(*d));
      r.Ack(*d);
    }
    checkpoint = r.Snapshot();
    fabric.Crash("learner");
  }
  ASSERT_EQ(checkpoint.size(), 1u);
  EXPECT_EQ(checkpoint[0].sender, "reward");
  EXPECT_EQ(checkpoint[0].next_expected, 13u);
  auto sn = fabric.NewNetwork({"learner", 0});
  auto server = sn->Bind(SocketKind::kServer, "mem://learner");
  ASSERT_TRUE(server.ok());
  ReceiverThread rt(server->get());
  rt.receiver().Restore(checkpoint);
  ASSERT_TRUE(sender.Flush(Deadline::InMs(30000)).ok());
  rt.Stop();
  auto after = rt.ids();
  processed.insert(processed.end(), after.begin(), after.end());
  std::vector<int> expect(20);
  for (int i = 0; i < 20; ++i) expect[i] = i;
  EXPECT_EQ(processed, expect);  // each exactly once, in order
}

TEST(Reliable, UnsequencedMessagesPassThrough) {
  MemoryFabric fabric;
  auto n = fabric.NewNetwork({"n", 0});
  auto server = n->Bind(SocketKind::kServer, "mem://s");
  SocketOptions o;
  o.identity = "c";
  auto c = n->Connect(SocketKind::kClient, "mem://s", o);
  ASSERT_TRUE(server.ok() && c.ok());
  ReliableReceiver r(server->get());
  ASSERT_TRUE((*c)->Send(MakeEcho("control"), Deadline::InMs(100)).ok());
  auto d = r.Recv(Deadline::InMs(1000));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->sequenced());
  EXPECT_EQ(EchoText(d->message), "control");
  r.Ack(*d);  // ignored
  EXPECT_EQ(r.stats().unsequenced, 1u);
  EXPECT_EQ(r.stats().acked, 0u);
}

TEST(Reliable, OptionsValidate) {
  ReliableSenderOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.retransmit_timeout_ms = 0;
  EXPECT_NE(o.Validate().message().find("retransmit_timeout_ms"), std::string::npos);
  ReliableReceiverOptions r;
  r.ack_batch = 0;
  EXPECT_FALSE(r.Validate().ok());
}

}  // namespace
}  // namespace troupe::transport
