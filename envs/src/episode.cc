#include "troupe/envs/episode.h"

#include <cmath>
#include <exception>
#include <functional>

#include <nlohmann/json.hpp>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

std::string ToolNames(const std::vector<ToolSpec>& tools) {
  std::string out;
  for (const auto& t : tools) out += (out.empty() ? "" : ", ") + t.name;
  return out;
}

void SanitizeAscii(std::string* text) {
  for (char& c : *text) {
    auto u = static_cast<unsigned char>(c);
    if (!(u == '\n' || u == '\t' || (u >= 0x20 && u < 0x7f))) c = '?';
  }
}

}  // namespace

const char* EpisodeEndName(EpisodeEnd end) {
  switch (end) {
    case EpisodeEnd::kRunning:
      return "running";
    case EpisodeEnd::kSubmitted:
      return "submitted";
    case EpisodeEnd::kTurnLimit:
      return "turn_limit";
    case EpisodeEnd::kTokenLimit:
      return "token_limit";
    case EpisodeEnd::kAborted:
      return "aborted";
  }
  return "unknown";
}

std::vector<std::pair<std::string, double>> EpisodeFlags::AsStats() const {
  return {{"missing_calls", static_cast<double>(missing_calls)},
          {"unparsable_calls", static_cast<double>(unparsable_calls)},
          {"unknown_tools", static_cast<double>(unknown_tools)},
          {"repeated_calls", static_cast<double>(repeated_calls)},
          {"tool_errors", static_cast<double>(tool_errors)},
          {"truncated_outputs", static_cast<double>(truncated_outputs)}};
}

EpisodeFlags& EpisodeFlags::operator+=(const EpisodeFlags& o) {
  missing_calls += o.missing_calls;
  unparsable_calls += o.unparsable_calls;
  unknown_tools += o.unknown_tools;
  repeated_calls += o.repeated_calls;
  tool_errors += o.tool_errors;
  truncated_outputs += o.truncated_outputs;
  return *this;
}

// ---------------------------------------------------------------- Episode

Episode::Episode(const Task& task, Prompt prompt, const EpisodeConfig& config,
                 std::unique_ptr<Environment> env, ToolCallFormat format)
    : task_(task), prompt_(std::move(prompt)), config_(config), env_(std::move(env)), format_(format) {}

Result<std::unique_ptr<Episode>> Episode::Start(const Task& task, Prompt prompt,
                                                const EpisodeConfig& config, ToolCallFormat format) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  if (!task.multi_turn())
    return InvalidArgument("task '{}' is single-turn; episodes need a multi-turn task",
                           task.name());
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, task.NewEnvironment(prompt));
  return std::unique_ptr<Episode>(
      new Episode(task, std::move(prompt), config, std::move(env), format));
}

ToolResult Episode::RunCall(std::string_view text) {
  ParsedTurn parsed = ParseToolCall(text, format_);
  const auto& tools = env_->tools();
  if (parsed.kind == ParsedTurn::Kind::kNoCall) {
    ++flags_.missing_calls;
    return ToolResult::Error(fmt::format("no tool call found; write {} (tools: {})",
                                         ToolCallSyntax(format_), ToolNames(tools)));
  }
  if (parsed.kind == ParsedTurn::Kind::kMalformed) {
    ++flags_.unparsable_calls;
    return ToolResult::Error("unparsable tool call: " + parsed.error);
  }
  const ToolCall& call = parsed.call;
  bool known = false;
  for (const auto& t : tools) known = known || t.name == call.name;
  if (!known) {
    ++flags_.unknown_tools;
    return ToolResult::Error(
        fmt::format("unknown tool '{}' (tools: {})", call.name, ToolNames(tools)));
  }
  if (!seen_calls_.insert(std::hash<std::string>{}(call.canonical)).second) ++flags_.repeated_calls;
  ToolResult result;
  try {
    result = env_->Call(call.name, call.args);
  } catch (const std::exception& e) {
    TROUPE_LOG_EVERY_MS(log::Get("envs"), spdlog::level::warn, 10000,
                        "task {}: tool '{}' threw: {}", task_.name(), call.name, e.what());
    result = ToolResult::Error(fmt::format("tool '{}' failed with an internal error", call.name));
  } catch (...) {
    result = ToolResult::Error(fmt::format("tool '{}' failed with an internal error", call.name));
  }
  if (!result.ok) {
    ++flags_.tool_errors;
    result.submitted = false;
  }
  return result;
}

