#include "troupe/trainer/learner.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>
// clip_grad.h relies on torch::Tensor being declared before it.
#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize/archive.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/peft.h"
#include "troupe/engine/safetensors.h"
#include "troupe/trainer/advantages.h"
#include "troupe/trainer/allocator.h"
#include "troupe/trainer/lag_gate.h"
#include "troupe/trainer/loss.h"
#include "troupe/trainer/lr_schedule.h"
#include "troupe/trainer/packing.h"

namespace troupe::trainer {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr const char* kFormat = "troupe-learner-checkpoint/1";
// The libtorch this binary is built with; state.json records the one that wrote optimizer.pt.
constexpr const char* kTorchVersion = TORCH_VERSION;
// Checkpoints from before the stamp was written: Troupe was built against Debian 12's 1.13 only.
constexpr const char* kUnstampedTorchVersion = "1.13";
// Batch ids remembered for deduplication (oldest forgotten first).
constexpr size_t kSeenCapacity = 1 << 20;

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

spdlog::logger& Log() {
  return log::Get("trainer");
}

// An accepted batch with its advantages (computed on arrival, off the training thread).
struct PendingBatch {
  TrainBatch batch;
  AdvantageResult adv;
};

// A batch inside the group of batches being trained on.
struct GroupBatch {
  TrainBatch batch;
  AdvantageResult adv;
  int64_t flat_offset = 0;  // first response token in the group's flat token space
  bool active = true;       // false once retired (lag limit reached)
};

// The batches of the current updates, with everything cached across their reuse.
struct Group {
  std::vector<GroupBatch> batches;
  int32_t uses = 0;
  bool dirty = true;  // the active set changed: repack
  std::vector<PackedMicroBatch> micro;
  std::vector<int32_t> micro_thread;  // the update thread of each micro-batch (threads > 1)
  int64_t sequences = 0;  // sequences packed (with trained tokens)
  int64_t trained_tokens = 0;
  int64_t padded_tokens = 0;
  int64_t flat_tokens = 0;
  at::Tensor prox_flat;  // log pi_prox of every response token (when reused)
  at::Tensor ref_flat;   // log pi_ref of every response token (with a reference)
  bool ref_ready = false;
};

// Bounded set of recently seen batch ids.
class SeenIds {
 public:
  bool Insert(const std::string& id) {
    if (!set_.insert(id).second) return false;
    order_.push_back(id);
    if (order_.size() > kSeenCapacity) {
      set_.erase(order_.front());
      order_.pop_front();
    }
    return true;
  }

 private:
  std::unordered_set<std::string> set_;
  std::deque<std::string> order_;
};

at::Tensor GatherFlat(const at::Tensor& flat, const PackedMicroBatch& mb) {
  at::Tensor out = at::zeros_like(mb.mask);
  out.masked_scatter_(mb.valid, flat.index_select(0, mb.valid_flat_index));
  return out;
}

void StoreFlat(at::Tensor& flat, const PackedMicroBatch& mb, const at::Tensor& values) {
  flat.index_copy_(0, mb.valid_flat_index, values.detach().masked_select(mb.valid));
}

// What a micro-batch's forward yields at its target positions (mb.valid), as [rows, T]
// tensors that are 0 elsewhere.
struct TargetScores {
  at::Tensor logprobs;  // log-prob of each target at `temperature` (engine::TokenLogprobs)
  at::Tensor entropy;   // entropy of the tempered distribution (when asked for)
  at::Tensor hits;      // float 1 where the argmax is the target (when asked for)
};

// Runs the model over mb.ids and evaluates the output head only at the positions that have a
// target: prompt and padding positions never need logits, and with a 150k-token vocabulary
// the vocab_size x d_model head is most of a small model's forward and backward (and its
// [tokens, vocab] logits most of the memory). Same values as Forward + TokenLogprobs.
TargetScores ScoreTargets(engine::LlamaModel& model, const PackedMicroBatch& mb,
                          double temperature, bool entropy, bool entropy_grad, bool hits) {
  const int64_t n = mb.rows * mb.length;
  const at::Tensor idx = mb.valid.reshape({-1}).nonzero().squeeze(1);
  const at::Tensor logits = model.HeadLogits(model.ForwardHiddenRows(mb.ids, mb.lengths, idx));
  const at::Tensor logp = engine::ScaledLogSoftmax(logits, temperature);
  const at::Tensor targets = mb.targets.reshape({-1}).index_select(0, idx);
  auto scatter = [&](const at::Tensor& rows) {
    return at::zeros({n}, rows.options()).index_copy(0, idx, rows).view({mb.rows, mb.length});
  };
  TargetScores out;
  out.logprobs = scatter(logp.gather(1, targets.unsqueeze(1)).squeeze(1));
  if (entropy) {
    std::optional<at::NoGradGuard> no_grad;
    if (!entropy_grad) no_grad.emplace();
    const at::Tensor lp = entropy_grad ? logp : logp.detach();
    out.entropy = scatter(-(lp.exp() * lp).sum(-1));
  }
  if (hits) {
    at::NoGradGuard no_grad;
    out.hits = scatter((logits.detach().argmax(-1) == targets).to(at::kFloat));
  }
  return out;
}

PackedMicroBatch ToDevice(PackedMicroBatch mb, const at::Device& device) {
  if (device.is_cpu()) return mb;
  for (at::Tensor* t : {&mb.ids, &mb.targets, &mb.mask, &mb.behaviour, &mb.advantages, &mb.weights,
                        &mb.flat_index, &mb.valid, &mb.valid_flat_index, &mb.lengths}) {
    *t = t->to(device, /*non_blocking=*/true);
  }
  return mb;
}

// The key of a parameter in Optimizer::state(): the string c10::guts::to_string makes of its
// TensorImpl's address up to torch 2.1, the address itself since 2.2.
auto OptimizerStateKey(const at::Tensor& p) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  return static_cast<void*>(p.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(p.unsafeGetTensorImpl());
#endif
}

}  // namespace

struct Learner::State {
  State(const LearnerConfig& c, engine::LlamaModel* p, engine::LlamaModel* r)
      : cfg(c), policy(p), reference(r), gate(c.effective_max_policy_lag()) {}

  // Retires batches that reached the lag limit and, when the current group is
  // used up, forms the next one from the queue. False: not enough fresh data.
  bool PrepareGroup() TROUPE_EXCLUDES(mu);
  // Packs the group's active, trainable sequences into micro-batches.
  void Repack(Group& g);
  // Which update thread runs which sequences (indices into `views`), as micro-batches.
  std::vector<std::pair<int32_t, std::vector<int64_t>>> PlanUpdate(
      const std::vector<SequenceView>& views) const;
  // One RL update on the prepared group; the caller handles errors.
  Result<StepMetrics> RunRlUpdate(SteadyClock::time_point t0);
  // Clips gradients, steps AdamW at `lr`; returns the pre-clip norm (non-finite: no step).
  double ApplyGradients(double lr, double eps);
  // Drops the group after a failed update; batches never trained count as invalid.
  void AbandonGroup(const Status& why) TROUPE_EXCLUDES(mu);

