#include "troupe/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string_view>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <time.h>

#include "sampler.h"
#include "troupe/core/check.h"
#include "troupe/core/cpu_time.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_name.h"
#include "troupe/engine/logprob.h"

namespace troupe::engine {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kRejected:
      return "rejected";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "unknown";
}

GenerateRequest ContinueRequest(const GenerationResult& previous,
                                const std::vector<int32_t>& env_tokens,
                                const SamplingParams& sampling) {
  GenerateRequest r;
  r.prompt = previous.prompt_ids;
  r.response_prefix = previous.response_ids;
  r.response_prefix_mask = previous.mask;
  r.response_prefix_logprobs = previous.logprobs;
  r.response_prefix_versions = previous.token_versions;
  // Keep the parallel arrays aligned even if the previous result was built by hand.
  r.response_prefix_mask.resize(r.response_prefix.size(), 0);
  r.response_prefix_logprobs.resize(r.response_prefix.size(), 0.f);
  r.response_prefix_versions.resize(r.response_prefix.size(), 0);
  for (int32_t t : env_tokens) {
    r.response_prefix.push_back(t);
    r.response_prefix_mask.push_back(0);
    r.response_prefix_logprobs.push_back(0.f);
    r.response_prefix_versions.push_back(0);
  }
  r.sampling = sampling;
  r.tag = previous.tag;
  return r;
}

Status CheckNoRejections(const std::vector<GenerationResult>& results) {
  for (const GenerationResult& r : results) {
    if (r.finish_reason == FinishReason::kRejected || r.finish_reason == FinishReason::kAborted)
      return InvalidArgument("request {} (tag {}) {}: {}", r.request_index, r.tag,
                             FinishReasonName(r.finish_reason), r.reject_reason);
  }
  return Status::Ok();
}

PaddedResults PadResults(const std::vector<GenerationResult>& results, int32_t pad_id) {
  const int64_t n = static_cast<int64_t>(results.size());
  int64_t pmax = 0, rmax = 0;
  for (const auto& r : results) {
    pmax = std::max<int64_t>(pmax, static_cast<int64_t>(r.prompt_ids.size()));
    rmax = std::max<int64_t>(rmax, static_cast<int64_t>(r.response_ids.size()));
  }
  PaddedResults out;
  out.prompt_ids = at::full({n, pmax}, pad_id, at::kLong);
  out.prompt_lengths = at::zeros({n}, at::kLong);
  out.response_ids = at::full({n, rmax}, pad_id, at::kLong);
  out.response_lengths = at::zeros({n}, at::kLong);
  out.logprobs = at::zeros({n, rmax}, at::kFloat);
  out.mask = at::zeros({n, rmax}, at::kBool);
  int64_t* pp = out.prompt_ids.data_ptr<int64_t>();
  int64_t* rp = out.response_ids.data_ptr<int64_t>();
  float* lp = out.logprobs.data_ptr<float>();
  bool* mp = out.mask.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    const GenerationResult& r = results[static_cast<size_t>(i)];
    out.prompt_lengths.data_ptr<int64_t>()[i] = static_cast<int64_t>(r.prompt_ids.size());
    out.response_lengths.data_ptr<int64_t>()[i] = static_cast<int64_t>(r.response_ids.size());
    for (size_t t = 0; t < r.prompt_ids.size(); ++t)
      pp[i * pmax + static_cast<int64_t>(t)] = r.prompt_ids[t];
    for (size_t t = 0; t < r.response_ids.size(); ++t) {
      const int64_t k = i * rmax + static_cast<int64_t>(t);
      rp[k] = r.response_ids[t];
      const bool m = t < r.mask.size() && r.mask[t] != 0;
      mp[k] = m;
      lp[k] = m && t < r.logprobs.size() ? r.logprobs[t] : 0.f;
    }
  }
  return out;
}

// ------------------------------------------------------------------ internal state

// Completion state of one Generate() call or one Submit().
struct Engine::Batch {
  std::vector<GenerationResult> results;
  size_t remaining = 0;  // samples not yet finished (engine thread)
  Callback done;         // Submit only
  bool pinned = false;   // Generate: holds a version pin until finished
  std::atomic<bool> cancelled{false};
  // Written by the engine thread before `finished` is set under mu_.
  Status abort_status;
  bool finished = false;  // guarded by Engine::mu_
};

// One request of a batch.
struct Engine::Work {
  GenerateRequest req;
  std::shared_ptr<Batch> batch;
  size_t offset = 0;  // index of sample 0 in batch->results
  int32_t admitted = 0;
  bool checked = false;
  uint64_t first_version = 0;  // step_version at its first admission (valid once admitted > 0)
  uint64_t submit_version = 0;  // the engine's version when it was queued (min_version rollback)
};

bool Engine::Startable(const Work& w, uint64_t version) {
  return w.admitted > 0 || w.req.min_version <= version || version < w.submit_version;
}

bool Engine::CancelRequested(const Work& w) {
  return w.batch->cancelled || (w.req.cancel && w.req.cancel->load(std::memory_order_relaxed));
}

// One sample occupying a KV slot.
struct Engine::Seq {
  std::shared_ptr<Work> work;
  GenerationResult* out = nullptr;
  Rng rng;
  int32_t slot = 0;
  int32_t pos = 0;         // position of next_token in the sequence
  int32_t next_token = 0;  // last sampled token, fed at the next decode step
  int32_t new_tokens = 0;
  float temperature = 1.f;  // EffectiveTemperature of the request
  bool started = false;     // has sampled its first token (next_token is valid)
  bool ghost = false;       // finished, kept computing PAD rows (Batching::kStaticPadded)
};

