// Multi-process tests of the weight broadcast: receivers (and, for the restart
// test, learners) are real child processes of this binary (re-executed with
// --child), talking over real sockets, gloo groups and shared memory.
//
//   * bit-exact weights for gloo, zmq and shm with 1, 2 and 4 receivers, each
//     receiver verifying every version it holds and reporting it;
//   * bf16 wire round-trips within bf16 precision;
//   * join mid-run (catch-up, then the next epoch), graceful leave, a receiver
//     SIGKILLed in the middle of a broadcast, and a learner restart: each ends
//     with every live receiver on the learner's latest version.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "child_process.h"
#include "troupe/broadcast/layout.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::ExpectedAfterWire;
using testing::MakeWeights;
using testing::WeightsSpec;
using troupe::testing::ChildProcess;

const WeightsSpec kSpec{8, 64, 128, 512};  // ~200 tensors, ~2.6 MB
constexpr int64_t kTimeoutMs = 3000;
std::string g_self;

uint64_t Seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("TROUPE_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("broadcast_process_test seed %llu (TROUPE_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

uint64_t ExpectedDigest(uint64_t seed, uint64_t version, WireDtype wire) {
  return DigestTensors(ExpectedAfterWire(MakeWeights(seed, version, kSpec), wire));
}

// ----------------------------------------------------------------- child side

using Args = std::map<std::string, std::string>;

std::mutex g_out_mu;
void Say(const std::string& line) {
  std::lock_guard<std::mutex> l(g_out_mu);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int64_t Int(const Args& a, const std::string& k, int64_t def) {
  auto it = a.find(k);
  return it == a.end() ? def : std::stoll(it->second);
}
std::string Str(const Args& a, const std::string& k, const std::string& def = "") {
  auto it = a.find(k);
  return it == a.end() ? def : it->second;
}

int RunReceiver(const Args& a) {
  log::Init(Str(a, "id"));
  const uint64_t seed = static_cast<uint64_t>(Int(a, "seed", 0));
  const uint64_t kill_version = static_cast<uint64_t>(Int(a, "kill_version", 0));
  const uint64_t stop_version = static_cast<uint64_t>(Int(a, "stop_version", 0));
  ReceiverConfig rc;
  rc.actor_id = Str(a, "id");
  rc.learner_endpoint = Str(a, "endpoint");
  rc.heartbeat_ms = 100;
  rc.learner_timeout_ms = 4 * kTimeoutMs;
  ReceiverHooks hooks;
  hooks.on_progress = [&](uint64_t version, uint64_t received, uint64_t total) {
    if (kill_version != 0 && version == kill_version && received >= total / 2) {
      Say("DYING " + std::to_string(version));
      ::raise(SIGKILL);  // a crash in the middle of a broadcast
    }
    if (stop_version != 0 && version == stop_version && received >= total / 2) {
      Say("STUCK " + std::to_string(version));
      ::raise(SIGSTOP);  // a hang: connections stay open, nothing moves
    }
  };
  auto sink = [&](const ReceivedWeights& w) {
    Status st = CompareWeights(w.named, MakeWeights(seed, w.version, kSpec), w.wire_dtype);
    Say(fmt::format("HOLD {} {} {}{}", w.version, DigestTensors(w.named), st.ok() ? "ok" : "bad",
                    w.catch_up ? " catch-up" : ""));
    return st;
  };
  auto r = WeightReceiver::Create(rc, sink, hooks);
  if (!r.ok()) {
    Say("ERROR " + r.status().ToString());
    return 2;
  }
  Say("READY " + (*r)->data_endpoint());
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "leave") {
      Status st = (*r)->Leave(Deadline::InMs(30000));
      Say(st.ok() ? "LEFT ok" : "LEFT " + st.ToString());
    }
  }
  Say(fmt::format("EXIT {}", (*r)->version()));
  r->reset();
  return 0;
}

int RunLearner(const Args& a) {
  log::Init("learner");
  const uint64_t seed = static_cast<uint64_t>(Int(a, "seed", 0));
  BroadcastConfig cfg;
  cfg.backend = *ParseBackend(Str(a, "backend", "gloo"));
  cfg.control_endpoint = Str(a, "endpoint");
  cfg.bucket_bytes = 256 * 1024;
  cfg.chunk_bytes = 64 * 1024;
  cfg.timeout_ms = kTimeoutMs;
  cfg.heartbeat_ms = 100;
  cfg.member_timeout_ms = 4 * kTimeoutMs;
  cfg.shm_prefix = Str(a, "shm_prefix", "/troupe-w");
  auto s = WeightSender::Create(cfg);
  if (!s.ok()) {
    Say("ERROR " + s.status().ToString());
    return 2;
  }
  Say("READY " + (*s)->endpoint());
  Status st =
      (*s)->WaitForMembers(static_cast<size_t>(Int(a, "members", 1)), Deadline::InMs(60000));
  if (!st.ok()) Say("ERROR " + st.ToString());
  for (int64_t v = Int(a, "from", 1); v <= Int(a, "to", 1); ++v) {
    st = (*s)->Broadcast(v, MakeWeights(seed, v, kSpec), Deadline::InMs(60000));
    Say(fmt::format("SENT {} {} {}", v, ExpectedDigest(seed, v, WireDtype::kAsStored),
                    st.ok() ? "ok" : st.ToString()));
  }
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

int RunChild(int argc, char** argv) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (eq != std::string::npos) a[s.substr(0, eq)] = s.substr(eq + 1);
  }
  if (Str(a, "role") == "receiver") return RunReceiver(a);
  if (Str(a, "role") == "learner") return RunLearner(a);
  std::fprintf(stderr, "unknown child role\n");
  return 3;
}

