// Engine: batched, continuous generation with exact behaviour log-probs.
//
//   rollout actor ──Generate / Submit──▶ queue ──▶ engine thread:
//       admit into free KV slots ─▶ batched prefill (G samples share it)
//       ─▶ decode step over all active slots ─▶ sample + log-prob ─▶ finished? free slot
//   learner ══weights══▶ UpdateWeights (between steps, never inside one)
//
// One engine thread owns the model and its KvCache and runs the loop above: every
// step prefills newly admitted prompts (padded into one batch) and advances every
// active slot by one token in one batched forward; a slot whose sequence finished
// is refilled at the next step (continuous batching), so short sequences never
// wait for the slowest one.
//
// Every sampled token carries its behaviour log-prob (logprob.h: log_softmax of
// the temperature-scaled logits, float32) and the policy version that sampled it.
//
// Versions and weight updates (DESIGN invariants 1 and 5): UpdateWeights never
// runs inside a forward step. A Generate() call pins the version: an update
// issued meanwhile waits until that call's whole batch has finished, so all its
// tokens come from one version, reported as `policy_version`; new Generate()
// calls wait while an update is waiting (no starvation). Submit() requests are
// not pinned: an update may land between two of their decode steps; their
// `policy_version` is the version at their prefill and `token_versions` tell
// which version sampled each token (importance weights stay exact either way).
// The model runs in eval mode under torch::InferenceMode during steps; its
// previous train/eval mode is restored after each step.
//
// Thread-safety: every public method may be called from any thread. Generate and
// UpdateWeights block (bounded by their deadline); Submit never blocks. Submit
// callbacks run on the engine thread: keep them short, and do not call the
// blocking methods (Generate, UpdateWeights) from them — calling Submit (e.g. the
// next turn of a multi-turn episode) is fine. The destructor stops the thread;
// unfinished requests end with finish reason kAborted (callbacks still run).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/engine/engine_config.h"
#include "troupe/engine/model.h"

