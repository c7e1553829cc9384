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
#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>

#include "batch_codec.h"
#include "role_common.h"
#include "roles.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/envs/sampler.h"
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

struct GroupInfo {
  const envs::Task* task = nullptr;
  envs::Prompt prompt;
  std::string prompt_text;
};

struct FinishedGroup {
  uint64_t serial = 0;
  std::vector<engine::GenerationResult> results;
  std::chrono::steady_clock::time_point release{};  // fault injection: not sent before this
};

class RolloutRole {
 public:
  RolloutRole(ActorRuntime& rt, transport::Network& net, JobContext& ctx)
      : rt_(rt), net_(net), ctx_(ctx), job_(ctx.job) {}
  Status Run();

 private:
  Status Setup();
  void SyncDirectory();
  void ConnectLearner(const std::string& data, const std::string& weights);
  void PollCredits(Deadline deadline);
  void RequestCredits();
  Status SubmitGroups();
  void CollectFinished();
  Status SendReady(bool flush_all);
  void UpdateStats();
  void Drain();
  void OnOutcome(const transport::DeliveryOutcome& o);

  ActorRuntime& rt_;
  transport::Network& net_;
  JobContext& ctx_;
  const launcher::JobConfig& job_;
  std::string id_;
  uint64_t incarnation_ = 0;
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
  uint64_t learner_version_ = 0;
  uint64_t next_serial_ = 0;
  std::optional<envs::PromptStream> prompts_;  // this incarnation's own weighted task mix
  std::map<uint64_t, GroupInfo> in_flight_;
  std::mutex done_mu_;
  std::deque<FinishedGroup> done_;  // filled on the engine thread
  std::vector<FinishedGroup> ready_;
  uint64_t batches_sent_ = 0;

  // Accounting (sequences).
  std::atomic<uint64_t> generated_{0}, resolved_{0}, rejected_{0};
  uint64_t rejected_groups_ = 0;
  int64_t gen_tokens_ = 0;                                   // sampled tokens of finished groups
  std::optional<std::chrono::steady_clock::time_point> first_submit_;  // start of generation
  bool slow_ = false;  // fault injection (rollout.slow_actor)
  std::chrono::steady_clock::time_point slow_until_{};
  RateMeter token_rate_;
  std::atomic<uint64_t> outcomes_{0};
  std::chrono::steady_clock::time_point last_stats_ = std::chrono::steady_clock::now();
};

Status RolloutRole::Setup() {
  id_ = rt_.options().actor_id;
  slow_ = !job_.rollout_settings.slow_actor.empty() && job_.rollout_settings.slow_actor == id_ &&
          job_.rollout_settings.slow_ms_per_group > 0;
  if (slow_)
    Log().warn("fault injection: holding every group {} ms",
               job_.rollout_settings.slow_ms_per_group);
  incarnation_ = net_.identity().incarnation;
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
  ec.init_seed = DeriveSeed(job_.seed, "policy-init");
  TROUPE_ASSIGN_OR_RETURN(engine_, engine::Engine::Create(ec));
  transport::ReliableSenderOptions so;
  so.max_outbox_messages = job_.rollout_settings.outbox_messages;
  sender_ = std::make_unique<transport::ReliableSender>(&net_, so);
  sender_->SetOutcomeCallback([this](const transport::DeliveryOutcome& o) { OnOutcome(o); });
  return Status::Ok();
}

void RolloutRole::OnOutcome(const transport::DeliveryOutcome& o) {
  uint64_t n = o.message.reader().getBody().getRolloutBatch().getNumSequences();
  resolved_.fetch_add(n);
  if (!o.accepted) {
    rejected_.fetch_add(n);
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "batch rejected by {}: {}", o.peer,
                        o.reason);
  }
  outcomes_.fetch_add(1);
}