// Engine-thread state: never touched by other threads.
class Engine::Loop {
 public:
  Loop(const EngineConfig& config, LlamaModel& model, torch::Device device)
      : config(config),
        model(model),
        device(device),
        cache(config.model, config.num_slots, config.CacheLen(), device),
        slots(static_cast<size_t>(config.num_slots)),
        tokens(at::zeros({config.num_slots}, at::kLong)),
        positions(at::zeros({config.num_slots}, at::kLong)),
        temps(at::ones({config.num_slots, 1}, at::kFloat)),
        packed(config.fused_cpu_kernels && device.is_cpu()) {}

  const EngineConfig& config;
  LlamaModel& model;
  torch::Device device;
  KvCache cache;
  std::vector<std::unique_ptr<Seq>> slots;  // null = free
  std::deque<std::shared_ptr<Work>> pending;
  at::Tensor tokens, positions, temps;  // CPU staging buffers, [num_slots]
  const bool packed;                    // CPU fused path: LlamaModel::Step for everything
  SampleScratch scratch;  // SampleRow's buffers
  std::vector<std::shared_ptr<Batch>> completed;  // finished during this iteration
  int active = 0;  // slots holding a running sequence (ghosts excluded)
  int ghosts = 0;  // Batching::kStaticPadded: finished rows still computed
  uint64_t step_version = 0;
  // Counters since the last flush into Engine::stats_.
  EngineStats delta;

  // Newly admitted prompt rows: one per (request, admission) with the slots of its samples.
  struct Chunk {
    std::shared_ptr<Work> work;
    std::vector<int32_t> slots;
    int32_t len;
  };

  // One iteration of the engine thread (between two waits for work).
  void Step();
  void CompleteOne(Work& w);
  // Whether `w` was cancelled, by its Generate() giving up (deadline) or by the caller of its
  // Submit() (GenerateRequest::cancel); the batch's abort status then says which (first wins).
  static bool IsCancelled(Work& w);
  // Whether `w` (admitted) has a staleness cut-off that this step's weights passed; `why`
  // then says so.
  bool IsStale(const Work& w, std::string* why) const;
  void EndUnadmitted(Work& w, FinishReason reason, const std::string& why);
  void FreeSlot(Seq& s, FinishReason reason, std::string why);
  void ClearGhosts();
  void AbortAll(const Status& why, bool include_pending);
  void TakeToken(Seq& s, const float* logp_row);
  std::vector<Chunk> Admit();
  static at::Tensor PromptCopies(const std::vector<Chunk>& chunks);
  void SharePrefill(const std::vector<Chunk>& chunks);
  void PackedStep(const std::vector<Chunk>& chunks);
  void Prefill(const std::vector<Chunk>& chunks);
  void Decode();
  void Publish(Engine& e);
};

namespace {

auto& Log() {
  return log::Get("engine");
}

// Why a request cannot run, or "" if it can.
std::string CheckRequest(const GenerateRequest& r, const EngineConfig& c) {
  Status st = r.sampling.Validate();
  if (!st.ok()) return st.message();
  if (r.prompt.empty()) return "empty prompt";
  const size_t np = r.response_prefix.size();
  if (!r.response_prefix_mask.empty() && r.response_prefix_mask.size() != np)
    return fmt::format("response_prefix_mask has {} entries for {} prefix tokens",
                       r.response_prefix_mask.size(), np);
  if (!r.response_prefix_logprobs.empty() && r.response_prefix_logprobs.size() != np)
    return fmt::format("response_prefix_logprobs has {} entries for {} prefix tokens",
                       r.response_prefix_logprobs.size(), np);
  if (!r.response_prefix_versions.empty() && r.response_prefix_versions.size() != np)
    return fmt::format("response_prefix_versions has {} entries for {} prefix tokens",
                       r.response_prefix_versions.size(), np);
  const int64_t vocab = c.model.vocab_size;
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
      return fmt::format("prompt token {} at position {} is outside the vocabulary [0, {})",
                         r.prompt[i], i, vocab);
  for (size_t i = 0; i < np; ++i)
    if (r.response_prefix[i] < 0 || r.response_prefix[i] >= vocab)
      return fmt::format(
          "response_prefix token {} at position {} is outside the vocabulary [0, {})",
          r.response_prefix[i], i, vocab);
  for (int32_t s : r.sampling.stop_token_ids)
    if (s >= vocab)
      return fmt::format("stop token id {} is outside the vocabulary [0, {})", s, vocab);
  const size_t ctx = r.prompt.size() + np;
  if (ctx >= static_cast<size_t>(c.CacheLen())) {
    if (np == 0)
      return fmt::format(
          "prompt of {} tokens does not fit: the KV cache holds {} positions per sequence "
          "(max_seq_len), leaving no room for a new token",
          r.prompt.size(), c.CacheLen());
    return fmt::format(
        "context of {} tokens ({} prompt + {} response prefix) does not fit: the KV cache holds "
        "{} positions per sequence (max_seq_len), leaving no room for a new token",
        ctx, r.prompt.size(), np, c.CacheLen());
  }
  return "";
}

// Restores the module's train/eval mode on scope exit.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(torch::nn::Module& m) : m_(m), was_training_(m.is_training()) {
    if (was_training_) m_.eval();
  }
  ~EvalModeGuard() {
    if (was_training_) m_.train(true);
  }

 private:
  torch::nn::Module& m_;
  bool was_training_;
};

}  // namespace

