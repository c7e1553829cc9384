// Real-model benchmark: loading a sharded Hugging Face folder, and what the math job
// (configs/math_qwen3.yaml: a small Qwen3-architecture policy on the real 151,669-id Qwen3
// tokenizer) generates and trains per second, each against a limit or peer in the same run.
//
//   load        a Qwen3-0.6B-shaped folder (28 layers, bf16, 4 shards of <= 300 MB, written
//               by tests/engine/hf_reference.py): ReadHfModelFolder + LoadModel into float32,
//               first round and best of N, against reading the same bytes into memory (the
//               limit) and PyTorch from Python (hf_reference.py load: mmap -> float32)
//   generate    the math job's rollout shape (8 prompts x 8 samples, its real chat-template
//               prompts, temperature 1, max_new_tokens of the config) on its model with
//               random weights: tokens/s
//   train       Learner::SupervisedStep on 32 rendered demonstrations (what the warm start
//               runs): tokens/s of trained (response) tokens, against the same step computing
//               the output head at every position (Forward + TokenLogprobs, the plain way) --
//               what evaluating the 151k-row head only at target positions saves
//   head share  the output head's share of one forward over the demonstrations
//   job         with --run RUN (a finished math job): its gen/train tokens/s and accuracy
//
// usage: models_bench [--layers 28] [--repeats 3] [--run RUN] [--no-python] [--only PARTS]
// Ends with one JSON line.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/hf_folder.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/memory.h"
#include "troupe/engine/safetensors.h"
#include "troupe/envs/renderer.h"
#include "troupe/envs/tasks.h"
#include "troupe/launcher/job_config.h"
#include "troupe/trainer/learner.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  int layers = 28;
  int repeats = 3;
  std::string run;
  bool python = true;
  std::string only;  // comma-separated parts to run (load, generate, train); empty: all
  bool Runs(const std::string& part) const {
    return only.empty() || ("," + only + ",").find("," + part + ",") != std::string::npos;
  }
};

std::string SourceDir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  return s ? s : ".";
}

std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// ---------------------------------------------------------------- load

nlohmann::json BenchLoad(const Options& o) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("troupe-models-bench-{}", ::getpid());
  fs::remove_all(dir);
  const std::string make = fmt::format(
      "/usr/bin/python3 {}/tests/engine/hf_reference.py make {} --preset qwen3-0.6b --layers {} "
      "--dtype bf16 --shard-mb 300 --no-reference",
      SourceDir(), dir.string(), o.layers);
  std::printf("writing the folder: %s\n", make.c_str());
  if (std::system(make.c_str()) != 0) {
    std::fprintf(stderr, "models_bench: %s failed\n", make.c_str());
    std::exit(1);
  }
  auto files = engine::HfWeightFiles(dir.string());
  TROUPE_CHECK(files.ok());
  uint64_t bytes = 0;
  for (const auto& f : *files) bytes += fs::file_size(f);
  double raw = 1e9, mine = 1e9, first = 0, python = 1e9;
  int64_t params = 0;
  for (int r = 0; r < o.repeats; ++r) {
    // Troupe: read config.json, validate the index, load and cast every tensor to float32.
    // The first round allocates fresh memory (page cache warm: the folder was just written),
    // later ones reuse the freed heap as a long-lived actor does.
    auto t0 = Clock::now();
    {
      auto folder = engine::ReadHfModelFolder(dir.string(), 2048);
      TROUPE_CHECK(folder.ok());
      engine::ModelConfig cfg = folder->config;
      cfg.dtype = engine::DType::kFloat32;
      auto model = engine::LoadModel(dir.string(), cfg);
      TROUPE_CHECK_MSG(model.ok(), "{}", model.status().ToString());
      params = cfg.NumParameters();
    }
    const double t = Since(t0);
    if (r == 0) first = t;
    mine = std::min(mine, t);
    // The limit: the same bytes into memory.
    t0 = Clock::now();
    std::vector<char> buf(bytes);
    size_t at = 0;
    for (const auto& f : *files) {
      std::ifstream in(f, std::ios::binary);
      in.read(buf.data() + at, static_cast<std::streamsize>(fs::file_size(f)));
      at += fs::file_size(f);
    }
    raw = std::min(raw, Since(t0));
  }
  // The peer: PyTorch from Python, a fresh process each time (mmap, frombuffer, .to(float32),
  // as safetensors' own loader does), best of the same number of rounds.
  for (int r = 0; o.python && r < o.repeats; ++r) {
    auto j = nlohmann::json::parse(
        Capture(fmt::format("/usr/bin/python3 {}/tests/engine/hf_reference.py load {}", SourceDir(),
                            dir.string())),
        nullptr, false);
    if (!j.is_discarded()) python = std::min(python, j.value("seconds", 1e9));
  }
  if (!o.python) python = 0;
  fs::remove_all(dir);
  std::printf("load: %zu shards, %.0f MB bf16, %.0fM parameters: Troupe %.2f s (first %.2f s), read "
              "bytes %.2f s (ratio %.2f), PyTorch %.2f s\n",
              files->size(), bytes / 1e6, params / 1e6, mine, first, raw, mine / raw, python);
  return {{"layers", o.layers},       {"shards", files->size()}, {"mb", bytes / 1e6},
          {"params_m", params / 1e6}, {"troupe_s", mine},        {"troupe_first_s", first},
          {"read_s", raw},            {"vs_read", mine / raw},   {"python_s", python},
          {"vs_python", python > 0 ? python / mine : 0.0},
          {"vs_python_first", python > 0 ? python / first : 0.0}};
}