namespace troupe::engine {

enum class FinishReason {
  kStop,      // sampled a stop token (kept as the last response token)
  kLength,    // max_new_tokens reached, or the sequence filled its KV-cache row
  kRejected,  // never started: see reject_reason (empty prompt, too long, bad params, ...)
  kAborted,   // cut short: engine stopped, deadline passed, or a step failed (see reject_reason)
};
// "stop" | "length" | "rejected" | "aborted".
const char* FinishReasonName(FinishReason reason);

// One prompt to sample sampling.num_samples continuations of.
struct GenerateRequest {
  // Prompt token ids (usually starting with BOS). Must be non-empty.
  std::vector<int32_t> prompt;
  // Multi-turn continuation: tokens already following the prompt (earlier turns' responses
  // and environment tokens). They are prefilled together with the prompt (the whole context is
  // re-prefilled; nothing is kept in the cache between turns) and lead the result's response
  // with the masks/log-probs/versions below. Empty for a first turn.
  std::vector<int32_t> response_prefix;
  // Per prefix token: 1 = sampled by the model (trained), 0 = environment token. Empty = all 0.
  std::vector<uint8_t> response_prefix_mask;
  // Per prefix token: behaviour log-prob (0 for environment tokens). Empty = all 0.
  std::vector<float> response_prefix_logprobs;
  // Per prefix token: version that sampled it (0 for environment tokens). Empty = all 0.
  std::vector<uint64_t> response_prefix_versions;
  SamplingParams sampling;
  // Caller's identifier, copied into every result of this request.
  uint64_t tag = 0;
  // Streaming: called on the engine thread right after each token is sampled, with the
  // sample's index, the token and its behaviour log-prob (the token is also in the result).
  // Keep it short (it runs inside the step); it must not throw.
  std::function<void(int32_t sample_index, int32_t token, float logprob)> on_token;
  // Cancellation: once it reads true, the request's unfinished samples end with kAborted
  // ("cancelled") at the engine's next step and their slots are freed; `done` still runs.
  std::shared_ptr<const std::atomic<bool>> cancel;
  // Staleness cut-off: when set, the request's unfinished samples end with kAborted
  // (reject_reason "stale: ...") at the first step whose weights are more than this many
  // versions newer than the request's policy_version (the version at its first admission);
  // their slots are freed at once and `done` still runs. A rollout actor sets the job's
  // max_policy_lag: the learner's weights are at least the engine's, so such a group could
  // only be dropped by the lag gate, and every token sampled for it after that is wasted.
  std::optional<uint64_t> abort_beyond_lag;
  // Start only with weights at least this new: the request waits in the engine's queue (other
  // requests pass it) until an update reaches min_version, and starts at the next step
  // boundary without a round trip through the caller. A rollback (an update to a version below
  // the one the engine had when the request arrived: a learner restarted from an older
  // checkpoint) releases it. A waiting request does not wake a sleeping engine; a cancelled
  // one ends at the engine's next step (within a second when it is idle). A rollout actor
  // sets the version its credit grant requires (0: start at once).
  uint64_t min_version = 0;
};

// One sampled sequence.
struct GenerationResult {
  uint64_t tag = 0;          // GenerateRequest::tag
  size_t request_index = 0;  // index of the request in Generate()'s input (0 for Submit)
  int32_t sample_index = 0;  // 0..num_samples-1 within the request
  std::vector<int32_t> prompt_ids;
  // Response tokens: the request's response_prefix, then the tokens sampled now.
  std::vector<int32_t> response_ids;
  // Behaviour log-prob of each response token (0 where mask is 0).
  std::vector<float> logprobs;
  // 1 = sampled by the model, 0 = environment/prefix token given by the caller.
  std::vector<uint8_t> mask;
  // Policy version that sampled each response token (0 where mask is 0).
  std::vector<uint64_t> token_versions;
  FinishReason finish_reason = FinishReason::kAborted;
  // Why the request was rejected or aborted (empty otherwise).
  std::string reject_reason;
  // Policy version at the start of generation (Generate: the pinned version of the batch).
  uint64_t policy_version = 0;
  // Tokens sampled by this call (response_ids minus the prefix).
  int32_t num_new_tokens = 0;
};

// Whether `r` was cut short by its request's abort_beyond_lag (finish reason kAborted, reason
// starting "stale: "), not cancelled or failed.
bool CutShortAsStale(const GenerationResult& r);

// Builds the next turn of a multi-turn episode: same prompt, response_prefix = the previous
// result's response + `env_tokens` (mask 0), carrying its log-probs and versions.
GenerateRequest ContinueRequest(const GenerationResult& previous,
                                const std::vector<int32_t>& env_tokens,
                                const SamplingParams& sampling);

// The first rejected or aborted result as one error naming the request, its tag and the
// reason ("request 3 (tag 17) rejected: prompt of 130 tokens does not fit ..."); ok if none.
Status CheckNoRejections(const std::vector<GenerationResult>& results);

// Results as right-padded tensors (CPU), e.g. for a learner-side check or a batch writer.
struct PaddedResults {
  at::Tensor prompt_ids;        // int64 [N, Pmax], pad_id after each prompt
  at::Tensor prompt_lengths;    // int64 [N]
  at::Tensor response_ids;      // int64 [N, Rmax], pad_id after each response
  at::Tensor response_lengths;  // int64 [N]
  at::Tensor logprobs;          // float32 [N, Rmax]: behaviour log-probs, 0 at padding/mask 0
  at::Tensor mask;              // bool [N, Rmax]: true only for model-sampled tokens
};
PaddedResults PadResults(const std::vector<GenerationResult>& results, int32_t pad_id);

// Counters since construction (monotonic).
// Sets torch's intra-op threads (at::set_num_threads) and, when OpenBLAS is the BLAS, its
// thread count too: torch's setting does not reach OpenBLAS's own pool, which then runs every
// GEMM on all cores and competes with the caller's threads. OpenBLAS's count is process-wide.
// Returns whether OpenBLAS was found.
bool SetComputeThreads(int n);

struct EngineStats {
  uint64_t requests = 0;          // requests accepted by Generate/Submit
  uint64_t rejected = 0;          // requests rejected
  uint64_t sequences = 0;         // samples finished (stop or length)
  uint64_t generated_tokens = 0;  // tokens sampled
  uint64_t prefill_tokens = 0;    // context tokens prefilled (unpadded)
  uint64_t prefill_steps = 0;     // batched prefills run
  uint64_t decode_steps = 0;      // decode steps run
  uint64_t weight_updates = 0;    // successful UpdateWeights
  uint64_t stale_aborted = 0;     // samples cut short by GenerateRequest::abort_beyond_lag
  double step_wall_seconds = 0;   // wall time the engine thread spent in steps
  // CPU time the engine thread spent in steps (its own thread only: with intra_op_threads 1
  // this is the compute cost, unaffected by time the OS gave to other processes).
  double step_cpu_seconds = 0;
};

// The torch device `device` names (see ValidateDeviceName), if this process can allocate on
// it: a CPU-only libtorch, or a GPU index not visible, cannot. Errors name `key` and the value:
// InvalidArgument for a name torch does not parse, Unavailable with torch's first sentence of
// why otherwise.
Result<torch::Device> UsableDevice(std::string_view key, const std::string& device);

class Engine {
 public:
  using Callback = std::function<void(std::vector<GenerationResult>)>;

