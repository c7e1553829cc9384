// The rollout role.
//
//   learner ══weights══▶ WeightReceiver ──UpdateWeights──▶ Engine (continuous batching)
//   learner ◀──Credit request / grant──▶ this actor       (start a group only with a credit)
//   prompts ──Submit(G samples)──▶ Engine ──callback──▶ finished groups
//   finished groups ──RolloutBatch (groups_per_message)──▶ ReliableSender ──▶ reward-*
//
// A group is tagged with the policy version at its prefill; a batch carries
// the oldest version of its groups (so the learner's lag gate is never
// fooled) and every token's own version. The actor only starts groups the
// learner granted (staleness control) and never more than
// max_groups_in_flight at once; the reliable sender's bounded outbox blocks
// generation rather than dropping anything.
//
// Multi-turn tasks (task->multi_turn()) take the same credits and produce the
// same RolloutBatch records, but a group's G samples are G tool episodes run by
// envs::EpisodeDriver on worker threads (tools run there, never on this loop
// or the engine thread); every assistant turn is an engine request, so turns
// of all episodes share the engine's continuous batching. Each worker takes
// every group queued while it was idle and runs them in one driver Run; with
// several workers a new group never waits for a long Run to end.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "batch_codec.h"
#include "credit_book.h"
#include "role_common.h"
#include "roles.h"
#include "troupe/actors/generation_endpoint.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/core/cpu_time.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/engine/engine.h"
#include "troupe/envs/agent.h"
#include "troupe/envs/episode_driver.h"
#include "troupe/envs/sampler.h"
#include "troupe/envs/tool_call.h"
#include "troupe/transport/reliable.h"

namespace troupe::actors {
namespace {

spdlog::logger& Log() {
  return log::Get("rollout");
}

wire::FinishReason WireFinish(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return wire::FinishReason::STOP;
    case engine::FinishReason::kLength:
      return wire::FinishReason::LENGTH;
    default:
      return wire::FinishReason::REJECTED;
  }
}

wire::FinishReason WireFinish(envs::EpisodeEnd e) {
  switch (e) {
    case envs::EpisodeEnd::kSubmitted:
      return wire::FinishReason::SUBMITTED;
    case envs::EpisodeEnd::kTurnLimit:
      return wire::FinishReason::TURN_LIMIT;
    case envs::EpisodeEnd::kTokenLimit:
      return wire::FinishReason::LENGTH;
    default:
      return wire::FinishReason::REJECTED;
  }
}

// Worker threads running multi-turn groups (each with its own driver).
constexpr int kEpisodeWorkers = 2;
// The main loop's longest sleep when nothing wakes it (directory, stats, re-requests, exit).
constexpr int kLoopTickMs = 50;
// Upper bound for one driver Run (all groups a worker took). Episodes still
// running then are aborted and their groups counted as rejected.
constexpr int64_t kEpisodeRunTimeoutMs = 600000;

struct GroupInfo {
  const envs::Task* task = nullptr;
  envs::Prompt prompt;
  std::string prompt_text;
  uint64_t grant_learner = 0;  // learner process whose credit started it
};

// A finished group, converted to wire records (group_index is set at sending).
struct FinishedGroup {
  uint64_t serial = 0;
  std::vector<SequenceRecord> seqs;
  uint64_t policy_version = 0;  // the oldest of its samples
  int64_t tokens = 0;           // sampled (model) tokens
  int64_t env_tokens = 0;       // environment (tool) tokens, multi-turn only
  std::string failure;          // not empty: the group could not be generated (not sent)
  bool stale = false;           // cut short by the engine: it outlived max_policy_lag
  uint64_t grant_learner = 0;   // learner process whose credit started it
  std::chrono::steady_clock::time_point release{};  // fault injection: not sent before this
};

// A sample's tokens as its wire record carries them, whichever path (one
// engine request, or a tool episode) produced it.
SequenceRecord TokenRecord(std::vector<int32_t> prompt, std::vector<int32_t> response,
                           std::vector<float> logprobs, std::vector<uint8_t> mask,
                           std::vector<uint64_t> token_versions, wire::FinishReason finish) {
  SequenceRecord sr;
  sr.prompt = std::move(prompt);
  sr.response = std::move(response);
  sr.logprobs = std::move(logprobs);
  sr.mask = std::move(mask);
  sr.token_versions = std::move(token_versions);
  sr.finish = finish;
  return sr;
}

// What a sample's record carries from its prompt and task.
void DescribeSample(const envs::Prompt& prompt, const envs::Task& task, SequenceRecord* sr) {
  sr->prompt_id = prompt.id;
  sr->task = task.name();
  sr->reference = prompt.reference;
  sr->service = prompt.service;
}

// A multi-turn group waiting for an episode worker.
struct EpisodeGroup {
  uint64_t serial = 0;
  const envs::Task* task = nullptr;
  envs::Prompt prompt;
  uint64_t seed = 0;
};

// One episode of a group played by an agent server (see RunAgentEpisode).
struct AgentJob {
  uint64_t serial = 0;
  size_t k = 0;              // sample index within the group
  std::string group;         // ledger key (also in the endpoint URL the agent gets)
  std::string server;        // agent server name
  const envs::Task* task = nullptr;
  envs::Prompt prompt;
  uint64_t start_version = 0;
};

// The G episodes of an agent group as they finish (filled by agent workers).
struct AgentGroupState {
  Mutex mu;
  FinishedGroup done TROUPE_GUARDED_BY(mu);
  size_t left TROUPE_GUARDED_BY(mu) = 0;
};

class RolloutRole {
 public:
  RolloutRole(ActorRuntime& rt, transport::Network& net, JobContext& ctx)
      : rt_(rt), net_(net), ctx_(ctx), job_(ctx.job) {}
  ~RolloutRole() {  // before the engine goes
    StopEpisodeWorkers();
    StopAgentWorkers();
    endpoint_.reset();
  }
  Status Run();