// ----------------------------------------------------------------- parent side

struct Hold {
  uint64_t version = 0;
  uint64_t digest = 0;
  bool ok = false;
  bool catch_up = false;
};

Hold ParseHold(const std::string& line) {
  Hold h;
  std::istringstream in(line);
  std::string tag, ok, extra;
  in >> tag >> h.version >> h.digest >> ok >> extra;
  h.ok = ok == "ok";
  h.catch_up = extra == "catch-up";
  return h;
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Seed();
    char tmpl[] = "/tmp/troupe-bcast-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    shm_prefix_ = fmt::format("/troupe-t{}", ::getpid());
  }

  void TearDown() override {
    // Children exit cleanly when their stdin closes (learners unlink their segments);
    // whatever is still running at the deadline is killed. All are reaped.
    for (auto& c : children_) c->Finish(Deadline::InMs(20000));
    children_.clear();
    std::filesystem::remove_all(dir_);
    // No shared-memory segment of ours survives.
    std::string stem = shm_prefix_.substr(1);
    if (DIR* d = ::opendir("/dev/shm")) {
      while (dirent* e = ::readdir(d))
        EXPECT_NE(std::string(e->d_name).rfind(stem, 0), 0u) << "leaked /dev/shm/" << e->d_name;
      ::closedir(d);
    }
  }

  BroadcastConfig Config(Backend backend) {
    BroadcastConfig c;
    c.backend = backend;
    c.control_endpoint = "ipc://" + dir_ + "/learner.sock";
    c.bucket_bytes = 256 * 1024;
    c.chunk_bytes = 64 * 1024;
    c.timeout_ms = kTimeoutMs;
    c.heartbeat_ms = 100;
    c.member_timeout_ms = 4 * kTimeoutMs;
    c.checksum = true;
    c.shm_prefix = shm_prefix_;
    return c;
  }

  // Starts a child; waits for its READY line unless `wait` is false.
  ChildProcess* Spawn(std::vector<std::string> args, bool wait = true) {
    args.insert(args.begin(), "--child");
    args.push_back(fmt::format("seed={}", Seed()));
    auto c = ChildProcess::Start(g_self, args);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    children_.push_back(std::move(c).value());
    if (wait) WaitReady(children_.back().get());
    return children_.back().get();
  }

  void WaitReady(ChildProcess* c) {
    auto ready = c->WaitFor("READY", Deadline::InMs(60000));
    EXPECT_TRUE(ready.ok()) << ready.status().ToString();
  }

  ChildProcess* SpawnReceiver(const std::string& id, const std::string& endpoint,
                              std::vector<std::string> extra = {}, bool wait = true) {
    extra.insert(extra.begin(), {"role=receiver", "id=" + id, "endpoint=" + endpoint});
    return Spawn(extra, wait);
  }

  // Starts receivers rollout-<i> concurrently (process start-up dominates) and waits for all.
  std::vector<ChildProcess*> SpawnReceivers(const std::vector<std::string>& ids,
                                            const std::string& endpoint,
                                            const std::map<std::string, std::string>& extra = {}) {
    std::vector<ChildProcess*> out;
    for (const auto& id : ids) {
      auto it = extra.find(id);
      out.push_back(SpawnReceiver(
          id, endpoint,
          it == extra.end() ? std::vector<std::string>{} : std::vector<std::string>{it->second},
          false));
    }
    for (auto* c : out) WaitReady(c);
    return out;
  }

  // Reads the child's lines until it reports holding `version`; returns that report.
  Hold WaitHold(ChildProcess* c, uint64_t version) {
    while (true) {
      auto line = c->WaitFor("HOLD", Deadline::InMs(60000));
      if (!line.ok()) {
        ADD_FAILURE() << "child " << c->pid() << " never reported version " << version << ": "
                      << line.status().ToString();
        return {};
      }
      Hold h = ParseHold(*line);
      EXPECT_TRUE(h.ok) << *line;
      if (h.version == version) return h;
    }
  }

  void Broadcast(WeightSender& s, uint64_t from, uint64_t to) {
    for (uint64_t v = from; v <= to; ++v) {
      Status st = s.Broadcast(v, MakeWeights(Seed(), v, kSpec), Deadline::InMs(60000));
      ASSERT_TRUE(st.ok()) << "version " << v << ": " << st.ToString();
    }
  }

  std::string dir_;
  std::string shm_prefix_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

