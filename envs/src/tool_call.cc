#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool IsNameStart(char c) {
  return c >= 'a' && c <= 'z';
}
bool IsNameChar(char c) {
  return IsNameStart(c) || (c >= '0' && c <= '9') || c == '_';
}

size_t SkipWs(std::string_view s, size_t i) {
  while (i < s.size() && IsWs(s[i])) ++i;
  return i;
}

// Printable excerpt of model text for error messages.
std::string Excerpt(std::string_view s, size_t max = 24) {
  std::string out;
  for (char c : s.substr(0, max)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

// Finds the end (one past the closing brace) of the JSON object starting at
// s[begin] == '{', honouring strings and escapes. Returns an error message on
// failure.
std::optional<size_t> ScanObject(std::string_view s, size_t begin, std::string* error) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < s.size(); ++i) {
    if (i - begin >= kMaxToolArgsBytes) {
      *error = fmt::format("arguments are longer than {} bytes", kMaxToolArgsBytes);
      return std::nullopt;
    }
    char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // skip the escaped character
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxToolArgsDepth) {
        *error = fmt::format("arguments nest deeper than {} levels", kMaxToolArgsDepth);
        return std::nullopt;
      }
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
      if (depth < 0) break;
    }
  }
  *error = in_string ? "arguments end inside a string (missing closing quote)"
                     : "arguments are not a complete JSON object (missing '}')";
  return std::nullopt;
}

ParsedTurn Malformed(std::string error) {
  ParsedTurn t;
  t.kind = ParsedTurn::Kind::kMalformed;
  t.error = std::move(error);
  return t;
}

}  // namespace

std::string SafeDump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

ParsedTurn ParseToolCall(std::string_view text) {
  size_t open = text.find(kToolOpen);
  if (open == std::string_view::npos) {
    if (text.find("<tool") != std::string_view::npos ||
        text.find(kToolClose) != std::string_view::npos)
      return Malformed("found an incomplete tool tag; write <tool>name {json}</tool>");
    return ParsedTurn{};
  }
  size_t i = SkipWs(text, open + kToolOpen.size());
  size_t name_begin = i;
  while (i < text.size() && IsNameChar(text[i])) ++i;
  std::string_view name = text.substr(name_begin, i - name_begin);
  if (name.empty()) {
    if (text.substr(i, kToolClose.size()) == kToolClose)
      return Malformed("missing tool name after <tool>");
    return Malformed(
        fmt::format("bad tool name starting '{}'; names are lowercase letters, digits, _",
                    Excerpt(text.substr(i))));
  }
  if (!IsNameStart(name[0]))
    return Malformed(fmt::format("tool name '{}' must start with a letter", Excerpt(name)));
  if (name.size() > kMaxToolNameChars)
    return Malformed(fmt::format("tool name '{}' is longer than {} characters", Excerpt(name),
                                 kMaxToolNameChars));
  if (i < text.size() && !IsWs(text[i]) && text[i] != '{' && text[i] != '<')
    return Malformed(fmt::format("bad character '{}' in tool name '{}'", Excerpt(text.substr(i, 1)),
                                 Excerpt(name)));

  ParsedTurn turn;
  turn.kind = ParsedTurn::Kind::kCall;
  turn.call.name = std::string(name);
  i = SkipWs(text, i);
  if (i < text.size() && text[i] == '{') {
    std::string error;
    std::optional<size_t> end = ScanObject(text, i, &error);
    if (!end) return Malformed(error);
    json args = json::parse(text.begin() + static_cast<std::ptrdiff_t>(i),
                            text.begin() + static_cast<std::ptrdiff_t>(*end), nullptr,
                            /*allow_exceptions=*/false);
    if (args.is_discarded() || !args.is_object())
      return Malformed(
          fmt::format("arguments of '{}' are not a valid JSON object", turn.call.name));
    turn.call.args = std::move(args);
    i = SkipWs(text, *end);
  }
  if (text.substr(i, kToolClose.size()) != kToolClose) {
    if (i >= text.size())
      return Malformed(fmt::format("call to '{}' is missing </tool>", turn.call.name));
    return Malformed(fmt::format("expected {{json arguments}} or </tool> after '{}', found '{}'",
                                 turn.call.name, Excerpt(text.substr(i))));
  }
  turn.call.canonical = turn.call.name + " " + SafeDump(turn.call.args);
  return turn;
}

std::string FormatToolCall(std::string_view name, const json& args) {
  std::string out(kToolOpen);
  out += name;
  if (args.is_object() && !args.empty()) out += " " + SafeDump(args);
  out += kToolClose;
  return out;
}

Status CheckArgKeys(const json& args, std::initializer_list<std::string_view> allowed) {
  if (!args.is_object()) return InvalidArgument("arguments must be a JSON object");
  for (auto it = args.begin(); it != args.end(); ++it) {
    bool ok = false;
    for (auto a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      std::string names;
      for (auto a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
      return InvalidArgument("unexpected argument \"{}\" (accepted: {})", Excerpt(it.key(), 32),
                             names.empty() ? "none" : names);
    }
  }
  return Status::Ok();
}

Result<std::optional<std::string>> OptStringArg(const json& args, std::string_view key,
                                                size_t max_bytes) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string())
    return InvalidArgument("argument \"{}\" must be a string, got {}", key, it->type_name());
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > max_bytes)
    return InvalidArgument("argument \"{}\" is {} bytes, over the limit of {}", key, s.size(),
                           max_bytes);
  return std::optional<std::string>(s);
}

Result<std::string> StringArg(const json& args, std::string_view key, size_t max_bytes) {
  TROUPE_ASSIGN_OR_RETURN(std::optional<std::string> v, OptStringArg(args, key, max_bytes));
  if (!v) return InvalidArgument("missing argument \"{}\" (a string)", key);
  return std::move(*v);
}

Result<std::optional<int64_t>> OptIntArg(const json& args, std::string_view key, int64_t lo,
                                         int64_t hi) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi))
      return InvalidArgument("argument \"{}\" = {} is outside [{}, {}]", key, u, lo, hi);
    return std::optional<int64_t>(static_cast<int64_t>(u));
  }
  if (it->is_number_integer()) {
    int64_t v = it->get<int64_t>();
    if (v < lo || v > hi)
      return InvalidArgument("argument \"{}\" = {} is outside [{}, {}]", key, v, lo, hi);
    return std::optional<int64_t>(v);
  }
  if (it->is_number_float())
    return InvalidArgument(
        "argument \"{}\" must be an integer in [{}, {}], got a fractional or huge "
        "number",
        key, lo, hi);
  return InvalidArgument("argument \"{}\" must be an integer, got {}", key, it->type_name());
}

}  // namespace troupe::envs
