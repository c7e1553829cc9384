// Logging: one spdlog logger per folder, the actor's name in every line.
//
//   auto& log = troupe::log::Get("transport");
//   log.info("bound {}", endpoint);
//   // 2026-11-30T05:12:01.123 I [rollout-1] transport: bound tcp://10.0.0.2:5555
//
// The process calls log::Init(actor_name, ...) once at start (the launcher uses
// "head", an actor its id). Loggers created before Init pick up the name too.
// Every logger writes to one shared sink list, so a sink added later (the
// actor runtime adds one that ships lines to the head) sees every folder's
// lines. All functions are thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace troupe::log {

struct Options {
  // Minimum level written ("trace", "debug", "info", "warn", "error"). Default info.
  spdlog::level::level_enum level = spdlog::level::info;
  // Write to stderr (default true; actors started by the launcher also ship to the head).
  bool to_stderr = true;
  // Color stderr when it is a terminal.
  bool color = true;
  // Also append to this file when non-empty.
  std::string file;
};

// Sets the actor name shown in every line and (re)configures the sinks.
void Init(const std::string& actor_name, const Options& options = {});
// The actor name given to Init ("troupe" before Init).
std::string ActorName();
// The logger of a folder/component; created on first use. Never null.
spdlog::logger& Get(const std::string& component);
// Adds a sink every logger writes to (e.g. the head forwarder). Thread-safe.
void AddSink(std::shared_ptr<spdlog::sinks::sink> sink);
void RemoveSink(const std::shared_ptr<spdlog::sinks::sink>& sink);
// Minimum level of the stderr sink only (other sinks keep the logger level).
void SetStderrLevel(spdlog::level::level_enum level);
// Sets the level of every logger.
void SetLevel(spdlog::level::level_enum level);
// Parses "trace|debug|info|warn|error|off"; returns false on unknown names.
bool ParseLevel(const std::string& name, spdlog::level::level_enum* out);
// Flushes all sinks (before exit).
void Flush();

// Rate limiter for repeated warnings: true at most once per `period` per call site.
class EveryN {
 public:
  explicit EveryN(std::chrono::milliseconds period) : period_(period) {}
  // Returns true if the caller should log now; counts suppressed calls.
  bool operator()();
  // Number of calls suppressed since the last true.
  uint64_t suppressed() const { return last_suppressed_; }

 private:
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point last_{};
  uint64_t suppressed_ = 0;
  uint64_t last_suppressed_ = 0;
  bool first_ = true;
};

}  // namespace troupe::log

// Logs at most once per `ms` milliseconds from this call site (thread-safe).
#define TROUPE_LOG_EVERY_MS(logger, lvl, ms, ...)                               \
  do {                                                                          \
    static std::mutex _troupe_every_mu;                                         \
    static ::troupe::log::EveryN _troupe_every{std::chrono::milliseconds(ms)};  \
    bool _troupe_go;                                                            \
    {                                                                           \
      std::lock_guard<std::mutex> _g(_troupe_every_mu);                         \
      _troupe_go = _troupe_every();                                             \
    }                                                                           \
    if (_troupe_go && (logger).should_log(lvl)) (logger).log(lvl, __VA_ARGS__); \
  } while (0)
