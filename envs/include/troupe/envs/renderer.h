// Rendering messages to token ids, with the loss mask the learner trains on.
//
// A ChatFormat says which text surrounds each role; the Renderer encodes each
// piece with an engine::Tokenizer (the torch-free interface in
// engine/include/troupe/engine/tokenizer.h). Pieces are encoded separately, in
// the same way a rollout produces them (prompt, then the model's sampled
// tokens, then environment tokens), so a demonstration renders to exactly the
// ids an episode would produce.
//
// Layout of a sequence:
//
//   prompt   = [BOS] render(system/user/tool messages...) assistant_prefix
//   response = assistant text, EOS                                 (mask 1)
//              tool_prefix tool output tool_suffix assistant_prefix (mask 0)
//              assistant text, EOS                                 (mask 1) ...
//
// The compact format for character-level models renders the reverse task as
// prompt "<bos>abc=" and response "cba<eos>"; a tool turn as "\n<output>=".
// The tagged format ("<|user|>\n...") suits pretrained tokenizers.
//
// Thread safety: a Renderer is immutable; it borrows the tokenizer, which must
// outlive it. Encoding failures (a character outside a character tokenizer's
// alphabet) are returned as errors naming the character.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/message.h"

namespace troupe::envs {

struct ChatFormat {
  // Start every prompt with the tokenizer's BOS id. Default true.
  bool add_bos = true;
  std::string system_prefix;         // before a system message. Compact: ""
  std::string system_suffix = "\n";  // after a system message. Compact: "\n"
  std::string user_prefix;           // before a user message. Compact: ""
  std::string user_suffix;           // after a user message. Compact: ""
  std::string assistant_prefix =
      "=";                         // before every assistant turn (ends the prompt). Compact: "="
  std::string tool_prefix = "\n";  // before a tool message. Compact: "\n"
  std::string tool_suffix;         // after a tool message. Compact: ""

  // The compact format above (the defaults).
  static ChatFormat Compact();
  // Tagged: "<|system|>\n...\n", "<|user|>\n...\n", "<|assistant|>\n", "<|tool|>\n...\n".
  static ChatFormat Tagged();
  // "compact" or "tagged"; InvalidArgument otherwise.
  static Result<ChatFormat> ByName(std::string_view name);
};

// One rendered training sequence (prompt + response with its loss mask).
struct RenderedSequence {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> response_tokens;
  std::vector<uint8_t> loss_mask;  // per response token: 1 = assistant (trained), 0 = environment
};

class Renderer {
 public:
  Renderer(const engine::Tokenizer& tokenizer, ChatFormat format)
      : tokenizer_(tokenizer), format_(std::move(format)) {}

  const engine::Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatFormat& format() const { return format_; }

  // Prompt text (without BOS) ending with the assistant prefix, e.g. "abc=".
  std::string PromptText(const Conversation& messages) const;
  // Prompt ids: [BOS] + PromptText. Fails when a message cannot be encoded.
  Result<std::vector<int32_t>> RenderPrompt(const Conversation& messages) const;
  // Ids of an assistant turn's text followed by EOS (as the model samples it).
  Result<std::vector<int32_t>> RenderAssistantTurn(std::string_view text) const;
  // Environment ids after an assistant turn: tool_prefix output tool_suffix assistant_prefix.
  Result<std::vector<int32_t>> RenderToolTurn(std::string_view output) const;
  // Text of the same (for transcripts and SequenceMeta.responseText).
  std::string ToolTurnText(std::string_view output) const;
  // A prompt and its continuation (assistant and tool messages, e.g. a task's
  // Demonstration) as one sequence with its loss mask, for supervised warm-up.
  // The continuation must start with an assistant message.
  Result<RenderedSequence> RenderConversation(const Conversation& prompt,
                                              const Conversation& continuation) const;

 private:
  std::string MessageText(const Message& m) const;
  const engine::Tokenizer& tokenizer_;
  ChatFormat format_;
};

// Every byte built-in tasks and environments can render: '\t', '\n' and
// printable ASCII 0x20-0x7e, in that order (97 characters). Build the
// CharTokenizer of a job from it.
const std::string& PrintableAlphabet();

}  // namespace troupe::envs
