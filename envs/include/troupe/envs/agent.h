// Agent servers from outside: NeMo Gym-style `POST {url}/run` clients, the
// parser that turns their answer into one training sequence, and the ledger
// that checks it against what the generation endpoint really produced.
//
//   rollout actor ──POST {url}/run (task row, endpoint base URL, bearer token)──▶ agent server
//                                                 agent loop: model calls ──▶ endpoint (engine)
//                                                             tool calls ──▶ its own tools
//   rollout actor ◀── {"response": {"output": [...]}, "reward": r} ──────────┘
//        ParseAgentResponse ─▶ AgentEpisode (prompt, response, mask, log-probs)
//        GenerationLedger::Verify ─▶ every model turn matches a generation of its group
//
// The /run request body (JSON):
//   {"responses_create_params": {"input": [{"role", "content"}...], "model", "temperature",
//                                "top_p", "max_output_tokens"},
//    "task": {"id", "name", "reference", "metadata": {...}},
//    <the prompt's metadata fields at top level, as NeMo Gym task rows carry them>,
//    "base_url": "http://host:port/g/<group>/v1", "api_key": "<bearer token>",
//    "model": "<served model name>", "episode_id": "<group>/<k>"}
//
// The answer (NeMo Gym's verify response): {"reward": number, "response": {"output": [item...]}}
// with items in order:
//   {"type": "message" | "function_call", ..., "prompt_token_ids": [...],
//    "generation_token_ids": [...], "generation_log_probs": [...]}   a model turn
//   {"type": "function_call_output", "call_id", "output"}            a tool result (no ids)
//   {"type": "reasoning", ...}                                       carried in the next turn
// Items with token ids are model turns. The episode's sequence is the first
// turn's prompt, then each turn's generation (mask 1) and, between turns, the
// part of the next turn's prompt_token_ids beyond the previous prompt +
// generation (the environment's tokens, mask 0). A turn whose prompt does not
// extend the previous prompt + generation (history rewritten, re-tokenized)
// rejects the episode. {"error": ...}, an empty output or no model turn is a
// failure with a reason (the episode then gets reward 0, num_turns 0).
//
// Thread safety: AgentClient and GenerationLedger may be used from any number
// of threads. ParseAgentResponse is a pure function.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/envs/message.h"

namespace troupe::config {
class Binder;
}

namespace troupe::envs {

// `agent_servers: {name: url}` and `agents.*` of a job.
struct AgentsConfig {
  // Agent servers by name: base URL; Troupe POSTs {url}/run. Empty: no agent path.
  std::map<std::string, std::string> servers;
  // Server for prompts whose agent_ref names none or an unknown one; "" = the first by name.
  std::string default_server;
  // Limit of one /run attempt, ms (an episode can take minutes). Default 300000.
  int64_t run_timeout_ms = 300000;
  // Limit of one episode, all attempts and backoffs together, ms. Default 600000.
  int64_t call_timeout_ms = 600000;
  // TCP connect limit, ms. Default 2000.
  int64_t connect_timeout_ms = 2000;
  // Attempts per episode (retried: unreachable, connection reset, 5xx, 408/429). Default 2.
  int64_t max_attempts = 2;
  // /run calls in flight per server at most. Default 16.
  int64_t max_concurrency = 16;
  // Largest /run answer accepted, bytes. Default 16 MiB.
  int64_t max_response_bytes = 16 << 20;
  // Samples per chat/completions request the endpoint accepts (OpenAI's `n`). Default 16.
  int64_t endpoint_max_n = 16;
  // Worker threads serving the endpoint's HTTP requests; a model call holds one while it
  // waits for the engine, so fewer threads than sessions queue calls behind each other
  // (smaller decode batches). Default 0 = one per /run worker plus 8 (EndpointThreads()).
  int64_t endpoint_threads = 0;
  // A model call waits at most this long for the engine, ms (then 503). Default 120000.
  int64_t endpoint_timeout_ms = 120000;

