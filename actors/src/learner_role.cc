// The learner role.
//
//   reward-* ──ScoredBatch (reliable)──▶ [data socket] ──Offer──▶ trainer::Learner ──Step──▶
//   version+1 rollout-* ──Credit request──▶ [data socket] ──Credit grant──▶ rollout-*   (staleness
//   control) version+1 ──AsyncBroadcaster──▶ WeightSender ══gloo/zmq/shm/nccl══▶ rollout-* engines
//   every eval.every_steps: greedy held-out evaluation on a private engine ──Metrics──▶ head
//
// Acknowledgements: with checkpoint.ack = checkpoint a batch is acknowledged
// (or rejected) only once a checkpoint covers its effect, so a learner killed
// and restarted from that checkpoint sees every later batch again:
// exactly-once training end to end. With `trained` it is acknowledged as soon
// as its fate is known (faster acks, at-most-once across learner crashes).
//
// Every decision goes to the batch ledger (batch_ledger.h, <run>/batches.tsv);
// a checkpoint stores the ledger's size and this actor's state
// (actor_state.json) inside the checkpoint directory, so a restarted learner
// resumes from one consistent point: weights, optimizer, version line, KL
// reference, accounting, the ids of every batch it already decided (answered
// again with their fate, never trained twice) and its timers.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <cstdio>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "async_broadcaster.h"
#include "batch_codec.h"
#include "batch_ledger.h"
#include "credit_book.h"
#include "role_common.h"
#include "roles.h"
#include "rollout_sampler.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_name.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/safetensors.h"
#include "troupe/envs/episode_driver.h"
#include "troupe/envs/scorer.h"
#include "troupe/trainer/checkpoint.h"
#include "troupe/trainer/lag_gate.h"
#include "troupe/trainer/learner.h"
#include "troupe/transport/reliable.h"

namespace troupe::actors {
namespace {

spdlog::logger& Log() {
  return log::Get("learner");
}

struct EvalResult {
  uint64_t update = 0, version = 0;  // the RL update and policy version evaluated
  double accuracy = 0, reward = 0;
  int64_t prompts = 0;
  double seconds = 0;
  std::vector<std::string> examples;  // a few failures, for the log
};

class LearnerRole {
 public:
  LearnerRole(ActorRuntime& rt, transport::Network& net, JobContext& ctx)
      : rt_(rt), net_(net), ctx_(ctx), job_(ctx.job) {}
  Status Run();

 private:
  Status Setup();
  Status WarmStart();
  void ReclaimDepartedCredits();
  // Held-out evaluation of the current weights, waiting for it (start of RL, end of job):
  // StartEval, then its result.
  Result<EvalResult> Evaluate();
  // Periodic evaluation off the training thread: StartEval copies the current weights into
  // the eval engine, then generation and scoring run on their own thread (the other core)
  // while training goes on. CollectEval reports a finished one (waiting if `wait`); one at a
  // time. The report carries the update and version evaluated; elapsed_s is when it finished.
  Status StartEval();
  void CollectEval(bool wait);
  void ReportEval(const Result<EvalResult>& e);
  Result<EvalResult> RunEval(EvalResult r);
  Status EvaluateEpisodes(const envs::Task& task, uint64_t n, EvalResult* r);
  Result<std::vector<envs::VerifyResult>> ScoreEval(
      const envs::Task& task, const std::vector<envs::ScoreRequest>& requests);
  void HandleDelivery(transport::Delivery d);
  void HandleCredit(const std::string& peer, const transport::InMessage& m);
  void SendGrants();
  Status TrainStep();
  Status Checkpoint(const char* why);
  Status CheckpointIfAcksPile();
  void FaultStallCheckpoint(std::string_view stage);
  void ReleaseAcks(bool all_finished);
  void Report(const trainer::StepMetrics& m);
  void SendEval(const EvalResult& e);
  std::string SidecarJson(int64_t ledger_bytes) const;
  // Restores this actor's state from `ckpt_dir`; `gap_s` is the wall time
  // since that checkpoint when this is a crash restart (else -1).
  Status ReadSidecar(const std::string& ckpt_dir, int64_t* ledger_bytes, double* gap_s);
  Status Resume(const std::string& ckpt_dir);
  void Finish();
  uint64_t RlUpdates() const { return learner_->version() - rl_start_version_; }

  ActorRuntime& rt_;
  transport::Network& net_;
  JobContext& ctx_;
  const launcher::JobConfig& job_;
  std::shared_ptr<engine::LlamaModel> policy_;
  std::vector<std::pair<std::string, std::string>> hf_files_;  // config.json, tokenizer, ...
  std::unique_ptr<trainer::Learner> learner_;
  std::unique_ptr<engine::Engine> eval_engine_;
  std::unique_ptr<envs::RewardScorer> eval_scorer_;  // external services for held-out scoring
  // The evaluation in flight (StartEval); destroyed (joined) before the eval engine.
  std::future<Result<EvalResult>> pending_eval_;
  std::unique_ptr<transport::Socket> data_;
  std::unique_ptr<transport::ReliableReceiver> receiver_;
  std::unique_ptr<broadcast::WeightSender> sender_;
  std::unique_ptr<AsyncBroadcaster> broadcaster_;
  std::unique_ptr<CreditBook> credits_;
  int64_t stale_on_arrival_ = 0;  // sequences the per-group gate left out of accepted batches
  // Every sequence dropped as stale: whole batches (the trainer's gate) and groups left out.
  double DroppedStale(const trainer::LearnerCounters& c) const {
    return static_cast<double>(c.dropped_stale_sequences + stale_on_arrival_);
  }
  int64_t abandoned_groups_ = 0;  // granted groups rollout actors cut short as stale (freed)
  std::unique_ptr<BatchLedger> ledger_;  // opened by Run (fresh or resumed)
  // A sample of every update's accepted sequences -> head -> RUN/rollouts.jsonl (dashboard).
  RolloutSampler rollouts_{job_, ctx_.tokenizer.get(), DeriveSeed(job_.seed, "rollout-samples")};
  std::string ckpt_root_;
  Status fatal_;  // a failure that must end the role (ledger or checkpoint I/O)

