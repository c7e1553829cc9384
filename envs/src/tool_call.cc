#include "troupe/envs/tool_call.h"

#include "troupe/core/text.h"
#include "troupe/jinja/template.h"

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
  return Printable(s, max);
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

static ParsedTurn ParseTroupeCall(std::string_view text) {
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
  turn.begin = open;
  turn.end = i + kToolClose.size();
  return turn;
}

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr size_t kMaxJsonToolNameBytes = 64;

// The JSON object {"name": ..., "arguments"|"parameters": ...} of a Hermes or
// Llama 3 call, starting at text[begin] == '{'. Sets *end past the object.
ParsedTurn ParseJsonCall(std::string_view text, size_t begin, size_t* end) {
  std::string error;
  std::optional<size_t> stop = ScanObject(text, begin, &error);
  if (!stop) return Malformed(error);
  *end = *stop;
  json obj = json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin),
                         text.begin() + static_cast<std::ptrdiff_t>(*stop), nullptr,
                         /*allow_exceptions=*/false);
  if (obj.is_discarded() || !obj.is_object())
    return Malformed("the tool call is not a valid JSON object");
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string())
    return Malformed("the tool call has no \"name\" string");
  const std::string& n = name->get_ref<const std::string&>();
  // Chat templates write the name between quotes as it is, unescaped (so does
  // FormatToolCall): a quote or backslash in it could not be written back.
  bool printable = !n.empty() && n.size() <= kMaxJsonToolNameBytes;
  for (char c : n) printable = printable && c > 0x20 && c < 0x7f && c != '"' && c != '\\';
  if (!printable)
    return Malformed(fmt::format(
        "tool name '{}' must be 1-{} printable ASCII characters, no quote or backslash",
        Excerpt(n), kMaxJsonToolNameBytes));
  json args = json::object();
  int arg_keys = 0;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it.key() == "name") continue;
    if (it.key() != "arguments" && it.key() != "parameters")
      return Malformed(
          fmt::format("unexpected key \"{}\" in the call to '{}' (expected name, "
                      "arguments)",
                      Excerpt(it.key()), Excerpt(n)));
    if (++arg_keys > 1)
      return Malformed(
          fmt::format("the call to '{}' has both arguments and parameters", Excerpt(n)));
    if (it->is_string()) {  // Qwen's template accepts arguments as JSON text
      args = json::parse(it->get_ref<const std::string&>(), nullptr, false);
      if (args.is_discarded() || !args.is_object())
        return Malformed(
            fmt::format("arguments of '{}' are a string that is not a JSON object", Excerpt(n)));
    } else if (it->is_object()) {
      args = *it;
    } else if (!it->is_null()) {
      return Malformed(fmt::format("arguments of '{}' must be a JSON object, got {}", Excerpt(n),
                                   it->type_name()));
    }
  }
  ParsedTurn turn;
  turn.kind = ParsedTurn::Kind::kCall;
  turn.call.name = n;
  turn.call.args = std::move(args);
  turn.call.canonical = turn.call.name + " " + SafeDump(turn.call.args);
  return turn;
}

ParsedTurn ParseHermesCall(std::string_view text) {
  size_t open = text.find(kHermesOpen);
  if (open == std::string_view::npos) {
    if (text.find("<tool_call") != std::string_view::npos ||
        text.find(kHermesClose) != std::string_view::npos)
      return Malformed("found an incomplete tool_call tag; write " +
                       ToolCallSyntax(ToolCallFormat::kHermes));
    return ParsedTurn{};
  }
  size_t i = SkipWs(text, open + kHermesOpen.size());
  if (i >= text.size() || text[i] != '{')
    return Malformed(fmt::format("expected a JSON object after <tool_call>, found '{}'",
                                 Excerpt(text.substr(i))));
  size_t end = 0;
  ParsedTurn turn = ParseJsonCall(text, i, &end);
  if (turn.kind != ParsedTurn::Kind::kCall) return turn;
  i = SkipWs(text, end);
  if (text.substr(i, kHermesClose.size()) != kHermesClose)
    return Malformed(
        fmt::format("the call to '{}' is missing </tool_call>", Excerpt(turn.call.name)));
  turn.begin = open;
  turn.end = i + kHermesClose.size();
  return turn;
}

ParsedTurn ParseLlama3Call(std::string_view text) {
  size_t i = SkipWs(text, 0);
  size_t begin = i;
  if (text.substr(i, kPythonTag.size()) == kPythonTag) i = SkipWs(text, i + kPythonTag.size());
  if (i >= text.size() || text[i] != '{') {
    if (text.find("{\"name\"") != std::string_view::npos)
      return Malformed("a tool call must be the whole reply: " +
                       ToolCallSyntax(ToolCallFormat::kLlama3Json));
    return ParsedTurn{};
  }
  size_t end = 0;
  ParsedTurn turn = ParseJsonCall(text, i, &end);
  if (turn.kind != ParsedTurn::Kind::kCall) return turn;
  size_t rest = SkipWs(text, end);
  if (rest < text.size())
    return Malformed(fmt::format("text after the call to '{}': '{}' (a call is the whole reply)",
                                 Excerpt(turn.call.name), Excerpt(text.substr(rest))));
  turn.begin = begin;
  turn.end = end;
  return turn;
}

