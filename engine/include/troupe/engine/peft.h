// Hugging Face PEFT LoRA adapters on disk: `adapter_config.json` + `adapter_model.safetensors`.
//
//   learner ──SaveAdapter──▶ DIR/{adapter_config.json, adapter_model.safetensors} ──▶ PEFT,
//   vLLM --lora-modules, LoadAdapter (resume, `troupe export --adapter`)
//
// Tensor names are PEFT's (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`,
// LlamaModel::AdapterWeights); the config carries peft_type LORA, r, lora_alpha,
// lora_dropout, target_modules, base_model_name_or_path, task_type CAUSAL_LM and the
// defaults of the options Troupe does not implement. Reading refuses, by key, every
// option that would change the math (use_rslora, use_dora, fan_in_fan_out, bias other than
// "none", rank/alpha patterns, layers_to_transform, modules_to_save, a regex
// target_modules): an adapter is never approximated. Pure functions; block on file I/O.
#pragma once

#include <string>
#include <string_view>

#include "troupe/core/status.h"
#include "troupe/engine/lora.h"
#include "troupe/engine/model.h"

namespace troupe::engine {

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (model dtype) of a LoRA
// model; creates DIR. Fails for a model without LoRA.
Status SaveAdapter(const std::string& dir, const LlamaModel& model,
                   const std::string& base_model = "");
// Loads DIR's adapter into `model`: its config must equal the model's LoRA (r, alpha,
// target modules; dropout may differ) and every adapter tensor must be present with its
// shape. Nothing changes on error; the error names the file and the key or tensor.
Status LoadAdapter(const std::string& dir, LlamaModel& model);

}  // namespace troupe::engine
