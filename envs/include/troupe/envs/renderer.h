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
// With a model's chat template (WithChatTemplate) the same layout holds, and
// the template decides every piece, found from what it renders:
//
//   prompt   = template(messages, add_generation_prompt=true)    (BOS, if any, is in the text)
//   response = the model's reply, then the EOS token              (mask 1)
//              environment text after a tool message              (mask 0)
//              the next reply, EOS ...                            (mask 1)
//
// The environment text of a tool output is what the template renders after
// an assistant reply's EOS token once a tool message follows, up to and with
// the next generation prompt (Qwen3: "\n<|im_start|>user\n<tool_response>\n
// OUT\n</tool_response><|im_end|>\n<|im_start|>assistant\n"). The template is
// probed once at construction and refused, naming why, when the pieces cannot
// be told apart: the generation prompt is not a prefix of the conversation
// with a reply, replies do not end with the tokenizer's EOS token (or write
// text other than whitespace between the reply and EOS), a tool message changes how the prompt
// renders, the tool output does not appear, or a second reply after a tool
// message renders differently from the first. A template that renders no
// tool messages (Llama 2) still renders single-turn prompts; its tool turns
// fail with the reason. Text written for Troupe's tool-call syntax (task
// instructions, demonstrations) is rewritten into the template's tool-call
// format (tool_call.h); demonstrations' replies start with the text the
// template puts before every reply (Qwen3 without enable_thinking=false:
// "<think>\n\n</think>\n\n") and end with the whitespace it puts before EOS
// (Llama 2: " ").
//
// Thread safety: a Renderer is immutable; it borrows the tokenizer, which must
// outlive it. Encoding failures (a character outside a character tokenizer's
// alphabet) are returned as errors naming the character.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "troupe/core/status.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/chat_template.h"
#include "troupe/envs/config.h"
#include "troupe/envs/message.h"
#include "troupe/envs/tool_call.h"

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
  // Renders through a model's chat template; probes it first (see above).
  static Result<Renderer> WithChatTemplate(const engine::Tokenizer& tokenizer,
                                           ChatTemplate chat_template);

  const engine::Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatFormat& format() const { return format_; }
  // The chat template, or null for a ChatFormat renderer.
  const ChatTemplate* chat_template() const;
  // The tool-call format replies are parsed in (troupe for a ChatFormat).
  ToolCallFormat tool_call_format() const;
  // The id that ends a reply: the tokenizer's EOS.
  int32_t stop_id() const { return tokenizer_.eos_id(); }
  // Why this renderer cannot render tool turns ("" when it can).
  const std::string& tool_turn_error() const;

  // Prompt text ending with the assistant prefix, e.g. "abc=" (without BOS;
  // with a template, BOS is part of the text). When a template refuses the
  // messages, "[chat template error: ...]" (RenderPrompt returns the error).
  std::string PromptText(const Conversation& messages) const;
  // Prompt ids: [BOS] + PromptText. Fails when a message cannot be encoded.
  Result<std::vector<int32_t>> RenderPrompt(const Conversation& messages) const;
  // The same with OpenAI function schemas (`tools`: [{"type": "function", "function": {"name",
  // "description", "parameters"}}]): a chat template renders them (its `tools` variable); a
  // ChatFormat renders them as a system message of tool instructions before the conversation,
  // as built-in tasks do ("Call one tool per turn by writing <tool>name {json
  // arguments}</tool>. Tools:\n- NAME PARAMETERS: DESCRIPTION\n"). InvalidArgument naming the
  // entry when a schema is malformed or its name cannot be written in the tool-call format.
  Result<std::vector<int32_t>> RenderPrompt(const Conversation& messages,
                                            const nlohmann::ordered_json& tools) const;
  // Ids of an assistant turn's text followed by EOS (as the model samples it).
  Result<std::vector<int32_t>> RenderAssistantTurn(std::string_view text) const;
  // Environment ids after an assistant turn: tool_prefix output tool_suffix assistant_prefix.
  Result<std::vector<int32_t>> RenderToolTurn(std::string_view output) const;
  // Text of the same (for transcripts and SequenceMeta.responseText); with a
  // template that refuses it, "[chat template error: ...]".
  std::string ToolTurnText(std::string_view output) const;
  // A prompt and its continuation (assistant and tool messages, e.g. a task's
  // Demonstration) as one sequence with its loss mask, for supervised warm-up.
  // The continuation must start with an assistant message.
  Result<RenderedSequence> RenderConversation(const Conversation& prompt,
                                              const Conversation& continuation) const;

  struct TemplateMode;  // what the probe found (renderer.cc)

 private:
  std::string MessageText(const Message& m) const;
  Result<std::string> RenderPromptText(const Conversation& messages,
                                       const nlohmann::ordered_json& tools = nullptr) const;
  Result<std::string> RenderToolTurnText(std::string_view output) const;
  const engine::Tokenizer& tokenizer_;
  ChatFormat format_;
  std::shared_ptr<const TemplateMode> template_;
};

// The renderer of a job (ChatConfig in config.h): the chat template of
// `model_dir` (tokenizer_config.json) when `chat.format` is auto and the
// folder has one, or is template; else the named fixed format (auto: compact).
// `model_dir` "" means no model folder (character tokenizers).
Result<std::unique_ptr<Renderer>> MakeRenderer(const engine::Tokenizer& tokenizer,
                                               const std::string& model_dir,
                                               const ChatConfig& chat);

// Messages in Hugging Face's shape ({"role", "content"}), with Troupe-syntax
// tool calls rewritten into `format`.
nlohmann::ordered_json ToTemplateMessages(const Conversation& messages, ToolCallFormat format);

// Every byte built-in tasks and environments can render: '\t', '\n' and
// printable ASCII 0x20-0x7e, in that order (97 characters). Build the
// CharTokenizer of a job from it.
const std::string& PrintableAlphabet();

}  // namespace troupe::envs
