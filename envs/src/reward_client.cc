#include "troupe/envs/reward_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "rng.h"
#include "troupe/core/log.h"
#include "troupe/core/text.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

enum class Fail { kNone, kUnreachable, kConnection, kTimeout, kHttpStatus, kMalformed };

struct Attempt {
  Fail fail = Fail::kNone;
  std::string reason;
  bool retryable = true;
  VerifyResult result;  // valid when fail == kNone
};

struct Sink {
  std::string* out;
  size_t cap;
  bool overflow = false;
};

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  size_t bytes = size * n;
  if (sink->out->size() + bytes > sink->cap) {
    sink->overflow = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  sink->out->append(data, bytes);
  return bytes;
}

Attempt ParseBody(const std::string& body) {
  Attempt a;
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    a.fail = Fail::kMalformed;
    a.reason = fmt::format("malformed response: not a JSON object ('{}')", Printable(body, 40));
    return a;
  }
  auto reward = doc.find("reward");
  if (reward == doc.end() || !reward->is_number()) {
    a.fail = Fail::kMalformed;
    a.reason = "malformed response: no numeric \"reward\"";
    return a;
  }
  double v = reward->get<double>();
  if (!std::isfinite(v)) {
    a.fail = Fail::kMalformed;
    a.reason = "malformed response: \"reward\" is not finite";
    return a;
  }
  a.result.reward = v;
  auto comps = doc.find("components");
  if (comps != doc.end() && comps->is_object()) {
    for (auto it = comps->begin(); it != comps->end(); ++it)
      if (it->is_number() && std::isfinite(it->get<double>()))
        a.result.components.emplace_back(it.key(), it->get<double>());
  }
  return a;
}

}  // namespace

struct RewardClient::Impl {
  explicit Impl(const RewardClientConfig& config) {
    for (size_t i = 0; i < config.services.size(); ++i) index[config.services[i].name] = i;
    stats.resize(config.services.size() + 1);
    for (size_t i = 0; i < config.services.size(); ++i) stats[i].name = config.services[i].name;
    stats.back().name = "<unrouted>";
    breakers.resize(config.services.size());
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    max_pool = static_cast<size_t>(config.max_concurrency) * 2;
  }
  ~Impl() {
    for (CURL* h : pool) curl_easy_cleanup(h);
    curl_slist_free_all(headers);
  }

  CURL* Acquire() {
    {
      MutexLock lock(mu);
      if (!pool.empty()) {
        CURL* h = pool.back();
        pool.pop_back();
        return h;
      }
    }
    return curl_easy_init();
  }
  void Release(CURL* h) {
    if (!h) return;
    MutexLock lock(mu);
    if (pool.size() < max_pool) {
      pool.push_back(h);
      return;
    }
    curl_easy_cleanup(h);
  }
  template <typename F>
  void Update(size_t service, F f) {
    MutexLock lock(mu);
    f(stats[service]);
  }
  double Jitter() {
    detail::Rng rng(detail::Mix({jitter_counter.fetch_add(1), 0x6a6974ULL}));
    return 0.5 + rng.UniformReal();
  }