  // Validates the config, builds the model (random weights from config.init_seed) unless
  // `model` is given (its config must equal config.model; the engine uses it exclusively
  // from now on, except through UpdateWeights), allocates the KV cache, starts the engine
  // thread. Fails on an invalid config or an unavailable device.
  static Result<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                std::shared_ptr<LlamaModel> model = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Generates every request's samples (continuous batching over all of them) and returns the
  // results ordered by request, then sample. Blocks until done or the deadline. A request that
  // cannot run is returned with finish reason kRejected and the reason; the others complete.
  // Errors: Timeout (deadline; the batch is cancelled), Unavailable (engine stopping),
  // Internal (a step failed).
  Result<std::vector<GenerationResult>> Generate(const std::vector<GenerateRequest>& requests,
                                                 Deadline deadline);

  // Queues one request; `done` runs on the engine thread with its num_samples results once
  // all have finished (or been rejected/aborted). Never blocks. Fails (without calling
  // `done`) only when the engine is stopping.
  Status Submit(GenerateRequest request, Callback done);

  // Copies named tensors (Hugging Face names, LlamaModel::LoadNamed rules: all parameters,
  // shapes must match, floating dtypes are cast; a LoRA model takes base + adapters or the
  // adapters alone, and refuses an update without them) into the model and sets the version. Waits
  // for the running step and for pinned Generate() batches; blocks until applied or the
  // deadline (Timeout, nothing changed). Fails on a version lower than version() or bad
  // tensors (nothing changed). The copy runs on the engine thread, between two steps: the new
  // weights land in the caches of the core that reads them next (a copy made by the caller's
  // thread on the other core cost the next steps ~10% at 20 updates a second), and a busy
  // engine thread does not sleep through the update. `named` must stay valid until it returns.
  // `allow_rollback`: accept a version lower than version() — a learner that
  // restarted from an older checkpoint re-syncs its rollout actors this way.
  Status UpdateWeights(uint64_t version, const NamedTensors& named, Deadline deadline,
                       bool allow_rollback = false);
  // Same, but `fill` writes the new weights directly into the model's tensors (e.g. a
  // broadcast receiving into them, avoiding one copy). It runs on the calling thread while
  // generation is paused; if it fails the version is unchanged (weights may be partial).
  Status UpdateWeightsInPlace(uint64_t version,
                              const std::function<Status(const NamedTensors& weights)>& fill,
                              Deadline deadline);

  // The policy version of the weights now in the model (0 before any update).
  uint64_t version() const;
  const EngineConfig& config() const { return config_; }
  EngineStats stats() const;

 private:
  struct Batch;
  struct Work;
  // Whether a queued request may start with weights of `version` (GenerateRequest::min_version).
  static bool Startable(const Work& w, uint64_t version);
  // Cancelled by its caller or its Generate() deadline (the step ends it).
  static bool CancelRequested(const Work& w);
  struct Seq;
  class Loop;

  explicit Engine(const EngineConfig& config);
  Status Enqueue(std::vector<std::shared_ptr<Work>> works) TROUPE_REQUIRES(mu_);
  // Waits until the gate lets an update in; marks it running. Returns Timeout otherwise.
  Status BeginUpdate(uint64_t version, Deadline deadline, bool allow_rollback);
  void EndUpdate(uint64_t version, bool ok);
  // An UpdateWeights call waiting for the engine thread, which applies it between two steps.
  struct QueuedUpdate;
  Status LoadUpdate(const QueuedUpdate& u) TROUPE_EXCLUDES(mu_);
  void FinishUpdate(QueuedUpdate& u, Status st) TROUPE_REQUIRES(mu_);
  void ThreadMain();

  const EngineConfig config_;
  std::shared_ptr<LlamaModel> model_;
  std::unique_ptr<Loop> loop_;  // engine-thread state (slots, cache, sequences)

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<Work>> queue_ TROUPE_GUARDED_BY(mu_);
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  int pins_ TROUPE_GUARDED_BY(mu_) = 0;             // Generate batches in flight
  int updates_waiting_ TROUPE_GUARDED_BY(mu_) = 0;  // UpdateWeights calls at the gate
  bool update_running_ TROUPE_GUARDED_BY(mu_) = false;
  bool step_running_ TROUPE_GUARDED_BY(mu_) = false;
  // UpdateWeights calls in arrival order (each also counts in updates_waiting_); the engine
  // thread applies them as soon as no pinned batch is in flight, before its next step.
  std::deque<QueuedUpdate*> update_queue_ TROUPE_GUARDED_BY(mu_);
  bool engine_sleeping_ TROUPE_GUARDED_BY(mu_) = false;  // waiting for work: notify to wake it
  bool thread_exited_ TROUPE_GUARDED_BY(mu_) = false;
  uint64_t version_ TROUPE_GUARDED_BY(mu_) = 0;
  EngineStats stats_ TROUPE_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace troupe::engine