// ---------------------------------------------------------------- the math job's shapes

struct MathJob {
  launcher::JobConfig job;
  std::unique_ptr<engine::Tokenizer> tokenizer;
  std::unique_ptr<envs::Renderer> renderer;
  std::unique_ptr<envs::Task> task;
};

MathJob LoadMathJob() {
  MathJob m;
  auto job = launcher::LoadJobConfig(SourceDir() + "/configs/math_qwen3.yaml", {});
  TROUPE_CHECK_MSG(job.ok(), "{}", job.status().ToString());
  m.job = std::move(*job);
  auto tok = launcher::MakeTokenizer(m.job.tokenizer);
  TROUPE_CHECK(tok.ok());
  m.tokenizer = std::move(*tok);
  auto r = envs::MakeRenderer(*m.tokenizer, launcher::TokenizerFolder(m.job.tokenizer), m.job.chat);
  TROUPE_CHECK_MSG(r.ok(), "{}", r.status().ToString());
  m.renderer = std::move(*r);
  auto t = envs::MakeTask(m.job.tasks[0]);
  TROUPE_CHECK(t.ok());
  m.task = std::move(*t);
  return m;
}

nlohmann::json BenchGenerate(const MathJob& m, const Options& o) {
  engine::EngineConfig ec;
  ec.model = m.job.model;
  ec.num_slots = m.job.engine.num_slots;
  auto engine = engine::Engine::Create(ec);
  TROUPE_CHECK(engine.ok());
  double best = 0;
  int64_t tokens = 0;
  for (int r = 0; r < o.repeats; ++r) {
    std::vector<engine::GenerateRequest> reqs;
    for (uint32_t i = 0; i < m.job.batch.prompts_per_update; ++i) {
      auto p = m.task->GetPrompt(envs::Split::kTrain, r * 100 + i);
      engine::GenerateRequest q;
      q.prompt = *m.renderer->RenderPrompt(p.messages);
      q.sampling.temperature = m.job.sampling.temperature;
      q.sampling.max_new_tokens = m.job.sampling.max_new_tokens;
      q.sampling.num_samples = static_cast<int32_t>(m.job.batch.samples_per_prompt);
      q.sampling.seed = static_cast<uint64_t>(r);
      q.sampling.stop_token_ids = {m.tokenizer->eos_id()};
      reqs.push_back(std::move(q));
    }
    auto t0 = Clock::now();
    auto res = (*engine)->Generate(reqs, Deadline::InMs(600000));
    const double s = Since(t0);
    TROUPE_CHECK(res.ok());
    tokens = 0;
    for (const auto& x : *res) tokens += x.num_new_tokens;
    best = std::max(best, static_cast<double>(tokens) / s);
  }
  std::printf("generate: %lld tokens per batch, %.0f tok/s\n", static_cast<long long>(tokens), best);
  return {{"tokens_per_batch", tokens}, {"tokens_per_s", best}};
}