  const LearnerConfig& cfg;
  engine::LlamaModel* policy;
  engine::LlamaModel* reference;  // null without KL

  mutable Mutex mu;
  std::deque<PendingBatch> queue TROUPE_GUARDED_BY(mu);
  SeenIds seen TROUPE_GUARDED_BY(mu);
  LearnerCounters counters TROUPE_GUARDED_BY(mu);
  std::vector<FinishedBatch> finished TROUPE_GUARDED_BY(mu);  // decided since TakeFinishedBatches
  uint64_t version TROUPE_GUARDED_BY(mu) = 0;
  uint64_t step TROUPE_GUARDED_BY(mu) = 0;
  bool group_has_work TROUPE_GUARDED_BY(mu) = false;  // mirror of `group` for ReadyToStep

  // Training thread only.
  std::unique_ptr<Group> group;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  // LoRA with a frozen base: model.safetensors of the last checkpoint (hard-linked by the
  // next one); empty when the base changed since or none was written.
  std::string base_file;
  std::vector<at::Tensor> params;
  LagGate gate;
  BatchLimits limits;
  LrSchedule schedule;
  at::Device device = at::kCPU;
};

Learner::Learner(const LearnerConfig& config, std::shared_ptr<engine::LlamaModel> policy,
                 std::shared_ptr<engine::LlamaModel> reference)
    : config_(config),
      policy_(std::move(policy)),
      reference_(std::move(reference)),
      state_(std::make_unique<State>(config_, policy_.get(), reference_.get())) {}

Learner::~Learner() = default;

namespace {

// LoRA with a frozen base: the reference (the KL anchor) is the same base with its own
// adapters, so its base parameters alias the policy's (one copy of the base, read by both,
// written by neither) instead of holding a clone. Trainable base parameters are never shared.
// Returns the bytes shared.
int64_t ShareFrozenBase(engine::LlamaModel& reference, const engine::LlamaModel& policy) {
  if (!policy.config().lora.enabled()) return 0;
  torch::NoGradGuard no_grad;
  const auto src = policy.named_parameters();
  int64_t shared = 0;
  for (auto& item : reference.named_parameters()) {
    const at::Tensor* from = src.find(item.key());
    if (from == nullptr || from->requires_grad() || item.key().find("_lora_") != std::string::npos)
      continue;
    at::Tensor p = item.value();
    if (!p.is_alias_of(*from)) p.set_(*from);
    shared += static_cast<int64_t>(p.nbytes());
  }
  return shared;
}

// Gives the reference its own copy of every base parameter it shares with the policy (before
// the policy's base trains, or before the reference loads other weights).
void UnshareBase(engine::LlamaModel& reference, const engine::LlamaModel& policy) {
  torch::NoGradGuard no_grad;
  const auto src = policy.named_parameters();
  for (auto& item : reference.named_parameters()) {
    const at::Tensor* from = src.find(item.key());
    at::Tensor p = item.value();
    if (from != nullptr && p.is_alias_of(*from)) p.set_(p.clone());
  }
}

// True when every base parameter of the two models holds the same values.
bool SameBase(const engine::LlamaModel& a, const engine::LlamaModel& b) {
  const auto other = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    if (item.key().find("_lora_") != std::string::npos) continue;
    const at::Tensor* t = other.find(item.key());
    if (t == nullptr || !at::equal(item.value(), *t)) return false;
  }
  return true;
}

std::unique_ptr<torch::optim::AdamW> MakeOptimizer(const LearnerConfig& c,
                                                   const std::vector<at::Tensor>& params) {
  // Decay matrices only; norms and biases (1-D) are never decayed.
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts = torch::optim::AdamWOptions(c.lr)
                  .betas({c.adam_beta1, c.adam_beta2})
                  .eps(c.adam_eps)
                  .weight_decay(c.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts));
  auto nd = opts;
  nd.weight_decay(0.0);
  if (!no_decay.empty()) {
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(nd));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), opts);
}

}  // namespace

Result<std::unique_ptr<Learner>> Learner::Create(const LearnerConfig& config,
                                                 std::shared_ptr<engine::LlamaModel> policy,
                                                 std::shared_ptr<engine::LlamaModel> reference) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  if (!policy) return InvalidArgument("learner needs a policy model (got null)");
  const engine::ModelConfig& mc = policy->config();
  if (config.kl_coef > 0 && !reference) {
    return InvalidArgument("trainer.kl_coef = {} needs a reference model (got none)",
                           config.kl_coef);
  }
  if (config.kl_coef == 0) reference.reset();
  if (reference && reference->device() != policy->device()) {
    return InvalidArgument("reference model on {} but policy on {}", reference->device().str(),
                           policy->device().str());
  }
  if (config.threads > 1 && !policy->device().is_cpu()) {
    return InvalidArgument("trainer.threads = {} splits updates across CPU threads; the policy is on {}",
                           config.threads, policy->device().str());
  }
  if (config.threads > 1 && mc.lora.enabled() && mc.lora.dropout > 0) {
    return InvalidArgument(
        "trainer.threads = {} with lora.dropout = {}: dropout masks drawn by several threads "
        "would depend on timing (set one of them to 1 / 0)",
        config.threads, mc.lora.dropout);
  }
  if (config.max_sequence_tokens > mc.max_seq_len) {
    return InvalidArgument("trainer.max_sequence_tokens = {} exceeds the model's max_seq_len {}",
                           config.max_sequence_tokens, mc.max_seq_len);
  }
  if (config.tune_allocator) {
    Status st = TuneAllocatorForTraining();
    if (!st.ok()) Log().warn("allocator tuning skipped: {}", st.message());
  }
  std::unique_ptr<Learner> l(new Learner(config, std::move(policy), std::move(reference)));
  State& s = *l->state_;
  s.device = l->policy_->device();
  s.limits.vocab_size = mc.vocab_size;
  s.limits.max_sequence_tokens =
      config.max_sequence_tokens > 0 ? config.max_sequence_tokens : mc.max_seq_len;
  s.schedule = LrSchedule{config.lr, config.warmup_steps, config.total_steps, config.min_lr_ratio};
  for (const auto& p : l->policy_->parameters()) {
    if (p.requires_grad()) s.params.push_back(p);
  }
  if (s.params.empty()) return InvalidArgument("policy model has no trainable parameters");
  s.optimizer = MakeOptimizer(config, s.params);
  if (l->reference_) {
    for (auto& p : l->reference_->parameters()) p.requires_grad_(false);
    Status st = l->reference_->LoadNamed(l->policy_->StateWeights());
    if (!st.ok()) return st.WithContext("reference model does not match the policy");
    if (int64_t b = ShareFrozenBase(*l->reference_, *l->policy_); b > 0)
      Log().info("learner: the reference shares the policy's frozen base ({:.1f} MB not copied)",
                 static_cast<double>(b) / 1e6);
  }
  if (mc.lora.enabled())
    Log().info("learner: LoRA {}: {} adapter parameters train, the {} of the base are frozen",
               mc.lora.ToString(), mc.NumAdapterParameters(), mc.NumParameters());
  Log().info(
      "learner: {} params, advantage {}, aggregation {}, lr {}, max_policy_lag {}, "
      "updates_per_batch {}, batches_per_update {}, device {}",
      mc.NumParameters(), Name(config.advantage), Name(config.aggregation), config.lr,
      config.effective_max_policy_lag(), config.updates_per_batch, config.batches_per_update,
      s.device.str());
  return l;
}

