#include "troupe/launcher/telemetry.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "troupe/core/log.h"
#include "troupe/launcher/head.h"

namespace troupe::launcher {

namespace {

spdlog::logger& Log() {
  return log::Get("launcher");
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double StatOr(const ActorStatus& a, const char* name, double fallback = 0) {
  auto it = a.stats.find(name);
  return it == a.stats.end() || !std::isfinite(it->second) ? fallback : it->second;
}

bool AliveState(const std::string& s) {
  return s == "starting" || s == "ready" || s == "busy" || s == "draining" || s == "stopping";
}

// Keys of metrics lines that are not figures.
bool Bookkeeping(const std::string& key) {
  return key == "time_ns" || key == "step" || key == "kind" || key == "actor";
}

// The kinds whose numbers become TensorBoard scalars.
bool Scalared(const std::string& kind) {
  return kind == "train" || kind == "eval" || kind == "warm_start" || kind == "resume" ||
         kind == "heartbeat";
}

// The numbers of a JSON array (anything else counts 0).
std::vector<double> Numbers(const nlohmann::json& a) {
  std::vector<double> out;
  for (const auto& v : a) out.push_back(v.is_number() ? v.get<double>() : 0.0);
  return out;
}

std::string Fence(const std::string& text) {
  // A fenced block that the text cannot close.
  std::string fence = "```";
  while (text.find(fence) != std::string::npos) fence += '`';
  return fence + "\n" + text + "\n" + fence;
}

}  // namespace

nlohmann::json StatusDocument(const std::string& job, const RunDir& run, const std::string& state,
                              const std::vector<ActorStatus>& actors,
                              const std::map<std::string, double>& progress, int64_t now_ns) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& a : actors) {
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [k, v] : a.stats)
      if (std::isfinite(v)) stats[k] = v;
    list.push_back({{"id", a.id},
                    {"role", a.role},
                    {"node", a.node},
                    {"state", a.state},
                    {"pid", a.pid},
                    {"policy_version", a.policy_version},
                    {"restarts", a.restarts},
                    {"last_heartbeat_ns", a.last_heartbeat_ns},
                    {"stats", std::move(stats)}});
  }
  nlohmann::json prog = nlohmann::json::object();
  for (const auto& [k, v] : progress)
    if (std::isfinite(v)) prog[k] = v;
  return {{"job", job},     {"run", run.path},       {"run_name", run.name()},
          {"state", state}, {"time_ns", now_ns},     {"progress", std::move(prog)},
          {"actors", std::move(list)}};
}

nlohmann::json HeartbeatFigures(const std::vector<ActorStatus>& actors, int64_t now_ns) {
  double gen = 0, credits = 0, in_flight = 0, out_rollout = 0, out_reward = 0, awaiting = 0;
  double restarts = 0, up = 0, age_max = 0, rejected = 0;
  double train_tps = 0, granted = 0, queued = 0, version = 0;
  nlohmann::json per_actor = nlohmann::json::object();
  for (const auto& a : actors) {
    restarts += a.restarts;
    const bool alive = AliveState(a.state) && a.pid > 0;
    if (!alive) continue;
    up += 1;
    if (a.last_heartbeat_ns > 0)
      age_max = std::max(age_max, static_cast<double>(now_ns - a.last_heartbeat_ns) * 1e-9);
    rejected += StatOr(a, "transport.rejected");
    nlohmann::json mine = {{"outbox", StatOr(a, "outbox")}};
    if (a.role == "rollout") {
      gen += StatOr(a, "gen_tokens_per_s");
      credits += StatOr(a, "credits");
      in_flight += StatOr(a, "in_flight");
      out_rollout += StatOr(a, "outbox");
      mine["gen_tokens_per_s"] = StatOr(a, "gen_tokens_per_s");
      mine["credits"] = StatOr(a, "credits");
    } else if (a.role == "reward") {
      out_reward += StatOr(a, "outbox");
      awaiting += StatOr(a, "awaiting_learner");
      mine["scored_per_s"] = StatOr(a, "scored_per_s");
    } else if (a.role == "learner") {
      train_tps = StatOr(a, "train_tokens_per_s");
      granted = StatOr(a, "credits_granted");
      queued = StatOr(a, "queued_batches");
      version = static_cast<double>(a.policy_version);
      mine["queued_batches"] = queued;
    }
    per_actor[a.id] = std::move(mine);
  }
  return {{"gen_tokens_per_s", gen},        {"train_tokens_per_s", train_tps},
          {"credits", credits},             {"credits_granted", granted},
          {"in_flight", in_flight},         {"outbox_rollout", out_rollout},
          {"outbox_reward", out_reward},    {"awaiting_learner", awaiting},
          {"queued_batches", queued},       {"learner_version", version},
          {"restarts", restarts},           {"actors_up", up},
          {"heartbeat_age_max_s", age_max}, {"transport_rejected", rejected},
          {"per_actor", std::move(per_actor)}};
}

