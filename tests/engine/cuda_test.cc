// The engine on CUDA against the engine on the CPU (label gpu; every case skips when torch
// sees no CUDA device, e.g. with Debian's CPU-only libtorch; TROUPE_GPU_TEST_DEVICE=cpu
// dry-runs them with the CPU's plain torch ops path in place of the GPU, see gpu_device.h).
//
//   * same weights, same prompts, greedy: the CUDA engine (KV cache on the device,
//     continuous batching over more requests than slots, stop tokens and length limits)
//     returns the CPU engine's tokens, and behaviour log-probs within 1e-3 (float32);
//     a divergence is accepted only right after a near-tie of the CPU's two best
//     logits (gap < kTieGap), where either choice is correct, and then counted;
//   * bfloat16 on CUDA: the tokens it chose, scored by the float32 CPU model, within the
//     bound the test prints (the measured figure goes to docs/gpu.md);
//   * a weight update lands on the device (UpdateWeights with CPU tensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "../common/gpu_device.h"
#include "test_util.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/model.h"

namespace troupe::engine {
namespace {

using testing::TestSeed;

constexpr double kLogprobTol = 1e-3;  // float32, CUDA vs CPU
constexpr double kTieGap = 1e-4;      // CPU top-2 logit gap below which either token is right

using troupe::test_support::GpuTestDevice;

// The engine under test: on the GPU (the plain torch ops path), or in a dry run on the CPU
// with the fused kernels off (the same path the GPU takes).
std::string GpuEngineDevice() {
  return GpuTestDevice().is_cuda() ? "cuda" : "cpu";
}

// Big enough that the device path runs real GEMMs and attention; peaked enough (std 0.08) that
// greedy choices are rarely near-ties.
ModelConfig Config(DType dtype) {
  ModelConfig c;
  c.vocab_size = 512;
  c.d_model = 256;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.ffn_dim = 704;
  c.max_seq_len = 160;
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.rope_theta = 1e6;
  c.dtype = dtype;
  return c;
}

// The weights are drawn on the CPU whatever the device: equal seeds give equal weights.
std::shared_ptr<LlamaModel> Model(const ModelConfig& c, torch::Device device) {
  auto m = std::make_shared<LlamaModel>(c, TestSeed(), device);
  m->InitRandom(TestSeed(), 0.08);
  return m;
}

// `plain`: the device path's torch ops even on the CPU (the fused CPU kernels off).
std::unique_ptr<Engine> MakeEngine(const ModelConfig& c, const std::string& device, int32_t slots,
                                   std::shared_ptr<LlamaModel> model, bool plain = false) {
  EngineConfig ec;
  ec.model = c;
  ec.num_slots = slots;
  ec.device = device;
  ec.fused_cpu_kernels = !plain;
  ec.intra_op_threads = 0;
  auto e = Engine::Create(ec, std::move(model));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Prompts of varied lengths; some requests stop early on token 7, lengths vary.
std::vector<GenerateRequest> Requests(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    const int len = 3 + static_cast<int>(rng() % 40);
    for (int t = 0; t < len; ++t) r.prompt.push_back(static_cast<int32_t>(1 + rng() % 511));
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 8 + static_cast<int32_t>(rng() % 48);
    if (i % 3 == 0) r.sampling.stop_token_ids = {7};
    r.sampling.num_samples = (i % 4 == 0) ? 2 : 1;
    r.tag = static_cast<uint64_t>(i);
    out.push_back(std::move(r));
  }
  return out;
}

// The CPU model's float32 log-probs of `response` after `prompt` (teacher forcing) and, per
// position, the gap between its two best logits.
struct Scored {
  std::vector<float> logprobs;
  std::vector<float> top2_gap;
};
Scored Score(LlamaModel& cpu, const std::vector<int32_t>& prompt,
             const std::vector<int32_t>& response) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), response.begin(), response.end());
  at::Tensor t = at::tensor(ids, at::kLong).view({1, -1});
  at::Tensor logits = cpu.Forward(t.slice(1, 0, t.size(1) - 1))
                          .slice(1, static_cast<int64_t>(prompt.size()) - 1)
                          .squeeze(0);
  at::Tensor lp =
      TokenLogprobs(logits.unsqueeze(0), t.slice(1, static_cast<int64_t>(prompt.size())), 1.0)
          .squeeze(0)
          .contiguous();
  at::Tensor top2 = std::get<0>(logits.topk(2, -1));
  at::Tensor gap = (top2.select(1, 0) - top2.select(1, 1)).contiguous();
  Scored s;
  s.logprobs.assign(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel());
  s.top2_gap.assign(gap.data_ptr<float>(), gap.data_ptr<float>() + gap.numel());
  return s;
}

