// The policy-lag gate (DESIGN invariant 2), torch-free.
//
// A batch generated at policy version b may train the learner at version L only
// if 0 <= L - b <= max_policy_lag. b > L is a protocol error (a rollout actor
// cannot hold weights the learner has not produced); L - b > max_policy_lag is
// stale data. The learner checks the gate when a batch arrives and again before
// every update that uses it (a batch reused for several updates ages by one
// version per update). Value type; const methods are thread-safe.
#pragma once

#include <cstdint>

#include "troupe/core/status.h"
#include "troupe/trainer/batch.h"

namespace troupe::trainer {

class LagGate {
 public:
  // max_policy_lag must be >= 0 (LearnerConfig::Validate checks it).
  explicit LagGate(int64_t max_policy_lag) : max_lag_(max_policy_lag) {}

  // Ok if the batch may train the learner now. Errors: kProtocol (future
  // version, naming both versions) or kStale (naming the lag and the limit).
  Status Check(uint64_t learner_version, uint64_t batch_version) const;
  // learner_version - batch_version (negative for a batch from the future).
  static int64_t Lag(uint64_t learner_version, uint64_t batch_version) {
    return static_cast<int64_t>(learner_version - batch_version);
  }
  int64_t max_policy_lag() const { return max_lag_; }

 private:
  int64_t max_lag_;
};

// The gate per group, for a batch that bundles several groups and carries its oldest group's
// version: removes the sequences whose own version (batch->sequence_versions) `gate` finds
// stale at `learner_version`, when some but not all are, and raises batch->policy_version to
// the oldest version kept. Returns how many it removed (0: none stale, no versions, or all
// stale, which the whole-batch gate then drops). Without it, one group too old drops the
// fresh ones beside it.
int64_t RemoveStaleSequences(TrainBatch* batch, const LagGate& gate, uint64_t learner_version);

}  // namespace troupe::trainer