uint64_t Learner::version() const {
  MutexLock l(state_->mu);
  return state_->version;
}

uint64_t Learner::step() const {
  MutexLock l(state_->mu);
  return state_->step;
}

LearnerCounters Learner::counters() const {
  MutexLock l(state_->mu);
  return state_->counters;
}

bool Learner::ReadyToStep() const {
  MutexLock l(state_->mu);
  return state_->group_has_work ||
         state_->queue.size() >= static_cast<size_t>(config_.batches_per_update);
}

Result<Admission> Learner::Offer(TrainBatch batch) {
  State& s = *state_;
  // Validation and advantages run outside the lock: they only read the batch.
  Status valid = ValidateTrainBatch(batch, s.limits);
  AdvantageResult adv;
  if (valid.ok()) {
    std::vector<int64_t> group_of;
    const int64_t groups =
        AssignGroups(batch.group_index, batch.group_size, batch.num_sequences(), &group_of);
    adv = ComputeAdvantages(batch.rewards, group_of, groups, config_.advantage,
                            config_.advantage_eps);
    if (config_.negative_advantage_scale != 1.0) {
      for (float& a : adv.advantages)
        if (a < 0) a = static_cast<float>(a * config_.negative_advantage_scale);
    }
  }
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(batch.num_sequences(), 0));
  MutexLock l(s.mu);
  LearnerCounters& c = s.counters;
  ++c.offered_batches;
  if (!s.seen.Insert(batch.batch_id)) {
    ++c.duplicate_batches;
    return AlreadyExists("batch '{}' was offered before (duplicate ignored)", batch.batch_id);
  }
  if (!valid.ok()) {
    ++c.dropped_invalid_batches;
    c.dropped_invalid_sequences += n;
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "dropped invalid batch: {}",
                        valid.message());
    return valid;
  }
  Status gate = s.gate.Check(s.version, batch.policy_version);
  if (gate.code() == Code::kProtocol) {
    ++c.dropped_invalid_batches;
    ++c.future_version_batches;
    c.dropped_invalid_sequences += n;
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::err, 5000, "batch '{}': {}", batch.batch_id,
                        gate.message());
    return gate.WithContext(fmt::format("batch '{}'", batch.batch_id));
  }
  if (!gate.ok()) {
    ++c.dropped_stale_batches;
    c.dropped_stale_sequences += n;
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "dropped stale batch '{}': {}",
                        batch.batch_id, gate.message());
    return gate.WithContext(fmt::format("batch '{}'", batch.batch_id));
  }
  Admission a;
  a.learner_version = s.version;
  a.lag = LagGate::Lag(s.version, batch.policy_version);
  ++c.accepted_batches;
  c.accepted_sequences += n;
  ++c.queued_batches;
  s.queue.push_back(PendingBatch{std::move(batch), std::move(adv)});
  a.queued_batches = s.queue.size();
  a.ready = s.group_has_work || s.queue.size() >= static_cast<size_t>(config_.batches_per_update);
  return a;
}

const char* BatchFateName(BatchFate fate) {
  switch (fate) {
    case BatchFate::kTrained:
      return "trained";
    case BatchFate::kStale:
      return "dropped_stale";
    case BatchFate::kInvalid:
      return "dropped_invalid";
    case BatchFate::kSkipped:
      return "skipped";
  }
  return "unknown";
}

BatchFate FateOfRefusal(const Status& s) {
  return s.code() == Code::kStale ? BatchFate::kStale : BatchFate::kInvalid;
}

void Learner::ResetOptimizer() {
  state_->optimizer = MakeOptimizer(config_, state_->params);
}

Status Learner::SetBaseTrainable(bool trainable) {
  if (!policy_->config().lora.enabled())
    return InvalidArgument("SetBaseTrainable: the policy has no LoRA (its base always trains)");
  // A base that trains must not move the reference's (shared while frozen).
  if (trainable && reference_) UnshareBase(*reference_, *policy_);
  policy_->SetBaseTrainable(trainable);
  state_->params.clear();
  for (const auto& p : policy_->parameters())
    if (p.requires_grad()) state_->params.push_back(p);
  state_->optimizer = MakeOptimizer(config_, state_->params);
  state_->base_file.clear();  // the base changes: the next checkpoint writes it
  return Status::Ok();
}

bool Learner::base_trainable() const {
  if (!policy_->config().lora.enabled()) return true;
  for (const auto& [name, t] : policy_->NamedWeights())
    if (t.requires_grad()) return true;
  return false;
}

engine::NamedTensors Learner::BroadcastWeights() const {
  return policy_->config().lora.enabled() ? policy_->AdapterWeights() : policy_->NamedWeights();
}

std::vector<FinishedBatch> Learner::TakeFinishedBatches() {
  MutexLock l(state_->mu);
  std::vector<FinishedBatch> out;
  out.swap(state_->finished);
  return out;
}

void Learner::SnapshotReference() {
  if (!reference_) return;
  // A frozen base is shared, not copied: only the adapters are the reference's own.
  const bool shared = ShareFrozenBase(*reference_, *policy_) > 0;
  if (!shared) UnshareBase(*reference_, *policy_);
  Status st = reference_->LoadNamed(shared ? policy_->AdapterWeights() : policy_->StateWeights());
  TROUPE_CHECK_MSG(st.ok(), "reference snapshot: {}", st.ToString());
}

bool Learner::State::PrepareGroup() {
  MutexLock l(mu);
  const size_t need = static_cast<size_t>(cfg.batches_per_update);
  if (group) {
    bool any = false;
    for (GroupBatch& gb : group->batches) {
      if (!gb.active) continue;
      if (!gate.Check(version, gb.batch.policy_version).ok()) {
        gb.active = false;
        group->dirty = true;
        Log().debug("batch '{}' retired after {} updates: lag {} reached max_policy_lag {}",
                    gb.batch.batch_id, group->uses, LagGate::Lag(version, gb.batch.policy_version),
                    gate.max_policy_lag());
        continue;
      }
      any = true;
    }
    if (!any || group->uses >= cfg.updates_per_batch) group.reset();
  }
  if (!group) {
    // Every queued batch the lag gate now refuses is dropped (decided: its credits free at once),
    // wherever it waits in the queue.
    for (auto it = queue.begin(); it != queue.end();) {
      Status st = gate.Check(version, it->batch.policy_version);
      if (st.ok()) {
        ++it;
        continue;
      }
      --counters.queued_batches;
      ++counters.dropped_stale_batches;
      counters.dropped_stale_sequences += static_cast<uint64_t>(it->batch.num_sequences());
      finished.push_back(
          {it->batch.batch_id, BatchFate::kStale, st.message(), it->batch.num_sequences()});
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                          "dropped stale batch '{}' before training: {}", it->batch.batch_id,
                          st.message());
      it = queue.erase(it);
    }
    // Oldest version first (earliest deadline), arrival order among equals: batches arrive out
    // of version order (a long group finishes after shorter, younger ones), and in arrival
    // order one that reached the learner in time could wait in the queue until it was too old
    // to train on, while the younger ones it waited behind had updates to spare.
    std::stable_sort(queue.begin(), queue.end(), [](const PendingBatch& a, const PendingBatch& b) {
      return a.batch.policy_version < b.batch.policy_version;
    });
    std::vector<PendingBatch> taken;
    while (taken.size() < need && !queue.empty()) {
      taken.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    if (taken.size() < need) {
      for (auto it = taken.rbegin(); it != taken.rend(); ++it) queue.push_front(std::move(*it));
      group_has_work = false;
      return false;
    }
    group = std::make_unique<Group>();
    int64_t flat = 0;
    for (PendingBatch& p : taken) {
      GroupBatch gb;
      gb.flat_offset = flat;
      flat += p.batch.num_response_tokens();
      gb.batch = std::move(p.batch);
      gb.adv = std::move(p.adv);
      group->batches.push_back(std::move(gb));
    }
    group->flat_tokens = flat;
  }
  group_has_work = true;
  return true;
}