// ----------------------------------------------------------------- bit-exact

struct Shape {
  Backend backend;
  int receivers;
  GlooAlgorithm gloo = GlooAlgorithm::kChain;
  ZmqTopology zmq = ZmqTopology::kChain;
  WireDtype wire = WireDtype::kAsStored;
};

class BitExact : public ProcessTest, public ::testing::WithParamInterface<Shape> {};

// The group grows 1 -> 2 -> 4 receivers (newcomers are caught up, then join); at each size
// two versions are broadcast and every receiver verifies and reports every version it holds.
TEST_P(BitExact, OneTwoAndFourReceiversHoldEveryVersionAndReportIt) {
  const Shape p = GetParam();
  BroadcastConfig cfg = Config(p.backend);
  cfg.gloo_algorithm = p.gloo;
  cfg.zmq_topology = p.zmq;
  cfg.wire_dtype = p.wire;
  auto sender = WeightSender::Create(cfg);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  std::vector<ChildProcess*> rs;
  uint64_t version = 0;
  for (int size : {1, 2, 4}) {
    if (size > p.receivers) break;
    std::vector<std::string> ids;
    for (int i = static_cast<int>(rs.size()); i < size; ++i)
      ids.push_back("rollout-" + std::to_string(i));
    for (ChildProcess* c : SpawnReceivers(ids, (*sender)->endpoint())) rs.push_back(c);
    ASSERT_TRUE((*sender)->WaitForMembers(rs.size(), Deadline::InMs(60000)).ok());
    Broadcast(**sender, version + 1, version + 2);
    version += 2;
    auto report = (*sender)->last_report();
    EXPECT_EQ(report.members.size(), rs.size());
    EXPECT_EQ(report.attempts, 1);
    for (ChildProcess* r : rs) {
      Hold h = WaitHold(r, version);
      EXPECT_FALSE(h.catch_up);
      EXPECT_EQ(h.digest, ExpectedDigest(Seed(), version, p.wire)) << "K=" << size;
    }
  }
  for (ChildProcess* r : rs) {
    EXPECT_EQ(r->Finish(Deadline::InMs(30000)), 0);
    EXPECT_EQ(r->lines().back(), fmt::format("EXIT {}", version));
  }
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  std::string n = BackendName(s.backend);
  if (s.backend == Backend::kGloo) n += std::string("_") + GlooAlgorithmName(s.gloo);
  if (s.backend == Backend::kZmq) n += std::string("_") + ZmqTopologyName(s.zmq);
  if (s.wire == WireDtype::kBFloat16) n += "_bf16";
  return n + "_" + std::to_string(s.receivers);
}

INSTANTIATE_TEST_SUITE_P(Backends, BitExact,
                         ::testing::Values(Shape{Backend::kGloo, 4}, Shape{Backend::kZmq, 4},
                                           Shape{Backend::kShm, 4},
                                           Shape{Backend::kGloo, 2, GlooAlgorithm::kBroadcast},
                                           Shape{Backend::kZmq, 2, {}, ZmqTopology::kStar},
                                           Shape{Backend::kGloo, 2, {}, {}, WireDtype::kBFloat16}),
                         ShapeName);

// ----------------------------------------------------------------- membership

