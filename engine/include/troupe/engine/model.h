// LlamaModel: a Llama 3 / Qwen2 / Qwen3-style decoder-only transformer in libtorch.
//
//   tokens ─▶ embed ─▶ [RMSNorm ─▶ GQA attention (RoPE) ─▶ + ─▶ RMSNorm ─▶ SwiGLU ─▶ +] × L
//          ─▶ RMSNorm ─▶ head (tied to embed, or lm_head) ─▶ float32 logits
//
// Family differences (ModelConfig): Qwen2 adds q/k/v biases, Qwen3 a per-head RMSNorm of
// queries and keys before RoPE (q_norm/k_norm), Llama 3.1+ scales RoPE frequencies
// (rope_scaling llama3); head_dim may differ from d_model / n_heads (Qwen3).
//
// One model serves two callers: the learner trains it through Forward()
// (autograd, full sequences), and the generation engine runs Prefill()/Decode()
// against a KvCache. Both paths compute the same function; tests check that
// incremental decoding reproduces Forward()'s log-probs within 1e-4 in fp32.
//
// Weights are exchanged under Hugging Face's parameter names
// (`model.layers.N.self_attn.q_proj.weight`, ...), so safetensors checkpoints of
// real Llama/Qwen2 models load, and so the learner, the weight broadcast and
// the rollout actors agree on one naming. Internally q/k/v and gate/up are each
// stored as one fused matrix (fewer, larger matmuls); NamedWeights() returns
// row-slices of them (contiguous views sharing storage) under the HF names.
//
// LoRA (config.lora.rank > 0, lora.h): every targeted projection gets an adapter
// (A [r, in], B [out, r]); the base is frozen and every path (Forward, Prefill,
// Step, Decode) computes W x + scale * B (A x). AdapterWeights() lists the adapters
// under PEFT's names (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`);
// SetMerged(true) folds them into the weights (kept equal to base + scale * B A
// across updates, from a private copy of the base) so generation runs at base speed.
//
// Thread-safety: a torch::nn::Module; concurrent Forward/Decode calls on one
// model are safe only if nobody mutates the weights meanwhile. The Engine
// serializes generation and weight updates with its own lock; the learner owns
// its model exclusively. Nothing here starts threads or blocks on I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "troupe/core/status.h"
#include "troupe/engine/model_config.h"

namespace troupe::engine {

// (Hugging Face name, tensor) pairs, in a stable order.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// torch dtype of a config dtype.
c10::ScalarType ToTorchDType(DType dtype);

// The key/value cache of generation: per layer one K and one V tensor of shape
// [num_slots, n_kv_heads, max_len, head_dim] in the model dtype on the model
// device, zero-initialised (so masked positions never hold NaN). A slot holds one
// sequence; position p of a slot holds the keys/values of token p. Allocated
// once (on the CPU, from 1 MiB per tensor, on transparent huge pages: memory.h);
// generation never reallocates it. Not thread-safe: one user at a time.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t num_slots, int64_t max_len, torch::Device device);

  int64_t num_slots() const { return num_slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  torch::Tensor& k(int64_t layer) { return k_[static_cast<size_t>(layer)]; }
  torch::Tensor& v(int64_t layer) { return v_[static_cast<size_t>(layer)]; }
  // Copies positions [0, len) of slots src[i] to slots dst[i] in every layer (group
  // sampling: G samples share one prompt prefill). src/dst: int64 [n] on the cache device.
  void CopySlots(const torch::Tensor& src, const torch::Tensor& dst, int64_t len);
  // Bytes held by the cache.
  int64_t bytes() const;

 private:
  int64_t num_slots_, max_len_;
  std::vector<torch::Tensor> k_, v_;
};

// Options of LoadNamed.
struct LoadOptions {
  // Cast floating tensors (F64/F32/BF16/F16) to the model dtype. Default true; false
  // requires exact dtypes. Integer or bool tensors never load into float parameters.
  bool allow_dtype_cast = true;
  // Every model parameter must be present. Default true; false allows partial updates.
  bool require_all = true;
  // Reject tensors holding NaN or Inf (one extra pass over the data). Default false.
  bool check_finite = false;
  // LoRA models: the tensors must include every adapter tensor (a rollout engine must never
  // keep generating with stale or initial adapters). Default false.
  bool require_adapters = false;
};

class LlamaModel : public torch::nn::Module {
 public:
  // Builds a model with random weights (normal(0, 0.02) matrices, unit norms), drawn
  // from `seed` on the CPU and then moved to `device`: the same seed gives the same
  // weights on every machine. The config must be valid (TROUPE_CHECK); use Create()
  // for a Status instead.
  explicit LlamaModel(const ModelConfig& config, uint64_t seed = 0,
                      torch::Device device = torch::kCPU);
  // Validates the config first; the error names the bad field.
  static Result<std::shared_ptr<LlamaModel>> Create(const ModelConfig& config, uint64_t seed = 0,
                                                    torch::Device device = torch::kCPU);
  // Parameters allocated but not initialised (their values are whatever the allocator
  // gives): only for a caller that overwrites every one before use, as LoadModel does
  // (drawing 600M random numbers that are replaced at once took most of a Qwen3-0.6B
  // load). The config must be valid (TROUPE_CHECK).
  struct Uninitialized {};
  LlamaModel(const ModelConfig& config, Uninitialized, torch::Device device = torch::kCPU);