Result<std::unique_ptr<Telemetry>> Telemetry::Create(const RunDir& run, TelemetryOptions o) {
  std::unique_ptr<Telemetry> t(new Telemetry(run, std::move(o)));
  t->started_ns_ = NowNs();
  if (t->o_.tensorboard.enabled) {
    TROUPE_ASSIGN_OR_RETURN(t->tb_, TbWriter::Open(run.path + "/tb"));
  }
  if (t->o_.dashboard.enabled) {
    DashboardOptions d;
    d.bind = t->o_.dashboard.bind;
    d.port = t->o_.dashboard.port;
    d.token = t->o_.dashboard_token;
    TROUPE_ASSIGN_OR_RETURN(t->dashboard_, Dashboard::Start(run, d));
  }
  return t;
}

Telemetry::~Telemetry() = default;

std::string Telemetry::dashboard_url() const {
  return dashboard_ ? dashboard_->url() : "";
}

void Telemetry::OnMetricsLine(const nlohmann::json& line) {
  const std::string kind = line.value("kind", "");
  if (kind == "train") last_step_ = line.value("step", last_step_);
  if (tb_) WriteTb(line);
}

void Telemetry::WriteTb(const nlohmann::json& line) {
  const std::string kind = line.value("kind", "");
  if (!Scalared(kind)) return;
  const int64_t step = line.value("step", int64_t{0});
  const double wall = static_cast<double>(line.value("time_ns", NowNs())) * 1e-9;
  Status s = Status::Ok();
  for (const auto& [k, v] : line.items()) {
    if (!v.is_number() || Bookkeeping(k)) continue;
    s = tb_->AddScalar(kind + "/" + k, step, v.get<double>(), wall);
    if (!s.ok()) break;
  }
  const auto& extra = line.contains("extra") ? line["extra"] : nlohmann::json();
  if (s.ok() && kind == "train" && extra.is_object()) {
    if (extra.contains("lag_histogram") && extra["lag_histogram"].is_array()) {
      s = tb_->AddIntegerHistogram("train/lag", step, Numbers(extra["lag_histogram"]), wall);
    }
    // Distributions the learner reports as values: group mean rewards.
    static const std::vector<double> kUnit = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
    if (s.ok() && extra.contains("group_rewards") && extra["group_rewards"].is_array())
      s = tb_->AddHistogram("train/group_reward", step,
                            Numbers(extra["group_rewards"]), kUnit, wall);
    const auto& is = extra.value("is_weight_histogram", nlohmann::json());
    if (s.ok() && is.is_object() && is.contains("edges") && is.contains("counts")) {
      Status h = tb_->AddBucketCounts("train/is_weight", step, Numbers(is["edges"]),
                                      Numbers(is["counts"]), wall);
      if (!h.ok() && h.code() != Code::kInvalidArgument) s = h;  // a malformed one is skipped
    }
  }
  if (s.ok() && kind == "eval" && o_.tensorboard.texts_per_eval > 0) WriteTranscripts(step, wall);
  if (!s.ok()) {
    Log().error("TensorBoard events stop: {}", s.ToString());
    tb_.reset();
  }
}