std::string Episode::FormatOutput(const ToolResult& result) {
  std::string text = result.ok ? result.output : "error: " + result.output;
  if (config_.ascii_tool_output) SanitizeAscii(&text);
  auto max = static_cast<size_t>(config_.max_tool_output_chars);
  if (text.size() > max) {
    size_t cut = text.size() - max;
    text.resize(max);
    text += fmt::format("[truncated {} chars]", cut);
    ++flags_.truncated_outputs;
  }
  return text;
}

std::optional<std::string> Episode::OnAssistantTurn(std::string_view text) {
  if (done()) return std::nullopt;
  ++turns_;
  transcript_.push_back(Message{Role::kAssistant, std::string(text)});
  ToolResult result = RunCall(text);
  if (result.submitted) {
    End(EpisodeEnd::kSubmitted);
    return std::nullopt;
  }
  if (turns_ >= config_.max_turns) {
    End(EpisodeEnd::kTurnLimit);
    return std::nullopt;
  }
  std::string out = FormatOutput(result);
  transcript_.push_back(Message{Role::kTool, out});
  return out;
}

void Episode::Finish(EpisodeEnd end, std::string reason) {
  if (done()) return;
  abort_reason_ = std::move(reason);
  End(end == EpisodeEnd::kRunning ? EpisodeEnd::kAborted : end);
}

void Episode::End(EpisodeEnd end) {
  end_ = end;
  try {
    score_ = env_->Score();
  } catch (const std::exception& e) {
    score_ = VerifyResult::Failure(task_.name(), std::string("scorer threw: ") + e.what());
  } catch (...) {
    score_ = VerifyResult::Failure(task_.name(), "scorer threw");
  }
  if (!std::isfinite(score_.reward))
    score_ = VerifyResult::Failure(task_.name(), "scorer returned a non-finite reward");
  if (score_.scorer.empty()) score_.scorer = task_.name();
  env_.reset();  // free the workspace now, not when the sample is shipped
}

std::string Episode::SummaryJson() const {
  json ep = json::object();
  ep["score"] = score_.reward;
  ep["end"] = EpisodeEndName(end_);
  ep["turns"] = turns_;
  if (!score_.failure.empty()) ep["failure"] = score_.failure;
  if (!abort_reason_.empty()) ep["abort_reason"] = abort_reason_;
  json comps = json::object();
  for (const auto& [k, v] : score_.components) comps[k] = std::isfinite(v) ? v : 0.0;
  ep["components"] = std::move(comps);
  json flags = json::object();
  for (const auto& [k, v] : flags_.AsStats()) flags[k] = static_cast<int64_t>(v);
  ep["flags"] = std::move(flags);
  json out = json::object();
  out["episode"] = std::move(ep);
  json meta = prompt_.metadata.empty() ? json() : json::parse(prompt_.metadata, nullptr, false);
  out["metadata"] = meta.is_discarded() ? json() : std::move(meta);
  return SafeDump(out);
}

// ---------------------------------------------------------------- TokenEpisode

TokenEpisode::TokenEpisode(const Renderer& renderer, std::unique_ptr<Episode> episode,
                           std::vector<int32_t> prompt_tokens)
    : renderer_(renderer), episode_(std::move(episode)), prompt_tokens_(std::move(prompt_tokens)) {}

Result<std::unique_ptr<TokenEpisode>> TokenEpisode::Start(const Task& task, Prompt prompt,
                                                          const EpisodeConfig& config,
                                                          const Renderer& renderer) {
  TROUPE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, renderer.RenderPrompt(prompt.messages));
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Episode> ep,
                          Episode::Start(task, std::move(prompt), config, renderer.tool_call_format()));
  return std::unique_ptr<TokenEpisode>(new TokenEpisode(renderer, std::move(ep), std::move(ids)));
}

int64_t TokenEpisode::next_turn_budget() const {
  if (done()) return 0;
  const EpisodeConfig& c = episode_->config();
  return std::max<int64_t>(0, std::min(c.max_turn_tokens, c.max_response_tokens - used()));
}

std::string TokenEpisode::prompt_text() const {
  return renderer_.PromptText(episode_->prompt().messages);
}

