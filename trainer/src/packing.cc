#include "troupe/trainer/packing.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

#include "troupe/core/check.h"

namespace troupe::trainer {

std::vector<std::vector<int64_t>> PlanMicroBatches(const std::vector<SequenceView>& seqs,
                                                   int64_t budget) {
  std::vector<int64_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return seqs[a].input_len() > seqs[b].input_len(); });
  std::vector<std::vector<int64_t>> plan;
  int64_t longest = 0;  // rows are sorted, so the first row of a micro-batch is its longest
  for (int64_t idx : order) {
    const int64_t len = seqs[idx].input_len();
    if (!plan.empty() && static_cast<int64_t>(plan.back().size() + 1) * longest <= budget) {
      plan.back().push_back(idx);
      continue;
    }
    plan.push_back({idx});
    longest = len;
  }
  return plan;
}

PackedMicroBatch PackMicroBatch(const std::vector<SequenceView>& seqs,
                                const std::vector<int64_t>& rows) {
  TROUPE_CHECK(!rows.empty());
  int64_t t_max = 0;
  for (int64_t r : rows) {
    TROUPE_CHECK_GE(seqs[r].input_len(), 1);
    t_max = std::max(t_max, seqs[r].input_len());
  }
  const int64_t b = static_cast<int64_t>(rows.size());
  PackedMicroBatch mb;
  mb.rows = b;
  mb.length = t_max;
  mb.ids = at::zeros({b, t_max}, at::kLong);
  mb.targets = at::zeros({b, t_max}, at::kLong);
  mb.mask = at::zeros({b, t_max}, at::kFloat);
  mb.behaviour = at::zeros({b, t_max}, at::kFloat);
  mb.advantages = at::zeros({b, t_max}, at::kFloat);
  mb.weights = at::zeros({b, t_max}, at::kFloat);
  mb.flat_index = at::full({b, t_max}, -1, at::kLong);
  mb.lengths = at::empty({b}, at::kLong);
  int64_t* ids = mb.ids.data_ptr<int64_t>();
  int64_t* targets = mb.targets.data_ptr<int64_t>();
  float* mask = mb.mask.data_ptr<float>();
  float* behaviour = mb.behaviour.data_ptr<float>();
  float* adv = mb.advantages.data_ptr<float>();
  float* weights = mb.weights.data_ptr<float>();
  int64_t* flat = mb.flat_index.data_ptr<int64_t>();
  std::vector<int64_t> valid_flat;
  int64_t trained = 0;
  for (int64_t i = 0; i < b; ++i) {
    const SequenceView& s = seqs[rows[i]];
    const int64_t row = i * t_max;
    mb.lengths.data_ptr<int64_t>()[i] = s.input_len();
    // Inputs: prompt then all but the last response token.
    for (int64_t t = 0; t < s.prompt_len; ++t) ids[row + t] = s.prompt[t];
    for (int64_t j = 0; j + 1 < s.response_len; ++j) ids[row + s.prompt_len + j] = s.response[j];
    // Targets: response token j at position P-1+j.
    for (int64_t j = 0; j < s.response_len; ++j) {
      const int64_t pos = row + s.prompt_len - 1 + j;
      targets[pos] = s.response[j];
      flat[pos] = s.flat_offset + j;
      valid_flat.push_back(s.flat_offset + j);
      adv[pos] = s.advantage;
      const bool on = s.mask == nullptr || s.mask[j] != 0;
      if (!on) continue;
      mask[pos] = 1.0f;
      weights[pos] = s.token_weight;
      behaviour[pos] = s.behaviour == nullptr ? 0.0f : s.behaviour[j];
      ++trained;
    }
  }
  mb.trained_tokens = trained;
  mb.valid = mb.flat_index >= 0;
  mb.valid_flat_index =
      at::from_blob(valid_flat.data(), {static_cast<int64_t>(valid_flat.size())}, at::kLong)
          .clone();
  return mb;
}

}  // namespace troupe::trainer
