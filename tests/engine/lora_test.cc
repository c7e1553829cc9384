// LoRA on the policy model: config validation, the adapter math on every forward path,
// merged vs unmerged generation, frozen base, PEFT files, and parity with the independent
// PyTorch reference (tests/engine/hf_reference.py: PEFT's format and math, float64).
//
//   hf_reference.py make DIR ─▶ make-adapter ADAPTER ─▶ LoadModel + LoadAdapter ─▶ Forward
//                                          logits within 1e-5 ◀── hf_reference.py logits --adapter
//   SaveAdapter(trained model) ─▶ hf_reference.py logits --adapter ─▶ equal within 1e-5
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include "test_util.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/hf_folder.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/model.h"
#include "troupe/engine/peft.h"
#include "troupe/engine/safetensors.h"

namespace troupe::engine {
namespace {

using testing::TempDir;
using testing::TestSeed;

ModelConfig LoraTiny(std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"}) {
  ModelConfig c = testing::TinyConfig();
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.target_modules = std::move(targets);
  return c;
}

// Gives every adapter random non-zero values (a fresh one is the identity).
void RandomizeAdapters(LlamaModel& m, uint64_t seed, double std = 0.2) {
  torch::NoGradGuard g;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, t] : m.AdapterWeights()) {
    at::Tensor r = at::empty(t.sizes(), at::kFloat);
    r.normal_(0.0, std, gen);
    t.copy_(r);
  }
}

float MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<float>();
}

at::Tensor RandomIds(int64_t T, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, vocab, {1, T}, gen, at::kLong);
}

TEST(LoraConfigTest, RefusesBadFieldsByName) {
  LoraConfig c;
  EXPECT_TRUE(c.Validate().ok()) << "off is valid";
  c.rank = 8;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_DOUBLE_EQ(c.scale(), 1.0) << "alpha defaults to rank";
  c.target_modules = {"q_proj", "qkv_proj"};
  Status st = c.Validate();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'qkv_proj'"), std::string::npos) << st.message();
  c.target_modules = {"q_proj", "q_proj"};
  EXPECT_NE(c.Validate().message().find("twice"), std::string::npos);
  c.target_modules = {};
  EXPECT_NE(c.Validate().message().find("lora.target_modules"), std::string::npos);
  c.target_modules = {"v_proj"};
  c.dropout = 1.0;
  EXPECT_NE(c.Validate().message().find("lora.dropout"), std::string::npos);
  c.dropout = 0;
  c.rank = -1;
  EXPECT_NE(c.Validate().message().find("lora.rank"), std::string::npos);
  ModelConfig m = testing::TinyConfig();
  m.lora.rank = 2;
  m.lora.target_modules = {"lm_head"};
  EXPECT_NE(m.Validate().message().find("'lm_head'"), std::string::npos)
      << "ModelConfig::Validate checks its LoRA";
}

TEST(LoraModelTest, FreshAdapterIsTheIdentityAndOnlyAdaptersTrain) {
  const uint64_t seed = TestSeed();
  ModelConfig base_cfg = testing::TinyConfig();
  LlamaModel base(base_cfg, seed);
  LlamaModel lora(LoraTiny(), seed);
  ASSERT_TRUE(lora.LoadNamed(base.NamedWeights()).ok());
  at::Tensor ids = RandomIds(12, base_cfg.vocab_size, seed);
  {
    c10::InferenceMode g;
    EXPECT_TRUE(at::equal(base.Forward(ids), lora.Forward(ids))) << "B = 0 at init";
  }
  // A: U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform a=sqrt(5)), B: zeros.
  int64_t adapter_numel = 0;
  for (const auto& [name, t] : lora.AdapterWeights()) {
    adapter_numel += t.numel();
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.f) << name;
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
      EXPECT_LE(t.abs().max().item<float>(), bound) << name;
      EXPECT_GT(t.abs().max().item<float>(), 0.5 * bound) << name;
    }
  }
  EXPECT_EQ(adapter_numel, lora.config().NumAdapterParameters());
  EXPECT_EQ(lora.AdapterWeights().size(), 2u * 7 * 2);
  EXPECT_EQ(lora.AdapterWeights()[0].first,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  // Only the adapters require gradients, and only they get one.
  int64_t trainable = 0;
  for (const auto& p : lora.parameters())
    if (p.requires_grad()) trainable += p.numel();
  EXPECT_EQ(trainable, adapter_numel);
  at::Tensor loss = lora.Forward(ids).logsumexp(-1).sum();
  loss.backward();
  for (const auto& [name, t] : lora.NamedWeights()) EXPECT_FALSE(t.grad().defined()) << name;
  for (const auto& [name, t] : lora.AdapterWeights()) {
    // B gets a gradient at B = 0; A's is zero until B moves (dL/dA = s B^T ...).
    if (name.find("lora_B") != std::string::npos) {
      ASSERT_TRUE(t.grad().defined()) << name;
      EXPECT_GT(t.grad().abs().max().item<float>(), 0.f) << name;
    }
  }
}

