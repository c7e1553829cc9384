#include "troupe/envs/openai_api.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "troupe/core/text.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

std::optional<ApiError> Err(std::string param, std::string message) {
  return BadRequest(std::move(param), std::move(message));
}

// A number field in [lo, hi]; absent or null keeps *out.
std::optional<ApiError> ReadNumber(const json& doc, const char* key, double lo, double hi,
                                   double* out) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Err(key, fmt::format("'{}' must be a number", key));
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return Err(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v, lo, hi));
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> ReadInt(const json& doc, const char* key, int64_t lo, int64_t hi,
                                int64_t* out, int status_over = 400) {
  auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return Err(key, fmt::format("'{}' must be an integer", key));
  int64_t v = it->is_number_unsigned()
                  ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                  : it->get<int64_t>();
  if (v < lo || v > hi) {
    auto e = Err(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v, lo, hi));
    if (v > hi) e->status = status_over;
    return e;
  }
  *out = v;
  return std::nullopt;
}

// A list of token ids (each in [0, 2^31)).
std::optional<ApiError> ReadIds(const json& v, const std::string& param, size_t max,
                                std::vector<int32_t>* out) {
  if (!v.is_array()) return Err(param, fmt::format("'{}' must be a list of token ids", param));
  if (v.size() > max) {
    auto e = Err(
        param, fmt::format("'{}' has {} token ids; at most {} are accepted", param, v.size(), max));
    e->status = 413;
    e->code = "context_length_exceeded";
    return e;
  }
  out->clear();
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 ||
        v[i].get<int64_t>() > std::numeric_limits<int32_t>::max())
      return Err(param,
                 fmt::format("'{}'[{}] is not a token id (a non-negative integer)", param, i));
    out->push_back(static_cast<int32_t>(v[i].get<int64_t>()));
  }
  return std::nullopt;
}

// Message content: a string, or OpenAI's list of {"type": "text", "text": ...} parts.
std::optional<ApiError> ReadContent(const json& v, const std::string& param, std::string* out) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return Err(param, "content must be a string or a list of text parts");
  for (size_t i = 0; i < v.size(); ++i) {
    const json& p = v[i];
    auto text = p.is_object() ? p.find("text") : p.end();
    auto type = p.is_object() ? p.find("type") : p.end();
    if (!p.is_object() || type == p.end() || !type->is_string() || *type != "text" ||
        text == p.end() || !text->is_string())
      return Err(fmt::format("{}[{}]", param, i),
                 "only {\"type\": \"text\", \"text\": ...} content parts are supported");
    *out += text->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> ReadMessages(const json& doc, const ApiLimits& limits,
                                     std::vector<ApiMessage>* out) {
  auto it = doc.find("messages");
  if (it == doc.end() || !it->is_array() || it->empty())
    return Err("messages", "'messages' must be a non-empty list");
  if (it->size() > limits.max_messages) {
    auto e = Err("messages", fmt::format("{} messages; at most {} are accepted", it->size(),
                                         limits.max_messages));
    e->status = 413;
    return e;
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return Err(param, "a message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Err(param + ".role", "missing role");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    auto parsed = ParseRole(r);
    if (!parsed.ok())
      return Err(param + ".role", fmt::format("unknown role '{}' (system, developer, user, "
                                              "assistant, tool)",
                                              Printable(r, 32)));
    ApiMessage am;
    am.message.role = *parsed;
    auto content = m.find("content");
    if (content != m.end())
      if (auto e = ReadContent(*content, param + ".content", &am.message.content)) return e;
    auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty())) {
      if (am.message.role != Role::kAssistant)
        return Err(param + ".tool_calls", "only assistant messages carry tool_calls");
      auto parsed_calls = ReadToolCalls(*calls);
      if (!parsed_calls.ok()) return Err(param + ".tool_calls", parsed_calls.status().message());
      am.tool_calls = std::move(parsed_calls).value();
    }
    auto call_id = m.find("tool_call_id");
    if (call_id != m.end() && !call_id->is_null()) {
      if (!call_id->is_string()) return Err(param + ".tool_call_id", "must be a string");
      am.tool_call_id = call_id->get<std::string>();
    }
    if (am.message.role == Role::kAssistant) {
      auto p = m.find("prompt_token_ids");
      auto g = m.find("generation_token_ids");
      if ((p == m.end()) != (g == m.end()))
        return Err(param,
                   "an assistant message carries both prompt_token_ids and "
                   "generation_token_ids or neither");
      if (p != m.end()) {
        if (auto e = ReadIds(*p, param + ".prompt_token_ids", limits.max_prompt_tokens,
                             &am.prompt_token_ids))
          return e;
        if (auto e = ReadIds(*g, param + ".generation_token_ids", limits.max_prompt_tokens,
                             &am.generation_token_ids))
          return e;
      }
    }
    out->push_back(std::move(am));
  }
  return std::nullopt;
}

