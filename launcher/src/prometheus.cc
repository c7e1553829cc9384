#include "prometheus.h"

#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

namespace troupe::launcher {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// One family: its samples (label text, value) under one HELP/TYPE header.
class Family {
 public:
  Family(std::string name, std::string type, std::string help)
      : name_(std::move(name)), type_(std::move(type)), help_(std::move(help)) {}
  void Add(const std::vector<std::pair<std::string, std::string>>& labels, double v) {
    std::string l;
    for (const auto& [k, val] : labels) {
      if (!l.empty()) l += ',';
      l += k + "=\"" + Escape(val) + "\"";
    }
    samples_.emplace_back(l.empty() ? "" : "{" + l + "}", v);
  }
  void Render(std::string* out) const {
    if (samples_.empty()) return;
    *out += "# HELP " + name_ + " " + help_ + "\n# TYPE " + name_ + " " + type_ + "\n";
    for (const auto& [l, v] : samples_) *out += name_ + l + " " + Number(v) + "\n";
  }

 private:
  std::string name_, type_, help_;
  std::vector<std::pair<std::string, double>> samples_;
};

double Stat(const nlohmann::json& a, const char* name, bool* found) {
  const auto& st = a.contains("stats") ? a["stats"] : nlohmann::json::object();
  auto it = st.find(name);
  *found = it != st.end() && it->is_number();
  return *found ? it->get<double>() : 0.0;
}

bool Alive(const std::string& state) {
  return state == "starting" || state == "ready" || state == "busy" || state == "draining" ||
         state == "stopping";
}

}  // namespace

std::string RenderPrometheus(const nlohmann::json& status, const std::optional<nlohmann::json>& train,
                             const std::optional<nlohmann::json>& eval, int64_t now_ns) {
  Family running("troupe_job_running", "gauge",
                 "1 while the job runs (0 once it finished or stopped)");
  Family up("troupe_actor_up", "gauge", "1 while the actor's process is alive");
  Family age("troupe_actor_heartbeat_age_seconds", "gauge",
             "seconds since the actor's last heartbeat reached the head");
  Family restarts("troupe_actor_restarts_total", "counter", "restarts of the actor by the head");
  Family version("troupe_actor_policy_version", "gauge", "policy version the actor holds");
  Family tps("troupe_actor_tokens_per_second", "gauge",
             "tokens per second: generated (rollout) or trained (learner)");
  Family credits("troupe_actor_credits", "gauge",
                 "credits: groups granted and not yet delivered (rollout), or in flight "
                 "(learner: credits_granted)");
  Family outbox("troupe_actor_outbox_depth", "gauge",
                "messages the actor holds unacknowledged in its outbox");
  Family stale("troupe_actor_dropped_stale_sequences_total", "counter",
               "sequences dropped as too old for max_policy_lag");
  Family invalid("troupe_actor_dropped_invalid_sequences_total", "counter",
                 "sequences rejected as invalid");
  Family stat("troupe_actor_stat", "gauge",
              "every figure of the actor's last heartbeat (troupe status --stats), by name");
  const std::string state = status.value("state", "");
  running.Add({{"job", status.value("job", "")}}, state == "running" ? 1 : 0);
  if (status.contains("actors") && status["actors"].is_array()) {
    for (const auto& a : status["actors"]) {
      const std::string id = a.value("id", ""), role = a.value("role", "");
      const std::vector<std::pair<std::string, std::string>> l = {{"actor", id}, {"role", role}};
      up.Add({{"actor", id}, {"role", role}, {"node", a.value("node", "")}},
             Alive(a.value("state", "")) && a.value("pid", 0) > 0 ? 1 : 0);
      const int64_t hb = a.value("last_heartbeat_ns", int64_t{0});
      if (hb > 0) age.Add(l, std::max<double>(0.0, static_cast<double>(now_ns - hb) * 1e-9));
      restarts.Add(l, a.value("restarts", 0.0));
      version.Add(l, a.value("policy_version", 0.0));
      bool f = false;
      double v = Stat(a, role == "learner" ? "train_tokens_per_s" : "gen_tokens_per_s", &f);
      if (f) tps.Add(l, v);
      v = Stat(a, role == "learner" ? "credits_granted" : "credits", &f);
      if (f) credits.Add(l, v);
      v = Stat(a, "outbox", &f);
      if (f) outbox.Add(l, v);
      v = Stat(a, "dropped_stale", &f);
      if (f) stale.Add(l, v);
      v = Stat(a, "dropped_invalid", &f);
      if (f) invalid.Add(l, v);
      if (a.contains("stats") && a["stats"].is_object()) {
        for (const auto& [k, val] : a["stats"].items())
          if (val.is_number()) stat.Add({{"actor", id}, {"role", role}, {"stat", k}}, val.get<double>());
      }
    }
  }
  Family lversion("troupe_learner_version", "gauge", "the learner's policy version");
  Family updates("troupe_learner_updates_total", "counter", "RL optimizer updates made");
  Family update_s("troupe_learner_update_seconds", "gauge",
                  "wall seconds of the last update (forward, backward, optimizer)");
  Family lag("troupe_learner_policy_lag", "gauge",
             "policy lag of the batches of the last update (versions), mean and max");
  Family reward("troupe_train_reward_mean", "gauge", "mean sampled reward of the last update");
  Family acc("troupe_eval_accuracy", "gauge", "held-out accuracy of the last evaluation");
  Family eval_reward("troupe_eval_reward", "gauge", "held-out reward of the last evaluation");
  if (train && train->is_object()) {
    lversion.Add({}, train->value("policy_version", 0.0));
    updates.Add({}, train->value("step", 0.0));
    update_s.Add({}, train->value("forward_s", 0.0) + train->value("backward_s", 0.0) +
                         train->value("optimizer_s", 0.0));
    lag.Add({{"stat", "mean"}}, train->value("lag_mean", 0.0));
    lag.Add({{"stat", "max"}}, train->value("lag_max", 0.0));
    reward.Add({}, train->value("reward_mean", 0.0));
  }
  if (eval && eval->is_object()) {
    acc.Add({}, eval->value("eval_accuracy", 0.0));
    eval_reward.Add({}, eval->value("eval_reward", 0.0));
  }
  std::string out;
  for (const Family* f : {&running, &up, &age, &restarts, &version, &tps, &credits, &outbox, &stale,
                          &invalid, &stat, &lversion, &updates, &update_s, &lag, &reward, &acc,
                          &eval_reward})
    f->Render(&out);
  return out;
}

}  // namespace troupe::launcher