// Arguments as a chat template's tojson writes them.
std::string TemplateJson(const json& args) {
  Result<std::string> text = jinja::ToJsonText(nlohmann::ordered_json(args));
  return text.ok() ? *text : SafeDump(args);
}

}  // namespace

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kTroupe:
      return "troupe";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
  }
  return "troupe";
}

Result<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  for (ToolCallFormat f :
       {ToolCallFormat::kTroupe, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json})
    if (name == ToolCallFormatName(f)) return f;
  return InvalidArgument("tool-call format '{}' is not one of troupe, hermes, llama3_json",
                         Excerpt(name, 40));
}

std::string ToolCallSyntax(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kTroupe:
      return "<tool>name {json arguments}</tool>";
    case ToolCallFormat::kHermes:
      return "<tool_call>{\"name\": name, \"arguments\": {json arguments}}</tool_call>";
    case ToolCallFormat::kLlama3Json:
      return "{\"name\": name, \"parameters\": {json arguments}} as the whole reply";
  }
  return "";
}

ParsedTurn ParseToolCall(std::string_view text, ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermesCall(text);
    case ToolCallFormat::kLlama3Json:
      return ParseLlama3Call(text);
    case ToolCallFormat::kTroupe:
      break;
  }
  return ParseTroupeCall(text);
}

std::string FormatToolCall(std::string_view name, const json& args, ToolCallFormat format) {
  json a = args.is_object() ? args : json::object();
  switch (format) {
    case ToolCallFormat::kHermes:
      return fmt::format("<tool_call>\n{{\"name\": \"{}\", \"arguments\": {}}}\n</tool_call>", name,
                         TemplateJson(a));
    case ToolCallFormat::kLlama3Json:
      return fmt::format("{{\"name\": \"{}\", \"parameters\": {}}}", name, TemplateJson(a));
    case ToolCallFormat::kTroupe:
      break;
  }
  std::string out(kToolOpen);
  out += name;
  if (!a.empty()) out += " " + SafeDump(a);
  out += kToolClose;
  return out;
}

Result<std::vector<ToolCall>> ReadToolCalls(const json& tool_calls) {
  if (!tool_calls.is_array()) return InvalidArgument("tool_calls must be a list");
  std::vector<ToolCall> out;
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const json& c = tool_calls[i];
    if (!c.is_object()) return InvalidArgument("tool_calls[{}] must be an object", i);
    auto fn_it = c.find("function");
    const bool nested = fn_it != c.end();
    const json& fn = nested ? *fn_it : c;
    const std::string where = fmt::format("tool_calls[{}]{}", i, nested ? ".function" : "");
    if (!fn.is_object()) return InvalidArgument("{} must be an object", where);
    auto name = fn.find("name");
    if (name == fn.end() || !name->is_string() || name->get<std::string>().empty())
      return InvalidArgument("{}.name (a non-empty string) is required", where);
    ToolCall call;
    call.name = name->get<std::string>();
    auto args = fn.find("arguments");
    if (args != fn.end() && !args->is_null()) {
      if (args->is_string()) {
        const std::string& text = args->get_ref<const std::string&>();
        call.args =
            text.empty() ? json::object() : json::parse(text, nullptr, /*allow_exceptions=*/false);
      } else {
        call.args = *args;
      }
      if (!call.args.is_object())
        return InvalidArgument("{}.arguments is not a JSON object (nor a string holding one)",
                               where);
    }
    call.canonical = call.name + " " + SafeDump(call.args);
    out.push_back(std::move(call));
  }
  return out;
}

Status CheckToolName(std::string_view name, ToolCallFormat format) {
  ParsedTurn back = ParseToolCall(FormatToolCall(name, json::object(), format), format);
  if (back.kind == ParsedTurn::Kind::kCall && back.call.name == name) return Status::Ok();
  return InvalidArgument("tool name '{}' cannot be written in the {} tool-call syntax ({}){}",
                         Printable(name, 64), ToolCallFormatName(format), ToolCallSyntax(format),
                         back.error.empty() ? "" : ": " + back.error);
}

Result<std::string> AppendToolCalls(std::string content, const std::vector<ToolCall>& calls,
                                    ToolCallFormat format) {
  for (size_t i = 0; i < calls.size(); ++i) {
    Status named = CheckToolName(calls[i].name, format);
    if (!named.ok()) return named.WithContext(fmt::format("tool_calls[{}]", i));
    if (!content.empty() && format != ToolCallFormat::kLlama3Json) content += "\n";
    content += FormatToolCall(calls[i].name, calls[i].args, format);
  }
  return content;
}

std::string RewriteToolCalls(std::string_view text, ToolCallFormat format) {
  if (format == ToolCallFormat::kTroupe) return std::string(text);
  const std::string generic = ToolCallSyntax(ToolCallFormat::kTroupe);
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t open = text.find(kToolOpen, pos);
    size_t syntax = text.find(generic, pos);
    if (syntax != std::string_view::npos && syntax <= open) {
      out.append(text.substr(pos, syntax - pos));
      out += ToolCallSyntax(format);
      pos = syntax + generic.size();
      continue;
    }
    if (open == std::string_view::npos) break;
    ParsedTurn t = ParseTroupeCall(text.substr(open));
    out.append(text.substr(pos, open - pos));
    if (t.kind == ParsedTurn::Kind::kCall) {
      out += FormatToolCall(t.call.name, t.call.args, format);
      pos = open + t.end;
    } else {
      out.append(kToolOpen);
      pos = open + kToolOpen.size();
    }
  }
  out.append(text.substr(pos));
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