  // Deliveries waiting for their acknowledgement, by batch id.
  struct Held {
    std::string id;      // batch id ("" when unreadable)
    std::string source;  // "<producer id>/<incarnation hex>" (BatchOrigin::Source)
    int64_t credited = 0;  // its groups the credit book had granted (consumed when decided)
    int64_t sequences = 0;
    bool decided = false;  // trained, skipped or dropped
    bool rejected = false;
    std::string fate;      // the ledger term once decided ("trained", "dropped_stale", ...)
    int64_t unscored = 0;  // sequences left out before training (no reward: on_failure drop)
    int64_t stale = 0;     // sequences of its groups too old on arrival, left out (per-group gate)
    std::string reason;
    // The batch's delivery, then copies of it that arrived before it was
    // answered (re-routed by a rollout actor after a reward actor was lost):
    // all get the one answer, so no producer counts the batch resolved before
    // the learner's decision is final (decided, and with ack = checkpoint,
    // covered by a checkpoint).
    std::vector<transport::Delivery> deliveries;
  };
  // Answers every delivery of `h` with its decision.
  void Answer(const Held& h) {
    for (const auto& d : h.deliveries) {
      if (h.rejected)
        receiver_->Reject(d, h.reason);
      else
        receiver_->Ack(d);
    }
  }
  // A batch decided on arrival (dropped): answered now, or with the next
  // checkpoint (ack = checkpoint).
  void Settle(Held h) {
    if (job_.checkpoint.ack == "checkpoint")
      decided_unacked_.push_back(std::move(h));
    else
      Answer(h);
  }
  // The first copy of batch `id` if it is not answered yet (undecided, or
  // decided and waiting for its checkpoint); null otherwise.
  Held* Unanswered(const std::string& id) {
    auto it = held_.find(id);
    if (it != held_.end()) return &it->second;
    for (Held& h : decided_unacked_)
      if (h.id == id) return &h;
    return nullptr;
  }
  // Records a decided batch in the ledger (unreadable ones have no id and
  // are counted apart). A ledger that cannot be written ends the role.
  void Decided(const Held& h) {
    if (h.id.empty()) return;
    Status s = ledger_->Record(h.id, h.source, h.fate, h.sequences, h.unscored, h.stale);
    if (!s.ok() && fatal_.ok()) fatal_ = s;
  }
  std::map<std::string, Held> held_;
  std::vector<Held> decided_unacked_;  // decided, waiting for a checkpoint (or the next ack)

