#include "troupe/envs/renderer.h"

#include "troupe/core/text.h"
#include "troupe/envs/environment.h"

namespace troupe::envs {

using ojson = nlohmann::ordered_json;

// What probing the chat template found.
struct Renderer::TemplateMode {
  explicit TemplateMode(ChatTemplate t) : tpl(std::move(t)) {}
  ChatTemplate tpl;
  ToolCallFormat format = ToolCallFormat::kTroupe;
  std::string lead;        // what the template writes before a reply's own text
  std::string tail;        // whitespace it writes between a reply and EOS (Llama 2: " ")
  ojson env_base;          // [user probe, assistant probe]: the conversation tool turns follow
  std::string env_prompt;  // env_base's user message without the generation prompt; every
                           // tool render starts with it
  std::string reply_end;   // the probe reply and EOS, after which a tool turn starts
  std::string tool_error;  // why tool turns cannot be rendered ("" when they can)
};

namespace {

// Probe texts: mixed case and no edge whitespace, so a template that changes
// them (upper, trim, ...) is caught.
constexpr const char* kProbeUser = "TroupeProbeUser";
constexpr const char* kProbeReply = "TroupeProbeReply";
constexpr const char* kProbeReply2 = "TroupeProbeSecondReply";
constexpr const char* kProbeTool = "TroupeProbeToolOutput";

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string Shown(std::string_view s) {
  return ojson(std::string(s.substr(0, 60)) + (s.size() > 60 ? "..." : "")).dump();
}

ojson Msg(const char* role, std::string content) {
  return ojson{{"role", role}, {"content", std::move(content)}};
}

// The tool turn after the probe reply: what the template renders after the
// reply's EOS once a tool message with `output` follows.
Result<std::string> EnvText(const Renderer::TemplateMode& t, std::string_view output) {
  ojson msgs = t.env_base;
  msgs.push_back(Msg("tool", std::string(output)));
  Result<std::string> full = t.tpl.Render(msgs, /*add_generation_prompt=*/true);
  if (!full.ok()) return full.status();
  if (!StartsWith(*full, t.env_prompt))
    return InvalidArgument("{}: a tool message changes how the prompt renders", t.tpl.origin());
  size_t pos = full->find(t.reply_end, t.env_prompt.size());
  if (pos == std::string::npos)
    return InvalidArgument("{}: after a tool message the reply no longer renders as <reply><EOS>",
                           t.tpl.origin());
  return full->substr(pos + t.reply_end.size());
}

// Probes tool turns; returns why they cannot be rendered, or "".
std::string ProbeToolTurns(const Renderer::TemplateMode& t, const std::string& after_eos,
                           const std::string& eos) {
  Result<std::string> env = EnvText(t, kProbeTool);
  if (!env.ok()) return "it cannot render a tool message: " + env.status().message();
  if (env->find(kProbeTool) == std::string::npos)
    return "the tool output does not appear in what it renders for a tool message";
  if (!StartsWith(*env, after_eos))
    return "after a tool message, the text after a reply's EOS changes from " + Shown(after_eos) +
           " to " + Shown(*env);
  ojson msgs = t.env_base;
  msgs.push_back(Msg("tool", kProbeTool));
  msgs.push_back(Msg("assistant", kProbeReply2));
  Result<std::string> two = t.tpl.Render(msgs, /*add_generation_prompt=*/false);
  if (!two.ok()) return "it cannot render a reply after a tool message: " + two.status().message();
  size_t pos = two->find(t.reply_end, t.env_prompt.size());
  std::string want = *env + t.lead + kProbeReply2 + t.tail + eos + after_eos;
  if (pos == std::string::npos || two->substr(pos + t.reply_end.size()) != want)
    return "a second reply after a tool message renders differently from the first: expected " +
           Shown(want) + ", the template writes " +
           Shown(pos == std::string::npos ? *two : two->substr(pos + t.reply_end.size()));
  return "";
}

}  // namespace

nlohmann::ordered_json ToTemplateMessages(const Conversation& messages, ToolCallFormat format) {
  ojson out = ojson::array();
  for (const Message& m : messages) out.push_back(Msg(RoleName(m.role), RewriteToolCalls(m.content, format)));
  return out;
}

Result<Renderer> Renderer::WithChatTemplate(const engine::Tokenizer& tokenizer,
                                            ChatTemplate chat_template) {
  auto t = std::make_shared<TemplateMode>(std::move(chat_template));
  t->format = t->tpl.tool_call_format();
  const std::string& origin = t->tpl.origin();
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("the chat template of {} cannot be used: {}", origin, why);
  };
  const std::string& eos = t->tpl.eos_token();
  if (eos.empty()) return refuse("it names no eos_token, so a reply has no end");
  int32_t eos_id = tokenizer.TokenToId(eos);
  if (eos_id < 0) return refuse("its eos_token " + Shown(eos) + " is not a token of the tokenizer");
  if (eos_id != tokenizer.eos_id())
    return refuse(fmt::format("it ends replies with {} (id {}) but the tokenizer's EOS is id {}: "
                              "generation would not stop there",
                              Shown(eos), eos_id, tokenizer.eos_id()));
  ojson user = ojson::array({Msg("user", kProbeUser)});
  Result<std::string> prompt = t->tpl.Render(user, /*add_generation_prompt=*/true);
  if (!prompt.ok()) return refuse("it cannot render one user message: " + prompt.status().message());
  t->env_base = user;
  t->env_base.push_back(Msg("assistant", kProbeReply));
  Result<std::string> full = t->tpl.Render(t->env_base, /*add_generation_prompt=*/false);
  if (!full.ok()) return refuse("it cannot render a reply: " + full.status().message());
  if (!StartsWith(*full, *prompt))
    return refuse("the prompt rendered with add_generation_prompt=true is not a prefix of the same "
                  "conversation with a reply, so a reply cannot be told apart from its prompt");
  std::string turn = full->substr(prompt->size());
  size_t at = turn.find(kProbeReply);
  if (at == std::string::npos) return refuse("it does not render a reply's text as it is");
  t->lead = turn.substr(0, at);
  std::string after = turn.substr(at + std::string(kProbeReply).size());
  size_t eos_at = after.find(eos);
  bool blank_tail = eos_at != std::string::npos &&
                    after.find_first_not_of(" \t\n", 0) >= eos_at;
  if (!blank_tail)
    return refuse("a reply does not end with the EOS token " + Shown(eos) + "; the template writes " +
                  Shown(after) + " after it");
  t->tail = after.substr(0, eos_at);
  after = after.substr(eos_at);
  // Tool renders start with the user turn; the reply after it may render
  // differently once it is history (Qwen3 drops its empty <think> block).
  Result<std::string> user_only = t->tpl.Render(user, /*add_generation_prompt=*/false);
  if (!user_only.ok()) return refuse("it cannot render one user message: " + user_only.status().message());
  if (!StartsWith(*prompt, *user_only))
    return refuse("the prompt without the generation prompt is not a prefix of the prompt with it");
  t->env_prompt = *user_only;
  t->reply_end = std::string(kProbeReply) + t->tail + eos;
  // The pieces are encoded one by one, as the engine produces them; they must
  // give the ids of the whole text (a SentencePiece tokenizer that prepends
  // "▁" to every text would not).
  std::string reply_text = t->lead + kProbeReply + t->tail;
  Result<std::vector<int32_t>> whole = tokenizer.Encode(*prompt + reply_text + eos, false, false);
  Result<std::vector<int32_t>> head = tokenizer.Encode(*prompt, false, false);
  Result<std::vector<int32_t>> piece = tokenizer.Encode(reply_text, false, true);
  if (!whole.ok() || !head.ok() || !piece.ok())
    return refuse("the tokenizer cannot encode what it renders: " +
                  (!whole.ok() ? whole : !head.ok() ? head : piece).status().message());
  head->insert(head->end(), piece->begin(), piece->end());
  if (*head != *whole)
    return refuse("the tokenizer encodes a reply differently on its own than after its prompt "
                  "(e.g. a SentencePiece tokenizer that starts every text with a word boundary), "
                  "so the engine's pieces would not be the ids of the rendered text");
  t->tool_error = ProbeToolTurns(*t, after.substr(eos.size()), eos);
  Renderer r(tokenizer, ChatFormat{});
  r.format_.add_bos = false;  // the template writes BOS (bos_token) into the text itself
  r.template_ = std::move(t);
  return r;
}