bool SetComputeThreads(int n) {
  at::set_num_threads(n);
  using SetFn = void (*)(int);
  // Looked up once: the learner calls this every update when it splits updates across threads.
  static const SetFn fn =
      reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn == nullptr) return false;
  fn(n);
  return true;
}

// ------------------------------------------------------------------ Engine

Engine::Engine(const EngineConfig& config) : config_(config) {}

Result<torch::Device> UsableDevice(std::string_view key, const std::string& device) {
  torch::Device dev(torch::kCPU);
  try {
    dev = torch::Device(device);
  } catch (const std::exception& e) {
    return InvalidArgument("{} '{}': {}", key, device, e.what());
  }
  if (dev.is_cpu()) return dev;
  try {
    at::empty({1}, at::TensorOptions().device(dev));
  } catch (const std::exception& e) {
    std::string why = e.what();  // torch's first sentence; the rest is its advice
    const size_t sentence = why.find(". ");
    why =
        why.substr(0, std::min(why.find('\n'), sentence == std::string::npos ? 300 : sentence + 1));
    return Unavailable("{} '{}' is not usable here: {}", key, device, why);
  }
  return dev;
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                               std::shared_ptr<LlamaModel> model) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  TROUPE_ASSIGN_OR_RETURN(const torch::Device device, UsableDevice("engine.device", config.device));
  if (model) {
    const ModelConfig& a = model->config();
    const ModelConfig& b = config.model;
    if (a.ToString() != b.ToString())
      return InvalidArgument("the given model ({}) does not match engine.model ({})", a.ToString(),
                             b.ToString());
    if (model->device() != device)
      return InvalidArgument("the given model is on {}, engine.device is {}", model->device().str(),
                             device.str());
  } else {
    model = std::make_shared<LlamaModel>(config.model, config.init_seed, device);
  }
  if (config.lora_merged) model->SetMerged(true);
  std::unique_ptr<Engine> e(new Engine(config));
  e->model_ = std::move(model);
  try {
    e->loop_ = std::make_unique<Loop>(e->config_, *e->model_, device);
  } catch (const std::exception& ex) {
    return ResourceExhausted("cannot allocate the KV cache ({} slots x {} positions): {}",
                             config.num_slots, config.CacheLen(),
                             std::string(ex.what()).substr(0, 300));
  }
  Log().info("{} on {}, {} slots x {} positions, KV cache {:.1f} MiB", config.model.ToString(),
             device.str(), config.num_slots, config.CacheLen(),
             static_cast<double>(e->loop_->cache.bytes()) / (1 << 20));
  e->thread_ = std::thread([raw = e.get()] {
    SetThreadName("engine");
    raw->ThreadMain();
  });
  return e;
}

Engine::~Engine() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Engine::version() const {
  MutexLock l(mu_);
  return version_;
}

EngineStats Engine::stats() const {
  MutexLock l(mu_);
  return stats_;
}

Status Engine::Enqueue(std::vector<std::shared_ptr<Work>> works) {
  if (stop_) return Unavailable("engine is stopping");
  stats_.requests += works.size();
  bool wake = false;
  for (auto& w : works) {
    w->submit_version = version_;
    wake = wake || Startable(*w, version_);
    queue_.push_back(std::move(w));
  }
  // Requests waiting for newer weights leave a sleeping engine asleep: the update wakes it.
  if (wake) cv_.notify_all();
  return Status::Ok();
}

Status Engine::Submit(GenerateRequest request, Callback done) {
  auto batch = std::make_shared<Batch>();
  const size_t n = static_cast<size_t>(std::max<int32_t>(1, request.sampling.num_samples));
  batch->results.resize(n);
  batch->remaining = n;
  batch->done = std::move(done);
  auto work = std::make_shared<Work>();
  work->req = std::move(request);
  work->batch = batch;
  MutexLock l(mu_);
  return Enqueue({std::move(work)});
}

Result<std::vector<GenerationResult>> Engine::Generate(const std::vector<GenerateRequest>& requests,
                                                       Deadline deadline) {
  if (requests.empty()) return std::vector<GenerationResult>{};
  auto batch = std::make_shared<Batch>();
  batch->pinned = true;
  std::vector<std::shared_ptr<Work>> works;
  size_t total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto w = std::make_shared<Work>();
    w->req = requests[i];
    w->batch = batch;
    w->offset = total;
    total += static_cast<size_t>(std::max<int32_t>(1, requests[i].sampling.num_samples));
    works.push_back(std::move(w));
  }
  batch->results.resize(total);
  for (const auto& w : works)
    for (int32_t s = 0; s < std::max<int32_t>(1, w->req.sampling.num_samples); ++s)
      batch->results[w->offset + static_cast<size_t>(s)].request_index =
          static_cast<size_t>(&w - works.data());
  batch->remaining = total;

  MutexLock l(mu_);
  // Pin the version: wait while an update is waiting or running (updates go first).
  bool ok = cv_.wait_until(l, deadline.at(), [&]() TROUPE_REQUIRES(mu_) {
    return stop_ || (updates_waiting_ == 0 && !update_running_);
  });
  if (!ok) return Timeout("generate: deadline passed while a weight update was pending");
  ++pins_;
  Status st = Enqueue(std::move(works));
  if (!st.ok()) {
    --pins_;
    cv_.notify_all();
    return st;
  }
  ok = cv_.wait_until(l, deadline.at(), [&]() TROUPE_REQUIRES(mu_) { return batch->finished; });
  if (!ok) {
    batch->cancelled = true;  // the engine drops the rest at its next step and unpins
    cv_.notify_all();
    return Timeout("generate: {} requests ({} sequences) did not finish before the deadline",
                   requests.size(), total);
  }
  if (!batch->abort_status.ok()) return batch->abort_status;
  return std::move(batch->results);
}

