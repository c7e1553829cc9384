// The conformance suite every broadcast backend passes: receivers (and, for
// the restart case, learners) are real child processes of this binary
// (re-executed with --child), each with its own ZeroMQ transport network,
// talking over real sockets, gloo groups, NCCL communicators or shared memory.
// The same cases run for gloo, zmq, shm and nccl (nccl only where enough GPUs
// are visible, one per rank: GTEST_SKIP otherwise):
//
//   * bit-exact weights with the group growing 1 -> 2 -> 4 receivers, each
//     receiver verifying every version it holds and reporting it;
//   * join mid-run (catch-up, then the next epoch), graceful leave;
//   * a receiver SIGKILLed in the middle of a transfer: the attempt fails, the
//     group re-forms without it, the retry reaches the rest;
//   * a receiver that hangs (SIGSTOP) mid-transfer: dropped after the timeout;
//     and a Broadcast whose deadline passes while it hangs returns Timeout;
//   * a learner restart: every receiver re-syncs to the new learner's version.
//
// Variants (bit-exact, some with a kill) cover gloo's own broadcast, zmq star,
// the bf16 wire dtype, and CURVE on every socket (keys reach the children on
// stdin, as the launcher hands them to actors).
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

#include "../common/test_seed.h"
#include "child_process.h"
#include "troupe/broadcast/layout.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "troupe/transport/curve.h"
#include "troupe/transport/zmq_network.h"
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
  return test_support::TestSeed("broadcast_conformance_test");
}

uint64_t ExpectedDigest(uint64_t seed, uint64_t version, WireDtype wire) {
  return DigestTensors(ExpectedAfterWire(MakeWeights(seed, version, kSpec), wire));
}

// "CURVE <server public> <server secret> <client public> <client secret>": how the keys
// travel to a child (its stdin), and the network options they make.
std::string CurveLine(const transport::CurveOptions& c) {
  return fmt::format("CURVE {} {} {} {}", c.server.public_key, c.server.secret_key,
                     c.client.public_key, c.client.secret_key);
}