// tools, tool_choice: schemas are checked for shape here, rendered by the endpoint.
std::optional<ApiError> ReadTools(const json& doc, CompletionRequest* out) {
  auto tools = doc.find("tools");
  if (tools != doc.end() && !tools->is_null()) {
    if (!out->chat) return Err("tools", "'tools' is a chat completions field");
    if (!tools->is_array()) return Err("tools", "'tools' must be a list of function schemas");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string param = fmt::format("tools[{}]", i);
      const auto type = t.is_object() ? t.find("type") : t.end();
      if (!t.is_object() || (type != t.end() && !(type->is_string() && *type == "function")))
        return Err(param, "only {\"type\": \"function\", \"function\": {...}} tools are supported");
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object())
        return Err(param + ".function", "a function schema (an object) is required");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
        return Err(param + ".function.name", "a non-empty string is required");
      auto params = fn->find("parameters");
      if (params != fn->end() && !params->is_null() && !params->is_object())
        return Err(param + ".function.parameters", "must be a JSON schema object");
    }
    if (!tools->empty()) out->tools = nlohmann::ordered_json::parse(tools->dump());
  }
  auto choice = doc.find("tool_choice");
  if (choice == doc.end() || choice->is_null()) return std::nullopt;
  if (choice->is_string() && (*choice == "auto" || *choice == "none")) {
    out->tool_choice = choice->get<std::string>();
    return std::nullopt;
  }
  if ((choice->is_string() && *choice == "required") || choice->is_object())
    return Err("tool_choice",
               "only \"auto\" and \"none\" are supported: forcing a call (\"required\" or a named "
               "function) needs constrained decoding, which this endpoint does not do");
  return Err("tool_choice", "'tool_choice' must be \"auto\" or \"none\"");
}

std::optional<ApiError> ReadStop(const json& doc, const ApiLimits& limits,
                                 std::vector<std::string>* out) {
  auto it = doc.find("stop");
  if (it == doc.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) out->push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (!it->is_array()) return Err("stop", "'stop' must be a string or a list of strings");
  if (it->size() > limits.max_stop)
    return Err("stop", fmt::format("{} stop strings; at most {}", it->size(), limits.max_stop));
  for (const auto& s : *it) {
    if (!s.is_string() || s.get<std::string>().empty())
      return Err("stop", "every stop entry must be a non-empty string");
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadPrompt(const json& doc, const ApiLimits& limits,
                                   CompletionRequest* out) {
  auto it = doc.find("prompt");
  if (it == doc.end()) return Err("prompt", "'prompt' is required");
  if (it->is_string()) {
    out->prompt = it->get<std::string>();
    if (out->prompt.empty()) return Err("prompt", "'prompt' is empty");
    return std::nullopt;
  }
  // A list holding one list of ids, or one string, is OpenAI's batch form of one prompt.
  const json* v = &*it;
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_array() || (*v)[0].is_string())) v = &(*v)[0];
  if (v->is_string()) {
    out->prompt = v->get<std::string>();
    if (out->prompt.empty()) return Err("prompt", "'prompt' is empty");
    return std::nullopt;
  }
  if (v->is_array() && !v->empty() && !(*v)[0].is_number_integer())
    return Err("prompt", "batched prompts are not supported: send one prompt per request");
  if (auto e = ReadIds(*v, "prompt", limits.max_prompt_tokens, &out->prompt_ids)) return e;
  if (out->prompt_ids.empty()) return Err("prompt", "'prompt' is empty");
  out->prompt_is_ids = true;
  return std::nullopt;
}

json LogprobsJson(const CompletionRequest& req, const CompletionChoice& c) {
  if (!req.logprobs) return nullptr;
  json lp = json::object();
  if (req.chat) {
    json content = json::array();
    for (size_t i = 0; i < c.generation_ids.size(); ++i)
      content.push_back({{"token", i < c.tokens.size() ? c.tokens[i] : ""},
                         {"logprob", c.logprobs[i]},
                         {"top_logprobs", json::array()}});
    lp["content"] = std::move(content);
  } else {
    lp["tokens"] = c.tokens;
    lp["token_logprobs"] = c.logprobs;
  }
  return lp;
}

json ToolCallsJson(const CompletionChoice& c, bool with_index) {
  json calls = json::array();
  for (size_t k = 0; k < c.tool_calls.size(); ++k) {
    const auto& tc = c.tool_calls[k];
    json one = {{"id", tc.id},
                {"type", "function"},
                {"function", {{"name", tc.call.name}, {"arguments", SafeDump(tc.call.args)}}}};
    if (with_index) one["index"] = k;
    calls.push_back(std::move(one));
  }
  return calls;
}

