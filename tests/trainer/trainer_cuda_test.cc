// The learner on CUDA (label gpu; every case skips when torch sees no CUDA device, and
// TROUPE_GPU_TEST_DEVICE=cpu dry-runs them with the CPU in place of the GPU: gpu_device.h).
//
//   * one RL update and one supervised update on CUDA equal the CPU learner's on the
//     same weights and data: loss and gradient norm within a relative 1e-5 / 1e-4, and
//     the updated weights within the bound AdamW's first step allows (see OneUpdate...);
//   * a checkpoint saved on the GPU resumes on the GPU bit for bit (deterministic
//     algorithms on, cuBLAS workspace fixed), and loads into a CPU learner too (the
//     optimizer state moves to the learner's device).
// Own main(): CUBLAS_WORKSPACE_CONFIG must be set before CUDA initialises.
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <random>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "../common/gpu_device.h"
#include "../common/temp_dir.h"
#include "../common/test_seed.h"
#include "test_util.h"
#include "troupe/core/check.h"
#include "troupe/trainer/learner.h"

namespace troupe::trainer {
namespace {

using testing::OnPolicyBatch;
using testing::SeqSpec;

using test_support::TempDir;
using troupe::test_support::GpuTestDevice;

uint64_t Seed() {
  return test_support::TestSeed("trainer_cuda_test");
}

engine::ModelConfig Config() {
  engine::ModelConfig c;
  c.vocab_size = 256;
  c.d_model = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 352;
  c.max_seq_len = 64;
  return c;
}

std::shared_ptr<engine::LlamaModel> Model(uint64_t seed, torch::Device device) {
  return std::make_shared<engine::LlamaModel>(Config(), seed, device);
}

LearnerConfig Cfg() {
  LearnerConfig c;
  c.lr = 1e-3;
  c.warmup_steps = 0;
  c.total_steps = 100;
  c.max_policy_lag = 1000;
  c.weight_decay = 0.01;
  c.entropy_coef = 0.01;
  return c;
}

std::unique_ptr<Learner> Make(const LearnerConfig& c, uint64_t seed, torch::Device device) {
  auto l =
      Learner::Create(c, Model(seed, device), c.kl_coef > 0 ? Model(seed + 1, device) : nullptr);
  TROUPE_CHECK_MSG(l.ok(), "{}", l.status().ToString());
  return std::move(l).value();
}

// Groups of 4 responses of varied lengths with rewards 0..2, behaviour log-probs from `gen`.
TrainBatch Batch(engine::LlamaModel& gen, const std::string& id, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SeqSpec> seqs;
  for (int g = 0; g < 4; ++g) {
    std::vector<int32_t> prompt;
    for (int t = 0, n = 4 + static_cast<int>(rng() % 12); t < n; ++t)
      prompt.push_back(static_cast<int32_t>(1 + rng() % 255));
    for (int k = 0; k < 4; ++k) {
      std::vector<int32_t> resp;
      for (int t = 0, n = 2 + static_cast<int>(rng() % 30); t < n; ++t)
        resp.push_back(static_cast<int32_t>(1 + rng() % 255));
      seqs.push_back({prompt, resp, static_cast<float>(rng() % 3)});
    }
  }
  return OnPolicyBatch(gen, id, 0, 4, seqs);
}

StepMetrics Train(Learner& l, const TrainBatch& b) {
  auto a = l.Offer(b);
  TROUPE_CHECK_MSG(a.ok(), "{}", a.status().ToString());
  auto m = l.Step();
  TROUPE_CHECK_MSG(m.ok(), "{}", m.status().ToString());
  return *m;
}

double Rel(double a, double b) {
  return std::abs(a - b) / std::max(1.0, std::max(std::abs(a), std::abs(b)));
}

// Updated weights of the CUDA learner against the CPU one's. AdamW's first step moves every
// element by about lr * sign(gradient): where a gradient is at float32 noise level the two
// devices may pick opposite signs, so an element may differ by up to 2 lr, but only a few may.
void ExpectWeightsClose(Learner& cpu, Learner& gpu, double lr, const char* what) {
  double max_diff = 0;
  int64_t far = 0, total = 0;
  auto a = cpu.NamedWeights();
  auto b = gpu.NamedWeights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    at::Tensor d = (a[i].second - b[i].second.to(at::kCPU)).abs();
    max_diff = std::max(max_diff, d.max().item<double>());
    far += (d > 1e-2 * lr).sum().item<int64_t>();
    total += d.numel();
  }
  std::printf(
      "%s: weights after the update: max |cpu - cuda| %.3g (lr %.g), %lld of %lld "
      "elements differ by more than lr/100\n",
      what, max_diff, lr, static_cast<long long>(far), static_cast<long long>(total));
  EXPECT_LE(max_diff, 2 * lr * (1 + 1e-3)) << what;
  EXPECT_LE(static_cast<double>(far), 1e-3 * static_cast<double>(total)) << what;
}

TEST(LearnerCuda, OneUpdateEqualsTheCpuLearnersWithinTolerance) {
  TROUPE_REQUIRE_GPU_DEVICE();
  auto cpu = Make(Cfg(), Seed(), torch::kCPU);
  auto gpu = Make(Cfg(), Seed(), GpuTestDevice());
  auto gen = Model(Seed() + 7, torch::kCPU);
  const TrainBatch b = Batch(*gen, "b0", Seed() + 1);
  StepMetrics mc = Train(*cpu, b);
  StepMetrics mg = Train(*gpu, b);
  std::printf("rl update: loss cpu %.9g cuda %.9g, grad norm cpu %.9g cuda %.9g, tokens %lld\n",
              mc.loss, mg.loss, mc.grad_norm, mg.grad_norm, static_cast<long long>(mc.tokens));
  EXPECT_EQ(mc.tokens, mg.tokens);
  EXPECT_LE(Rel(mc.loss, mg.loss), 1e-5);
  EXPECT_LE(Rel(mc.grad_norm, mg.grad_norm), 1e-4);
  ExpectWeightsClose(*cpu, *gpu, Cfg().lr, "rl update");

  // A supervised step on top (the warm start's path: its own lr and eps).
  Demonstrations d;
  for (int a = 4; a < 12; ++a) d.Add({1, a, 3}, {a + 1, a + 2, a + 3, 2});
  auto sc = cpu->SupervisedStep(d);
  auto sg = gpu->SupervisedStep(d);
  ASSERT_TRUE(sc.ok() && sg.ok()) << sc.status().ToString() << sg.status().ToString();
  EXPECT_LE(Rel(sc->loss, sg->loss), 1e-4);
  // Argmax hits: a near-tie among the small random logits may fall either way on a token.
  EXPECT_NEAR(sc->token_accuracy, sg->token_accuracy, 0.05);
}

TEST(LearnerCuda, CheckpointSavedOnTheGpuResumesBitExactly) {
  TROUPE_REQUIRE_GPU_DEVICE();
  // Deterministic kernels where torch has them; an op without one warns (naming itself) and
  // the bit-exact comparison below then fails instead of the whole binary aborting.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  const torch::Device cuda = GpuTestDevice();
  LearnerConfig c = Cfg();
  c.kl_coef = 0.05;  // the reference model is part of the checkpoint too
  auto gen = Model(Seed() + 7, torch::kCPU);
  std::vector<TrainBatch> batches;
  for (int i = 0; i < 5; ++i) batches.push_back(Batch(*gen, "b" + std::to_string(i), Seed() + i));

  TempDir dir;
  auto a = Make(c, Seed(), cuda);
  for (int i = 0; i < 2; ++i) Train(*a, batches[static_cast<size_t>(i)]);
  auto saved = a->SaveCheckpoint(dir.path());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  std::vector<StepMetrics> ma;
  for (int i = 2; i < 5; ++i) ma.push_back(Train(*a, batches[static_cast<size_t>(i)]));

  auto b = Make(c, Seed() + 100, cuda);  // other initial weights: all must come from the file
  Status st = b->LoadCheckpoint(dir.path());
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int i = 2; i < 5; ++i) {
    StepMetrics m = Train(*b, batches[static_cast<size_t>(i)]);
    const StepMetrics& r = ma[static_cast<size_t>(i - 2)];
    EXPECT_EQ(m.loss, r.loss) << "update " << i;
    EXPECT_EQ(m.grad_norm, r.grad_norm) << "update " << i;
    EXPECT_EQ(m.lr, r.lr) << "update " << i;
  }
  auto wa = a->NamedWeights();
  auto wb = b->NamedWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  EXPECT_EQ(a->version(), b->version());

  // The same checkpoint loads into a CPU learner: the weights are the saved ones.
  at::globalContext().setDeterministicAlgorithms(false, false);
  auto cpu = Make(c, Seed() + 200, torch::kCPU);
  st = cpu->LoadCheckpoint(*saved);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto reread = Make(c, Seed() + 300, cuda);
  ASSERT_TRUE(reread->LoadCheckpoint(*saved).ok());
  auto wc = cpu->NamedWeights();
  auto wr = reread->NamedWeights();
  for (size_t i = 0; i < wc.size(); ++i)
    EXPECT_TRUE(at::equal(wc[i].second, wr[i].second.to(at::kCPU))) << wc[i].first;
  StepMetrics next = Train(*cpu, batches[2]);  // the optimizer state arrived on the CPU
  EXPECT_LE(Rel(next.loss, ma[0].loss), 1e-5);
}

}  // namespace
}  // namespace troupe::trainer

int main(int argc, char** argv) {
  // cuBLAS is deterministic only with a fixed workspace, set before the CUDA context exists.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
