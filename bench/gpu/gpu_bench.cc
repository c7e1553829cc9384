// GPU benchmark: decode throughput against the memory-bandwidth limit, the engine against the
// bare model, the learner with a rollout engine on the same GPU, weight packing into host and
// device streams. Every figure is a ratio to a limit or a peer measured in the same run.
//
//   decode   per batch size B (default 1, 32, 256), a Qwen3-0.6B-shaped model with random
//            weights (the default Llama-style architecture at Qwen3-0.6B's sizes: vocab
//            151936, d_model 1024, 28 layers, 16/8 heads of 128, ffn 3072, tied head; this
//            main has no Qwen3 q/k-norm, which adds 0.01% of the bytes), bfloat16:
//     model    LlamaModel::Decode steps with the next token taken by argmax on the device
//              (no host sync per step): what the engine's device path could reach
//     engine   Engine::Generate, greedy, B prompts in B slots: the whole engine (host-side
//              sampling copies log-probs [B, vocab] to the host every step); decode time is
//              the run with N new tokens minus the run with 1 (prefill excluded)
//     limit    B tokens per step / (bytes a step must read / HBM bandwidth): every weight
//              once (the tied head reads the embedding matrix) plus each row's keys and
//              values up to its position. --hbm-tbps (default 4.8, an H200's HBM3e).
//   learner  Learner::Step on the same shape in float32 (master weights) on the device, fed
//            by an Engine on the same GPU sampling G=8 continuations of 8 prompts at
//            temperature 1 (real behaviour log-probs): generated and trained tokens/s.
//   pack     PackTensors of the bfloat16 model's CUDA weights into a host stream (what the
//            weight broadcast stages today) and into a device stream (no host round trip):
//            GB/s each and the ratio.
//
// usage: gpu_bench [--device cuda|cpu] [--tiny] [--batches 1,32,256] [--prompt 128]
//                  [--new 128] [--hbm-tbps 4.8] [--learner-updates 3] [--budget-s 240]
// --device cpu --tiny runs the same code on a small model (a dry run of the logic; its
// "limit" is then meaningless). Stops starting sections once --budget-s is spent. Ends with
// one JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "troupe/broadcast/layout.h"
#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/model.h"
#include "troupe/trainer/learner.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Options {
  std::string device = "cuda";
  bool tiny = false;
  std::vector<int> batches = {1, 32, 256};
  int prompt = 128;
  int new_tokens = 128;
  double hbm_tbps = 4.8;
  int learner_updates = 3;
  double budget_s = 240;
};

engine::ModelConfig ModelShape(const Options& o, engine::DType dtype) {
  engine::ModelConfig c;
  if (o.tiny) {
    c.vocab_size = 512;
    c.d_model = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.ffn_dim = 128;
  } else {  // Qwen3-0.6B's sizes (config.json of Qwen/Qwen3-0.6B)
    c.vocab_size = 151936;
    c.d_model = 1024;
    c.n_layers = 28;
    c.n_heads = 16;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.ffn_dim = 3072;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
  }
  c.tie_word_embeddings = true;
  c.max_seq_len = o.prompt + o.new_tokens + 8;  // room: no sequence ends on a full cache row
  c.dtype = dtype;
  return c;
}

// Waits for every queued kernel of the device's current stream (a tiny device-to-host copy).
void Sync(const at::Device& d) {
  if (!d.is_cpu()) at::zeros({1}, at::TensorOptions().device(d)).to(at::kCPU);
}

int64_t WeightBytes(engine::LlamaModel& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += static_cast<int64_t>(p.nbytes());
  return b;
}

// Bytes of keys and values one row reads attending positions [0, pos].
int64_t KvBytesPerPosition(const engine::ModelConfig& c) {
  const int64_t item = c.dtype == engine::DType::kFloat32 ? 4 : 2;
  return 2 * c.n_layers * c.n_kv_heads * c.HeadDim() * item;
}

std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int len, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab - 1));
  return p;
}

