#include "troupe/engine/lora.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

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

}  // namespace troupe::engine