  uint64_t rl_start_version_ = 0;
  double warm_accuracy_ = -1, best_accuracy_ = -1, last_accuracy_ = -1, time_to_target_ = -1;
  double rl_elapsed_before_ = 0;  // RL seconds of earlier incarnations (resume)
  uint32_t learner_restarts_ = 0;  // crash restarts of the learner in this job
  double restart_lost_s_ = 0;      // wall time from each crash's last checkpoint to its resume
  std::chrono::steady_clock::time_point rl_t0_;
  double train_seconds_ = 0;
  int64_t train_tokens_ = 0, received_response_tokens_ = 0;
  int64_t received_env_tokens_ = 0;  // received response tokens with loss mask 0
  uint64_t last_eval_update_ = 0, last_ckpt_update_ = 0;
  bool done_ = false;
  std::string done_reason_;
  uint64_t invalid_unreadable_ =
      0;  // scored batches the codec rejected (the trainer never saw them)
  uint64_t invalid_unreadable_seqs_ = 0;  // their sequences (as the envelope claims)
  uint64_t skipped_updates_ = 0;          // updates with no learning signal (every group uniform)
  uint64_t ack_checkpoints_ = 0;          // early checkpoints taken to release acks
  uint64_t redelivered_decided_ = 0;      // copies of batches the ledger had decided (answered)
  uint64_t copies_of_held_ = 0;           // copies of batches still waiting for their answer
  std::map<std::string, std::chrono::steady_clock::time_point>
      absent_since_;  // rollout actors holding grants, missing from the directory since
};

Result<std::shared_ptr<engine::LlamaModel>> InitialPolicy(const launcher::JobConfig& job) {
  if (job.warm_start.init_from.empty() && !job.model_from.empty()) {
    auto m = engine::LoadModel(job.model_from, job.model);  // a Hugging Face folder
    if (!m.ok()) return m.status().WithContext("model.from");
    return m;
  }
  if (job.warm_start.init_from.empty())
    return engine::LlamaModel::Create(job.model, DeriveSeed(job.seed, "policy-init"));
  auto path = trainer::ResolveWeightsFile(job.warm_start.init_from);
  if (!path.ok()) return path.status().WithContext("warm_start.init_from");
  auto m = engine::LoadModel(*path, job.model);
  if (!m.ok()) return m.status().WithContext("warm_start.init_from");
  return m;
}

// The learner's device (trainer.device): the model as loaded (on the CPU), copied onto it.
Result<std::shared_ptr<engine::LlamaModel>> PlaceOnDevice(std::shared_ptr<engine::LlamaModel> m,
                                                         const std::string& device) {
  TROUPE_ASSIGN_OR_RETURN(const torch::Device dev, engine::UsableDevice("trainer.device", device));
  if (dev == m->device()) return m;
  auto on = std::make_shared<engine::LlamaModel>(m->config(), engine::LlamaModel::Uninitialized{},
                                                 dev);
  TROUPE_RETURN_IF_ERROR(on->LoadNamed(m->StateWeights()).WithContext("trainer.device"));
  return on;
}

Status LearnerRole::Setup() {
  TROUPE_ASSIGN_OR_RETURN(auto initial, InitialPolicy(job_));
  TROUPE_ASSIGN_OR_RETURN(policy_, PlaceOnDevice(std::move(initial), job_.trainer.device));
  if (!job_.warm_start.init_from.empty())
    Log().info("policy starts from {}", job_.warm_start.init_from);
  else if (!job_.model_from.empty())
    Log().info("policy starts from the Hugging Face folder {}", job_.model_from);
  // A checkpoint is a complete Hugging Face folder: these files go next to its weights.
  TROUPE_ASSIGN_OR_RETURN(hf_files_, launcher::HfCompanionFiles(job_, *ctx_.tokenizer));
  std::shared_ptr<engine::LlamaModel> reference;
  if (job_.trainer.kl_coef > 0) {
    // The frozen reference of the KL penalty: the policy after the warm start
    // (WarmStart() snapshots it, also when only init_from is set), or the
    // checkpoint's reference on a resume; the seeded init is a placeholder.
    TROUPE_ASSIGN_OR_RETURN(reference,
                            engine::LlamaModel::Create(job_.model,
                                                       DeriveSeed(job_.seed, "policy-init"),
                                                       policy_->device()));
  }
  TROUPE_ASSIGN_OR_RETURN(learner_, trainer::Learner::Create(job_.trainer, policy_, reference));
  engine::EngineConfig ec;
  ec.model = job_.model;
  ec.num_slots = std::max<int32_t>(8, std::min<int32_t>(256, job_.engine.num_slots * 2));
  ec.intra_op_threads = job_.engine.intra_op_threads;
  ec.device = job_.engine.device;
  ec.fused_cpu_kernels = job_.engine.fused_cpu_kernels;
  ec.lora_merged = job_.engine.lora_merged;
  TROUPE_ASSIGN_OR_RETURN(eval_engine_, engine::Engine::Create(ec));

  transport::SocketOptions so;
  so.linger_ms = 0;
  TROUPE_ASSIGN_OR_RETURN(data_, net_.Bind(transport::SocketKind::kServer, ctx_.AnyPort(), so));
  receiver_ = std::make_unique<transport::ReliableReceiver>(data_.get());

  broadcast::BroadcastConfig bc = job_.broadcast;
  bc.control_endpoint = ctx_.AnyPort();
  bc.store_host = ctx_.bind_host;
  bc.gloo_hostname = ctx_.bind_host;
  bc.actor_id = rt_.options().actor_id;
  bc.adapters = AdapterLayoutOf(job_.model);  // receivers that cannot apply them are refused
  TROUPE_ASSIGN_OR_RETURN(sender_, broadcast::WeightSender::Create(bc, net_));
  broadcaster_ = std::make_unique<AsyncBroadcaster>(sender_.get());

  credits_ =
      std::make_unique<CreditBook>(job_.trainer.effective_max_policy_lag(),
                                   job_.batch.prompts_per_update, job_.batch.groups_per_message,
                                   net_.identity().incarnation, job_.trainer.updates_per_batch);
  ckpt_root_ = ctx_.run_dir + "/checkpoints";
  rt_.AddEndpoint("data", data_->endpoint());
  rt_.AddEndpoint("weights", sender_->endpoint());
  return Status::Ok();
}

// ---------------------------------------------------------------- evaluation

Result<EvalResult> LearnerRole::Evaluate() {
  TROUPE_RETURN_IF_ERROR(StartEval());
  Result<EvalResult> r = pending_eval_.get();
  return r;
}

Status LearnerRole::StartEval() {
  CollectEval(/*wait=*/true);
  auto t0 = std::chrono::steady_clock::now();
  // The copy is taken here, on the training thread, before the next update changes them.
  TROUPE_RETURN_IF_ERROR(eval_engine_->UpdateWeights(learner_->version(), learner_->StateWeights(),
                                                     Deadline::InMs(30000)));
  EvalResult r;
  r.update = RlUpdates();
  r.version = learner_->version();
  pending_eval_ = std::async(std::launch::async, [this, r, t0]() -> Result<EvalResult> {
    SetThreadName("eval");
    TROUPE_ASSIGN_OR_RETURN(EvalResult done, RunEval(r));
    done.seconds = SecondsSince(t0);
    return done;
  });
  return Status::Ok();
}

void LearnerRole::CollectEval(bool wait) {
  if (!pending_eval_.valid()) return;
  if (!wait && pending_eval_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return;
  ReportEval(pending_eval_.get());
}

void LearnerRole::ReportEval(const Result<EvalResult>& e) {
  if (!e.ok()) {
    Log().error("evaluation failed: {}", e.status().ToString());
    return;
  }
  SendEval(*e);
  if (job_.stop.target_accuracy > 0 && e->accuracy >= job_.stop.target_accuracy && !done_) {
    done_ = true;
    done_reason_ = fmt::format("held-out accuracy {:.3f} reached the target {:.3f} (update {})",
                               e->accuracy, job_.stop.target_accuracy, e->update);
  }
}

// Generates and scores the held-out prompts on the eval engine (weights already loaded).
// Touches only the eval engine, the scorer and read-only job state: safe off the training
// thread, one evaluation at a time.
Result<EvalResult> LearnerRole::RunEval(EvalResult r) {
  for (const envs::Task* task : ctx_.task_list) {
    uint64_t n = task->size(envs::Split::kEval);
    if (job_.eval.prompts > 0) n = std::min<uint64_t>(n, job_.eval.prompts);
    if (task->multi_turn()) {
      TROUPE_RETURN_IF_ERROR(EvaluateEpisodes(*task, n, &r));
      continue;
    }
    std::vector<engine::GenerateRequest> reqs;
    std::vector<envs::Prompt> prompts;
    for (uint64_t i = 0; i < n; ++i) {
      envs::Prompt p = task->GetPrompt(envs::Split::kEval, i);
      auto ids = ctx_.renderer->RenderPrompt(p.messages);
      if (!ids.ok()) return ids.status().WithContext("eval prompt " + p.id);
      engine::GenerateRequest q;
      q.prompt = std::move(ids).value();
      q.sampling.temperature = 0;  // greedy
      q.sampling.max_new_tokens =
          job_.eval.max_new_tokens > 0 ? job_.eval.max_new_tokens : job_.sampling.max_new_tokens;
      q.sampling.stop_token_ids = ctx_.stop_ids;
      q.tag = i;
      reqs.push_back(std::move(q));
      prompts.push_back(std::move(p));
    }
    TROUPE_ASSIGN_OR_RETURN(auto results, eval_engine_->Generate(reqs, Deadline::InMs(120000)));
    TROUPE_RETURN_IF_ERROR(engine::CheckNoRejections(results));
    std::vector<envs::ScoreRequest> score;
    for (const auto& res : results) {
      std::vector<int32_t> ids;
      for (int32_t id : res.response_ids)
        if (!ctx_.tokenizer->IsSpecial(id)) ids.push_back(id);
      auto text = ctx_.tokenizer->Decode(ids);
      const envs::Prompt& p = prompts[res.request_index];
      score.push_back({task->name(), ctx_.renderer->PromptText(p.messages), text.ok() ? *text : "",
                       p.reference, p.service, p.metadata});
    }
    TROUPE_ASSIGN_OR_RETURN(auto scores, ScoreEval(*task, score));
    for (size_t i = 0; i < score.size(); ++i) {
      const envs::VerifyResult& v = scores[i];
      if (v.reward < 1.0 - 1e-9 && r.examples.size() < 3) {
        r.examples.push_back(fmt::format("'{}' -> '{}' (expected '{}'){}", score[i].prompt,
                                         score[i].response, score[i].reference,
                                         v.failure.empty() ? "" : ": " + v.failure));
      }
      r.reward += v.reward;
      r.accuracy += v.reward >= 1.0 - 1e-9 ? 1.0 : 0.0;
      r.prompts++;
    }
  }
  if (r.prompts > 0) {
    r.accuracy /= static_cast<double>(r.prompts);
    r.reward /= static_cast<double>(r.prompts);
  }
  return r;
}

// Scores held-out samples as the reward actors would: the task's verifier, or
// its external reward service (a failed call scores 0, its reason in the log).
Result<std::vector<envs::VerifyResult>> LearnerRole::ScoreEval(
    const envs::Task& task, const std::vector<envs::ScoreRequest>& requests) {
  if (task.local_verifier()) {
    std::vector<envs::VerifyResult> out;
    for (const auto& q : requests)
      out.push_back(task.Verify({q.prompt, q.response, q.reference, q.metadata}));
    return out;
  }
  if (!eval_scorer_) {
    TROUPE_ASSIGN_OR_RETURN(eval_scorer_,
                            envs::RewardScorer::Create(job_.tasks, job_.reward_services));
  }
  return eval_scorer_->ScoreBatch(requests, Deadline::InMs(job_.reward_settings.score_timeout_ms));
}

// Held-out multi-turn prompts play whole episodes on the eval engine (greedy);
// the task's Verify reads the score each episode recorded.
Status LearnerRole::EvaluateEpisodes(const envs::Task& task, uint64_t n, EvalResult* r) {
  envs::EpisodeDriverConfig dc;
  dc.episode = job_.episode;
  dc.sampling.temperature = 0;  // greedy
  envs::EpisodeDriver driver(*eval_engine_, *ctx_.renderer, dc);
  std::vector<envs::EpisodeRequest> reqs;
  for (uint64_t i = 0; i < n; ++i) {
    envs::EpisodeRequest q;
    q.task = &task;
    q.prompt = task.GetPrompt(envs::Split::kEval, i);
    q.tag = i;
    reqs.push_back(std::move(q));
  }
  auto outcomes = driver.Run(std::move(reqs), Deadline::InMs(120000));
  std::vector<envs::ScoreRequest> score;
  for (const auto& o : outcomes) {
    if (o.status.ok() && o.episode) {
      const envs::TokenEpisode& e = *o.episode;
      score.push_back({task.name(), e.prompt_text(), e.response_text(),
                       e.episode().prompt().reference, e.episode().prompt().service,
                       e.episode().SummaryJson()});
    }
  }
  TROUPE_ASSIGN_OR_RETURN(auto scores, ScoreEval(task, score));
  size_t next = 0;
  for (const auto& o : outcomes) {
    if (!o.status.ok() || !o.episode) {
      // Counted as a miss (reward 0): the held-out set keeps its size.
      if (r->examples.size() < 3)
        r->examples.push_back(fmt::format("{}: episode did not start: {}",
                                          task.GetPrompt(envs::Split::kEval, o.tag).id,
                                          o.status.ToString()));
      r->prompts++;
      continue;
    }
    const envs::TokenEpisode& e = *o.episode;
    // An aborted episode (eval deadline, engine rejection) scores 0 like any
    // unfinished one; its reason shows in the example below.
    const envs::VerifyResult& v = scores[next++];
    if (v.reward < 1.0 - 1e-9 && r->examples.size() < 3) {
      std::string text = e.response_text();
      for (char& c : text)
        if (c == '\n') c = '|';
      r->examples.push_back(
          fmt::format("{} ({}{}, {} turns) -> '{}' (expected '{}')", e.episode().prompt().id,
                      envs::EpisodeEndName(e.episode().end()),
                      e.episode().abort_reason().empty() ? "" : ": " + e.episode().abort_reason(),
                      e.episode().turns(), text, e.episode().prompt().reference));
    }
    r->reward += v.reward;
    r->accuracy += v.reward >= 1.0 - 1e-9 ? 1.0 : 0.0;
    r->prompts++;
  }
  return Status::Ok();
}

void LearnerRole::SendEval(const EvalResult& e) {
  double elapsed = rl_elapsed_before_ + SecondsSince(rl_t0_);
  last_accuracy_ = e.accuracy;
  best_accuracy_ = std::max(best_accuracy_, e.accuracy);
  if (job_.stop.target_accuracy > 0 && time_to_target_ < 0 &&
      e.accuracy >= job_.stop.target_accuracy) {
    time_to_target_ = elapsed;
  }
  rt_.SendMetrics("eval", e.update, e.version,
                  {{"eval_accuracy", e.accuracy},
                   {"eval_reward", e.reward},
                   {"eval_prompts", static_cast<double>(e.prompts)},
                   {"eval_seconds", e.seconds},
                   {"elapsed_s", elapsed}});
  Log().info("eval at update {}: accuracy {:.3f}, reward {:.3f} ({} prompts, {:.0f} ms)",
             e.update, e.accuracy, e.reward, e.prompts, e.seconds * 1e3);
  for (const auto& ex : e.examples) Log().info("  eval miss: {}", ex);
}

// ---------------------------------------------------------------- warm start

Status LearnerRole::WarmStart() {
  // Nothing to do (and nothing to report) for a seeded init without supervised steps.
  if (job_.warm_start.steps == 0 && job_.warm_start.init_from.empty() && job_.model_from.empty())
    return Status::Ok();
  auto t0 = std::chrono::steady_clock::now();
  const bool full_then_lora = job_.model.lora.enabled() && job_.model.lora.warm_start_full &&
                              job_.warm_start.steps > 0;
  if (full_then_lora) TROUPE_RETURN_IF_ERROR(learner_->SetBaseTrainable(true));
  uint64_t index = DeriveSeed(job_.seed, "warm-start") % (uint64_t{1} << 40);
  for (uint32_t step = 0; step < job_.warm_start.steps; ++step) {
    if (rt_.should_exit()) return Cancelled("warm start interrupted");
    trainer::Demonstrations demos;
    for (uint32_t i = 0; i < job_.warm_start.batch_size; ++i) {
      const envs::Task* task =
          ctx_.task_list[(step * job_.warm_start.batch_size + i) % ctx_.task_list.size()];
      envs::Prompt p = task->GetPrompt(envs::Split::kTrain, index++);
      auto demo = task->Demonstration(p);
      if (!demo.ok()) return demo.status().WithContext("warm start demonstration for " + p.id);
      TROUPE_ASSIGN_OR_RETURN(auto seq, ctx_.renderer->RenderConversation(p.messages, *demo));
      // Multi-turn demonstrations carry tool turns: mask 0, never trained on.
      demos.Add(seq.prompt_tokens, seq.response_tokens, seq.loss_mask);
    }
    auto m = learner_->SupervisedStep(demos);
    if (!m.ok()) return m.status().WithContext("warm start step " + std::to_string(step));
    if ((step + 1) % 25 == 0 || step + 1 == job_.warm_start.steps) {
      Log().info("warm start {}/{}: loss {:.4f}, token accuracy {:.3f}", step + 1,
                 job_.warm_start.steps, m->loss, m->token_accuracy);
    }
  }
  double seconds = SecondsSince(t0);
  if (full_then_lora) {
    TROUPE_RETURN_IF_ERROR(learner_->SetBaseTrainable(false));  // RL trains the adapter only
    Log().info("warm start trained the full model; the base is frozen from here on");
  }
  learner_->SnapshotReference();  // the KL anchor (if any) is the warm-started policy
  if (job_.trainer.reset_optimizer_for_rl) learner_->ResetOptimizer();
  TROUPE_ASSIGN_OR_RETURN(EvalResult e, Evaluate());
  warm_accuracy_ = e.accuracy;
  rt_.SendMetrics("warm_start", 0, learner_->version(),
                  {{"steps", static_cast<double>(job_.warm_start.steps)},
                   {"seconds", seconds},
                   {"eval_accuracy", e.accuracy},
                   {"eval_reward", e.reward}});
  Log().info("warm start done in {:.1f} s: held-out accuracy {:.3f}", seconds, e.accuracy);
  return Status::Ok();
}

// ---------------------------------------------------------------- data

void LearnerRole::HandleCredit(const std::string& peer, const transport::InMessage& m) {
  auto c = m.envelope().getBody().getCredit();
  if (int64_t back = credits_->SeenIncarnation(peer, m.incarnation()))
    Log().info("credits: {} restarted; {} groups granted to its previous process reclaimed", peer,
               back);
  if (c.getReturned() > 0) {
    credits_->Return(peer, c.getReturned());
    Log().info("credits: {} is draining; {} groups granted to it and not started returned", peer,
               c.getReturned());
  } else {
    // Groups it cut short as stale free their capacity (before the request, which they grew).
    abandoned_groups_ += credits_->Abandoned(peer, c.getAbandonedLearner(), c.getAbandoned());
    credits_->Request(peer, c.getRequested(), static_cast<int64_t>(c.getGrantsSeen()));
  }
  SendGrants();
}

// Grants held by rollout actors that left the job (drained by a scale-down,
// or gone for good) go back to the pool once the actor has been absent from
// the head's directory for a few seconds (its last batches had time to land).
void LearnerRole::ReclaimDepartedCredits() {
  auto dir = rt_.directory();
  if (dir.epoch == 0) return;  // no directory yet: nothing is known to be gone
  const auto now = std::chrono::steady_clock::now();
  for (const std::string& peer : credits_->PeersWithOutstanding()) {
    if (dir.Find(peer)) {
      absent_since_.erase(peer);
      continue;
    }
    auto it = absent_since_.emplace(peer, now).first;
    if (now - it->second < std::chrono::seconds(3)) continue;
    int64_t back = credits_->Reclaim(peer);
    absent_since_.erase(it);
    Log().info("credits: {} left the job; {} groups granted to it and never delivered reclaimed",
               peer, back);
    SendGrants();
  }
}

void LearnerRole::SendGrants() {
  for (auto& [peer, g] : credits_->Grant()) {
    transport::OutMessage out;
    auto c = out.envelope().getBody().initCredit();
    c.setGranted(static_cast<uint32_t>(g));
    c.setLearnerVersion(learner_->version());
    Status s = data_->SendTo(peer, out, Deadline::InMs(100));
    if (!s.ok()) {
      // The rollout actor is gone or restarting: take the grant back.
      credits_->Undo(peer, g);
      Log().debug("credit grant to {} failed: {}", peer, s.ToString());
    }
  }
}

void LearnerRole::HandleDelivery(transport::Delivery d) {
  const auto& m = d.message;
  if (m.kind() == transport::MessageKind::CREDIT) {
    HandleCredit(d.peer, m);
    return;
  }
  if (m.kind() != transport::MessageKind::SCORED_BATCH) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "ignoring a {} message from {}",
                        transport::KindName(m.kind()), d.peer);
    if (d.sequenced())
      receiver_->Reject(d, "the learner only accepts scoredBatch and credit messages");
    return;
  }
  BatchOrigin origin;
  std::vector<uint8_t> unscored;
  auto batch = ReadTrainBatch(m, &origin, &unscored);
  const std::string& producer = origin.producer;
  int64_t groups = 0;
  if (batch.ok()) {
    std::set<uint32_t> gs(batch->group_index.begin(), batch->group_index.end());
    groups = gs.empty() ? batch->num_sequences() / std::max<int64_t>(1, batch->group_size)
                        : static_cast<int64_t>(gs.size());
  }
  if (!batch.ok()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "rejecting a scored batch from {}: {}",
                        d.peer, batch.status().ToString());
    // Unreadable: counted here (the trainer never saw it).
    invalid_unreadable_++;
    invalid_unreadable_seqs_ +=
        m.envelope().getBody().getScoredBatch().getRollout().getNumSequences();
    Held h;
    h.decided = h.rejected = true;
    h.reason = batch.status().ToString();
    h.deliveries.push_back(std::move(d));
    Settle(std::move(h));
    return;
  }
  std::string id = batch->batch_id;
  const int64_t sequences = batch->num_sequences();
  const std::string source = origin.Source();
  // A copy of a batch (re-routed after a reward actor died, or re-sent to a
  // restarted learner): answered with the first copy when that is answered,
  // or now with the fate the ledger recorded. Never offered again.
  if (Held* first = Unanswered(id)) {
    ++copies_of_held_;
    first->deliveries.push_back(std::move(d));
    return;
  }
  if (const BatchLedger::Entry* e = ledger_->Find(id)) {
    ++redelivered_decided_;
    if (e->fate == "dropped_stale" || e->fate == "dropped_invalid")
      receiver_->Reject(d, fmt::format("batch '{}' was decided before: {}", id, e->fate));
    else
      receiver_->Ack(d);
    return;
  }
  // Only groups this learner process granted free credit capacity when decided.
  const int64_t credited =
      credits_->Received(producer, origin.incarnation, origin.grant_learner,
                         std::min<int64_t>(groups, origin.granted_groups));
  received_response_tokens_ += batch->num_response_tokens();
  for (uint8_t m : batch->loss_mask) received_env_tokens_ += m == 0;  // multi-turn tool tokens
  // Samples whose reward service failed with on_failure: drop never reach the
  // trainer (their group's baseline is computed without them).
  const int64_t n_unscored = batch->RemoveSequences(unscored);
  if (n_unscored > 0 && batch->num_sequences() == 0) {
    Held h{id, source, credited, n_unscored};
    h.decided = true;
    h.fate = "dropped_unscored";
    h.reason = "no sample of the batch could be scored (on_failure: drop)";
    credits_->Consumed(h.credited);
    h.deliveries.push_back(std::move(d));
    Decided(h);
    Settle(std::move(h));
    SendGrants();
    return;
  }
  // The per-group lag gate: a message carries its oldest group's version, and the groups of
  // it that are too old are left out (dropped_stale) rather than taking the fresh ones beside
  // them down. All too old: the whole-batch gate below drops it.
  const int64_t n_stale = trainer::RemoveStaleSequences(
      &*batch, trainer::LagGate(job_.trainer.effective_max_policy_lag()), learner_->version());
  if (n_stale > 0) {
    stale_on_arrival_ += n_stale;
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::info, 5000,
                        "batch {} from {}: left out {} of its sequences, whose groups are more "
                        "than {} versions older than the learner's {} (the rest is fresh enough)",
                        id, producer, n_stale, job_.trainer.effective_max_policy_lag(),
                        learner_->version());
  }
  // Started under an earlier learner process's grants with a version this
  // process never made (it resumed from an older checkpoint and the versions
  // after it were lost with the old process): too old in effect, not a
  // protocol error. A future version granted by this process still is one.
  const uint64_t self = net_.identity().incarnation;
  Result<trainer::Admission> adm =
      origin.grant_learner != self && batch->policy_version > learner_->version()
          ? Result<trainer::Admission>(Stale(
                "batch policy version {} was made by an earlier learner process; this one "
                "resumed at version {} (later versions were lost with that process)",
                batch->policy_version, learner_->version()))
          : learner_->Offer(std::move(batch).value());
  Held h{id, source, credited, sequences - n_unscored - n_stale};
  h.unscored = n_unscored;
  h.stale = n_stale;
  if (adm.ok()) {
    // Sampled for the update that will train it (a burst arriving while the learner steps
    // feeds the updates after the next one); queued_batches counts this batch.
    rollouts_.Offer(rt_, m, learner_->version(),
                    UpdateThatTrains(RlUpdates(), adm->queued_batches,
                                     static_cast<uint64_t>(job_.trainer.batches_per_update)));
    h.deliveries.push_back(std::move(d));
    held_[id] = std::move(h);
    return;
  }
  const Status& s = adm.status();
  if (s.code() == Code::kAlreadyExists) {
    // Offered before by this process but neither held nor in the ledger:
    // cannot happen (the ledger records every decision); answer it anyway.
    Log().error("batch {} offered twice but not in the ledger", id);
    receiver_->Ack(d);
    return;
  }
  credits_->Consumed(h.credited);
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "batch {} from {} dropped: {}", id,
                      producer, s.ToString());
  h.decided = h.rejected = true;
  h.fate = trainer::BatchFateName(trainer::FateOfRefusal(s));
  h.reason = s.ToString();
  h.deliveries.push_back(std::move(d));
  Decided(h);
  Settle(std::move(h));
  SendGrants();
}

