// The engine alone, doing exactly what one rollout actor does, with no actor
// system around it: the peer of the job-overhead benchmark
// (bench/actors/job_bench.py).
//
// Reads the same job config, builds the same tokenizer, tasks, prompt stream
// and Engine (same slots, threads, sampling), keeps the same number of groups
// in flight through Engine::Submit, and counts sampled tokens per second for
// a fixed number of seconds. Ends with one JSON line.
//
// --weights PATH loads the policy from a .safetensors file, a checkpoint, a
// checkpoints root or a run folder (its latest checkpoint), as
// warm_start.init_from does:
// a trained policy stops earlier than a random one, which changes the prefill
// share of every generated token, so the peer must generate with the same
// weights as the job it is compared with.
//
// --wave-period-ms P paces it as a learner-bound job is paced: a wave of
// max_groups_in_flight groups (one update's grant) at most every P ms, the
// engine idle in between (job_bench.py's paced side-by-side peer).
//
//   standalone_rollout CONFIG [--seconds S] [--weights PATH] [--set key=value ...]
//                      [--waves] [--wave-gap-ms G] [--wave-period-ms P]
//                      [--weight-updates-per-s U] [--load-via-update]
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/core/cpu_time.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/memory.h"
#include "troupe/engine/safetensors.h"
#include "troupe/envs/renderer.h"
#include "troupe/envs/sampler.h"
#include "troupe/envs/tasks.h"
#include "troupe/launcher/job_config.h"
#include "troupe/trainer/checkpoint.h"

using namespace troupe;