TEST_F(ProcessTest, JoinMidRunGetsCatchUpThenNextEpoch) {
  auto sender = WeightSender::Create(Config(Backend::kGloo));
  ASSERT_TRUE(sender.ok());
  auto ab = SpawnReceivers({"rollout-a", "rollout-b"}, (*sender)->endpoint());
  ChildProcess *a = ab[0], *b = ab[1];
  ASSERT_TRUE((*sender)->WaitForMembers(2, Deadline::InMs(60000)).ok());
  Broadcast(**sender, 1, 2);
  auto* c = SpawnReceiver("rollout-c", (*sender)->endpoint());
  Hold first = WaitHold(c, 2);  // the full current weights before anything else
  EXPECT_TRUE(first.catch_up);
  EXPECT_EQ(first.digest, ExpectedDigest(Seed(), 2, WireDtype::kAsStored));
  ASSERT_TRUE((*sender)->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(**sender, 3, 4);
  EXPECT_EQ((*sender)->last_report().members.size(), 3u);
  for (ChildProcess* r : {a, b, c}) EXPECT_FALSE(WaitHold(r, 4).catch_up);
}

TEST_F(ProcessTest, LeaveIsConfirmedAndTheRestGoOn) {
  auto sender = WeightSender::Create(Config(Backend::kZmq));
  ASSERT_TRUE(sender.ok());
  auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, (*sender)->endpoint());
  ChildProcess *a = abc[0], *b = abc[1], *c = abc[2];
  ASSERT_TRUE((*sender)->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(**sender, 1, 1);
  ASSERT_TRUE(b->Send("leave").ok());
  auto left = b->WaitFor("LEFT", Deadline::InMs(60000));
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left, "LEFT ok");
  Broadcast(**sender, 2, 3);
  auto report = (*sender)->last_report();
  EXPECT_EQ(report.attempts, 1);  // a graceful leave costs no failed attempt
  std::sort(report.members.begin(), report.members.end());
  EXPECT_EQ(report.members, (std::vector<std::string>{"rollout-a", "rollout-c"}));
  WaitHold(a, 3);
  WaitHold(c, 3);
  EXPECT_EQ(b->Finish(Deadline::InMs(30000)), 0);
  EXPECT_EQ(b->lines().back(), "EXIT 1");
}

class KillMidBroadcast : public ProcessTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(KillMidBroadcast, BroadcastFailsWithinTimeoutGroupReformsLearnerGoesOn) {
  const Shape p = GetParam();
  BroadcastConfig cfg = Config(p.backend);
  cfg.gloo_algorithm = p.gloo;
  auto sender = WeightSender::Create(cfg);
  ASSERT_TRUE(sender.ok());
  auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, (*sender)->endpoint(),
                            {{"rollout-b", "kill_version=3"}});
  ChildProcess *a = abc[0], *victim = abc[1], *c = abc[2];
  ASSERT_TRUE((*sender)->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(**sender, 1, 2);
  // Version 3: the victim SIGKILLs itself halfway through receiving it.
  auto t0 = Clock::now();
  Status st = (*sender)->Broadcast(3, MakeWeights(Seed(), 3, kSpec), Deadline::InMs(60000));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto report = (*sender)->last_report();
  std::printf("kill mid-broadcast (%s): %.2f s, %d attempts, failures: %s\n",
              BackendName(p.backend), secs, report.attempts,
              report.failures.empty() ? "-" : report.failures[0].c_str());
  EXPECT_EQ(report.attempts, 2);  // the attempt with the victim failed, the retry did not
  EXPECT_EQ(report.dropped, std::vector<std::string>{"rollout-b"});
  std::sort(report.members.begin(), report.members.end());
  EXPECT_EQ(report.members, (std::vector<std::string>{"rollout-a", "rollout-c"}));
  ASSERT_TRUE(victim->WaitFor("DYING 3", Deadline::InMs(10000)).ok());
  Broadcast(**sender, 4, 4);
  for (ChildProcess* r : {a, c})
    EXPECT_EQ(WaitHold(r, 4).digest, ExpectedDigest(Seed(), 4, WireDtype::kAsStored));
  int status = victim->Finish(Deadline::InMs(10000));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Backends, KillMidBroadcast,
                         ::testing::Values(Shape{Backend::kGloo, 3},
                                           Shape{Backend::kGloo, 3, GlooAlgorithm::kBroadcast},
                                           Shape{Backend::kZmq, 3}, Shape{Backend::kShm, 3}),
                         ShapeName);

class StuckReceiver : public ProcessTest, public ::testing::WithParamInterface<Shape> {};

