// Engine: continuous batching, exact behaviour log-probs, seeds, rejections, versions.
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/logprob.h"

namespace troupe::engine {
namespace {

using testing::TestSeed;
using testing::TinyConfig;

constexpr int64_t kWaitMs = 120000;  // generous bound for every wait (loaded CI machine)

// A latch with a bounded wait.
class Latch {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait(int64_t ms = kWaitMs) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(ms), [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

EngineConfig SmallEngine(int slots) {
  EngineConfig c;
  c.model = TinyConfig();
  c.num_slots = slots;
  c.max_seq_len = 40;
  return c;
}

std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int len, int vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return p;
}

// Recomputes every response token's log-prob with one full forward pass over the final
// sequence and compares it with what the sampler recorded (mask 1), or checks 0 (mask 0).
void ExpectLogprobsMatchForward(LlamaModel& model, const std::vector<GenerateRequest>& reqs,
                                const std::vector<GenerationResult>& results, double tol) {
  c10::InferenceMode guard;
  for (const GenerationResult& r : results) {
    ASSERT_TRUE(r.finish_reason == FinishReason::kStop || r.finish_reason == FinishReason::kLength)
        << FinishReasonName(r.finish_reason) << " " << r.reject_reason;
    ASSERT_EQ(r.response_ids.size(), r.logprobs.size());
    ASSERT_EQ(r.response_ids.size(), r.mask.size());
    std::vector<int64_t> seq(r.prompt_ids.begin(), r.prompt_ids.end());
    seq.insert(seq.end(), r.response_ids.begin(), r.response_ids.end());
    at::Tensor ids = at::tensor(seq).unsqueeze(0);
    at::Tensor logits = model.Forward(ids)[0];
    const size_t p = r.prompt_ids.size();
    const double temp = reqs[r.request_index].sampling.temperature;
    at::Tensor targets =
        ids[0].narrow(0, static_cast<int64_t>(p), static_cast<int64_t>(r.response_ids.size()));
    at::Tensor want = TokenLogprobs(logits.narrow(0, static_cast<int64_t>(p) - 1, targets.size(0)),
                                    targets, temp);
    for (size_t t = 0; t < r.response_ids.size(); ++t) {
      if (r.mask[t]) {
        EXPECT_NEAR(r.logprobs[t], want[static_cast<int64_t>(t)].item<float>(), tol)
            << "request " << r.request_index << " sample " << r.sample_index << " token " << t;
      } else {
        EXPECT_EQ(r.logprobs[t], 0.f);
      }
    }
  }
}

struct ParityCase {
  bool fused;
  Batching batching;
};

class LogprobParityTest : public ::testing::TestWithParam<ParityCase> {};

// Slot reuse (5 slots, 19 sequences), batched prefill with mixed prompt lengths, groups
// sharing a prefill, stop tokens, varied temperatures and truncation.
TEST_P(LogprobParityTest, IncrementalLogprobsMatchFullForward) {
  EngineConfig cfg = SmallEngine(5);
  cfg.fused_cpu_kernels = GetParam().fused;
  cfg.batching = GetParam().batching;
  auto model = std::make_shared<LlamaModel>(cfg.model, TestSeed());
  auto engine = Engine::Create(cfg, model);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::mt19937_64 rng(TestSeed());
  std::vector<GenerateRequest> reqs;
  const double temps[] = {1.0, 0.7, 1.3, 0.0};
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt = RandomPrompt(rng, 1 + i * 3 % 11, 23);
    r.sampling.temperature = temps[i % 4];
    r.sampling.max_new_tokens = 3 + (i * 5) % 17;
    r.sampling.num_samples = 1 + i % 4;
    r.sampling.seed = rng();
    if (i % 3 == 0) r.sampling.stop_token_ids = {2, 5};
    if (i == 5) r.sampling.top_k = 4;
    if (i == 6) r.sampling.top_p = 0.8;
    r.tag = 100 + static_cast<uint64_t>(i);
    reqs.push_back(r);
  }
  auto results = (*engine)->Generate(reqs, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  ASSERT_EQ(results->size(), 1u + 2 + 3 + 4 + 1 + 2 + 3 + 4);
  size_t k = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    for (int s = 0; s < reqs[i].sampling.num_samples; ++s, ++k) {
      const GenerationResult& r = (*results)[k];
      EXPECT_EQ(r.request_index, i);
      EXPECT_EQ(r.sample_index, s);
      EXPECT_EQ(r.tag, reqs[i].tag);
      EXPECT_EQ(r.prompt_ids, reqs[i].prompt);
      EXPECT_LE(r.num_new_tokens, reqs[i].sampling.max_new_tokens);
      EXPECT_LE(r.prompt_ids.size() + r.response_ids.size(), 40u);
      if (r.finish_reason == FinishReason::kStop) {
        const auto& stops = reqs[i].sampling.stop_token_ids;
        EXPECT_NE(std::find(stops.begin(), stops.end(), r.response_ids.back()), stops.end());
      } else {
        EXPECT_EQ(r.finish_reason, FinishReason::kLength);
      }
    }
  ExpectLogprobsMatchForward(*model, reqs, *results, 1e-4);
  EXPECT_EQ((*engine)->stats().sequences, results->size());
}

std::string ParityName(const ::testing::TestParamInfo<ParityCase>& info) {
  static const char* const kNames[] = {"Continuous", "Static", "StaticPadded"};
  return std::string(info.param.fused ? "Packed" : "Generic") +
         kNames[static_cast<int>(info.param.batching)];
}

INSTANTIATE_TEST_SUITE_P(Paths, LogprobParityTest,
                         ::testing::Values(ParityCase{true, Batching::kContinuous},
                                           ParityCase{false, Batching::kContinuous},
                                           ParityCase{true, Batching::kStatic},
                                           ParityCase{true, Batching::kStaticPadded},
                                           ParityCase{false, Batching::kStaticPadded}),
                         ParityName);

TEST(GenerationTest, Bfloat16ModelGeneratesWithCloseLogprobs) {
  EngineConfig cfg = SmallEngine(6);
  cfg.model.dtype = DType::kBFloat16;
  auto model = std::make_shared<LlamaModel>(cfg.model, TestSeed());
  auto engine = Engine::Create(cfg, model);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::vector<GenerateRequest> reqs(3);
  std::mt19937_64 rng(TestSeed());
  for (auto& r : reqs) {
    r.prompt = RandomPrompt(rng, 6, 23);
    r.sampling.max_new_tokens = 12;
    r.sampling.num_samples = 2;
    r.sampling.seed = rng();
  }
  auto res = (*engine)->Generate(reqs, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  // bf16 rounding differs between the packed kernels and the module path: loose tolerance.
  ExpectLogprobsMatchForward(*model, reqs, *res, 0.05);
}

TEST(GenerationTest, PaddingHoldsPadIdsMaskFalseLogprobZero) {
  auto engine = Engine::Create(SmallEngine(8));
  ASSERT_TRUE(engine.ok());
  std::vector<GenerateRequest> reqs(3);
  reqs[0].prompt = {1, 4, 5};
  reqs[0].sampling.max_new_tokens = 2;
  reqs[1].prompt = {1, 6};
  reqs[1].sampling.max_new_tokens = 9;
  reqs[2].prompt = {1, 7, 8, 9, 10};
  reqs[2].sampling.max_new_tokens = 5;
  auto results = (*engine)->Generate(reqs, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(results.ok());
  const int32_t pad = 0;
  PaddedResults p = PadResults(*results, pad);
  ASSERT_EQ(p.response_ids.size(1), 9);
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t len = p.response_lengths[i].item<int64_t>();
    EXPECT_EQ(len, reqs[static_cast<size_t>(i)].sampling.max_new_tokens);
    for (int64_t t = 0; t < 9; ++t) {
      if (t < len) {
        EXPECT_TRUE(p.mask[i][t].item<bool>());
        EXPECT_EQ(p.logprobs[i][t].item<float>(),
                  (*results)[static_cast<size_t>(i)].logprobs[static_cast<size_t>(t)]);
        EXPECT_LT(p.logprobs[i][t].item<float>(), 0.f);
      } else {
        EXPECT_EQ(p.response_ids[i][t].item<int64_t>(), pad);
        EXPECT_FALSE(p.mask[i][t].item<bool>());
        EXPECT_EQ(p.logprobs[i][t].item<float>(), 0.f);
      }
    }
    const int64_t plen = p.prompt_lengths[i].item<int64_t>();
    for (int64_t t = plen; t < p.prompt_ids.size(1); ++t)
      EXPECT_EQ(p.prompt_ids[i][t].item<int64_t>(), pad);
  }
}

TEST(GenerationTest, SameSeedSameTokensDifferentSeedsDiffer) {
  auto engine = Engine::Create(SmallEngine(16));
  ASSERT_TRUE(engine.ok());
  auto make = [](uint64_t seed) {
    GenerateRequest r;
    r.prompt = {1, 3, 4, 5};
    r.sampling.max_new_tokens = 24;
    r.sampling.num_samples = 4;
    r.sampling.seed = seed;
    return r;
  };
  const uint64_t seed = TestSeed();
  auto a = (*engine)->Generate({make(seed)}, Deadline::InMs(kWaitMs));
  // Same seed again, now sharing the batch with other requests.
  auto b =
      (*engine)->Generate({make(seed + 1), make(seed), make(seed + 2)}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(a.ok() && b.ok());
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ((*a)[static_cast<size_t>(s)].response_ids,
              (*b)[static_cast<size_t>(4 + s)].response_ids)
        << "sample " << s;
    // Log-probs agree up to float rounding (GEMM blocking depends on the batch size).
    const auto& la = (*a)[static_cast<size_t>(s)].logprobs;
    const auto& lb = (*b)[static_cast<size_t>(4 + s)].logprobs;
    ASSERT_EQ(la.size(), lb.size());
    for (size_t t = 0; t < la.size(); ++t) EXPECT_NEAR(la[t], lb[t], 1e-5);
  }
  // Samples of one group differ from each other, and other seeds give other samples.
  EXPECT_NE((*a)[0].response_ids, (*a)[1].response_ids);
  EXPECT_NE((*b)[0].response_ids, (*b)[4].response_ids);
  EXPECT_NE((*b)[8].response_ids, (*b)[4].response_ids);
}

TEST(GenerationTest, GroupSamplesSharePrefillAndGreedyIsTopK1) {
  auto engine = Engine::Create(SmallEngine(16));
  ASSERT_TRUE(engine.ok());
  GenerateRequest r;
  r.prompt = {1, 9, 8, 7, 6, 5};
  r.sampling.num_samples = 8;
  r.sampling.max_new_tokens = 6;
  auto res = (*engine)->Generate({r}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->size(), 8u);
  EngineStats st = (*engine)->stats();
  EXPECT_EQ(st.prefill_tokens, 6u);  // one prefill for the whole group
  EXPECT_EQ(st.prefill_steps, 1u);

  GenerateRequest g = r;
  g.sampling.num_samples = 1;
  g.sampling.temperature = 0.0;
  GenerateRequest k1 = g;
  k1.sampling.temperature = 1.0;
  k1.sampling.top_k = 1;
  k1.sampling.seed = 99;
  GenerateRequest p0 = k1;
  p0.sampling.top_k = 0;
  p0.sampling.top_p = 1e-6;
  auto out = (*engine)->Generate({g, k1, p0}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].response_ids, (*out)[1].response_ids);
  EXPECT_EQ((*out)[0].response_ids, (*out)[2].response_ids);
}

TEST(GenerationTest, RejectionsNameTheReasonAndOthersComplete) {
  auto engine = Engine::Create(SmallEngine(4));
  ASSERT_TRUE(engine.ok());
  std::vector<GenerateRequest> reqs(7);
  for (auto& r : reqs) {
    r.prompt = {1, 2, 3};
    r.sampling.max_new_tokens = 4;
  }
  reqs[1].prompt.clear();             // empty prompt
  reqs[2].prompt.assign(40, 3);       // no room in a 40-position cache
  reqs[3].prompt = {1, 23};           // id outside the vocabulary
  reqs[4].sampling.temperature = -1;  // bad sampling
  reqs[5].response_prefix = {4, 5};   // prefix arrays disagree
  reqs[5].response_prefix_mask = {1};
  reqs[6].sampling.num_samples = 3;  // fine
  reqs[6].tag = 77;
  auto res = (*engine)->Generate(reqs, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->size(), 9u);
  auto reason = [&](size_t i) { return (*res)[i].reject_reason; };
  EXPECT_EQ((*res)[0].finish_reason, FinishReason::kLength);
  for (size_t i = 1; i <= 5; ++i) EXPECT_EQ((*res)[i].finish_reason, FinishReason::kRejected) << i;
  EXPECT_EQ(reason(1), "empty prompt");
  EXPECT_NE(reason(2).find("prompt of 40 tokens does not fit"), std::string::npos) << reason(2);
  EXPECT_NE(reason(3).find("prompt token 23 at position 1 is outside the vocabulary [0, 23)"),
            std::string::npos)
      << reason(3);
  EXPECT_NE(reason(4).find("sampling.temperature = -1"), std::string::npos) << reason(4);
  EXPECT_NE(reason(5).find("response_prefix_mask has 1 entries for 2 prefix tokens"),
            std::string::npos)
      << reason(5);
  for (size_t i = 6; i < 9; ++i) {
    EXPECT_EQ((*res)[i].finish_reason, FinishReason::kLength);
    EXPECT_EQ((*res)[i].tag, 77u);
  }
  EXPECT_TRUE((*res)[1].response_ids.empty());
  Status st = CheckNoRejections(*res);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "request 1 (tag 0) rejected: empty prompt");
  EXPECT_EQ((*engine)->stats().rejected, 5u);
}

TEST(GenerationTest, UpdateWaitsForPinnedBatchWhichKeepsItsVersion) {
  EngineConfig cfg = SmallEngine(8);
  auto model = std::make_shared<LlamaModel>(cfg.model, 1);
  auto engine = Engine::Create(cfg, model);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  LlamaModel v1(cfg.model, 2);
  const NamedTensors v1_weights = v1.NamedWeights();
  // Hold the engine thread inside a callback so the batch below cannot finish yet.
  Latch in_callback, release;
  GenerateRequest blocker;
  blocker.prompt = {1, 2};
  blocker.sampling.max_new_tokens = 1;
  ASSERT_TRUE(e.Submit(blocker, [&](std::vector<GenerationResult>) {
                 in_callback.Open();
                 release.Wait();
               }).ok());
  ASSERT_TRUE(in_callback.Wait());

  std::vector<GenerateRequest> reqs(12);
  std::mt19937_64 rng(TestSeed());
  for (auto& r : reqs) {
    r.prompt = RandomPrompt(rng, 5, 23);
    r.sampling.max_new_tokens = 30;
    r.sampling.seed = rng();
  }
  auto gen =
      std::async(std::launch::async, [&] { return e.Generate(reqs, Deadline::InMs(kWaitMs)); });
  // Wait (bounded) until the batch is queued, i.e. pinned.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (e.stats().requests < 1 + reqs.size() && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  ASSERT_EQ(e.stats().requests, 1 + reqs.size());
  // An update issued now must wait for the batch: with a short deadline it times out and
  // changes nothing.
  Status early = e.UpdateWeights(1, v1_weights, Deadline::InMs(50));
  EXPECT_EQ(early.code(), Code::kTimeout) << early.ToString();
  EXPECT_EQ(e.version(), 0u);
  // A patient update: it must not complete before every sequence of the batch finished.
  auto update = std::async(std::launch::async, [&] {
    Status st = e.UpdateWeights(1, v1_weights, Deadline::InMs(kWaitMs));
    return std::make_pair(st, e.stats().sequences);
  });
  release.Open();
  auto results = gen.get();
  auto [st, finished_at_update] = update.get();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  EXPECT_EQ(finished_at_update, 1 + reqs.size());
  EXPECT_EQ(e.version(), 1u);
  for (const auto& r : *results) {
    EXPECT_EQ(r.policy_version, 0u);
    for (uint64_t v : r.token_versions) EXPECT_EQ(v, 0u);
  }
  // Every token of the batch came from version-0 weights (the model now holds v1; compare
  // against a fresh copy of v0).
  LlamaModel v0(cfg.model, 1);
  ExpectLogprobsMatchForward(v0, reqs, *results, 1e-4);
  // The next batch runs at version 1 with the new weights.
  auto next = e.Generate({reqs[0]}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ((*next)[0].policy_version, 1u);
  ExpectLogprobsMatchForward(v1, {reqs[0]}, *next, 1e-4);
  // Updates never go back in time, and bad tensors change nothing.
  EXPECT_EQ(e.UpdateWeights(0, v1_weights, Deadline::InMs(kWaitMs)).code(), Code::kInvalidArgument);
  NamedTensors bad = v1_weights;
  bad.pop_back();
  EXPECT_FALSE(e.UpdateWeights(2, bad, Deadline::InMs(kWaitMs)).ok());
  EXPECT_EQ(e.version(), 1u);
  EXPECT_EQ(e.stats().weight_updates, 1u);
}

// UpdateWeights is applied by the engine thread between two steps (invariant 5): a stream of
// updates from another thread while Submit()ted sequences generate lands between steps, in
// order, each call returning once its weights are in; an update to an idle (sleeping) engine
// wakes it and lands too.
TEST(GenerationTest, UpdatesFromAnotherThreadLandBetweenStepsInOrder) {
  EngineConfig cfg = SmallEngine(8);
  auto engine = Engine::Create(cfg);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  LlamaModel a(cfg.model, 100), b(cfg.model, 101);
  const NamedTensors weights[2] = {a.NamedWeights(), b.NamedWeights()};
  // Idle engine: the update wakes it.
  ASSERT_TRUE(e.UpdateWeights(1, weights[0], Deadline::InMs(kWaitMs)).ok());
  EXPECT_EQ(e.version(), 1u);
  std::mt19937_64 rng(TestSeed());
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
  std::vector<GenerationResult> done;
  for (int i = 0; i < 24; ++i) {
    GenerateRequest r;
    r.prompt = RandomPrompt(rng, 3, 23);
    r.sampling.max_new_tokens = 30;
    r.sampling.seed = rng();
    {
      std::lock_guard<std::mutex> g(mu);
      ++pending;
    }
    ASSERT_TRUE(e.Submit(r, [&](std::vector<GenerationResult> res) {
                   std::lock_guard<std::mutex> g(mu);
                   for (auto& x : res) done.push_back(std::move(x));
                   --pending;
                   cv.notify_all();
                 }).ok());
  }
  // Versions 2..41 while those generate, alternating two weight sets.
  for (uint64_t v = 2; v <= 41; ++v) {
    Status st = e.UpdateWeights(v, weights[v % 2], Deadline::InMs(kWaitMs));
    ASSERT_TRUE(st.ok()) << "version " << v << ": " << st.ToString();
    EXPECT_EQ(e.version(), v);  // in place when the call returns
  }
  {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::milliseconds(kWaitMs), [&] { return pending == 0; }));
  }
  EXPECT_EQ(e.stats().weight_updates, 41u);
  // Each sequence's tokens carry non-decreasing versions, all among those applied.
  ASSERT_EQ(done.size(), 24u);
  for (const auto& r : done) {
    ASSERT_EQ(r.finish_reason, FinishReason::kLength);
    for (size_t i = 0; i < r.token_versions.size(); ++i) {
      EXPECT_GE(r.token_versions[i], 1u);
      EXPECT_LE(r.token_versions[i], 41u);
      if (i > 0) {
        EXPECT_GE(r.token_versions[i], r.token_versions[i - 1]);
      }
    }
  }
}

TEST(GenerationTest, SubmittedSequenceRecordsPerTokenVersions) {
  EngineConfig cfg = SmallEngine(4);
  auto engine = Engine::Create(cfg);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  LlamaModel v5(cfg.model, 5);
  GenerateRequest one_token;
  one_token.prompt = {1, 2};
  one_token.sampling.max_new_tokens = 1;
  GenerateRequest longer;
  longer.prompt = {1, 3, 4};
  longer.sampling.max_new_tokens = 10;
  // Blocker A holds the engine thread in its callback while `longer` and blocker B are
  // queued, so both are admitted in the same step; B then holds the engine again right
  // after `longer` sampled exactly one token.
  Latch in_a, release_a, in_b, release_b;
  ASSERT_TRUE(e.Submit(one_token, [&](std::vector<GenerationResult>) {
                 in_a.Open();
                 release_a.Wait();
               }).ok());
  ASSERT_TRUE(in_a.Wait());
  std::promise<std::vector<GenerationResult>> done;
  ASSERT_TRUE(e.Submit(longer, [&](std::vector<GenerationResult> r) {
                 done.set_value(std::move(r));
               }).ok());
  ASSERT_TRUE(e.Submit(one_token, [&](std::vector<GenerationResult>) {
                 in_b.Open();
                 release_b.Wait();
               }).ok());
  release_a.Open();
  ASSERT_TRUE(in_b.Wait());
  // Not pinned: the update lands between two steps of `longer`.
  ASSERT_TRUE(e.UpdateWeightsInPlace(
                   5,
                   [&](const NamedTensors& dst) {
                     auto src = v5.NamedWeights();
                     for (size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(src[i].second);
                     return Status::Ok();
                   },
                   Deadline::InMs(kWaitMs))
                  .ok());
  release_b.Open();
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  auto res = fut.get();
  ASSERT_EQ(res.size(), 1u);
  const GenerationResult& r = res[0];
  EXPECT_EQ(r.policy_version, 0u);
  std::vector<uint64_t> want(10, 5);
  want[0] = 0;
  EXPECT_EQ(r.token_versions, want);
  EXPECT_EQ(e.version(), 5u);
}

TEST(GenerationTest, MultiTurnContinuationKeepsMasksAndLogprobs) {
  EngineConfig cfg = SmallEngine(4);
  auto model = std::make_shared<LlamaModel>(cfg.model, TestSeed());
  auto engine = Engine::Create(cfg, model);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  GenerateRequest first;
  first.prompt = {1, 5, 6, 7};
  first.sampling.max_new_tokens = 4;
  first.sampling.temperature = 0.9;
  first.tag = 3;
  const std::vector<int32_t> env = {10, 11, 12};
  std::promise<std::vector<GenerationResult>> done;
  // Turn 2 is submitted from turn 1's callback (on the engine thread).
  ASSERT_TRUE(e.Submit(first, [&](std::vector<GenerationResult> r) {
                 Status st = e.Submit(
                     ContinueRequest(r[0], env, first.sampling),
                     [&](std::vector<GenerationResult> r2) { done.set_value(std::move(r2)); });
                 EXPECT_TRUE(st.ok());
               }).ok());
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  auto res = fut.get();
  const GenerationResult& r = res[0];
  EXPECT_EQ(r.tag, 3u);
  EXPECT_EQ(r.prompt_ids, first.prompt);
  ASSERT_EQ(r.response_ids.size(), 4u + 3 + static_cast<size_t>(r.num_new_tokens));
  EXPECT_EQ(r.num_new_tokens, 4);
  std::vector<uint8_t> want_mask = {1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_EQ(r.mask, want_mask);
  EXPECT_EQ(std::vector<int32_t>(r.response_ids.begin() + 4, r.response_ids.begin() + 7), env);
  ExpectLogprobsMatchForward(*model, {first}, res, 1e-4);
}

TEST(GenerationTest, DeadlineCancelsAndEngineStaysUsable) {
  auto engine = Engine::Create(SmallEngine(4));
  ASSERT_TRUE(engine.ok());
  std::vector<GenerateRequest> reqs(16);
  for (auto& r : reqs) {
    r.prompt = {1, 2, 3};
    r.sampling.max_new_tokens = 30;
  }
  auto late = (*engine)->Generate(reqs, Deadline::Now());
  EXPECT_EQ(late.status().code(), Code::kTimeout) << late.status().ToString();
  auto ok = (*engine)->Generate({reqs[0]}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)[0].num_new_tokens, 30);
  // The pin of the cancelled batch was released: updates go through.
  LlamaModel w(SmallEngine(4).model, 3);
  EXPECT_TRUE((*engine)->UpdateWeights(1, w.NamedWeights(), Deadline::InMs(kWaitMs)).ok());
}

TEST(GenerationTest, OnTokenStreamsEveryTokenAndCancelFreesTheSlots) {
  auto engine = Engine::Create(SmallEngine(2));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  // on_token sees every sampled token of every sample, in order, before `done` runs.
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.sampling.max_new_tokens = 12;
  r.sampling.num_samples = 2;
  std::vector<std::vector<std::pair<int32_t, float>>> seen(2);  // engine thread only
  r.on_token = [&](int32_t sample, int32_t tok, float lp) {
    seen.at(static_cast<size_t>(sample)).emplace_back(tok, lp);
  };
  std::promise<std::vector<GenerationResult>> done;
  ASSERT_TRUE(
      e.Submit(r, [&](std::vector<GenerationResult> out) { done.set_value(std::move(out)); }).ok());
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  auto res = fut.get();
  ASSERT_EQ(res.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_EQ(seen[s].size(), res[s].response_ids.size());
    for (size_t k = 0; k < seen[s].size(); ++k) {
      EXPECT_EQ(seen[s][k].first, res[s].response_ids[k]);
      EXPECT_EQ(seen[s][k].second, res[s].logprobs[k]);
    }
  }
  // A request cancelled after its first token ends aborted well before max_new_tokens, and
  // both slots serve the next request.
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  GenerateRequest longer;
  longer.prompt = {1, 2, 3};
  longer.sampling.max_new_tokens = 30;
  longer.sampling.num_samples = 2;
  longer.cancel = cancel;
  longer.on_token = [cancel](int32_t, int32_t, float) { cancel->store(true); };
  std::promise<std::vector<GenerationResult>> aborted;
  ASSERT_TRUE(e.Submit(longer, [&](std::vector<GenerationResult> out) {
                 aborted.set_value(std::move(out));
               }).ok());
  auto fa = aborted.get_future();
  ASSERT_EQ(fa.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  for (const auto& g : fa.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kAborted);
    EXPECT_EQ(g.reject_reason, "cancelled");
    EXPECT_FALSE(CutShortAsStale(g));
    EXPECT_EQ(g.num_new_tokens, 1);
  }
  GenerateRequest next = r;
  next.on_token = nullptr;
  auto ok = e.Generate({next}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  for (const auto& g : *ok) EXPECT_NE(g.finish_reason, FinishReason::kAborted);
}

// GenerateRequest::abort_beyond_lag: once the weights are more than that many versions newer
// than the request's own, its unfinished samples end aborted ("stale: ...") and free their
// slots; a request without it, generating beside it through the same updates, runs to its end.
// Each token of both waits 10 ms in on_token, so the updates land while they generate.
TEST(GenerationTest, ARequestOutlivingItsLagLimitIsCutShort) {
  auto engine = Engine::Create(SmallEngine(4));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  LlamaModel m(TinyConfig(), 7);
  const NamedTensors w = m.NamedWeights();
  ASSERT_TRUE(e.UpdateWeights(1, w, Deadline::InMs(kWaitMs)).ok());
  Latch started;
  auto slow = [&started](int32_t, int32_t, float) {
    started.Open();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  GenerateRequest limited;
  limited.prompt = {1, 2, 3};
  limited.sampling.max_new_tokens = 20;
  limited.sampling.num_samples = 2;
  limited.abort_beyond_lag = 1;
  limited.on_token = slow;
  GenerateRequest unlimited = limited;
  unlimited.abort_beyond_lag.reset();
  std::promise<std::vector<GenerationResult>> cut, whole;
  ASSERT_TRUE(e.Submit(limited, [&](std::vector<GenerationResult> r) { cut.set_value(std::move(r)); }).ok());
  ASSERT_TRUE(e.Submit(unlimited, [&](std::vector<GenerationResult> r) { whole.set_value(std::move(r)); }).ok());
  ASSERT_TRUE(started.Wait());
  // Version 2 is within the limit (1 newer), version 3 is not.
  ASSERT_TRUE(e.UpdateWeights(2, w, Deadline::InMs(kWaitMs)).ok());
  ASSERT_TRUE(e.UpdateWeights(3, w, Deadline::InMs(kWaitMs)).ok());
  auto fc = cut.get_future(), fw = whole.get_future();
  ASSERT_EQ(fc.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  ASSERT_EQ(fw.wait_for(std::chrono::milliseconds(kWaitMs)), std::future_status::ready);
  for (const auto& g : fc.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kAborted);
    EXPECT_EQ(g.policy_version, 1u);
    EXPECT_EQ(g.reject_reason.rfind("stale: the weights (version 3) are 2 versions newer", 0), 0u)
        << g.reject_reason;
    EXPECT_TRUE(CutShortAsStale(g));
    EXPECT_GE(g.num_new_tokens, 1);
    EXPECT_LT(g.num_new_tokens, 20);
    // Every token it has was sampled within the limit.
    for (uint64_t v : g.token_versions) EXPECT_LE(v, 2u);
  }
  for (const auto& g : fw.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kLength) << g.reject_reason;
    EXPECT_FALSE(CutShortAsStale(g));
    EXPECT_EQ(g.num_new_tokens, 20);
    EXPECT_EQ(g.token_versions.back(), 3u);
  }
  EXPECT_EQ(e.stats().stale_aborted, 2u);
  // The freed slots serve the next request, which starts at version 3.
  GenerateRequest next = unlimited;
  next.on_token = nullptr;
  next.abort_beyond_lag = 0;
  next.sampling.max_new_tokens = 4;
  auto ok = e.Generate({next}, Deadline::InMs(kWaitMs));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  for (const auto& g : *ok) {
    EXPECT_EQ(g.finish_reason, FinishReason::kLength);
    EXPECT_EQ(g.policy_version, 3u);
  }
}

// GenerateRequest::min_version: a request waits in the engine for weights at least that new,
// others pass it meanwhile, and it starts with them; a rollback releases it; a waiting
// request can be cancelled.
TEST(GenerationTest, ARequestWaitsForItsMinimumVersionWhileOthersPassIt) {
  auto engine = Engine::Create(SmallEngine(4));
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  LlamaModel m(TinyConfig(), 7);
  const NamedTensors w = m.NamedWeights();
  ASSERT_TRUE(e.UpdateWeights(1, w, Deadline::InMs(kWaitMs)).ok());
  using Results = std::vector<GenerationResult>;
  auto submit = [&e](GenerateRequest r, std::promise<Results>* p) {
    return e.Submit(std::move(r), [p](Results res) { p->set_value(std::move(res)); });
  };
  auto ready = [](std::future<Results>& f) {
    return f.wait_for(std::chrono::milliseconds(kWaitMs)) == std::future_status::ready;
  };
  GenerateRequest base;
  base.prompt = {1, 2, 3};
  base.sampling.max_new_tokens = 3;
  base.sampling.num_samples = 2;
  GenerateRequest later = base, now = base;
  later.min_version = 2;
  std::promise<Results> later_p, now_p;
  ASSERT_TRUE(submit(later, &later_p).ok());  // queued first, waits for version 2
  ASSERT_TRUE(submit(now, &now_p).ok());
  auto later_f = later_p.get_future(), now_f = now_p.get_future();
  ASSERT_TRUE(ready(now_f));  // it passed the waiting one
  for (const auto& g : now_f.get()) EXPECT_EQ(g.policy_version, 1u);
  EXPECT_EQ(later_f.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  const EngineStats before = e.stats();
  EXPECT_EQ(before.sequences, 2u);  // only `now`'s samples ran
  ASSERT_TRUE(e.UpdateWeights(2, w, Deadline::InMs(kWaitMs)).ok());
  ASSERT_TRUE(ready(later_f));
  for (const auto& g : later_f.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kLength) << g.reject_reason;
    EXPECT_EQ(g.policy_version, 2u);
    for (uint64_t v : g.token_versions) EXPECT_EQ(v, 2u);
  }

  // A rollback below the version the engine had when it arrived releases a waiting request:
  // the learner that granted it is gone.
  GenerateRequest orphan = base;
  orphan.min_version = 9;
  std::promise<Results> orphan_p;
  ASSERT_TRUE(submit(orphan, &orphan_p).ok());
  auto orphan_f = orphan_p.get_future();
  ASSERT_TRUE(e.UpdateWeights(1, w, Deadline::InMs(kWaitMs), /*allow_rollback=*/true).ok());
  ASSERT_TRUE(ready(orphan_f));
  for (const auto& g : orphan_f.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kLength) << g.reject_reason;
    EXPECT_EQ(g.policy_version, 1u);
  }

  // A waiting request is cancelled at the engine's next step.
  GenerateRequest waiting = base;
  waiting.min_version = 9;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  waiting.cancel = cancel;
  std::promise<Results> waiting_p, other_p;
  ASSERT_TRUE(submit(waiting, &waiting_p).ok());
  cancel->store(true);
  ASSERT_TRUE(submit(base, &other_p).ok());
  auto waiting_f = waiting_p.get_future(), other_f = other_p.get_future();
  ASSERT_TRUE(ready(waiting_f));
  for (const auto& g : waiting_f.get()) {
    EXPECT_EQ(g.finish_reason, FinishReason::kAborted);
    EXPECT_EQ(g.num_new_tokens, 0);
  }
  ASSERT_TRUE(ready(other_f));
}

TEST(GenerationTest, DestructorAbortsPendingWorkAndRunsCallbacks) {
  std::atomic<int> called{0}, aborted{0};
  {
    auto engine = Engine::Create(SmallEngine(2));
    ASSERT_TRUE(engine.ok());
    for (int i = 0; i < 20; ++i) {
      GenerateRequest r;
      r.prompt = {1, 2, 3};
      r.sampling.max_new_tokens = 30;
      r.sampling.num_samples = 2;
      ASSERT_TRUE((*engine)
                      ->Submit(r,
                               [&](std::vector<GenerationResult> res) {
                                 EXPECT_EQ(res.size(), 2u);
                                 ++called;
                                 for (auto& x : res)
                                   aborted += x.finish_reason == FinishReason::kAborted;
                               })
                      .ok());
    }
  }
  EXPECT_EQ(called.load(), 20);
}

TEST(GenerationTest, RestoresTrainingModeAndRejectsMismatchedModel) {
  EngineConfig cfg = SmallEngine(4);
  auto model = std::make_shared<LlamaModel>(cfg.model, 0);
  model->train();
  auto engine = Engine::Create(cfg, model);
  ASSERT_TRUE(engine.ok());
  GenerateRequest r;
  r.prompt = {1, 2};
  ASSERT_TRUE((*engine)->Generate({r}, Deadline::InMs(kWaitMs)).ok());
  EXPECT_TRUE(model->is_training());

  EngineConfig other = cfg;
  other.model.ffn_dim = 64;
  auto bad = Engine::Create(other, model);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("does not match"), std::string::npos);
  other = cfg;
  other.device = "cuda:0";
  if (!at::hasCUDA()) {
    auto no_gpu = Engine::Create(other);
    EXPECT_FALSE(no_gpu.ok());
  }
}

}  // namespace
}  // namespace troupe::engine
