// The job's sequence accounting (DESIGN invariant 4), from what every actor
// incarnation reported:
//   generated = trained + dropped_stale + dropped_invalid + in_flight + lost_with_actor
// Head thread only; pure (tests/launcher/accounting_test.cc).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace troupe::launcher {

struct IncarnationReport {
  enum class Kind {
    kFinal,  // the process's own final report, or its latest stats while it lives
    kDead,   // the latest stats of a process that died (may predate what it sent)
  };
  // "<actor id>/<incarnation hex>": the prefix of the batch ids a producer
  // made, the key of the learner's "decided:" and "held:" counts.
  std::string source;
  std::map<std::string, double> report;
  Kind kind = Kind::kFinal;
};

// Sums the reports into generated, trained, dropped_stale, dropped_invalid,
// in_flight and lost_with_actor. A producer's own count of what is still in
// flight is the upper bound; the learner's per-source count of what it decided
// corrects it, because decisions keep coming after a producer stopped counting
// (it drained and left before its last acknowledgements, or its final report
// went out before them): those sequences are in the learner's trained/dropped
// figures and must not stay in flight too.
std::map<std::string, double> SumAccounting(const std::vector<IncarnationReport>& reports);

}  // namespace troupe::launcher
