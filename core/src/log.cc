#include "troupe/core/log.h"

#include <unistd.h>

#include <map>
#include <mutex>

#include <spdlog/sinks/ansicolor_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace troupe::log {
namespace {

struct State {
  std::mutex mu;
  std::string actor = "troupe";
  spdlog::level::level_enum level = spdlog::level::info;
  std::shared_ptr<spdlog::sinks::dist_sink_mt> dist =
      std::make_shared<spdlog::sinks::dist_sink_mt>();
  std::shared_ptr<spdlog::sinks::sink> stderr_sink;
  std::shared_ptr<spdlog::sinks::sink> file_sink;
  std::map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  bool initialised = false;
};

State& S() {
  static State* s = new State();  // never destroyed: loggers may log during exit
  return *s;
}

std::string Pattern(const std::string& actor) {
  // ISO time, one-letter level, actor, component, message.
  return "%Y-%m-%dT%H:%M:%S.%e %L [" + actor + "] %n: %v";
}

void EnsureDefaultSinkLocked(State& s) {
  if (s.initialised) return;
  s.initialised = true;
  s.stderr_sink =
      std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::automatic);
  s.dist->add_sink(s.stderr_sink);
}

}  // namespace

void Init(const std::string& actor_name, const Options& options) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  s.initialised = true;
  s.actor = actor_name;
  s.level = options.level;
  if (s.stderr_sink) s.dist->remove_sink(s.stderr_sink);
  if (s.file_sink) s.dist->remove_sink(s.file_sink);
  s.stderr_sink.reset();
  s.file_sink.reset();
  if (options.to_stderr) {
    auto mode = options.color ? spdlog::color_mode::automatic : spdlog::color_mode::never;
    s.stderr_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(mode);
    s.dist->add_sink(s.stderr_sink);
  }
  if (!options.file.empty()) {
    s.file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file, false);
    s.dist->add_sink(s.file_sink);
  }
  s.dist->set_pattern(Pattern(actor_name));
  for (auto& [name, logger] : s.loggers) {
    logger->set_level(s.level);
  }
}

std::string ActorName() {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  return s.actor;
}

spdlog::logger& Get(const std::string& component) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  EnsureDefaultSinkLocked(s);
  auto it = s.loggers.find(component);
  if (it != s.loggers.end()) return *it->second;
  auto logger = std::make_shared<spdlog::logger>(component, s.dist);
  logger->set_level(s.level);
  logger->flush_on(spdlog::level::warn);
  s.dist->set_pattern(Pattern(s.actor));
  s.loggers.emplace(component, logger);
  return *logger;
}

void AddSink(std::shared_ptr<spdlog::sinks::sink> sink) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  EnsureDefaultSinkLocked(s);
  sink->set_pattern(Pattern(s.actor));
  s.dist->add_sink(std::move(sink));
}

void RemoveSink(const std::shared_ptr<spdlog::sinks::sink>& sink) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  s.dist->remove_sink(sink);
}

void SetStderrLevel(spdlog::level::level_enum level) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.stderr_sink) s.stderr_sink->set_level(level);
}

void SetLevel(spdlog::level::level_enum level) {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  s.level = level;
  for (auto& [name, logger] : s.loggers) logger->set_level(level);
}

bool ParseLevel(const std::string& name, spdlog::level::level_enum* out) {
  static const std::map<std::string, spdlog::level::level_enum> kLevels = {
      {"trace", spdlog::level::trace},  {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},    {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off}};
  auto it = kLevels.find(name);
  if (it == kLevels.end()) return false;
  *out = it->second;
  return true;
}

void Flush() {
  State& s = S();
  std::lock_guard<std::mutex> g(s.mu);
  s.dist->flush();
}

bool EveryN::operator()() {
  auto now = std::chrono::steady_clock::now();
  if (first_ || now - last_ >= period_) {
    first_ = false;
    last_ = now;
    last_suppressed_ = suppressed_;
    suppressed_ = 0;
    return true;
  }
  ++suppressed_;
  return false;
}

}  // namespace troupe::log
