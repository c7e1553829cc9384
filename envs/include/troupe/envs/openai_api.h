// OpenAI-compatible request and response shapes for the rollout actors'
// generation endpoint (actors/src/generation_endpoint.h serves them).
//
//   agent server ──POST /v1/completions | /v1/chat/completions (JSON)──▶ DecodeCompletionRequest
//        ▲                                                                 │ CompletionRequest
//        └── EncodeCompletionResponse ◀── CompletionChoice per sample ◀── engine
//
// Requests: OpenAI's fields (model, prompt | messages, n, temperature, top_p,
// max_tokens | max_completion_tokens, stop, logprobs, seed, stream, stream_options; chat:
// tools, tool_choice "auto" | "none", assistant tool_calls, tool_call_id) plus
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

#include <nlohmann/json.hpp>

#include "troupe/envs/message.h"
#include "troupe/envs/tool_call.h"

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
  // Assistant: structured calls (OpenAI's tool_calls); the endpoint writes them after
  // `content` in the model's tool-call syntax (AppendToolCalls) before rendering.
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;                   // tool: the call it answers (accepted, not rendered)
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
  // Chat: OpenAI function schemas, passed to the renderer (null = none given).
  nlohmann::ordered_json tools;
  // Chat: "auto" (default: parse the reply for a call when `tools` are given) or "none".
  // A named function or "required" is refused (decoding cannot be constrained).
  std::string tool_choice = "auto";
  bool stream = false;         // server-sent events (chat.completion.chunk / text_completion)
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage

  // Whether replies are parsed into structured tool_calls.
  bool ParsesToolCalls() const {
    return chat && tool_choice == "auto" && tools.is_array() && !tools.empty();
  }
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
  std::string finish_reason;            // "stop" | "length" | "tool_calls"
  uint64_t policy_version = 0;
  // Chat with tools: the call parsed from `text` (ShapeToolCall); `content` is then the text
  // before it (nullopt: none), and the message carries tool_calls instead of the raw text.
  struct Call {
    std::string id;  // "call_<hex>"
    ToolCall call;
  };
  std::vector<Call> tool_calls;
  std::optional<std::string> content;

  // What the chat message's content is: `text`, or with tool calls `content` ("" for none).
  const std::string& MessageContent() const;
};

// Parses `choice->text` in `format` (ParseToolCall). A call: tool_calls = [{call_id, call}],
// content = the text before the call without trailing whitespace (nullopt when empty),
// finish_reason "tool_calls". No call or a malformed one: the choice is left as it is.
void ShapeToolCall(CompletionChoice* choice, ToolCallFormat format, std::string call_id);

// The response body: OpenAI's "text_completion" / "chat.completion" object.
std::string EncodeCompletionResponse(const CompletionRequest& request, const std::string& id,
                                     int64_t created, const std::string& model,
                                     const std::vector<CompletionChoice>& choices);

// ---- streaming (stream: true): server-sent events, one JSON object per "data: " line.

// "data: <json>\n\n".
std::string SseEvent(std::string_view json);
// "data: [DONE]\n\n".
std::string SseDone();

// A chunk with new text of choice `index` ("chat.completion.chunk" with delta {"content"},
// the role on the choice's first chunk; or a "text_completion" chunk with "text").
std::string EncodeStreamDelta(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model, size_t index,
                              std::string_view text, bool first);
// The last chunk of choice `index`: the rest of its text (`rest`), its tool_calls (chat, as
// one delta), finish_reason, logprobs (the whole choice's) and the training fields.
std::string EncodeStreamFinal(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model, size_t index,
                              const CompletionChoice& choice, std::string_view rest, bool first);
// stream_options.include_usage: the chunk with no choices and the usage of all of them.
std::string EncodeStreamUsage(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model,
                              const std::vector<CompletionChoice>& choices);

// How much of a streamed reply's text so far may be sent: up to the first of `markers`
// (tool-call openers), without a tail that may still become a marker or a stop string (a
// proper prefix of one), an incomplete UTF-8 character, or (trim_space) trailing whitespace.
// What is sent is then a prefix of the final text (or content) the non-streamed reply has.
size_t StreamableLength(std::string_view text, const std::vector<std::string>& stop,
                        const std::vector<std::string_view>& markers, bool trim_space);
// Where a call may start in `format` ("<tool>", "<tool_call>", "{" / "<|python_tag|>").
std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format);

// GET /v1/models.
std::string EncodeModelList(const std::string& model, int64_t created);

}  // namespace troupe::envs