Status Engine::BeginUpdate(uint64_t version, Deadline deadline, bool allow_rollback) {
  MutexLock l(mu_);
  if (version < version_ && !allow_rollback)
    return InvalidArgument("weight update to version {} is older than the engine's version {}",
                           version, version_);
  ++updates_waiting_;
  cv_.notify_all();
  bool ok = cv_.wait_until(l, deadline.at(), [&]() TROUPE_REQUIRES(mu_) {
    return stop_ || (pins_ == 0 && !step_running_ && !update_running_);
  });
  --updates_waiting_;
  if (!ok || stop_) {
    cv_.notify_all();
    if (stop_) return Unavailable("engine is stopping");
    return Timeout(
        "weight update to version {} waited past its deadline for generation "
        "({} pinned batches in flight)",
        version, pins_);
  }
  update_running_ = true;
  return Status::Ok();
}

void Engine::EndUpdate(uint64_t version, bool ok) {
  {
    MutexLock l(mu_);
    update_running_ = false;
    if (ok) {
      version_ = version;
      ++stats_.weight_updates;
    }
  }
  cv_.notify_all();
}

struct Engine::QueuedUpdate {
  uint64_t version = 0;
  bool allow_rollback = false;
  const NamedTensors* named = nullptr;
  bool started = false, done = false;
  Status status;
};

Status Engine::UpdateWeights(uint64_t version, const NamedTensors& named, Deadline deadline,
                             bool allow_rollback) {
  QueuedUpdate u;
  u.version = version;
  u.allow_rollback = allow_rollback;
  u.named = &named;
  MutexLock l(mu_);
  if (stop_ || thread_exited_) return Unavailable("engine is stopping");
  if (version < version_ && !allow_rollback)
    return InvalidArgument("weight update to version {} is older than the engine's version {}",
                           version, version_);
  update_queue_.push_back(&u);
  ++updates_waiting_;
  // A busy engine thread finds the update at its next step boundary by itself: only a
  // sleeping one needs waking (each wake-up is a cross-core interrupt on 2 shared cores).
  if (engine_sleeping_) cv_.notify_all();
  const bool in_time = cv_.wait_until(
      l, deadline.at(), [&]() TROUPE_REQUIRES(mu_) { return u.done || thread_exited_; });
  if (!in_time && !u.started) {
    update_queue_.erase(std::find(update_queue_.begin(), update_queue_.end(), &u));
    --updates_waiting_;
    cv_.notify_all();
    return Timeout(
        "weight update to version {} waited past its deadline for generation "
        "({} pinned batches in flight)",
        version, pins_);
  }
  // Started: the copy is bounded, `named` must outlive it. A stopped engine thread never
  // starts one (it leaves the queue to this wait).
  while (!u.done && !thread_exited_) {
    cv_.wait_until(l, Deadline::InMs(1000).at(),
                   [&]() TROUPE_REQUIRES(mu_) { return u.done || thread_exited_; });
  }
  if (!u.done) {
    auto it = std::find(update_queue_.begin(), update_queue_.end(), &u);
    if (it != update_queue_.end()) {
      update_queue_.erase(it);
      --updates_waiting_;
    }
    return Unavailable("engine stopped before applying the weight update to version {}", version);
  }
  if (u.status.ok()) Log().debug("weights updated to version {}", version);
  return u.status;
}

// On the engine thread, between steps, without mu_: copies a queued update into the model.
Status Engine::LoadUpdate(const QueuedUpdate& u) {
  try {
    // A LoRA engine never keeps generating with stale adapters: every update carries them.
    LoadOptions opts;
    opts.require_adapters = config_.model.lora.enabled();
    return model_->LoadNamed(*u.named, opts);
  } catch (const std::exception& e) {
    return Internal("weight update to version {} failed: {}", u.version, e.what());
  }
}

// With mu_ held: records what became of a queued update and wakes its caller.
void Engine::FinishUpdate(QueuedUpdate& u, Status st) {
  if (st.ok()) {
    version_ = u.version;
    ++stats_.weight_updates;
  }
  u.status = std::move(st);
  u.done = true;
  --updates_waiting_;
  cv_.notify_all();
}

Status Engine::UpdateWeightsInPlace(uint64_t version,
                                    const std::function<Status(const NamedTensors& weights)>& fill,
                                    Deadline deadline) {
  TROUPE_RETURN_IF_ERROR(BeginUpdate(version, deadline, false));
  Status st;
  try {
    torch::NoGradGuard no_grad;
    st = fill(model_->NamedWeights());
  } catch (const std::exception& e) {
    st = Internal("in-place weight update to version {} failed: {}", version, e.what());
  }
  EndUpdate(version, st.ok());
  return st;
}

// ------------------------------------------------------------------ the engine thread

namespace {

void FinishSeqResult(GenerationResult& out, FinishReason reason, std::string why = {}) {
  out.finish_reason = reason;
  out.reject_reason = std::move(why);
}

// Token i of a request's context: its prompt, then its response prefix.
int32_t ContextToken(const GenerateRequest& req, size_t i) {
  return i < req.prompt.size() ? req.prompt[i] : req.response_prefix[i - req.prompt.size()];
}

}  // namespace