TEST(EngineCuda, GreedyTokensEqualTheCpuEngineAndLogprobsWithin1e3) {
  TROUPE_REQUIRE_GPU_DEVICE();
  const ModelConfig c = Config(DType::kFloat32);
  auto cpu_model = Model(c, torch::kCPU);
  auto cpu = MakeEngine(c, "cpu", 6, cpu_model);
  auto gpu = MakeEngine(c, GpuEngineDevice(), 6, Model(c, GpuTestDevice()), /*plain=*/true);
  ASSERT_TRUE(cpu && gpu);
  const auto reqs = Requests(24, TestSeed() + 1);  // 30 samples through 6 slots: refills
  auto a = cpu->Generate(reqs, Deadline::InMs(600000));
  auto b = gpu->Generate(reqs, Deadline::InMs(600000));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->size(), b->size());
  int ties = 0;
  size_t tokens = 0;
  double max_diff = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    const GenerationResult& x = (*a)[i];
    const GenerationResult& y = (*b)[i];
    ASSERT_EQ(x.finish_reason == FinishReason::kRejected, false) << x.reject_reason;
    size_t same = 0;
    while (same < x.response_ids.size() && same < y.response_ids.size() &&
           x.response_ids[same] == y.response_ids[same])
      ++same;
    if (same < x.response_ids.size() || same < y.response_ids.size()) {
      // They differ at `same`: only a near-tie on the CPU side may explain it.
      ASSERT_LT(same, x.response_ids.size()) << "result " << i << ": CUDA ran past the CPU";
      Scored s = Score(*cpu_model, x.prompt_ids, x.response_ids);
      EXPECT_LT(s.top2_gap[same], kTieGap)
          << "result " << i << " diverges at token " << same << " (cpu " << x.response_ids[same]
          << ", cuda " << (same < y.response_ids.size() ? y.response_ids[same] : -1)
          << ") without a near-tie: top-2 gap " << s.top2_gap[same];
      ++ties;
    } else {
      EXPECT_EQ(x.finish_reason, y.finish_reason) << "result " << i;
    }
    for (size_t t = 0; t < same; ++t) {
      const double d = std::abs(static_cast<double>(x.logprobs[t]) - y.logprobs[t]);
      max_diff = std::max(max_diff, d);
      EXPECT_LE(d, kLogprobTol) << "result " << i << " token " << t;
    }
    tokens += same;
  }
  std::printf(
      "engine cuda vs cpu (float32): %zu tokens compared, max |dlogprob| %.3g, "
      "%d of %zu sequences cut at a near-tie\n",
      tokens, max_diff, ties, a->size());
  EXPECT_LE(ties, static_cast<int>(a->size() / 10));  // ties are rare with these weights
  EXPECT_GT(tokens, size_t{500});
}

TEST(EngineCuda, Bfloat16LogprobsAgainstFloat32Cpu) {
  TROUPE_REQUIRE_GPU_DEVICE();
  const ModelConfig c32 = Config(DType::kFloat32);
  ModelConfig c16 = Config(DType::kBFloat16);
  auto cpu_model = Model(c32, torch::kCPU);
  auto gpu_model = std::make_shared<LlamaModel>(c16, TestSeed(), GpuTestDevice());
  ASSERT_TRUE(gpu_model->LoadNamed(cpu_model->NamedWeights()).ok());  // same weights, rounded
  auto gpu = MakeEngine(c16, GpuEngineDevice(), 8, gpu_model, /*plain=*/true);
  ASSERT_TRUE(gpu);
  auto b = gpu->Generate(Requests(16, TestSeed() + 2), Deadline::InMs(600000));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  double max_diff = 0, sum = 0;
  size_t n = 0;
  for (const GenerationResult& y : *b) {
    Scored s = Score(*cpu_model, y.prompt_ids, y.response_ids);
    for (size_t t = 0; t < y.response_ids.size(); ++t) {
      const double d = std::abs(static_cast<double>(y.logprobs[t]) - s.logprobs[t]);
      max_diff = std::max(max_diff, d);
      sum += d;
      ++n;
    }
  }
  ASSERT_GT(n, size_t{100});
  std::printf(
      "engine cuda bfloat16 vs cpu float32 on the same tokens: %zu tokens, "
      "max |dlogprob| %.3g, mean %.3g\n",
      n, max_diff, sum / static_cast<double>(n));
  // bfloat16 keeps 8 bits of mantissa: per-token log-prob errors of a few 1e-2 are expected
  // (the CPU dry run measured mean 0.03, max 0.13); a broken path is off by whole nats.
  EXPECT_LT(sum / static_cast<double>(n), 0.1);
  EXPECT_LT(max_diff, 0.5);
}

TEST(EngineCuda, WeightUpdateFromCpuTensorsLandsOnTheDevice) {
  TROUPE_REQUIRE_GPU_DEVICE();
  const ModelConfig c = Config(DType::kFloat32);
  auto cpu_model = Model(c, torch::kCPU);
  auto gpu = MakeEngine(c, GpuEngineDevice(), 4,
                        std::make_shared<LlamaModel>(c, TestSeed() + 9, GpuTestDevice()),
                        /*plain=*/true);
  ASSERT_TRUE(gpu);
  auto cpu = MakeEngine(c, "cpu", 4, cpu_model);
  ASSERT_TRUE(cpu);
  // The CUDA engine starts from other weights and receives the CPU model's (as a broadcast
  // receiver hands them over: host tensors).
  NamedTensors host;
  for (auto& [name, t] : cpu_model->NamedWeights()) host.emplace_back(name, t.clone());
  ASSERT_TRUE(gpu->UpdateWeights(1, host, Deadline::InMs(60000)).ok());
  EXPECT_EQ(gpu->version(), 1u);
  const auto reqs = Requests(4, TestSeed() + 3);
  auto a = cpu->Generate(reqs, Deadline::InMs(600000));
  auto b = gpu->Generate(reqs, Deadline::InMs(600000));
  ASSERT_TRUE(a.ok() && b.ok());
  // The first token of each result already tells whether the weights arrived.
  for (size_t i = 0; i < a->size(); ++i) {
    ASSERT_FALSE((*a)[i].response_ids.empty());
    EXPECT_EQ((*a)[i].response_ids[0], (*b)[i].response_ids[0]) << "result " << i;
    EXPECT_EQ((*b)[i].policy_version, 1u);
  }
}

}  // namespace
}  // namespace troupe::engine
