// The job's sequence accounting (DESIGN invariant 4), from what every actor
// incarnation reported:
//
//   generated = trained + skipped + dropped_stale + dropped_invalid
//             + dropped_unscored + in_flight + lost_with_actor + lost_with_learner
//
// Who knows what:
//   * a rollout incarnation (a producer) knows what it generated, how much of
//     it was answered, and what a reward actor rejected itself (unscorable);
//   * the learner's batch ledger (actors/src/batch_ledger.h) knows, per
//     producer incarnation, every sequence it decided (trained, skipped,
//     stale, invalid, unscored) and holds undecided; it survives learner
//     restarts with the checkpoint, so only the learner's last report counts.
// Each term is measured, not derived, except where a producer died (what the
// learner never received is lost with it). Two checks per producer catch what
// a sum cannot: the learner may not have decided more than the producer
// generated (a batch trained twice), and must have decided at least what the
// producer saw answered (otherwise decisions were lost with a learner: only
// possible with checkpoint.ack = trained). Failed checks are `problems`, and
// the equation then does not hold.
//
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
  // made, the key of the learner's "<term>:<source>" and "held:<source>".
  std::string source;
  std::map<std::string, double> report;
  Kind kind = Kind::kFinal;
  std::string role;  // "rollout", "reward", "learner", ...
};

// The terms of the equation, in the order the summary prints them.
const std::vector<std::string>& AccountingTerms();

struct Accounting {
  std::map<std::string, double> terms;  // generated and every AccountingTerms() entry
  std::vector<std::string> problems;    // one line each; empty when everything adds up
  bool complete = true;  // false without the learner's final report (the job failed or was cut)
  // generated equals the sum of the other terms and no check failed.
  bool holds() const;
};

Accounting SumAccounting(const std::vector<IncarnationReport>& reports);

}  // namespace troupe::launcher