bool Engine::Loop::IsCancelled(Work& w) {
  const bool deadline = w.batch->cancelled;
  if (!deadline && !(w.req.cancel && w.req.cancel->load(std::memory_order_relaxed))) return false;
  if (w.batch->abort_status.ok())
    w.batch->abort_status =
        Cancelled("generation cancelled ({})", deadline ? "deadline passed" : "by the caller");
  return true;
}

namespace {
constexpr std::string_view kStalePrefix = "stale: ";
}  // namespace

bool CutShortAsStale(const GenerationResult& r) {
  return r.finish_reason == FinishReason::kAborted &&
         std::string_view(r.reject_reason).substr(0, kStalePrefix.size()) == kStalePrefix;
}

bool Engine::Loop::IsStale(const Work& w, std::string* why) const {
  if (!w.req.abort_beyond_lag || w.admitted == 0) return false;
  const uint64_t lag = *w.req.abort_beyond_lag;
  if (step_version <= w.first_version || step_version - w.first_version <= lag) return false;
  *why = fmt::format(
      "{}the weights (version {}) are {} versions newer than the request's (version {}), "
      "beyond its lag limit of {}",
      kStalePrefix, step_version, step_version - w.first_version, w.first_version, lag);
  return true;
}

// Marks one sample done; completes its batch when it was the last.
void Engine::Loop::CompleteOne(Work& w) {
  Batch& b = *w.batch;
  TROUPE_CHECK_GT(b.remaining, 0u);
  if (--b.remaining == 0) completed.push_back(w.batch);
}

// Ends every not-yet-admitted sample of `w` with `reason`.
void Engine::Loop::EndUnadmitted(Work& w, FinishReason reason, const std::string& why) {
  const int32_t n = std::max<int32_t>(1, w.req.sampling.num_samples);
  for (int32_t s = w.admitted; s < n; ++s) {
    GenerationResult& out = w.batch->results[w.offset + static_cast<size_t>(s)];
    out.tag = w.req.tag;
    out.sample_index = s;
    out.prompt_ids = w.req.prompt;
    FinishSeqResult(out, reason, why);
    CompleteOne(w);
  }
  w.admitted = n;
}

// Ends a running sample with `reason` and frees its slot (kStaticPadded: it stays a ghost).
void Engine::Loop::FreeSlot(Seq& s, FinishReason reason, std::string why) {
  FinishSeqResult(*s.out, reason, std::move(why));
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) ++delta.sequences;
  std::shared_ptr<Work> w = std::move(s.work);  // outlives s
  --active;
  if (config.batching == Batching::kStaticPadded && reason != FinishReason::kAborted) {
    s.ghost = true;  // keeps its slot and its compute until the wave ends
    s.out = nullptr;
    ++ghosts;
  } else {
    slots[static_cast<size_t>(s.slot)].reset();  // destroys s
  }
  CompleteOne(*w);
}

// Frees the slots of finished samples kept computing until the end of a wave.
void Engine::Loop::ClearGhosts() {
  for (auto& slot : slots)
    if (slot && slot->ghost) slot.reset();
  ghosts = 0;
}

// Aborts everything (engine stopping or a failed step).
void Engine::Loop::AbortAll(const Status& why, bool include_pending) {
  ClearGhosts();
  for (auto& slot : slots)
    if (slot) {
      if (slot->work->batch->abort_status.ok()) slot->work->batch->abort_status = why;
      FreeSlot(*slot, FinishReason::kAborted, why.message());
    }
  if (include_pending) {
    for (auto& w : pending) {
      if (w->batch->abort_status.ok()) w->batch->abort_status = why;
      EndUnadmitted(*w, FinishReason::kAborted, why.message());
    }
    pending.clear();
  }
}

// Records one sampled token and decides whether the sequence ends.
void Engine::Loop::TakeToken(Seq& s, const float* logp_row) {
  const SamplingParams& sp = s.work->req.sampling;
  const int32_t tok = SampleRow(logp_row, config.model.vocab_size, sp, s.rng, scratch);
  const float lp = logp_row[tok];
  GenerationResult& out = *s.out;
  out.response_ids.push_back(tok);
  out.logprobs.push_back(lp);
  out.mask.push_back(1);
  out.token_versions.push_back(step_version);
  ++out.num_new_tokens;
  ++s.new_tokens;
  ++delta.generated_tokens;
  if (s.work->req.on_token) s.work->req.on_token(out.sample_index, tok, lp);
  if (!std::isfinite(lp)) {
    FreeSlot(s, FinishReason::kAborted,
             fmt::format("non-finite log-prob {} for sampled token {} (broken weights?)", lp, tok));
    return;
  }
  const auto& stops = sp.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    FreeSlot(s, FinishReason::kStop, {});
    return;
  }
  const int32_t total = s.pos + 1;  // context + new tokens so far
  if (s.new_tokens >= sp.max_new_tokens || total >= config.CacheLen()) {
    FreeSlot(s, FinishReason::kLength, {});
    return;
  }
  s.next_token = tok;
  s.started = true;
}