TEST(LoraModelTest, EveryPathComputesTheAdapter) {
  const uint64_t seed = TestSeed() + 1;
  for (const auto& targets : std::vector<std::vector<std::string>>{
           {"q_proj", "v_proj"}, {"k_proj", "o_proj", "down_proj"}, {"gate_proj"},
           {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}) {
    SCOPED_TRACE(fmt::format("targets {}", fmt::join(targets, ",")));
    ModelConfig cfg = LoraTiny(targets);
    LlamaModel m(cfg, seed);
    RandomizeAdapters(m, seed);
    c10::InferenceMode g;
    const int64_t T = 10;
    at::Tensor ids = RandomIds(T, cfg.vocab_size, seed);
    at::Tensor full = m.Forward(ids)[0];
    // The merged weights compute the same function in a model without LoRA.
    ModelConfig plain = cfg;
    plain.lora = LoraConfig{};
    LlamaModel merged_copy(plain, 0);
    ASSERT_TRUE(merged_copy.LoadNamed(m.MergedWeights()).ok());
    EXPECT_LE(MaxDiff(merged_copy.Forward(ids)[0], full), 1e-5);
    LlamaModel base_only(plain, 0);
    ASSERT_TRUE(base_only.LoadNamed(m.NamedWeights()).ok());
    EXPECT_GT(MaxDiff(base_only.Forward(ids)[0], full), 1e-3) << "the adapter must matter";
    // Packed Step (fused CPU kernels): the whole prompt, then token by token via Decode.
    KvCache cache(cfg, 2, 32, torch::kCPU);
    at::Tensor flat = ids[0];
    const int64_t P = T / 2;
    at::Tensor rows = at::arange(P);
    at::Tensor step =
        m.Step(flat.narrow(0, 0, P), at::zeros({P}, at::kLong), rows, rows, cache);
    EXPECT_LE(MaxDiff(step, full.narrow(0, 0, P)), 1e-5);
    for (int64_t t = P; t < T; ++t) {
      at::Tensor d = m.Decode(flat.narrow(0, t, 1), at::full({1}, t, at::kLong), t + 1, cache);
      EXPECT_LE(MaxDiff(d[0], full[t]), 1e-5) << "fused decode at " << t;
    }
    // Plain-ops Prefill + Decode.
    KvCache cache2(cfg, 1, 32, torch::kCPU);
    at::Tensor pre = m.Prefill(ids.narrow(1, 0, P), at::full({1}, P, at::kLong),
                               at::zeros({1}, at::kLong), cache2);
    EXPECT_LE(MaxDiff(pre[0], full[P - 1]), 1e-5);
    for (int64_t t = P; t < T; ++t) {
      at::Tensor d = m.Decode(flat.narrow(0, t, 1), at::full({1}, t, at::kLong), t + 1, cache2,
                              /*fused_cpu=*/false);
      EXPECT_LE(MaxDiff(d[0], full[t]), 1e-5) << "plain decode at " << t;
    }
  }
}

// Greedy decoding with the adapter merged vs unmerged: same tokens, log-probs within 1e-5,
// and the merged model follows adapter-only and base updates exactly (from its base copy).
TEST(LoraModelTest, MergedAndUnmergedGenerateTheSame) {
  const uint64_t seed = TestSeed() + 2;
  ModelConfig cfg = LoraTiny({"q_proj", "v_proj", "up_proj", "down_proj"});
  LlamaModel unmerged(cfg, seed), merged(cfg, seed);
  merged.SetMerged(true);
  auto greedy = [&](LlamaModel& m, at::Tensor* logprobs) {
    c10::InferenceMode g;
    KvCache cache(cfg, 1, 40, torch::kCPU);
    std::vector<int64_t> toks = {1, 5, 7, 2};
    at::Tensor t = at::tensor(toks);
    at::Tensor rows = at::arange(4);
    at::Tensor logits = m.Step(t, at::zeros({4}, at::kLong), rows,
                               at::full({1}, 3, at::kLong), cache);
    std::vector<float> lps;
    for (int i = 0; i < 20; ++i) {
      at::Tensor lp = at::log_softmax(logits[0], -1);
      int64_t next = lp.argmax().item<int64_t>();
      lps.push_back(lp[next].item<float>());
      toks.push_back(next);
      logits = m.Decode(at::full({1}, next, at::kLong),
                        at::full({1}, static_cast<int64_t>(toks.size()) - 1, at::kLong),
                        static_cast<int64_t>(toks.size()), cache);
    }
    *logprobs = at::tensor(lps);
    return toks;
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // Round 0: the same random adapters; 1: an adapter-only update; 2: a base + adapter update.
    LlamaModel src(cfg, seed + 10 + round);
    RandomizeAdapters(src, seed + 20 + round);
    NamedTensors update = round == 1 ? src.AdapterWeights() : src.StateWeights();
    LoadOptions opts;
    opts.require_adapters = true;
    ASSERT_TRUE(unmerged.LoadNamed(update, opts).ok());
    ASSERT_TRUE(merged.LoadNamed(update, opts).ok());
    at::Tensor lp_u, lp_m;
    auto a = greedy(unmerged, &lp_u);
    auto b = greedy(merged, &lp_m);
    EXPECT_EQ(a, b);
    EXPECT_LE(MaxDiff(lp_u, lp_m), 1e-5);
  }
  // Unmerging restores the pure base.
  merged.SetMerged(false);
  c10::InferenceMode g;
  at::Tensor ids = RandomIds(8, cfg.vocab_size, seed);
  EXPECT_LE(MaxDiff(merged.Forward(ids), unmerged.Forward(ids)), 1e-5);
}

TEST(LoraModelTest, LoadNamedRefusesWhatItCannotApply) {
  const uint64_t seed = TestSeed() + 3;
  LlamaModel lora(LoraTiny({"q_proj", "v_proj"}), seed);
  LlamaModel plain(testing::TinyConfig(), seed);
  // A model without LoRA refuses adapter tensors by name.
  Status st = plain.LoadNamed(lora.StateWeights());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lora_A.weight' is a LoRA adapter but this model has no LoRA"),
            std::string::npos)
      << st.message();
  // Adapters for other modules.
  LlamaModel other(LoraTiny({"k_proj"}), seed);
  st = lora.LoadNamed(other.AdapterWeights());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("k_proj.lora_A.weight"), std::string::npos) << st.message();
  // Another rank: a shape mismatch naming the tensor.
  ModelConfig r8 = LoraTiny({"q_proj", "v_proj"});
  r8.lora.rank = 8;
  LlamaModel big(r8, seed);
  st = lora.LoadNamed(big.AdapterWeights());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
  // A base-only update into an engine that requires adapters.
  LoadOptions opts;
  opts.require_adapters = true;
  st = lora.LoadNamed(plain.NamedWeights(), opts);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("carries no LoRA adapter"), std::string::npos) << st.message();
  // An incomplete adapter set.
  NamedTensors partial = lora.AdapterWeights();
  partial.pop_back();
  st = lora.LoadNamed(partial);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.message();
  // A whole adapter-only update is fine without the base.
  EXPECT_TRUE(lora.LoadNamed(lora.AdapterWeights()).ok());
}