json TrainingFields(const CompletionChoice& c) {
  return {{"prompt_token_ids", c.prompt_ids},
          {"generation_token_ids", c.generation_ids},
          {"generation_log_probs", c.logprobs},
          {"policy_version", c.policy_version}};
}

json ChunkHead(const CompletionRequest& request, const std::string& id, int64_t created,
               const std::string& model) {
  return {{"id", id},
          {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model}};
}

bool IsSpace(char ch) {
  return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r';
}

}  // namespace

const std::string& CompletionChoice::MessageContent() const {
  static const std::string kEmpty;
  if (tool_calls.empty()) return text;
  return content ? *content : kEmpty;
}

void ShapeToolCall(CompletionChoice* choice, ToolCallFormat format, std::string call_id) {
  ParsedTurn turn = ParseToolCall(choice->text, format);
  if (turn.kind != ParsedTurn::Kind::kCall) return;
  std::string before = choice->text.substr(0, std::min(turn.begin, choice->text.size()));
  while (!before.empty() && IsSpace(before.back())) before.pop_back();
  choice->content = before.empty() ? std::nullopt : std::optional<std::string>(std::move(before));
  choice->tool_calls = {CompletionChoice::Call{std::move(call_id), std::move(turn.call)}};
  choice->finish_reason = "tool_calls";
}

std::string SseEvent(std::string_view json) {
  std::string out = "data: ";
  out.append(json);
  out += "\n\n";
  return out;
}

std::string SseDone() {
  return "data: [DONE]\n\n";
}

std::string EncodeStreamDelta(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model, size_t index,
                              std::string_view text, bool first) {
  json out = ChunkHead(request, id, created, model);
  json ch = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (request.chat) {
    json delta = {{"content", std::string(text)}};
    if (first) delta["role"] = "assistant";
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = std::string(text);
  }
  out["choices"] = json::array({std::move(ch)});
  return SafeDump(out);
}

std::string EncodeStreamFinal(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model, size_t index,
                              const CompletionChoice& c, std::string_view rest, bool first) {
  json out = ChunkHead(request, id, created, model);
  json ch = {
      {"index", index}, {"finish_reason", c.finish_reason}, {"logprobs", LogprobsJson(request, c)}};
  if (request.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!rest.empty()) delta["content"] = std::string(rest);
    if (!c.tool_calls.empty()) delta["tool_calls"] = ToolCallsJson(c, /*with_index=*/true);
    ch["delta"] = std::move(delta);
  } else {
    ch["text"] = std::string(rest);
  }
  ch.update(TrainingFields(c));
  out["choices"] = json::array({std::move(ch)});
  out["policy_version"] = c.policy_version;
  return SafeDump(out);
}

std::string EncodeStreamUsage(const CompletionRequest& request, const std::string& id,
                              int64_t created, const std::string& model,
                              const std::vector<CompletionChoice>& choices) {
  json out = ChunkHead(request, id, created, model);
  out["choices"] = json::array();
  int64_t completion_tokens = 0;
  for (const auto& c : choices) completion_tokens += static_cast<int64_t>(c.generation_ids.size());
  int64_t prompt_tokens = choices.empty() ? 0 : static_cast<int64_t>(choices[0].prompt_ids.size());
  out["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  return SafeDump(out);
}

std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>"};
    case ToolCallFormat::kLlama3Json:
      return {"{", "<|python_tag|>"};
    case ToolCallFormat::kTroupe:
      break;
  }
  return {kToolOpen};
}

size_t StreamableLength(std::string_view text, const std::vector<std::string>& stop,
                        const std::vector<std::string_view>& markers, bool trim_space) {
  size_t n = text.size();
  for (std::string_view m : markers) n = std::min(n, text.find(m));
  // A tail that is a proper prefix of a marker or a stop string may still become one.
  auto hold_prefixes_of = [&](std::string_view s) {
    for (size_t k = std::min(s.size() - 1, n); k > 0; --k)
      if (text.substr(n - k, k) == s.substr(0, k)) {
        n -= k;
        return;
      }
  };
  for (std::string_view m : markers)
    if (!m.empty()) hold_prefixes_of(m);
  for (const std::string& st : stop)
    if (!st.empty()) hold_prefixes_of(st);
  // An incomplete UTF-8 character at the end (its lead byte says how long it is).
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto ch = static_cast<unsigned char>(text[n - back]);
    if ((ch & 0xC0) == 0x80) continue;  // continuation byte
    const size_t len = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
    if (len > back) n -= back;
    break;
  }
  if (trim_space)
    while (n > 0 && IsSpace(text[n - 1])) --n;
  return n;
}

std::string ApiError::Json() const {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return SafeDump(json{{"error", std::move(e)}});
}

