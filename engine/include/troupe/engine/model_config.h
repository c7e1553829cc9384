// ModelConfig: the sizes and numerics of a Llama-style decoder (torch-free).
//
// The launcher (which never includes torch) maps YAML onto this struct and
// calls Validate() before anything is spawned; the engine and the trainer
// build the same model from it. Field names follow Hugging Face's
// LlamaConfig/Qwen2Config where a counterpart exists, and ModelConfigFromHfJson
// reads a Hugging Face `config.json`. Plain value type: copy freely, no
// thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/core/status.h"

namespace troupe::engine {

// Storage dtype of the model's parameters (and of the KV cache). Logits and
// log-probs are always computed in float32.
enum class DType { kFloat32, kBFloat16, kFloat16 };

// "float32" | "bfloat16" | "float16".
const char* DTypeName(DType dtype);
// Parses the names above (also "fp32", "bf16", "fp16"); error names the value.
Result<DType> ParseDType(std::string_view name);

struct ModelConfig {
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
  // Per-head width; 0 (default) means d_model / n_heads (Llama, Qwen2).
  int64_t head_dim = 0;
  // Hidden width of the SwiGLU MLP (intermediate_size). Default 384 (~3x d_model).
  int64_t ffn_dim = 384;
  // Longest sequence (prompt + response) the model serves: RoPE table and KV cache length.
  // Default 128. Memory of the KV cache grows linearly with it.
  int64_t max_seq_len = 128;
  // RoPE base frequency (rope_theta). Default 10000 (Llama-2); Qwen2 uses 1e6.
  double rope_theta = 10000.0;
  // Epsilon inside RMSNorm (rms_norm_eps). Default 1e-5 (Llama-2); Qwen2 uses 1e-6.
  double rms_norm_eps = 1e-5;
  // Output head shares the embedding matrix (no separate lm_head.weight). Default true:
  // saves vocab_size * d_model parameters; small models usually tie.
  bool tie_word_embeddings = true;
  // q/k/v projections carry biases (Qwen2: true; Llama: false). Default false.
  bool attention_bias = false;
  // Parameter and KV-cache dtype. Default float32 (exact log-prob parity with the learner);
  // bfloat16 halves memory and is faster on GPUs.
  DType dtype = DType::kFloat32;

  // d_model / n_heads when head_dim == 0, else head_dim.
  int64_t HeadDim() const {
    return head_dim > 0 ? head_dim : (n_heads > 0 ? d_model / n_heads : 0);
  }
  // Number of parameters the model has with this config.
  int64_t NumParameters() const;
  // Checks every field; the error names the field, its value and the rule.
  Status Validate() const;
  // One-line summary for logs ("layers=2 d_model=128 heads=4/2 ffn=384 vocab=32 ...").
  std::string ToString() const;
};

// Reads a Hugging Face config.json (LlamaForCausalLM / Qwen2ForCausalLM style) into a
// ModelConfig: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, intermediate_size, vocab_size, max_position_embeddings, rope_theta,
// rms_norm_eps, tie_word_embeddings, attention_bias (true for Qwen2 when absent),
// torch_dtype. Rejects rope_scaling (not implemented) and non-numeric fields with an
// error naming the key. The result is validated. `max_seq_len_cap` > 0 caps
// max_position_embeddings (real checkpoints declare 32k+ positions; the cache needs less).
Result<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, int64_t max_seq_len_cap = 0);

}  // namespace troupe::engine