  bool enabled() const { return !servers.empty(); }
  // /run calls a rollout actor runs at once: max_concurrency per server, at most 128.
  int64_t RunWorkers() const;
  // endpoint_threads, or when 0: RunWorkers() + 8 (each session makes one model call at a
  // time; the rest serve manual and /v1/models requests).
  int64_t EndpointThreads() const;
  // The server a prompt's agent_ref resolves to (see default_server).
  const std::string& Route(const std::string& agent_ref) const;
  Status Validate() const;
};
// The `agents.*` keys (troupe/core/config_binder.h; `agent_servers` is bound by the job schema).
void Describe(config::Binder& b, AgentsConfig& c);

// One model turn of an episode as the agent reported it.
struct AgentTurn {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generation_ids;
  std::vector<float> logprobs;
};

// An episode as one training sequence.
struct AgentEpisode {
  double reward = 0;
  std::vector<AgentTurn> turns;
  std::vector<int32_t> prompt;    // the first turn's prompt ids
  std::vector<int32_t> response;  // generations and environment tokens, in order
  std::vector<float> logprobs;    // per response token (0 where mask is 0)
  std::vector<uint8_t> mask;      // 1 = model token, 0 = environment token
  std::vector<int32_t> turn_of;   // per response token: its model turn (-1 for env tokens)
  std::string transcript;         // the output items' text, for rollouts.jsonl
};

// Parses a /run answer. Errors name the item and field ("output[3]: ...").
Result<AgentEpisode> ParseAgentResponse(std::string_view body, size_t max_tokens);

// What one /run call needs.
struct AgentRunRequest {
  std::string server;  // a name in AgentsConfig::servers
  std::string body;    // the request JSON (MakeRunBody)
};

// The /run body (see above). `metadata` is JSON object text ("" = {}).
std::string MakeRunBody(const Conversation& input, const std::string& prompt_id,
                        const std::string& task, const std::string& reference,
                        const std::string& metadata, const std::string& base_url,
                        const std::string& api_key, const std::string& model,
                        const std::string& episode_id, double temperature, double top_p,
                        int32_t max_output_tokens);

// The agent_ref of a prompt's metadata: "agent_ref": "name" or {"name": "name"}; "" = none.
std::string AgentRefOf(const std::string& metadata);

// Counters of one agent server (monotonic).
struct AgentServerStats {
  uint64_t episodes = 0;        // episodes routed to it
  uint64_t ok = 0;              // parsed and verified
  uint64_t failed = 0;          // reward 0 with a reason (every kind below but retries)
  uint64_t attempts = 0;        // HTTP attempts
  uint64_t retries = 0;         // attempts after the first
  uint64_t unreachable = 0;     // attempts: could not connect / connection reset
  uint64_t timeouts = 0;        // attempts or episodes out of time
  uint64_t http_status = 0;     // attempts answered with a non-2xx status
  uint64_t malformed = 0;       // episodes whose answer could not be parsed
  uint64_t agent_error = 0;     // episodes the agent reported as failed ("error", empty output)
  uint64_t mismatch = 0;        // episodes whose tokens/log-probs differ from the endpoint's
  uint64_t turns = 0;           // model turns of ok episodes
  uint64_t max_in_flight = 0;   // most /run calls in flight at once
  double latency_ms_total = 0;  // wall time of ok episodes
};

// Result of one episode's /run: the answer body, or why there is none.
struct AgentRunOutcome {
  Status status;  // ok: `body` holds a 2xx answer
  std::string body;
  std::string kind;  // on failure: unreachable | timeout | http_status | malformed
};

class AgentClient {
 public:
  static Result<std::unique_ptr<AgentClient>> Create(const AgentsConfig& config);
  ~AgentClient();
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  // POSTs the body to {url}/run, waiting for a free slot of the server's
  // concurrency limit first; retries as configured. Blocks at most until
  // min(deadline, start + call_timeout_ms). Counts attempts and transport
  // failures; the caller reports what became of the episode (Record*).
  AgentRunOutcome Run(const AgentRunRequest& request, Deadline deadline);
  // The episode's end, for the counters: "" = ok (with its turns and latency), else a kind
  // (unreachable | timeout | http_status | malformed | agent_error | mismatch).
  void RecordEpisode(const std::string& server, const std::string& failure_kind, size_t turns,
                     double latency_ms);
  // Ends every /run call in flight (they fail as "cancelled") and any later one at once.
  void Cancel();
  std::map<std::string, AgentServerStats> Stats() const;
  // "agent.<server>.<counter>" for heartbeats (`troupe status --stats`) and final metrics.
  std::vector<std::pair<std::string, double>> StatsForMetrics() const;

 private:
  struct Impl;
  explicit AgentClient(const AgentsConfig& config);
  AgentsConfig config_;
  std::unique_ptr<Impl> impl_;
};

// What the endpoint generated, per group, for the lifetime of the group
// ("trust but verify"): every model turn an agent reports must be a
// generation of its own group with the same prompt ids, generation ids and
// log-probs.
class GenerationLedger {
 public:
  struct Generation {
    std::vector<int32_t> prompt_ids;
    std::vector<int32_t> generation_ids;
    std::vector<float> logprobs;
    std::vector<uint64_t> token_versions;
    uint64_t policy_version = 0;
  };
  // Opens a group (its key goes into the endpoint URL the agent gets).
  void Open(const std::string& group);
  // Forgets a group and its generations.
  void Close(const std::string& group);
  bool IsOpen(const std::string& group) const;
  // Records a generation; false when the group is not open (finished or unknown) or holds
  // max_per_group generations already.
  bool Record(const std::string& group, Generation g);
  // Checks every turn; ok gives the versions per response token (0 for env tokens) and the
  // oldest version. ProtocolError names the first turn that differs and how.
  Status Verify(const std::string& group, const AgentEpisode& episode,
                std::vector<uint64_t>* token_versions, uint64_t* oldest_version) const;
  size_t open_groups() const;
  static constexpr size_t kMaxPerGroup = 4096;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::vector<Generation>> groups_ TROUPE_GUARDED_BY(mu_);
};

}  // namespace troupe::envs