Result<transport::CurveOptions> ParseCurveLine(const std::string& line) {
  std::istringstream in(line);
  std::string tag;
  transport::CurveOptions c;
  in >> tag >> c.server.public_key >> c.server.secret_key >> c.client.public_key >>
      c.client.secret_key;
  if (tag != "CURVE") return InvalidArgument("expected a CURVE line, got '{}'", line);
  c.enabled = true;
  c.allowed_client_public_keys = {c.client.public_key};
  TROUPE_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<std::unique_ptr<transport::Network>> MakeNetwork(const std::string& actor,
                                                        const transport::CurveOptions& curve) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  o.curve = curve;
  return transport::NewZmqNetwork(o);
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

// The child's network; with curve=stdin the keys are the first line of stdin.
Result<std::unique_ptr<transport::Network>> ChildNetwork(const Args& a) {
  transport::CurveOptions curve;
  if (Str(a, "curve") == "stdin") {
    std::string line;
    if (!std::getline(std::cin, line)) return InvalidArgument("no CURVE line on stdin");
    TROUPE_ASSIGN_OR_RETURN(curve, ParseCurveLine(line));
  }
  return MakeNetwork(Str(a, "id", "learner"), curve);
}

int RunReceiver(const Args& a) {
  log::Init(Str(a, "id"));
  const uint64_t seed = static_cast<uint64_t>(Int(a, "seed", 0));
  const uint64_t kill_version = static_cast<uint64_t>(Int(a, "kill_version", 0));
  const uint64_t stop_version = static_cast<uint64_t>(Int(a, "stop_version", 0));
  auto net = ChildNetwork(a);
  if (!net.ok()) {
    Say("ERROR " + net.status().ToString());
    return 2;
  }
  ReceiverConfig rc;
  rc.learner_endpoint = Str(a, "endpoint");
  rc.heartbeat_ms = 100;
  rc.learner_timeout_ms = 4 * kTimeoutMs;
  rc.nccl_device = static_cast<int>(Int(a, "device", 0));
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
  auto r = WeightReceiver::Create(rc, **net, sink, hooks);
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
  auto net = ChildNetwork(a);
  if (!net.ok()) {
    Say("ERROR " + net.status().ToString());
    return 2;
  }
  BroadcastConfig cfg;
  cfg.backend = *ParseBackend(Str(a, "backend", "gloo"));
  cfg.control_endpoint = Str(a, "endpoint");
  cfg.bucket_bytes = 256 * 1024;
  cfg.chunk_bytes = 64 * 1024;
  cfg.timeout_ms = kTimeoutMs;
  cfg.heartbeat_ms = 100;
  cfg.member_timeout_ms = 4 * kTimeoutMs;
  cfg.shm_prefix = Str(a, "shm_prefix", "/troupe-w");
  auto s = WeightSender::Create(cfg, **net);
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

// One backend (and data path) the suite runs against.
struct Variant {
  Backend backend;
  GlooAlgorithm gloo = GlooAlgorithm::kChain;
  ZmqTopology zmq = ZmqTopology::kChain;
  WireDtype wire = WireDtype::kAsStored;
  bool curve = false;
};

std::string VariantName(const ::testing::TestParamInfo<Variant>& info) {
  const Variant& v = info.param;
  std::string n = BackendName(v.backend);
  if (v.backend == Backend::kGloo) n += std::string("_") + GlooAlgorithmName(v.gloo);
  if (v.backend == Backend::kZmq) n += std::string("_") + ZmqTopologyName(v.zmq);
  if (v.wire == WireDtype::kBFloat16) n += "_bf16";
  if (v.curve) n += "_curve";
  return n;
}

class Suite : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    Seed();
    char tmpl[] = "/tmp/troupe-bcast-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    shm_prefix_ = fmt::format("/troupe-t{}", ::getpid());
    if (GetParam().curve) {
      auto server = transport::GenerateCurveKeyPair();
      auto client = transport::GenerateCurveKeyPair();
      ASSERT_TRUE(server.ok() && client.ok());
      curve_.enabled = true;
      curve_.server = *server;
      curve_.client = *client;
      curve_.allowed_client_public_keys = {client->public_key};
    }
    auto net = MakeNetwork("learner", curve_);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    net_ = std::move(net).value();
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

  // nccl needs one GPU per rank: skip (with the reason) when fewer are visible.
  bool MissingDevices(int receivers, std::string* why) {
    if (GetParam().backend != Backend::kNccl) return false;
    if (!BackendCompiled(Backend::kNccl)) {
      *why = "the nccl backend is not built (no CUDA + NCCL at build time)";
      return true;
    }
    BroadcastConfig probe = Config();
    probe.control_endpoint = "ipc://" + dir_ + "/probe.sock";
    probe.nccl_device = receivers;  // the highest device a rank would use
    auto s = WeightSender::Create(probe, *net_);
    if (s.ok()) return false;
    *why = fmt::format("needs {} visible CUDA devices (one per rank): {}", receivers + 1,
                       s.status().ToString());
    return true;
  }

  BroadcastConfig Config() {
    const Variant& v = GetParam();
    BroadcastConfig c;
    c.backend = v.backend;
    c.gloo_algorithm = v.gloo;
    c.zmq_topology = v.zmq;
    c.wire_dtype = v.wire;
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

  std::unique_ptr<WeightSender> Sender() {
    auto s = WeightSender::Create(Config(), *net_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  // Starts a child; waits for its READY line unless `wait` is false.
  ChildProcess* Spawn(std::vector<std::string> args, bool wait = true) {
    args.insert(args.begin(), "--child");
    args.push_back(fmt::format("seed={}", Seed()));
    if (curve_.enabled) args.push_back("curve=stdin");
    auto c = ChildProcess::Start(g_self, args);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    if (curve_.enabled) {
      EXPECT_TRUE((*c)->Send(CurveLine(curve_)).ok());
    }
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
    extra.insert(extra.begin(), {"role=receiver", "id=" + id, "endpoint=" + endpoint,
                                 fmt::format("device={}", ++receivers_started_)});
    return Spawn(extra, wait);
  }

  // Starts receivers concurrently (process start-up dominates) and waits for all.
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

  // ----------------------------------------------------------------- the cases

  // The group grows 1 -> 2 -> 4 receivers (newcomers are caught up, then join); at each size
  // two versions are broadcast and every receiver verifies and reports every version it holds.
  void BitExactOneTwoFour() {
    std::string why;
    if (MissingDevices(1, &why)) GTEST_SKIP() << why;
    auto sender = Sender();
    ASSERT_TRUE(sender);
    std::vector<ChildProcess*> rs;
    uint64_t version = 0;
    for (int size : {1, 2, 4}) {
      if (MissingDevices(size, &why)) {
        std::printf("stopping at %zu receivers: %s\n", rs.size(), why.c_str());
        break;
      }
      std::vector<std::string> ids;
      for (int i = static_cast<int>(rs.size()); i < size; ++i)
        ids.push_back("rollout-" + std::to_string(i));
      for (ChildProcess* c : SpawnReceivers(ids, sender->endpoint())) rs.push_back(c);
      ASSERT_TRUE(sender->WaitForMembers(rs.size(), Deadline::InMs(60000)).ok());
      Broadcast(*sender, version + 1, version + 2);
      version += 2;
      auto report = sender->last_report();
      EXPECT_EQ(report.members.size(), rs.size());
      EXPECT_EQ(report.attempts, 1);
      for (ChildProcess* r : rs) {
        Hold h = WaitHold(r, version);
        EXPECT_FALSE(h.catch_up);
        EXPECT_EQ(h.digest, ExpectedDigest(Seed(), version, GetParam().wire)) << "K=" << size;
      }
    }
    for (ChildProcess* r : rs) {
      EXPECT_EQ(r->Finish(Deadline::InMs(30000)), 0);
      EXPECT_EQ(r->lines().back(), fmt::format("EXIT {}", version));
    }
  }

  void KillMidTransfer() {
    std::string why;
    if (MissingDevices(3, &why)) GTEST_SKIP() << why;
    auto sender = Sender();
    ASSERT_TRUE(sender);
    auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, sender->endpoint(),
                              {{"rollout-b", "kill_version=3"}});
    ChildProcess *a = abc[0], *victim = abc[1], *c = abc[2];
    ASSERT_TRUE(sender->WaitForMembers(3, Deadline::InMs(60000)).ok());
    Broadcast(*sender, 1, 2);
    // Version 3: the victim SIGKILLs itself halfway through receiving it.
    auto t0 = Clock::now();
    Status st = sender->Broadcast(3, MakeWeights(Seed(), 3, kSpec), Deadline::InMs(60000));
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto report = sender->last_report();
    std::printf("kill mid-broadcast (%s): %.2f s, %d attempts, failures: %s\n",
                BackendName(GetParam().backend), secs, report.attempts,
                report.failures.empty() ? "-" : report.failures[0].c_str());
    EXPECT_EQ(report.attempts, 2);  // the attempt with the victim failed, the retry did not
    EXPECT_EQ(report.dropped, std::vector<std::string>{"rollout-b"});
    std::sort(report.members.begin(), report.members.end());
    EXPECT_EQ(report.members, (std::vector<std::string>{"rollout-a", "rollout-c"}));
    ASSERT_TRUE(victim->WaitFor("DYING 3", Deadline::InMs(10000)).ok());
    Broadcast(*sender, 4, 4);
    for (ChildProcess* r : {a, c})
      EXPECT_EQ(WaitHold(r, 4).digest, ExpectedDigest(Seed(), 4, GetParam().wire));
    int status = victim->Finish(Deadline::InMs(10000));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }

  std::string dir_;
  std::string shm_prefix_;
  transport::CurveOptions curve_;
  std::unique_ptr<transport::Network> net_;  // the parent (learner) network; outlives senders
  std::vector<std::unique_ptr<ChildProcess>> children_;
  int receivers_started_ = 0;  // nccl: receiver i uses CUDA device i (the learner device 0)
};

// ----------------------------------------------------------------- every backend

class Conformance : public Suite {};

TEST_P(Conformance, OneTwoAndFourReceiversHoldEveryVersionAndReportIt) {
  BitExactOneTwoFour();
}

TEST_P(Conformance, JoinMidRunGetsCatchUpThenNextEpoch) {
  std::string why;
  if (MissingDevices(3, &why)) GTEST_SKIP() << why;
  auto sender = Sender();
  ASSERT_TRUE(sender);
  auto ab = SpawnReceivers({"rollout-a", "rollout-b"}, sender->endpoint());
  ChildProcess *a = ab[0], *b = ab[1];
  ASSERT_TRUE(sender->WaitForMembers(2, Deadline::InMs(60000)).ok());
  Broadcast(*sender, 1, 2);
  auto* c = SpawnReceiver("rollout-c", sender->endpoint());
  Hold first = WaitHold(c, 2);  // the full current weights before anything else
  EXPECT_TRUE(first.catch_up);
  EXPECT_EQ(first.digest, ExpectedDigest(Seed(), 2, WireDtype::kAsStored));
  ASSERT_TRUE(sender->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(*sender, 3, 4);
  EXPECT_EQ(sender->last_report().members.size(), 3u);
  for (ChildProcess* r : {a, b, c}) EXPECT_FALSE(WaitHold(r, 4).catch_up);
}

TEST_P(Conformance, LeaveIsConfirmedAndTheRestGoOn) {
  std::string why;
  if (MissingDevices(3, &why)) GTEST_SKIP() << why;
  auto sender = Sender();
  ASSERT_TRUE(sender);
  auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, sender->endpoint());
  ChildProcess *a = abc[0], *b = abc[1], *c = abc[2];
  ASSERT_TRUE(sender->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(*sender, 1, 1);
  ASSERT_TRUE(b->Send("leave").ok());
  auto left = b->WaitFor("LEFT", Deadline::InMs(60000));
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left, "LEFT ok");
  Broadcast(*sender, 2, 3);
  auto report = sender->last_report();
  EXPECT_EQ(report.attempts, 1);  // a graceful leave costs no failed attempt
  std::sort(report.members.begin(), report.members.end());
  EXPECT_EQ(report.members, (std::vector<std::string>{"rollout-a", "rollout-c"}));
  WaitHold(a, 3);
  WaitHold(c, 3);
  EXPECT_EQ(b->Finish(Deadline::InMs(30000)), 0);
  EXPECT_EQ(b->lines().back(), "EXIT 1");
}

TEST_P(Conformance, KillMidTransferFailsTheAttemptAndTheRetryReachesTheRest) {
  KillMidTransfer();
}

// A receiver that hangs (SIGSTOP) mid-broadcast keeps its connections open: only the
// timeout can expose it. The attempt fails after timeout_ms, the group re-forms without it.
TEST_P(Conformance, StuckReceiverIsDroppedAfterTheTimeoutAndTheRestGetTheVersion) {
  std::string why;
  if (MissingDevices(3, &why)) GTEST_SKIP() << why;
  auto sender = Sender();
  ASSERT_TRUE(sender);
  auto abc = SpawnReceivers({"rollout-a", "rollout-b", "rollout-c"}, sender->endpoint(),
                            {{"rollout-b", "stop_version=2"}});
  ChildProcess *a = abc[0], *victim = abc[1], *c = abc[2];
  ASSERT_TRUE(sender->WaitForMembers(3, Deadline::InMs(60000)).ok());
  Broadcast(*sender, 1, 1);
  auto t0 = Clock::now();
  Status st = sender->Broadcast(2, MakeWeights(Seed(), 2, kSpec), Deadline::InMs(60000));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto report = sender->last_report();
  std::printf("stuck receiver (%s): %.2f s (timeout %lld ms), %d attempts, failures: %s\n",
              BackendName(GetParam().backend), secs, static_cast<long long>(kTimeoutMs),
              report.attempts, report.failures.empty() ? "-" : report.failures[0].c_str());
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(report.attempts, 2);
  EXPECT_EQ(report.dropped, std::vector<std::string>{"rollout-b"});
  ASSERT_TRUE(victim->WaitFor("STUCK 2", Deadline::InMs(10000)).ok());
  for (ChildProcess* r : {a, c}) WaitHold(r, 2);
  victim->Kill(SIGKILL);
  Broadcast(*sender, 3, 3);
  for (ChildProcess* r : {a, c}) WaitHold(r, 3);
}

// The caller's deadline bounds a Broadcast whatever the members do: with one of them hung
// mid-transfer and a deadline shorter than the stall timeout, the call returns Timeout; the
// next call (time enough) re-forms without the hung member and reaches the rest.
TEST_P(Conformance, DeadlineBoundsABroadcastWithAHungMember) {
  std::string why;
  if (MissingDevices(2, &why)) GTEST_SKIP() << why;
  auto sender = Sender();
  ASSERT_TRUE(sender);
  auto ab = SpawnReceivers({"rollout-a", "rollout-b"}, sender->endpoint(),
                           {{"rollout-b", "stop_version=2"}});
  ChildProcess *a = ab[0], *victim = ab[1];
  ASSERT_TRUE(sender->WaitForMembers(2, Deadline::InMs(60000)).ok());
  Broadcast(*sender, 1, 1);
  auto t0 = Clock::now();
  Status st = sender->Broadcast(2, MakeWeights(Seed(), 2, kSpec), Deadline::InMs(kTimeoutMs / 3));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("hung member, deadline %lld ms (%s): returned after %.2f s: %s\n",
              static_cast<long long>(kTimeoutMs / 3), BackendName(GetParam().backend), secs,
              st.ToString().c_str());
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  ASSERT_TRUE(victim->WaitFor("STUCK 2", Deadline::InMs(10000)).ok());
  Broadcast(*sender, 3, 3);
  auto report = sender->last_report();
  EXPECT_EQ(report.members, std::vector<std::string>{"rollout-a"});
  EXPECT_EQ(WaitHold(a, 3).digest, ExpectedDigest(Seed(), 3, GetParam().wire));
  victim->Kill(SIGKILL);
}

TEST_P(Conformance, LearnerRestartResyncsReceiversToTheNewLearnersVersion) {
  std::string why;
  if (MissingDevices(2, &why)) GTEST_SKIP() << why;
  const std::string endpoint = "ipc://" + dir_ + "/learner.sock";
  auto learner_args = [&](int from, int to) {
    return std::vector<std::string>{"role=learner",
                                    "endpoint=" + endpoint,
                                    std::string("backend=") + BackendName(GetParam().backend),
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

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Values(Variant{Backend::kGloo}, Variant{Backend::kZmq},
                                           Variant{Backend::kShm}, Variant{Backend::kNccl}),
                         VariantName);

// ----------------------------------------------------------------- variants

class VariantBitExact : public Suite {};
TEST_P(VariantBitExact, OneTwoAndFourReceiversHoldEveryVersionAndReportIt) {
  BitExactOneTwoFour();
}
INSTANTIATE_TEST_SUITE_P(Variants, VariantBitExact,
                         ::testing::Values(Variant{Backend::kGloo, GlooAlgorithm::kBroadcast},
                                           Variant{Backend::kZmq, {}, ZmqTopology::kStar},
                                           Variant{Backend::kGloo, {}, {}, WireDtype::kBFloat16},
                                           Variant{Backend::kZmq, {}, {}, {}, /*curve=*/true},
                                           Variant{Backend::kGloo, {}, {}, {}, /*curve=*/true}),
                         VariantName);

class VariantKill : public Suite {};
TEST_P(VariantKill, KillMidTransferFailsTheAttemptAndTheRetryReachesTheRest) {
  KillMidTransfer();
}
INSTANTIATE_TEST_SUITE_P(Variants, VariantKill,
                         ::testing::Values(Variant{Backend::kGloo, GlooAlgorithm::kBroadcast},
                                           Variant{Backend::kZmq, {}, {}, {}, /*curve=*/true}),
                         VariantName);

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
