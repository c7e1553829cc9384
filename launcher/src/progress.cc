#include "progress.h"

#include <cmath>

#include <fmt/format.h>

namespace troupe::launcher {

static double Get(const std::map<std::string, double>& m, const char* k, double d = NAN) {
  auto it = m.find(k);
  return it == m.end() ? d : it->second;
}

static std::string Rate(double v) {
  if (!std::isfinite(v)) return "-";
  if (v >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

static std::string Clock(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  int t = static_cast<int>(s + 0.5);
  return fmt::format("{}:{:02d}", t / 60, t % 60);
}

void Progress::OnMetrics(const std::string& kind, uint64_t step,
                         const std::map<std::string, double>& s) {
  if (kind == "train") {
    train_ = s;
    step_ = step;
  } else if (kind == "eval") {
    eval_ = s;
    pending_.push_back(fmt::format(
        "eval  step {:>5}  t={:>7.1f}s  held-out accuracy {:.3f} reward {:.3f}  sampled reward "
        "{:.3f}  lag {:.2f}  gen {} tok/s  train {} tok/s",
        step, Get(s, "elapsed_s", 0), Get(s, "eval_accuracy", 0), Get(s, "eval_reward", NAN),
        Get(train_, "reward_mean", NAN), Get(train_, "lag_mean", NAN), Rate(gen_rate_),
        Rate(Get(train_, "train_tokens_per_s"))));
  } else if (kind == "warm_start") {
    pending_.push_back(
        fmt::format("warm start: {} supervised steps in {:.1f}s, held-out accuracy {:.3f}, "
                    "reward {:.3f}",
                    static_cast<int64_t>(Get(s, "steps", 0)), Get(s, "seconds", 0),
                    Get(s, "eval_accuracy", 0), Get(s, "eval_reward", NAN)));
  } else if (kind == "resume") {
    pending_.push_back(fmt::format("resumed from checkpoint at step {}", step));
  }
}

std::string Progress::Line() const {
  double max_steps = Get(train_, "max_steps", NAN);
  double elapsed = Get(train_, "elapsed_s", NAN);
  double eta = NAN;
  if (std::isfinite(max_steps) && std::isfinite(elapsed) && step_ > 0) {
    eta = elapsed / static_cast<double>(step_) * (max_steps - static_cast<double>(step_));
  }
  return fmt::format(
      "\rstep {}{} | reward {:.3f} | eval {:.3f} | lag {:.2f} | gen {} tok/s | train {} tok/s | "
      "ETA {}   ",
      step_, std::isfinite(max_steps) ? fmt::format("/{}", static_cast<int64_t>(max_steps)) : "",
      Get(train_, "reward_mean", 0), Get(eval_, "eval_accuracy", 0), Get(train_, "lag_mean", 0),
      Rate(gen_rate_), Rate(Get(train_, "train_tokens_per_s")), Clock(eta));
}

std::vector<std::string> Progress::TakeLines() {
  std::vector<std::string> out;
  out.swap(pending_);
  if (live_) {
    // Clear the live line before printing over it.
    for (auto& l : out) l = "\r\033[K" + l;
  }
  return out;
}

std::map<std::string, double> Progress::Stats() const {
  std::map<std::string, double> s;
  if (!train_.empty()) s["step"] = static_cast<double>(step_);
  for (const char* k :
       {"reward_mean", "lag_mean", "train_tokens_per_s", "max_steps", "elapsed_s"}) {
    double v = Get(train_, k);
    if (std::isfinite(v)) s[k] = v;
  }
  double acc = Get(eval_, "eval_accuracy");
  if (std::isfinite(acc)) s["eval_accuracy"] = acc;
  s["gen_tokens_per_s"] = gen_rate_;
  return s;
}

std::vector<std::string> Progress::SummaryLines(const std::map<std::string, double>& l,
                                                const Accounting& acc) const {
  std::vector<std::string> out;
  const std::map<std::string, double>& a = acc.terms;
  if (l.empty() && a.empty()) return out;
  std::string prefix = live_ ? "\r\033[K" : "";
  out.push_back(prefix + "summary:");
  if (!l.empty()) {
    out.push_back(fmt::format(
        "  warm-start accuracy {:.3f}, best accuracy {:.3f}, final accuracy {:.3f}",
        Get(l, "warm_accuracy", 0), Get(l, "best_accuracy", 0), Get(l, "final_accuracy", 0)));
    double t = Get(l, "time_to_target_s");
    if (Get(l, "target_accuracy", 0) > 0)  // stop.target_accuracy 0: no target
      out.push_back(
          fmt::format("  time to {:.0f}% held-out accuracy (from end of warm start): {}",
                      Get(l, "target_accuracy", 0) * 100,
                      std::isfinite(t) && t >= 0 ? fmt::format("{:.1f} s", t) : "not reached"));
    const auto skipped = static_cast<int64_t>(Get(l, "skipped_updates", 0));
    out.push_back(fmt::format(
        "  steps {}{}, wall {:.1f} s, generated {} tok/s, trained {} tok/s",
        static_cast<int64_t>(Get(l, "steps", 0)),
        skipped > 0 ? fmt::format(" (+{} skipped: uniform rewards)", skipped) : std::string(),
        Get(l, "elapsed_s", 0), Rate(Get(l, "gen_tokens_per_s")),
        Rate(Get(l, "train_tokens_per_s"))));
  }
  if (!l.empty() && Get(l, "credits_abandoned_stale", 0) > 0)
    out.push_back(fmt::format(
        "  groups cut short while generating, older than max_policy_lag allows: {} (never sent, "
        "so not in the accounting; their credits went to fresh groups)",
        static_cast<int64_t>(Get(l, "credits_abandoned_stale", 0))));
  if (!l.empty() && Get(l, "learner_restarts", 0) > 0)
    out.push_back(fmt::format(
        "  learner restarts {}: {:.1f} s from their last checkpoints to resuming (in the wall "
        "time above)",
        static_cast<int64_t>(Get(l, "learner_restarts", 0)), Get(l, "restart_lost_s", 0)));
  if (!a.empty()) {
    // Every term, zeros included except the two losses (printed when not zero).
    std::string terms;
    for (const auto& t : AccountingTerms()) {
      const double v = Get(a, t.c_str(), 0);
      if (v == 0 && t.rfind("lost_", 0) == 0) continue;
      terms += fmt::format("{}{} {}", terms.empty() ? "" : " + ", t, v);
    }
    out.push_back(fmt::format("  accounting (sequences): generated {} = {}  [{}]",
                              Get(a, "generated", 0), terms,
                              acc.holds()      ? "holds"
                              : !acc.complete ? "incomplete"
                                              : "MISMATCH"));
    for (const auto& p : acc.problems) out.push_back("  accounting: " + p);
  }
  return out;
}

}  // namespace troupe::launcher
