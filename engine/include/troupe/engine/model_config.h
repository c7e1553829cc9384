// ModelConfig: the sizes and numerics of a Llama/Qwen-family decoder (torch-free).
//
// The launcher (which never includes torch) maps YAML onto this struct and
// calls Validate() before anything is spawned; the engine and the trainer
// build the same model from it. Field names follow Hugging Face's
// LlamaConfig/Qwen2Config/Qwen3Config where a counterpart exists;
// ModelConfigFromHfJson reads a Hugging Face `config.json` (refusing, by name,
// every key whose meaning Troupe does not implement) and ModelConfigToHfJson
// writes one that Hugging Face loads as the same model. Plain value type: copy
// freely, no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/engine/lora.h"

namespace troupe::config {
class Binder;
}

namespace troupe::engine {

// Storage dtype of the model's parameters (and of the KV cache). Logits and
// log-probs are always computed in float32.
enum class DType { kFloat32, kBFloat16, kFloat16 };

// "float32" | "bfloat16" | "float16".
const char* DTypeName(DType dtype);
// Parses the names above (also "fp32", "bf16", "fp16"); error names the value.
Result<DType> ParseDType(std::string_view name);

// RoPE frequency scaling (Hugging Face `rope_scaling`). Only Llama 3.1's "llama3" rule is
// implemented: wavelengths longer than original_max_position_embeddings / low_freq_factor are
// divided by `factor`, those shorter than .../high_freq_factor are kept, and the band between
// is interpolated smoothly. Attention is not rescaled (llama3's attention factor is 1).
struct RopeScaling {
  // "none" (default: plain RoPE) | "llama3".
  std::string type = "none";
  // How much longer the context is than in pre-training (Llama 3.2: 32, 3.1: 8). Default 8.
  double factor = 8.0;
  // Wavelength thresholds as fractions of the original context. Defaults 1 and 4 (Llama 3.1).
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // Context length of pre-training (Llama 3.x: 8192). Default 8192.
  int64_t original_max_position_embeddings = 8192;

  bool enabled() const { return type != "none"; }
};

struct ModelConfig {
  // The Hugging Face family: llama | qwen2 | qwen3 (config.json's model_type). Default llama.
  // qwen3 adds a per-head RMSNorm of queries and keys before RoPE (q_norm/k_norm); qwen2
  // always has q/k/v biases. Export writes it as model_type and architectures.
  std::string architecture = "llama";
  // Number of token ids the embedding and the output head cover. Default 32 (a
  // character vocabulary); must be >= the tokenizer's vocab_size().
  int64_t vocab_size = 32;
  // Width of the residual stream (hidden_size). Default 128.
  int64_t d_model = 128;
  // Number of decoder layers (num_hidden_layers). Default 2.
  int64_t n_layers = 2;
  // Query heads (num_attention_heads). Default 4; d_model % n_heads == 0 unless head_dim is set.
  int64_t n_heads = 4;
  // Key/value heads (num_key_value_heads) for grouped-query attention; must divide n_heads.
  // Default 2 (GQA: 2 query heads share a KV head). Fewer KV heads = smaller KV cache.
  int64_t n_kv_heads = 2;
  // Per-head width; 0 (default) means d_model / n_heads (Llama, Qwen2). Qwen3 sets it
  // explicitly (128), so n_heads * head_dim may differ from d_model.
  int64_t head_dim = 0;
  // Hidden width of the SwiGLU MLP (intermediate_size). Default 384 (~3x d_model).
  int64_t ffn_dim = 384;
  // Longest sequence (prompt + response) the model serves: RoPE table and KV cache length.
  // Default 128. Memory of the KV cache grows linearly with it.
  int64_t max_seq_len = 128;
  // Positions the checkpoint declares (config.json's max_position_embeddings), written back
  // on export; 0 (default) means max_seq_len. Does not change the math.
  int64_t max_position_embeddings = 0;
  // RoPE base frequency (rope_theta). Default 10000 (Llama-2); Qwen2/3 use 1e6, Llama 3 5e5.
  double rope_theta = 10000.0;
  // RoPE frequency scaling (rope_scaling). Default none.
  RopeScaling rope_scaling;
  // Epsilon inside RMSNorm (rms_norm_eps). Default 1e-5 (Llama); Qwen2/3 use 1e-6.
  double rms_norm_eps = 1e-5;
  // Output head shares the embedding matrix (no separate lm_head.weight). Default true:
  // saves vocab_size * d_model parameters; small models usually tie.
  bool tie_word_embeddings = true;
  // q/k/v projections carry biases (Qwen2: always; Llama/Qwen3: attention_bias). Default false.
  bool attention_bias = false;
  // Parameter and KV-cache dtype. Default float32 (exact log-prob parity with the learner);
  // bfloat16 halves memory and is faster on GPUs.
  DType dtype = DType::kFloat32;
  // Low-rank adapters (the job's `lora:` section; not part of a Hugging Face config.json).
  // Default off. With rank > 0 the base is frozen and only adapters train and travel.
  LoraConfig lora;