  const ModelConfig& config() const { return config_; }
  torch::Device device() const;

  // Full-sequence forward: ids int64/int32 [B, T] with T <= max_seq_len, positions
  // 0..T-1 (right padding is harmless: attention is causal). Returns float32 logits
  // [B, T, vocab_size], differentiable w.r.t. the parameters. Throws c10::Error on
  // bad shapes or ids outside the vocabulary (use CheckTokens first for untrusted input).
  torch::Tensor Forward(const torch::Tensor& ids);
  // Forward without the output head: the final-normed hidden states [B, T, d_model]
  // (model dtype), differentiable. With HeadLogits, callers that need logits at a few
  // positions only (a learner scoring response tokens) skip the vocab_size x d_model matmul
  // everywhere else -- with a 150k-token vocabulary, most of a small model's compute.
  torch::Tensor ForwardHidden(const torch::Tensor& ids);
  // The final-normed hidden states at a few positions only: ids [B, T] as ForwardHidden,
  // row b's true length lengths[b] (int64 [B], in [1, T]; undefined: all T), and `rows`
  // (int64 [M]) positions b * T + t (t < lengths[b]) of ids.view(-1). Returns [M, d_model],
  // differentiable, equal to ForwardHidden(ids).view({-1, d}).index_select(0, rows) up to
  // float rounding. On the CPU in float32 (without q/k norms) it is the learner's fast path:
  // padding is dropped (sequences packed into token rows), RMSNorm, RoPE + causal attention
  // and SiLU * up run as fused autograd kernels (train_kernels.h), and the last layer's
  // output projection and MLP run at `rows` only. Elsewhere it is ForwardHidden's path.
  // Throws c10::Error naming the problem on bad lengths or rows.
  torch::Tensor ForwardHiddenRows(const torch::Tensor& ids, const torch::Tensor& lengths,
                                  const torch::Tensor& rows);
  // The output head (tied embedding or lm_head) on hidden rows [..., d_model]: float32
  // logits [..., vocab_size]. Forward(ids) == HeadLogits(ForwardHidden(ids)).
  torch::Tensor HeadLogits(const torch::Tensor& hidden) const;

  // Checks an id tensor for Forward/Prefill: 1-D or 2-D integer, at most max_seq_len long,
  // every id in [0, vocab_size). The error names the first offending id and position.
  Status CheckTokens(const torch::Tensor& ids) const;

  // Cache-aware prefill: runs ids [P, T] (row i right-padded, true length lengths[i] >= 1,
  // T <= cache.max_len()) through the model, writes keys/values of positions [0, T) into
  // cache slots `slots[i]`, and returns float32 logits [P, vocab] at position
  // lengths[i]-1 of each row. lengths and slots: int64 [P] on the model device.
  torch::Tensor Prefill(const torch::Tensor& ids, const torch::Tensor& lengths,
                        const torch::Tensor& slots, KvCache& cache);

  // Cache-aware decode step for slots 0..n-1: tokens[s] (int64 [n]) is at position
  // positions[s] (int64 [n]) of slot s; its key/value is written there and attention
  // covers positions [0, positions[s]]. attn_len must be >= max(positions)+1 (the
  // caller's scheduler knows it without a device sync). Returns float32 logits [n, V].
  // `fused_cpu` selects the fused CPU kernel (RoPE + cache write + attention in one pass,
  // float32/bfloat16/float16 on CPU); otherwise plain torch ops (any device).
  torch::Tensor Decode(const torch::Tensor& tokens, const torch::Tensor& positions,
                       int64_t attn_len, KvCache& cache, bool fused_cpu = true);

  // Packed step on the CPU (fused kernels; float32/bfloat16/float16): row r is token
  // tokens[r] at position positions[r] of cache slot slots[r] (all int64 [N], CPU). Decode
  // tokens and whole prompts can share one call: every row's key/value is written first,
  // then each row attends to positions [0, positions[r]] of its slot. No two rows may share
  // a (slot, position). Returns float32 logits [M, V] for the rows listed in logit_rows
  // (int64 [M]): the head runs only on those. This is what the Engine runs on CPU: newly
  // admitted prompts join the running decode batch in one forward.
  // copies (optional, int64 [C, 3]: source slot, destination slot, length): in each layer,
  // positions [0, length) of the source slot's key/value rows are copied to the destination
  // slot once this step wrote them: the samples of a group share their prompt's forward and
  // get its cache in the same pass (not a copy of every layer afterwards).
  torch::Tensor Step(const torch::Tensor& tokens, const torch::Tensor& slots,
                     const torch::Tensor& positions, const torch::Tensor& logit_rows,
                     KvCache& cache, const torch::Tensor& copies = {});