 private:
  Status Setup();
  void SyncDirectory();
  void ConnectLearner(const std::string& data, const std::string& weights);
  // Reads every credit message already waiting (never blocks).
  void PollCredits();
  // Starts the generation clocks (wall and process CPU) at the first submitted group:
  // the final report's tokens per CPU-second leave out start-up and waiting for weights.
  void MarkFirstSubmit() {
    if (first_submit_) return;
    first_submit_ = std::chrono::steady_clock::now();
    first_submit_cpu_ = ProcessCpuSeconds();
    engine_at_first_submit_ = engine_->stats();
  }
  void RequestCredits();
  Status SubmitGroups();
  void StartEpisodeWorkers();
  void StopEpisodeWorkers();
  void EpisodeWorker(envs::EpisodeDriver* driver);
  void RunEpisodeGroups(envs::EpisodeDriver* driver, std::vector<EpisodeGroup> groups);
  Status StartAgents();
  void StopAgentWorkers();
  void AgentWorker();
  void QueueAgentGroup(uint64_t serial, const GroupInfo& g);
  SequenceRecord RunAgentEpisode(const AgentJob& job, uint64_t* version);
  // Hands a finished group to the main loop and wakes it (any thread).
  void PushDone(FinishedGroup f) {
    {
      MutexLock l(done_mu_);
      done_.push_back(std::move(f));
    }
    poller_->Wake();
  }
  // PushDone for a group the engine generated (called on the engine thread). The main loop is
  // woken once a message's worth of groups is waiting or the engine has nothing left to
  // generate, not for every group: each wake-up of the main thread preempts the engine (or the
  // learner) on 2 cores, and the groups go out a message at a time anyway. Stragglers are
  // picked up by the next wake (credits, weights, the loop's tick).
  void PushGenerated(FinishedGroup f) {
    const bool idle = generating_.fetch_sub(1) == 1;
    size_t waiting;
    {
      MutexLock l(done_mu_);
      done_.push_back(std::move(f));
      waiting = done_.size();
    }
    if (idle || waiting >= job_.batch.groups_per_message) poller_->Wake();
  }
  // Blocks the main loop until a credit arrives, a group finishes, new weights land, or the
  // deadline (the loop's housekeeping tick) passes, then reads every pending credit.
  void WaitForWork(Deadline deadline);
  void CollectFinished();
  Status SendReady(bool flush_all);
  void UpdateStats();
  // Episode counters of every driver together ("episodes.submitted", ...).
  std::vector<std::pair<std::string, double>> EpisodeStats() const;
  // Agent-server and endpoint counters ("agent.<server>.*", "endpoint.*").
  std::vector<std::pair<std::string, double>> AgentStats() const;
  void Drain();
  void ReturnCredits();
  void OnOutcome(const transport::DeliveryOutcome& o);

  ActorRuntime& rt_;
  transport::Network& net_;
  JobContext& ctx_;
  const launcher::JobConfig& job_;
  std::string id_;
  uint64_t incarnation_ = 0;
  // Declared before everything that wakes it (engine, workers, receiver): destroyed after.
  std::unique_ptr<transport::Poller> poller_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<transport::ReliableSender> sender_;
  std::unique_ptr<transport::Socket> credit_sock_;
  std::unique_ptr<broadcast::WeightReceiver> receiver_;
  std::string learner_data_, learner_weights_;
  std::map<std::string, std::string> reward_peers_;  // id -> endpoint
  uint64_t seen_epoch_ = 0;

  // Credits and groups.
  int64_t credits_ = 0;
  uint64_t credit_version_ = 0;  // weights must be at least this new to start granted groups
  std::optional<std::chrono::steady_clock::time_point> last_request_;
  int64_t last_want_ = 0;     // the want last sent (Credit.requested)
  uint64_t grants_seen_ = 0;  // groups granted by the current learner process, received so far
  uint64_t learner_version_ = 0;
  uint64_t grant_learner_ = 0;  // incarnation of the learner process our credits_ come from
  // Groups granted by grant_learner_ cut short as stale (Credit.abandoned, cumulative), and
  // the count last sent.
  uint64_t abandoned_ = 0, last_abandoned_sent_ = 0;
  uint64_t next_serial_ = 0;
  std::optional<envs::PromptStream> prompts_;  // this incarnation's own weighted task mix
  std::map<uint64_t, GroupInfo> in_flight_;
  Mutex done_mu_;
  std::deque<FinishedGroup> done_ TROUPE_GUARDED_BY(done_mu_);  // filled on the engine thread
  std::vector<FinishedGroup> ready_;
  uint64_t batches_sent_ = 0;

  // Accounting (sequences).
  std::atomic<uint64_t> generated_{0}, resolved_{0}, rejected_{0};
  // Rejected by a reward actor itself (unscorable), not by the learner: the
  // learner's ledger never saw them, so this actor's count is their record.
  std::atomic<uint64_t> rejected_by_reward_{0};
  uint64_t rejected_groups_ = 0;
  int64_t stale_groups_ = 0;  // cut short as stale (never generated)
  int64_t gen_tokens_ = 0;      // sampled tokens of finished groups
  int64_t gen_env_tokens_ = 0;  // environment tokens (mask 0) of finished multi-turn groups
  std::optional<std::chrono::steady_clock::time_point> first_submit_;  // start of generation
  double first_submit_cpu_ = 0;                                        // ProcessCpuSeconds() then
  engine::EngineStats engine_at_first_submit_;                         // engine_->stats() then
  bool slow_ = false;  // fault injection (rollout.slow_actor)
  std::chrono::steady_clock::time_point slow_until_{};
  RateMeter token_rate_;
  std::atomic<uint64_t> outcomes_{0};
  std::atomic<int64_t> generating_{0};  // groups submitted to the engine and not finished
  // Every group is one engine request (no multi-turn task, no agent server): a granted group
  // is submitted at once with GenerateRequest::min_version, and the engine starts it when the
  // grant's weights land, without a round trip through this loop.
  bool direct_only_ = false;
  // New weights wake the main loop only while something there waits for them (the first
  // weights, or granted multi-turn or agent groups): set by the main loop before it sleeps.
  std::atomic<bool> wake_on_weights_{true};
  bool waiting_for_weights_ = false;  // SubmitGroups held granted groups for newer weights
  std::chrono::steady_clock::time_point last_stats_ = std::chrono::steady_clock::now();

  // Multi-turn episodes (started on the first multi-turn group).
  std::vector<std::unique_ptr<envs::EpisodeDriver>> drivers_;
  std::vector<std::thread> episode_workers_;
  Mutex episode_mu_;
  CondVar episode_cv_;
  std::deque<EpisodeGroup> episode_queue_ TROUPE_GUARDED_BY(episode_mu_);
  bool episode_stop_ TROUPE_GUARDED_BY(episode_mu_) = false;

