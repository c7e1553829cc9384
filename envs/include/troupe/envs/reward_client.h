// Client for external reward / verifier services over HTTP.
//
//   reward actor ──VerifyBatch──▶ RewardClient ──POST <url> JSON──▶ service "math"
//                                   (routing by sample.service,   ─▶ service "code"
//                                    default_service if empty)
//
// Protocol: POST the sample as JSON
//   {"task": str, "prompt": str, "response": str, "reference": str, "metadata": object}
// to the service's URL (e.g. http://127.0.0.1:8000/verify); a 2xx answer with
//   {"reward": <finite number>, "components"?: {name: number}}
// is a success. Anything else is a failure value, never an exception:
// unreachable (connect failed), connection (closed or reset mid-request),
// timeout, http_status (non-2xx), malformed (not JSON, no finite "reward",
// body over max_response_bytes), unknown_service, no_service. The sample then
// gets reward 0 and a reason naming the service and what went wrong, and the
// service's counter for that kind goes up.
//
// Circuit breaker: after breaker_failures samples in a row failed for the
// service's own reasons, samples fail at once (no request) for
// breaker_cooldown_ms; then one probe request is let through — success closes
// the breaker, failure opens it for another cooldown. A failed sample's
// VerifyResult is `unscored` when the service says on_failure: drop.
//
// Retries: up to max_attempts per sample, with exponential backoff (+-50%
// jitter) between attempts, for every failure except a 4xx other than 408/429
// (the request itself is wrong). Time limits: each attempt is bounded by the
// service's timeout_ms, each sample by call_timeout_ms (all attempts and
// backoffs together), and every call by its `deadline`: Verify and VerifyBatch
// return by min(deadline, start + call_timeout_ms) at the latest (plus a few
// ms), so a dead service never blocks the pipeline longer than configured.
//
// Thread safety: all methods may be called from any number of threads at
// once. VerifyBatch runs up to max_concurrency requests in parallel on threads
// it starts and joins before returning; connections are pooled and reused
// between calls. Proxies from the environment are ignored (requests go
// straight to the configured URL). The destructor closes every connection;
// no call may be in flight then.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/envs/config.h"
#include "troupe/envs/verify.h"

namespace troupe::envs {

// One sample to score.
struct RewardRequest {
  std::string service;    // service name; "" = the default service
  std::string task;       // task name (SequenceMeta.task)
  std::string prompt;     // rendered prompt text
  std::string response;   // decoded response text
  std::string reference;  // expected answer, may be empty
  std::string metadata;   // JSON object text, may be empty (sent as {})
};

// Counters of one service since the client was created.
struct RewardServiceStats {
  std::string name;
  uint64_t samples = 0;         // samples routed to the service
  uint64_t ok = 0;              // samples scored
  uint64_t failed = 0;          // samples that got reward 0 after their last attempt
  uint64_t attempts = 0;        // HTTP attempts (first tries + retries)
  uint64_t retries = 0;         // attempts after the first
  uint64_t unreachable = 0;     // attempts: could not connect
  uint64_t connection = 0;      // attempts: connection closed or reset mid-request
  uint64_t timeouts = 0;        // attempts (or samples out of time) that hit a limit
  uint64_t http_status = 0;     // attempts answered with a non-2xx status
  uint64_t malformed = 0;       // attempts answered with a bad body
  uint64_t short_circuited = 0;  // samples failed at once: circuit breaker open
  uint64_t breaker_opened = 0;   // times the circuit breaker opened
  double latency_ms_total = 0;  // wall time of scored samples, summed
};

class RewardClient {
 public:
  // Validates the config. No network traffic happens here.
  static Result<std::unique_ptr<RewardClient>> Create(const RewardClientConfig& config);
  ~RewardClient();
  RewardClient(const RewardClient&) = delete;
  RewardClient& operator=(const RewardClient&) = delete;

  // Scores one sample on the calling thread. Blocks at most until
  // min(deadline, now + call_timeout_ms). Failures are values (reward 0 +
  // reason); `scorer` is "http:<service>".
  VerifyResult Verify(const RewardRequest& request, Deadline deadline = Deadline::Never());
  // Scores samples in parallel (max_concurrency at a time); results in input
  // order. Blocks at most until min(deadline, now + call_timeout_ms): samples
  // that could not finish by then fail with a timeout reason.
  std::vector<VerifyResult> VerifyBatch(const std::vector<RewardRequest>& requests,
                                        Deadline deadline = Deadline::Never());

  // Per-service counters (configured services in order, then "<unrouted>" for
  // samples naming an unknown service or none without a default).
  std::vector<RewardServiceStats> Stats() const;
  // The same flattened for metrics: "reward_service.<name>.<counter>".
  std::vector<std::pair<std::string, double>> StatsForMetrics() const;
  const RewardClientConfig& config() const { return config_; }

 private:
  struct Impl;
  explicit RewardClient(const RewardClientConfig& config);
  RewardClientConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::envs