// Admits pending requests into free slots (lowest first), within the prefill budget.
std::vector<Engine::Loop::Chunk> Engine::Loop::Admit() {
  std::vector<Chunk> chunks;
  if (config.batching != Batching::kContinuous) {
    if (active > 0) return chunks;  // the wave is still running
    ClearGhosts();
  }
  int64_t budget_rows = 0;  // rows x padded length (generic path) or total tokens (packed)
  int32_t max_len = 0;
  int32_t next_free = 0;
  auto find_free = [&]() {
    while (next_free < config.num_slots && slots[static_cast<size_t>(next_free)]) ++next_free;
    return next_free < config.num_slots ? next_free : -1;
  };
  // In arrival order; a request waiting for newer weights (min_version) is passed over.
  size_t i = 0;
  while (i < pending.size() && find_free() >= 0) {
    std::shared_ptr<Work> w = pending[i];
    const int32_t n = std::max<int32_t>(1, w->req.sampling.num_samples);
    const auto drop = [&] { pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i)); };
    if (IsCancelled(*w)) {
      EndUnadmitted(*w, FinishReason::kAborted, "cancelled");
      drop();
      continue;
    }
    std::string stale;
    if (IsStale(*w, &stale)) {  // partly admitted when its version was current
      delta.stale_aborted += static_cast<uint64_t>(n - w->admitted);
      EndUnadmitted(*w, FinishReason::kAborted, stale);
      drop();
      continue;
    }
    if (!Startable(*w, step_version)) {
      ++i;
      continue;
    }
    if (!w->checked) {
      w->checked = true;
      std::string why = CheckRequest(w->req, config);
      if (!why.empty()) {
        ++delta.rejected;
        EndUnadmitted(*w, FinishReason::kRejected, why);
        drop();
        continue;
      }
    }
    const int32_t len = static_cast<int32_t>(w->req.prompt.size() + w->req.response_prefix.size());
    const int64_t cost = packed ? budget_rows + len
                                : static_cast<int64_t>(chunks.size() + 1) * std::max(max_len, len);
    if (!chunks.empty() && cost > config.max_prefill_tokens) break;
    Chunk chunk{w, {}, len};
    if (w->admitted == 0) w->first_version = step_version;
    int32_t slot;
    while (w->admitted < n && (slot = find_free()) >= 0) {
      chunk.slots.push_back(slot);
      auto seq = std::make_unique<Seq>();
      seq->work = w;
      seq->slot = slot;
      seq->pos = len;
      seq->temperature = static_cast<float>(EffectiveTemperature(w->req.sampling.temperature));
      seq->rng = Rng(w->req.sampling.seed, static_cast<uint64_t>(w->admitted));
      GenerationResult& out = w->batch->results[w->offset + static_cast<size_t>(w->admitted)];
      out.tag = w->req.tag;
      out.sample_index = w->admitted;
      out.prompt_ids = w->req.prompt;
      out.response_ids = w->req.response_prefix;
      const size_t np = w->req.response_prefix.size();
      out.mask = w->req.response_prefix_mask;
      out.mask.resize(np, 0);
      out.logprobs = w->req.response_prefix_logprobs;
      out.logprobs.resize(np, 0.f);
      out.token_versions = w->req.response_prefix_versions;
      out.token_versions.resize(np, 0);
      out.policy_version = step_version;
      seq->out = &out;
      slots[static_cast<size_t>(slot)] = std::move(seq);
      ++active;
      ++w->admitted;
    }
    budget_rows = cost;
    max_len = std::max(max_len, len);
    delta.prefill_tokens += static_cast<uint64_t>(len);
    chunks.push_back(std::move(chunk));
    if (w->admitted == n)
      drop();
    else
      ++i;
  }
  return chunks;
}

// Group sampling: copy each chunk's prompt keys/values to the slots of its other samples.
// Rows (source slot, destination slot, length): each new prompt's cache rows, from the slot
// its forward wrote to the other samples' slots (int64 [C, 3], CPU).
at::Tensor Engine::Loop::PromptCopies(const std::vector<Chunk>& chunks) {
  int64_t n = 0;
  for (const Chunk& c : chunks) n += static_cast<int64_t>(c.slots.size()) - 1;
  at::Tensor copies = at::empty({n, 3}, at::kLong);
  int64_t* cp = copies.data_ptr<int64_t>();
  for (const Chunk& c : chunks)
    for (size_t j = 1; j < c.slots.size(); ++j) {
      *cp++ = c.slots[0];
      *cp++ = c.slots[j];
      *cp++ = c.len;
    }
  return copies;
}

void Engine::Loop::SharePrefill(const std::vector<Chunk>& chunks) {
  at::Tensor copies = PromptCopies(chunks);
  if (copies.size(0) == 0) return;
  const int64_t len = copies.select(1, 2).max().item<int64_t>();
  cache.CopySlots(copies.select(1, 0).contiguous().to(device),
                  copies.select(1, 1).contiguous().to(device), len);
}