void Learner::State::Repack(Group& g) {
  std::vector<SequenceView> views;
  std::vector<int64_t> trained_per_seq;
  for (GroupBatch& gb : g.batches) {
    if (!gb.active) continue;
    const TrainBatch& b = gb.batch;
    for (int64_t i = 0; i < b.num_sequences(); ++i) {
      if (cfg.skip_uniform_groups && gb.adv.in_uniform[i]) continue;
      const int64_t p0 = b.prompt_offsets[i], p1 = b.prompt_offsets[i + 1];
      const int64_t r0 = b.response_offsets[i], r1 = b.response_offsets[i + 1];
      int64_t trained = 0;
      for (int64_t j = r0; j < r1; ++j) trained += b.loss_mask[j];
      if (trained == 0) continue;  // nothing to learn from (also covers empty responses)
      SequenceView v;
      v.prompt = b.prompt_tokens.data() + p0;
      v.prompt_len = p1 - p0;
      v.response = b.response_tokens.data() + r0;
      v.response_len = r1 - r0;
      v.behaviour = b.behaviour_logprobs.data() + r0;
      v.mask = b.loss_mask.data() + r0;
      v.advantage = gb.adv.advantages[i];
      v.flat_offset = gb.flat_offset + r0;
      views.push_back(v);
      trained_per_seq.push_back(trained);
    }
  }
  int64_t total = 0;
  for (int64_t t : trained_per_seq) total += t;
  const double n_seq = static_cast<double>(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    views[i].token_weight =
        cfg.aggregation == LossAggregation::kTokenMean
            ? static_cast<float>(1.0 / static_cast<double>(total))
            : static_cast<float>(1.0 / (static_cast<double>(trained_per_seq[i]) * n_seq));
  }
  g.micro.clear();
  g.micro_thread.clear();
  g.padded_tokens = 0;
  for (const auto& [thread, rows] : PlanUpdate(views)) {
    PackedMicroBatch mb = ToDevice(PackMicroBatch(views, rows), device);
    g.padded_tokens += mb.rows * mb.length;
    g.micro.push_back(std::move(mb));
    g.micro_thread.push_back(thread);
  }
  g.sequences = static_cast<int64_t>(views.size());
  g.trained_tokens = total;
  g.dirty = false;
}

std::vector<std::pair<int32_t, std::vector<int64_t>>> Learner::State::PlanUpdate(
    const std::vector<SequenceView>& views) const {
  std::vector<std::pair<int32_t, std::vector<int64_t>>> plan;
  const int32_t threads = std::max<int32_t>(1, std::min<int32_t>(cfg.threads, views.size()));
  if (threads == 1) {
    for (auto& rows : PlanMicroBatches(views, cfg.micro_batch_tokens))
      plan.emplace_back(0, std::move(rows));
    return plan;
  }
  // Deal the sequences, longest first, round-robin: every thread gets the same mix of
  // lengths, hence about the same padded tokens. Then micro-batches within each share.
  std::vector<int64_t> order(views.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return views[a].input_len() > views[b].input_len();
  });
  for (int32_t t = 0; t < threads; ++t) {
    std::vector<int64_t> index;
    std::vector<SequenceView> share;
    for (size_t k = static_cast<size_t>(t); k < order.size(); k += static_cast<size_t>(threads)) {
      index.push_back(order[k]);
      share.push_back(views[order[k]]);
    }
    for (const auto& rows : PlanMicroBatches(share, cfg.micro_batch_tokens)) {
      std::vector<int64_t> global;
      global.reserve(rows.size());
      for (int64_t r : rows) global.push_back(index[r]);
      plan.emplace_back(t, std::move(global));
    }
  }
  return plan;
}

double Learner::State::ApplyGradients(double lr, double eps) {
  const double max_norm =
      cfg.grad_clip > 0 ? cfg.grad_clip : std::numeric_limits<double>::infinity();
  const double norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
  if (!std::isfinite(norm)) return norm;
  for (auto& group_opts : optimizer->param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group_opts.options());
    o.lr(lr);
    o.eps(eps);
  }
  optimizer->step();
  return norm;
}

void Learner::State::AbandonGroup(const Status& why) {
  optimizer->zero_grad();
  MutexLock l(mu);
  if (group) {
    for (const GroupBatch& gb : group->batches) {
      if (group->uses > 0) continue;  // already counted as trained
      --counters.queued_batches;
      ++counters.dropped_invalid_batches;
      counters.dropped_invalid_sequences += static_cast<uint64_t>(gb.batch.num_sequences());
      finished.push_back({gb.batch.batch_id, BatchFate::kInvalid, "update failed: " + why.message(),
                          gb.batch.num_sequences()});
    }
  }
  group.reset();
  group_has_work = false;
  Log().error("update abandoned: {}", why.ToString());
}