Result<TokenEpisode::Step> TokenEpisode::OnAssistantTokens(const std::vector<int32_t>& tokens,
                                                           const std::vector<float>& logprobs) {
  if (done()) return InvalidArgument("episode '{}' has already ended", episode_->prompt().id);
  Status bad;
  if (tokens.size() != logprobs.size()) {
    bad = InvalidArgument("turn has {} tokens but {} log-probs", tokens.size(), logprobs.size());
  } else if (static_cast<int64_t>(tokens.size()) > next_turn_budget()) {
    bad = InvalidArgument("turn has {} tokens, over the turn budget of {}", tokens.size(),
                          next_turn_budget());
  }
  int32_t vocab = renderer_.tokenizer().vocab_size();
  for (size_t i = 0; bad.ok() && i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      bad = InvalidArgument("token {} at turn position {} is outside the vocabulary [0, {})",
                            tokens[i], i, vocab);
  }
  if (!bad.ok()) {
    episode_->Finish(EpisodeEnd::kAborted, bad.message());
    return bad;
  }
  response_tokens_.insert(response_tokens_.end(), tokens.begin(), tokens.end());
  logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
  loss_mask_.insert(loss_mask_.end(), tokens.size(), 1);
  Result<std::string> text = renderer_.tokenizer().Decode(tokens, /*skip_special=*/true);
  std::string turn_text = text.ok() ? std::move(*text) : std::string();
  response_text_ += turn_text;

  std::optional<std::string> out = episode_->OnAssistantTurn(turn_text);
  if (!out) return Step{true, {}};
  const int64_t max = episode_->config().max_response_tokens;
  // The transcript's last message is this tool turn; keep it equal to what the
  // model is shown, or drop it when the model will not see it.
  auto& transcript = episode_->transcript_;
  TROUPE_CHECK(!transcript.empty() && transcript.back().role == Role::kTool);
  Result<std::vector<int32_t>> env = renderer_.RenderToolTurn(*out);
  if (!env.ok()) {
    // A character the tokenizer lacks: retry with printable ASCII only.
    std::string ascii = *out;
    for (char& c : ascii) {
      auto u = static_cast<unsigned char>(c);
      if (!(u == '\n' || u == '\t' || (u >= 0x20 && u < 0x7f))) c = '?';
    }
    env = renderer_.RenderToolTurn(ascii);
    if (!env.ok()) {
      transcript.pop_back();
      episode_->Finish(EpisodeEnd::kAborted, env.status().message());
      return Step{true, {}};
    }
    *out = ascii;
    transcript.back().content = std::move(ascii);
  }
  // The environment tokens plus at least one generated token must fit.
  if (used() + static_cast<int64_t>(env->size()) + 1 > max) {
    transcript.pop_back();
    episode_->Finish(EpisodeEnd::kTokenLimit);
    return Step{true, {}};
  }
  response_tokens_.insert(response_tokens_.end(), env->begin(), env->end());
  logprobs_.insert(logprobs_.end(), env->size(), 0.0f);
  loss_mask_.insert(loss_mask_.end(), env->size(), 0);
  response_text_ += renderer_.ToolTurnText(*out);
  return Step{false, std::move(*env)};
}

// ---------------------------------------------------------------- helpers

Result<std::unique_ptr<Episode>> PlayEpisode(const Task& task, const Prompt& prompt,
                                             const EpisodeConfig& config,
                                             const TextPolicy& policy) {
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Episode> ep, Episode::Start(task, prompt, config));
  while (!ep->done()) ep->OnAssistantTurn(policy(ep->prompt(), ep->transcript()));
  return ep;
}

VerifyResult VerifyFromEpisodeRecord(const std::string& scorer, std::string_view metadata) {
  json doc = json::parse(metadata.begin(), metadata.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return VerifyResult::Failure(scorer,
                                 "sample metadata is not a JSON object with an episode record");
  auto ep = doc.find("episode");
  if (ep == doc.end() || !ep->is_object())
    return VerifyResult::Failure(scorer,
                                 "sample metadata has no \"episode\" record (multi-turn tasks are "
                                 "scored by their episode in the rollout actor)");
  auto failure = ep->find("failure");
  if (failure != ep->end() && failure->is_string() && !failure->get<std::string>().empty())
    return VerifyResult::Failure(scorer, "episode scoring failed: " + failure->get<std::string>());
  auto score = ep->find("score");
  if (score == ep->end() || !score->is_number())
    return VerifyResult::Failure(scorer, "episode record has no numeric \"score\"");
  double v = score->get<double>();
  if (!std::isfinite(v)) return VerifyResult::Failure(scorer, "episode score is not finite");
  VerifyResult r;
  r.scorer = scorer;
  r.reward = v;
  auto comps = ep->find("components");
  if (comps != ep->end() && comps->is_object()) {
    for (auto it = comps->begin(); it != comps->end(); ++it)
      if (it->is_number() && std::isfinite(it->get<double>()))
        r.components.emplace_back(it.key(), it->get<double>());
  }
  return r;
}

}  // namespace troupe::envs
