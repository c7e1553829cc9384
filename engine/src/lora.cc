#include "troupe/engine/lora.h"

#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "troupe/core/config_binder.h"

namespace troupe::engine {

namespace {
constexpr const char* kModules[kNumLoraModules] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
}  // namespace

const char* LoraModuleName(int module) {
  return module >= 0 && module < kNumLoraModules ? kModules[module] : "?";
}

int LoraModuleIndex(std::string_view name) {
  for (int i = 0; i < kNumLoraModules; ++i)
    if (name == kModules[i]) return i;
  return -1;
}

const char* LoraModuleParent(int module) {
  return module <= 3 ? "self_attn" : "mlp";
}

std::string LoraAdapterName(size_t layer, int module, const char* ab) {
  return fmt::format("base_model.model.model.layers.{}.{}.{}.{}.weight", layer,
                     LoraModuleParent(module), LoraModuleName(module), ab);
}

bool LoraConfig::Targets(int module) const {
  for (const auto& m : target_modules)
    if (LoraModuleIndex(m) == module) return true;
  return false;
}

Status LoraConfig::Validate() const {
  if (rank < 0 || rank > 65536) return InvalidArgument("lora.rank = {} must be in [0, 65536]", rank);
  if (rank == 0) return Status::Ok();  // off: the other fields are not used
  if (!(alpha >= 0) || !std::isfinite(alpha))
    return InvalidArgument("lora.alpha = {} must be finite and >= 0 (0: alpha = rank)", alpha);
  if (!(dropout >= 0 && dropout < 1))
    return InvalidArgument("lora.dropout = {} must be in [0, 1)", dropout);
  if (target_modules.empty())
    return InvalidArgument("lora.target_modules is empty: name at least one of {}",
                           fmt::join(kModules, kModules + kNumLoraModules, " "));
  std::set<std::string> seen;
  for (const auto& m : target_modules) {
    if (LoraModuleIndex(m) < 0)
      return InvalidArgument("lora.target_modules: unknown module '{}' (known: {})",
                             m.substr(0, 40), fmt::join(kModules, kModules + kNumLoraModules, " "));
    if (!seen.insert(m).second)
      return InvalidArgument("lora.target_modules names '{}' twice", m);
  }
  return Status::Ok();
}

std::string LoraConfig::ToString() const {
  if (!enabled()) return "off";
  return fmt::format("r={} alpha={} dropout={} targets={}", rank, effective_alpha(), dropout,
                     fmt::join(target_modules, ","));
}

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

void Describe(config::Binder& b, LoraConfig& c) {
  b.Field("rank", &c.rank, "adapter rank r (0: no LoRA, the full model trains and travels)");
  b.Field("alpha", &c.alpha, "scale numerator: updates are (alpha / rank) * B A (0: alpha = rank)");
  b.Field("dropout", &c.dropout, "dropout on the adapters' input while training");
  b.Field("target_modules", &c.target_modules,
          "PEFT module names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  b.Field("warm_start_full", &c.warm_start_full,
          "the supervised warm start trains the full model, then RL trains the adapter");
}

}  // namespace troupe::engine