Result<StepMetrics> Learner::State::RunRlUpdate(SteadyClock::time_point t0) {
  Group& g = *group;
  if (g.dirty) Repack(g);
  const bool first = g.uses == 0;
  const bool keep_prox = cfg.updates_per_batch > 1;
  const at::TensorOptions fopts = at::TensorOptions().dtype(at::kFloat).device(device);
  if (first && keep_prox) g.prox_flat = at::zeros({g.flat_tokens}, fopts);
  if (reference != nullptr && !g.ref_flat.defined()) g.ref_flat = at::zeros({g.flat_tokens}, fopts);

  StepMetrics m;
  m.kind = "rl";
  uint64_t version_now = 0, rl_updates = 0;
  {
    MutexLock l(mu);
    version_now = version;
    rl_updates = counters.updates;
  }
  m.lr = schedule.At(static_cast<int64_t>(rl_updates));
  m.lag_histogram.assign(static_cast<size_t>(gate.max_policy_lag()) + 1, 0);
  double reward_sum = 0, reward_sq = 0;
  int64_t reward_n = 0, response_tokens = 0, response_seqs = 0;
  for (const GroupBatch& gb : g.batches) {
    if (!gb.active) continue;
    const auto& off = gb.batch.response_offsets;
    for (size_t i = 1; i < off.size(); ++i)
      m.response_len_max = std::max(m.response_len_max, static_cast<double>(off[i] - off[i - 1]));
    response_tokens += gb.batch.num_response_tokens();
    response_seqs += gb.batch.num_sequences();
    ++m.batches;
    m.groups += gb.adv.groups;
    m.uniform_groups += gb.adv.uniform_groups;
    const int64_t lag = LagGate::Lag(version_now, gb.batch.policy_version);
    TROUPE_CHECK(lag >= 0 && lag < static_cast<int64_t>(m.lag_histogram.size()));
    ++m.lag_histogram[static_cast<size_t>(lag)];
    for (float r : gb.batch.rewards) {
      reward_sum += r;
      reward_sq += static_cast<double>(r) * r;
      ++reward_n;
    }
    // Group means (groups by group_index, else contiguous runs of group_size).
    std::map<int64_t, std::pair<double, int64_t>> groups;
    for (size_t i = 0; i < gb.batch.rewards.size(); ++i) {
      const int64_t gid = gb.batch.group_index.size() == gb.batch.rewards.size()
                              ? gb.batch.group_index[i]
                              : static_cast<int64_t>(i) / std::max<int64_t>(1, gb.batch.group_size);
      groups[gid].first += gb.batch.rewards[i];
      groups[gid].second += 1;
    }
    for (const auto& [gid, sn] : groups)
      m.group_rewards.push_back(sn.first / static_cast<double>(sn.second));
  }
  if (reward_n > 0) {
    m.reward_mean = reward_sum / static_cast<double>(reward_n);
    m.reward_std = std::sqrt(
        std::max(0.0, reward_sq / static_cast<double>(reward_n) - m.reward_mean * m.reward_mean));
  }
  if (response_seqs > 0)
    m.response_len_mean = static_cast<double>(response_tokens) / static_cast<double>(response_seqs);
  m.sequences = g.sequences;
  m.padded_tokens = g.padded_tokens;
  m.micro_batches = static_cast<int64_t>(g.micro.size());

  PolicyLossCoefficients coef;
  coef.clip_low = cfg.clip_low;
  coef.clip_high = cfg.clip_high;
  coef.is_cap = cfg.is_cap;
  coef.kl_coef = cfg.kl_coef;
  coef.entropy_coef = cfg.entropy_coef;
  // One update thread's share: forward and backward of its micro-batches, in order. Thread 0
  // (the training thread) accumulates into the parameters' .grad; the others into `grads`,
  // summed into .grad in thread order afterwards (results independent of timing).
  struct Share {
    PolicyLossStats stats;
    std::vector<at::Tensor> grads;
    double forward_s = 0, backward_s = 0;
    std::exception_ptr error;  // what the share threw (rethrown on the training thread)
  };
  const int32_t threads =
      g.micro_thread.empty() ? 1 : *std::max_element(g.micro_thread.begin(), g.micro_thread.end()) + 1;
  std::vector<Share> shares(static_cast<size_t>(threads));
  Mutex flat_mu;  // prox_flat / ref_flat writes of concurrent threads
  auto run_share = [&](int32_t t) {
    Share& sh = shares[static_cast<size_t>(t)];
    for (size_t i = 0; i < g.micro.size(); ++i) {
      if (g.micro_thread[i] != t) continue;
      const PackedMicroBatch& mb = g.micro[i];
      auto tf = SteadyClock::now();
      TargetScores scores = ScoreTargets(*policy, mb, cfg.temperature, /*entropy=*/true,
                                         /*entropy_grad=*/cfg.entropy_coef > 0, /*hits=*/false);
      PolicyLossInputs in;
      in.logprobs = scores.logprobs;
      in.proximal_logprobs = first ? in.logprobs.detach() : GatherFlat(g.prox_flat, mb);
      in.behaviour_logprobs = mb.behaviour;
      in.advantages = mb.advantages;
      in.mask = mb.mask;
      in.token_weights = mb.weights;
      if (reference != nullptr) {
        if (!g.ref_ready) {
          at::NoGradGuard no_grad;
          at::Tensor ref =
              ScoreTargets(*reference, mb, cfg.temperature, false, false, false).logprobs;
          MutexLock l(flat_mu);
          StoreFlat(g.ref_flat, mb, ref);
          in.reference_logprobs = ref;
        } else {
          in.reference_logprobs = GatherFlat(g.ref_flat, mb);
        }
      }
      in.entropy = scores.entropy;
      PolicyLossResult res = ComputePolicyLoss(in, coef);
      if (first && keep_prox) {
        MutexLock l(flat_mu);
        StoreFlat(g.prox_flat, mb, in.logprobs);
      }
      auto tb = SteadyClock::now();
      sh.forward_s += Seconds(tf, tb);
      if (t == 0) {
        res.loss.backward();
      } else {
        std::vector<at::Tensor> got = torch::autograd::grad(
            {res.loss}, params, /*grad_outputs=*/{}, /*retain_graph=*/false,
            /*create_graph=*/false, /*allow_unused=*/true);
        if (sh.grads.empty()) {
          sh.grads = std::move(got);
        } else {
          for (size_t k = 0; k < got.size(); ++k) {
            if (!got[k].defined()) continue;
            if (sh.grads[k].defined())
              sh.grads[k].add_(got[k]);
            else
              sh.grads[k] = got[k];
          }
        }
      }
      sh.backward_s += Seconds(tb, SteadyClock::now());
      sh.stats.Add(res.stats);
    }
  };
  optimizer->zero_grad();
  if (threads == 1) {
    run_share(0);
  } else {
    engine::SetComputeThreads(1);
    std::vector<std::thread> helpers;
    for (int32_t t = 1; t < threads; ++t) {
      helpers.emplace_back([&, t] {
        // One intra-op thread each (torch and OpenBLAS): the threads are the parallelism.
        engine::SetComputeThreads(1);
        try {
          run_share(t);
        } catch (...) {
          shares[static_cast<size_t>(t)].error = std::current_exception();
        }
      });
    }
    try {
      run_share(0);
    } catch (...) {
      shares[0].error = std::current_exception();
    }
    for (auto& h : helpers) h.join();
    for (const Share& sh : shares) {
      if (sh.error) std::rethrow_exception(sh.error);  // as the one-thread loop would throw
    }
    for (size_t t = 1; t < shares.size(); ++t) {
      const auto& grads = shares[t].grads;
      for (size_t k = 0; k < grads.size(); ++k) {
        if (!grads[k].defined()) continue;
        at::Tensor& gk = params[k].mutable_grad();
        if (gk.defined())
          gk.add_(grads[k]);
        else
          gk = grads[k].clone();
      }
    }
  }
  PolicyLossStats total;
  for (const Share& sh : shares) {  // thread order: the same sums every run
    total.Add(sh.stats);
    m.forward_s += sh.forward_s;  // summed over the update threads (thread-seconds)
    m.backward_s += sh.backward_s;
  }
  if (reference != nullptr) g.ref_ready = true;

  const double tokens = total.tokens;
  m.tokens = static_cast<int64_t>(tokens);
  if (tokens > 0) {
    m.loss = total.loss;
    m.pg_loss = total.pg_loss;
    m.kl = total.kl_sum / tokens;
    m.entropy = total.entropy_sum / tokens;
    m.clip_fraction = total.clipped / tokens;
    m.ratio_max = total.ratio_max;
    m.is_weight_mean = total.is_weight_sum / tokens;
    m.is_weight_max = total.is_weight_max;
    m.is_truncated_fraction = total.truncated / tokens;
    m.logprob_mismatch_mean = total.mismatch_sum / tokens;
    m.logprob_mismatch_max = total.mismatch_max;
    for (double c : total.is_weight_histogram)
      m.is_weight_histogram.push_back(static_cast<int64_t>(std::llround(c)));
    if (!std::isfinite(m.loss)) {
      return Internal("non-finite loss {}: optimizer step skipped", m.loss);
    }
    auto to = SteadyClock::now();
    m.grad_norm = ApplyGradients(m.lr, cfg.adam_eps);
    m.optimizer_s = Seconds(to, SteadyClock::now());
    if (!std::isfinite(m.grad_norm)) {
      return Internal("non-finite gradient norm {}: optimizer step skipped", m.grad_norm);
    }
  }

  MutexLock l(mu);
  if (first) {
    for (const GroupBatch& gb : g.batches) {
      --counters.queued_batches;
      const auto n = static_cast<uint64_t>(gb.batch.num_sequences());
      if (m.tokens > 0) {
        ++counters.trained_batches;
        counters.trained_sequences += n;
        finished.push_back({gb.batch.batch_id, BatchFate::kTrained, "", gb.batch.num_sequences()});
        counters.uniform_groups += static_cast<uint64_t>(gb.adv.uniform_groups);
      } else {
        // No optimizer step: not trained on, not dropped either.
        ++counters.skipped_batches;
        counters.skipped_sequences += n;
        finished.push_back({gb.batch.batch_id, BatchFate::kSkipped,
                            "no learning signal: every group had uniform rewards",
                            gb.batch.num_sequences()});
      }
    }
  }
  counters.trained_tokens += static_cast<uint64_t>(m.tokens);
  ++g.uses;
  if (m.tokens > 0) {
    ++version;
    ++step;
    ++counters.updates;
  } else {
    g.uses = cfg.updates_per_batch;  // nothing to learn from these batches: retire them
  }
  if (g.uses >= cfg.updates_per_batch) {
    group.reset();
    group_has_work = false;
  }
  m.step = step;
  m.version = version;
  m.total_s = Seconds(t0, SteadyClock::now());
  if (Log().should_log(spdlog::level::debug)) {
    Log().debug(
        "update {} (version {}): loss {:.4f} reward {:.3f} tokens {} clip {:.3f} "
        "is_w {:.3f} mismatch {:.2e} grad {:.3f} {:.0f} ms",
        m.step, m.version, m.loss, m.reward_mean, m.tokens, m.clip_fraction, m.is_weight_mean,
        m.logprob_mismatch_max, m.grad_norm, 1e3 * m.total_s);
  }
  return m;
}

