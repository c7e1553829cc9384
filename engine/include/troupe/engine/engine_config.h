// Generation settings (torch-free): the engine's config and per-request sampling.
//
// The launcher maps YAML onto these structs and calls Validate() before it
// spawns anything; rollout actors pass them to troupe::engine::Engine. Plain
// value types; no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/engine/model_config.h"

namespace troupe::engine {

// How one request is sampled.
struct SamplingParams {
  // Softmax temperature. Default 1.0 (the policy itself). 0 = greedy (argmax); its recorded
  // log-prob is then the temperature-1 value. Must be finite and >= 0.
  double temperature = 1.0;
  // Keep only the k most likely tokens; 0 (default) = off.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose mass reaches top_p; 1.0 (default) = off.
  // Must be in (0, 1].
  double top_p = 1.0;
  // New tokens to generate at most (per sample). Default 16. The sequence also stops when the
  // KV cache row is full (finish reason "length").
  int32_t max_new_tokens = 16;
  // Generation stops after sampling any of these (the stop token is kept in the response,
  // with its log-prob, and trained on). Usually {tokenizer.eos_id()}. Default empty.
  std::vector<int32_t> stop_token_ids;
  // Samples drawn for this prompt (the G of GRPO). They share one prompt prefill. Default 1.
  int32_t num_samples = 1;
  // Seed of this request's sampler: same seed + same weights + same prompt = same tokens.
  // Sample j of the request uses the stream derived from (seed, j).
  uint64_t seed = 0;

  // Checks every field; the error names the field and the value.
  Status Validate() const;
};

// Slot refill policy (see EngineConfig::batching).
enum class Batching { kContinuous, kStatic, kStaticPadded };

// Where the model and the KV cache live.
struct EngineConfig {
  // The policy model's sizes.
  ModelConfig model;
  // KV-cache slots = sequences decoded concurrently. Default 128 (one GRPO batch of the default
  // job: 16 prompts x 8 samples). More slots = bigger decode batches (better throughput)
  // and more memory: 2 * layers * slots * kv_heads * max_seq_len * head_dim * dtype bytes.
  int32_t num_slots = 128;
  // Cache length per slot (prompt + response); 0 (default) = model.max_seq_len. Must be
  // <= model.max_seq_len. Prompts of this length or longer are rejected.
  int32_t max_seq_len = 0;
  // Intra-op threads of the engine thread's torch ops and kernels; 0 = leave the default.
  // When OpenBLAS is the BLAS, its (process-wide) thread count is set to the same value.
  // Default 1: rollout actors share few cores with other processes (see docs/engine.md for
  // the 1 vs 2 measurement); larger models on idle cores gain from more.
  int32_t intra_op_threads = 1;
  // "cpu" (default) or "cuda" / "cuda:N". CUDA needs a CUDA-enabled libtorch.
  std::string device = "cpu";
  // Upper bound on prompt tokens (rows x padded length) in one batched prefill; longer
  // queues are prefilled in several steps. Default 8192. Bounds the prefill's activations.
  int32_t max_prefill_tokens = 8192;
  // Use the fused CPU decode kernels (RoPE + cache write + attention in one pass). Default
  // true; false runs plain torch ops (the path CUDA uses), e.g. to compare the two.
  bool fused_cpu_kernels = true;
  // LoRA models: fold the adapters into the weights (W = base + scale * B A, recomputed from a
  // private copy of the base at every weight update) instead of running them beside the
  // frozen weights at every step. Default true: `lora_bench` measured merged generation
  // 1.7-2.75x the unmerged tokens/s on the default model and 1.1-1.24x on an 8-layer d512 one
  // (batch 128), for 2.5 / 30 ms per update and one more copy of the adapted matrices
  // (README, LoRA rows).
  bool lora_merged = true;
  // Seed of the initial random weights when no model is passed in. Default 0.
  uint64_t init_seed = 0;
  // How slots are refilled. kContinuous (default): a finished slot is refilled at the next
  // step. kStatic and kStaticPadded are benchmark baselines: new sequences are admitted only
  // when the whole previous wave has finished; kStaticPadded also keeps computing finished
  // rows (fed PAD, results unchanged) until the wave ends, like padded batch generation.
  Batching batching = Batching::kContinuous;

  // Cache length actually used.
  int32_t CacheLen() const {
    return max_seq_len > 0 ? max_seq_len : static_cast<int32_t>(model.max_seq_len);
  }
  // Validates the model config and every field here.
  Status Validate() const;
};

// Checks a device name as the config takes one: "cpu", "cuda" or "cuda:N". The error names
// `key` (engine.device, trainer.device) and the value.
Status ValidateDeviceName(std::string_view key, const std::string& device);

}  // namespace troupe::engine