  // Agent servers (job_.agents.enabled()): the endpoint they call back, the
  // /run client, what the endpoint generated per group, and /run workers.
  std::unique_ptr<envs::AgentClient> agents_;
  envs::GenerationLedger ledger_;
  std::unique_ptr<GenerationEndpoint> endpoint_;
  std::string endpoint_token_;
  std::atomic<bool> weights_ready_{false};
  std::vector<std::thread> agent_workers_;
  Mutex agent_mu_;
  CondVar agent_cv_;
  std::deque<AgentJob> agent_queue_ TROUPE_GUARDED_BY(agent_mu_);
  bool agent_stop_ TROUPE_GUARDED_BY(agent_mu_) = false;
  std::map<uint64_t, std::shared_ptr<AgentGroupState>> agent_groups_ TROUPE_GUARDED_BY(agent_mu_);
};

Status RolloutRole::Setup() {
  id_ = rt_.options().actor_id;
  slow_ = !job_.rollout_settings.slow_actor.empty() && job_.rollout_settings.slow_actor == id_ &&
          job_.rollout_settings.slow_ms_per_group > 0;
  if (slow_)
    Log().warn("fault injection: holding every group {} ms",
               job_.rollout_settings.slow_ms_per_group);
  incarnation_ = net_.identity().incarnation;
  direct_only_ = !job_.agents.enabled();
  for (const std::string& name : ctx_.tasks->names())
    if (ctx_.tasks->Find(name)->multi_turn()) direct_only_ = false;
  TROUPE_ASSIGN_OR_RETURN(
      prompts_,
      envs::PromptStream::Create(ctx_.tasks, job_.tasks,
                                 DeriveSeed(job_.seed, id_ + "/prompts", incarnation_), 0, 1));
  engine::EngineConfig ec;
  ec.model = job_.model;
  ec.num_slots = job_.engine.num_slots;
  ec.intra_op_threads = job_.engine.intra_op_threads;
  ec.device = job_.engine.device;
  ec.fused_cpu_kernels = job_.engine.fused_cpu_kernels;
  ec.lora_merged = job_.engine.lora_merged;
  ec.init_seed = DeriveSeed(job_.seed, "policy-init");
  poller_ = net_.NewPoller();
  TROUPE_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(ec));
  transport::ReliableSenderOptions so;
  so.max_outbox_messages = job_.rollout_settings.outbox_messages;
  sender_ = std::make_unique<transport::ReliableSender>(&net_, so);
  sender_->SetOutcomeCallback([this](const transport::DeliveryOutcome& o) { OnOutcome(o); });
  if (job_.agents.enabled()) TROUPE_RETURN_IF_ERROR(StartAgents());
  return Status::Ok();
}

void RolloutRole::OnOutcome(const transport::DeliveryOutcome& o) {
  uint64_t n = o.message.reader().getBody().getRolloutBatch().getNumSequences();
  resolved_.fetch_add(n);
  if (!o.accepted) {
    rejected_.fetch_add(n);
    // The reward actor relays the learner's rejections as "learner: <reason>".
    if (o.reason.rfind("learner: ", 0) != 0) rejected_by_reward_.fetch_add(n);
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "batch rejected by {}: {}", o.peer,
                        o.reason);
  }
  outcomes_.fetch_add(1);
}

void RolloutRole::ConnectLearner(const std::string& data, const std::string& weights) {
  if (data != learner_data_) {
    learner_data_ = data;
    if (credit_sock_) poller_->Remove(credit_sock_.get());
    credit_sock_.reset();
    credits_ = 0;  // a new learner knows nothing of the old grants
    credit_version_ = 0;
    grants_seen_ = 0;
    abandoned_ = 0;
    last_abandoned_sent_ = 0;
    last_request_.reset();
    transport::SocketOptions so;
    so.identity = id_;
    so.linger_ms = 0;
    auto s = net_.Connect(transport::SocketKind::kClient, data, so);
    if (s.ok()) {
      credit_sock_ = std::move(s).value();
      poller_->Add(credit_sock_.get());
    } else
      Log().error("cannot connect to the learner at {}: {}", data, s.status().ToString());
  }
  if (weights != learner_weights_) {
    learner_weights_ = weights;
    receiver_.reset();
    broadcast::ReceiverConfig rc;
    rc.actor_id = id_;
    rc.learner_endpoint = weights;
    rc.data_endpoint = ctx_.AnyPort();
    rc.gloo_hostname = ctx_.bind_host;
    rc.adapters = AdapterLayoutOf(job_.model);  // the learner refuses us if it trains others
    auto* engine = engine_.get();
    auto* poller = poller_.get();
    auto* wake = &wake_on_weights_;
    // The learner is the authority on versions: a learner restarted from an
    // older checkpoint sends a lower version, and it replaces ours. New weights
    // wake the main loop when it waits for them (wake_on_weights_); granted
    // single-turn groups wait in the engine instead (min_version).
    auto r = broadcast::WeightReceiver::Create(
        rc, net_, [engine, poller, wake](const broadcast::ReceivedWeights& w) {
          Status s = engine->UpdateWeights(w.version, w.named, Deadline::InMs(30000),
                                           /*allow_rollback=*/true);
          if (wake->load(std::memory_order_relaxed)) poller->Wake();
          return s;
        });
    if (r.ok())
      receiver_ = std::move(r).value();
    else
      Log().error("cannot start the weight receiver for {}: {}", weights, r.status().ToString());
  }
}

void RolloutRole::SyncDirectory() {
  auto dir = rt_.directory();
  if (dir.epoch == seen_epoch_) return;
  seen_epoch_ = dir.epoch;
  auto learners = dir.Live("learner");
  if (!learners.empty()) {
    auto& eps = learners[0].endpoints;
    if (eps.count("data") && eps.count("weights"))
      ConnectLearner(eps.at("data"), eps.at("weights"));
  }
  std::map<std::string, std::string> now;
  for (const auto& r : dir.Live("reward")) {
    auto it = r.endpoints.find("data");
    if (it != r.endpoints.end()) now[r.id] = it->second;
  }
  for (auto& [rid, ep] : reward_peers_) {
    auto it = now.find(rid);
    if (it == now.end() || it->second != ep) {
      // Gone (or restarted elsewhere): its unacked batches move to the others.
      sender_->RemovePeer(rid).IgnoreError();
      Log().info("reward peer {} left", rid);
    }
  }
  for (auto& [rid, ep] : now) {
    auto it = reward_peers_.find(rid);
    if (it == reward_peers_.end() || it->second != ep) {
      Status s = sender_->ConnectPeer(rid, ep);
      if (!s.ok())
        Log().warn("cannot add reward peer {}: {}", rid, s.ToString());
      else
        Log().info("reward peer {} at {}", rid, ep);
    }
  }
  reward_peers_ = now;
}

void RolloutRole::WaitForWork(Deadline deadline) {
  // Readable sockets, empty after a Wake, or kTimeout: PollCredits looks either way.
  (void)poller_->Wait(deadline);
  PollCredits();
}