Result<StepMetrics> Learner::Step() {
  State& s = *state_;
  const auto t0 = SteadyClock::now();
  if (!s.PrepareGroup()) {
    MutexLock l(s.mu);
    return Unavailable("not enough fresh data for an update: {} of {} batches queued",
                       s.queue.size(), config_.batches_per_update);
  }
  Result<StepMetrics> r = Internal("update did not run");
  try {
    r = s.RunRlUpdate(t0);
  } catch (const c10::Error& e) {
    r = Internal("torch error during the update: {}", e.what_without_backtrace());
  } catch (const std::exception& e) {
    r = Internal("error during the update: {}", e.what());
  }
  if (!r.ok()) s.AbandonGroup(r.status());
  return r;
}

Result<StepMetrics> Learner::SupervisedStep(const Demonstrations& demos) {
  State& s = *state_;
  const auto t0 = SteadyClock::now();
  TROUPE_RETURN_IF_ERROR(ValidateDemonstrations(demos, s.limits));
  std::vector<SequenceView> views;
  int64_t total = 0;  // trained tokens (mask 1)
  const bool masked = !demos.loss_mask.empty();
  for (int64_t i = 0; i < demos.num_sequences(); ++i) {
    const int64_t p0 = demos.prompt_offsets[i], p1 = demos.prompt_offsets[i + 1];
    const int64_t r0 = demos.response_offsets[i], r1 = demos.response_offsets[i + 1];
    int64_t trained = r1 - r0;
    if (masked) {
      trained = 0;
      for (int64_t j = r0; j < r1; ++j) trained += demos.loss_mask[j];
    }
    if (trained == 0) continue;  // empty, or only environment tokens
    SequenceView v;
    v.prompt = demos.prompt_tokens.data() + p0;
    v.prompt_len = p1 - p0;
    v.response = demos.response_tokens.data() + r0;
    v.response_len = r1 - r0;
    v.mask = masked ? demos.loss_mask.data() + r0 : nullptr;  // tool turns are context, not targets
    v.flat_offset = r0;
    views.push_back(v);
    total += trained;
  }
  for (auto& v : views) v.token_weight = static_cast<float>(1.0 / static_cast<double>(total));

  StepMetrics m;
  m.kind = "supervised";
  m.lr = config_.supervised_lr;
  m.sequences = static_cast<int64_t>(views.size());
  m.tokens = total;
  double correct = 0;
  try {
    s.optimizer->zero_grad();
    for (const auto& rows : PlanMicroBatches(views, config_.micro_batch_tokens)) {
      PackedMicroBatch mb = ToDevice(PackMicroBatch(views, rows), s.device);
      auto tf = SteadyClock::now();
      TargetScores scores = ScoreTargets(*policy_, mb, 1.0, false, false, /*hits=*/true);
      const at::Tensor loss = -(scores.logprobs * mb.weights).sum();
      auto tb = SteadyClock::now();
      m.forward_s += Seconds(tf, tb);
      loss.backward();
      m.backward_s += Seconds(tb, SteadyClock::now());
      at::NoGradGuard no_grad;
      const at::Tensor hit = scores.hits * mb.mask;
      const at::Tensor sums = at::stack({loss.detach(), hit.sum()}).to(at::kDouble).cpu();
      m.loss += sums[0].item<double>();
      correct += sums[1].item<double>();
      m.padded_tokens += mb.rows * mb.length;
      ++m.micro_batches;
    }
    if (!std::isfinite(m.loss)) {
      s.optimizer->zero_grad();
      return Internal("non-finite supervised loss {}: optimizer step skipped", m.loss);
    }
    auto to = SteadyClock::now();
    m.grad_norm = s.ApplyGradients(config_.supervised_lr, config_.supervised_adam_eps);
    m.optimizer_s = Seconds(to, SteadyClock::now());
    if (!std::isfinite(m.grad_norm)) {
      s.optimizer->zero_grad();
      return Internal("non-finite gradient norm {} in the supervised step: optimizer step skipped",
                      m.grad_norm);
    }
  } catch (const c10::Error& e) {
    s.optimizer->zero_grad();
    return Internal("torch error during the supervised step: {}", e.what_without_backtrace());
  }
  m.pg_loss = 0;
  m.token_accuracy = total > 0 ? correct / static_cast<double>(total) : 0.0;
  MutexLock l(s.mu);
  ++s.version;
  ++s.step;
  ++s.counters.supervised_updates;
  m.step = s.step;
  m.version = s.version;
  m.total_s = Seconds(t0, SteadyClock::now());
  return m;
}

