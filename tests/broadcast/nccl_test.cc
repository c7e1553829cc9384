// nccl backend tests (label gpu). Skipped when no CUDA device is visible; the
// multi-rank cases need one GPU per rank (NCCL refuses two ranks on one GPU).
//
//   * a communicator whose peer never arrives is aborted at the deadline, not
//     waited on (the no-hang guarantee, one GPU);
//   * a single-rank group runs the whole staging + ncclBroadcast path (one GPU), and
//     moves a stream packed from CUDA tensors into device memory with no staging;
//   * with G >= 2 GPUs: the learner on GPU 0 and G-1 (up to 4) receiver
//     processes on the others get every version bit-exact, and a receiver
//     SIGKILLed mid-broadcast is dropped while the rest go on.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <iostream>
#include <map>
#include <random>

#include "child_process.h"
#include "nccl_path.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "troupe/transport/zmq_network.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::MakeWeights;
using testing::WeightsSpec;
using troupe::testing::ChildProcess;

const WeightsSpec kSpec{8, 64, 128, 512};
std::string g_self;

uint64_t Seed() {
  static uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("broadcast_nccl_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

int Gpus() {
  return NcclGroup::VisibleDevices();
}

std::unique_ptr<transport::Network> Net(const std::string& actor) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  auto n = transport::NewZmqNetwork(o);
  TROUPE_CHECK_MSG(n.ok(), "network: {}", n.status().ToString());
  return std::move(n).value();
}

#define REQUIRE_GPUS(n)                                                               \
  do {                                                                                \
    if (Gpus() < (n))                                                                 \
      GTEST_SKIP() << "needs " << (n) << " visible CUDA device(s), found " << Gpus(); \
  } while (0)

TEST(Nccl, CommunicatorWithAMissingPeerIsAbortedAtTheDeadline) {
  REQUIRE_GPUS(1);
  auto id = NcclGroup::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto t0 = Clock::now();
  // Rank 0 of 2; rank 1 never comes: initialisation cannot complete.
  auto g = NcclGroup::Form(*id, 0, 2, 0, Deadline::InMs(3000), [] { return false; });
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), Code::kTimeout) << g.status().ToString();
  EXPECT_LT(secs, 60.0);  // bounded by the deadline (plus the abort), not hung
  std::printf("aborted after %.2f s: %s\n", secs, g.status().ToString().c_str());
}

TEST(Nccl, SingleRankRunsStagingAndBroadcast) {
  REQUIRE_GPUS(1);
  auto id = NcclGroup::NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto g = NcclGroup::Form(*id, 0, 1, 0, Deadline::InMs(30000), [] { return false; });
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto w = MakeWeights(Seed(), 1, kSpec);
  auto layout = PlanLayout(w, WireDtype::kAsStored, 1 << 20, 1 << 18);
  ASSERT_TRUE(layout.ok());
  std::vector<uint8_t> flat(layout->total_bytes);
  ASSERT_TRUE(PackTensors(w, *layout, flat.data()).ok());
  Status st = (*g)->Transfer(flat.data(), *layout, Deadline::InMs(30000), [] { return false; });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A stream already in the GPU's memory (PackTensors into a device stream) moves with no staging
// buffer; what lands unpacks into CUDA tensors equal to what was packed.
TEST(Nccl, SingleRankMovesADeviceStreamWithoutStaging) {
  REQUIRE_GPUS(1);
  auto id = NcclGroup::NewUniqueId();
  ASSERT_TRUE(id.ok());
  auto g = NcclGroup::Form(*id, 0, 1, 0, Deadline::InMs(30000), [] { return false; });
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const at::Device cuda(at::kCUDA, 0);
  NamedTensors host = MakeWeights(Seed(), 2, kSpec);
  NamedTensors w;
  for (const auto& [name, t] : host) w.emplace_back(name, t.to(cuda));
  auto layout = PlanLayout(w, WireDtype::kAsStored, 1 << 20, 1 << 18);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  uint8_t* flat = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&flat), layout->total_bytes), cudaSuccess);
  std::shared_ptr<void> owner(flat, [](void* p) { cudaFree(p); });
  ASSERT_TRUE(PackTensors(w, *layout, flat, cuda).ok());
  Status st = (*g)->Transfer(flat, *layout, Deadline::InMs(30000), [] { return false; });
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto got = UnpackTensors(*layout, flat, owner, nullptr, nullptr, cuda);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  NamedTensors back;
  for (const auto& [name, t] : *got) back.emplace_back(name, t.to(at::kCPU));
  Status same = CompareWeights(back, host, WireDtype::kAsStored);
  EXPECT_TRUE(same.ok()) << same.ToString();
}

