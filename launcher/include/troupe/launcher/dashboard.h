// The dashboard: a small HTTP server (Debian's cpp-httplib) that shows one
// run folder in a browser, while the job runs (inside `troupe run`, fed by the
// head) or after it ended (`troupe dashboard RUN`, from the folder alone).
//
//   browser ──GET /, /app.js, /uplot.*──▶ page assets (embedded in the binary)
//           ──GET /api/job, /api/actors──▶ status document (head, live) | RUN/status.json
//           ──GET /api/series?from=N───▶ metrics.jsonl records (train, eval, heartbeat, ...)
//           ──GET /api/logs?actor=&offset=─▶ RUN/logs/<actor>.log (tail, follow)
//           ──GET /api/rollouts?...────▶ RUN/rollouts.jsonl (filters: step, reward, task, text)
//   Prometheus ──GET /metrics──────────▶ text exposition format
//
// Access: bound to 127.0.0.1 by default, where requests must name a local
// Host (no DNS rebinding). With a token (required for any other address),
// every request must carry it: `?token=`, `Authorization: Bearer`, or the
// cookie the page gets on its first visit with `?token=`.
//
// Thread-safety: Publish() from any thread; the server answers on its own
// threads and never blocks the head (it reads a copy of the last status).
// The destructor stops the server and joins its threads.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"
#include "troupe/launcher/run_dir.h"

namespace troupe::launcher {

struct DashboardOptions {
  std::string bind = "127.0.0.1";  // listen address
  uint32_t port = 0;               // 0: any free port
  std::string token;  // required on every request when non-empty (must be set off loopback)
  uint32_t threads = 3;  // HTTP worker threads
};

// A fresh random token (32 hex digits, from the OS's random source).
Result<std::string> NewDashboardToken();
// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackAddress(const std::string& address);
// "ADDR", "ADDR:PORT", "[V6]:PORT" or ":PORT" (ADDR stays `options->bind`) into
// options->bind / options->port; errors name the text.
Status ParseDashboardBind(const std::string& text, std::string* bind, uint32_t* port);

class Dashboard {
 public:
  // Binds and starts serving `run`. Without Publish() calls it shows
  // RUN/status.json (a finished run); after the first one, what was published.
  static Result<std::unique_ptr<Dashboard>> Start(const RunDir& run, DashboardOptions options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const;
  // http://<bind>:<port>/ (bind 0.0.0.0 shows this host's name), with
  // ?token=... when a token is required.
  std::string url() const;
  // The job's live status document (see Telemetry::StatusDocument).
  void Publish(nlohmann::json status);

  class Impl;

 private:
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::launcher