  // Per-service circuit breaker (RewardServiceConfig::breaker_failures).
  struct Breaker {
    int64_t consecutive = 0;  // samples in a row that failed for the service's reasons
    bool open = false;
    bool probing = false;  // open, cooldown over, one probe request in flight
    Clock::time_point retry_at{};
  };
  enum class Admit { kSend, kProbe, kFailFast };
  // Whether a sample may be sent to `service` now; on kFailFast `wait_ms` is
  // the time until the next probe.
  Admit BreakerAdmit(size_t service, int64_t* wait_ms) {
    MutexLock lock(mu);
    Breaker& b = breakers[service];
    if (!b.open) return Admit::kSend;
    const auto now = Clock::now();
    if (!b.probing && now >= b.retry_at) {
      b.probing = true;
      return Admit::kProbe;
    }
    *wait_ms = std::max<int64_t>(0, std::chrono::duration_cast<Millis>(b.retry_at - now).count());
    return Admit::kFailFast;
  }
  // The outcome of a sample that was sent; returns true when this opened the breaker.
  bool BreakerRecord(size_t service, const RewardServiceConfig& svc, bool service_failed) {
    MutexLock lock(mu);
    Breaker& b = breakers[service];
    if (!service_failed) {
      b = Breaker{};
      return false;
    }
    ++b.consecutive;
    const bool was_open = b.open;
    if (b.open || (svc.breaker_failures > 0 && b.consecutive >= svc.breaker_failures)) {
      b.open = true;
      b.probing = false;
      b.retry_at = Clock::now() + Millis(svc.breaker_cooldown_ms);
      if (!was_open) ++stats[service].breaker_opened;
    }
    return !was_open && b.open;
  }

  std::map<std::string, size_t> index;  // immutable after construction
  curl_slist* headers = nullptr;        // immutable after construction
  size_t max_pool = 32;
  std::atomic<uint64_t> jitter_counter{0};
  Mutex mu;
  std::vector<CURL*> pool TROUPE_GUARDED_BY(mu);
  std::vector<RewardServiceStats> stats TROUPE_GUARDED_BY(mu);
  std::vector<Breaker> breakers TROUPE_GUARDED_BY(mu);  // one per configured service
};

namespace {

Attempt PostOnce(CURL* h, curl_slist* headers, const RewardServiceConfig& svc,
                 const std::string& body, int64_t timeout_ms, int64_t connect_ms,
                 size_t max_bytes) {
  Attempt a;
  if (!h) {
    a.fail = Fail::kUnreachable;
    a.reason = "could not create an HTTP handle";
    return a;
  }
  std::string response;
  Sink sink{&response, max_bytes};
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, svc.url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_PROXY, "");  // never use a proxy from the environment
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min(timeout_ms, connect_ms)));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  CURLcode rc = curl_easy_perform(h);
  if (sink.overflow) {
    a.fail = Fail::kMalformed;
    a.reason = fmt::format("malformed response: body over {} bytes", max_bytes);
    return a;
  }
  if (rc != CURLE_OK) {
    std::string detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      a.fail = Fail::kTimeout;
      // Say which limit ended it: the attempt's own, or what was left of the
      // sample's time (call_timeout_ms, or the caller's deadline).
      a.reason = timeout_ms < svc.timeout_ms
                     ? fmt::format(
                           "no answer within {} ms (the attempt limit timeout_ms {} was "
                           "cut to the time left for this sample)",
                           timeout_ms, svc.timeout_ms)
                     : fmt::format("no answer within timeout_ms {} ms", timeout_ms);
    } else if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
               rc == CURLE_COULDNT_RESOLVE_PROXY) {
      a.fail = Fail::kUnreachable;
      a.reason = "unreachable: " + detail;
    } else {
      a.fail = Fail::kConnection;
      a.reason = "connection failed: " + detail;
    }
    return a;
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300) {
    a.fail = Fail::kHttpStatus;
    a.reason = fmt::format("HTTP status {}", status);
    // Services may explain themselves with {"error": "..."}.
    json doc = json::parse(response, nullptr, false);
    if (doc.is_object() && doc.contains("error") && doc["error"].is_string())
      a.reason += ": " + Printable(doc["error"].get<std::string>(), 200);
    a.retryable = status >= 500 || status == 408 || status == 429;
    return a;
  }
  return ParseBody(response);
}

std::string RequestBody(const RewardRequest& r) {
  json body = json::object();
  body["task"] = r.task;
  body["prompt"] = r.prompt;
  body["response"] = r.response;
  body["reference"] = r.reference;
  json meta = r.metadata.empty() ? json::object() : json::parse(r.metadata, nullptr, false);
  if (meta.is_discarded()) meta = json::object({{"raw", r.metadata}});
  body["metadata"] = std::move(meta);
  return SafeDump(body);
}

}  // namespace

