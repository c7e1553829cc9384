#include "troupe/trainer/metrics.h"

#include <nlohmann/json.hpp>

namespace troupe::trainer {

std::vector<std::pair<std::string, double>> StepMetrics::Stats() const {
  return {
      {"step", static_cast<double>(step)},
      {"version", static_cast<double>(version)},
      {"lr", lr},
      {"loss", loss},
      {"pg_loss", pg_loss},
      {"kl", kl},
      {"entropy", entropy},
      {"clip_fraction", clip_fraction},
      {"ratio_max", ratio_max},
      {"is_weight_mean", is_weight_mean},
      {"is_weight_max", is_weight_max},
      {"is_truncated_fraction", is_truncated_fraction},
      {"logprob_mismatch_mean", logprob_mismatch_mean},
      {"logprob_mismatch_max", logprob_mismatch_max},
      {"grad_norm", grad_norm},
      {"reward_mean", reward_mean},
      {"reward_std", reward_std},
      {"response_len_mean", response_len_mean},
      {"response_len_max", response_len_max},
      {"token_accuracy", token_accuracy},
      {"tokens", static_cast<double>(tokens)},
      {"padded_tokens", static_cast<double>(padded_tokens)},
      {"sequences", static_cast<double>(sequences)},
      {"batches", static_cast<double>(batches)},
      {"groups", static_cast<double>(groups)},
      {"uniform_groups", static_cast<double>(uniform_groups)},
      {"micro_batches", static_cast<double>(micro_batches)},
      {"forward_s", forward_s},
      {"backward_s", backward_s},
      {"optimizer_s", optimizer_s},
      {"total_s", total_s},
      {"tokens_per_s", tokens_per_s()},
  };
}

std::string StepMetrics::ToJson() const {
  nlohmann::json j;
  j["kind"] = kind;
  for (const auto& [name, value] : Stats()) j[name] = value;
  j["lag_histogram"] = lag_histogram;
  j["group_rewards"] = group_rewards;
  j["is_weight_histogram"] = is_weight_histogram;
  return j.dump();
}

std::vector<std::pair<std::string, double>> LearnerCounters::Stats() const {
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  return {
      {"offered_batches", d(offered_batches)},
      {"accepted_batches", d(accepted_batches)},
      {"trained_batches", d(trained_batches)},
      {"dropped_stale_batches", d(dropped_stale_batches)},
      {"dropped_invalid_batches", d(dropped_invalid_batches)},
      {"future_version_batches", d(future_version_batches)},
      {"duplicate_batches", d(duplicate_batches)},
      {"queued_batches", d(queued_batches)},
      {"accepted_sequences", d(accepted_sequences)},
      {"trained_sequences", d(trained_sequences)},
      {"dropped_stale_sequences", d(dropped_stale_sequences)},
      {"dropped_invalid_sequences", d(dropped_invalid_sequences)},
      {"skipped_batches", d(skipped_batches)},
      {"skipped_sequences", d(skipped_sequences)},
      {"trained_tokens", d(trained_tokens)},
      {"uniform_groups", d(uniform_groups)},
      {"updates", d(updates)},
      {"supervised_updates", d(supervised_updates)},
  };
}

}  // namespace troupe::trainer
