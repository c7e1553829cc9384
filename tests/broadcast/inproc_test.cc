// Protocol tests with the sender and several receivers in one process (real
// sockets, real gloo groups, real shared memory; threads instead of
// processes; each actor has its own ZeroMQ transport network). Fast to run;
// the multi-process test covers crashes.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/transport/zmq_network.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::MakeWeights;
using testing::WeightsSpec;

uint64_t Seed() {
  static uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("broadcast_inproc_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

const WeightsSpec kSpec{6, 64, 128, 512};

// One actor's network (real ZeroMQ sockets).
std::unique_ptr<transport::Network> Net(const std::string& actor) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  auto n = transport::NewZmqNetwork(o);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return std::move(n).value();
}

BroadcastConfig TestConfig(Backend backend) {
  BroadcastConfig c;
  c.backend = backend;
  c.bucket_bytes = 256 * 1024;
  c.chunk_bytes = 64 * 1024;
  c.timeout_ms = 5000;
  c.heartbeat_ms = 100;
  c.member_timeout_ms = 8000;
  c.checksum = true;
  return c;
}

// A receiver whose sink checks every delivery against MakeWeights(seed, version).
struct CheckedReceiver {
  std::unique_ptr<transport::Network> net;  // outlives the receiver
  std::unique_ptr<WeightReceiver> receiver;
  std::atomic<int> mismatches{0};
  std::atomic<uint64_t> last{0};

  static std::unique_ptr<CheckedReceiver> Make(const std::string& id, const std::string& learner,
                                               WireDtype wire, std::string node = "") {
    auto out = std::make_unique<CheckedReceiver>();
    ReceiverConfig rc;
    rc.actor_id = id;
    rc.learner_endpoint = learner;
    rc.heartbeat_ms = 100;
    rc.learner_timeout_ms = 8000;
    rc.node = node;
    CheckedReceiver* self = out.get();
    out->net = Net(id);
    auto r = WeightReceiver::Create(rc, *out->net, [self, wire](const ReceivedWeights& w) {
      Status st = CompareWeights(w.named, MakeWeights(Seed(), w.version, kSpec), wire);
      if (!st.ok()) ++self->mismatches;
      self->last = w.version;
      return st;
    });
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) out->receiver = std::move(r).value();
    return out;
  }
};

void RunVersions(WeightSender& s, uint64_t from, uint64_t to) {
  for (uint64_t v = from; v <= to; ++v) {
    Status st = s.Broadcast(v, MakeWeights(Seed(), v, kSpec), Deadline::InMs(30000));
    ASSERT_TRUE(st.ok()) << "version " << v << ": " << st.ToString();
  }
}

struct Case {
  Backend backend;
  GlooAlgorithm gloo = GlooAlgorithm::kChain;
  ZmqTopology zmq = ZmqTopology::kChain;
  WireDtype wire = WireDtype::kAsStored;
};

class InprocBackends : public ::testing::TestWithParam<Case> {};