void RolloutRole::PollCredits() {
  if (!credit_sock_) return;
  while (true) {
    auto in = credit_sock_->Recv(Deadline::Now());
    if (!in.ok()) return;
    if (in->message.kind() != transport::MessageKind::CREDIT) continue;
    auto c = in->message.envelope().getBody().getCredit();
    credits_ += c.getGranted();
    grants_seen_ += c.getGranted();
    if (in->message.incarnation() != grant_learner_) {
      abandoned_ = 0;  // counted per learner process
      last_abandoned_sent_ = 0;
    }
    grant_learner_ = in->message.incarnation();
    learner_version_ = c.getLearnerVersion();
    credit_version_ = std::max(credit_version_, learner_version_);
    last_request_.reset();
  }
}

void RolloutRole::RequestCredits() {
  if (!credit_sock_ || rt_.should_exit()) return;
  const int64_t want = RolloutCreditWant(
      job_.rollout_settings.max_groups_in_flight, job_.rollout_settings.credit_reserve, credits_,
      static_cast<int64_t>(in_flight_.size()), job_.batch.groups_per_message);
  const bool abandoned_news = abandoned_ != last_abandoned_sent_;
  if (want <= 0 && !abandoned_news) return;
  // The want is re-sent as soon as it grows (groups finished since the last ask): the learner
  // grants between optimizer steps, and answering the whole current want then starts the
  // freed slots together (full decode batches) instead of a message's worth per round trip.
  // Grants still on their way are not asked twice: the learner subtracts what it granted
  // beyond grants_seen_. Unchanged, it is re-sent only after credit_timeout_ms (a lost ask).
  auto now = std::chrono::steady_clock::now();
  if (last_request_ && want <= last_want_ && !abandoned_news &&
      now - *last_request_ < std::chrono::milliseconds(job_.rollout_settings.credit_timeout_ms))
    return;
  transport::OutMessage m;
  auto c = m.envelope().getBody().initCredit();
  c.setRequested(static_cast<uint32_t>(std::max<int64_t>(want, 0)));
  c.setOutstanding(static_cast<uint32_t>(credits_));
  c.setGrantsSeen(grants_seen_);
  c.setAbandoned(abandoned_);
  c.setAbandonedLearner(grant_learner_);
  if (credit_sock_->Send(m, Deadline::InMs(50)).ok()) {
    last_request_ = now;
    last_want_ = want;
    last_abandoned_sent_ = abandoned_;
  }
}

Status RolloutRole::SubmitGroups() {
  waiting_for_weights_ = false;
  if (!receiver_ || receiver_->stats().delivered == 0) return Status::Ok();  // no weights yet
  // Granted groups start only with weights at least as new as the grant (the staleness rule
  // counts from that version); new weights are milliseconds away. Engine requests wait for
  // them in the engine (min_version below); episodes and agent groups wait here.
  if (!direct_only_ && credits_ > 0 && engine_->version() < credit_version_) {
    waiting_for_weights_ = true;
    return Status::Ok();
  }
  while (credits_ > 0 && in_flight_.size() < job_.rollout_settings.max_groups_in_flight) {
    uint64_t serial = next_serial_++;
    envs::TaskPrompt tp = prompts_->Next();
    GroupInfo g;
    g.task = tp.task;
    g.prompt = std::move(tp.prompt);
    g.prompt_text = ctx_.renderer->PromptText(g.prompt.messages);
    g.grant_learner = grant_learner_;
    if (agents_) {
      QueueAgentGroup(serial, g);
      in_flight_[serial] = std::move(g);
      --credits_;
      MarkFirstSubmit();
      continue;
    }
    if (g.task->multi_turn()) {
      if (episode_workers_.empty()) StartEpisodeWorkers();
      EpisodeGroup eg{serial, g.task, g.prompt,
                      DeriveSeed(job_.seed, id_ + "/episodes", incarnation_ * 1000003 + serial)};
      in_flight_[serial] = std::move(g);
      --credits_;
      MarkFirstSubmit();
      {
        MutexLock l(episode_mu_);
        episode_queue_.push_back(std::move(eg));
      }
      episode_cv_.notify_one();
      continue;
    }
    auto ids = ctx_.renderer->RenderPrompt(g.prompt.messages);
    if (!ids.ok()) return ids.status().WithContext("rendering prompt " + g.prompt.id);
    engine::GenerateRequest req;
    req.prompt = std::move(ids).value();
    req.sampling.temperature = job_.sampling.temperature;
    req.sampling.top_k = job_.sampling.top_k;
    req.sampling.top_p = job_.sampling.top_p;
    req.sampling.max_new_tokens = job_.sampling.max_new_tokens;
    req.sampling.stop_token_ids = ctx_.stop_ids;
    req.sampling.num_samples = static_cast<int32_t>(job_.batch.samples_per_prompt);
    req.sampling.seed = DeriveSeed(job_.seed, id_, incarnation_ * 1000003 + serial);
    req.tag = serial;
    // A group still generating when the weights are more than max_policy_lag versions newer
    // than its own could only be dropped by the learner's lag gate (invariant 3): the engine
    // cuts it short, and its slots and its credit go to a fresh group.
    req.abort_beyond_lag = static_cast<uint64_t>(job_.trainer.effective_max_policy_lag());
    req.min_version = credit_version_;
    in_flight_[serial] = std::move(g);
    --credits_;
    MarkFirstSubmit();
    generating_.fetch_add(1);
    Status s =
        engine_->Submit(std::move(req), [this, serial](std::vector<engine::GenerationResult> res) {
          FinishedGroup f;
          f.serial = serial;
          f.policy_version = UINT64_MAX;
          for (auto& r : res) {
            if (r.finish_reason == engine::FinishReason::kRejected ||
                r.finish_reason == engine::FinishReason::kAborted) {
              f.failure = r.reject_reason.empty() ? "aborted" : r.reject_reason;
              if (engine::CutShortAsStale(r)) f.stale = true;
            }
            f.policy_version = std::min(f.policy_version, r.policy_version);
            f.tokens += r.num_new_tokens;
            f.seqs.push_back(TokenRecord(std::move(r.prompt_ids), std::move(r.response_ids),
                                         std::move(r.logprobs), std::move(r.mask),
                                         std::move(r.token_versions), WireFinish(r.finish_reason)));
          }
          PushGenerated(std::move(f));
        });
    if (!s.ok()) {
      generating_.fetch_sub(1);
      in_flight_.erase(serial);
      return s.WithContext("engine submit");
    }
  }
  return Status::Ok();
}