// ---------------------------------------------------------------- checkpoints

namespace {

nlohmann::json CountersToJson(const LearnerCounters& c) {
  nlohmann::json j;
  for (const auto& [name, value] : c.Stats()) j[name] = static_cast<uint64_t>(value);
  return j;
}

Status CountersFromJson(const nlohmann::json& j, LearnerCounters* c) {
  auto get = [&](const char* key, uint64_t* out) -> Status {
    if (!j.contains(key) || !j[key].is_number_unsigned()) {
      return Malformed("state.json: counters.{} missing or not an unsigned integer", key);
    }
    *out = j[key].get<uint64_t>();
    return Status::Ok();
  };
  TROUPE_RETURN_IF_ERROR(get("offered_batches", &c->offered_batches));
  TROUPE_RETURN_IF_ERROR(get("accepted_batches", &c->accepted_batches));
  TROUPE_RETURN_IF_ERROR(get("trained_batches", &c->trained_batches));
  TROUPE_RETURN_IF_ERROR(get("dropped_stale_batches", &c->dropped_stale_batches));
  TROUPE_RETURN_IF_ERROR(get("dropped_invalid_batches", &c->dropped_invalid_batches));
  TROUPE_RETURN_IF_ERROR(get("future_version_batches", &c->future_version_batches));
  TROUPE_RETURN_IF_ERROR(get("duplicate_batches", &c->duplicate_batches));
  TROUPE_RETURN_IF_ERROR(get("accepted_sequences", &c->accepted_sequences));
  TROUPE_RETURN_IF_ERROR(get("trained_sequences", &c->trained_sequences));
  TROUPE_RETURN_IF_ERROR(get("dropped_stale_sequences", &c->dropped_stale_sequences));
  TROUPE_RETURN_IF_ERROR(get("dropped_invalid_sequences", &c->dropped_invalid_sequences));
  TROUPE_RETURN_IF_ERROR(get("trained_tokens", &c->trained_tokens));
  // Added later: absent from older checkpoints (then 0).
  for (auto [key, out] : {std::pair{"skipped_batches", &c->skipped_batches},
                          std::pair{"skipped_sequences", &c->skipped_sequences}}) {
    if (j.contains(key)) TROUPE_RETURN_IF_ERROR(get(key, out));
  }
  TROUPE_RETURN_IF_ERROR(get("uniform_groups", &c->uniform_groups));
  TROUPE_RETURN_IF_ERROR(get("updates", &c->updates));
  TROUPE_RETURN_IF_ERROR(get("supervised_updates", &c->supervised_updates));
  c->queued_batches = 0;
  return Status::Ok();
}

// "2.6.0+cu124" -> "2.6": the part of a torch version that decides how optimizer.pt reads.
std::string MajorMinor(const std::string& version) {
  const size_t dot = version.find('.');
  if (dot == std::string::npos) return version;
  const size_t end = version.find_first_not_of("0123456789", dot + 1);
  return version.substr(0, end == std::string::npos ? version.size() : end);
}

// optimizer.pt is a torch archive whose layout is torch's own: 1.13 keys the state by the
// parameters' addresses in hex, 2.2+ parses decimal ones and would misassign a 1.13 archive
// without an error. So a checkpoint is read only by the torch major.minor that wrote it.
Status CheckTorchVersion(const nlohmann::json& j, const std::string& where) {
  std::string saved = kUnstampedTorchVersion;
  if (j.contains("torch_version")) {
    if (!j["torch_version"].is_string() || j["torch_version"].get<std::string>().empty()) {
      return Malformed("{}: 'torch_version' is not a version string", where);
    }
    saved = j["torch_version"].get<std::string>();
  }
  if (MajorMinor(saved) != MajorMinor(kTorchVersion)) {
    return InvalidArgument(
        "{}: the checkpoint was written by torch {} but this build uses torch {}; its optimizer "
        "state (optimizer.pt) cannot be read across torch versions. Resume with the torch that "
        "wrote it, or start a new run from its weights (warm_start.init_from)",
        where, saved, kTorchVersion);
  }
  return Status::Ok();
}

Status WriteBytes(const std::string& path, const void* data, size_t size) {
  return WriteFileAtomic(path, std::string_view(static_cast<const char*>(data), size));
}

}  // namespace

Result<std::string> Learner::SaveCheckpoint(const std::string& root, const CheckpointHooks& hooks,
                                            const std::map<std::string, std::string>& extra_files) {
  State& s = *state_;
  uint64_t version = 0, step = 0;
  LearnerCounters counters;
  {
    MutexLock l(s.mu);
    version = s.version;
    step = s.step;
    counters = s.counters;
  }
  TROUPE_ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(root, step));
  const std::map<std::string, std::string> meta = {{"troupe_version", std::to_string(version)},
                                                   {"troupe_step", std::to_string(step)}};
  const bool lora = policy_->config().lora.enabled();
  // A frozen LoRA base is written once: later checkpoints hard-link the same file (each
  // checkpoint stays a complete folder; rotation deletes links, never shared bytes).
  std::error_code link_error(1, std::generic_category());
  if (lora && !s.base_file.empty() && !base_trainable())
    std::filesystem::create_hard_link(s.base_file, w.File("model.safetensors"), link_error);
  if (link_error) {
    TROUPE_RETURN_IF_ERROR(engine::SaveModel(w.File("model.safetensors"), *policy_, meta));
  }
  hooks.Stage("model");
  if (lora) {
    TROUPE_RETURN_IF_ERROR(engine::SaveAdapter(w.File("adapter"), *policy_));
    hooks.Stage("adapter");
  }
  if (reference_) {
    TROUPE_RETURN_IF_ERROR(engine::WriteSafetensors(w.File("reference.safetensors"),
                                                    reference_->StateWeights(), meta));
    hooks.Stage("reference");
  }
  try {
    torch::serialize::OutputArchive archive;
    s.optimizer->save(archive);
    archive.save_to(w.File("optimizer.pt"));
  } catch (const c10::Error& e) {
    return IoError("cannot write {}: {}", w.File("optimizer.pt"), e.what_without_backtrace());
  }
  hooks.Stage("optimizer");
  at::Tensor rng;
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state().contiguous();
  }
  TROUPE_RETURN_IF_ERROR(WriteBytes(w.File("rng.bin"), rng.data_ptr(), rng.nbytes()));
  hooks.Stage("rng");
  nlohmann::json j;
  j["format"] = kFormat;
  j["torch_version"] = kTorchVersion;
  j["version"] = version;
  j["step"] = step;
  j["schedule_step"] = counters.updates;
  j["counters"] = CountersToJson(counters);
  j["model"] = policy_->config().ToString();
  j["has_reference"] = reference_ != nullptr;
  j["learner"] = {{"advantage", Name(config_.advantage)},
                  {"aggregation", Name(config_.aggregation)},
                  {"lr", config_.lr},
                  {"warmup_steps", config_.warmup_steps},
                  {"total_steps", config_.total_steps},
                  {"max_policy_lag", config_.effective_max_policy_lag()},
                  {"updates_per_batch", config_.updates_per_batch}};
  TROUPE_RETURN_IF_ERROR(WriteFileAtomic(w.File("state.json"), j.dump(2) + "\n"));
  hooks.Stage("state");
  for (const auto& [name, contents] : extra_files)
    TROUPE_RETURN_IF_ERROR(WriteFileAtomic(w.File(name), contents));
  if (!extra_files.empty()) hooks.Stage("extra");
  TROUPE_ASSIGN_OR_RETURN(std::string dir, w.Commit(config_.keep_checkpoints, hooks));
  if (lora && !base_trainable()) s.base_file = (std::filesystem::path(dir) / "model.safetensors").string();
  Log().info("checkpoint saved: {} (version {}, step {})", dir, version, step);
  return dir;
}