  // Every parameter under its Hugging Face name, in a fixed order: embed_tokens, then per
  // layer input_layernorm, q/k/v(/biases)/o_proj, q_norm/k_norm (Qwen3), post_attention_layernorm,
  // gate/up/down_proj, then model.norm and (untied only) lm_head. The tensors share
  // storage with the parameters (writes under torch::NoGradGuard change the model).
  NamedTensors NamedWeights() const;
  // LoRA adapters under PEFT's names, per layer q..down_proj, lora_A then lora_B; empty
  // without LoRA. Share storage with the parameters.
  NamedTensors AdapterWeights() const;
  // NamedWeights() followed by AdapterWeights(): everything a copy of this model needs.
  NamedTensors StateWeights() const;
  // The base weights with the adapters folded in (W + scale * B A; fresh tensors for the
  // targeted projections, shared storage for the rest): a model without LoRA computing the
  // same function. Equal to NamedWeights() without LoRA or when merged.
  NamedTensors MergedWeights() const;
  // Unmerged (default): adapters run beside the frozen weights. Merged: the weights hold
  // base + scale * B A (a private copy of the base is kept, so LoadNamed of base or adapter
  // tensors re-merges exactly). No-op without LoRA. Not for a model being trained.
  void SetMerged(bool merged);
  bool merged() const { return merged_; }
  // LoRA models: whether the base weights train (requires_grad). Default false; the
  // learner's full warm start turns it on, then off. Adapters always train.
  void SetBaseTrainable(bool trainable);

  // Copies named tensors into the parameters. Fails, changing nothing, on the first
  // problem in input order (an unknown name, a duplicate, a shape mismatch, a dtype the
  // options do not allow, a non-finite value when options.check_finite), then on the
  // first missing parameter in NamedWeights() order when options.require_all. The error
  // names the tensor and both shapes/dtypes. Copies across devices when needed.
  // `rotary_emb.inv_freq` buffers found in old checkpoints are ignored.
  // Adapter tensors (PEFT names) load the same way; options.require_all then asks for
  // every base tensor only when some base tensor is given (an adapter-only update is
  // whole), and options.require_adapters for every adapter tensor. A model without LoRA
  // refuses adapter tensors by name.
  Status LoadNamed(const NamedTensors& named, const LoadOptions& options = {});

  // Re-draws every parameter from `seed` (normal(0, std) matrices, unit norm weights).
  void InitRandom(uint64_t seed, double std = 0.02);

 private:
  void Allocate(const ModelConfig& config);  // registers every parameter and buffer
  struct Layer {
    torch::Tensor input_norm, qkv_w, qkv_b, o_w, q_norm, k_norm, post_norm, gate_up_w, down_w;
    // LoRA adapters by module (lora.h order); undefined where not targeted.
    torch::Tensor lora_a[kNumLoraModules], lora_b[kNumLoraModules];
    // Merged mode: the pure base of each targeted module's weight rows.
    torch::Tensor lora_base[kNumLoraModules];
  };
  // The fused matrices adapters attach to: q/k/v rows of qkv_w, o_w, gate/up rows of
  // gate_up_w, down_w.
  enum Fused { kQkv, kO, kGateUp, kDown };
  // Weight rows of `module` inside its fused matrix (a view).
  torch::Tensor ModuleWeight(const Layer& layer, int module) const;
  // Adds scale * B (A x) of the adapters on `fused` to their output columns of y (the
  // fused projection of x, possibly plus a residual), in place; returns y. No-op without
  // LoRA, merged, or with none of its modules targeted.
  torch::Tensor WithLora(const Layer& layer, Fused fused, const torch::Tensor& x,
                         torch::Tensor y) const;
  void InitAdapters(uint64_t seed);
  void DrawBase(uint64_t seed, double std);
  void Remerge();  // merged mode: weight rows = base copy + scale * B A
  torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w) const;
  torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos,
                     const torch::Tensor& sin) const;
  // fused: the SiLU * up of train_kernels.h (float32 CPU rows [n, d] only).
  torch::Tensor Mlp(const Layer& layer, const torch::Tensor& x, bool fused = false) const;
  // Whether ForwardHiddenRows takes its fused path (see there).
  bool FusedTrainingPath() const;
  torch::Tensor Head(const torch::Tensor& x) const;
  // Runs the layers over x [B, T, D] at positions 0..T-1; when cache/slots are given,
  // writes K/V of the T positions into those slots.
  torch::Tensor RunLayers(torch::Tensor x, KvCache* cache, const torch::Tensor& slots);

  ModelConfig config_;
  int64_t head_dim_, q_size_, kv_size_;
  bool merged_ = false;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  torch::Tensor rope_cos_, rope_sin_;  // float32 [max_seq_len, head_dim/2]
};

}  // namespace troupe::engine
