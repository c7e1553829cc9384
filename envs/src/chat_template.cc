#include "troupe/envs/chat_template.h"

#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "troupe/jinja/template.h"

namespace troupe::envs {
namespace {

using ojson = nlohmann::ordered_json;

std::string ConfigPath(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return path + "/tokenizer_config.json";
  return path;
}

// A special token in tokenizer_config.json: a string or {"content": ...}.
std::string TokenText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

ToolCallFormat DetectFormat(const std::string& src) {
  if (src.find("<tool_call>") != std::string::npos) return ToolCallFormat::kHermes;
  if (src.find("\"parameters\": ") != std::string::npos &&
      (src.find("ipython") != std::string::npos || src.find("python_tag") != std::string::npos))
    return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kTroupe;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromTokenizerConfig(const nlohmann::json& config,
                                                       const std::string& origin) {
  if (!config.is_object()) return InvalidArgument("{}: not a JSON object", origin);
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    return NotFound("{}: has no chat_template (the model has no chat format to render with)", origin);
  std::string main_src, tool_src;
  if (it->is_string()) {
    main_src = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        return InvalidArgument("{}: chat_template list entries must be {{\"name\", \"template\"}} strings",
                               origin);
      if (e["name"] == "default") main_src = e["template"].get<std::string>();
      if (e["name"] == "tool_use") tool_src = e["template"].get<std::string>();
    }
    if (main_src.empty())
      return InvalidArgument("{}: chat_template has no template named \"default\"", origin);
  } else {
    return InvalidArgument("{}: chat_template must be a string or a list, got {}", origin,
                           it->type_name());
  }
  ChatTemplate t;
  t.origin_ = origin;
  Result<jinja::Template> main = jinja::Template::Parse(main_src, origin + " chat_template");
  if (!main.ok()) return main.status();
  t.default_ = std::make_shared<jinja::Template>(std::move(*main));
  if (!tool_src.empty()) {
    Result<jinja::Template> tool = jinja::Template::Parse(tool_src, origin + " chat_template tool_use");
    if (!tool.ok()) return tool.status();
    t.tool_use_ = std::make_shared<jinja::Template>(std::move(*tool));
  }
  // The special tokens Hugging Face passes to every render (special_tokens_map).
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    auto v = config.find(name);
    if (v == config.end()) continue;
    std::string text = TokenText(*v);
    if (!text.empty() || v->is_string()) t.vars_[name] = text;
  }
  if (auto extra = config.find("additional_special_tokens"); extra != config.end() && extra->is_array()) {
    ojson list = ojson::array();
    for (const auto& e : *extra) list.push_back(TokenText(e));
    t.vars_["additional_special_tokens"] = list;
  }
  if (t.vars_.contains("eos_token")) t.eos_token_ = t.vars_["eos_token"].get<std::string>();
  t.format_ = DetectFormat(tool_src.empty() ? main_src : tool_src);
  return t;
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return NotFound("{}: no such model folder or file", path);
  std::string file = ConfigPath(path);
  std::ifstream in(file);
  if (!in) return NotFound("{}: cannot be read", file);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json config = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return InvalidArgument("{}: is not valid JSON", file);
  return FromTokenizerConfig(config, file);
}

bool ChatTemplate::Available(const std::string& path) {
  std::ifstream in(ConfigPath(path));
  if (!in) return false;
  nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null();
}

void ChatTemplate::SetVariable(const std::string& name, nlohmann::ordered_json value) {
  vars_[name] = std::move(value);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& tools) const {
  ojson ctx = vars_;
  ctx["messages"] = messages;
  bool with_tools = tools.is_array() && !tools.empty();
  if (with_tools) ctx["tools"] = tools;
  ctx["add_generation_prompt"] = add_generation_prompt;
  jinja::RenderOptions opts;
  if (now_) {
    opts.now_unix_seconds = *now_;
    opts.utc = true;
  }
  const jinja::Template& t = with_tools && tool_use_ ? *tool_use_ : *default_;
  return t.Render(ctx, opts);
}

}  // namespace troupe::envs