// CPU: one packed forward for every running sequence's next token and every new prompt.
void Engine::Loop::PackedStep(const std::vector<Chunk>& chunks) {
  std::vector<Seq*> running;
  for (auto& slot : slots)
    if (slot && slot->started && (!slot->ghost || slot->pos < config.CacheLen()))
      running.push_back(slot.get());
  int64_t n = static_cast<int64_t>(running.size());
  for (const Chunk& c : chunks) n += c.len;
  if (n == 0) return;
  const int64_t m = static_cast<int64_t>(running.size() + chunks.size());
  at::Tensor toks = at::empty({n}, at::kLong), slot_ids = at::empty({n}, at::kLong);
  at::Tensor pos = at::empty({n}, at::kLong), rows = at::empty({m}, at::kLong);
  at::Tensor row_temps = at::empty({m, 1}, at::kFloat);
  // The other samples of each new prompt get its cache rows inside the step, layer by layer
  // while they are in cache (PackedAttention's copies), not by SharePrefill after it.
  at::Tensor copies = PromptCopies(chunks);
  int64_t *tp = toks.data_ptr<int64_t>(), *sp = slot_ids.data_ptr<int64_t>();
  int64_t *pp = pos.data_ptr<int64_t>(), *rp = rows.data_ptr<int64_t>();
  float* temp_p = row_temps.data_ptr<float>();
  int64_t r = 0, k = 0;
  for (Seq* s : running) {
    tp[r] = s->ghost ? 0 : s->next_token;
    sp[r] = s->slot;
    pp[r] = s->pos;
    temp_p[k] = s->temperature;
    rp[k++] = r++;
  }
  for (const Chunk& c : chunks) {
    for (int32_t i = 0; i < c.len; ++i) {
      tp[r] = ContextToken(c.work->req, static_cast<size_t>(i));
      sp[r] = c.slots[0];
      pp[r++] = i;
    }
    temp_p[k] = static_cast<float>(EffectiveTemperature(c.work->req.sampling.temperature));
    rp[k++] = r - 1;
  }
  at::Tensor logits = model.Step(toks, slot_ids, pos, rows, cache, copies);
  at::Tensor logp = ScaledLogSoftmax(logits, row_temps).contiguous();
  if (!running.empty()) ++delta.decode_steps;
  if (!chunks.empty()) ++delta.prefill_steps;
  const int64_t V = config.model.vocab_size;
  const float* lp = logp.data_ptr<float>();
  k = 0;
  for (Seq* s : running) {
    ++s->pos;  // next_token is now in the cache at its position
    if (s->ghost) {
      ++k;
      continue;
    }
    TakeToken(*s, lp + (k++) * V);
  }
  for (const Chunk& c : chunks) {
    for (int32_t slot : c.slots) TakeToken(*slots[static_cast<size_t>(slot)], lp + k * V);
    ++k;
  }
}

// Any device: a padded batched prefill of the new prompts, then one decode step.
void Engine::Loop::Prefill(const std::vector<Chunk>& chunks) {
  if (chunks.empty()) return;
  const int64_t P = static_cast<int64_t>(chunks.size());
  int32_t max_len = 0;
  for (const Chunk& c : chunks) max_len = std::max(max_len, c.len);
  at::Tensor ids = at::zeros({P, max_len}, at::kLong);
  at::Tensor lengths = at::empty({P}, at::kLong);
  at::Tensor first_slots = at::empty({P}, at::kLong);
  at::Tensor row_temps = at::empty({P, 1}, at::kFloat);
  int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < P; ++r) {
    const Chunk& c = chunks[static_cast<size_t>(r)];
    for (int32_t i = 0; i < c.len; ++i)
      idp[r * max_len + i] = ContextToken(c.work->req, static_cast<size_t>(i));
    lengths.data_ptr<int64_t>()[r] = c.len;
    first_slots.data_ptr<int64_t>()[r] = c.slots[0];
    row_temps.data_ptr<float>()[r] =
        static_cast<float>(EffectiveTemperature(c.work->req.sampling.temperature));
  }
  at::Tensor logits =
      model.Prefill(ids.to(device), lengths.to(device), first_slots.to(device), cache);
  SharePrefill(chunks);
  at::Tensor logp = ScaledLogSoftmax(logits, row_temps.to(device)).to(at::kCPU).contiguous();
  ++delta.prefill_steps;
  const int64_t V = config.model.vocab_size;
  const float* lp = logp.data_ptr<float>();
  for (int64_t r = 0; r < P; ++r)
    for (int32_t slot : chunks[static_cast<size_t>(r)].slots)
      TakeToken(*slots[static_cast<size_t>(slot)], lp + r * V);
}

// Any device: one decode step over slots [0, highest running slot].
void Engine::Loop::Decode() {
  int32_t n = 0;
  int32_t attn_len = 1;
  int64_t* tp = tokens.data_ptr<int64_t>();
  int64_t* pp = positions.data_ptr<int64_t>();
  float* temp_p = temps.data_ptr<float>();
  for (int32_t i = 0; i < config.num_slots; ++i) {
    const Seq* s = slots[static_cast<size_t>(i)].get();
    if (s == nullptr || !s->started || (s->ghost && s->pos >= config.CacheLen())) {
      tp[i] = 0;
      pp[i] = 0;
      temp_p[i] = 1.f;
      continue;
    }
    n = i + 1;
    tp[i] = s->ghost ? 0 : s->next_token;
    pp[i] = s->pos;
    temp_p[i] = s->temperature;
    attn_len = std::max(attn_len, s->pos + 1);
  }
  if (n == 0) return;
  at::Tensor toks = tokens.narrow(0, 0, n).to(device);
  at::Tensor pos = positions.narrow(0, 0, n).to(device);
  at::Tensor logits = model.Decode(toks, pos, attn_len, cache, /*fused_cpu=*/false);
  at::Tensor logp = ScaledLogSoftmax(logits, temps.narrow(0, 0, n).to(device));
  logp = logp.to(at::kCPU).contiguous();
  ++delta.decode_steps;
  const int64_t V = config.model.vocab_size;
  const float* lp = logp.data_ptr<float>();
  for (int32_t i = 0; i < n; ++i) {
    Seq* s = slots[static_cast<size_t>(i)].get();
    if (s == nullptr || !s->started || (s->ghost && s->pos >= config.CacheLen())) continue;
    ++s->pos;  // next_token is now in the cache at its position
    if (!s->ghost) TakeToken(*s, lp + static_cast<int64_t>(i) * V);
  }
}

