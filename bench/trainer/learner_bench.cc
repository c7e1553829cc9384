// Learner benchmark: training throughput of one optimizer step on the default
// job's model and batch, measured against a limit and a peer in one run.
//
//   learner      Learner::Offer + Learner::Step on 128 sequences (16 prompts x 8
//                samples, prompts 8-11 tokens, responses 2-8 tokens), default
//                LearnerConfig: tokens/s (prompt + response tokens, as the
//                Python reference counts them) and the share of the step spent
//                in forward (+ loss), backward and the optimizer (clip + AdamW)
//   raw_loop     the limit: the same model, the same pre-packed padded tensors,
//                the learner's forward (ForwardHiddenRows + the head at the target
//                positions) + log-probs + a policy-gradient loss + backward + clip +
//                AdamW and nothing else. learner / raw_loop shows what validation,
//                packing, the full decoupled loss and metrics cost.
//   module_path  the same loop through the padded module path (Forward: plain
//                torch ops under autograd, the head everywhere), what the learner
//                ran before its fused kernels: raw_loop / module_path is their gain.
//   python       the peer: bench/trainer/torch_train_peer.py, the same step in
//                plain PyTorch (when python3-torch is installed), run between
//                three rounds of the learner; ratio of the medians
//   threads      the learner at 2 intra-op threads (default is 1)
//
//   allocator    --no-allocator-tuning leaves glibc malloc at its defaults
//                (LearnerConfig::tune_allocator = false, see allocator.h)
//
// usage: learner_bench [--steps N] [--no-python] [--no-allocator-tuning]
// Ends with one JSON line of the key figures and ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>
// clip_grad.h relies on torch::Tensor being declared before it.
#include <torch/nn/utils/clip_grad.h>
#include <nlohmann/json.hpp>

#include "troupe/core/check.h"
#include "troupe/core/cpu_time.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/model.h"
#include "troupe/trainer/learner.h"
#include "troupe/trainer/packing.h"

namespace troupe::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr int kPrompts = 16, kSamples = 8, kSeqs = kPrompts * kSamples;
constexpr int kPromptMin = 8, kPromptMax = 11, kRespMin = 2, kRespMax = 8;

struct Options {
  int steps = 20;
  bool python = true;
  bool tune_allocator = true;
};

// Batches of the default job's shape with on-policy behaviour log-probs;
// every group has both rewards (no uniform group to skip).
std::vector<TrainBatch> MakeBatches(engine::LlamaModel& model, int n, std::mt19937_64& rng) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<TrainBatch> out;
  for (int b = 0; b < n; ++b) {
    TrainBatch batch;
    batch.batch_id = "bench-" + std::to_string(b);
    batch.group_size = kSamples;
    for (int i = 0; i < kSeqs; ++i) {
      const int p = kPromptMin + static_cast<int>(rng() % (kPromptMax - kPromptMin + 1));
      const int r = kRespMin + static_cast<int>(rng() % (kRespMax - kRespMin + 1));
      std::vector<int32_t> prompt(static_cast<size_t>(p)), resp(static_cast<size_t>(r));
      for (auto& t : prompt) t = 4 + static_cast<int32_t>(rng() % (vocab - 4));
      for (auto& t : resp) t = 4 + static_cast<int32_t>(rng() % (vocab - 4));
      batch.AddSequence(prompt, resp, std::vector<float>(resp.size(), 0.0f),
                        std::vector<uint8_t>(resp.size(), 1), static_cast<float>(i % 2));
    }
    // On-policy behaviour log-probs, one padded forward.
    std::vector<SequenceView> views;
    for (int i = 0; i < kSeqs; ++i) {
      SequenceView v;
      v.prompt = batch.prompt_tokens.data() + batch.prompt_offsets[i];
      v.prompt_len = batch.prompt_offsets[i + 1] - batch.prompt_offsets[i];
      v.response = batch.response_tokens.data() + batch.response_offsets[i];
      v.response_len = batch.response_offsets[i + 1] - batch.response_offsets[i];
      v.flat_offset = batch.response_offsets[i];
      views.push_back(v);
    }
    std::vector<int64_t> rows(kSeqs);
    for (int i = 0; i < kSeqs; ++i) rows[static_cast<size_t>(i)] = i;
    PackedMicroBatch mb = PackMicroBatch(views, rows);
    at::NoGradGuard no_grad;
    at::Tensor lp = engine::TokenLogprobs(model.Forward(mb.ids), mb.targets, 1.0);
    at::Tensor flat = at::zeros({batch.num_response_tokens()});
    flat.index_copy_(0, mb.valid_flat_index, lp.masked_select(mb.valid));
    std::copy(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel(),
              batch.behaviour_logprobs.begin());
    out.push_back(std::move(batch));
  }
  return out;
}

