// Progress display of a running job (head side): one live line on a terminal,
// plain lines otherwise; the accuracy curve as evaluations arrive; the
// end-of-job summary. Fed from the learner's metrics. Head thread only.
#pragma once

#include "accounting.h"

#include <map>
#include <string>
#include <vector>

namespace troupe::launcher {

class Progress {
 public:
  explicit Progress(bool live) : live_(live) {}
  // A metrics message: kind "train", "eval", "warm_start", "summary", ...
  void OnMetrics(const std::string& kind, uint64_t step,
                 const std::map<std::string, double>& stats);
  // Sum of the rollout actors' generation rates (from heartbeats).
  void SetGenerationRate(double tokens_per_s) { gen_rate_ = tokens_per_s; }
  // The live line (starts with '\r', no newline).
  std::string Line() const;
  // Lines to print now (evaluations, phase changes), each ending without '\n'.
  std::vector<std::string> TakeLines();
  // Current figures (for `troupe status`).
  std::map<std::string, double> Stats() const;
  // The end-of-job summary.
  std::vector<std::string> SummaryLines(const std::map<std::string, double>& learner,
                                        const Accounting& accounting) const;

 private:
  bool live_;
  double gen_rate_ = 0;
  std::map<std::string, double> train_;
  std::map<std::string, double> eval_;
  uint64_t step_ = 0;
  std::vector<std::string> pending_;
};

}  // namespace troupe::launcher