// Model-only decode: prefill B prompts, then `steps` decode steps, argmax on the device.
double ModelDecodeSeconds(engine::LlamaModel& m, const at::Device& dev, int B, int prompt,
                          int steps, std::mt19937_64& rng) {
  c10::InferenceMode guard;
  const engine::ModelConfig& c = m.config();
  engine::KvCache cache(c, B, prompt + steps + 1, dev);
  std::vector<int64_t> ids;
  for (int r = 0; r < B; ++r)
    for (int32_t t : RandomPrompt(rng, prompt, c.vocab_size)) ids.push_back(t);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor idt = at::tensor(ids, lopt).view({B, prompt}).to(dev);
  at::Tensor lengths = at::full({B}, prompt, lopt).to(dev);
  at::Tensor slots = at::arange(B, lopt).to(dev);
  at::Tensor logits = m.Prefill(idt, lengths, slots, cache);
  at::Tensor tok = logits.argmax(-1);
  Sync(dev);
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    at::Tensor pos = at::full({B}, prompt + s, lopt.device(dev));
    logits = m.Decode(tok, pos, prompt + s + 1, cache, /*fused_cpu=*/dev.is_cpu());
    tok = logits.argmax(-1);
  }
  Sync(dev);
  return Seconds(t0, Clock::now());
}

// Engine decode seconds for B greedy requests: one engine, warmed up, then the run with
// `new_tokens` minus the run with 1 (the prefill and the first token cancel out).
double EngineDecodeSeconds(std::shared_ptr<engine::LlamaModel> m, const Options& o, int B,
                           uint64_t seed) {
  engine::EngineConfig ec;
  ec.model = m->config();
  ec.num_slots = B;
  ec.device = o.device;
  ec.intra_op_threads = 0;
  ec.max_prefill_tokens = std::max(8192, B * o.prompt);
  auto e = engine::Engine::Create(ec, std::move(m));
  TROUPE_CHECK_MSG(e.ok(), "engine: {}", e.status().ToString());
  std::mt19937_64 rng(seed);
  auto run = [&](int rows, int new_tokens) {
    std::vector<engine::GenerateRequest> reqs;
    for (int r = 0; r < rows; ++r) {
      engine::GenerateRequest q;
      q.prompt = RandomPrompt(rng, o.prompt, ec.model.vocab_size);
      q.sampling.temperature = 0;
      q.sampling.max_new_tokens = new_tokens;
      reqs.push_back(std::move(q));
    }
    const auto t0 = Clock::now();
    auto res = (*e)->Generate(reqs, Deadline::InMs(600000));
    const double s = Seconds(t0, Clock::now());
    TROUPE_CHECK_MSG(res.ok(), "generate: {}", res.status().ToString());
    for (const auto& r : *res)
      TROUPE_CHECK_MSG(static_cast<int>(r.response_ids.size()) == new_tokens,
                       "a sequence stopped after {} of {} tokens", r.response_ids.size(),
                       new_tokens);
    return s;
  };
  run(B, 2);  // warm-up: allocations, kernels, the engine thread
  const double one = run(B, 1);
  const double full = run(B, o.new_tokens);
  return full - one;
}

json Decode(const Options& o, const at::Device& dev, Clock::time_point start) {
  const engine::ModelConfig c =
      ModelShape(o, dev.is_cpu() ? engine::DType::kFloat32 : engine::DType::kBFloat16);
  auto m = std::make_shared<engine::LlamaModel>(c, 1, dev);
  const int64_t wbytes = WeightBytes(*m);
  const int steps = o.new_tokens - 1;  // the first new token comes from the prefill
  std::mt19937_64 rng(7);
  ModelDecodeSeconds(*m, dev, 1, o.prompt, 4, rng);  // warm-up: kernels, allocator
  json rows = json::array();
  for (int B : o.batches) {
    json row = {{"batch", B}};
    if (Seconds(start, Clock::now()) > o.budget_s) {
      row["skipped"] = "budget";
      rows.push_back(row);
      continue;
    }
    // What a step must read: the weights once, each row's keys/values up to its position.
    double bytes = 0;
    for (int s = 0; s < steps; ++s)
      bytes += static_cast<double>(wbytes) +
               static_cast<double>(B) * KvBytesPerPosition(c) * (o.prompt + s + 1);
    const double limit = static_cast<double>(B) * steps / (bytes / (o.hbm_tbps * 1e12));
    const double tm = ModelDecodeSeconds(*m, dev, B, o.prompt, steps, rng);
    const double model_tps = B * steps / tm;
    const double te = EngineDecodeSeconds(m, o, B, 11 + static_cast<uint64_t>(B));
    // Timer noise can exceed a tiny model's decode time: then there is no figure (0).
    const double engine_tps = te > 0 ? B * steps / te : 0.0;
    row.update({{"limit_tok_s", limit},
                {"model_tok_s", model_tps},
                {"engine_tok_s", engine_tps},
                {"model_vs_limit", model_tps / limit},
                {"engine_vs_limit", engine_tps / limit},
                {"engine_vs_model", engine_tps / model_tps},
                {"bytes_per_step_mb", bytes / steps / 1e6}});
    std::printf(
        "decode B=%-4d model %9.0f tok/s  engine %9.0f tok/s  limit %9.0f tok/s  "
        "(model %.2f, engine %.2f of the limit)\n",
        B, model_tps, engine_tps, limit, model_tps / limit, engine_tps / limit);
    std::fflush(stdout);
    rows.push_back(row);
  }
  return {{"model", o.tiny ? "tiny" : "qwen3-0.6b-shaped"},
          {"dtype", engine::DTypeName(c.dtype)},
          {"params", c.NumParameters()},
          {"weight_bytes", wbytes},
          {"prompt", o.prompt},
          {"new_tokens", o.new_tokens},
          {"hbm_tbps", o.hbm_tbps},
          {"rows", rows}};
}

