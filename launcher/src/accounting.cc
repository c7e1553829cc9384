#include "accounting.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace troupe::launcher {
namespace {

double Get(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}

// The learner's decision terms (its ledger), without in_flight and the losses.
const std::vector<std::string>& DecisionTerms() {
  static const std::vector<std::string> t = {"trained", "skipped", "dropped_stale",
                                             "dropped_invalid", "dropped_unscored"};
  return t;
}

}  // namespace

const std::vector<std::string>& AccountingTerms() {
  static const std::vector<std::string> t = {
      "trained",          "skipped",   "dropped_stale",   "dropped_invalid",
      "dropped_unscored", "in_flight", "lost_with_actor", "lost_with_learner"};
  return t;
}

bool Accounting::holds() const {
  if (!problems.empty()) return false;
  double rest = 0;
  for (const auto& t : AccountingTerms()) rest += Get(terms, t);
  return std::fabs(Get(terms, "generated") - rest) < 0.5;
}

Accounting SumAccounting(const std::vector<IncarnationReport>& reports) {
  Accounting acc;
  acc.terms["generated"] = 0;
  for (const auto& t : AccountingTerms()) acc.terms[t] = 0;

  // The learner's ledger: its last incarnation's final report (the ledger
  // survives restarts inside the checkpoint, so earlier reports are included).
  const IncarnationReport* learner = nullptr;
  for (const auto& r : reports)
    if (r.role == "learner" && r.report.count("ledger_batches")) learner = &r;
  if (!learner) {
    for (const auto& r : reports)
      if (r.role == "learner" && r.kind == IncarnationReport::Kind::kFinal) learner = &r;
    acc.complete = false;
    acc.problems.push_back(
        "the learner sent no final report: its decisions per producer are unknown, so the "
        "producers' own unanswered counts stand in for in_flight");
  }
  std::map<std::string, bool> producers;
  for (const auto& r : reports) {
    if (r.role != "rollout") continue;
    producers[r.source] = true;
    const bool ledger = learner && learner->report.count("ledger_batches");
    const double gen_rep = Get(r.report, "generated");
    const double answered = Get(r.report, "resolved");
    const double by_reward = Get(r.report, "rejected_by_reward");
    double decided = 0, held = 0;
    if (ledger) {
      for (const auto& t : DecisionTerms()) {
        const double n = Get(learner->report, t + ":" + r.source);
        acc.terms[t] += n;
        decided += n;
      }
      held = Get(learner->report, "held:" + r.source);
    }
    acc.terms["dropped_invalid"] += by_reward;
    if (!ledger) {
      acc.terms["generated"] += gen_rep;
      acc.terms["in_flight"] += gen_rep - answered;
      continue;
    }
    if (r.kind == IncarnationReport::Kind::kDead) {
      // Its last stats may predate batches that reached the learner: it
      // generated at least what was decided and held there.
      const double generated = std::max(gen_rep, decided + held + by_reward);
      acc.terms["generated"] += generated;
      acc.terms["in_flight"] += held;
      acc.terms["lost_with_actor"] += generated - decided - held - by_reward;
      continue;
    }
    acc.terms["generated"] += gen_rep;
    const double open = gen_rep - decided - by_reward;  // not decided by anyone yet
    if (open < -0.5) {
      acc.problems.push_back(fmt::format(
          "{}: the learner decided {} of its sequences but it generated {} ({} rejected by a "
          "reward actor): {} counted twice",
          r.source, decided, gen_rep, by_reward, -open));
      continue;
    }
    // Decided by the learner but answered to the producer: the learner's
    // decisions must cover what the producer saw answered; the part they do
    // not cover was lost with a learner (acknowledged, then not checkpointed).
    const double unanswered = gen_rep - answered;
    const double lost = std::max(0.0, open - unanswered);
    acc.terms["lost_with_learner"] += lost;
    acc.terms["in_flight"] += open - lost;
  }
  if (learner && learner->report.count("ledger_batches")) {
    // Decisions about batches of producers the head never saw (a forged
    // batch id, or a report that never arrived): named, never silently added.
    for (const auto& [key, n] : learner->report) {
      const auto colon = key.find(':');
      if (colon == std::string::npos || n == 0) continue;
      const std::string term = key.substr(0, colon), source = key.substr(colon + 1);
      if (std::find(DecisionTerms().begin(), DecisionTerms().end(), term) ==
              DecisionTerms().end() &&
          term != "held")
        continue;
      if (!producers.count(source))
        acc.problems.push_back(fmt::format(
            "the learner {} {} sequences of '{}', a producer no actor report names",
            term == "held" ? "holds" : "counted as " + term, n, source));
    }
  }
  return acc;
}

}  // namespace troupe::launcher