void RolloutRole::StartEpisodeWorkers() {
  envs::EpisodeDriverConfig dc;
  dc.episode = job_.episode;
  dc.sampling.temperature = job_.sampling.temperature;
  dc.sampling.top_k = job_.sampling.top_k;
  dc.sampling.top_p = job_.sampling.top_p;
  for (int i = 0; i < kEpisodeWorkers; ++i) {
    drivers_.push_back(std::make_unique<envs::EpisodeDriver>(*engine_, *ctx_.renderer, dc));
    episode_workers_.emplace_back(&RolloutRole::EpisodeWorker, this, drivers_.back().get());
  }
  Log().info("{} episode workers for multi-turn tasks (max {} turns, {} response tokens)",
             kEpisodeWorkers, job_.episode.max_turns, job_.episode.max_response_tokens);
}

void RolloutRole::StopEpisodeWorkers() {
  {
    MutexLock l(episode_mu_);
    episode_stop_ = true;
  }
  episode_cv_.notify_all();
  for (auto& d : drivers_) d->Cancel();  // running episodes end promptly
  for (auto& t : episode_workers_) t.join();
  episode_workers_.clear();
}

void RolloutRole::EpisodeWorker(envs::EpisodeDriver* driver) {
  while (true) {
    std::vector<EpisodeGroup> take;
    {
      MutexLock l(episode_mu_);
      // Bounded wait; the loop re-checks (stop requests also notify).
      episode_cv_.wait_until(
          l, Clock::now() + std::chrono::milliseconds(200),
          [&]() TROUPE_REQUIRES(episode_mu_) { return episode_stop_ || !episode_queue_.empty(); });
      if (episode_stop_) return;
      while (!episode_queue_.empty()) {
        take.push_back(std::move(episode_queue_.front()));
        episode_queue_.pop_front();
      }
    }
    if (!take.empty()) RunEpisodeGroups(driver, std::move(take));
  }
}

void RolloutRole::RunEpisodeGroups(envs::EpisodeDriver* driver, std::vector<EpisodeGroup> groups) {
  const size_t G = job_.batch.samples_per_prompt;
  std::vector<envs::EpisodeRequest> reqs;
  reqs.reserve(groups.size() * G);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (size_t k = 0; k < G; ++k) {
      envs::EpisodeRequest r;
      r.task = groups[gi].task;
      r.prompt = groups[gi].prompt;
      r.seed = groups[gi].seed + k * 0x9e3779b97f4a7c15ULL;
      r.tag = gi * G + k;
      reqs.push_back(std::move(r));
    }
  }
  std::vector<FinishedGroup> out(groups.size());
  std::vector<size_t> left(groups.size(), G);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    out[gi].serial = groups[gi].serial;
    out[gi].policy_version = UINT64_MAX;
    out[gi].seqs.resize(G);
  }
  auto on_done = [&](size_t index, const envs::EpisodeOutcome& o) {
    size_t gi = index / G, k = index % G;
    FinishedGroup& f = out[gi];
    const EpisodeGroup& g = groups[gi];
    if (!o.status.ok() || !o.episode) {
      if (f.failure.empty()) f.failure = "episode did not start: " + o.status.ToString();
    } else {
      const envs::TokenEpisode& e = *o.episode;
      SequenceRecord& sr = f.seqs[k];
      sr = TokenRecord(e.prompt_tokens(), e.response_tokens(), e.logprobs(), e.loss_mask(),
                       o.token_versions, WireFinish(e.episode().end()));
      if (e.episode().end() == envs::EpisodeEnd::kAborted) {
        sr.reject_reason = e.episode().abort_reason();
        if (f.failure.empty()) f.failure = "episode aborted: " + sr.reject_reason;
      }
      if (sr.response.empty() && f.failure.empty()) f.failure = "episode produced no tokens";
      DescribeSample(g.prompt, *g.task, &sr);
      sr.prompt_text = e.prompt_text();
      sr.response_text = e.response_text();
      sr.extra = e.episode().SummaryJson();
      f.policy_version = std::min(f.policy_version, o.policy_version);
      for (uint8_t m : sr.mask) {
        f.tokens += m;
        f.env_tokens += 1 - m;
      }
    }
    if (--left[gi] == 0) PushDone(std::move(f));
  };
  driver->Run(std::move(reqs), Deadline::InMs(kEpisodeRunTimeoutMs), on_done);
  // Run hands every episode to on_done (aborted ones included); a group the
  // driver never finished would be a driver bug.
  for (size_t gi = 0; gi < groups.size(); ++gi) TROUPE_CHECK_EQ(left[gi], 0u);
}

Status RolloutRole::StartAgents() {
  TROUPE_ASSIGN_OR_RETURN(agents_, envs::AgentClient::Create(job_.agents));
  // One token for the whole job, issued by the launcher: valid on every rollout actor of
  // the job (an agent may be handed any of them) and on no other job's.
  if (ctx_.endpoint_token.empty())
    return InvalidArgument(
        "the job has agent servers but no endpoint token was delivered (the launcher hands it "
        "to actors on stdin with --secrets-stdin; start actors with `troupe run`)");
  endpoint_token_ = ctx_.endpoint_token;
  GenerationEndpointOptions eo;
  eo.host = ctx_.bind_host;
  eo.model = job_.name;
  eo.token = endpoint_token_;
  eo.threads = static_cast<int>(job_.agents.EndpointThreads());
  eo.timeout_ms = job_.agents.endpoint_timeout_ms;
  eo.limits.max_n = static_cast<int32_t>(job_.agents.endpoint_max_n);
  eo.limits.max_tokens = job_.model.max_seq_len;
  eo.limits.max_prompt_tokens = static_cast<size_t>(job_.model.max_seq_len);
  eo.stop_ids = ctx_.stop_ids;
  eo.top_k = job_.sampling.top_k;
  eo.seed = DeriveSeed(job_.seed, id_ + "/endpoint", incarnation_);
  TROUPE_ASSIGN_OR_RETURN(endpoint_,
                          GenerationEndpoint::Start(*engine_, *ctx_.renderer, ledger_, eo,
                                                    [this] { return weights_ready_.load(); }));
  rt_.AddEndpoint("openai", endpoint_->BaseUrl());
  // /run calls block for a whole episode: enough workers for every server's limit.
  const auto workers = static_cast<size_t>(job_.agents.RunWorkers());
  for (size_t i = 0; i < workers; ++i) agent_workers_.emplace_back(&RolloutRole::AgentWorker, this);
  Log().info("{} agent server(s), {} /run workers; endpoint {} ({} HTTP threads)",
             job_.agents.servers.size(), workers, endpoint_->BaseUrl(), eo.threads);
  return Status::Ok();
}

void RolloutRole::StopAgentWorkers() {
  {
    MutexLock l(agent_mu_);
    agent_stop_ = true;
  }
  agent_cv_.notify_all();
  if (agents_) agents_->Cancel();  // /run calls in flight end now
  for (auto& t : agent_workers_) t.join();
  agent_workers_.clear();
}