std::string Python() {
  return "/usr/bin/python3 " + std::string(std::getenv("TROUPE_SOURCE_DIR")) +
         "/tests/engine/hf_reference.py";
}

at::Tensor ReadFloats(const std::string& path, int64_t rows, int64_t cols) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size(), static_cast<size_t>(rows * cols * 4)) << path;
  at::Tensor t = at::zeros({rows, cols}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), std::min(bytes.size(), t.nbytes()));
  return t;
}

std::string Join(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ","));
}

// PEFT adapters written by the reference load into Troupe, Troupe's load into the reference,
// and both compute the same logits (float32 vs the reference's float64) within 1e-5.
TEST(LoraPeftTest, MatchesTheIndependentReferenceBothWays) {
  ASSERT_NE(std::getenv("TROUPE_SOURCE_DIR"), nullptr) << "run through ctest";
  TempDir dir;
  const uint64_t seed = TestSeed() % 100000;
  const std::string base = dir.file("base"), adapter = dir.file("adapter");
  std::string cmd = fmt::format("{} make {} --preset qwen2.5-0.5b --layers 2 --vocab 256 "
                                "--dtype fp32 --seed {} --no-reference",
                                Python(), base, seed);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  cmd = fmt::format("{} make-adapter {} --base {} --r 8 --alpha 16 --seed {}", Python(), adapter,
                    base, seed + 1);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto folder = ReadHfModelFolder(base, /*max_seq_len_cap=*/64);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  ModelConfig cfg = folder->config;
  cfg.lora.rank = 8;
  cfg.lora.alpha = 16;
  cfg.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                             "down_proj"};
  auto model = LoadModel(base, cfg);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Status st = LoadAdapter(adapter, **model);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<int64_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((seed * 7 + i * 31) % 256);
  const int64_t T = static_cast<int64_t>(tokens.size());
  auto reference = [&](const std::string& adapter_dir) {
    const std::string out = dir.file("logits.bin");
    std::string c = fmt::format("{} logits {} --tokens '{}' --out {} --adapter {}", Python(), base,
                                Join(tokens), out, adapter_dir);
    EXPECT_EQ(std::system(c.c_str()), 0) << c;
    return ReadFloats(out, T, cfg.vocab_size);
  };
  at::Tensor ids = at::tensor(tokens).view({1, T});
  at::Tensor want = reference(adapter);
  {
    c10::InferenceMode g;
    at::Tensor got = (*model)->Forward(ids)[0];
    EXPECT_LE(MaxDiff(got, want), 1e-5) << "PEFT adapter from the reference";
    auto plain = LoadModel(base, folder->config);
    ASSERT_TRUE(plain.ok());
    EXPECT_GT(MaxDiff((*plain)->Forward(ids)[0], want), 1e-3) << "the adapter must matter";
  }
  // Troupe writes an adapter (changed values), the reference reads it.
  RandomizeAdapters(**model, seed + 2, /*std=*/0.03);  // the size of the reference's
  const std::string saved = dir.file("saved");
  ASSERT_TRUE(SaveAdapter(saved, **model, base).ok());
  auto json = nlohmann::json::parse(std::ifstream(saved + "/adapter_config.json"));
  EXPECT_EQ(json["peft_type"], "LORA");
  EXPECT_EQ(json["r"], 8);
  EXPECT_EQ(json["lora_alpha"], 16.0);
  EXPECT_EQ(json["task_type"], "CAUSAL_LM");
  EXPECT_EQ(json["base_model_name_or_path"], base);
  want = reference(saved);
  {
    c10::InferenceMode g;
    EXPECT_LE(MaxDiff((*model)->Forward(ids)[0], want), 1e-5) << "Troupe's adapter in the reference";
  }
  // And it loads back bit-exactly.
  auto again = LoadModel(base, cfg);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(LoadAdapter(saved, **again).ok());
  for (size_t i = 0; i < (*model)->AdapterWeights().size(); ++i)
    EXPECT_TRUE(at::equal((*model)->AdapterWeights()[i].second, (*again)->AdapterWeights()[i].second));
}

