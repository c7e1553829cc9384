// A model's chat template: tokenizer_config.json's "chat_template" (Jinja),
// rendered with troupe::jinja byte-identically to Hugging Face's JavaScript
// implementation, with the variables Hugging Face passes (the special-token
// strings: bos_token, eos_token, ...), the caller's template variables
// (enable_thinking, date_string, ...) and the tool-call format the template
// teaches its model.
//
//   auto tpl = ChatTemplate::Load("models/qwen3");            // reads tokenizer_config.json
//   tpl->SetVariable("enable_thinking", false);
//   auto text = tpl->Render(messages_json, /*add_generation_prompt=*/true);
//
// Refused at Load with a message naming the file: no chat_template, a template
// outside the supported Jinja subset (jinja/template.h). Refused at Render: what
// the template itself refuses (raise_exception), naming its message.
//
// Immutable after construction except SetVariable/set_now (call those before
// sharing); Render is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"
#include "troupe/envs/tool_call.h"

namespace troupe::jinja {
class Template;
}

namespace troupe::envs {

class ChatTemplate {
 public:
  // From tokenizer_config.json's content; `origin` names the file in errors.
  // chat_template may be a string or Hugging Face's list of named templates
  // ("default", and "tool_use" which is used when tools are given).
  static Result<ChatTemplate> FromTokenizerConfig(const nlohmann::json& config,
                                                  const std::string& origin);
  // Reads DIR/tokenizer_config.json (DIR may also be that file).
  static Result<ChatTemplate> Load(const std::string& path);
  // Whether DIR/tokenizer_config.json exists and has a chat_template.
  static bool Available(const std::string& path);

  // Renders Hugging Face-shaped messages ([{"role": ..., "content": ...}, ...]).
  // `tools` (a list of function schemas) is passed when not null.
  Result<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr) const;

  // A template variable every render gets (Hugging Face's chat_template_kwargs).
  void SetVariable(const std::string& name, nlohmann::ordered_json value);
  // Pins the clock strftime_now() reads (unix seconds, UTC); unset: the current local time.
  void set_now(std::optional<int64_t> unix_seconds) { now_ = unix_seconds; }

  // The format the template writes tool calls in: hermes when it has
  // <tool_call> tags (Qwen2.5/3), llama3_json when it writes
  // {"name": ..., "parameters": ...} (Llama 3.1/3.2), troupe otherwise.
  ToolCallFormat tool_call_format() const { return format_; }
  // tokenizer_config.json's eos_token ("" when it names none).
  const std::string& eos_token() const { return eos_token_; }
  const std::string& origin() const { return origin_; }

 private:
  ChatTemplate() = default;
  std::string origin_;
  std::shared_ptr<const jinja::Template> default_, tool_use_;
  nlohmann::ordered_json vars_ = nlohmann::ordered_json::object();
  std::string eos_token_;
  ToolCallFormat format_ = ToolCallFormat::kTroupe;
  std::optional<int64_t> now_;
};

}  // namespace troupe::envs