// Batches whose fate the trainer decided (trained through all updates, or
// dropped stale after acceptance) move to the decided list; acknowledged now
// (ack = trained) or at the next checkpoint.
void LearnerRole::ReleaseAcks(bool checkpointed) {
  for (const auto& f : learner_->TakeFinishedBatches()) {
    auto it = held_.find(f.batch_id);
    if (it == held_.end()) continue;
    Held h = std::move(it->second);
    held_.erase(it);
    h.decided = true;
    h.rejected = !f.accepted();
    h.fate = trainer::BatchFateName(f.fate);
    h.sequences = f.sequences;
    h.reason = f.reason;
    credits_->Consumed(h.credited);
    Decided(h);
    decided_unacked_.push_back(std::move(h));
  }
  if (job_.checkpoint.ack == "trained" || checkpointed) {
    for (const auto& h : decided_unacked_) Answer(h);
    decided_unacked_.clear();
    receiver_->FlushAcks(Deadline::InMs(200)).IgnoreError();
  }
}

// ---------------------------------------------------------------- training

void LearnerRole::Report(const trainer::StepMetrics& m) {
  std::map<std::string, double> s;
  for (const auto& [k, v] : m.Stats()) s[k] = v;
  double lag_sum = 0, lag_n = 0, lag_max = 0;
  for (size_t k = 0; k < m.lag_histogram.size(); ++k) {
    lag_sum += static_cast<double>(k) * m.lag_histogram[k];
    lag_n += m.lag_histogram[k];
    if (m.lag_histogram[k] > 0) lag_max = static_cast<double>(k);
  }
  s["lag_mean"] = lag_n > 0 ? lag_sum / lag_n : 0;
  s["lag_max"] = lag_max;
  double elapsed = rl_elapsed_before_ + SecondsSince(rl_t0_);
  s["elapsed_s"] = elapsed;
  s["max_steps"] = static_cast<double>(job_.stop.max_steps);
  s["train_tokens_per_s"] = m.tokens_per_s();
  s["received_tokens_per_s"] = elapsed > 0 ? received_response_tokens_ / elapsed : 0;
  s["received_response_tokens"] = static_cast<double>(received_response_tokens_);
  s["received_env_tokens"] = static_cast<double>(received_env_tokens_);
  s["broadcast_s"] = broadcaster_->last_seconds();
  // Stream bytes of the last finished broadcast (LoRA: the adapters once the base went).
  s["broadcast_bytes"] = static_cast<double>(sender_->last_report().payload_bytes);
  s["broadcast_version"] = static_cast<double>(sender_->last_report().version);
  nlohmann::json extra;
  extra["lag_histogram"] = m.lag_histogram;
  extra["group_rewards"] = m.group_rewards;  // (TensorBoard histograms)
  extra["is_weight_histogram"] = {{"edges", trainer::IsWeightEdges()}, {"counts", m.is_weight_histogram}};
  rt_.SendMetrics("train", RlUpdates(), m.version, s, extra.dump());
  rt_.SetStat("train_tokens_per_s", m.tokens_per_s());
  rt_.SetPolicyVersion(learner_->version());
}