TEST_P(InprocBackends, ThreeReceiversGetEveryVersionBitExact) {
  const Case c = GetParam();
  BroadcastConfig cfg = TestConfig(c.backend);
  cfg.gloo_algorithm = c.gloo;
  cfg.zmq_topology = c.zmq;
  cfg.wire_dtype = c.wire;
  auto net = Net("learner");
  auto sender = WeightSender::Create(cfg, *net);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  WeightSender& s = **sender;
  std::vector<std::unique_ptr<CheckedReceiver>> rs;
  for (int i = 0; i < 3; ++i)
    rs.push_back(CheckedReceiver::Make("r" + std::to_string(i), s.endpoint(), c.wire));
  ASSERT_TRUE(s.WaitForMembers(3, Deadline::InMs(20000)).ok());
  RunVersions(s, 1, 3);
  auto report = s.last_report();
  EXPECT_EQ(report.members.size(), 3u);
  EXPECT_EQ(report.attempts, 1);
  for (auto& r : rs) {
    EXPECT_EQ(r->receiver->version(), 3u);
    EXPECT_EQ(r->mismatches.load(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, InprocBackends,
    ::testing::Values(Case{Backend::kZmq}, Case{Backend::kZmq, {}, ZmqTopology::kStar},
                      Case{Backend::kGloo}, Case{Backend::kGloo, GlooAlgorithm::kBroadcast},
                      Case{Backend::kShm}, Case{Backend::kZmq, {}, {}, WireDtype::kBFloat16}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      std::string n = BackendName(c.backend);
      if (c.backend == Backend::kGloo) n += std::string("_") + GlooAlgorithmName(c.gloo);
      if (c.backend == Backend::kZmq) n += std::string("_") + ZmqTopologyName(c.zmq);
      if (c.wire == WireDtype::kBFloat16) n += "_bf16";
      return n;
    });

TEST(Inproc, NewcomerIsCaughtUpThenJoinsAndLeaverIsConfirmed) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kGloo), *net);
  ASSERT_TRUE(sender.ok());
  WeightSender& s = **sender;
  auto a = CheckedReceiver::Make("a", s.endpoint(), WireDtype::kAsStored);
  ASSERT_TRUE(s.WaitForMembers(1, Deadline::InMs(20000)).ok());
  RunVersions(s, 1, 2);
  // Join mid-run: the newcomer gets version 2 by catch-up before any new broadcast.
  auto b = CheckedReceiver::Make("b", s.endpoint(), WireDtype::kAsStored);
  ASSERT_TRUE(b->receiver->WaitForVersion(2, Deadline::InMs(20000)).ok());
  EXPECT_EQ(b->receiver->stats().catch_ups, 1u);
  ASSERT_TRUE(s.WaitForMembers(2, Deadline::InMs(20000)).ok());
  RunVersions(s, 3, 3);
  EXPECT_EQ(b->receiver->version(), 3u);
  // Leave: confirmed by the next epoch, then the learner goes on with the rest.
  ASSERT_TRUE(a->receiver->Leave(Deadline::InMs(20000)).ok());
  RunVersions(s, 4, 4);
  EXPECT_EQ(s.last_report().members, std::vector<std::string>{"b"});
  EXPECT_EQ(a->receiver->version(), 3u);
  EXPECT_EQ(b->receiver->version(), 4u);
  EXPECT_EQ(a->mismatches + b->mismatches, 0);
}

TEST(Inproc, ReceiveWithoutSinkReturnsTheNewestVersion) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kZmq), *net);
  ASSERT_TRUE(sender.ok());
  ReceiverConfig rc;
  rc.actor_id = "plain";
  rc.learner_endpoint = (*sender)->endpoint();
  rc.heartbeat_ms = 100;
  auto rnet = Net("plain");
  auto r = WeightReceiver::Create(rc, *rnet);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*sender)->WaitForMembers(1, Deadline::InMs(20000)).ok());
  EXPECT_EQ((*r)->Receive(Deadline::InMs(50)).status().code(), Code::kTimeout);
  RunVersions(**sender, 1, 3);
  auto got = (*r)->Receive(Deadline::InMs(5000));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->version, 3u);  // 1 and 2 were superseded before we asked
  EXPECT_TRUE(CompareWeights(got->named, MakeWeights(Seed(), 3, kSpec), WireDtype::kAsStored).ok());
  // The tensors we hold stay valid across later broadcasts (they own their memory).
  RunVersions(**sender, 4, 5);
  EXPECT_TRUE(CompareWeights(got->named, MakeWeights(Seed(), 3, kSpec), WireDtype::kAsStored).ok());
  auto next = (*r)->Receive(Deadline::InMs(5000));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->version, 5u);
}

