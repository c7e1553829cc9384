#include "troupe/envs/renderer.h"

namespace troupe::envs {

ChatFormat ChatFormat::Compact() {
  return ChatFormat{};
}

ChatFormat ChatFormat::Tagged() {
  ChatFormat f;
  f.system_prefix = "<|system|>\n";
  f.system_suffix = "\n";
  f.user_prefix = "<|user|>\n";
  f.user_suffix = "\n";
  f.assistant_prefix = "<|assistant|>\n";
  f.tool_prefix = "\n<|tool|>\n";
  f.tool_suffix = "\n";
  return f;
}

Result<ChatFormat> ChatFormat::ByName(std::string_view name) {
  if (name == "compact") return Compact();
  if (name == "tagged") return Tagged();
  return InvalidArgument("chat format '{}' is not one of compact, tagged",
                         std::string(name.substr(0, 40)));
}

std::string Renderer::MessageText(const Message& m) const {
  switch (m.role) {
    case Role::kSystem:
      return format_.system_prefix + m.content + format_.system_suffix;
    case Role::kUser:
      return format_.user_prefix + m.content + format_.user_suffix;
    case Role::kAssistant:
      // An assistant message inside a prompt (few-shot examples): prefix, text, no EOS.
      return format_.assistant_prefix + m.content;
    case Role::kTool:
      return format_.tool_prefix + m.content + format_.tool_suffix;
  }
  return m.content;
}

std::string Renderer::PromptText(const Conversation& messages) const {
  std::string text;
  for (const auto& m : messages) text += MessageText(m);
  return text + format_.assistant_prefix;
}

Result<std::vector<int32_t>> Renderer::RenderPrompt(const Conversation& messages) const {
  Result<std::vector<int32_t>> ids =
      tokenizer_.Encode(PromptText(messages), format_.add_bos, false);
  if (!ids.ok()) return ids.status().WithContext("rendering the prompt");
  return ids;
}

Result<std::vector<int32_t>> Renderer::RenderAssistantTurn(std::string_view text) const {
  Result<std::vector<int32_t>> ids = tokenizer_.Encode(text, false, true);
  if (!ids.ok()) return ids.status().WithContext("rendering an assistant turn");
  return ids;
}

std::string Renderer::ToolTurnText(std::string_view output) const {
  std::string text = format_.tool_prefix;
  text += output;
  text += format_.tool_suffix;
  text += format_.assistant_prefix;
  return text;
}

Result<std::vector<int32_t>> Renderer::RenderToolTurn(std::string_view output) const {
  Result<std::vector<int32_t>> ids = tokenizer_.Encode(ToolTurnText(output), false, false);
  if (!ids.ok()) return ids.status().WithContext("rendering a tool turn");
  return ids;
}

Result<RenderedSequence> Renderer::RenderConversation(const Conversation& prompt,
                                                      const Conversation& continuation) const {
  if (continuation.empty() || continuation.front().role != Role::kAssistant)
    return InvalidArgument("a continuation must start with an assistant message");
  RenderedSequence seq;
  TROUPE_ASSIGN_OR_RETURN(seq.prompt_tokens, RenderPrompt(prompt));
  for (size_t i = 0; i < continuation.size(); ++i) {
    const Message& m = continuation[i];
    std::vector<int32_t> ids;
    uint8_t mask = 0;
    if (m.role == Role::kAssistant) {
      TROUPE_ASSIGN_OR_RETURN(ids, RenderAssistantTurn(m.content));
      mask = 1;
    } else if (m.role == Role::kTool) {
      if (i + 1 == continuation.size())
        return InvalidArgument("a continuation must not end with a tool message");
      TROUPE_ASSIGN_OR_RETURN(ids, RenderToolTurn(m.content));
    } else {
      return InvalidArgument(
          "continuation message {} has role {}; only assistant and tool are allowed", i,
          RoleName(m.role));
    }
    seq.response_tokens.insert(seq.response_tokens.end(), ids.begin(), ids.end());
    seq.loss_mask.insert(seq.loss_mask.end(), ids.size(), mask);
  }
  return seq;
}

const std::string& PrintableAlphabet() {
  static const std::string alphabet = [] {
    std::string a = "\t\n";
    for (int c = 0x20; c < 0x7f; ++c) a.push_back(static_cast<char>(c));
    return a;
  }();
  return alphabet;
}

}  // namespace troupe::envs