void RolloutRole::QueueAgentGroup(uint64_t serial, const GroupInfo& g) {
  const size_t G = job_.batch.samples_per_prompt;
  auto state = std::make_shared<AgentGroupState>();
  {
    MutexLock l(state->mu);
    state->left = G;
    state->done.serial = serial;
    state->done.policy_version = UINT64_MAX;
    state->done.seqs.resize(G);
  }
  const std::string group = fmt::format("{}-{:x}-{}", id_, incarnation_, serial);
  ledger_.Open(group);
  const std::string& server = job_.agents.Route(envs::AgentRefOf(g.prompt.metadata));
  MutexLock l(agent_mu_);
  agent_groups_[serial] = state;
  for (size_t k = 0; k < G; ++k)
    agent_queue_.push_back(AgentJob{serial, k, group, server, g.task, g.prompt, engine_->version()});
  agent_cv_.notify_all();
}

void RolloutRole::AgentWorker() {
  while (true) {
    AgentJob job;
    std::shared_ptr<AgentGroupState> state;
    {
      MutexLock l(agent_mu_);
      agent_cv_.wait_until(
          l, Clock::now() + std::chrono::milliseconds(200),
          [&]() TROUPE_REQUIRES(agent_mu_) { return agent_stop_ || !agent_queue_.empty(); });
      if (agent_stop_) return;
      if (agent_queue_.empty()) continue;
      job = std::move(agent_queue_.front());
      agent_queue_.pop_front();
      state = agent_groups_.at(job.serial);
    }
    uint64_t version = job.start_version;
    SequenceRecord sr = RunAgentEpisode(job, &version);
    bool last = false;
    FinishedGroup f;
    {
      MutexLock l(state->mu);
      state->done.policy_version = std::min(state->done.policy_version, version);
      for (uint8_t m : sr.mask) {
        state->done.tokens += m;
        state->done.env_tokens += 1 - m;
      }
      state->done.seqs[job.k] = std::move(sr);
      last = --state->left == 0;
      if (last) f = std::move(state->done);
    }
    if (!last) continue;
    ledger_.Close(job.group);  // the group's generations are no longer needed
    {
      MutexLock l(agent_mu_);
      agent_groups_.erase(job.serial);
    }
    PushDone(std::move(f));
  }
}

// Plays one episode through the agent server and turns its answer into a
// record: the verified sequence, or (any failure) the prompt with one masked
// EOS, reward 0 and the reason in the episode record.
SequenceRecord RolloutRole::RunAgentEpisode(const AgentJob& job, uint64_t* version) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string episode_id = fmt::format("{}/{}", job.group, job.k);
  std::string body = envs::MakeRunBody(
      job.prompt.messages, job.prompt.id, job.task->name(), job.prompt.reference,
      job.prompt.metadata, endpoint_->BaseUrl(job.group), endpoint_token_, job_.name, episode_id,
      job_.sampling.temperature, job_.sampling.top_p,
      job.task->multi_turn() ? job_.episode.max_turn_tokens : job_.sampling.max_new_tokens);
  envs::AgentRunOutcome out = agents_->Run({job.server, std::move(body)},
                                           Deadline::InMs(job_.agents.call_timeout_ms));
  std::string kind, reason;
  envs::AgentEpisode ep;
  std::vector<uint64_t> versions;
  uint64_t oldest = job.start_version;
  if (!out.status.ok()) {
    kind = out.kind;
    reason = out.status.ToString();
  } else {
    auto parsed = envs::ParseAgentResponse(out.body, static_cast<size_t>(job_.model.max_seq_len));
    if (!parsed.ok()) {
      Code c = parsed.status().code();
      kind = c == Code::kCancelled ? "agent_error" : c == Code::kProtocol ? "mismatch" : "malformed";
      reason = parsed.status().ToString();
    } else {
      ep = std::move(parsed).value();
      Status v = ledger_.Verify(job.group, ep, &versions, &oldest);
      if (!v.ok()) {
        kind = "mismatch";
        reason = v.ToString();
      }
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  agents_->RecordEpisode(job.server, kind, ep.turns.size(), ms);
  nlohmann::json record = {{"score", kind.empty() ? ep.reward : 0.0},
                           {"end", kind.empty() ? "agent" : "agent_failed"},
                           {"turns", kind.empty() ? ep.turns.size() : 0}};
  if (!kind.empty()) record["failure"] = fmt::format("agent {} ({}): {}", job.server, kind, reason);
  nlohmann::json meta = nlohmann::json::parse(job.prompt.metadata.empty() ? "{}" : job.prompt.metadata,
                                              nullptr, false);
  nlohmann::json extra = {{"episode", record},
                          {"agent", {{"server", job.server}, {"episode_id", episode_id}}},
                          {"metadata", meta.is_discarded() ? nlohmann::json() : meta}};
  SequenceRecord sr;
  if (kind.empty()) {
    sr = TokenRecord(std::move(ep.prompt), std::move(ep.response), std::move(ep.logprobs),
                     std::move(ep.mask), std::move(versions), wire::FinishReason::SUBMITTED);
    sr.response_text = ep.transcript;
    *version = oldest;
  } else {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "episode {}: reward 0: {}", episode_id,
                        record["failure"].get<std::string>());
    auto ids = ctx_.renderer->RenderPrompt(job.prompt.messages);
    std::vector<int32_t> prompt = ids.ok() ? std::move(ids).value()
                                           : std::vector<int32_t>{ctx_.tokenizer->bos_id()};
    sr = TokenRecord(std::move(prompt), {ctx_.tokenizer->eos_id()}, {0.0f}, {0}, {0},
                     wire::FinishReason::REJECTED);
    sr.reject_reason = record["failure"].get<std::string>();
  }
  DescribeSample(job.prompt, *job.task, &sr);
  sr.prompt_text = ctx_.renderer->PromptText(job.prompt.messages);
  sr.extra = envs::SafeDump(extra);
  return sr;
}

