// The rollout actor's OpenAI-compatible generation endpoint.
//
//   agent server ──HTTP POST /g/<group>/v1/chat/completions (Bearer token)──▶ GenerationEndpoint
//       ──decode (envs/openai_api.h) ─▶ render (Renderer) ─▶ Engine::Submit (continuous batching,
//         the same engine and slots as the actor's own groups) ─▶ record in the GenerationLedger
//       ◀─ OpenAI response + prompt_token_ids / generation_token_ids / generation_log_probs /
//          policy_version
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
// each also under /g/<group>/ — the base URL a /run call hands the agent.
// Generations under a group path are recorded in the ledger for the group's
// lifetime (the rollout actor verifies the agent's episode against them); a
// group that is not open (finished, unknown) is refused with 404. Plain /v1/
// paths serve without recording (benchmarks, manual use).
//
// Chat requests may carry `tools` (rendered by the renderer) and assistant `tool_calls`
// (written in the renderer's tool-call syntax); with tools and tool_choice "auto" replies are
// parsed into `tool_calls` (envs::ShapeToolCall). `stream: true` answers with server-sent
// events: a chunk as tokens are sampled (GenerateRequest::on_token), each choice's final chunk
// (training fields, tool_calls) from the same code as a plain reply, [DONE]. A client that goes
// away cancels its engine request (GenerateRequest::cancel); nothing is recorded for it.
//
// Every request needs `Authorization: Bearer <token>` (401 otherwise); 503
// while `ready()` is false (no weights yet) or when `max_pending` requests are
// already waiting for the engine. A request waits for the engine at most
// `timeout_ms` (then 503; the engine finishes it anyway). The endpoint keeps
// serving after any bad request.
//
// Thread safety: the HTTP server runs on its own threads (a pool of
// `threads`); the public methods may be called from any thread. The
// destructor stops the server and joins its threads; the engine, renderer and
// tokenizer must outlive the endpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/agent.h"
#include "troupe/envs/openai_api.h"
#include "troupe/envs/renderer.h"

namespace troupe::actors {

struct GenerationEndpointOptions {
  std::string host = "127.0.0.1";       // bind and advertised address
  int port = 0;                         // 0 = any free port
  std::string model = "troupe-policy";  // the one model name served
  std::string token;                    // bearer token; must not be empty
  int threads = 32;                     // HTTP worker threads
  int64_t timeout_ms = 120000;          // wait for the engine per request
  int64_t max_pending = 1024;           // requests waiting for the engine at most
  envs::ApiLimits limits;
  std::vector<int32_t> stop_ids;  // token ids that end a reply (EOS, ...)
  int32_t top_k = 0;              // the job's sampling.top_k (OpenAI has no such field)
  uint64_t seed = 0;              // sampler seeds of requests that name none derive from it
};

struct GenerationEndpointStats {
  uint64_t requests = 0;          // HTTP requests to the API routes
  uint64_t ok = 0;                // answered 200
  uint64_t client_errors = 0;     // answered 4xx
  uint64_t server_errors = 0;     // answered 5xx
  uint64_t generated_tokens = 0;  // sampled tokens returned
  uint64_t recorded = 0;          // generations recorded for a group
  uint64_t streams = 0;           // requests answered as server-sent events (stream: true)
  uint64_t streams_cancelled = 0;  // streams whose client went away (engine request cancelled)
  uint64_t streams_running = 0;    // streamed requests the engine still holds (a gauge)
};

class GenerationEndpoint {
 public:
  static Result<std::unique_ptr<GenerationEndpoint>> Start(engine::Engine& engine,
                                                           const envs::Renderer& renderer,
                                                           envs::GenerationLedger& ledger,
                                                           GenerationEndpointOptions options,
                                                           std::function<bool()> ready);
  ~GenerationEndpoint();
  GenerationEndpoint(const GenerationEndpoint&) = delete;
  GenerationEndpoint& operator=(const GenerationEndpoint&) = delete;

  int port() const;
  // "http://host:port/v1", or "http://host:port/g/<group>/v1".
  std::string BaseUrl(const std::string& group = "") const;
  GenerationEndpointStats stats() const;
  // "endpoint.<counter>" for heartbeats.
  std::vector<std::pair<std::string, double>> StatsForMetrics() const;

 private:
  struct Impl;
  explicit GenerationEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors
