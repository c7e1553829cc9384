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