// Publishes finished batches: unpins, wakes Generate callers, runs Submit callbacks.
void Engine::Loop::Publish(Engine& e) {
  std::vector<std::shared_ptr<Batch>> done;
  done.swap(completed);
  {
    MutexLock l(e.mu_);
    e.stats_.rejected += delta.rejected;
    e.stats_.sequences += delta.sequences;
    e.stats_.generated_tokens += delta.generated_tokens;
    e.stats_.prefill_tokens += delta.prefill_tokens;
    e.stats_.prefill_steps += delta.prefill_steps;
    e.stats_.decode_steps += delta.decode_steps;
    e.stats_.stale_aborted += delta.stale_aborted;
    e.stats_.step_cpu_seconds += delta.step_cpu_seconds;
    e.stats_.step_wall_seconds += delta.step_wall_seconds;
    delta = EngineStats();
    for (auto& b : done) {
      b->finished = true;
      if (b->pinned) --e.pins_;
    }
  }
  if (!done.empty()) e.cv_.notify_all();
  for (auto& b : done) {
    if (!b->done) continue;
    try {
      b->done(std::move(b->results));
    } catch (const std::exception& e) {
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::err, 1000, "generation callback threw: {}",
                          e.what());
    }
  }
}

// Drops sequences whose Generate() gave up, admits new prompts, and runs one forward: packed on
// the CPU fused path, else a padded prefill of the new prompts then one decode step.
void Engine::Loop::Step() {
  std::string stale;
  for (auto& slot : slots) {
    if (!slot || slot->ghost) continue;
    if (IsCancelled(*slot->work)) {
      FreeSlot(*slot, FinishReason::kAborted, "cancelled");
    } else if (IsStale(*slot->work, &stale)) {
      ++delta.stale_aborted;
      FreeSlot(*slot, FinishReason::kAborted, stale);
    }
  }
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = ThreadCpuSeconds();
  try {
    EvalModeGuard eval(model);
    std::vector<Chunk> chunks = Admit();
    if (packed) {
      PackedStep(chunks);
    } else {
      Prefill(chunks);
      if (active > 0) Decode();
    }
  } catch (const std::exception& e) {
    Status why = Internal("generation step failed: {}", std::string(e.what()).substr(0, 500));
    Log().error("{}", why.message());
    AbortAll(why, /*include_pending=*/false);
  }
  delta.step_cpu_seconds += ThreadCpuSeconds() - cpu0;
  delta.step_wall_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
}

void Engine::ThreadMain() {
  c10::InferenceMode inference_mode;
  if (config_.intra_op_threads > 0) {
    SetComputeThreads(config_.intra_op_threads);
  }
  Loop& L = *loop_;
  for (;;) {
    bool stopping;
    {
      MutexLock l(mu_);
      for (;;) {
        // Weight updates go first, between steps, on this thread (UpdateWeights).
        const auto update_due = [&]() TROUPE_REQUIRES(mu_) {
          return !update_queue_.empty() && pins_ == 0 && !update_running_;
        };
        if (update_due()) {
          QueuedUpdate& u = *update_queue_.front();
          update_queue_.pop_front();
          u.started = true;
          Status st;
          if (u.version < version_ && !u.allow_rollback) {
            st = InvalidArgument(
                "weight update to version {} is older than the engine's version {}", u.version,
                version_);
          } else {
            l.Unlock();  // the copy runs without the lock; generation is paused (this thread)
            st = LoadUpdate(u);
            l.Lock();
          }
          FinishUpdate(u, std::move(st));
          continue;
        }
        // Something a step would do: run sequences, or admit (or end) a queued request. One
        // that waits for newer weights (min_version) is not work until they land.
        const auto has_work = [&]() TROUPE_REQUIRES(mu_) {
          if (L.active > 0) return true;
          const uint64_t v = version_;
          const auto ready = [v](const std::shared_ptr<Work>& w) {
            return Startable(*w, v) || CancelRequested(*w);
          };
          return std::any_of(queue_.begin(), queue_.end(), ready) ||
                 std::any_of(L.pending.begin(), L.pending.end(), ready);
        };
        const bool gate_closed = update_running_ || (updates_waiting_ > 0 && pins_ == 0);
        if (stop_ || (!gate_closed && has_work())) break;
        engine_sleeping_ = true;
        cv_.wait_until(l, Deadline::InMs(1000).at(), [&]() TROUPE_REQUIRES(mu_) {
          if (update_due()) return true;
          const bool closed = update_running_ || (updates_waiting_ > 0 && pins_ == 0);
          return stop_ || (!closed && has_work());
        });
        engine_sleeping_ = false;
      }
      stopping = stop_;
      while (!queue_.empty()) {
        L.pending.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (!stopping) step_running_ = true;
      L.step_version = version_;
    }
    if (stopping) {
      L.AbortAll(Unavailable("engine stopped"), /*include_pending=*/true);
      L.Publish(*this);
      MutexLock l(mu_);
      thread_exited_ = true;
      cv_.notify_all();
      return;
    }
    L.Step();
    {
      MutexLock l(mu_);
      step_running_ = false;
    }
    cv_.notify_all();
    L.Publish(*this);
  }
}

}  // namespace troupe::engine