int main(int argc, char** argv) {
  engine::ConfigureAllocatorForTensors();
  if (argc < 2) {
    std::cerr << "usage: standalone_rollout CONFIG [--seconds S] [--weights PATH] [--set "
                 "key=value ...]\n";
    return 2;
  }
  std::string config = argv[1];
  double seconds = 20;
  std::vector<std::string> sets;
  std::string weights;
  // Diagnostics (what a job adds around the engine, one thing at a time):
  double updates_per_s = 0;  // weight updates from another thread, as a job's receiver makes
  bool waves = false;        // refill only once every group finished (a job's grant waves)
  double wave_gap_ms = 0;    // --waves: idle this long between waves (a learner-bound job)
  double wave_period_ms = 0;  // waves that start this often at most: a learner-bound job's pace
  bool load_via_update = false;  // start from random weights, then UpdateWeights (as a job)
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--weights" && i + 1 < argc)
      weights = argv[++i];
    else if (a == "--set" && i + 1 < argc)
      sets.push_back(argv[++i]);
    else if (a == "--waves")
      waves = true;
    else if (a == "--load-via-update")
      load_via_update = true;
    else if (a == "--wave-gap-ms" && i + 1 < argc)
      wave_gap_ms = std::atof(argv[++i]);
    else if (a == "--wave-period-ms" && i + 1 < argc) {
      wave_period_ms = std::atof(argv[++i]);
      waves = true;
    }
    else if (a == "--weight-updates-per-s" && i + 1 < argc)
      updates_per_s = std::atof(argv[++i]);
  }
  auto job = launcher::LoadJobConfig(config, sets);
  if (!job.ok()) {
    std::cerr << job.status().ToString() << "\n";
    return 2;
  }
  auto tok = launcher::MakeTokenizer(job->tokenizer);
  if (!tok.ok()) return 1;
  envs::Renderer renderer(**tok, envs::ChatFormat::Compact());
  auto tasks = envs::TaskRegistry::Create(job->tasks);
  if (!tasks.ok()) return 1;
  auto prompts = envs::PromptStream::Create(*tasks, job->tasks, 12345, 0, 1);
  if (!prompts.ok()) return 1;
  engine::EngineConfig ec;
  ec.model = job->model;
  ec.num_slots = job->engine.num_slots;
  ec.intra_op_threads = job->engine.intra_op_threads;
  ec.device = job->engine.device;
  ec.fused_cpu_kernels = job->engine.fused_cpu_kernels;
  std::shared_ptr<engine::LlamaModel> model;
  if (!weights.empty()) {
    auto file = trainer::ResolveWeightsFile(weights);
    if (!file.ok()) {
      std::cerr << "--weights: " << file.status().ToString() << "\n";
      return 2;
    }
    auto m = engine::LoadModel(*file, ec.model);
    if (!m.ok()) {
      std::cerr << m.status().ToString() << "\n";
      return 1;
    }
    model = *m;
  }
  auto eng = engine::Engine::Create(ec, load_via_update ? nullptr : model);
  if (eng.ok() && load_via_update && model) {
    Status s = (*eng)->UpdateWeights(1, model->NamedWeights(), Deadline::InMs(30000));
    if (!s.ok()) {
      std::cerr << s.ToString() << "\n";
      return 1;
    }
  }
  if (!eng.ok()) {
    std::cerr << eng.status().ToString() << "\n";
    return 1;
  }
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::atomic<int64_t> tokens{0}, groups{0};
  const int max_in_flight = static_cast<int>(job->rollout_settings.max_groups_in_flight);
  const double cpu0 = ProcessCpuSeconds();
  const engine::EngineStats e0 = (*eng)->stats();
  auto t0 = std::chrono::steady_clock::now();
  auto end = t0 + std::chrono::duration<double>(seconds);
  // --weight-updates-per-s: copies of the same weights (a fresh buffer each, as a receiver
  // hands over) applied from another thread at that rate, to see what updates cost the engine.
  std::atomic<bool> updater_stop{false};
  std::thread updater;
  if (updates_per_s > 0 && model) {
    updater = std::thread([&] {
      engine::NamedTensors w = model->NamedWeights();
      uint64_t v = 1;
      while (!updater_stop) {
        std::this_thread::sleep_for(std::chrono::duration<double>(1.0 / updates_per_s));
        engine::NamedTensors copy;
        for (const auto& [name, t] : w) copy.emplace_back(name, t.clone());
        if (!(*eng)->UpdateWeights(v++, copy, Deadline::InMs(10000)).ok()) return;
      }
    });
  }
  uint64_t serial = 0;
  auto next_wave = t0;
  while (std::chrono::steady_clock::now() < end) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_until(l, end, [&] { return waves ? in_flight == 0 : in_flight < max_in_flight; });
    if (waves && (wave_gap_ms > 0 || wave_period_ms > 0)) {
      l.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(wave_gap_ms));
      if (next_wave < end)
        std::this_thread::sleep_until(next_wave);
      else
        std::this_thread::sleep_until(end);
      next_wave = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double, std::milli>(wave_period_ms));
      l.lock();
    }
    while (in_flight < max_in_flight && std::chrono::steady_clock::now() < end) {
      envs::TaskPrompt tp = prompts->Next();
      auto ids = renderer.RenderPrompt(tp.prompt.messages);
      if (!ids.ok()) return 1;
      engine::GenerateRequest req;
      req.prompt = *ids;
      req.sampling.temperature = job->sampling.temperature;
      req.sampling.top_k = job->sampling.top_k;
      req.sampling.top_p = job->sampling.top_p;
      req.sampling.max_new_tokens = job->sampling.max_new_tokens;
      req.sampling.stop_token_ids = {(*tok)->eos_id()};
      req.sampling.num_samples = static_cast<int32_t>(job->batch.samples_per_prompt);
      req.sampling.seed = serial++;
      ++in_flight;
      Status s = (*eng)->Submit(std::move(req), [&](std::vector<engine::GenerationResult> res) {
        int64_t n = 0;
        for (auto& r : res) n += r.num_new_tokens;
        tokens += n;
        ++groups;
        std::lock_guard<std::mutex> g(mu);
        --in_flight;
        cv.notify_all();
      });
      if (!s.ok()) return 1;
    }
  }
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  updater_stop = true;
  if (updater.joinable()) updater.join();
  nlohmann::json j;
  j["bench"] = "standalone_rollout";
  j["seconds"] = elapsed;
  j["groups"] = groups.load();
  j["tokens"] = tokens.load();
  j["tokens_per_s"] = tokens.load() / elapsed;
  const double cpu = ProcessCpuSeconds() - cpu0;
  j["cpu_s"] = cpu;
  j["tokens_per_cpu_s"] = tokens.load() / cpu;
  const engine::EngineStats es = (*eng)->stats();
  j["engine_step_cpu_s"] = es.step_cpu_seconds - e0.step_cpu_seconds;
  j["engine_decode_steps"] = es.decode_steps - e0.decode_steps;
  j["engine_prefill_steps"] = es.prefill_steps - e0.prefill_steps;
  j["engine_tokens"] = es.generated_tokens - e0.generated_tokens;
  std::cout << j.dump() << std::endl;
  return 0;
}
