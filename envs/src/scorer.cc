#include "troupe/envs/scorer.h"

#include <cmath>
#include <exception>

#include <nlohmann/json.hpp>

#include "troupe/envs/episode.h"

namespace troupe::envs {
namespace {

// Metadata of a sample an agent server played (rollout actor: {"episode", "agent", ...}).
bool IsAgentRecord(const std::string& metadata) {
  if (metadata.find("\"agent\"") == std::string::npos) return false;
  auto doc = nlohmann::json::parse(metadata, nullptr, false);
  return doc.is_object() && doc.contains("agent") && doc["agent"].is_object() &&
         doc.contains("episode");
}

}  // namespace

Result<std::unique_ptr<RewardScorer>> RewardScorer::Create(const std::vector<TaskConfig>& tasks,
                                                           const RewardClientConfig& client) {
  TROUPE_RETURN_IF_ERROR(ValidateRewardRouting(tasks, client));
  TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<const TaskRegistry> registry,
                          TaskRegistry::Create(tasks));
  std::unique_ptr<RewardClient> http;
  if (!client.services.empty()) {
    TROUPE_ASSIGN_OR_RETURN(http, RewardClient::Create(client));
  }
  return std::make_unique<RewardScorer>(std::move(registry), std::move(http));
}

RewardScorer::RewardScorer(std::shared_ptr<const TaskRegistry> tasks,
                           std::unique_ptr<RewardClient> client)
    : tasks_(std::move(tasks)), client_(std::move(client)) {}

VerifyResult RewardScorer::ScoreLocal(const Task& task, const ScoreRequest& r) const {
  VerifyInput in{r.prompt, r.response, r.reference, r.metadata};
  VerifyResult out;
  try {
    out = task.Verify(in);
  } catch (const std::exception& e) {
    return VerifyResult::Failure(task.name(), std::string("verifier threw: ") + e.what());
  } catch (...) {
    return VerifyResult::Failure(task.name(), "verifier threw");
  }
  if (!std::isfinite(out.reward))
    return VerifyResult::Failure(task.name(), "verifier returned a non-finite reward");
  if (!out.ok()) out.reward = 0.0;
  return out;
}

std::vector<VerifyResult> RewardScorer::ScoreBatch(const std::vector<ScoreRequest>& requests,
                                                   Deadline deadline) {
  std::vector<VerifyResult> results(requests.size());
  std::vector<RewardRequest> remote;
  std::vector<size_t> remote_index;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ScoreRequest& r = requests[i];
    const Task* task = tasks_->Find(r.task);
    if (IsAgentRecord(r.metadata)) {
      // Played by an agent server: its reward (or failure) is in the episode record.
      results[i] = VerifyFromEpisodeRecord("agent", r.metadata);
    } else if (!task) {
      std::string known;
      for (const auto& n : tasks_->names()) known += (known.empty() ? "" : ", ") + n;
      results[i] = VerifyResult::Failure(
          "scorer", fmt::format("unknown task '{}' (tasks: {})", r.task.substr(0, 64), known));
    } else if (task->local_verifier()) {
      results[i] = ScoreLocal(*task, r);
    } else if (!client_) {
      results[i] = VerifyResult::Failure(
          task->name(), "task is scored externally but no reward services are configured");
    } else {
      remote.push_back(
          RewardRequest{r.service, r.task, r.prompt, r.response, r.reference, r.metadata});
      remote_index.push_back(i);
    }
  }
  if (!remote.empty()) {
    std::vector<VerifyResult> scored = client_->VerifyBatch(remote, deadline);
    for (size_t k = 0; k < remote.size(); ++k) results[remote_index[k]] = std::move(scored[k]);
  }
  MutexLock lock(mu_);
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string& name = tasks_->Find(requests[i].task) ? requests[i].task : "<unknown>";
    TaskScoreStats& s = stats_[name];
    ++s.samples;
    s.failures += results[i].ok() ? 0 : 1;
    s.reward_sum += results[i].reward;
  }
  return results;
}

std::map<std::string, TaskScoreStats> RewardScorer::TaskStats() const {
  MutexLock lock(mu_);
  return stats_;
}

std::vector<std::pair<std::string, double>> RewardScorer::StatsForMetrics() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, s] : TaskStats()) {
    std::string p = "task." + name + ".";
    out.emplace_back(p + "samples", static_cast<double>(s.samples));
    out.emplace_back(p + "failures", static_cast<double>(s.failures));
    out.emplace_back(p + "reward_mean",
                     s.samples ? s.reward_sum / static_cast<double>(s.samples) : 0.0);
  }
  if (client_) {
    auto more = client_->StatsForMetrics();
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

}  // namespace troupe::envs
