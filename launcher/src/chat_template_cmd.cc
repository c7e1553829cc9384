#include "chat_template_cmd.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "troupe/engine/hf_tokenizer.h"
#include "troupe/envs/chat_template.h"
#include "troupe/envs/renderer.h"

namespace troupe::launcher {
namespace {

using ojson = nlohmann::ordered_json;

int Fail(const std::string& message, int code = 1) {
  std::cerr << "troupe chat-template: " << message << "\n";
  return code;
}

// A conversation message as Troupe renders it: role and text, tool calls
// written into the text in the template's format.
Result<envs::Message> ToMessage(const ojson& m, size_t index, envs::ToolCallFormat format) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    return InvalidArgument("message {} has no \"role\" string", index);
  std::string role = m["role"].get<std::string>();
  if (role == "ipython") role = "tool";
  Result<envs::Role> r = envs::ParseRole(role);
  if (!r.ok()) return r.status().WithContext(fmt::format("message {}", index));
  envs::Message out{*r, ""};
  if (m.contains("content") && !m["content"].is_null()) {
    if (!m["content"].is_string())
      return InvalidArgument("message {}: --ids renders text content only (got {})", index,
                             m["content"].type_name());
    out.content = m["content"].get<std::string>();
  }
  if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
    auto calls = envs::ReadToolCalls(nlohmann::json::parse(m["tool_calls"].dump()));
    if (!calls.ok()) return calls.status().WithContext(fmt::format("message {}", index));
    auto text = envs::AppendToolCalls(std::move(out.content), *calls, format);
    if (!text.ok()) return text.status().WithContext(fmt::format("message {}", index));
    out.content = std::move(text).value();
  }
  return out;
}

int PrintIds(const envs::ChatTemplate& tpl, const ojson& messages, const std::string& dir) {
  auto tok = engine::HfTokenizer::Load(dir);
  if (!tok.ok()) return Fail(tok.status().message());
  Result<envs::Renderer> r = envs::Renderer::WithChatTemplate(**tok, tpl);
  if (!r.ok()) return Fail(r.status().message());
  envs::Conversation prompt, continuation;
  for (size_t i = 0; i < messages.size(); ++i) {
    Result<envs::Message> m = ToMessage(messages[i], i, r->tool_call_format());
    if (!m.ok()) return Fail(m.status().message());
    bool reply_started = !continuation.empty() || m->role == envs::Role::kAssistant;
    (reply_started ? continuation : prompt).push_back(*m);
  }
  ojson out = ojson::object();
  if (continuation.empty()) {
    Result<std::vector<int32_t>> ids = r->RenderPrompt(prompt);
    if (!ids.ok()) return Fail(ids.status().message());
    out["prompt_ids"] = *ids;
    out["response_ids"] = ojson::array();
    out["loss_mask"] = ojson::array();
  } else {
    Result<envs::RenderedSequence> seq = r->RenderConversation(prompt, continuation);
    if (!seq.ok()) return Fail(seq.status().message());
    out["prompt_ids"] = seq->prompt_tokens;
    out["response_ids"] = seq->response_tokens;
    out["loss_mask"] = seq->loss_mask;
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

CLI::App* AddChatTemplateCommand(CLI::App& app, ChatTemplateArgs* args) {
  auto* cmd = app.add_subcommand(
      "chat-template", "render a conversation with a model folder's chat template (--ids: ids and loss mask)");
  cmd->add_option("dir", args->dir, "model folder with tokenizer_config.json (and tokenizer.json for --ids)")
      ->required();
  cmd->add_option("conversation", args->conversation,
                  "JSON file: a list of messages, or {\"messages\": [...], \"tools\": [...], variables...}")
      ->required();
  cmd->add_flag("--ids", args->ids, "print prompt ids, response ids and the loss mask as one JSON line");
  cmd->add_flag("--generation-prompt", args->generation_prompt, "render with add_generation_prompt=true");
  cmd->add_option("--var", args->vars, "template variable NAME=JSON, e.g. enable_thinking=false (repeatable)");
  return cmd;
}

int RunChatTemplate(const ChatTemplateArgs& args) {
  Result<envs::ChatTemplate> tpl = envs::ChatTemplate::Load(args.dir);
  if (!tpl.ok()) return Fail(tpl.status().message());
  std::ifstream in(args.conversation);
  if (!in) return Fail(args.conversation + ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  ojson doc = ojson::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Fail(args.conversation + ": is not valid JSON");
  ojson messages, tools;
  bool generation_prompt = args.generation_prompt;
  if (doc.is_array()) {
    messages = doc;
  } else if (doc.is_object() && doc.contains("messages") && doc["messages"].is_array()) {
    messages = doc["messages"];
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "messages") continue;
      if (it.key() == "tools") {
        tools = it.value();
      } else if (it.key() == "add_generation_prompt" && it.value().is_boolean()) {
        generation_prompt = generation_prompt || it.value().get<bool>();
      } else {
        tpl->SetVariable(it.key(), it.value());
      }
    }
  } else {
    return Fail(args.conversation + ": expected a list of messages or an object with \"messages\"");
  }
  for (const std::string& v : args.vars) {
    size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0) return Fail("--var " + v + ": expected NAME=JSON", 2);
    ojson value = ojson::parse(v.substr(eq + 1), nullptr, false);
    if (value.is_discarded()) value = v.substr(eq + 1);  // a bare word is a string
    tpl->SetVariable(v.substr(0, eq), value);
  }
  if (args.ids) {
    if (tools.is_array() && !tools.empty()) tpl->SetVariable("tools", tools);
    return PrintIds(*tpl, messages, args.dir);
  }
  Result<std::string> text = tpl->Render(messages, generation_prompt, tools);
  if (!text.ok()) return Fail(text.status().message());
  std::cout << *text;
  return 0;
}

}  // namespace troupe::launcher