trainer::Demonstrations Demos(const MathJob& m, int n, int round) {
  trainer::Demonstrations d;
  for (int i = 0; i < n; ++i) {
    auto p = m.task->GetPrompt(envs::Split::kTrain, round * 1000 + i);
    auto demo = m.task->Demonstration(p);
    auto seq = m.renderer->RenderConversation(p.messages, *demo);
    TROUPE_CHECK(seq.ok());
    d.Add(seq->prompt_tokens, seq->response_tokens, seq->loss_mask);
  }
  return d;
}

nlohmann::json BenchTrain(const MathJob& m, const Options& o) {
  const int n = static_cast<int>(m.job.warm_start.batch_size);
  auto policy = std::make_shared<engine::LlamaModel>(m.job.model, 1);
  auto learner = trainer::Learner::Create(m.job.trainer, policy, nullptr);
  TROUPE_CHECK(learner.ok());
  double best = 0;
  int64_t targets = 0;
  for (int r = 0; r < o.repeats + 1; ++r) {  // the first round warms up
    auto d = Demos(m, n, r);
    targets = static_cast<int64_t>(d.response_tokens.size());
    auto t0 = Clock::now();
    auto s = (*learner)->SupervisedStep(d);
    const double sec = Since(t0);
    TROUPE_CHECK_MSG(s.ok(), "{}", s.status().ToString());
    if (r > 0) best = std::max(best, static_cast<double>(targets) / sec);
  }
  // The plain way: logits at every position, then the target log-probs.
  auto plain_model = std::make_shared<engine::LlamaModel>(m.job.model, 1);
  std::vector<at::Tensor> params;
  for (auto& p : plain_model->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3));
  double plain = 0;
  int64_t positions = 0;
  double head_share = 0;
  for (int r = 0; r < o.repeats + 1; ++r) {
    auto d = Demos(m, n, r);
    const int64_t rows = d.num_sequences();
    int64_t T = 0;
    for (int64_t i = 0; i < rows; ++i)
      T = std::max<int64_t>(T, (d.prompt_offsets[i + 1] - d.prompt_offsets[i]) +
                                   (d.response_offsets[i + 1] - d.response_offsets[i]) - 1);
    at::Tensor ids = at::zeros({rows, T}, at::kLong), tgt = at::zeros({rows, T}, at::kLong);
    at::Tensor w = at::zeros({rows, T});
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<int32_t> seq(d.prompt_tokens.begin() + d.prompt_offsets[i],
                               d.prompt_tokens.begin() + d.prompt_offsets[i + 1]);
      const int64_t P = static_cast<int64_t>(seq.size());
      seq.insert(seq.end(), d.response_tokens.begin() + d.response_offsets[i],
                 d.response_tokens.begin() + d.response_offsets[i + 1]);
      for (int64_t t = 0; t + 1 < static_cast<int64_t>(seq.size()); ++t) {
        ids[i][t] = seq[t];
        tgt[i][t] = seq[t + 1];
        if (t + 1 >= P) w[i][t] = 1.0;
      }
    }
    positions = rows * T;
    auto t0 = Clock::now();
    opt.zero_grad();
    at::Tensor logits = plain_model->Forward(ids);
    at::Tensor loss = -(engine::TokenLogprobs(logits, tgt, 1.0) * w).sum() / w.sum();
    loss.backward();
    opt.step();
    const double sec = Since(t0);
    if (r > 0) plain = std::max(plain, static_cast<double>(targets) / sec);
    if (r == o.repeats) {
      // Forward only: the body vs the output head on the target rows.
      c10::InferenceMode guard;
      auto h0 = Clock::now();
      at::Tensor hidden = plain_model->ForwardHidden(ids);
      const double body = Since(h0);
      at::Tensor rows_h = hidden.reshape({-1, hidden.size(-1)}).index_select(
          0, w.reshape({-1}).nonzero().squeeze(1));
      h0 = Clock::now();
      at::Tensor z = engine::ScaledLogSoftmax(plain_model->HeadLogits(rows_h), 1.0);
      const double head = Since(h0);
      head_share = head / (head + body);
    }
  }
  const engine::ModelConfig& mc = m.job.model;
  const double embed = static_cast<double>(mc.vocab_size * mc.d_model);
  std::printf("train: %lld target tokens per step (%lld positions): %.0f tok/s with the head at "
              "targets only, %.0f tok/s with the head everywhere (%.2fx); the head is %.0f%% of a "
              "forward; embedding %.1fM of %.1fM parameters\n",
              static_cast<long long>(targets), static_cast<long long>(positions), best, plain,
              best / plain, 100 * head_share, embed / 1e6, mc.NumParameters() / 1e6);
  return {{"targets_per_step", targets}, {"tokens_per_s", best},     {"plain_tokens_per_s", plain},
          {"vs_plain", best / plain},   {"head_share", head_share}, {"embedding_params_m", embed / 1e6},
          {"params_m", mc.NumParameters() / 1e6}};
}

