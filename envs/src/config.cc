#include "troupe/envs/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "troupe/core/config_binder.h"
#include "troupe/envs/wordle.h"

namespace troupe::envs {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

Status CheckName(const char* what, const std::string& name) {
  if (name.empty()) return InvalidArgument("{} is empty", what);
  if (name.size() > 64) return InvalidArgument("{} '{}' is longer than 64 characters", what, name);
  for (char c : name) {
    if (!IsNameChar(c))
      return InvalidArgument("{} '{}' has character '{}'; use letters, digits, '_', '-', '.'", what,
                             name, c);
  }
  return Status::Ok();
}

Status CheckRange(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    return InvalidArgument("{} = {} is outside [{}, {}]", field, value, lo, hi);
  return Status::Ok();
}

std::string JoinKinds(const char* separator = ", ") {
  std::string out;
  for (const auto& k : BuiltinTaskKinds()) out += (out.empty() ? "" : separator) + k;
  return out;
}

}  // namespace

Status WorkspaceConfig::Validate() const {
  if (root.empty() || root[0] != '/')
    return InvalidArgument("workspace.root '{}' must be an absolute directory path", root);
  TROUPE_RETURN_IF_ERROR(
      CheckRange("workspace.max_file_bytes", max_file_bytes, 1, int64_t{1} << 30));
  TROUPE_RETURN_IF_ERROR(
      CheckRange("workspace.max_total_bytes", max_total_bytes, max_file_bytes, int64_t{1} << 34));
  TROUPE_RETURN_IF_ERROR(CheckRange("workspace.max_files", max_files, 1, 100000));
  TROUPE_RETURN_IF_ERROR(CheckRange("workspace.max_path_chars", max_path_chars, 1, 4096));
  TROUPE_RETURN_IF_ERROR(CheckRange("workspace.max_depth", max_depth, 1, 64));
  TROUPE_RETURN_IF_ERROR(CheckRange("workspace.max_list_entries", max_list_entries, 1, 100000));
  return Status::Ok();
}

Status TaskConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(CheckName("task name", name));
  const std::string& k = effective_kind();
  const auto& kinds = BuiltinTaskKinds();
  if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) {
    return InvalidArgument("task '{}': kind '{}' is not a built-in kind ({}){}", name, k,
                           JoinKinds(), kind.empty() ? "; set `kind` when the name differs" : "");
  }
  auto ctx = [this](Status s) { return s.WithContext(fmt::format("task '{}'", name)); };
  Status s = CheckRange("eval_size", eval_size, 0, 1000000);
  if (!s.ok()) return ctx(s);
  if (scoring != "exact" && scoring != "partial" && scoring != "numeric" && scoring != "external")
    return InvalidArgument(
        "task '{}': scoring '{}' is not one of exact, partial, numeric, external", name, scoring);
  if (k == "gsm8k" && scoring != "numeric" && scoring != "external")
    return InvalidArgument(
        "task '{}': kind gsm8k is scored by the final number of the answer: set scoring: numeric "
        "(or external)",
        name);
  if (scoring == "numeric" && IsMultiTurnKind(k))
    return InvalidArgument("task '{}': scoring 'numeric' is for single-turn tasks", name);
  if (scoring == "external" && IsMultiTurnKind(k))
    return InvalidArgument(
        "task '{}': scoring 'external' is not supported for the multi-turn kind '{}' (its "
        "environment scores the episode in the rollout actor)",
        name, k);
  if (!service.empty() && scoring != "external")
    return InvalidArgument(
        "task '{}': service '{}' is set but scoring is '{}'; services are used "
        "only with scoring: external",
        name, service, scoring);
  if (!service.empty()) TROUPE_RETURN_IF_ERROR(ctx(CheckName("service", service)));
  if (prompt_style != "compact" && prompt_style != "verbose")
    return InvalidArgument("task '{}': prompt_style '{}' is not one of compact, verbose", name,
                           prompt_style);
  if (min_len < 1 || max_len < min_len || max_len > 128)
    return InvalidArgument(
        "task '{}': min_len = {}, max_len = {} must satisfy 1 <= min_len <= "
        "max_len <= 128",
        name, min_len, max_len);
  if (!(length_power >= 0 && length_power <= 8))
    return InvalidArgument("task '{}': length_power = {} must be in [0, 8]", name, length_power);
  if (min_digits < 1 || max_digits < min_digits || max_digits > 18)
    return InvalidArgument(
        "task '{}': min_digits = {}, max_digits = {} must satisfy 1 <= "
        "min_digits <= max_digits <= 18",
        name, min_digits, max_digits);
  s = CheckRange("max_number", max_number, 2, 1000);
  if (!s.ok()) return ctx(s);
  if (word_length != 4 && word_length != 5)
    return InvalidArgument("task '{}': word_length = {} must be 4 or 5", name, word_length);
  if (k == "wordle") {
    auto words = static_cast<int64_t>(WordleWords(static_cast<int>(word_length)).size());
    if (eval_size > words / 2)
      return InvalidArgument(
          "task '{}': eval_size = {} is more than half of the {} {}-letter wordle "
          "words; use eval_size <= {}",
          name, eval_size, words, word_length, words / 2);
  }
  if (k == "jsonl" && path.empty())
    return InvalidArgument("task '{}': kind jsonl needs `path` (a JSONL file)", name);
  if (k != "jsonl" && !path.empty())
    return InvalidArgument("task '{}': `path` is only used by kind jsonl (kind is '{}')", name, k);
  if (k == "file_reverse" || k == "file_sort") TROUPE_RETURN_IF_ERROR(ctx(workspace.Validate()));
  if (!(weight >= 0.0 && weight <= 1e6))
    return InvalidArgument("task '{}': weight = {} must be in [0, 1e6]", name, weight);
  return Status::Ok();
}