Status LearnerRole::TrainStep() {
  auto m = learner_->Step();
  if (!m.ok()) {
    // No update, but batches were decided: the ones it dropped as stale (kUnavailable: too few
    // fresh ones left) or abandoned with a failed update. Their credits come back now, or with
    // the whole window granted no rollout actor could start a group, nothing would refill the
    // queue, and the job would stall (it did after a learner restart with credit_reserve 16).
    ReleaseAcks(false);
    SendGrants();
    TROUPE_RETURN_IF_ERROR(CheckpointIfAcksPile());
    if (m.status().code() == Code::kUnavailable) return Status::Ok();  // wait for more
    Log().error("update failed: {}", m.status().ToString());
    return Status::Ok();  // the batches are counted invalid; keep serving
  }
  if (m->tokens > 0) {
    train_seconds_ += m->total_s;
    train_tokens_ += m->padded_tokens;
    broadcaster_->Publish(learner_->version(), learner_->BroadcastWeights());
    Report(*m);
  } else {
    ++skipped_updates_;
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                        "update skipped: every group in it had uniform rewards, so there is no "
                        "learning signal ({} skipped so far; the version stays {})",
                        skipped_updates_, learner_->version());
  }
  ReleaseAcks(false);
  SendGrants();
  uint64_t u = RlUpdates();
  if (job_.eval.every_steps > 0 && u >= last_eval_update_ + job_.eval.every_steps) {
    last_eval_update_ = u;
    Status st = StartEval();
    if (!st.ok()) Log().error("evaluation failed: {}", st.ToString());
  }
  if (job_.checkpoint.every_steps > 0 && u >= last_ckpt_update_ + job_.checkpoint.every_steps) {
    TROUPE_RETURN_IF_ERROR(Checkpoint("periodic"));
  }
  TROUPE_RETURN_IF_ERROR(CheckpointIfAcksPile());
  // Skipped updates count toward stop.max_steps: a policy that collapsed to
  // uniform rewards must not run forever.
  if (u + skipped_updates_ >= job_.stop.max_steps) {
    done_ = true;
    done_reason_ = skipped_updates_ == 0
                       ? fmt::format("reached stop.max_steps = {}", job_.stop.max_steps)
                       : fmt::format("reached stop.max_steps = {} ({} updates, {} skipped)",
                                     job_.stop.max_steps, u, skipped_updates_);
  }
  if (job_.stop.max_seconds > 0 &&
      rl_elapsed_before_ + SecondsSince(rl_t0_) >= job_.stop.max_seconds) {
    done_ = true;
    done_reason_ = fmt::format("reached stop.max_seconds = {}", job_.stop.max_seconds);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- checkpoints

std::string LearnerRole::SidecarJson(int64_t ledger_bytes) const {
  nlohmann::json j;
  j["rl_start_version"] = rl_start_version_;
  j["warm_accuracy"] = warm_accuracy_;
  j["best_accuracy"] = best_accuracy_;
  j["last_accuracy"] = last_accuracy_;
  j["time_to_target"] = time_to_target_;
  j["rl_elapsed"] = rl_elapsed_before_ + SecondsSince(rl_t0_);
  j["saved_unix_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  j["learner_restarts"] = learner_restarts_;
  j["restart_lost_s"] = restart_lost_s_;
  j["skipped_updates"] = skipped_updates_;
  // Throughput figures of the whole job (the summary's tok/s).
  j["received_response_tokens"] = received_response_tokens_;
  j["received_env_tokens"] = received_env_tokens_;
  j["train_tokens"] = train_tokens_;
  j["train_seconds"] = train_seconds_;
  j["invalid_unreadable"] = invalid_unreadable_;
  j["invalid_unreadable_seqs"] = invalid_unreadable_seqs_;
  // Deliveries are deduplicated by batch id through the ledger, not by the
  // reliable receiver's stream state: senders open a fresh stream to a
  // restarted learner (a new peer), so restoring sequence numbers would turn
  // its first messages into "duplicates" and lose them.
  j["ledger_bytes"] = ledger_bytes;
  return j.dump(2) + "\n";
}

Status LearnerRole::ReadSidecar(const std::string& dir, int64_t* ledger_bytes, double* gap_s) {
  *gap_s = -1;
  const std::string path = dir + "/actor_state.json";
  TROUPE_ASSIGN_OR_RETURN(std::string text, trainer::ReadFile(path));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ledger_bytes") ||
      !j["ledger_bytes"].is_number_integer())
    return Malformed("{}: not a learner state (a JSON object with ledger_bytes)", path);
  try {
    rl_start_version_ = j.value("rl_start_version", uint64_t{0});
    warm_accuracy_ = j.value("warm_accuracy", -1.0);
    best_accuracy_ = j.value("best_accuracy", -1.0);
    last_accuracy_ = j.value("last_accuracy", -1.0);
    time_to_target_ = j.value("time_to_target", -1.0);
    rl_elapsed_before_ = j.value("rl_elapsed", 0.0);
    learner_restarts_ = j.value("learner_restarts", uint32_t{0});
    restart_lost_s_ = j.value("restart_lost_s", 0.0);
    skipped_updates_ = j.value("skipped_updates", uint64_t{0});
    received_response_tokens_ = j.value("received_response_tokens", int64_t{0});
    received_env_tokens_ = j.value("received_env_tokens", int64_t{0});
    train_tokens_ = j.value("train_tokens", int64_t{0});
    train_seconds_ = j.value("train_seconds", 0.0);
    invalid_unreadable_ = j.value("invalid_unreadable", uint64_t{0});
    invalid_unreadable_seqs_ = j.value("invalid_unreadable_seqs", uint64_t{0});
    *ledger_bytes = j["ledger_bytes"].get<int64_t>();
    if (rt_.options().restarts > 0) {
      // A crash restart inside this job: the time since the checkpoint (work
      // lost and time down) is part of the job's wall time.
      const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      const double gap = std::max<double>(0, now_ms - j.value("saved_unix_ms", now_ms)) / 1e3;
      rl_elapsed_before_ += gap;
      restart_lost_s_ += gap;
      *gap_s = gap;
      ++learner_restarts_;
    }
  } catch (const nlohmann::json::exception& e) {
    return Malformed("{}: {}", path, e.what());
  }
  return Status::Ok();
}

// Restores everything from the checkpoint `dir`: the trainer's state, this
// actor's state and the ledger as of that checkpoint.
Status LearnerRole::Resume(const std::string& dir) {
  TROUPE_RETURN_IF_ERROR(learner_->LoadCheckpoint(dir));
  int64_t ledger_bytes = 0;
  double gap_s = -1;
  TROUPE_RETURN_IF_ERROR(ReadSidecar(dir, &ledger_bytes, &gap_s));
  TROUPE_ASSIGN_OR_RETURN(ledger_, BatchLedger::Open(ctx_.run_dir + "/batches.tsv", ledger_bytes));
  // The ledger and the trainer's counters describe the same decisions.
  const auto c = learner_->counters();
  const LedgerCounts t = ledger_->Total();
  if (t.trained != static_cast<int64_t>(c.trained_sequences) ||
      t.skipped != static_cast<int64_t>(c.skipped_sequences)) {
    Log().error(
        "resumed ledger disagrees with the checkpoint's counters: trained {} vs {}, skipped {} vs "
        "{}",
        t.trained, c.trained_sequences, t.skipped, c.skipped_sequences);
  }
  last_ckpt_update_ = RlUpdates();
  last_eval_update_ = RlUpdates();
  Log().info("resumed from checkpoint {}: version {}, {} RL updates, {} batches in the ledger{}",
             dir, learner_->version(), RlUpdates(), ledger_->size(),
             gap_s >= 0 ? fmt::format(" ({:.1f} s since that checkpoint)", gap_s) : "");
  rt_.SendMetrics("resume", RlUpdates(), learner_->version(),
                  {{"version", static_cast<double>(learner_->version())},
                   {"ledger_batches", static_cast<double>(ledger_->size())},
                   {"learner_restarts", static_cast<double>(learner_restarts_)},
                   {"restart_lost_s", restart_lost_s_}});
  return Status::Ok();
}

// Fault injection (checkpoint.fault_stall_stage): stalls this checkpoint at
// `stage` when the trigger file exists (taken, so a restarted learner does not
// stall again), announcing it in <run>/fault-stalled-checkpoint, until killed
// (60 s at most).
void LearnerRole::FaultStallCheckpoint(std::string_view stage) {
  if (stage != job_.checkpoint.fault_stall_stage) return;
  const std::string trigger = ctx_.run_dir + "/fault-stall-checkpoint";
  if (std::rename(trigger.c_str(), (trigger + ".taken").c_str()) != 0) return;
  Log().warn("fault injection: stalling at checkpoint stage '{}' until killed", stage);
  trainer::WriteFileAtomic(ctx_.run_dir + "/fault-stalled-checkpoint", std::string(stage))
      .IgnoreError();
  for (int i = 0; i < 600 && !rt_.should_exit(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// Senders keep every unacknowledged message in a bounded outbox. Updates that
// train nothing (every group uniform) or dropped batches decide data without
// advancing the update count, so periodic checkpoints alone could leave
// decided batches unacknowledged until those outboxes fill and the pipeline
// stalls: checkpoint early instead.
Status LearnerRole::CheckpointIfAcksPile() {
  if (job_.checkpoint.ack != "checkpoint" ||
      decided_unacked_.size() < job_.checkpoint.max_unacked_batches)
    return Status::Ok();
  ++ack_checkpoints_;
  return Checkpoint("to acknowledge decided batches");
}

Status LearnerRole::Checkpoint(const char* why) {
  auto t0 = std::chrono::steady_clock::now();
  ReleaseAcks(false);  // decide what can be decided before the snapshot
  TROUPE_RETURN_IF_ERROR(fatal_);
  auto ledger_bytes = ledger_->Sync();
  if (!ledger_bytes.ok()) return ledger_bytes.status().WithContext("checkpoint");
  trainer::CheckpointHooks hooks;
  if (!job_.checkpoint.fault_stall_stage.empty()) hooks.on_stage = [this](std::string_view stage) {
    FaultStallCheckpoint(stage);
  };
  std::map<std::string, std::string> extra(hf_files_.begin(), hf_files_.end());
  extra["actor_state.json"] = SidecarJson(*ledger_bytes);
  auto dir = learner_->SaveCheckpoint(ckpt_root_, hooks, extra);
  if (!dir.ok()) return dir.status().WithContext("checkpoint");
  last_ckpt_update_ = RlUpdates();
  ReleaseAcks(true);
  Log().info("checkpoint ({}) at update {}, version {}: {} ({:.0f} ms)", why, RlUpdates(),
             learner_->version(), *dir, SecondsSince(t0) * 1e3);
  return Status::Ok();
}

// ---------------------------------------------------------------- run

void LearnerRole::Finish() {
  auto c = learner_->counters();
  double elapsed = rl_elapsed_before_ + SecondsSince(rl_t0_);
  std::map<std::string, double> summary = {
      {"warm_accuracy", warm_accuracy_},
      {"best_accuracy", best_accuracy_},
      {"final_accuracy", last_accuracy_},
      {"target_accuracy", job_.stop.target_accuracy},
      {"time_to_target_s", time_to_target_},
      {"skipped_updates", static_cast<double>(skipped_updates_)},
      {"credits_abandoned_stale", static_cast<double>(abandoned_groups_)},
      {"steps", static_cast<double>(RlUpdates())},
      {"elapsed_s", elapsed},
      {"gen_tokens_per_s", elapsed > 0 ? received_response_tokens_ / elapsed : 0},
      {"train_tokens_per_s", train_seconds_ > 0 ? train_tokens_ / train_seconds_ : 0},
      {"train_seconds", train_seconds_},
      {"learner_restarts", static_cast<double>(learner_restarts_)},
      {"restart_lost_s", restart_lost_s_}};
  rt_.SendMetrics("summary", RlUpdates(), learner_->version(), summary);
  // The accounting (launcher/src/accounting.h): the ledger's terms in total
  // and per producer incarnation ("<term>:<source>"), and what is held
  // undecided ("held:<source>"). Unreadable batches have no producer.
  const LedgerCounts total = ledger_->Total();
  std::map<std::string, double> fin;
  for (const auto& [term, n] : total.Terms()) fin[term] = static_cast<double>(n);
  fin["unreadable_batches"] = static_cast<double>(invalid_unreadable_);
  fin["unreadable_sequences"] = static_cast<double>(invalid_unreadable_seqs_);
  fin["queued_sequences"] = 0;
  fin["duplicates"] =
      static_cast<double>(c.duplicate_batches + redelivered_decided_ + copies_of_held_);
  fin["skipped_updates"] = static_cast<double>(skipped_updates_);
  fin["ack_checkpoints"] = static_cast<double>(ack_checkpoints_);
  fin["ledger_batches"] = static_cast<double>(ledger_->size());
  for (const auto& [src, counts] : ledger_->Counts())
    for (const auto& [term, n] : counts.Terms())
      if (n > 0) fin[term + ":" + src] = static_cast<double>(n);
  for (const auto& [id, h] : held_) {
    fin["held:" + h.source] += static_cast<double>(h.sequences);
    fin["queued_sequences"] += static_cast<double>(h.sequences);
  }
  rt_.SendMetrics("final", RlUpdates(), learner_->version(), fin);
  Log().info(
      "done ({}): {} updates, best accuracy {:.3f}, trained {} sequences, dropped {} stale / {} "
      "invalid",
      done_reason_, RlUpdates(), best_accuracy_, c.trained_sequences,
      DroppedStale(c), c.dropped_invalid_sequences);
}

Status LearnerRole::Run() {
  TROUPE_RETURN_IF_ERROR(Setup());
  TROUPE_RETURN_IF_ERROR(rt_.Register(Deadline::InMs(60000)));
  // The job's checkpoint, if any: a learner restarted after a crash (or a
  // --resume) continues from it; otherwise this is a fresh job.
  auto ckpt = trainer::ResolveCheckpoint(ckpt_root_);
  const bool resumed = ckpt.ok();
  if (resumed) {
    TROUPE_RETURN_IF_ERROR(Resume(*ckpt).WithContext("resume from " + *ckpt));
  } else if (ckpt.status().code() != Code::kNotFound) {
    return ckpt.status().WithContext("resume");
  } else {
    TROUPE_ASSIGN_OR_RETURN(ledger_, BatchLedger::Open(ctx_.run_dir + "/batches.tsv", 0));
    TROUPE_RETURN_IF_ERROR(WarmStart());
    rl_start_version_ = learner_->version();
    rl_t0_ = std::chrono::steady_clock::now();
    TROUPE_RETURN_IF_ERROR(Checkpoint("after warm start"));
  }
  rl_t0_ = std::chrono::steady_clock::now();
  if (job_.model.lora.enabled()) {
    // LoRA: the frozen base goes once (with the next broadcast to the group, and with every
    // newcomer's catch-up); each update then sends only the adapters.
    TROUPE_RETURN_IF_ERROR(sender_->SetBase(learner_->NamedWeights()));
    Log().info("LoRA {}: broadcasting adapters only ({} of {} parameters) after the base",
               job_.model.lora.ToString(), job_.model.NumAdapterParameters(),
               job_.model.NumParameters());
  }
  broadcaster_->Publish(learner_->version(), learner_->BroadcastWeights());
  rt_.SetPolicyVersion(learner_->version());
  Log().info("RL starts at version {} (max policy lag {}, {} groups x {} samples per update)",
             learner_->version(), job_.trainer.effective_max_policy_lag(),
             job_.batch.prompts_per_update, job_.batch.samples_per_prompt);
  auto last_stats = std::chrono::steady_clock::now();
  while (!done_ && !rt_.should_exit()) {
    bool ready = learner_->ReadyToStep();
    auto d = receiver_->Recv(Deadline::InMs(ready ? 0 : 20));
    if (d.ok()) {
      HandleDelivery(std::move(d).value());
      // Take everything already waiting before stepping.
      for (int i = 0; i < 256; ++i) {
        auto more = receiver_->Recv(Deadline::Now());
        if (!more.ok()) break;
        HandleDelivery(std::move(more).value());
      }
    }
    TROUPE_RETURN_IF_ERROR(fatal_);
    if (learner_->ReadyToStep()) TROUPE_RETURN_IF_ERROR(TrainStep());
    CollectEval(/*wait=*/false);
    if (rt_.TakeCheckpointRequest()) TROUPE_RETURN_IF_ERROR(Checkpoint("requested"));
    TROUPE_RETURN_IF_ERROR(CheckpointIfAcksPile());
    if (SecondsSince(last_stats) > 0.5) {
      last_stats = std::chrono::steady_clock::now();
      ReclaimDepartedCredits();
      auto c = learner_->counters();
      std::map<std::string, double> st = {{"version", static_cast<double>(learner_->version())},
                    {"updates", static_cast<double>(RlUpdates())},
                    {"queued_batches", static_cast<double>(c.queued_batches)},
                    {"trained", static_cast<double>(c.trained_sequences)},
                    {"dropped_stale", DroppedStale(c)},
                    {"stale_groups_left_out_sequences", static_cast<double>(stale_on_arrival_)},
                    {"dropped_invalid", static_cast<double>(c.dropped_invalid_sequences)},
                    {"credits_granted", static_cast<double>(credits_->granted())},
                    {"credits_abandoned_stale", static_cast<double>(abandoned_groups_)},
                    {"skipped_updates", static_cast<double>(skipped_updates_)},
                    {"ack_checkpoints", static_cast<double>(ack_checkpoints_)},
                    {"duplicates", static_cast<double>(c.duplicate_batches +
                                                       redelivered_decided_ + copies_of_held_)},
                    {"copies_of_held", static_cast<double>(copies_of_held_)},
                    {"broadcast_failures", static_cast<double>(broadcaster_->failures())},
                    {"redelivered_decided", static_cast<double>(redelivered_decided_)},
                    {"unreadable_batches", static_cast<double>(invalid_unreadable_)}};
      const auto received = receiver_->stats();
      AddDeliveryStats(&received, nullptr, &st);
      rt_.SetStats(st);
      if (job_.stop.max_seconds > 0 &&
          rl_elapsed_before_ + SecondsSince(rl_t0_) >= job_.stop.max_seconds) {
        done_ = true;
        done_reason_ = fmt::format("reached stop.max_seconds = {}", job_.stop.max_seconds);
      }
    }
  }
  if (!done_) done_reason_ = std::string("asked to exit: ") + ExitReasonName(rt_.exit_reason());
  if (rt_.exit_reason() == ExitReason::kHeadLost) return Status::Ok();  // nobody to report to
  CollectEval(/*wait=*/true);  // the one in flight is reported before the final one
  // A final evaluation unless one just ran, then the last checkpoint (acks).
  if (last_eval_update_ != RlUpdates() || last_accuracy_ < 0) {
    auto e = Evaluate();
    if (e.ok()) SendEval(*e);
  }
  TROUPE_RETURN_IF_ERROR(Checkpoint("final"));
  broadcaster_->WaitIdle(Deadline::InMs(5000));
  Finish();
  return Status::Ok();
}

}  // namespace

Status RunLearner(ActorRuntime& runtime, transport::Network& network, JobContext& ctx) {
  LearnerRole role(runtime, network, ctx);
  return role.Run();
}

}  // namespace troupe::actors