void RolloutRole::ConnectLearner(const std::string& data, const std::string& weights) {
  if (data != learner_data_) {
    learner_data_ = data;
    credit_sock_.reset();
    credits_ = 0;  // a new learner knows nothing of the old grants
    credit_version_ = 0;
    last_request_.reset();
    transport::SocketOptions so;
    so.identity = id_;
    so.linger_ms = 0;
    auto s = net_.Connect(transport::SocketKind::kClient, data, so);
    if (s.ok())
      credit_sock_ = std::move(s).value();
    else
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
    auto* engine = engine_.get();
    // The learner is the authority on versions: a learner restarted from an
    // older checkpoint sends a lower version, and it replaces ours.
    auto r = broadcast::WeightReceiver::Create(rc, [engine](const broadcast::ReceivedWeights& w) {
      return engine->UpdateWeights(w.version, w.named, Deadline::InMs(30000),
                                   /*allow_rollback=*/true);
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

void RolloutRole::PollCredits(Deadline deadline) {
  if (!credit_sock_) return;
  while (true) {
    auto in = credit_sock_->Recv(deadline);
    if (!in.ok()) return;
    deadline = Deadline::Now();
    if (in->message.kind() != transport::MessageKind::CREDIT) continue;
    auto c = in->message.envelope().getBody().getCredit();
    credits_ += c.getGranted();
    learner_version_ = c.getLearnerVersion();
    credit_version_ = std::max(credit_version_, learner_version_);
    last_request_.reset();
  }
}

void RolloutRole::RequestCredits() {
  if (!credit_sock_ || rt_.should_exit()) return;
  const int64_t unit = job_.batch.groups_per_message;
  int64_t want = static_cast<int64_t>(job_.rollout_settings.max_groups_in_flight) - credits_ -
                 static_cast<int64_t>(in_flight_.size());
  want = want / unit * unit;  // whole messages only
  if (want <= 0) return;
  auto now = std::chrono::steady_clock::now();
  if (last_request_ &&
      now - *last_request_ < std::chrono::milliseconds(job_.rollout_settings.credit_timeout_ms))
    return;
  transport::OutMessage m;
  auto c = m.envelope().getBody().initCredit();
  c.setRequested(static_cast<uint32_t>(want));
  c.setOutstanding(static_cast<uint32_t>(credits_));
  if (credit_sock_->Send(m, Deadline::InMs(50)).ok()) last_request_ = now;
}

Status RolloutRole::SubmitGroups() {
  if (!receiver_ || receiver_->stats().delivered == 0) return Status::Ok();  // no weights yet
  // Granted groups start only with weights at least as new as the grant (the
  // staleness rule counts from that version); new weights are milliseconds away.
  if (engine_->version() < credit_version_) return Status::Ok();
  while (credits_ > 0 && in_flight_.size() < job_.rollout_settings.max_groups_in_flight) {
    uint64_t serial = next_serial_++;
    envs::TaskPrompt tp = prompts_->Next();
    GroupInfo g;
    g.task = tp.task;
    g.prompt = std::move(tp.prompt);
    g.prompt_text = ctx_.renderer->PromptText(g.prompt.messages);
    auto ids = ctx_.renderer->RenderPrompt(g.prompt.messages);
    if (!ids.ok()) return ids.status().WithContext("rendering prompt " + g.prompt.id);
    engine::GenerateRequest req;
    req.prompt = std::move(ids).value();
    req.sampling.temperature = job_.sampling.temperature;
    req.sampling.top_k = job_.sampling.top_k;
    req.sampling.top_p = job_.sampling.top_p;
    req.sampling.max_new_tokens = job_.sampling.max_new_tokens;
    req.sampling.stop_token_ids = {ctx_.tokenizer->eos_id()};
    req.sampling.num_samples = static_cast<int32_t>(job_.batch.samples_per_prompt);
    req.sampling.seed = DeriveSeed(job_.seed, id_, incarnation_ * 1000003 + serial);
    req.tag = serial;
    in_flight_[serial] = std::move(g);
    --credits_;
    if (!first_submit_) first_submit_ = std::chrono::steady_clock::now();
    Status s =
        engine_->Submit(std::move(req), [this, serial](std::vector<engine::GenerationResult> res) {
          std::lock_guard<std::mutex> l(done_mu_);
          done_.push_back({serial, std::move(res)});
        });
    if (!s.ok()) {
      in_flight_.erase(serial);
      return s.WithContext("engine submit");
    }
  }
  return Status::Ok();
}

void RolloutRole::CollectFinished() {
  std::deque<FinishedGroup> got;
  {
    std::lock_guard<std::mutex> l(done_mu_);
    got.swap(done_);
  }
  for (auto& g : got) {
    bool bad = false;
    for (const auto& r : g.results) {
      if (r.finish_reason == engine::FinishReason::kRejected ||
          r.finish_reason == engine::FinishReason::kAborted) {
        bad = true;
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::err, 2000, "group {} not generated: {}", g.serial,
                            r.reject_reason);
      }
    }
    if (bad) {
      ++rejected_groups_;
      in_flight_.erase(g.serial);
      continue;
    }
    int64_t tokens = 0;
    for (const auto& r : g.results) tokens += r.num_new_tokens;
    token_rate_.Add(static_cast<double>(tokens));
    gen_tokens_ += tokens;
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
  while (released() >= per || (flush_all && !ready_.empty())) {
    size_t take = std::min(per, ready_.size());
    std::vector<SequenceRecord> seqs;
    RolloutBatchInfo info;
    info.producer = id_;
    info.group_size = job_.batch.samples_per_prompt;
    info.batch_id = fmt::format("{}/{:x}/{}", id_, incarnation_, batches_sent_);
    info.policy_version = UINT64_MAX;
    info.created_ns = WallTimeNs();
    for (size_t gi = 0; gi < take; ++gi) {
      auto& g = ready_[gi];
      const GroupInfo& meta = in_flight_.at(g.serial);
      for (auto& r : g.results) {
        info.policy_version = std::min(info.policy_version, r.policy_version);
        SequenceRecord s;
        s.prompt = r.prompt_ids;
        s.response = r.response_ids;
        s.logprobs = r.logprobs;
        s.mask = r.mask;
        s.token_versions = r.token_versions;
        s.group_index = static_cast<uint32_t>(gi);
        s.finish = WireFinish(r.finish_reason);
        s.prompt_id = meta.prompt.id;
        s.task = meta.task->name();
        s.reference = meta.prompt.reference;
        s.service = meta.prompt.service;
        s.prompt_text = meta.prompt_text;
        s.extra = meta.prompt.metadata;
        std::vector<int32_t> visible;
        for (int32_t id : r.response_ids)
          if (!ctx_.tokenizer->IsSpecial(id)) visible.push_back(id);
        auto text = ctx_.tokenizer->Decode(visible);
        s.response_text = text.ok() ? *text : "";
        seqs.push_back(std::move(s));
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

void RolloutRole::UpdateStats() {
  if (SecondsSince(last_stats_) < 0.5) return;
  last_stats_ = std::chrono::steady_clock::now();
  auto st = sender_->stats();
  uint64_t gen = generated_.load(), res = resolved_.load();
  rt_.SetStats({{"gen_tokens_per_s", token_rate_.Update()},
                {"generated", static_cast<double>(gen)},
                {"resolved", static_cast<double>(res)},
                {"in_flight", static_cast<double>(gen - res)},
                {"rejected", static_cast<double>(rejected_.load())},
                {"credits", static_cast<double>(credits_)},
                {"groups_generating", static_cast<double>(in_flight_.size() - ready_.size())},
                {"outbox", static_cast<double>(st.queued + st.in_flight)},
                {"retransmits", static_cast<double>(st.retransmits)},
                {"rejected_groups", static_cast<double>(rejected_groups_)}});
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
    bool learner_gone = rt_.directory().Live("learner").empty();
    if (learner_gone && SecondsSince(quiet_since) > 0.5) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(10));  // outcomes arrive on the sender thread
  }
}

Status RolloutRole::Run() {
  TROUPE_RETURN_IF_ERROR(Setup());
  TROUPE_RETURN_IF_ERROR(rt_.Register(Deadline::InMs(60000)));
  Log().info("rollout actor up: {} slots, {} groups in flight at most", job_.engine.num_slots,
             job_.rollout_settings.max_groups_in_flight);
  bool announced = false;
  while (!rt_.should_exit()) {
    SyncDirectory();
    if (!announced && receiver_ && receiver_->stats().delivered > 0) {
      announced = true;
      Log().info("got weights version {}; generating", engine_->version());
    }
    RequestCredits();
    TROUPE_RETURN_IF_ERROR(SubmitGroups());
    PollCredits(Deadline::InMs(2));
    CollectFinished();
    TROUPE_RETURN_IF_ERROR(SendReady(false));
    UpdateStats();
  }
  double active_s = first_submit_ ? SecondsSince(*first_submit_) : 0;
  if (rt_.exit_reason() != ExitReason::kHeadLost) Drain();
  uint64_t gen = generated_.load(), res = resolved_.load();
  rt_.SendMetrics("final", 0, engine_->version(),
                  {{"generated", static_cast<double>(gen)},
                   {"gen_tokens", static_cast<double>(gen_tokens_)},
                   {"gen_active_s", active_s},
                   {"resolved", static_cast<double>(res)},
                   {"in_flight", static_cast<double>(gen - res)},
                   {"rejected_groups", static_cast<double>(rejected_groups_)}});
  rt_.SetStats({{"generated", static_cast<double>(gen)},
                {"resolved", static_cast<double>(res)},
                {"in_flight", static_cast<double>(gen - res)}});
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
