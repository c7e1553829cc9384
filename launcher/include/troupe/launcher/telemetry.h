// Telemetry: what the head records and serves about a job besides
// metrics.jsonl — owned by the head, called on its thread only.
//
//   learner ──Metrics "train"/"eval"/...──▶ head ──metrics.jsonl──┐
//                                             │                   ├──▶ Dashboard (HTTP, own threads)
//                                             ├──▶ TbWriter ──▶ RUN/tb/events.out.tfevents.*
//   learner ──Metrics "rollouts"─────────▶ head ──▶ RUN/rollouts.jsonl (one sampled sequence a line)
//   heartbeats (every actor) ──▶ head ──Tick──▶ "heartbeat" line (job-wide figures) ──▶ metrics.jsonl
//                                           └──▶ status document ──▶ Dashboard (live), RUN/status.json
//
// TensorBoard tags are "<kind>/<field>" for every number of a train, eval,
// warm_start, resume or heartbeat line, at the line's step; histograms
// train/lag (batches per policy lag) and, where the learner reports them,
// train/is_weight and train/group_reward; texts rollouts/transcripts (the
// newest sampled transcripts at each evaluation).
//
// A failure to write tb/ or rollouts.jsonl is logged once and that output
// stops; the job goes on (metrics.jsonl, the head's own record, is what
// stops a job when it cannot be written).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"
#include "troupe/launcher/dashboard.h"
#include "troupe/launcher/job_spec.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/tensorboard.h"

namespace troupe::launcher {

struct ActorStatus;  // head.h

struct TelemetryOptions {
  std::string job_name;
  DashboardSpec dashboard;      // enabled, bind, port, sample_ms
  std::string dashboard_token;  // required when dashboard.bind is not loopback
  TensorboardSpec tensorboard;
};

// The status document: the job, its state ("running", "stopping",
// "finished", "failed") and the actors table (what `troupe status --stats`
// shows). The dashboard serves it; RUN/status.json holds the last one.
nlohmann::json StatusDocument(const std::string& job, const RunDir& run, const std::string& state,
                              const std::vector<ActorStatus>& actors,
                              const std::map<std::string, double>& progress, int64_t now_ns);

// Job-wide figures of one moment from every actor's last heartbeat: the
// "heartbeat" line of metrics.jsonl (without kind/time/step).
nlohmann::json HeartbeatFigures(const std::vector<ActorStatus>& actors, int64_t now_ns);

class Telemetry {
 public:
  static Result<std::unique_ptr<Telemetry>> Create(const RunDir& run, TelemetryOptions options);
  ~Telemetry();

  // "" when the dashboard is off.
  std::string dashboard_url() const;

  // A line the head wrote to metrics.jsonl.
  void OnMetricsLine(const nlohmann::json& line);
  // A "rollouts" metrics message: `json` = {"sequences": [...]}; each
  // sequence becomes a line of rollouts.jsonl (with time_ns and actor).
  void OnRollouts(const std::string& actor, int64_t time_ns, const std::string& json);
  // True when Tick has something to do (cheap; the head calls Tick only then).
  bool Due() const;
  // Publishes the status to the dashboard (at most
  // every 500 ms), writes RUN/status.json (every 5 s), and returns a
  // "heartbeat" line for metrics.jsonl every dashboard.sample_ms.
  std::optional<nlohmann::json> Tick(const std::vector<ActorStatus>& actors,
                                     const std::map<std::string, double>& progress,
                                     const std::string& state);
  // The job ended: the last status (published and written).
  void Finish(const std::vector<ActorStatus>& actors, const std::map<std::string, double>& progress,
              const std::string& state);

 private:
  Telemetry(RunDir run, TelemetryOptions o) : run_(std::move(run)), o_(std::move(o)) {}
  void WriteTb(const nlohmann::json& line);
  void WriteTranscripts(int64_t step, double wall_time);
  void PublishStatus(const std::vector<ActorStatus>& actors,
                     const std::map<std::string, double>& progress, const std::string& state,
                     bool write_file);

  RunDir run_;
  TelemetryOptions o_;
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<TbWriter> tb_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> rollouts_{nullptr, &std::fclose};
  bool rollouts_failed_ = false;
  std::deque<nlohmann::json> recent_rollouts_;  // for the transcripts at each eval
  int64_t last_step_ = 0;                       // the learner's last update (heartbeat lines)
  int64_t started_ns_ = 0;
  int64_t last_sample_ns_ = 0, last_publish_ns_ = 0, last_file_ns_ = 0;
};

}  // namespace troupe::launcher