Status ChatConfig::Validate() const {
  if (format != "auto" && format != "template" && format != "compact" && format != "tagged")
    return InvalidArgument("chat.format '{}' is not one of auto, template, compact, tagged",
                           format.substr(0, 40));
  for (const auto& [name, value] : variables) {
    if (name.empty() || name.size() > 64)
      return InvalidArgument("chat.variables: a name must be 1-64 characters");
    if (!nlohmann::json::accept(value))
      return InvalidArgument("chat.variables.{}: '{}' is not JSON (strings need quotes)", name,
                             value.substr(0, 40));
  }
  return Status::Ok();
}

Status EpisodeConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(CheckRange("episode.max_turns", max_turns, 1, 1000));
  TROUPE_RETURN_IF_ERROR(
      CheckRange("episode.max_response_tokens", max_response_tokens, 2, int64_t{1} << 20));
  TROUPE_RETURN_IF_ERROR(
      CheckRange("episode.max_turn_tokens", max_turn_tokens, 1, max_response_tokens));
  TROUPE_RETURN_IF_ERROR(
      CheckRange("episode.max_tool_output_chars", max_tool_output_chars, 16, int64_t{1} << 20));
  return Status::Ok();
}

Status RewardServiceConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(CheckName("reward service name", name));
  auto ctx = [this](Status s) { return s.WithContext(fmt::format("reward service '{}'", name)); };
  std::string_view u = url;
  size_t scheme = u.rfind("http://", 0) == 0 ? 7 : (u.rfind("https://", 0) == 0 ? 8 : 0);
  if (scheme == 0 || u.size() <= scheme || u[scheme] == '/')
    return InvalidArgument("reward service '{}': url '{}' must look like http://host:port/verify",
                           name, url);
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return InvalidArgument("reward service '{}': url '{}' contains a space or control character",
                             name, url);
  }
  Status s = CheckRange("timeout_ms", timeout_ms, 1, 600000);
  if (s.ok()) s = CheckRange("max_attempts", max_attempts, 1, 20);
  if (s.ok()) s = CheckRange("backoff_ms", backoff_ms, 0, 60000);
  if (s.ok()) s = CheckRange("max_backoff_ms", max_backoff_ms, backoff_ms, 600000);
  if (s.ok()) s = CheckRange("breaker_failures", breaker_failures, 0, 1000000);
  if (s.ok()) s = CheckRange("breaker_cooldown_ms", breaker_cooldown_ms, 1, 3600000);
  if (s.ok() && on_failure != "zero" && on_failure != "drop")
    s = InvalidArgument("on_failure must be zero or drop, got '{}'", on_failure);
  return s.ok() ? s : ctx(s);
}

