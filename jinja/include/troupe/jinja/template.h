// troupe::jinja — the subset of Jinja that Hugging Face chat templates use,
// rendered byte-identically to @huggingface/jinja (the implementation
// transformers.js uses; tests run it under Node as the reference).
//
//   auto tpl = jinja::Template::Parse(config["chat_template"], "Qwen3 chat_template");
//   auto text = tpl->Render({{"messages", messages}, {"add_generation_prompt", true}});
//
// What is supported: text with {%- -%} / {{- -}} / {#- -#} whitespace control
// under HF's settings (trim_blocks and lstrip_blocks on); statements set
// (names, tuples, ns.attr, block set), if/elif/else, for (tuple targets,
// `for x in xs if cond`, else, loop.index/index0/revindex/revindex0/first/
// last/length/previtem/nextitem, break, continue), macro, filter blocks;
// expressions with literals (int, float, string, list, tuple, dict), attribute
// and subscript access, slices, calls, filters, `is` tests, not/and/or, in/not
// in, == != < > <= >=, + - * / // % ** ~, conditional expressions; the
// globals namespace(), range(), raise_exception(), strftime_now(); the
// filters, tests and string/dict methods of the reference (docs/envs.md lists
// them). Values behave as the reference's do (it runs on JavaScript: `length`
// counts UTF-16 units, `strip('x')` ignores its argument, tojson is
// JSON.stringify with Python's separators, ...); docs/envs.md lists where that
// differs from Python's Jinja.
//
// What is refused: anything else (extends/include/import/call/with/raw,
// unknown filters or tests, tests with arguments, argument unpacking) fails at
// Parse or Render with an InvalidArgument that names the template, the line
// and the construct; so do raise_exception() (its message is kept), invalid
// UTF-8 input, renders longer than RenderOptions::max_output_bytes
// (ResourceExhausted) or over the evaluation budget, and recursion deeper than
// 100 macro calls. Nothing crashes or hangs on any input.
//
// Thread safety: a Template is immutable after Parse; Render is const and may
// run concurrently from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"

namespace troupe::jinja {

struct RenderOptions {
  // The time strftime_now() formats, in seconds since the Unix epoch. Unset:
  // the current time (what the reference does). Tests pin it.
  std::optional<int64_t> now_unix_seconds;
  // Format strftime_now() in UTC rather than the local time zone (the
  // reference uses local time). Default false.
  bool utc = false;
  // Longest rendered text accepted, in bytes; longer is ResourceExhausted.
  // Default 16 MiB.
  size_t max_output_bytes = size_t{16} << 20;
  // Evaluation budget (expression and statement evaluations) against runaway
  // loops; over it is ResourceExhausted. Default 20 million (a 1,000-message
  // conversation through a real template takes well under 1 million).
  int64_t max_steps = 20'000'000;
};

namespace internal {
struct Program;
}

class Template {
 public:
  // Parses a template; `name` appears in every error ("template 'NAME' line N: ...").
  // Fails with InvalidArgument on a syntax error or an unsupported construct.
  static Result<Template> Parse(std::string_view source, std::string name = "template");

  // Renders with `context` (a JSON object: its keys are the template's
  // variables; messages, tools, add_generation_prompt, bos_token, ...; null is
  // an empty context). Object
  // key order is kept (tojson prints keys in that order).
  Result<std::string> Render(const nlohmann::ordered_json& context,
                             const RenderOptions& options = {}) const;

  const std::string& name() const;

 private:
  explicit Template(std::shared_ptr<const internal::Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const internal::Program> program_;
};

// What {{ value | tojson }} prints (Python's separators, keys in the given
// order, numbers as the reference prints them): how templates write tool-call
// arguments, for code that must write them the same way. Fails on invalid
// UTF-8 or nesting deeper than 200.
Result<std::string> ToJsonText(const nlohmann::ordered_json& value);

}  // namespace troupe::jinja
