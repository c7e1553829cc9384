// Per-update metrics and the learner's data accounting, torch-free.
//
// StepMetrics describes one optimizer update (RL or supervised). LearnerCounters
// are the exact counts the job's accounting invariant is built from:
//   accepted = trained + dropped_stale_after_accept + queued
//   offered  = accepted + dropped_stale_on_arrival + dropped_invalid + duplicates
// so that, job-wide, generated = trained + dropped_stale + dropped_invalid + in_flight
// (duplicates are redeliveries of batches already counted). Plain values.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::trainer {

// Upper edges of StepMetrics::is_weight_histogram's buckets (one more bucket above the last).
inline const std::vector<double>& IsWeightEdges() {
  static const std::vector<double> kEdges = {0.5, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25, 2.0};
  return kEdges;
}

struct StepMetrics {
  std::string kind;      // "rl" or "supervised"
  uint64_t step = 0;     // optimizer updates made so far, this one included
  uint64_t version = 0;  // learner policy version after this update
  double lr = 0.0;       // learning rate this update used
  double loss = 0.0;  // total loss (policy + kl_coef*kl - entropy_coef*entropy, or cross-entropy)
  double pg_loss = 0.0;  // policy-gradient part of the loss
  double kl = 0.0;       // mean k3 KL to the reference over trained tokens (0 without reference)
  double entropy = 0.0;  // mean per-token entropy of the current policy at `temperature`
  double clip_fraction = 0.0;          // share of trained tokens whose PPO ratio was clipped
  double ratio_max = 0.0;              // largest pi/pi_prox over trained tokens
  double is_weight_mean = 0.0;         // mean behaviour importance weight after truncation
  double is_weight_max = 0.0;          // largest weight before truncation
  double is_truncated_fraction = 0.0;  // share of tokens whose weight hit is_cap
  double logprob_mismatch_mean = 0.0;  // mean |log pi_prox - log pi_behav| (learner vs sampler)
  double logprob_mismatch_max = 0.0;   // max of the same
  double grad_norm = 0.0;              // global gradient norm before clipping
  double reward_mean = 0.0;            // over the sequences of the update's batches
  double reward_std = 0.0;             // population std of the same
  // Response tokens per sequence (model and environment tokens) over the update's batches:
  // the length distribution whose tail an on-policy (lag 0) update waits for.
  double response_len_mean = 0.0;
  double response_len_max = 0.0;
  double token_accuracy = 0.0;         // supervised: share of response tokens predicted by argmax
  int64_t tokens = 0;                  // trained (mask = 1) tokens
  int64_t padded_tokens = 0;           // tokens run through the model (rows x padded length)
  int64_t sequences = 0;               // sequences trained on
  int64_t batches = 0;                 // batches used by this update
  int64_t groups = 0;                  // groups in those batches
  int64_t uniform_groups = 0;          // groups whose rewards were all equal (no policy gradient)
  int64_t micro_batches = 0;
  // lag_histogram[k] = batches used at lag k in this update (size max_policy_lag + 1).
  std::vector<int64_t> lag_histogram;
  // Mean reward of each group of the update (the spread GRPO learns from).
  std::vector<double> group_rewards;
  // Trained tokens by behaviour importance weight pi_prox/pi_behav before
  // truncation: is_weight_histogram[i] counts weights in
  // (IsWeightEdges()[i-1], IsWeightEdges()[i]]; the last entry those above the last edge.
  std::vector<int64_t> is_weight_histogram;
  double forward_s = 0.0;    // wall seconds in model forward + loss
  double backward_s = 0.0;   // wall seconds in backward
  double optimizer_s = 0.0;  // wall seconds in clip + AdamW step
  double total_s = 0.0;      // wall seconds of the whole update (packing included)

  // Tokens through the model per second of this update (padded_tokens / total_s).
  double tokens_per_s() const { return total_s > 0 ? padded_tokens / total_s : 0.0; }
  // Scalar figures as (name, value) pairs, e.g. for the wire's Stat list.
  std::vector<std::pair<std::string, double>> Stats() const;
  // One JSON object with every field (the histogram as an array).
  std::string ToJson() const;
};

struct LearnerCounters {
  uint64_t offered_batches = 0;          // calls to Offer
  uint64_t accepted_batches = 0;         // passed validation and the lag gate
  uint64_t trained_batches = 0;          // used by at least one update
  uint64_t dropped_stale_batches = 0;    // too old on arrival or before their first update
  uint64_t dropped_invalid_batches = 0;  // failed validation or came from the future
  uint64_t future_version_batches = 0;   // the part of dropped_invalid from the future
  uint64_t duplicate_batches = 0;        // batch ids seen before (not counted elsewhere)
  uint64_t queued_batches = 0;           // accepted, not yet trained nor dropped
  uint64_t accepted_sequences = 0;
  uint64_t trained_sequences = 0;
  uint64_t dropped_stale_sequences = 0;
  uint64_t dropped_invalid_sequences = 0;
  uint64_t skipped_batches = 0;    // accepted, retired by an update without signal (all uniform)
  uint64_t skipped_sequences = 0;  // their sequences (not trained, not dropped)
  uint64_t trained_tokens =
      0;  // trained (mask = 1) tokens summed over updates (reuse counts again)
  uint64_t uniform_groups = 0;  // groups with all-equal rewards among trained batches
  uint64_t updates = 0;         // RL optimizer updates
  uint64_t supervised_updates = 0;

  std::vector<std::pair<std::string, double>> Stats() const;
};

}  // namespace troupe::trainer