Status Learner::LoadCheckpoint(const std::string& path) {
  State& s = *state_;
  {
    MutexLock l(s.mu);
    if (!s.queue.empty() || s.group) {
      return InvalidArgument("LoadCheckpoint needs an idle learner: {} batches queued, {} in use",
                             s.queue.size(), s.group ? s.group->batches.size() : 0);
    }
  }
  TROUPE_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(path));
  namespace fs = std::filesystem;
  auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };

  // 1. Read and check everything; nothing changes yet.
  TROUPE_ASSIGN_OR_RETURN(const std::string state_text, ReadFile(file("state.json")));
  nlohmann::json j = nlohmann::json::parse(state_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Malformed("{}: not a JSON object", file("state.json"));
  }
  if (!j.contains("format") || j["format"] != kFormat) {
    return Malformed("{}: format is not '{}'", file("state.json"), kFormat);
  }
  for (const char* key : {"version", "step", "schedule_step"}) {
    if (!j.contains(key) || !j[key].is_number_unsigned()) {
      return Malformed("{}: '{}' missing or not an unsigned integer", file("state.json"), key);
    }
  }
  TROUPE_RETURN_IF_ERROR(CheckTorchVersion(j, file("state.json")));
  if (!j.contains("counters") || !j["counters"].is_object()) {
    return Malformed("{}: 'counters' missing", file("state.json"));
  }
  LearnerCounters counters;
  TROUPE_RETURN_IF_ERROR(
      CountersFromJson(j["counters"], &counters).WithContext(file("state.json")));
  counters.updates = j["schedule_step"].get<uint64_t>();
  TROUPE_ASSIGN_OR_RETURN(engine::SafetensorsFile model_file,
                          engine::ReadSafetensors(file("model.safetensors")));
  std::optional<engine::SafetensorsFile> ref_file;
  if (reference_ && fs::exists(file("reference.safetensors"))) {
    TROUPE_ASSIGN_OR_RETURN(ref_file, engine::ReadSafetensors(file("reference.safetensors")));
  }
  TROUPE_ASSIGN_OR_RETURN(const std::string rng_bytes, ReadFile(file("rng.bin")));
  const at::Tensor rng_now = at::detail::getDefaultCPUGenerator().get_state();
  if (static_cast<int64_t>(rng_bytes.size()) != rng_now.numel()) {
    return Malformed("{}: {} bytes, expected {}", file("rng.bin"), rng_bytes.size(),
                     rng_now.numel());
  }
  at::Tensor rng = at::empty({static_cast<int64_t>(rng_bytes.size())}, at::kByte);
  std::memcpy(rng.data_ptr(), rng_bytes.data(), rng_bytes.size());
  try {  // rejects corrupt states without touching the real generator
    at::make_generator<at::CPUGeneratorImpl>().set_state(rng);
  } catch (const c10::Error& e) {
    return Malformed("{}: {}", file("rng.bin"), e.what_without_backtrace());
  }
  std::unique_ptr<torch::optim::AdamW> optimizer = MakeOptimizer(config_, s.params);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(file("optimizer.pt"), s.device);  // a checkpoint may move devices
    optimizer->load(archive);
  } catch (const c10::Error& e) {
    return Malformed("{}: {}", file("optimizer.pt"), e.what_without_backtrace());
  }
  // The archive must describe these parameters (load() does not check shapes).
  for (const auto& group_opts : optimizer->param_groups()) {
    for (const auto& p : group_opts.params()) {
      auto it = optimizer->state().find(OptimizerStateKey(p));
      if (it == optimizer->state().end()) continue;
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      if (st.exp_avg().sizes() != p.sizes()) {
        return Malformed("{}: optimizer state of shape [{}] for a parameter of shape [{}]",
                         file("optimizer.pt"), fmt::join(st.exp_avg().sizes(), ","),
                         fmt::join(p.sizes(), ","));
      }
    }
  }

  // 2. Apply. LoadNamed changes nothing on failure; the reference is restored
  // if the policy then fails.
  engine::NamedTensors ref_before;
  if (ref_file) {
    UnshareBase(*reference_, *policy_);  // loading must not write into the policy's base
    for (auto& [name, t] : reference_->StateWeights()) ref_before.emplace_back(name, t.clone());
    TROUPE_RETURN_IF_ERROR(
        reference_->LoadNamed(ref_file->tensors).WithContext(file("reference.safetensors")));
  }
  engine::NamedTensors adapter_before;
  if (policy_->config().lora.enabled())
    for (auto& [name, t] : policy_->AdapterWeights()) adapter_before.emplace_back(name, t.clone());
  Status st = policy_->LoadNamed(model_file.tensors);
  if (st.ok() && policy_->config().lora.enabled()) {
    st = engine::LoadAdapter(file("adapter"), *policy_);
    if (!st.ok()) policy_->LoadNamed(adapter_before).IgnoreError();
  }
  if (!st.ok()) {
    if (ref_file) reference_->LoadNamed(ref_before).IgnoreError();
    return st.WithContext(file("model.safetensors"));
  }
  s.base_file.clear();
  if (reference_ && !ref_file) SnapshotReference();
  // The checkpoint's reference over the same frozen base: share it again.
  if (reference_ && ref_file && SameBase(*reference_, *policy_))
    ShareFrozenBase(*reference_, *policy_);
  s.optimizer = std::move(optimizer);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  {
    MutexLock l(s.mu);
    s.version = j["version"].get<uint64_t>();
    s.step = j["step"].get<uint64_t>();
    s.counters = counters;
  }
  Log().info("checkpoint loaded: {} (version {}, step {})", dir, j["version"].get<uint64_t>(),
             j["step"].get<uint64_t>());
  return Status::Ok();
}

}  // namespace troupe::trainer