Result<std::unique_ptr<Renderer>> MakeRenderer(const engine::Tokenizer& tokenizer,
                                               const std::string& model_dir,
                                               const ChatConfig& chat) {
  TROUPE_RETURN_IF_ERROR(chat.Validate());
  bool use_template = chat.format == "template" ||
                      (chat.format == "auto" && !model_dir.empty() && ChatTemplate::Available(model_dir));
  if (!use_template) {
    TROUPE_ASSIGN_OR_RETURN(ChatFormat f, ChatFormat::ByName(chat.format == "auto" ? "compact" : chat.format));
    return std::make_unique<Renderer>(tokenizer, std::move(f));
  }
  if (model_dir.empty())
    return InvalidArgument("chat.format is template but the tokenizer has no model folder (tokenizer.path)");
  TROUPE_ASSIGN_OR_RETURN(ChatTemplate tpl, ChatTemplate::Load(model_dir));
  for (const auto& [name, value] : chat.variables) tpl.SetVariable(name, ojson::parse(value));
  TROUPE_ASSIGN_OR_RETURN(Renderer r, Renderer::WithChatTemplate(tokenizer, std::move(tpl)));
  return std::make_unique<Renderer>(std::move(r));
}

const ChatTemplate* Renderer::chat_template() const {
  return template_ ? &template_->tpl : nullptr;
}

ToolCallFormat Renderer::tool_call_format() const {
  return template_ ? template_->format : ToolCallFormat::kTroupe;
}