RewardClient::RewardClient(const RewardClientConfig& config)
    : config_(config), impl_(std::make_unique<Impl>(config)) {}

RewardClient::~RewardClient() = default;

Result<std::unique_ptr<RewardClient>> RewardClient::Create(const RewardClientConfig& config) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  static std::once_flag once;
  static CURLcode init_rc = CURLE_OK;
  std::call_once(once, [] { init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init_rc != CURLE_OK)
    return Internal("libcurl initialisation failed: {}", curl_easy_strerror(init_rc));
  return std::unique_ptr<RewardClient>(new RewardClient(config));
}

VerifyResult RewardClient::Verify(const RewardRequest& request, Deadline deadline) {
  Clock::time_point start = Clock::now();
  Deadline until = deadline.min(Deadline(start + Millis(config_.call_timeout_ms)));
  const std::string& name = request.service.empty() ? config_.default_service : request.service;
  auto it = impl_->index.find(name);
  if (it == impl_->index.end()) {
    size_t unrouted = config_.services.size();
    impl_->Update(unrouted, [](RewardServiceStats& s) {
      ++s.samples;
      ++s.failed;
    });
    if (name.empty())
      return VerifyResult::Failure(
          "http", "sample names no reward service and no default_service is configured");
    std::string known;
    for (const auto& s : config_.services) known += (known.empty() ? "" : ", ") + s.name;
    return VerifyResult::Failure(
        "http", fmt::format("unknown reward service '{}' (configured: {})", Printable(name, 64),
                            known.empty() ? "none" : known));
  }
  const size_t idx = it->second;
  const RewardServiceConfig& svc = config_.services[idx];
  const std::string scorer = "http:" + svc.name;
  impl_->Update(idx, [](RewardServiceStats& s) { ++s.samples; });
  // A service the breaker holds open: the sample fails now, without a request.
  auto failed = [&](std::string reason) {
    VerifyResult r = VerifyResult::Failure(scorer, std::move(reason));
    r.unscored = svc.on_failure == "drop";
    return r;
  };
  int64_t wait_ms = 0;
  const Impl::Admit admit = impl_->BreakerAdmit(idx, &wait_ms);
  if (admit == Impl::Admit::kFailFast) {
    impl_->Update(idx, [](RewardServiceStats& s) {
      ++s.failed;
      ++s.short_circuited;
    });
    return failed(fmt::format(
        "reward service '{}' is failing: circuit open after {} samples in a row failed; next "
        "probe in {} ms",
        svc.name, svc.breaker_failures, wait_ms));
  }
  const std::string body = RequestBody(request);

  Attempt last;
  int64_t attempt = 0;
  CURL* h = impl_->Acquire();
  while (attempt < svc.max_attempts) {
    int64_t left_ms = std::chrono::duration_cast<Millis>(until.remaining()).count();
    if (left_ms < 1) {
      if (attempt == 0 || last.fail == Fail::kNone) {
        last.fail = Fail::kTimeout;
        last.reason = "out of time before the request could be sent";
        impl_->Update(idx, [](RewardServiceStats& s) { ++s.timeouts; });
      }
      break;
    }
    if (attempt > 0) {
      double backoff =
          std::min<double>(static_cast<double>(svc.backoff_ms) * std::pow(2.0, attempt - 1),
                           static_cast<double>(svc.max_backoff_ms)) *
          impl_->Jitter();
      if (backoff >= static_cast<double>(left_ms)) break;  // retrying would pass the deadline
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(backoff * 1000)));
      left_ms = std::chrono::duration_cast<Millis>(until.remaining()).count();
      if (left_ms < 1) break;
    }
    ++attempt;
    last = PostOnce(h, impl_->headers, svc, body, std::min(svc.timeout_ms, left_ms),
                    config_.connect_timeout_ms, static_cast<size_t>(config_.max_response_bytes));
    Fail fail = last.fail;
    impl_->Update(idx, [&](RewardServiceStats& s) {
      ++s.attempts;
      if (attempt > 1) ++s.retries;
      s.unreachable += fail == Fail::kUnreachable;
      s.connection += fail == Fail::kConnection;
      s.timeouts += fail == Fail::kTimeout;
      s.http_status += fail == Fail::kHttpStatus;
      s.malformed += fail == Fail::kMalformed;
    });
    if (fail == Fail::kNone || !last.retryable) break;
  }
  impl_->Release(h);

  double latency_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (last.fail == Fail::kNone) {
    if (admit == Impl::Admit::kProbe)
      log::Get("envs").info("reward service '{}' answered the probe: circuit closed", svc.name);
    impl_->BreakerRecord(idx, svc, false);
    impl_->Update(idx, [&](RewardServiceStats& s) {
      ++s.ok;
      s.latency_ms_total += latency_ms;
    });
    VerifyResult r = std::move(last.result);
    r.scorer = scorer;
    return r;
  }
  impl_->Update(idx, [](RewardServiceStats& s) { ++s.failed; });
  // A request the service rejected as wrong (4xx), or a sample that ran out
  // of time before any request went out, says nothing of the service's health.
  const bool service_failed = attempt > 0 && (last.fail != Fail::kHttpStatus || last.retryable);
  if (impl_->BreakerRecord(idx, svc, service_failed)) {
    log::Get("envs").warn(
        "reward service '{}': circuit open after {} samples in a row failed (last: {}); samples "
        "fail fast for {} ms, then one probe request",
        svc.name, svc.breaker_failures, last.reason, svc.breaker_cooldown_ms);
  }
  TROUPE_LOG_EVERY_MS(log::Get("envs"), spdlog::level::warn, 5000,
                      "reward service '{}' failed: {} (after {} attempt(s))", svc.name, last.reason,
                      attempt);
  return failed(
      fmt::format("reward service '{}': {} (after {} attempt(s))", svc.name, last.reason, attempt));
}

