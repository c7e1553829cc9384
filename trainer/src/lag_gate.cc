#include "troupe/trainer/lag_gate.h"

#include <algorithm>

namespace troupe::trainer {

Status LagGate::Check(uint64_t learner_version, uint64_t batch_version) const {
  if (batch_version > learner_version) {
    return ProtocolError(
        "batch policy version {} is ahead of the learner's version {} (a batch cannot come from "
        "the future)",
        batch_version, learner_version);
  }
  const uint64_t lag = learner_version - batch_version;
  if (lag > static_cast<uint64_t>(max_lag_)) {
    return Stale(
        "batch policy version {} is {} versions behind the learner's version {} (max_policy_lag "
        "{})",
        batch_version, lag, learner_version, max_lag_);
  }
  return Status::Ok();
}

int64_t RemoveStaleSequences(TrainBatch* batch, const LagGate& gate, uint64_t learner_version) {
  const std::vector<uint64_t>& v = batch->sequence_versions;
  const int64_t n = batch->num_sequences();
  if (n <= 0 || static_cast<int64_t>(v.size()) != n) return 0;
  std::vector<uint8_t> drop(v.size(), 0);
  int64_t k = 0;
  for (size_t i = 0; i < v.size(); ++i)
    k += drop[i] = gate.Check(learner_version, v[i]).code() == Code::kStale ? 1 : 0;
  if (k == 0 || k == n) return 0;
  const int64_t removed = batch->RemoveSequences(drop);
  if (removed > 0)
    batch->policy_version = *std::min_element(v.begin(), v.end());  // v: the kept ones now
  return removed;
}

}  // namespace troupe::trainer