// Rollouts from `engine` (G samples of each prompt, temperature 1) as one TrainBatch.
trainer::TrainBatch Rollouts(engine::Engine& engine, const Options& o, int prompts, int G,
                             uint64_t id, std::mt19937_64& rng, int64_t* generated) {
  std::vector<engine::GenerateRequest> reqs;
  for (int p = 0; p < prompts; ++p) {
    engine::GenerateRequest q;
    q.prompt = RandomPrompt(rng, o.prompt, engine.config().model.vocab_size);
    q.sampling.temperature = 1.0;
    q.sampling.max_new_tokens = o.new_tokens;
    q.sampling.num_samples = G;
    q.sampling.seed = id * 1000 + static_cast<uint64_t>(p);
    reqs.push_back(std::move(q));
  }
  auto res = engine.Generate(reqs, Deadline::InMs(600000));
  TROUPE_CHECK_MSG(res.ok(), "rollouts: {}", res.status().ToString());
  trainer::TrainBatch b;
  b.batch_id = fmt::format("gpu-bench-{}", id);
  b.policy_version = engine.version();
  b.group_size = static_cast<uint32_t>(G);
  int i = 0;
  for (const auto& r : *res) {
    *generated += static_cast<int64_t>(r.response_ids.size());
    b.AddSequence(r.prompt_ids, r.response_ids, r.logprobs, r.mask,
                  static_cast<float>((i++ / 2) % 2));  // both rewards in every group
  }
  return b;
}

json LearnerSection(const Options& o, const at::Device& dev) {
  const engine::ModelConfig c = ModelShape(o, engine::DType::kFloat32);
  auto policy = std::make_shared<engine::LlamaModel>(c, 3, dev);
  trainer::LearnerConfig lc;
  lc.lr = 1e-5;
  lc.warmup_steps = 0;
  lc.total_steps = 1000;
  lc.max_policy_lag = 1000;
  auto learner = trainer::Learner::Create(lc, policy, nullptr);
  TROUPE_CHECK_MSG(learner.ok(), "learner: {}", learner.status().ToString());
  const int prompts = o.tiny ? 4 : 8, G = 8;
  engine::EngineConfig ec;
  ec.model = c;
  ec.num_slots = prompts * G;
  ec.device = o.device;
  ec.intra_op_threads = 0;
  auto eng = engine::Engine::Create(ec);  // its own copy of the weights on the same device
  TROUPE_CHECK_MSG(eng.ok(), "engine: {}", eng.status().ToString());
  // The learner's weights from the start: the rollouts are on-policy.
  Status synced = (*eng)->UpdateWeights(0, (*learner)->NamedWeights(), Deadline::InMs(60000));
  TROUPE_CHECK_MSG(synced.ok(), "initial weights: {}", synced.ToString());
  std::mt19937_64 rng(5);
  std::vector<double> gen_tps, train_tps, update_s;
  int64_t trained_tokens = 0;
  for (int u = 0; u <= o.learner_updates; ++u) {
    int64_t generated = 0;
    const auto t0 = Clock::now();
    trainer::TrainBatch b =
        Rollouts(**eng, o, prompts, G, static_cast<uint64_t>(u), rng, &generated);
    const auto t1 = Clock::now();
    auto a = (*learner)->Offer(std::move(b));
    TROUPE_CHECK_MSG(a.ok(), "offer: {}", a.status().ToString());
    auto m = (*learner)->Step();
    TROUPE_CHECK_MSG(m.ok(), "step: {}", m.status().ToString());
    Sync(dev);
    const auto t2 = Clock::now();
    // The trained weights go back to the engine, as a broadcast would deliver them.
    Status st = (*eng)->UpdateWeights((*learner)->version(), (*learner)->NamedWeights(),
                                      Deadline::InMs(60000));
    TROUPE_CHECK_MSG(st.ok(), "update weights: {}", st.ToString());
    if (u == 0) continue;  // warm-up update: allocator, kernels
    gen_tps.push_back(static_cast<double>(generated) / Seconds(t0, t1));
    train_tps.push_back(static_cast<double>(m->padded_tokens) / Seconds(t1, t2));
    update_s.push_back(Seconds(t1, t2));
    trained_tokens = m->tokens;
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "learner (float32, %d sequences/update): generated %.0f tok/s, trained %.0f tok/s "
      "(prompt + response, padded), update %.2f s\n",
      prompts * G, median(gen_tps), median(train_tps), median(update_s));
  return {{"dtype", "float32"},
          {"sequences_per_update", prompts * G},
          {"trained_tokens_per_update", trained_tokens},
          {"updates", o.learner_updates},
          {"generated_tok_s", median(gen_tps)},
          {"trained_tok_s", median(train_tps)},
          {"update_s", median(update_s)}};
}