TEST(Inproc, ShmServesRemoteNodesOverZmq) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kShm), *net);
  ASSERT_TRUE(sender.ok());
  auto local = CheckedReceiver::Make("local", (*sender)->endpoint(), WireDtype::kAsStored);
  auto remote =
      CheckedReceiver::Make("remote", (*sender)->endpoint(), WireDtype::kAsStored, "another-node");
  ASSERT_TRUE((*sender)->WaitForMembers(2, Deadline::InMs(20000)).ok());
  RunVersions(**sender, 1, 3);
  EXPECT_EQ(local->receiver->version(), 3u);
  EXPECT_EQ(remote->receiver->version(), 3u);
  EXPECT_GT(remote->receiver->stats().bytes_received, 0u);
  EXPECT_EQ(local->receiver->stats().bytes_received, 0u);  // mapped, never copied off a socket
  EXPECT_EQ(local->mismatches + remote->mismatches, 0);
}

TEST(Inproc, SinkErrorIsReportedToTheLearner) {
  BroadcastConfig cfg = TestConfig(Backend::kZmq);
  cfg.max_attempts = 1;
  auto net = Net("learner");
  auto sender = WeightSender::Create(cfg, *net);
  ASSERT_TRUE(sender.ok());
  ReceiverConfig rc;
  rc.actor_id = "picky";
  rc.learner_endpoint = (*sender)->endpoint();
  rc.heartbeat_ms = 100;
  auto rnet = Net("picky");
  auto r = WeightReceiver::Create(rc, *rnet, [](const ReceivedWeights& w) {
    return w.version == 2 ? InvalidArgument("engine refused version 2") : Status::Ok();
  });
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*sender)->WaitForMembers(1, Deadline::InMs(20000)).ok());
  RunVersions(**sender, 1, 1);
  Status st = (*sender)->Broadcast(2, MakeWeights(Seed(), 2, kSpec), Deadline::InMs(20000));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("engine refused version 2"), std::string::npos) << st.ToString();
  EXPECT_EQ((*r)->version(), 1u);  // it keeps what it had
  RunVersions(**sender, 3, 3);
  EXPECT_EQ((*r)->version(), 3u);
}

TEST(Inproc, NewcomerWhoseCatchUpFailsDoesNotStallTheGroup) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kZmq), *net);
  ASSERT_TRUE(sender.ok());
  auto good = CheckedReceiver::Make("good", (*sender)->endpoint(), WireDtype::kAsStored);
  ASSERT_TRUE((*sender)->WaitForMembers(1, Deadline::InMs(20000)).ok());
  RunVersions(**sender, 1, 1);
  ReceiverConfig rc;
  rc.actor_id = "bad";
  rc.learner_endpoint = (*sender)->endpoint();
  rc.heartbeat_ms = 100;
  std::atomic<int> refused{0};
  std::promise<void> first_refusal;
  auto bnet = Net("bad");
  auto bad = WeightReceiver::Create(rc, *bnet, [&](const ReceivedWeights& w) {
    if (!w.catch_up) return Status::Ok();
    if (refused++ == 0) first_refusal.set_value();
    return Internal("refusing catch-up");
  });
  ASSERT_TRUE(bad.ok());
  ASSERT_EQ(first_refusal.get_future().wait_for(std::chrono::seconds(20)),
            std::future_status::ready);
  // While the newcomer fails its catch-ups (and is backed off, then dropped), the group
  // goes on: every broadcast succeeds at the first attempt with the good member only.
  for (uint64_t v = 2; v <= 6; ++v) {
    RunVersions(**sender, v, v);
    EXPECT_EQ((*sender)->last_report().members, std::vector<std::string>{"good"});
    EXPECT_EQ((*sender)->last_report().attempts, 1);
  }
  EXPECT_EQ(good->receiver->version(), 6u);
  EXPECT_EQ((*bad)->version(), 0u);
  for (const MemberInfo& m : (*sender)->Members()) {
    if (m.id == "bad") {
      EXPECT_NE(m.state, "member");
    }
  }
}

// Local addresses (hex, as /proc/net/tcp{,6} print them) of every TCP socket this process
// listens on.
std::vector<std::string> ListeningAddresses() {
  std::set<std::string> inodes;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      char target[256] = {0};
      std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
      std::string t = target;
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local.substr(0, local.find(':')));
    }
  }
  return out;
}

