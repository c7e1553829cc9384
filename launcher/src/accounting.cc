#include "accounting.h"

#include <algorithm>

namespace troupe::launcher {
namespace {

double Get(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

std::map<std::string, double> SumAccounting(const std::vector<IncarnationReport>& reports) {
  std::map<std::string, double> acc;
  for (const char* k :
       {"generated", "trained", "dropped_stale", "dropped_invalid", "in_flight", "lost_with_actor"})
    acc[k] = 0;
  // The learner's view of each producer incarnation: sequences it decided
  // (trained or dropped) and holds undecided. A learner's numbers survive its
  // restarts (restored from its checkpoint), so only living reports count.
  std::map<std::string, double> learner;
  for (const auto& r : reports) {
    if (r.kind != IncarnationReport::Kind::kFinal) continue;
    for (const auto& [k, v] : r.report)
      if (k.rfind("decided:", 0) == 0 || k.rfind("held:", 0) == 0) learner[k] += v;
  }
  for (const auto& r : reports) {
    const bool producer = r.report.count("generated") > 0;
    if (!producer) {
      if (r.kind == IncarnationReport::Kind::kDead) continue;  // restored, or counted by peers
      for (const char* k : {"trained", "dropped_stale", "dropped_invalid"})
        acc[k] += Get(r.report, k);
      continue;
    }
    const double decided = learner["decided:" + r.source], held = learner["held:" + r.source];
    // It generated at least what it reported and at least what reached the learner.
    const double generated = std::max(Get(r.report, "generated"), decided + held);
    acc["generated"] += generated;
    if (r.kind == IncarnationReport::Kind::kDead) {
      // What the learner never got is lost with it; what it holds is in flight.
      acc["in_flight"] += held;
      acc["lost_with_actor"] += generated - decided - held;
    } else {
      // Its own count (what it had no answer for) less what the learner has
      // decided since: the smaller bound (the reward actor's rejections are in
      // the first, not the second).
      const double own = generated - (Get(r.report, "generated") - Get(r.report, "in_flight"));
      acc["in_flight"] += std::max(0.0, std::min(own, generated - decided));
    }
  }
  return acc;
}

}  // namespace troupe::launcher