json PackSection(const Options& o, const at::Device& dev) {
  const engine::ModelConfig c = ModelShape(o, engine::DType::kBFloat16);
  engine::LlamaModel m(c, 9, dev);
  const broadcast::NamedTensors named = m.NamedWeights();
  auto layout = broadcast::PlanLayout(named, broadcast::WireDtype::kAsStored, 64 << 20, 4 << 20);
  TROUPE_CHECK_MSG(layout.ok(), "plan: {}", layout.status().ToString());
  std::vector<uint8_t> host(layout->total_bytes);
  at::Tensor device_flat = at::empty({static_cast<int64_t>(layout->total_bytes)},
                                     at::TensorOptions().dtype(at::kByte).device(dev));
  auto time = [&](uint8_t* flat, const at::Device& where) {
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {
      Sync(dev);
      const auto t0 = Clock::now();
      Status st = broadcast::PackTensors(named, *layout, flat, where);
      TROUPE_CHECK_MSG(st.ok(), "pack: {}", st.ToString());
      Sync(dev);
      if (r > 0) best = std::min(best, Seconds(t0, Clock::now()));
    }
    return best;
  };
  const double th = time(host.data(), at::kCPU);
  const double td = time(device_flat.data_ptr<uint8_t>(), dev);
  const double gb = static_cast<double>(layout->total_bytes) / 1e9;
  std::printf("pack %.2f GB of weights: host stream %.1f GB/s, device stream %.1f GB/s\n", gb,
              gb / th, gb / td);
  return {{"bytes", layout->total_bytes},
          {"tensors", named.size()},
          {"host_gb_s", gb / th},
          {"device_gb_s", gb / td},
          {"device_vs_host", th / td}};
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::stoi(x));
  return out;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      TROUPE_CHECK_MSG(i + 1 < argc, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--device")
      o.device = next();
    else if (a == "--tiny")
      o.tiny = true;
    else if (a == "--batches")
      o.batches = ParseList(next());
    else if (a == "--prompt")
      o.prompt = std::stoi(next());
    else if (a == "--new")
      o.new_tokens = std::stoi(next());
    else if (a == "--hbm-tbps")
      o.hbm_tbps = std::stod(next());
    else if (a == "--learner-updates")
      o.learner_updates = std::stoi(next());
    else if (a == "--budget-s")
      o.budget_s = std::stod(next());
    else {
      std::fprintf(stderr, "gpu_bench: unknown argument %s (see the file comment)\n", a.c_str());
      return 2;
    }
  }
  if (o.new_tokens < 2 || o.prompt < 1) {
    std::fprintf(stderr, "gpu_bench: --new must be >= 2 and --prompt >= 1\n");
    return 2;
  }
  const at::Device dev(o.device);
  if (!dev.is_cpu() && !torch::cuda::is_available()) {
    std::printf("{\"bench\":\"gpu\",\"skipped\":\"no CUDA device visible to torch\"}\n");
    return 0;
  }
  log::Get("engine").set_level(spdlog::level::warn);
  log::Get("trainer").set_level(spdlog::level::warn);
  const auto start = Clock::now();
  json out = {{"bench", "gpu"}, {"device", o.device}};
  out["decode"] = Decode(o, dev, start);
  auto section = [&](const char* name, auto fn) {
    if (Seconds(start, Clock::now()) > o.budget_s) {
      out[name] = {{"skipped", "budget"}};
      return;
    }
    out[name] = fn();
  };
  section("learner", [&] { return LearnerSection(o, dev); });
  section("pack", [&] { return PackSection(o, dev); });
  out["seconds"] = Seconds(start, Clock::now());
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  try {
    return troupe::Main(argc, argv);
  } catch (const std::exception& e) {  // a bad number on the command line, a device torch refuses
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 2;
  }
}