// For a local job every socket of the broadcast (control, data, gloo's rendezvous and pairs)
// binds loopback: c10d's TCPStore, which listens on every interface, is not used.
TEST(Inproc, NothingOfTheBroadcastListensOnAWildcardAddress) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kGloo), *net);
  ASSERT_TRUE(sender.ok());
  auto a = CheckedReceiver::Make("a", (*sender)->endpoint(), WireDtype::kAsStored);
  auto b = CheckedReceiver::Make("b", (*sender)->endpoint(), WireDtype::kAsStored);
  ASSERT_TRUE((*sender)->WaitForMembers(2, Deadline::InMs(20000)).ok());
  RunVersions(**sender, 1, 1);
  auto listening = ListeningAddresses();
  EXPECT_GE(listening.size(), 3u);  // at least the control socket and both data sockets
  const std::set<std::string> loopback = {"0100007F", "0000000000000000FFFF00000100007F",
                                          "00000000000000000000000001000000"};
  for (const auto& addr : listening) EXPECT_TRUE(loopback.count(addr)) << "listening on " << addr;
}

TEST(Inproc, VersionsMustIncreaseAndBadTensorsAreRejected) {
  auto net = Net("learner");
  auto sender = WeightSender::Create(TestConfig(Backend::kZmq), *net);
  ASSERT_TRUE(sender.ok());
  RunVersions(**sender, 5, 5);
  EXPECT_EQ((*sender)->Broadcast(5, MakeWeights(Seed(), 5, kSpec), Deadline::InMs(5000)).code(),
            Code::kInvalidArgument);
  NamedTensors bad{{"x", at::randn({2})}, {"x", at::randn({2})}};
  Status st = (*sender)->Broadcast(6, bad, Deadline::InMs(5000));
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("appears twice"), std::string::npos);
}


// ----------------------------------------------------------------- LoRA: adapter-only sync

// A receiver that records what every delivery carried (names and bytes).
struct RecordingReceiver {
  std::unique_ptr<transport::Network> net;
  std::unique_ptr<WeightReceiver> receiver;
  Mutex mu;
  std::vector<std::pair<uint64_t, NamedTensors>> got TROUPE_GUARDED_BY(mu);

  static std::unique_ptr<RecordingReceiver> Make(const std::string& id, const std::string& learner) {
    auto out = std::make_unique<RecordingReceiver>();
    ReceiverConfig rc;
    rc.actor_id = id;
    rc.learner_endpoint = learner;
    rc.heartbeat_ms = 100;
    rc.learner_timeout_ms = 8000;
    out->net = Net(id);
    RecordingReceiver* self = out.get();
    auto r = WeightReceiver::Create(rc, *out->net, [self](const ReceivedWeights& w) {
      NamedTensors copy;
      for (const auto& [name, t] : w.named) copy.emplace_back(name, t.clone());
      MutexLock l(self->mu);
      self->got.emplace_back(w.version, std::move(copy));
      return Status::Ok();
    });
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) out->receiver = std::move(r).value();
    return out;
  }
  std::vector<std::pair<uint64_t, NamedTensors>> deliveries() {
    MutexLock l(mu);
    return got;
  }
};

NamedTensors Adapters(uint64_t version) {
  NamedTensors a = MakeWeights(Seed() + 17, version, WeightsSpec{2, 16, 8, 64});
  for (auto& [name, t] : a) name = "adapter." + name;
  return a;
}

uint64_t Bytes(const NamedTensors& n) {
  uint64_t b = 0;
  for (const auto& [name, t] : n) b += t.nbytes();
  return b;
}

std::set<std::string> Names(const NamedTensors& n) {
  std::set<std::string> s;
  for (const auto& [name, t] : n) s.insert(name);
  return s;
}

class LoraSync : public ::testing::TestWithParam<Case> {};