int64_t Tokens(const TrainBatch& b) {
  return static_cast<int64_t>(b.prompt_tokens.size() + b.response_tokens.size());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The learner under test: Offer + Step per call, timings per phase.
class LearnerRunner {
 public:
  LearnerRunner(const std::vector<TrainBatch>& batches, bool tune_allocator,
                int32_t update_threads = 1)
      : batches_(batches) {
    LearnerConfig c;
    c.tune_allocator = tune_allocator;
    c.threads = update_threads;
    c.max_policy_lag = 1 << 20;  // the same few batches are offered again and again
    auto learner =
        Learner::Create(c, std::make_shared<engine::LlamaModel>(engine::ModelConfig(), 0));
    TROUPE_CHECK_MSG(learner.ok(), "{}", learner.status().ToString());
    learner_ = std::move(learner).value();
  }
  // Returns the step's metrics; `seconds` is the wall time of Offer + Step.
  StepMetrics Step(double* seconds) {
    TrainBatch b = batches_[static_cast<size_t>(i_) % batches_.size()];
    b.batch_id += "/" + std::to_string(i_++);
    const auto t0 = Clock::now();
    TROUPE_CHECK(learner_->Offer(std::move(b)).ok());
    auto m = learner_->Step();
    *seconds = Seconds(t0, Clock::now());
    TROUPE_CHECK_MSG(m.ok(), "{}", m.status().ToString());
    return *m;
  }

 private:
  const std::vector<TrainBatch>& batches_;
  std::unique_ptr<Learner> learner_;
  int i_ = 0;
};

// The limit: forward, log-probs, a policy-gradient loss, backward, clip, AdamW
// on pre-packed tensors.
class RawLoop {
 public:
  RawLoop(const std::vector<TrainBatch>& batches, bool rows_path)
      : rows_path_(rows_path),
        model_(std::make_shared<engine::LlamaModel>(engine::ModelConfig(), 0)),
        params_(model_->parameters()),
        opt_(params_, torch::optim::AdamWOptions(1e-3).weight_decay(0.0)) {
    for (const TrainBatch& b : batches) {
      std::vector<SequenceView> views;
      for (int i = 0; i < kSeqs; ++i) {
        SequenceView v;
        v.prompt = b.prompt_tokens.data() + b.prompt_offsets[i];
        v.prompt_len = b.prompt_offsets[i + 1] - b.prompt_offsets[i];
        v.response = b.response_tokens.data() + b.response_offsets[i];
        v.response_len = b.response_offsets[i + 1] - b.response_offsets[i];
        v.advantage = (i % 2) ? 1.0f : -1.0f;
        v.token_weight = 1.0f / static_cast<float>(b.num_response_tokens());
        views.push_back(v);
      }
      std::vector<int64_t> rows(kSeqs);
      for (int i = 0; i < kSeqs; ++i) rows[static_cast<size_t>(i)] = i;
      packed_.push_back(PackMicroBatch(views, rows));
    }
  }
  double Step() {
    const PackedMicroBatch& mb = packed_[static_cast<size_t>(i_++) % packed_.size()];
    const auto t0 = Clock::now();
    opt_.zero_grad();
    at::Tensor loss;
    if (rows_path_) {
      const at::Tensor idx = mb.valid.reshape({-1}).nonzero().squeeze(1);
      const at::Tensor logits =
          model_->HeadLogits(model_->ForwardHiddenRows(mb.ids, mb.lengths, idx));
      auto at_rows = [&](const at::Tensor& t) { return t.reshape({-1}).index_select(0, idx); };
      const at::Tensor logp = engine::TokenLogprobs(logits, at_rows(mb.targets), 1.0);
      loss = -(logp * at_rows(mb.advantages) * at_rows(mb.weights)).sum();
    } else {
      const at::Tensor logp = engine::TokenLogprobs(model_->Forward(mb.ids), mb.targets, 1.0);
      loss = -(logp * mb.advantages * mb.weights).sum();
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params_, 1.0);
    opt_.step();
    return Seconds(t0, Clock::now());
  }

 private:
  bool rows_path_;
  std::shared_ptr<engine::LlamaModel> model_;
  std::vector<at::Tensor> params_;
  torch::optim::AdamW opt_;
  std::vector<PackedMicroBatch> packed_;
  int i_ = 0;
};

// tokens/s of the Python peer, or -1 when python3-torch is missing or it fails.
double PythonPeer(int steps) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) return -1;
  const engine::ModelConfig mc;
  const std::string cmd = fmt::format(
      "OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 {} --layers {} --d-model {} --heads {} "
      "--kv-heads {} --ffn {} --vocab {} --sequences {} --group {} --prompt-min {} "
      "--prompt-max {} --response-min {} --response-max {} --threads 1 --steps {}",
      TROUPE_TRAIN_PEER, mc.n_layers, mc.d_model, mc.n_heads, mc.n_kv_heads, mc.ffn_dim,
      mc.vocab_size, kSeqs, kSamples, kPromptMin, kPromptMax, kRespMin, kRespMax, steps);
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  if (pclose(p) != 0) return -1;
  const size_t line = out.rfind('{');
  if (line == std::string::npos) return -1;
  auto j = nlohmann::json::parse(out.substr(line), nullptr, false);
  if (j.is_discarded() || !j.contains("tokens_per_s")) return -1;
  return j["tokens_per_s"].get<double>();
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      o.steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-python") {
      o.python = false;
    } else if (a == "--no-allocator-tuning") {
      o.tune_allocator = false;
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--no-python] [--no-allocator-tuning]\n",
                   argv[0]);
      return 2;
    }
  }
  log::Init("learner_bench", {spdlog::level::warn});
  // One thread for torch and OpenBLAS, as in the job (the learner's process sets both).
  engine::SetComputeThreads(1);
  std::mt19937_64 rng(1);
  auto gen_model = std::make_shared<engine::LlamaModel>(engine::ModelConfig(), 0);
  const auto batches = MakeBatches(*gen_model, 4, rng);
  int64_t tokens_per_step = 0;
  for (const auto& b : batches) tokens_per_step += Tokens(b);
  tokens_per_step /= static_cast<int64_t>(batches.size());
  std::printf("model: %s\n", engine::ModelConfig().ToString().c_str());
  std::printf("batch: %d sequences (%d prompts x %d), ~%lld tokens per step\n", kSeqs, kPrompts,
              kSamples, static_cast<long long>(tokens_per_step));

  // Learner and raw loop alternate step by step, so load from other processes
  // hits both alike; medians of per-step times resist load spikes. The Python
  // peer runs between rounds of the same measurement for the same reason.
  LearnerRunner learner(batches, o.tune_allocator);
  RawLoop raw(batches, /*rows_path=*/true), module(batches, /*rows_path=*/false);
  std::vector<double> t_learner, t_raw, t_module, fwd, bwd, opt, other, py_rounds, l_rounds;
  const int warmup = 3, rounds = 3;
  const int per_round = std::max(1, o.steps / rounds);
  for (int i = 0; i < warmup; ++i) {
    double dt = 0;
    learner.Step(&dt);
    raw.Step();
    module.Step();
  }
  for (int round = 0; round < rounds; ++round) {
    std::vector<double> t_round;
    for (int i = 0; i < per_round; ++i) {
      double dt = 0;
      StepMetrics m = learner.Step(&dt);
      const double dr = raw.Step();
      t_module.push_back(module.Step());
      t_learner.push_back(dt);
      t_round.push_back(dt);
      t_raw.push_back(dr);
      fwd.push_back(m.forward_s / dt);
      bwd.push_back(m.backward_s / dt);
      opt.push_back(m.optimizer_s / dt);
      other.push_back(std::max(0.0, dt - m.forward_s - m.backward_s - m.optimizer_s) / dt);
    }
    l_rounds.push_back(static_cast<double>(tokens_per_step) / Median(t_round));
    if (o.python) {
      const double p = PythonPeer(per_round);
      if (p > 0) py_rounds.push_back(p);
    }
  }
  const double step_s = Median(t_learner);
  const double l1 = static_cast<double>(tokens_per_step) / step_s;
  const double raw_tok_s = static_cast<double>(tokens_per_step) / Median(t_raw);
  const double module_tok_s = static_cast<double>(tokens_per_step) / Median(t_module);
  // Python against the learner rounds measured next to it.
  const double py = py_rounds.size() == static_cast<size_t>(rounds) ? Median(py_rounds) : -1;
  const double l_next_to_py = Median(l_rounds);
  // Two intra-op threads (the default is one; see docs/trainer.md).
  engine::SetComputeThreads(2);
  LearnerRunner learner2(batches, o.tune_allocator);
  std::vector<double> t2;
  for (int i = 0; i < warmup + o.steps / 2; ++i) {
    double dt = 0;
    learner2.Step(&dt);
    if (i >= warmup) t2.push_back(dt);
  }
  const double l2 = static_cast<double>(tokens_per_step) / Median(t2);
  engine::SetComputeThreads(1);
  // Two update threads (trainer.threads 2: the sequences split across two threads of one
  // intra-op thread each), alternating step by step with the one-thread learner.
  LearnerRunner learner_t2(batches, o.tune_allocator, 2);
  std::vector<double> tt2, tt1, ct2, ct1;
  for (int i = 0; i < warmup + o.steps / 2; ++i) {
    double a = 0, b = 0;
    const double c0 = ProcessCpuSeconds();
    learner_t2.Step(&a);
    const double c1 = ProcessCpuSeconds();
    learner.Step(&b);
    const double c2 = ProcessCpuSeconds();
    if (i >= warmup) {
      tt2.push_back(a);
      tt1.push_back(b);
      ct2.push_back(c1 - c0);
      ct1.push_back(c2 - c1);
    }
  }
  // CPU-seconds per step, 2 update threads over 1: the threads' overhead (1 = none; the
  // wall-time gain on free cores is then the thread count), whatever the machine's load.
  const double update_threads_cpu_ratio = Median(ct2) / Median(ct1);
  const double lt2 = static_cast<double>(tokens_per_step) / Median(tt2);
  const double update_threads_ratio = Median(tt1) / Median(tt2);

  std::printf(
      "learner (1 thread):  %8.0f tok/s  (%.1f ms/step; forward %.0f%%, backward %.0f%%, "
      "optimizer %.0f%%, other %.0f%%)\n",
      l1, 1e3 * step_s, 100 * Median(fwd), 100 * Median(bwd), 100 * Median(opt),
      100 * Median(other));
  std::printf("raw libtorch loop:   %8.0f tok/s  -> learner %.2fx of the limit\n", raw_tok_s,
              l1 / raw_tok_s);
  std::printf("module-path loop:    %8.0f tok/s  -> fused forward %.2fx of it\n", module_tok_s,
              raw_tok_s / module_tok_s);
  std::printf("learner (2 threads): %8.0f tok/s  (%.2fx of 1 thread)\n", l2, l2 / l1);
  std::printf(
      "learner (2 update threads): %8.0f tok/s  (%.2fx of 1 thread, alternating; CPU-seconds "
      "per step %.2fx)\n",
      lt2, update_threads_ratio, update_threads_cpu_ratio);
  nlohmann::json j;
  j["bench"] = "trainer_learner";
  j["sequences"] = kSeqs;
  j["allocator_tuning"] = o.tune_allocator;
  j["tokens_per_step"] = tokens_per_step;
  j["learner_tok_s"] = l1;
  j["step_ms"] = 1e3 * step_s;
  j["forward_share"] = Median(fwd);
  j["backward_share"] = Median(bwd);
  j["optimizer_share"] = Median(opt);
  j["other_share"] = Median(other);
  j["raw_loop_tok_s"] = raw_tok_s;
  j["learner_vs_raw"] = l1 / raw_tok_s;
  j["module_path_tok_s"] = module_tok_s;
  j["fused_vs_module_path"] = raw_tok_s / module_tok_s;
  j["learner_2threads_tok_s"] = l2;
  j["threads2_vs_1"] = l2 / l1;
  j["learner_2update_threads_tok_s"] = lt2;
  j["update_threads2_vs_1"] = update_threads_ratio;
  j["update_threads2_cpu_per_step_vs_1"] = update_threads_cpu_ratio;
  if (py > 0) {
    std::printf(
        "python pytorch step: %8.0f tok/s  -> learner %.2fx (%.0f tok/s in the same rounds)\n", py,
        l_next_to_py / py, l_next_to_py);
    j["python_tok_s"] = py;
    j["learner_vs_python"] = l_next_to_py / py;
  } else {
    std::printf("python pytorch step: skipped (python3-torch not installed or --no-python)\n");
    j["python_tok_s"] = nullptr;
    j["learner_vs_python"] = nullptr;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace troupe::trainer

int main(int argc, char** argv) {
  return troupe::trainer::Main(argc, argv);
}