// A receiver that hangs (SIGSTOP) mid-broadcast keeps its connections open: only the
// timeout can expose it. The attempt fails after timeout_ms, the group re-forms without it.
TEST_P(StuckReceiver, IsDroppedAfterTheTimeoutAndTheRestGetTheVersion) {
  const Shape p = GetParam();
  BroadcastConfig cfg = Config(p.backend);
  cfg.gloo_algorithm = p.gloo;
  auto sender = WeightSender::Create(cfg);
  ASSERT_TRUE(sender.ok());
  auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, (*sender)->endpoint(),
                            {{"rollout-b", "stop_version=2"}});
  ChildProcess *a = abc[0], *victim = abc[1], *c = abc[2];
  ASSERT_TRUE((*sender)->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(**sender, 1, 1);
  auto t0 = Clock::now();
  Status st = (*sender)->Broadcast(2, MakeWeights(Seed(), 2, kSpec), Deadline::InMs(60000));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto report = (*sender)->last_report();
  std::printf("stuck receiver (%s): %.2f s (timeout %lld ms), %d attempts, failures: %s\n",
              BackendName(p.backend), secs, static_cast<long long>(kTimeoutMs), report.attempts,
              report.failures.empty() ? "-" : report.failures[0].c_str());
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(report.attempts, 2);
  EXPECT_EQ(report.dropped, std::vector<std::string>{"rollout-b"});
  ASSERT_TRUE(victim->WaitFor("STUCK 2", Deadline::InMs(10000)).ok());
  for (ChildProcess* r : {a, c}) WaitHold(r, 2);
  victim->Kill(SIGKILL);
  Broadcast(**sender, 3, 3);
  for (ChildProcess* r : {a, c}) WaitHold(r, 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, StuckReceiver,
                         ::testing::Values(Shape{Backend::kGloo, 3}, Shape{Backend::kZmq, 3}),
                         ShapeName);

class LearnerRestart : public ProcessTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(LearnerRestart, ReceiversResyncToTheNewLearnersVersion) {
  const Shape p = GetParam();
  const std::string endpoint = "ipc://" + dir_ + "/learner.sock";
  auto learner_args = [&](int from, int to) {
    return std::vector<std::string>{"role=learner",
                                    "endpoint=" + endpoint,
                                    std::string("backend=") + BackendName(p.backend),
                                    "members=2",
                                    fmt::format("from={}", from),
                                    fmt::format("to={}", to),
                                    "shm_prefix=" + shm_prefix_};
  };
  ChildProcess* first = Spawn(learner_args(1, 3), false);
  auto ab = SpawnReceivers({"rollout-a", "rollout-b"}, endpoint);
  ChildProcess *a = ab[0], *b = ab[1];
  WaitReady(first);
  for (int v = 1; v <= 3; ++v) {
    auto sent = first->WaitFor(fmt::format("SENT {}", v), Deadline::InMs(60000));
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_NE(sent->find(" ok"), std::string::npos) << *sent;
  }
  for (ChildProcess* r : {a, b}) WaitHold(r, 3);
  first->Kill(SIGKILL);  // the learner crashes
  first->Finish(Deadline::InMs(10000));
  // A new learner (resumed from an older checkpoint: version 2) on the same endpoint.
  ChildProcess* second = Spawn(learner_args(2, 4));
  std::string last_sent;
  for (int v = 2; v <= 4; ++v) {
    auto sent = second->WaitFor(fmt::format("SENT {}", v), Deadline::InMs(60000));
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_NE(sent->find(" ok"), std::string::npos) << *sent;
    last_sent = *sent;
  }
  uint64_t digest = std::stoull(last_sent.substr(last_sent.find(' ', 5) + 1));
  for (ChildProcess* r : {a, b}) {
    // Back to the new learner's version 2 (from 3), then forward with it.
    EXPECT_EQ(WaitHold(r, 2).version, 2u);
    EXPECT_EQ(WaitHold(r, 4).digest, digest);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LearnerRestart,
                         ::testing::Values(Shape{Backend::kGloo, 2}, Shape{Backend::kZmq, 2},
                                           Shape{Backend::kShm, 2}),
                         ShapeName);

}  // namespace
}  // namespace troupe::broadcast

int main(int argc, char** argv) {
  troupe::broadcast::g_self = "/proc/self/exe";
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) troupe::broadcast::g_self.assign(buf, static_cast<size_t>(n));
  if (argc > 1 && std::string(argv[1]) == "--child") return troupe::broadcast::RunChild(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
