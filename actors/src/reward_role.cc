// The reward role.
//
//   rollout-* ──RolloutBatch──▶ [data socket] ReliableReceiver
//        ──RewardScorer (task verifiers, HTTP reward services)──▶ ScoredBatch
//        ──ReliableSender──▶ learner
//   learner ack/reject ──▶ ack/reject the rollout batch upstream
//
// A rollout batch is acknowledged only when the learner has processed its
// scored batch, so if this actor dies the rollout actor re-sends everything
// unacknowledged to another reward actor: nothing is lost, and the learner
// drops the copies it already has (dedupe by batch id). Tensors are forwarded
// by reference to the received frames, never copied.
#include <map>
#include <mutex>

#include "batch_codec.h"
#include "role_common.h"
#include "roles.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/envs/scorer.h"
#include "troupe/transport/reliable.h"

namespace troupe::actors {
namespace {

spdlog::logger& Log() {
  return log::Get("reward");
}

class RewardRole {
 public:
  RewardRole(ActorRuntime& rt, transport::Network& net, JobContext& ctx)
      : rt_(rt), net_(net), ctx_(ctx), job_(ctx.job) {}
  Status Run();

 private:
  void SyncDirectory();
  void Handle(transport::Delivery d);
  void OnOutcome(const transport::DeliveryOutcome& o);
  void UpdateStats();

  ActorRuntime& rt_;
  transport::Network& net_;
  JobContext& ctx_;
  const launcher::JobConfig& job_;
  std::unique_ptr<envs::RewardScorer> scorer_;
  std::unique_ptr<transport::Socket> data_;
  std::unique_ptr<transport::ReliableReceiver> receiver_;
  std::unique_ptr<transport::ReliableSender> sender_;
  std::string learner_id_, learner_ep_;
  uint64_t seen_epoch_ = 0;