TEST(Nccl, LearnerAloneBroadcasts) {
  REQUIRE_GPUS(1);
  BroadcastConfig cfg;
  cfg.backend = Backend::kNccl;
  cfg.timeout_ms = 10000;
  auto net = Net("learner");
  auto s = WeightSender::Create(cfg, *net);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE((*s)->Broadcast(1, MakeWeights(Seed(), 1, kSpec), Deadline::InMs(30000)).ok());
}

class NcclProcesses : public ::testing::Test {
 protected:
  ChildProcess* SpawnReceiver(const std::string& id, const std::string& endpoint, int device,
                              const std::string& extra = "") {
    auto c = ChildProcess::Start(
        g_self, {"--child", "id=" + id, "endpoint=" + endpoint, fmt::format("device={}", device),
                 fmt::format("seed={}", Seed()), extra});
    EXPECT_TRUE(c.ok());
    children_.push_back(std::move(c).value());
    EXPECT_TRUE(children_.back()->WaitFor("READY", Deadline::InMs(120000)).ok());
    return children_.back().get();
  }
  void TearDown() override {
    for (auto& c : children_) c->Finish(Deadline::InMs(30000));
  }
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

TEST_F(NcclProcesses, EveryGpuReceiverHoldsEveryVersionAndSurvivesAKill) {
  REQUIRE_GPUS(2);
  const int receivers = std::min(Gpus() - 1, 4);
  BroadcastConfig cfg;
  cfg.backend = Backend::kNccl;
  cfg.nccl_device = 0;
  cfg.bucket_bytes = 1 << 20;
  cfg.timeout_ms = 10000;
  cfg.heartbeat_ms = 100;
  cfg.member_timeout_ms = 40000;
  auto net = Net("learner");
  auto s = WeightSender::Create(cfg, *net);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<ChildProcess*> rs;
  for (int i = 0; i < receivers; ++i)
    rs.push_back(SpawnReceiver(fmt::format("gpu-{}", i + 1), (*s)->endpoint(), i + 1,
                               i == 0 && receivers > 1 ? "kill_version=3" : ""));
  ASSERT_TRUE((*s)->WaitForMembers(rs.size(), Deadline::InMs(120000)).ok());
  for (uint64_t v = 1; v <= 4; ++v) {
    Status st = (*s)->Broadcast(v, MakeWeights(Seed(), v, kSpec), Deadline::InMs(120000));
    ASSERT_TRUE(st.ok()) << "version " << v << ": " << st.ToString();
  }
  auto report = (*s)->last_report();
  EXPECT_EQ(report.members.size(), receivers > 1 ? rs.size() - 1 : rs.size());
  for (size_t i = receivers > 1 ? 1 : 0; i < rs.size(); ++i) {
    auto line = rs[i]->WaitFor("HOLD 4", Deadline::InMs(60000));
    ASSERT_TRUE(line.ok());
    EXPECT_NE(line->find(" ok"), std::string::npos) << *line;
  }
}

int RunChild(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (eq != std::string::npos) a[s.substr(0, eq)] = s.substr(eq + 1);
  }
  log::Init(a["id"]);
  const uint64_t seed = std::stoull(a["seed"]);
  const uint64_t kill = a["kill_version"].empty() ? 0 : std::stoull(a["kill_version"]);
  ReceiverConfig rc;
  rc.actor_id = a["id"];
  rc.learner_endpoint = a["endpoint"];
  rc.nccl_device = std::stoi(a["device"]);
  rc.heartbeat_ms = 100;
  ReceiverHooks hooks;
  hooks.on_progress = [&](uint64_t v, uint64_t got, uint64_t total) {
    if (kill != 0 && v == kill && got >= total / 2) ::raise(SIGKILL);
  };
  auto net = Net(a["id"]);
  auto r = WeightReceiver::Create(
      rc, *net,
      [&](const ReceivedWeights& w) {
        Status st = CompareWeights(w.named, MakeWeights(seed, w.version, kSpec), w.wire_dtype);
        std::printf("HOLD %llu %s\n", static_cast<unsigned long long>(w.version),
                    st.ok() ? "ok" : st.ToString().c_str());
        std::fflush(stdout);
        return st;
      },
      hooks);
  if (!r.ok()) {
    std::printf("ERROR %s\n", r.status().ToString().c_str());
    return 2;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

}  // namespace
}  // namespace troupe::broadcast

int main(int argc, char** argv) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  troupe::broadcast::g_self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : argv[0];
  if (argc > 1 && std::string(argv[1]) == "--child") return troupe::broadcast::RunChild(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
