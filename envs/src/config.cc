#include "troupe/envs/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

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

std::string JoinKinds() {
  std::string out;
  for (const auto& k : BuiltinTaskKinds()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

const std::vector<std::string>& BuiltinTaskKinds() {
  static const std::vector<std::string> kinds = {
      "reverse", "sort",      "add",      "word_problem", "gsm8k",
      "jsonl",   "file_reverse", "file_sort", "wordle"};
  return kinds;
}

bool IsMultiTurnKind(const std::string& kind) {
  return kind == "file_reverse" || kind == "file_sort" || kind == "wordle";
}

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
  if (min_len < 1 || max_len < min_len || max_len > 32)
    return InvalidArgument(
        "task '{}': min_len = {}, max_len = {} must satisfy 1 <= min_len <= "
        "max_len <= 32",
        name, min_len, max_len);
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

}  // namespace troupe::envs