  // d_model / n_heads when head_dim == 0, else head_dim.
  int64_t HeadDim() const {
    return head_dim > 0 ? head_dim : (n_heads > 0 ? d_model / n_heads : 0);
  }
  // Qwen3's per-head q/k RMSNorm (q_norm, k_norm weights of head_dim each).
  bool QkNorm() const { return architecture == "qwen3"; }
  // max_position_embeddings, or max_seq_len when 0.
  int64_t DeclaredPositions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : max_seq_len;
  }
  // RoPE inverse frequencies inv_freq[i], i < HeadDim()/2, after rope_scaling, in double.
  std::vector<double> RopeInverseFrequencies() const;
  // Number of parameters the model has with this config (the base; adapters excluded).
  int64_t NumParameters() const;
  // Number of adapter parameters (0 without LoRA).
  int64_t NumAdapterParameters() const;
  // (in, out) features of LoRA module `module` (lora.h order: q k v o gate up down).
  std::pair<int64_t, int64_t> LoraDims(int module) const;
  // Every adapter tensor's PEFT name and shape ([r, in] lora_A, [out, r] lora_B), in the
  // order of LlamaModel::AdapterWeights(); empty without LoRA.
  std::vector<std::pair<std::string, std::vector<int64_t>>> AdapterShapes() const;
  // Checks every field; the error names the field, its value and the rule.
  Status Validate() const;
  // One-line summary for logs ("arch=llama layers=2 d_model=128 heads=4/2 ...").
  std::string ToString() const;
};

// The Hugging Face architecture class of a family ("llama" -> "LlamaForCausalLM"), or "".
const char* HfArchitectureClass(std::string_view architecture);

// Reads a Hugging Face config.json of a LlamaForCausalLM, Qwen2ForCausalLM or
// Qwen3ForCausalLM into a ModelConfig. Read: model_type, architectures, hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// vocab_size, max_position_embeddings, rope_theta, rope_scaling (none/default or llama3),
// rms_norm_eps, tie_word_embeddings, attention_bias, torch_dtype (or dtype). Checked to hold
// values that change nothing: hidden_act silu, mlp_bias false, attention_dropout 0,
// use_sliding_window false, layer_types all full_attention. Informational keys are
// accepted and ignored (bos/eos/pad_token_id, transformers_version, use_cache,
// initializer_range, pretraining_tp, max_window_layers, sliding_window, _name_or_path).
// Any other key is refused with an error naming it: Troupe never approximates a model.
// The result is validated. `max_seq_len_cap` > 0 caps max_seq_len (real checkpoints
// declare 32k+ positions; the KV cache needs less); max_position_embeddings keeps the
// declared value.
Result<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, int64_t max_seq_len_cap = 0);

// A config.json Hugging Face loads as this model: `base_json` (a config.json read with the
// model, "" for none) with every key ModelConfig owns replaced, so informational keys such
// as bos/eos_token_id survive. `stored_dtype` is the dtype of the weight files written next
// to it (torch_dtype). bos_id/eos_ids >= 0 / non-empty set bos_token_id/eos_token_id when
// the base has none. Keys are sorted (as Hugging Face writes them). Fails on an invalid
// config or a base that is not a JSON object.
Result<std::string> ModelConfigToHfJson(const ModelConfig& config, std::string_view base_json,
                                        DType stored_dtype, int32_t bos_id = -1,
                                        const std::vector<int32_t>& eos_ids = {});

// The YAML keys of these structs, each documented once (troupe/core/config_binder.h; the
// launcher binds job files with them, `troupe config-keys` lists them).
void Describe(config::Binder& b, ModelConfig& c);
void Describe(config::Binder& b, RopeScaling& c);

}  // namespace troupe::engine
