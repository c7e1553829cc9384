#include "troupe/trainer/lag_gate.h"

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

}  // namespace troupe::trainer