Status RewardClientConfig::Validate() const {
  std::set<std::string> names;
  for (const auto& svc : services) {
    TROUPE_RETURN_IF_ERROR(svc.Validate());
    if (!names.insert(svc.name).second)
      return InvalidArgument("reward service '{}' is defined twice", svc.name);
  }
  if (!default_service.empty() && !names.count(default_service))
    return InvalidArgument("default_service '{}' is not one of the configured services",
                           default_service);
  TROUPE_RETURN_IF_ERROR(CheckRange("reward.call_timeout_ms", call_timeout_ms, 1, 3600000));
  TROUPE_RETURN_IF_ERROR(CheckRange("reward.connect_timeout_ms", connect_timeout_ms, 1, 600000));
  TROUPE_RETURN_IF_ERROR(CheckRange("reward.max_concurrency", max_concurrency, 1, 1024));
  TROUPE_RETURN_IF_ERROR(
      CheckRange("reward.max_response_bytes", max_response_bytes, 16, int64_t{64} << 20));
  return Status::Ok();
}

Status ValidateTasks(const std::vector<TaskConfig>& tasks) {
  std::set<std::string> names;
  for (const auto& t : tasks) {
    TROUPE_RETURN_IF_ERROR(t.Validate());
    if (!names.insert(t.name).second) return InvalidArgument("task '{}' is defined twice", t.name);
  }
  bool any_weight = false;
  for (const auto& t : tasks) any_weight = any_weight || t.weight > 0;
  if (!tasks.empty() && !any_weight)
    return InvalidArgument("every task has weight 0; at least one task must be trained on");
  return Status::Ok();
}

Status ValidateRewardRouting(const std::vector<TaskConfig>& tasks,
                             const RewardClientConfig& client) {
  TROUPE_RETURN_IF_ERROR(ValidateTasks(tasks));
  TROUPE_RETURN_IF_ERROR(client.Validate());
  for (const auto& t : tasks) {
    if (t.scoring != "external") continue;
    if (client.services.empty())
      return InvalidArgument(
          "task '{}' uses scoring: external but no reward services are configured", t.name);
    if (t.service.empty()) {
      if (client.default_service.empty())
        return InvalidArgument(
            "task '{}' uses scoring: external without a service, and there is no "
            "default_service",
            t.name);
      continue;
    }
    bool found = false;
    for (const auto& s : client.services) found = found || s.name == t.service;
    if (!found)
      return InvalidArgument("task '{}': service '{}' is not one of the configured reward services",
                             t.name, t.service);
  }
  return Status::Ok();
}

// Describe(): the YAML keys of the config structs, one documented line each
// (troupe/core/config_binder.h).
using config::Binder;
using config::EnumField;

