// LoraConfig: low-rank adapters on the policy's linear projections (torch-free).
//
//   y = W x (+ b)  +  (alpha / rank) * B (A dropout(x))      A: [rank, in], B: [out, rank]
//
// The published LoRA / Hugging Face PEFT math. Module names are PEFT's for
// Llama/Qwen (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj); A starts
// kaiming-uniform(a = sqrt(5)) and B at zero, so a fresh adapter changes nothing.
// With rank > 0 the base weights are frozen (requires_grad false) and only the
// adapters train, checkpoint and travel over the weight broadcast after the
// first full version. The launcher (never torch) reads `lora:` of a job into
// ModelConfig::lora; the learner and the rollout engines build the same adapters
// from it. Plain value type: copy freely, no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::config {
class Binder;
}

namespace troupe::engine {

// The projections an adapter may target, in the order of AdapterWeights().
inline constexpr int kNumLoraModules = 7;
// PEFT's name of module i ("q_proj", ..., "down_proj").
const char* LoraModuleName(int module);
// Index of a PEFT module name, or -1.
int LoraModuleIndex(std::string_view name);
// "self_attn" for q/k/v/o, "mlp" for gate/up/down.
const char* LoraModuleParent(int module);
// PEFT's name of an adapter tensor: `ab` is "lora_A" or "lora_B"
// ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight").
std::string LoraAdapterName(size_t layer, int module, const char* ab);

struct LoraConfig {
  // Rank r of every adapter. 0 (default) = no LoRA: the full model trains and travels.
  // PEFT's usual 8-16; larger ranks approach a full fine-tune and cost more bytes per update.
  int64_t rank = 0;
  // Scale numerator: the update is (alpha / rank) * B A. 0 (default) means alpha = rank
  // (scale 1), PEFT's lora_alpha default when it equals r.
  double alpha = 0.0;
  // Dropout on the adapter's input while training (PEFT lora_dropout). Default 0; never
  // applied in generation or without gradients.
  double dropout = 0.0;
  // PEFT module names that get an adapter. Default q_proj, v_proj (PEFT's default for
  // Llama/Qwen); all seven adapt every linear projection except the output head.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  // Learner: the supervised warm start trains the full model (then the base is frozen and
  // RL trains the adapter), instead of the adapter alone. Default false (LoRA throughout).
  bool warm_start_full = false;

  bool enabled() const { return rank > 0; }
  double effective_alpha() const { return alpha > 0 ? alpha : static_cast<double>(rank); }
  double scale() const { return rank > 0 ? effective_alpha() / static_cast<double>(rank) : 0.0; }
  // True when `module` (an index) is targeted.
  bool Targets(int module) const;
  // Checks rank, alpha, dropout and the module names; the error names the field (`lora.*`).
  Status Validate() const;
  // "r=8 alpha=16 dropout=0 targets=q_proj,v_proj" or "off".
  std::string ToString() const;
};

// ---------------------------------------------------------------- PEFT adapter_config.json
// (torch-free: the launcher's `troupe export` reads it; peft.h saves and loads adapters)

struct AdapterConfig {
  LoraConfig lora;          // r, lora_alpha, lora_dropout, target_modules
  std::string base_model;   // base_model_name_or_path ("" when null)
};

// Parses adapter_config.json text; `where` (a path) prefixes errors, which name the key.
Result<AdapterConfig> ParseAdapterConfig(std::string_view json_text, const std::string& where);
// adapter_config.json for `lora` (sorted keys, as PEFT writes them).
std::string AdapterConfigJson(const LoraConfig& lora, const std::string& base_model);

// The `lora.*` keys of a job (troupe/core/config_binder.h).
void Describe(config::Binder& b, LoraConfig& c);

}  // namespace troupe::engine