const std::string& Renderer::tool_turn_error() const {
  static const std::string kNone;
  return template_ ? template_->tool_error : kNone;
}

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

namespace {

// The tool instructions of OpenAI function schemas (ToolInstructions' shape), checking that
// every name can be written, and parsed back, in `format`.
Result<std::string> ToolSchemaInstructions(const nlohmann::ordered_json& tools,
                                           ToolCallFormat format) {
  if (!tools.is_array()) return InvalidArgument("tools must be a list of function schemas");
  std::vector<ToolSpec> specs;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    const auto fn = t.is_object() ? t.find("function") : t.end();
    if (!t.is_object() || fn == t.end() || !fn->is_object())
      return InvalidArgument("tools[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}",
                             i);
    const auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      return InvalidArgument("tools[{}].function.name (a string) is required", i);
    ToolSpec spec;
    spec.name = name->get<std::string>();
    Status named = CheckToolName(spec.name, format);
    if (!named.ok()) return named.WithContext(fmt::format("tools[{}].function.name", i));
    const auto params = fn->find("parameters");
    spec.usage = params == fn->end() || params->is_null() ? "{}" : params->dump();
    const auto desc = fn->find("description");
    if (desc != fn->end() && desc->is_string()) spec.description = desc->get<std::string>();
    specs.push_back(std::move(spec));
  }
  return ToolInstructions(specs);
}

}  // namespace

Result<std::string> Renderer::RenderPromptText(const Conversation& messages,
                                               const nlohmann::ordered_json& tools) const {
  if (template_)
    return template_->tpl.Render(ToTemplateMessages(messages, template_->format),
                                 /*add_generation_prompt=*/true, tools);
  std::string text;
  if (!tools.is_null()) {
    Result<std::string> instructions = ToolSchemaInstructions(tools, ToolCallFormat::kTroupe);
    if (!instructions.ok()) return instructions.status();
    text += MessageText(Message{Role::kSystem, *instructions});
  }
  for (const auto& m : messages) text += MessageText(m);
  return text + format_.assistant_prefix;
}

std::string Renderer::PromptText(const Conversation& messages) const {
  Result<std::string> text = RenderPromptText(messages);
  return text.ok() ? *text : "[chat template error: " + text.status().message() + "]";
}

Result<std::vector<int32_t>> Renderer::RenderPrompt(const Conversation& messages) const {
  return RenderPrompt(messages, nullptr);
}

Result<std::vector<int32_t>> Renderer::RenderPrompt(const Conversation& messages,
                                                    const nlohmann::ordered_json& tools) const {
  Result<std::string> text = RenderPromptText(messages, tools);
  if (!text.ok()) return text.status().WithContext("rendering the prompt");
  Result<std::vector<int32_t>> ids = tokenizer_.Encode(*text, format_.add_bos, false);
  if (!ids.ok()) return ids.status().WithContext("rendering the prompt");
  return ids;
}

Result<std::vector<int32_t>> Renderer::RenderAssistantTurn(std::string_view text) const {
  Result<std::vector<int32_t>> ids = tokenizer_.Encode(text, false, true);
  if (!ids.ok()) return ids.status().WithContext("rendering an assistant turn");
  return ids;
}

Result<std::string> Renderer::RenderToolTurnText(std::string_view output) const {
  if (template_) {
    if (!template_->tool_error.empty())
      return InvalidArgument("the chat template of {} renders no tool turns: {}",
                             template_->tpl.origin(), template_->tool_error);
    return EnvText(*template_, output);
  }
  std::string text = format_.tool_prefix;
  text += output;
  text += format_.tool_suffix;
  text += format_.assistant_prefix;
  return text;
}

std::string Renderer::ToolTurnText(std::string_view output) const {
  Result<std::string> text = RenderToolTurnText(output);
  return text.ok() ? *text : "[chat template error: " + text.status().message() + "]";
}

Result<std::vector<int32_t>> Renderer::RenderToolTurn(std::string_view output) const {
  Result<std::string> text = RenderToolTurnText(output);
  if (!text.ok()) return text.status().WithContext("rendering a tool turn");
  Result<std::vector<int32_t>> ids = tokenizer_.Encode(*text, false, false);
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
      std::string text = m.content;
      if (template_) {
        // A demonstration reply as the template renders one: in the model's
        // tool-call format, after the template's lead (unless it has its own).
        text = RewriteToolCalls(text, template_->format);
        const std::string& lead = template_->lead;
        std::string head = lead.substr(0, lead.find('\n'));
        if (!lead.empty() && (head.empty() || text.compare(0, head.size(), head) != 0))
          text = lead + text;
        const std::string& tail = template_->tail;
        if (text.size() < tail.size() || text.compare(text.size() - tail.size(), tail.size(), tail) != 0)
          text += tail;
      }
      TROUPE_ASSIGN_OR_RETURN(ids, RenderAssistantTurn(text));
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
