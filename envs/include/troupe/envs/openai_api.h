// OpenAI-compatible request and response shapes for the rollout actors'
// generation endpoint (actors/src/generation_endpoint.h serves them).
//
//   agent server ──POST /v1/completions | /v1/chat/completions (JSON)──▶ DecodeCompletionRequest
//        ▲                                                                 │ CompletionRequest
//        └── EncodeCompletionResponse ◀── CompletionChoice per sample ◀── engine
//
// Requests: OpenAI's fields (model, prompt | messages, n, temperature, top_p,
// max_tokens | max_completion_tokens, stop, logprobs, seed) plus
// `prompt_token_ids` style input: a completions `prompt` may be a list of
// token ids. Chat assistant messages may carry the `prompt_token_ids` and
// `generation_token_ids` of the reply the endpoint gave (NeMo Gym's agents
// send them back); the endpoint then uses those ids instead of re-rendering
// the reply, so a later turn extends the earlier one token for token.
//
// Responses: OpenAI's shapes plus what training needs, under the field names
// NeMo Gym produces and consumes: `prompt_token_ids`, `generation_token_ids`,
// `generation_log_probs` (the behaviour log-probs the sampler used) and
// `policy_version` (the weights' version at generation start).
//
// Errors are ApiError values (OpenAI's body {"error": {"message", "type",
// "param", "code"}} and an HTTP status): 400 malformed JSON or a field of the
// wrong type/range, 401 no or wrong bearer token, 404 unknown model or path,
// 413 body or prompt too long, 422 a request the model cannot serve (a
// message it cannot render), 503 not ready, overloaded or stopping.
// The decoder never throws and never crashes on any input (fuzzed in
// tests/envs/openai_api_test.cc). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/envs/message.h"

namespace troupe::envs {

// An OpenAI-style error: the HTTP status and the body's fields.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";  // or "authentication_error", "server_error", ...
  std::string message;                         // names the field and the problem
  std::string param;                           // the offending field ("" = none)
  std::string code;                            // machine-readable ("" = none)
  // {"error": {"message", "type", "param" (null if empty), "code" (null if empty)}}
  std::string Json() const;
};
ApiError BadRequest(std::string param, std::string message);

// What one endpoint accepts.
struct ApiLimits {
  size_t max_body_bytes = 4 << 20;     // larger bodies: 413
  int32_t max_n = 16;                  // samples per request
  int32_t max_tokens = 4096;           // max_tokens larger than this: 400
  int32_t default_max_tokens = 64;     // when the request names none
  size_t max_prompt_tokens = 1 << 20;  // prompt ids beyond this: 413 (the engine also refuses
                                       // prompts that do not fit its KV-cache row)
  size_t max_stop = 4;                 // stop strings (OpenAI's limit)
  size_t max_messages = 256;           // chat messages
};

// A chat message with the token ids an agent carried back (NeMo Gym).
struct ApiMessage {
  Message message;
  std::vector<int32_t> prompt_token_ids;      // of the reply this message is (assistant only)
  std::vector<int32_t> generation_token_ids;  // the reply's ids (assistant only)
};

struct CompletionRequest {
  bool chat = false;                // /v1/chat/completions
  std::string model;                // must name the served model
  std::string prompt;               // completions, text prompt
  std::vector<int32_t> prompt_ids;  // completions, token-id prompt (prompt_is_ids)
  bool prompt_is_ids = false;
  std::vector<ApiMessage> messages;  // chat
  int32_t n = 1;
  double temperature = 1.0;
  double top_p = 1.0;
  int32_t max_tokens = 0;  // set from ApiLimits::default_max_tokens when absent
  std::vector<std::string> stop;
  bool logprobs = false;  // return per-token log-probs in OpenAI's shape too
  std::optional<uint64_t> seed;
};

// Decodes a request body. Every problem is an ApiError naming the field.
std::optional<ApiError> DecodeCompletionRequest(std::string_view body, bool chat,
                                                const ApiLimits& limits, CompletionRequest* out);

// One generated sample as the response reports it.
struct CompletionChoice {
  std::string text;                     // decoded generation (cut before a stop string)
  std::vector<int32_t> prompt_ids;      // the whole context the model saw
  std::vector<int32_t> generation_ids;  // sampled ids (up to and with a stop token)
  std::vector<float> logprobs;          // behaviour log-prob per generation id
  std::vector<std::string> tokens;      // piece per generation id (for OpenAI's logprobs)
  std::string finish_reason;            // "stop" | "length"
  uint64_t policy_version = 0;
};

// The response body: OpenAI's "text_completion" / "chat.completion" object.
std::string EncodeCompletionResponse(const CompletionRequest& request, const std::string& id,
                                     int64_t created, const std::string& model,
                                     const std::vector<CompletionChoice>& choices);

// GET /v1/models.
std::string EncodeModelList(const std::string& model, int64_t created);

}  // namespace troupe::envs