std::vector<std::pair<std::string, double>> RolloutRole::AgentStats() const {
  std::vector<std::pair<std::string, double>> out;
  if (!agents_) return out;
  out = agents_->StatsForMetrics();
  auto more = endpoint_->StatsForMetrics();
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

void RolloutRole::CollectFinished() {
  std::deque<FinishedGroup> got;
  {
    MutexLock l(done_mu_);
    got.swap(done_);
  }
  for (auto& g : got) {
    auto it = in_flight_.find(g.serial);
    TROUPE_CHECK(it != in_flight_.end());
    const GroupInfo& meta = it->second;
    g.grant_learner = meta.grant_learner;
    if (g.stale) {
      // Not generated (never sent, never counted in `generated`): its credit goes back to the
      // learner that granted it with the next request (Credit.abandoned).
      ++stale_groups_;
      if (meta.grant_learner == grant_learner_) ++abandoned_;
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::info, 5000,
                          "group {} ({}) cut short: {} ({} such groups so far)", g.serial,
                          meta.prompt.id, g.failure, stale_groups_);
      in_flight_.erase(it);
      continue;
    }
    if (!g.failure.empty()) {
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::err, 2000, "group {} ({}) not generated: {}",
                          g.serial, meta.prompt.id, g.failure);
      ++rejected_groups_;
      in_flight_.erase(it);
      continue;
    }
    if (!meta.task->multi_turn() && !agents_) {
      for (auto& s : g.seqs) {
        DescribeSample(meta.prompt, *meta.task, &s);
        s.prompt_text = meta.prompt_text;
        s.extra = meta.prompt.metadata;
        std::vector<int32_t> visible;
        for (int32_t id : s.response)
          if (!ctx_.tokenizer->IsSpecial(id)) visible.push_back(id);
        auto text = ctx_.tokenizer->Decode(visible);
        s.response_text = text.ok() ? *text : "";
      }
    }
    token_rate_.Add(static_cast<double>(g.tokens));
    gen_tokens_ += g.tokens;
    gen_env_tokens_ += g.env_tokens;
    if (slow_) {
      // A slow node: each group takes slow_ms_per_group longer (serially).
      auto base = std::max(std::chrono::steady_clock::now(), slow_until_);
      slow_until_ = base + std::chrono::milliseconds(job_.rollout_settings.slow_ms_per_group);
      g.release = slow_until_;
    }
    ready_.push_back(std::move(g));
  }
}

Status RolloutRole::SendReady(bool flush_all) {
  const size_t per = job_.batch.groups_per_message;
  auto now = std::chrono::steady_clock::now();
  auto released = [&] {
    size_t n = 0;
    while (n < ready_.size() && ready_[n].release <= now) ++n;
    return n;
  };
  // Oldest groups first, and together: a message's version is its oldest group's. The learner
  // gates each group by its own version (sequenceVersions), so a group too old no longer takes
  // fresh ones beside it down, but the oldest still go first: they are closest to the limit.
  // (Held groups, rollout.slow_actor, keep their release order.)
  if (!slow_)
    std::stable_sort(ready_.begin(), ready_.end(), [](const FinishedGroup& a, const FinishedGroup& b) {
      return a.policy_version < b.policy_version;
    });
  while (released() >= per || (flush_all && !ready_.empty())) {
    size_t take = std::min(per, ready_.size());
    // Built from the groups in place (a failed send keeps them for a retry).
    std::vector<const SequenceRecord*> seqs;
    RolloutBatchInfo info;
    info.producer = id_;
    info.producer_incarnation = incarnation_;
    info.grant_learner = grant_learner_;
    info.group_size = job_.batch.samples_per_prompt;
    info.batch_id = fmt::format("{}/{:x}/{}", id_, incarnation_, batches_sent_);
    info.policy_version = UINT64_MAX;
    info.created_ns = WallTimeNs();
    for (size_t gi = 0; gi < take; ++gi) {
      auto& g = ready_[gi];
      info.policy_version = std::min(info.policy_version, g.policy_version);
      if (g.grant_learner == grant_learner_) ++info.granted_groups;
      for (auto& r : g.seqs) {
        r.group_index = static_cast<uint32_t>(gi);
        r.start_version = g.policy_version;  // the learner gates each group by its own
        seqs.push_back(&r);
      }
    }
    transport::OutMessage msg;
    TROUPE_RETURN_IF_ERROR(BuildRolloutBatch(info, seqs, &msg));
    Status s = sender_->Send(msg, Deadline::InMs(flush_all ? 2000 : 50));
    if (!s.ok()) {
      if (s.code() == Code::kResourceExhausted || s.code() == Code::kTimeout)
        return Status::Ok();  // outbox full: retry later
      return s.WithContext("send rollout batch");
    }
    generated_.fetch_add(seqs.size());
    ++batches_sent_;
    for (size_t gi = 0; gi < take; ++gi) in_flight_.erase(ready_[gi].serial);
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<long>(take));
  }
  return Status::Ok();
}

std::vector<std::pair<std::string, double>> RolloutRole::EpisodeStats() const {
  if (drivers_.empty()) return {};
  envs::EpisodeDriverStats sum;
  for (const auto& d : drivers_) {
    auto st = d->Stats();
    sum.episodes += st.episodes;
    sum.start_failures += st.start_failures;
    sum.submitted += st.submitted;
    sum.turn_limit += st.turn_limit;
    sum.token_limit += st.token_limit;
    sum.aborted += st.aborted;
    sum.turns += st.turns;
    sum.score_sum += st.score_sum;
    sum.flags += st.flags;
  }
  return sum.AsStats();
}

void RolloutRole::UpdateStats() {
  if (SecondsSince(last_stats_) < 0.5) return;
  last_stats_ = std::chrono::steady_clock::now();
  auto st = sender_->stats();
  uint64_t gen = generated_.load(), res = resolved_.load();
  std::map<std::string, double> stats = {
      {"gen_tokens_per_s", token_rate_.Update()},
      {"generated", static_cast<double>(gen)},
      {"resolved", static_cast<double>(res)},
      {"in_flight", static_cast<double>(gen - res)},
      {"rejected", static_cast<double>(rejected_.load())},
      {"rejected_by_reward", static_cast<double>(rejected_by_reward_.load())},
      {"credits", static_cast<double>(credits_)},
      {"groups_generating", static_cast<double>(in_flight_.size() - ready_.size())},
      {"outbox", static_cast<double>(st.queued + st.in_flight)},
      {"retransmits", static_cast<double>(st.retransmits)},
      {"rejected_groups", static_cast<double>(rejected_groups_)},
      {"cut_short_stale_groups", static_cast<double>(stale_groups_)}};
  for (const auto& [k, v] : EpisodeStats()) stats[k] = v;
  for (const auto& [k, v] : AgentStats()) stats[k] = v;
  AddDeliveryStats(nullptr, &st, &stats);
  rt_.SetStats(stats);
  rt_.SetPolicyVersion(engine_->version());
}

void RolloutRole::Drain() {
  Log().info("draining: {} groups generating, {} finished, outbox {}",
             in_flight_.size() - ready_.size(), ready_.size(),
             sender_->stats().in_flight + sender_->stats().queued);
  auto deadline = Deadline::InMs(job_.rollout_settings.drain_timeout_ms);
  // 1. Let generating groups finish (they hold credits the learner counted).
  while (in_flight_.size() > ready_.size() && !deadline.expired()) {
    CollectFinished();
    std::this_thread::sleep_for(
        std::chrono::milliseconds(2));  // engine callbacks have no fd to wait on
  }
  CollectFinished();
  SendReady(true).IgnoreError();
  ReturnCredits();  // grants it will not start: the other actors go on meanwhile
  // 2. Deliver: wait for acknowledgements, or until nothing moves for a while
  //    once the learner is gone (at job end nobody will acknowledge more).
  uint64_t last = outcomes_.load();
  auto quiet_since = std::chrono::steady_clock::now();
  while (!deadline.expired()) {
    auto st = sender_->stats();
    if (st.in_flight + st.queued == 0) break;
    if (outcomes_.load() != last) {
      last = outcomes_.load();
      quiet_since = std::chrono::steady_clock::now();
    }
    PollCredits();  // a grant that crossed the return goes back too
    ReturnCredits();
    bool learner_gone = rt_.directory().Live("learner").empty();
    if (learner_gone && SecondsSince(quiet_since) > 0.5) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(10));  // outcomes arrive on the sender thread
  }
}

void RolloutRole::ReturnCredits() {
  if (!credit_sock_ || credits_ <= 0) return;
  transport::OutMessage m;
  m.envelope().getBody().initCredit().setReturned(static_cast<uint32_t>(credits_));
  Status s = credit_sock_->Send(m, Deadline::InMs(50));
  if (!s.ok()) {  // the learner reclaims them once this actor has left the directory
    Log().debug("returning {} credits: {}", credits_, s.ToString());
    return;
  }
  Log().info("returned {} granted groups it will not start", credits_);
  credits_ = 0;
}

Status RolloutRole::Run() {
  TROUPE_RETURN_IF_ERROR(Setup());
  TROUPE_RETURN_IF_ERROR(rt_.Register(Deadline::InMs(60000)));
  Log().info("rollout actor up: {} slots, {} groups in flight at most", job_.engine.num_slots,
             job_.rollout_settings.max_groups_in_flight);
  bool announced = false;
  while (!rt_.should_exit()) {
    SyncDirectory();
    // The learner refused our weight receiver (its adapters do not fit this engine): never
    // generate with the base or the wrong adapters; exit with the mismatch instead.
    if (receiver_ && !receiver_->refusal().ok()) {
      Status why = receiver_->refusal();
      Log().error("cannot take the learner's weights: {}", why.message());
      return why;
    }
    if (!announced && receiver_ && receiver_->stats().delivered > 0) {
      announced = true;
      weights_ready_ = true;
      Log().info("got weights version {}; generating", engine_->version());
    }
    RequestCredits();
    TROUPE_RETURN_IF_ERROR(SubmitGroups());
    // Sleep until there is something to do. Credits, finished groups and new weights wake
    // the loop; the tick is for the directory, stats, credit re-requests and exit. Sends
    // that found the outbox full and held groups (slow-actor fault injection) retry soon.
    const bool retry_soon = ready_.size() >= job_.batch.groups_per_message || slow_;
    wake_on_weights_.store(!announced || waiting_for_weights_, std::memory_order_relaxed);
    WaitForWork(Deadline::InMs(retry_soon ? 2 : kLoopTickMs));
    CollectFinished();
    TROUPE_RETURN_IF_ERROR(SendReady(false));
    UpdateStats();
  }
  double active_s = first_submit_ ? SecondsSince(*first_submit_) : 0;
  // CPU of the whole process (every thread: engine, transport, weight updates)
  // while generating: tokens per CPU-second is what the actor system costs,
  // whatever share of the cores other processes took (bench/actors).
  double active_cpu_s = first_submit_ ? ProcessCpuSeconds() - first_submit_cpu_ : 0;
  // The engine's share of it, and how full its decode batches were (bench/actors/job_bench.py
  // compares both with the engine alone).
  const engine::EngineStats es = engine_->stats(),& e0 = engine_at_first_submit_;
  if (rt_.exit_reason() != ExitReason::kHeadLost) Drain();
  StopEpisodeWorkers();
  StopAgentWorkers();
  uint64_t gen = generated_.load(), res = resolved_.load();
  std::map<std::string, double> final_metrics = {
      {"generated", static_cast<double>(gen)},
      {"gen_tokens", static_cast<double>(gen_tokens_)},
      {"gen_env_tokens", static_cast<double>(gen_env_tokens_)},
      {"gen_active_s", active_s},
      {"gen_cpu_s", active_cpu_s},
      {"engine_step_cpu_s", es.step_cpu_seconds - e0.step_cpu_seconds},
      {"engine_decode_steps", static_cast<double>(es.decode_steps - e0.decode_steps)},
      {"engine_prefill_steps", static_cast<double>(es.prefill_steps - e0.prefill_steps)},
      {"engine_tokens", static_cast<double>(es.generated_tokens - e0.generated_tokens)},
      {"engine_weight_updates", static_cast<double>(es.weight_updates - e0.weight_updates)},
      {"resolved", static_cast<double>(res)},
      {"in_flight", static_cast<double>(gen - res)},
      {"rejected_by_reward", static_cast<double>(rejected_by_reward_.load())},
      {"rejected_groups", static_cast<double>(rejected_groups_)},
      {"cut_short_stale_groups", static_cast<double>(stale_groups_)},
      {"cut_short_stale_sequences",  // single-turn groups only: samples_per_prompt each
       static_cast<double>(stale_groups_ * job_.batch.samples_per_prompt)}};
  for (const auto& [k, v] : EpisodeStats()) final_metrics[k] = v;
  for (const auto& [k, v] : AgentStats()) final_metrics[k] = v;
  rt_.SendMetrics("final", 0, engine_->version(), final_metrics);
  rt_.SetStats({{"generated", static_cast<double>(gen)},
                {"resolved", static_cast<double>(res)},
                {"in_flight", static_cast<double>(gen - res)},
                {"rejected_by_reward", static_cast<double>(rejected_by_reward_.load())}});
  Log().info("exiting ({}): generated {} sequences, {} resolved, {} in flight",
             ExitReasonName(rt_.exit_reason()), gen, res, gen - res);
  if (receiver_) receiver_->Leave(Deadline::InMs(2000)).IgnoreError();
  return Status::Ok();
}

}  // namespace

Status RunRollout(ActorRuntime& runtime, transport::Network& network, JobContext& ctx) {
  RolloutRole role(runtime, network, ctx);
  return role.Run();
}

}  // namespace troupe::actors
