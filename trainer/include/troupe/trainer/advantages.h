// Group-relative advantages, torch-free.
//
// The sequences sampled for one prompt form a group of size G with rewards
// r_1..r_G, mean m and unbiased std s (divisor G-1; 0 when G = 1):
//
//   grpo     A_i = (r_i - m) / (s + eps)
//   dr_grpo  A_i =  r_i - m
//   rloo     A_i =  r_i - (sum_j r_j - r_i) / (G - 1)  =  G/(G-1) * (r_i - m)
//
// A group whose rewards are all equal (including any group of one) has
// A_i = 0 exactly for every member: it carries no policy gradient and is
// reported as "uniform". Sums use double precision. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/trainer/config.h"

namespace troupe::trainer {

struct AdvantageResult {
  std::vector<float> advantages;    // one per sequence
  std::vector<uint8_t> in_uniform;  // one per sequence: 1 if its group's rewards are all equal
  int64_t groups = 0;
  int64_t uniform_groups = 0;
};

// `group_of[i]` is sequence i's group in [0, num_groups); every group must be
// non-empty (TROUPE_CHECKed: callers validate batches first).
AdvantageResult ComputeAdvantages(const std::vector<float>& rewards,
                                  const std::vector<int64_t>& group_of, int64_t num_groups,
                                  AdvantageEstimator estimator, double eps);

// Dense group numbering for a batch: from `group_index` when present (ids in
// order of first appearance), else contiguous chunks of `group_size`.
// Returns the number of groups.
int64_t AssignGroups(const std::vector<uint32_t>& group_index, uint32_t group_size,
                     int64_t num_sequences, std::vector<int64_t>* group_of);

}  // namespace troupe::trainer