// The base reaches the group once, with the first broadcast after SetBase; every later
// broadcast carries only the adapters (payload and the learner's sent bytes ≤ 1.1 × their
// size on a chain); a newcomer's catch-up carries base + current adapters in one transfer.
TEST_P(LoraSync, BaseOnceThenAdaptersAndNewcomersGetBoth) {
  const Case c = GetParam();
  BroadcastConfig cfg = TestConfig(c.backend);
  cfg.gloo_algorithm = c.gloo;
  cfg.zmq_topology = c.zmq;
  auto net = Net("learner");
  auto sender = WeightSender::Create(cfg, *net);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  WeightSender& s = **sender;
  std::vector<std::unique_ptr<RecordingReceiver>> rs;
  for (int i = 0; i < 2; ++i) rs.push_back(RecordingReceiver::Make("r" + std::to_string(i), s.endpoint()));
  ASSERT_TRUE(s.WaitForMembers(2, Deadline::InMs(20000)).ok());
  const NamedTensors base = MakeWeights(Seed(), 0, kSpec);
  EXPECT_FALSE(s.SetBase({{"", base[0].second}}).ok()) << "empty names are refused";
  ASSERT_TRUE(s.SetBase(base).ok());
  const uint64_t adapter_bytes = Bytes(Adapters(1));
  ASSERT_LT(adapter_bytes * 10, Bytes(base)) << "the test needs a base much larger than adapters";
  for (uint64_t v = 1; v <= 4; ++v) {
    const uint64_t sent0 = s.stats().bytes_sent;
    ASSERT_TRUE(s.Broadcast(v, Adapters(v), Deadline::InMs(30000)).ok()) << v;
    const uint64_t sent = s.stats().bytes_sent - sent0;
    const uint64_t payload = s.last_report().payload_bytes;
    if (v == 1) {
      EXPECT_GE(payload, Bytes(base) + adapter_bytes);
    } else {
      EXPECT_LE(payload, 1.1 * adapter_bytes) << "version " << v;
      EXPECT_GE(payload, adapter_bytes);
      // The learner's link: one copy on a chain (gloo counts one per transfer).
      EXPECT_LE(sent, 1.1 * adapter_bytes) << "version " << v;
    }
  }
  std::set<std::string> full = Names(base), adapters = Names(Adapters(1));
  full.insert(adapters.begin(), adapters.end());
  for (auto& r : rs) {
    auto d = r->deliveries();
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(Names(d[0].second), full);
    EXPECT_TRUE(CompareWeights(NamedTensors(d[0].second.begin(), d[0].second.begin() + base.size()),
                               base, WireDtype::kAsStored)
                    .ok());
    for (size_t i = 1; i < d.size(); ++i) {
      EXPECT_EQ(Names(d[i].second), adapters) << "version " << d[i].first;
      EXPECT_TRUE(CompareWeights(d[i].second, Adapters(d[i].first), WireDtype::kAsStored).ok());
    }
  }
  // A newcomer: one catch-up with the base and version 4's adapters, then adapters only.
  auto late = RecordingReceiver::Make("late", s.endpoint());
  ASSERT_TRUE(late->receiver->WaitForVersion(4, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(s.WaitForMembers(3, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(s.Broadcast(5, Adapters(5), Deadline::InMs(30000)).ok());
  auto d = late->deliveries();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 4u);
  EXPECT_EQ(Names(d[0].second), full);
  NamedTensors caught_adapters(d[0].second.begin() + base.size(), d[0].second.end());
  EXPECT_TRUE(CompareWeights(caught_adapters, Adapters(4), WireDtype::kAsStored).ok());
  EXPECT_EQ(Names(d[1].second), adapters);
  EXPECT_EQ(s.last_report().members.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, LoraSync,
    ::testing::Values(Case{Backend::kZmq}, Case{Backend::kGloo}, Case{Backend::kShm}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(BackendName(info.param.backend));
    });

}  // namespace
}  // namespace troupe::broadcast