void Telemetry::WriteTranscripts(int64_t step, double wall_time) {
  if (recent_rollouts_.empty()) return;
  std::string md;
  size_t n = 0;
  for (auto it = recent_rollouts_.rbegin();
       it != recent_rollouts_.rend() && n < o_.tensorboard.texts_per_eval; ++it, ++n) {
    const auto& r = *it;
    md += fmt::format("**update {}** · {} · reward {:.3f} · policy version {} (lag {})\n\n",
                      r.value("step", 0), r.value("task", "?"), r.value("reward", 0.0),
                      r.value("policy_version", 0), r.value("lag", 0));
    md += "prompt:\n\n" + Fence(r.value("prompt_text", "")) + "\n\nresponse:\n\n" +
          Fence(r.value("response_text", "")) + "\n\n";
    if (!r.value("failure", "").empty()) md += "scoring failed: " + r.value("failure", "") + "\n\n";
    md += "---\n\n";
  }
  Status s = tb_->AddText("rollouts/transcripts", step, md, wall_time);
  if (!s.ok()) {
    Log().error("TensorBoard events stop: {}", s.ToString());
    tb_.reset();
  }
}

void Telemetry::OnRollouts(const std::string& actor, int64_t time_ns, const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("sequences") || !j["sequences"].is_array()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                        "ignoring a rollouts message from {}: not {{\"sequences\": [...]}}", actor);
    return;
  }
  if (rollouts_failed_) return;
  if (!rollouts_) {
    const std::string path = run_.path + "/rollouts.jsonl";
    rollouts_.reset(std::fopen(path.c_str(), "ab"));
    if (!rollouts_) {
      Log().error("cannot write {}: {}; no more rollout samples", path, std::strerror(errno));
      rollouts_failed_ = true;
      return;
    }
  }
  for (auto& seq : j["sequences"]) {
    if (!seq.is_object()) continue;
    seq["time_ns"] = time_ns;
    seq["actor"] = actor;
    const std::string line =
        seq.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), rollouts_.get()) != line.size()) {
      Log().error("cannot write {}/rollouts.jsonl: {}; no more rollout samples", run_.path,
                  std::strerror(errno));
      rollouts_failed_ = true;
      return;
    }
    recent_rollouts_.push_back(std::move(seq));
    while (recent_rollouts_.size() > 64) recent_rollouts_.pop_front();
  }
  std::fflush(rollouts_.get());
}

bool Telemetry::Due() const {
  const int64_t now = NowNs();
  return now - last_publish_ns_ >= 500'000'000 ||
         now - last_sample_ns_ >= static_cast<int64_t>(o_.dashboard.sample_ms) * 1'000'000;
}

std::optional<nlohmann::json> Telemetry::Tick(const std::vector<ActorStatus>& actors,
                                              const std::map<std::string, double>& progress,
                                              const std::string& state) {
  const int64_t now = NowNs();
  if (now - last_publish_ns_ >= 500'000'000) {
    const bool file = now - last_file_ns_ >= 5'000'000'000;
    PublishStatus(actors, progress, state, file);
    last_publish_ns_ = now;
    if (file) last_file_ns_ = now;
  }
  if (now - last_sample_ns_ < static_cast<int64_t>(o_.dashboard.sample_ms) * 1'000'000)
    return std::nullopt;
  last_sample_ns_ = now;
  nlohmann::json line = {{"time_ns", now}, {"actor", "head"}, {"kind", "heartbeat"},
                         {"step", last_step_}, {"elapsed_s", static_cast<double>(now - started_ns_) * 1e-9}};
  line.update(HeartbeatFigures(actors, now));
  return line;
}

void Telemetry::Finish(const std::vector<ActorStatus>& actors,
                       const std::map<std::string, double>& progress, const std::string& state) {
  PublishStatus(actors, progress, state, true);
}

void Telemetry::PublishStatus(const std::vector<ActorStatus>& actors,
                              const std::map<std::string, double>& progress,
                              const std::string& state, bool write_file) {
  nlohmann::json doc = StatusDocument(o_.job_name, run_, state, actors, progress, NowNs());
  if (write_file) {
    // Not fatal: the dashboard of a finished run shows the last status it finds.
    Status s = WriteFileAtomic(run_.path + "/status.json", doc.dump() + "\n");
    if (!s.ok())
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 60000, "status.json: {}", s.ToString());
  }
  if (dashboard_) dashboard_->Publish(std::move(doc));
}

}  // namespace troupe::launcher
