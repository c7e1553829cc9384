#include "troupe/trainer/advantages.h"

#include <cmath>
#include <unordered_map>

#include "troupe/core/check.h"

namespace troupe::trainer {

int64_t AssignGroups(const std::vector<uint32_t>& group_index, uint32_t group_size,
                     int64_t num_sequences, std::vector<int64_t>* group_of) {
  group_of->resize(static_cast<size_t>(num_sequences));
  if (group_index.empty()) {
    TROUPE_CHECK_GT(group_size, 0u);
    for (int64_t i = 0; i < num_sequences; ++i) (*group_of)[i] = i / group_size;
    return num_sequences == 0 ? 0 : (num_sequences - 1) / group_size + 1;
  }
  TROUPE_CHECK_EQ(static_cast<int64_t>(group_index.size()), num_sequences);
  std::unordered_map<uint32_t, int64_t> dense;
  for (int64_t i = 0; i < num_sequences; ++i) {
    auto [it, inserted] = dense.emplace(group_index[i], static_cast<int64_t>(dense.size()));
    (*group_of)[i] = it->second;
  }
  return static_cast<int64_t>(dense.size());
}

AdvantageResult ComputeAdvantages(const std::vector<float>& rewards,
                                  const std::vector<int64_t>& group_of, int64_t num_groups,
                                  AdvantageEstimator estimator, double eps) {
  const size_t n = rewards.size();
  TROUPE_CHECK_EQ(group_of.size(), n);
  std::vector<double> sum(num_groups, 0.0), sum_sq(num_groups, 0.0);
  std::vector<int64_t> count(num_groups, 0);
  std::vector<float> first(num_groups, 0.0f);
  std::vector<uint8_t> uniform(num_groups, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t g = group_of[i];
    TROUPE_CHECK_MSG(g >= 0 && g < num_groups, "sequence {} in group {} of {}", i, g, num_groups);
    if (count[g] == 0) {
      first[g] = rewards[i];
    } else if (rewards[i] != first[g]) {
      uniform[g] = 0;
    }
    ++count[g];
    sum[g] += rewards[i];
  }
  std::vector<double> mean(num_groups, 0.0), stdev(num_groups, 0.0);
  for (int64_t g = 0; g < num_groups; ++g) {
    TROUPE_CHECK_MSG(count[g] > 0, "group {} of {} is empty", g, num_groups);
    mean[g] = sum[g] / static_cast<double>(count[g]);
  }
  for (size_t i = 0; i < n; ++i) {
    const double d = rewards[i] - mean[group_of[i]];
    sum_sq[group_of[i]] += d * d;
  }
  for (int64_t g = 0; g < num_groups; ++g) {
    stdev[g] = count[g] > 1 ? std::sqrt(sum_sq[g] / static_cast<double>(count[g] - 1)) : 0.0;
  }

  AdvantageResult out;
  out.advantages.resize(n);
  out.in_uniform.resize(n);
  out.groups = num_groups;
  for (int64_t g = 0; g < num_groups; ++g) out.uniform_groups += uniform[g];
  for (size_t i = 0; i < n; ++i) {
    const int64_t g = group_of[i];
    out.in_uniform[i] = uniform[g];
    if (uniform[g]) {
      out.advantages[i] = 0.0f;
      continue;
    }
    const double centred = rewards[i] - mean[g];
    double a = 0.0;
    switch (estimator) {
      case AdvantageEstimator::kGrpo:
        a = centred / (stdev[g] + eps);
        break;
      case AdvantageEstimator::kDrGrpo:
        a = centred;
        break;
      case AdvantageEstimator::kRloo: {
        // Not uniform implies count >= 2.
        const double others = (sum[g] - rewards[i]) / static_cast<double>(count[g] - 1);
        a = rewards[i] - others;
        break;
      }
    }
    out.advantages[i] = static_cast<float>(a);
  }
  return out;
}

}  // namespace troupe::trainer