void Describe(Binder& b, WorkspaceConfig& c) {
  b.Field("root", &c.root, "directory under which each episode gets its own scratch dir");
  b.Field("max_file_bytes", &c.max_file_bytes, "largest file the tools read or write whole");
  b.Field("max_total_bytes", &c.max_total_bytes, "bytes all files of one workspace may hold");
  b.Field("max_files", &c.max_files, "files and directories one workspace may hold");
  b.Field("max_path_chars", &c.max_path_chars, "longest relative path a tool accepts");
  b.Field("max_depth", &c.max_depth, "deepest directory nesting a path may have");
  b.Field("max_list_entries", &c.max_list_entries, "entries `list` shows before cutting");
}
void Describe(Binder& b, TaskConfig& c) {
  b.Field("name", &c.name, "task name samples carry and verifiers are looked up by");
  static const std::string kind_doc = JoinKinds(" | ") + " (empty: name)";
  b.Field("kind", &c.kind, kind_doc.c_str());
  b.Field("seed", &c.seed, "seed of prompt generation and of the held-out split");
  b.Field("eval_size", &c.eval_size, "held-out prompts");
  b.Field("scoring", &c.scoring,
          "exact | partial | numeric (final number, from \\boxed{} or ####) | external (reward "
          "service)");
  b.Field("prompt_style", &c.prompt_style,
          "compact (short, for char models) | verbose (English instruction)");
  b.Field("min_len", &c.min_len, "letters per word, at least (reverse, sort, file tasks)");
  b.Field("max_len", &c.max_len, "letters per word, at most");
  b.Field("length_power", &c.length_power,
          "word lengths: 0 = uniform, p > 0 = P(len) ~ len^-p (long-tailed)");
  b.Field("min_digits", &c.min_digits, "digits per operand, at least (add)");
  b.Field("max_digits", &c.max_digits, "digits per operand, at most (add)");
  b.Field("max_number", &c.max_number, "largest number in word problems");
  b.Field("word_length", &c.word_length, "secret word length for wordle (4 or 5)");
  b.Field("path", &c.path, "JSONL file for kind jsonl");
  b.Field("service", &c.service,
          "reward service for this task's samples (empty: the default service)");
  b.Field("tool_instructions", &c.tool_instructions,
          "multi-turn: open with a system message listing the tools");
  b.Section("workspace", &c.workspace, "scratch directory limits (file tasks)");
}
void Describe(Binder& b, EpisodeConfig& c) {
  b.Field("max_turns", &c.max_turns, "assistant turns before the episode ends");
  b.Field("max_response_tokens", &c.max_response_tokens,
          "response tokens (model + environment) per episode");
  b.Field("max_turn_tokens", &c.max_turn_tokens, "new tokens per assistant turn");
  b.Field("max_tool_output_chars", &c.max_tool_output_chars,
          "tool output shown to the model, at most");
  b.Field("ascii_tool_output", &c.ascii_tool_output,
          "replace non-printable bytes in tool output with '?'");
}
void Describe(Binder& b, RewardServiceConfig& c) {
  b.Field("name", &c.name, "name samples route by");
  b.Field("url", &c.url, "endpoint URL (POST JSON, answer {\"reward\": x})");
  b.Field("timeout_ms", &c.timeout_ms, "limit of one HTTP attempt");
  b.Field("max_attempts", &c.max_attempts, "attempts per sample");
  b.Field("backoff_ms", &c.backoff_ms, "backoff before the 2nd attempt (doubles, jittered)");
  b.Field("max_backoff_ms", &c.max_backoff_ms, "largest backoff");
  b.Field("breaker_failures", &c.breaker_failures,
          "circuit breaker: fail samples fast after this many in a row failed for the service's "
          "own reasons (0: off)");
  b.Field("breaker_cooldown_ms", &c.breaker_cooldown_ms,
          "circuit breaker: fail fast this long, then probe with one request");
  b.Field("on_failure", &c.on_failure,
          "a sample the service could not score: zero (reward 0, trained) | drop (left out of "
          "training, counted as dropped_unscored)");
}
void Describe(Binder& b, ChatConfig& c) {
  b.Field("format", &c.format,
          "auto (the model folder's chat template if it has one, else compact) | template | "
          "compact | tagged");
  std::map<std::string, std::string> vars(c.variables.begin(), c.variables.end());
  b.Field("variables", &vars,
          "chat template variables as JSON values, e.g. {enable_thinking: 'false'} "
          "(Hugging Face's chat_template_kwargs)");
  if (b.mode() == Binder::Mode::kRead) c.variables.assign(vars.begin(), vars.end());
}
void Describe(Binder& b, RewardClientConfig& c) {
  b.List("services", &c.services, "external reward services");
  b.Field("default_service", &c.default_service, "service for samples that name none");
  b.Field("call_timeout_ms", &c.call_timeout_ms, "limit per sample, retries included");
  b.Field("connect_timeout_ms", &c.connect_timeout_ms, "TCP connect limit");
  b.Field("max_concurrency", &c.max_concurrency, "requests in parallel per batch");
  b.Field("max_response_bytes", &c.max_response_bytes, "largest response body accepted");
}

}  // namespace troupe::envs