// The job_summary line of a finished run: its learner's generated / trained tokens per second.
nlohmann::json JobFigures(const std::string& run) {
  if (run.empty()) return nullptr;
  std::ifstream in(run + "/metrics.jsonl");
  nlohmann::json out = nullptr;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("kind", "") != "job_summary" || !j.contains("learner")) continue;
    const auto& l = j["learner"];
    out = {{"gen_tokens_per_s", l.value("gen_tokens_per_s", 0.0)},
           {"train_tokens_per_s", l.value("train_tokens_per_s", 0.0)},
           {"warm_accuracy", l.value("warm_accuracy", 0.0)},
           {"best_accuracy", l.value("best_accuracy", 0.0)},
           {"final_accuracy", l.value("final_accuracy", 0.0)},
           {"updates", l.value("steps", 0.0)},
           {"rl_seconds", l.value("elapsed_s", 0.0)}};
  }
  if (out.is_null()) {
    std::fprintf(stderr, "models_bench: %s/metrics.jsonl has no job_summary line\n", run.c_str());
    std::exit(1);
  }
  std::printf("job %s: generated %.0f tok/s, trained %.0f tok/s; held-out %.3f -> %.3f (best %.3f)\n",
              run.c_str(), out["gen_tokens_per_s"].get<double>(),
              out["train_tokens_per_s"].get<double>(), out["warm_accuracy"].get<double>(),
              out["final_accuracy"].get<double>(), out["best_accuracy"].get<double>());
  return out;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  using namespace troupe;
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--layers") o.layers = std::atoi(next().c_str());
    else if (a == "--repeats") o.repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--run") o.run = next();
    else if (a == "--no-python") o.python = false;
    else if (a == "--only") o.only = next();
    else {
      std::fprintf(stderr, "usage: models_bench [--layers N] [--repeats N] [--run RUN] [--no-python] "
                           "[--only load,generate,train]\n");
      return 2;
    }
  }
  log::Options quiet;
  quiet.level = spdlog::level::warn;
  log::Init("models_bench", quiet);
  engine::ConfigureAllocatorForTensors();
  at::set_num_threads(1);
  nlohmann::json out;
  out["bench"] = "models";
  if (o.Runs("load")) out["load"] = BenchLoad(o);
  MathJob m = LoadMathJob();
  if (o.Runs("generate")) out["generate"] = BenchGenerate(m, o);
  if (o.Runs("train")) out["train"] = BenchTrain(m, o);
  out["job"] = JobFigures(o.run);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
