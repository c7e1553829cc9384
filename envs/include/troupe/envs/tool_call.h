// The tool-call formats the policy writes, their parsers, and typed argument
// readers for tool implementations.
//
// Three formats (one call per assistant turn); a model's chat template picks
// one (ChatTemplate::tool_call_format), character-level models use Troupe's:
//
//   troupe       <tool>NAME {"key": value, ...}</tool>   (or <tool>NAME</tool>)
//   hermes       <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
//                (Qwen2.5/Qwen3, Hermes; "arguments" may also be a JSON string)
//   llama3_json  {"name": NAME, "parameters": {...}}  as the whole turn,
//                optionally after <|python_tag|> (Llama 3.1/3.2)
//
// Troupe's format in detail:
// NAME is 1-32 characters of [a-z0-9_] starting with a letter. Whitespace is
// allowed around NAME and the arguments. Text before the first "<tool>" is
// ignored (room for reasoning); so is text after the call's "</tool>". The
// closing tag is found after the JSON object, so argument strings may contain
// "</tool>". Arguments are limited to kMaxToolArgsBytes bytes and
// kMaxToolArgsDepth levels of nesting.
//
// Hermes and Llama 3 calls take "arguments" or "parameters" (an object; null
// or absent is {}), a name of 1-64 printable ASCII characters (no quote or
// backslash: templates write names unescaped), no other keys, and the same size
// and depth limits.
//
// The parsers never throw: a turn yields no call, a malformed call (with a
// message the model is shown), or a call. The argument readers check types and
// ranges and return errors that name the argument. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"

namespace troupe::envs {

inline constexpr std::string_view kToolOpen = "<tool>";
inline constexpr std::string_view kToolClose = "</tool>";
inline constexpr size_t kMaxToolNameChars = 32;
inline constexpr size_t kMaxToolArgsBytes = 64 * 1024;
inline constexpr int kMaxToolArgsDepth = 32;

enum class ToolCallFormat {
  kTroupe,      // <tool>NAME {json}</tool>
  kHermes,      // <tool_call>{"name": ..., "arguments": ...}</tool_call>
  kLlama3Json,  // {"name": ..., "parameters": ...}
};
// "troupe", "hermes", "llama3_json".
const char* ToolCallFormatName(ToolCallFormat format);
// The names above; InvalidArgument otherwise.
Result<ToolCallFormat> ParseToolCallFormat(std::string_view name);
// How to write a call, for messages to the model ("<tool>name {json arguments}</tool>").
std::string ToolCallSyntax(ToolCallFormat format);

struct ToolCall {
  std::string name;
  nlohmann::json args = nlohmann::json::object();  // always an object
  // name + " " + compact args with sorted keys: equal for identical calls.
  std::string canonical;
};

struct ParsedTurn {
  enum class Kind {
    kNoCall,     // the turn has no "<tool>" (and nothing that looks like one)
    kMalformed,  // a call was attempted but cannot be parsed; see `error`
    kCall,       // `call` is valid
  };
  Kind kind = Kind::kNoCall;
  ToolCall call;
  std::string error;  // for kMalformed: what is wrong, shown to the model
  size_t begin = 0, end = 0;  // for kCall: the call's bytes in the turn text
};

// Parses the first tool call of an assistant turn.
ParsedTurn ParseToolCall(std::string_view turn_text,
                         ToolCallFormat format = ToolCallFormat::kTroupe);

// Writes a call (for demonstrations and tests); in the Hermes and Llama 3
// formats arguments are written as the templates' tojson writes them
// (JavaScript number printing: integers past 2^53 round, as in Hugging
// Face's renderer).
std::string FormatToolCall(std::string_view name,
                           const nlohmann::json& args = nlohmann::json::object(),
                           ToolCallFormat format = ToolCallFormat::kTroupe);

// OpenAI-shaped tool calls ([{"id", "type": "function", "function": {"name", "arguments"}}],
// "function" optional, "arguments" a JSON object or a string holding one, absent = {}) as
// calls. InvalidArgument naming the entry ("tool_calls[1].function.name ...") otherwise.
Result<std::vector<ToolCall>> ReadToolCalls(const nlohmann::json& tool_calls);

// A reply's text with its tool calls written after it in `format`, as Troupe renders
// structured calls (`troupe chat-template --ids`, the generation endpoint): each call on its
// own line after any text (llama3_json: no separator). InvalidArgument naming the call when
// a name cannot be written in `format` (CheckToolName).
Result<std::string> AppendToolCalls(std::string content, const std::vector<ToolCall>& calls,
                                    ToolCallFormat format);

// Ok when `name` written in `format` parses back as a call to the same name; otherwise
// InvalidArgument naming it, the syntax and the parser's reason (a Troupe name must be
// lowercase letters, digits and _; a Hermes/Llama 3 name has no quote or backslash).
Status CheckToolName(std::string_view name, ToolCallFormat format);

// Rewrites text written for Troupe's format (task instructions, examples,
// demonstrations) into `format`: every well-formed <tool>...</tool> call, and
// the syntax line ToolInstructions() starts with. Identity for kTroupe.
std::string RewriteToolCalls(std::string_view text, ToolCallFormat format);

// Compact JSON that never throws on invalid UTF-8 (bad bytes become U+FFFD).
std::string SafeDump(const nlohmann::json& value);

// ---- argument readers for tool implementations (messages name the argument)

// InvalidArgument when `args` has a key outside `allowed`.
Status CheckArgKeys(const nlohmann::json& args, std::initializer_list<std::string_view> allowed);
// A required string argument of at most `max_bytes` bytes.
Result<std::string> StringArg(const nlohmann::json& args, std::string_view key, size_t max_bytes);
// An optional string argument (absent or null: nullopt).
Result<std::optional<std::string>> OptStringArg(const nlohmann::json& args, std::string_view key,
                                                size_t max_bytes);
// An optional integer argument in [lo, hi]; floats, huge values, strings are errors.
Result<std::optional<int64_t>> OptIntArg(const nlohmann::json& args, std::string_view key,
                                         int64_t lo, int64_t hi);

}  // namespace troupe::envs