std::vector<VerifyResult> RewardClient::VerifyBatch(const std::vector<RewardRequest>& requests,
                                                    Deadline deadline) {
  std::vector<VerifyResult> results(requests.size());
  if (requests.empty()) return results;
  Deadline until = deadline.min(Deadline::InMs(config_.call_timeout_ms));
  size_t workers = std::min<size_t>(requests.size(), static_cast<size_t>(config_.max_concurrency));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < requests.size(); i = next.fetch_add(1))
      results[i] = Verify(requests[i], until);
  };
  if (workers == 1) {
    work();
    return results;
  }
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (size_t t = 0; t + 1 < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return results;
}

std::vector<RewardServiceStats> RewardClient::Stats() const {
  MutexLock lock(impl_->mu);
  return impl_->stats;
}

std::vector<std::pair<std::string, double>> RewardClient::StatsForMetrics() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& s : Stats()) {
    std::string p = "reward_service." + s.name + ".";
    auto add = [&](const char* k, double v) { out.emplace_back(p + k, v); };
    add("samples", static_cast<double>(s.samples));
    add("ok", static_cast<double>(s.ok));
    add("failed", static_cast<double>(s.failed));
    add("attempts", static_cast<double>(s.attempts));
    add("retries", static_cast<double>(s.retries));
    add("unreachable", static_cast<double>(s.unreachable));
    add("connection", static_cast<double>(s.connection));
    add("timeouts", static_cast<double>(s.timeouts));
    add("http_status", static_cast<double>(s.http_status));
    add("malformed", static_cast<double>(s.malformed));
    add("short_circuited", static_cast<double>(s.short_circuited));
    add("breaker_opened", static_cast<double>(s.breaker_opened));
    add("latency_ms_mean", s.ok ? s.latency_ms_total / static_cast<double>(s.ok) : 0.0);
  }
  return out;
}

}  // namespace troupe::envs