  Mutex mu_;
  // Batch id -> the rollout deliveries awaiting the learner: the first, then
  // copies re-sent under new sequence numbers. All get the learner's one
  // answer, so the rollout actor never counts a batch resolved before the
  // learner decided it.
  std::map<std::string, std::vector<transport::Delivery>> upstream_ TROUPE_GUARDED_BY(mu_);
  std::atomic<uint64_t> scored_{0}, forwarded_{0}, invalid_seqs_{0}, acked_{0}, rejected_{0};
  RateMeter rate_;
  std::chrono::steady_clock::time_point last_stats_ = std::chrono::steady_clock::now();
};

void RewardRole::OnOutcome(const transport::DeliveryOutcome& o) {
  std::string id = o.message.reader().getBody().getScoredBatch().getRollout().getBatchId();
  std::vector<transport::Delivery> ups;
  {
    MutexLock l(mu_);
    auto it = upstream_.find(id);
    if (it == upstream_.end()) return;
    ups = std::move(it->second);
    upstream_.erase(it);
  }
  if (o.accepted) {
    for (auto& up : ups) receiver_->Ack(up);
    acked_.fetch_add(1);
  } else {
    for (auto& up : ups) receiver_->Reject(up, "learner: " + o.reason);
    rejected_.fetch_add(1);
  }
}

void RewardRole::SyncDirectory() {
  auto dir = rt_.directory();
  if (dir.epoch == seen_epoch_) return;
  seen_epoch_ = dir.epoch;
  auto learners = dir.Live("learner");
  if (learners.empty()) return;
  auto it = learners[0].endpoints.find("data");
  if (it == learners[0].endpoints.end() || it->second == learner_ep_) return;
  if (!learner_id_.empty()) sender_->RemovePeer(learner_id_).IgnoreError();
  learner_id_ = learners[0].id + "@" + it->second;  // a restarted learner is a new peer
  learner_ep_ = it->second;
  Status s = sender_->ConnectPeer(learner_id_, learner_ep_);
  if (!s.ok())
    Log().error("cannot connect to the learner at {}: {}", learner_ep_, s.ToString());
  else
    Log().info("learner at {}", learner_ep_);
}

void RewardRole::Handle(transport::Delivery d) {
  auto t0 = std::chrono::steady_clock::now();
  std::string batch_id;
  uint32_t n = 0;
  auto items = ReadScoringItems(d.message, &batch_id, &n);
  if (!items.ok()) {
    invalid_seqs_.fetch_add(n);
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "rejecting a batch from {}: {}", d.peer,
                        items.status().ToString());
    if (d.sequenced()) receiver_->Reject(d, items.status().ToString());
    return;
  }
  {
    MutexLock l(mu_);
    auto it = upstream_.find(batch_id);
    if (it != upstream_.end()) {
      // The same batch again under a new sequence number (re-routed): not
      // scored twice; answered when the learner answers the first copy.
      it->second.push_back(std::move(d));
      return;
    }
  }
  std::vector<envs::ScoreRequest> reqs;
  reqs.reserve(items->size());
  for (auto& it : *items) {
    reqs.push_back({std::move(it.task), std::move(it.prompt_text), std::move(it.response_text),
                    std::move(it.reference), std::move(it.service), std::move(it.extra)});
  }
  auto results = scorer_->ScoreBatch(reqs, Deadline::InMs(job_.reward_settings.score_timeout_ms));
  std::vector<RewardRecord> rewards;
  rewards.reserve(results.size());
  for (auto& r : results)
    rewards.push_back({static_cast<float>(r.reward), r.scorer, r.failure, r.components, r.unscored});
  transport::OutMessage out;
  Status s = ForwardScored(
      d.message, rewards, rt_.options().actor_id,
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count(),
      &out);
  if (!s.ok()) {
    invalid_seqs_.fetch_add(n);
    Log().warn("rejecting batch {}: {}", batch_id, s.ToString());
    if (d.sequenced()) receiver_->Reject(d, s.ToString());
    return;
  }
  scored_.fetch_add(n);
  rate_.Add(n);
  {
    MutexLock l(mu_);  // Handle runs on one thread: no copy came meanwhile
    upstream_[batch_id].push_back(std::move(d));
  }
  // Blocks while the outbox is full: backpressure reaches the rollout actors.
  while (!rt_.should_exit()) {
    Status sent = sender_->Send(out, Deadline::InMs(200));
    if (sent.ok()) {
      forwarded_.fetch_add(1);
      return;
    }
    if (sent.code() != Code::kResourceExhausted && sent.code() != Code::kTimeout) {
      Log().error("cannot forward batch {}: {}", batch_id, sent.ToString());
      break;
    }
    SyncDirectory();
  }
  MutexLock l(mu_);
  upstream_.erase(batch_id);  // not forwarded: the rollout actor keeps it and re-sends it
}

void RewardRole::UpdateStats() {
  if (SecondsSince(last_stats_) < 0.5) return;
  last_stats_ = std::chrono::steady_clock::now();
  auto st = sender_->stats();
  size_t waiting;
  {
    MutexLock l(mu_);
    waiting = upstream_.size();
  }
  std::map<std::string, double> s = {{"scored_per_s", rate_.Update()},
                                     {"scored", static_cast<double>(scored_.load())},
                                     {"dropped_invalid", static_cast<double>(invalid_seqs_.load())},
                                     {"awaiting_learner", static_cast<double>(waiting)},
                                     {"outbox", static_cast<double>(st.queued + st.in_flight)}};
  for (const auto& [k, v] : scorer_->StatsForMetrics()) s[k] = v;
  const auto received = receiver_->stats();
  AddDeliveryStats(&received, &st, &s);
  rt_.SetStats(s);
}

Status RewardRole::Run() {
  TROUPE_ASSIGN_OR_RETURN(scorer_, envs::RewardScorer::Create(job_.tasks, job_.reward_services));
  transport::SocketOptions so;
  so.linger_ms = 0;
  TROUPE_ASSIGN_OR_RETURN(data_, net_.Bind(transport::SocketKind::kServer, ctx_.AnyPort(), so));
  receiver_ = std::make_unique<transport::ReliableReceiver>(data_.get());
  transport::ReliableSenderOptions sopt;
  sopt.max_outbox_messages = job_.reward_settings.outbox_messages;
  sender_ = std::make_unique<transport::ReliableSender>(&net_, sopt);
  sender_->SetOutcomeCallback([this](const transport::DeliveryOutcome& o) { OnOutcome(o); });
  rt_.AddEndpoint("data", data_->endpoint());
  TROUPE_RETURN_IF_ERROR(rt_.Register(Deadline::InMs(60000)));
  Log().info("reward actor serving at {}", data_->endpoint());
  while (!rt_.should_exit()) {
    SyncDirectory();
    auto d = receiver_->Recv(Deadline::InMs(20));
    if (d.ok()) Handle(std::move(d).value());
    UpdateStats();
  }
  // Drain: pass the learner's last acknowledgements upstream, then go.
  if (rt_.exit_reason() != ExitReason::kHeadLost) {
    auto deadline = Deadline::InMs(3000);
    uint64_t last = acked_.load() + rejected_.load();
    auto quiet = std::chrono::steady_clock::now();
    while (!deadline.expired()) {
      {
        MutexLock l(mu_);
        if (upstream_.empty()) break;
      }
      uint64_t now = acked_.load() + rejected_.load();
      if (now != last) {
        last = now;
        quiet = std::chrono::steady_clock::now();
      }
      if (rt_.directory().Live("learner").empty() && SecondsSince(quiet) > 0.3) break;
      std::this_thread::sleep_for(
          std::chrono::milliseconds(10));  // outcomes arrive on the sender thread
    }
    receiver_->FlushAcks(Deadline::InMs(500)).IgnoreError();
  }
  std::map<std::string, double> final_stats = {
      {"scored", static_cast<double>(scored_.load())},
      {"dropped_invalid", static_cast<double>(invalid_seqs_.load())},
      {"forwarded_batches", static_cast<double>(forwarded_.load())}};
  // Per-task and per-service counters (task.<name>.*, reward_service.<name>.*).
  for (const auto& [k, v] : scorer_->StatsForMetrics()) final_stats[k] = v;
  rt_.SendMetrics("final", 0, 0, final_stats);
  Log().info("exiting ({}): scored {} sequences", ExitReasonName(rt_.exit_reason()),
             scored_.load());
  return Status::Ok();
}

}  // namespace

Status RunReward(ActorRuntime& runtime, transport::Network& network, JobContext& ctx) {
  RewardRole role(runtime, network, ctx);
  return role.Run();
}

}  // namespace troupe::actors
