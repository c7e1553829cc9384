#include "troupe/engine/peft.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "troupe/engine/safetensors.h"

namespace troupe::engine {

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

}  // namespace

Result<AdapterConfig> ParseAdapterConfig(std::string_view json_text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Malformed("{}: not a JSON object", where);
  auto bad = [&](const char* key, const std::string& why) {
    return InvalidArgument("{}: '{}' {}", where, key, why);
  };
  if (!j.contains("peft_type") || j["peft_type"] != "LORA")
    return bad("peft_type", "must be \"LORA\" (only LoRA adapters are supported)");
  AdapterConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0)
    return bad("r", "must be a positive integer");
  c.lora.rank = j["r"].get<int64_t>();
  c.lora.alpha = static_cast<double>(c.lora.rank);
  if (j.contains("lora_alpha")) {
    if (!j["lora_alpha"].is_number()) return bad("lora_alpha", "must be a number");
    c.lora.alpha = j["lora_alpha"].get<double>();
  }
  if (j.contains("lora_dropout") && !j["lora_dropout"].is_null()) {
    if (!j["lora_dropout"].is_number()) return bad("lora_dropout", "must be a number");
    c.lora.dropout = j["lora_dropout"].get<double>();
  }
  if (!j.contains("target_modules") || !j["target_modules"].is_array())
    return bad("target_modules",
               "must be a list of module names (a regular expression is not supported)");
  c.lora.target_modules.clear();
  for (const auto& m : j["target_modules"]) {
    if (!m.is_string()) return bad("target_modules", "holds a value that is not a string");
    c.lora.target_modules.push_back(m.get<std::string>());
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model = j["base_model_name_or_path"].get<std::string>();
  // Options that change the math: refused unless at their default.
  auto must_be = [&](const char* key, const nlohmann::json& want) -> Status {
    if (!j.contains(key) || j[key].is_null() || j[key] == want) return Status::Ok();
    return bad(key, fmt::format("= {} is not supported (only {})", j[key].dump(), want.dump()));
  };
  TROUPE_RETURN_IF_ERROR(must_be("use_rslora", false));
  TROUPE_RETURN_IF_ERROR(must_be("use_dora", false));
  TROUPE_RETURN_IF_ERROR(must_be("fan_in_fan_out", false));
  TROUPE_RETURN_IF_ERROR(must_be("bias", "none"));
  TROUPE_RETURN_IF_ERROR(must_be("rank_pattern", nlohmann::json::object()));
  TROUPE_RETURN_IF_ERROR(must_be("alpha_pattern", nlohmann::json::object()));
  TROUPE_RETURN_IF_ERROR(must_be("modules_to_save", nlohmann::json::array()));
  TROUPE_RETURN_IF_ERROR(must_be("layers_to_transform", nlohmann::json::array()));
  Status st = c.lora.Validate();
  if (!st.ok()) return InvalidArgument("{}: {}", where, st.message());
  return c;
}

std::string AdapterConfigJson(const LoraConfig& lora, const std::string& base_model) {
  nlohmann::json j;  // std::map underneath: keys sorted
  j["alpha_pattern"] = nlohmann::json::object();
  j["base_model_name_or_path"] =
      base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = lora.effective_alpha();
  j["lora_dropout"] = lora.dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = lora.rank;
  j["rank_pattern"] = nlohmann::json::object();
  j["target_modules"] = lora.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = false;
  return j.dump(2) + "\n";
}

Status SaveAdapter(const std::string& dir, const LlamaModel& model,
                   const std::string& base_model) {
  const LoraConfig& lora = model.config().lora;
  if (!lora.enabled()) return InvalidArgument("the model has no LoRA adapter to save");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create {}: {}", dir, ec.message());
  TROUPE_RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / kWeightsFile).string(),
                                          model.AdapterWeights(), {{"format", "pt"}}));
  const std::string path = (fs::path(dir) / kConfigFile).string();
  {
    std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
    out << AdapterConfigJson(lora, base_model);
    if (!out.flush()) return IoError("cannot write {}.tmp", path);
  }
  fs::rename(path + ".tmp", path, ec);
  if (ec) return IoError("cannot rename {}.tmp: {}", path, ec.message());
  return Status::Ok();
}

Status LoadAdapter(const std::string& dir, LlamaModel& model) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return NotFound("{}: cannot open (not a PEFT adapter folder?)", config_path);
  std::stringstream text;
  text << in.rdbuf();
  TROUPE_ASSIGN_OR_RETURN(AdapterConfig c, ParseAdapterConfig(text.str(), config_path));
  const LoraConfig& mine = model.config().lora;
  if (!mine.enabled())
    return InvalidArgument("{}: a LoRA adapter (r={}) but the model has no LoRA (set lora.rank)",
                           config_path, c.lora.rank);
  if (c.lora.rank != mine.rank)
    return InvalidArgument("{}: 'r' = {} but the model's lora.rank = {}", config_path, c.lora.rank,
                           mine.rank);
  if (std::abs(c.lora.effective_alpha() - mine.effective_alpha()) > 1e-12)
    return InvalidArgument("{}: 'lora_alpha' = {} but the model's lora.alpha = {}", config_path,
                           c.lora.effective_alpha(), mine.effective_alpha());
  for (int m = 0; m < kNumLoraModules; ++m) {
    if (c.lora.Targets(m) != mine.Targets(m))
      return InvalidArgument("{}: target_modules [{}] differ from the model's lora.target_modules "
                             "[{}] ({})",
                             config_path, fmt::join(c.lora.target_modules, ", "),
                             fmt::join(mine.target_modules, ", "), LoraModuleName(m));
  }
  const std::string weights = (fs::path(dir) / kWeightsFile).string();
  TROUPE_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(weights));
  LoadOptions opts;
  opts.require_adapters = true;
  for (const auto& [name, t] : f.tensors) {
    if (name.find(".lora_A.") == std::string::npos && name.find(".lora_B.") == std::string::npos)
      return InvalidArgument("{}: tensor '{}' is not a LoRA adapter tensor", weights, name);
  }
  return model.LoadNamed(f.tensors, opts).WithContext(weights);
}

}  // namespace troupe::engine
