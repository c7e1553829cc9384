// Prometheus text exposition format (version 0.0.4) of a job's state: what
// the head serves on /metrics. Built from the status document (telemetry.h,
// StatusDocument)
// and the learner's last train/eval records; every family has HELP and TYPE
// lines and `promtool check metrics` finds nothing to lint.
//
// Families (labels actor, role; node on troupe_actor_up):
//   troupe_job_running, troupe_actor_up, troupe_actor_heartbeat_age_seconds,
//   troupe_actor_restarts_total, troupe_actor_policy_version,
//   troupe_actor_tokens_per_second, troupe_actor_credits,
//   troupe_actor_outbox_depth, troupe_actor_dropped_stale_sequences_total,
//   troupe_actor_dropped_invalid_sequences_total, troupe_actor_stat{stat=...}
//   (every heartbeat figure, transport and delivery counters included),
//   troupe_learner_version, troupe_learner_updates_total,
//   troupe_learner_update_seconds, troupe_learner_policy_lag{stat=mean|max},
//   troupe_train_reward_mean, troupe_eval_accuracy, troupe_eval_reward.
// Pure function; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe::launcher {

std::string RenderPrometheus(const nlohmann::json& status, const std::optional<nlohmann::json>& train,
                             const std::optional<nlohmann::json>& eval, int64_t now_ns);

}  // namespace troupe::launcher