TEST(LoraPeftTest, RefusesAdaptersItCannotApplyByKey) {
  TempDir dir;
  LlamaModel m(LoraTiny({"q_proj", "v_proj"}), 1);
  const std::string d = dir.file("a");
  ASSERT_TRUE(SaveAdapter(d, m).ok());
  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit) {
    std::string text = AdapterConfigJson(m.config().lora, "");
    nlohmann::json j = nlohmann::json::parse(text);
    edit(j);
    std::ofstream(d + "/adapter_config.json") << j.dump();
  };
  auto expect = [&](const char* needle) {
    LlamaModel fresh(LoraTiny({"q_proj", "v_proj"}), 2);
    Status st = LoadAdapter(d, fresh);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  rewrite([](nlohmann::json& j) { j["r"] = 16; });
  expect("'r' = 16");
  rewrite([](nlohmann::json& j) { j["lora_alpha"] = 3; });
  expect("'lora_alpha' = 3");
  rewrite([](nlohmann::json& j) { j["use_dora"] = true; });
  expect("'use_dora'");
  rewrite([](nlohmann::json& j) { j["use_rslora"] = true; });
  expect("'use_rslora'");
  rewrite([](nlohmann::json& j) { j["target_modules"] = "q_proj|v_proj"; });
  expect("regular expression");
  rewrite([](nlohmann::json& j) { j["target_modules"] = {"q_proj", "k_proj"}; });
  expect("target_modules");
  rewrite([](nlohmann::json& j) { j["peft_type"] = "IA3"; });
  expect("'peft_type'");
  rewrite([](nlohmann::json&) {});
  LlamaModel fresh(LoraTiny({"q_proj", "v_proj"}), 2);
  EXPECT_TRUE(LoadAdapter(d, fresh).ok());
  LlamaModel plain(testing::TinyConfig(), 2);
  Status st = LoadAdapter(d, plain);
  EXPECT_NE(st.message().find("has no LoRA"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- invariant 5 with adapters

// Adapter updates (merged copy and unmerged) land only between engine steps, never while a
// step is in flight (DESIGN.md invariant 5): while sequences decode, another thread applies a
// new adapter version after another; every sampled token's log-prob must equal a replay with
// exactly the version it is tagged with (token_versions), and a pinned Generate batch keeps
// one version throughout. An update landing inside a step (a half-merged copy, adapters
// swapped between layers, or between the forward and the version tag) makes some token match
// no single version.
class LoraUpdateWhileDecoding : public ::testing::TestWithParam<bool> {};

TEST_P(LoraUpdateWhileDecoding, EveryTokenMatchesTheVersionItIsTaggedWith) {
  const bool merged = GetParam();
  const uint64_t seed = TestSeed() + 40 + (merged ? 1 : 0);
  EngineConfig ec;
  ec.model = LoraTiny({"q_proj", "v_proj", "up_proj", "down_proj"});
  ec.num_slots = 6;
  ec.lora_merged = merged;
  ec.init_seed = seed;
  auto created = Engine::Create(ec);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Engine& e = **created;
  // kSets adapter sets over one base; version v (>= 1) carries set v % kSets. Large random
  // adapters, so versions give clearly different log-probs.
  constexpr int kSets = 4;
  std::vector<std::unique_ptr<LlamaModel>> replay;
  for (int k = 0; k < kSets; ++k) {
    replay.push_back(std::make_unique<LlamaModel>(ec.model, seed + 1));  // same base
    RandomizeAdapters(*replay.back(), seed + 100 + k, 0.5);
  }
  auto set_of = [&](uint64_t v) { return static_cast<int>(v % kSets); };
  ASSERT_TRUE(e.UpdateWeights(1, replay[set_of(1)]->StateWeights(), Deadline::InMs(30000)).ok());

  // The updater: adapter-only updates, one after another, until generation is over.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> last_version{1};
  auto updater = std::async(std::launch::async, [&]() -> Status {
    for (uint64_t v = 2; !done.load() && v < 100000; ++v) {
      TROUPE_RETURN_IF_ERROR(
          e.UpdateWeights(v, replay[set_of(v)]->AdapterWeights(), Deadline::InMs(30000)));
      last_version.store(v);
    }
    return Status::Ok();
  });

  std::mt19937_64 rng(seed);
  auto request = [&](int i) {
    GenerateRequest r;
    r.prompt = {1};
    for (int t = 0; t < 3 + i % 5; ++t) r.prompt.push_back(static_cast<int32_t>(2 + rng() % 20));
    r.sampling.max_new_tokens = 24;
    r.sampling.temperature = i % 3 == 0 ? 0.7 : 1.0;
    r.sampling.seed = rng();
    r.tag = static_cast<uint64_t>(i);
    return r;
  };
  // Submitted sequences (not pinned: updates land between their steps), in rounds of 16 until
  // the updater has landed a few versions and some sequence saw one while it decoded: a round
  // takes milliseconds, and on a loaded machine the updater may not get a core that soon.
  constexpr int kPerRound = 16;
  std::vector<GenerateRequest> submitted;
  std::mutex mu;
  std::vector<GenerationResult> results;
  auto any_mixed = [&] {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& r : results)
      if (std::set<uint64_t>(r.token_versions.begin(), r.token_versions.end()).size() > 1)
        return true;
    return false;
  };
  for (int round = 0; round < 200 && (round == 0 || last_version.load() < 3 || !any_mixed());
       ++round) {
    std::promise<void> all_in;
    int remaining = kPerRound;
    for (int i = 0; i < kPerRound; ++i) {
      submitted.push_back(request(static_cast<int>(submitted.size())));
      ASSERT_TRUE(e.Submit(submitted.back(), [&](std::vector<GenerationResult> r) {
                     std::lock_guard<std::mutex> l(mu);
                     for (auto& x : r) results.push_back(std::move(x));
                     if (--remaining == 0) all_in.set_value();
                   }).ok());
    }
    ASSERT_EQ(all_in.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  }
  // Then a pinned batch (updates wait for it), which keeps the version it started with.
  std::vector<GenerateRequest> pinned;
  for (int i = 0; i < 6; ++i) pinned.push_back(request(100 + i));
  auto batch = e.Generate(pinned, Deadline::InMs(60000));
  done.store(true);
  Status updates = updater.get();
  ASSERT_TRUE(updates.ok()) << updates.ToString();
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_GE(last_version.load(), 3u) << "the updater must have run during generation";

  c10::InferenceMode guard;
  int mixed = 0;  // submitted sequences whose tokens span more than one version
  // The replay of one sequence: the prompt prefilled, then one decode step per token, each
  // step on the model of exactly the version that token is tagged with, over one KV cache (a
  // token's keys/values stay those of the version that processed it, as in the engine: an
  // update does not recompute the cache).
  auto check = [&](const GenerationResult& r, double temperature) {
    ASSERT_TRUE(r.finish_reason == FinishReason::kStop || r.finish_reason == FinishReason::kLength)
        << FinishReasonName(r.finish_reason) << " " << r.reject_reason;
    ASSERT_EQ(r.token_versions.size(), r.response_ids.size());
    ASSERT_FALSE(r.response_ids.empty());
    if (std::set<uint64_t>(r.token_versions.begin(), r.token_versions.end()).size() > 1) ++mixed;
    const auto p = static_cast<int64_t>(r.prompt_ids.size());
    KvCache cache(ec.model, 1, ec.model.max_seq_len, torch::kCPU);
    at::Tensor logits;
    for (size_t t = 0; t < r.response_ids.size(); ++t) {
      const uint64_t v = r.token_versions[t];
      ASSERT_GE(v, 1u);
      LlamaModel& m = *replay[set_of(v)];
      if (t == 0) {
        std::vector<int64_t> prompt(r.prompt_ids.begin(), r.prompt_ids.end());
        logits = m.Step(at::tensor(prompt), at::zeros({p}, at::kLong), at::arange(p),
                        at::full({1}, p - 1, at::kLong), cache);
      } else {
        const int64_t pos = p + static_cast<int64_t>(t) - 1;
        logits = m.Decode(at::full({1}, static_cast<int64_t>(r.response_ids[t - 1]), at::kLong),
                          at::full({1}, pos, at::kLong), pos + 1, cache);
      }
      at::Tensor want = TokenLogprobs(
          logits, at::full({1}, static_cast<int64_t>(r.response_ids[t]), at::kLong), temperature);
      EXPECT_NEAR(r.logprobs[t], want[0].item<float>(), 1e-4)
          << "tag " << r.tag << " token " << t << " tagged with version " << v;
    }
  };
  for (const auto& r : results) check(r, submitted[r.tag].sampling.temperature);
  for (const auto& r : *batch) {
    check(r, pinned[r.request_index].sampling.temperature);
    for (uint64_t v : r.token_versions) EXPECT_EQ(v, r.policy_version) << "a pinned batch";
  }
  // The check above only means something if updates did land between decode steps.
  EXPECT_GT(mixed, 0) << "no sequence saw an update while it decoded";
  RecordProperty("adapter_updates", static_cast<int>(last_version.load() - 1));
}

INSTANTIATE_TEST_SUITE_P(Paths, LoraUpdateWhileDecoding, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "MergedCopy" : "Unmerged";
                         });

}  // namespace
}  // namespace troupe::engine