ApiError BadRequest(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::optional<ApiError> DecodeCompletionRequest(std::string_view body, bool chat,
                                                const ApiLimits& limits, CompletionRequest* out) {
  *out = CompletionRequest{};
  out->chat = chat;
  if (body.size() > limits.max_body_bytes) {
    ApiError e = BadRequest("", fmt::format("request body of {} bytes; at most {} are accepted",
                                            body.size(), limits.max_body_bytes));
    e.status = 413;
    return e;
  }
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return BadRequest("", fmt::format("malformed JSON body ('{}')", Printable(body, 40)));
  if (!doc.is_object()) return BadRequest("", "the body must be a JSON object");
  auto model = doc.find("model");
  if (model == doc.end() || !model->is_string())
    return BadRequest("model", "'model' (a string) is required");
  out->model = model->get<std::string>();
  if (chat) {
    if (auto e = ReadMessages(doc, limits, &out->messages)) return e;
  } else if (auto e = ReadPrompt(doc, limits, out)) {
    return e;
  }
  int64_t n = 1;
  if (auto e = ReadInt(doc, "n", 1, limits.max_n, &n)) return e;
  out->n = static_cast<int32_t>(n);
  if (auto e = ReadNumber(doc, "temperature", 0.0, 2.0, &out->temperature)) return e;
  if (auto e = ReadNumber(doc, "top_p", 0.0, 1.0, &out->top_p)) return e;
  if (out->top_p <= 0.0) return BadRequest("top_p", "'top_p' must be greater than 0");
  int64_t max_tokens = limits.default_max_tokens;
  const char* mt_key =
      doc.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = ReadInt(doc, mt_key, 1, limits.max_tokens, &max_tokens)) return e;
  out->max_tokens = static_cast<int32_t>(max_tokens);
  if (auto e = ReadStop(doc, limits, &out->stop)) return e;
  auto lp = doc.find("logprobs");
  if (lp != doc.end() && !lp->is_null()) {
    // Chat: a boolean. Completions: an integer (top-k count; 0 = the sampled token only).
    if (lp->is_boolean())
      out->logprobs = lp->get<bool>();
    else if (lp->is_number_integer() && lp->get<int64_t>() >= 0 && lp->get<int64_t>() <= 20)
      out->logprobs = true;
    else
      return BadRequest("logprobs", "'logprobs' must be a boolean or an integer in [0, 20]");
  }
  auto seed = doc.find("seed");
  if (seed != doc.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return BadRequest("seed", "'seed' must be an integer");
    out->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                           : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (auto e = ReadTools(doc, out)) return e;
  auto stream = doc.find("stream");
  if (stream != doc.end() && !stream->is_null()) {
    if (!stream->is_boolean()) return BadRequest("stream", "'stream' must be a boolean");
    out->stream = stream->get<bool>();
  }
  auto so = doc.find("stream_options");
  if (so != doc.end() && !so->is_null()) {
    if (!so->is_object()) return BadRequest("stream_options", "'stream_options' must be an object");
    if (!out->stream)
      return BadRequest("stream_options", "'stream_options' is only allowed with stream: true");
    auto usage = so->find("include_usage");
    if (usage != so->end() && !usage->is_null()) {
      if (!usage->is_boolean())
        return BadRequest("stream_options.include_usage", "must be a boolean");
      out->include_usage = usage->get<bool>();
    }
  }
  return std::nullopt;
}

std::string EncodeCompletionResponse(const CompletionRequest& request, const std::string& id,
                                     int64_t created, const std::string& model,
                                     const std::vector<CompletionChoice>& choices) {
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model}};
  json arr = json::array();
  int64_t completion_tokens = 0;
  uint64_t version = UINT64_MAX;
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionChoice& c = choices[i];
    completion_tokens += static_cast<int64_t>(c.generation_ids.size());
    version = std::min(version, c.policy_version);
    json train = TrainingFields(c);
    json ch = {
        {"index", i}, {"finish_reason", c.finish_reason}, {"logprobs", LogprobsJson(request, c)}};
    if (request.chat) {
      json msg = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.empty()) {
        msg["content"] = c.content ? json(*c.content) : json(nullptr);
        msg["tool_calls"] = ToolCallsJson(c, /*with_index=*/false);
      }
      msg.update(train);
      ch["message"] = std::move(msg);
    } else {
      ch["text"] = c.text;
    }
    ch.update(train);
    arr.push_back(std::move(ch));
  }
  out["choices"] = std::move(arr);
  int64_t prompt_tokens = choices.empty() ? 0 : static_cast<int64_t>(choices[0].prompt_ids.size());
  out["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  out["policy_version"] = choices.empty() ? 0 : version;
  return SafeDump(out);
}

std::string EncodeModelList(const std::string& model, int64_t created) {
  json m = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "troupe"}};
  return SafeDump(json{{"object", "list"}, {"data", json::array({m})}});
}

}  // namespace troupe::envs
