// Fused CPU kernels of the decode step (private to engine/).
//
// A decode step of a small model pays per-op overhead on every element-wise op, so
// the element-wise parts of a layer run as single raw loops: RMSNorm, SiLU*up,
// and RoPE + KV-cache write + attention over the cache (for decode and prompt
// tokens packed into one batch). Matmuls stay in BLAS. All kernels accept float32, bfloat16 and
// float16 tensors and compute in float32. Inputs must be contiguous CPU tensors (checked with
// TORCH_CHECK). Work is split over rows with at::parallel_for (the calling thread's intra-op pool);
// kernels allocate only small per-chunk scratch.
#pragma once

#include <ATen/core/Tensor.h>

namespace troupe::engine::cpu {

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), rows of x [n, d]. Returns a new tensor.
at::Tensor RmsNormRows(const at::Tensor& x, const at::Tensor& w, double eps);

// gu [n, 2f] = [gate | up] -> silu(gate) * up [n, f].
at::Tensor SiluMulRows(const at::Tensor& gu);

// Attention for a packed batch of token rows (decode tokens and prompt tokens mixed): row r
// of qkv [N, (H + 2*Hkv) * hd] is the token at position positions[r] of cache slot slots[r].
// Phase 1 rotates q (in place, rounded to the dtype) and k at their positions (cos/sin
// float32 [max_len, hd/2], rotate-half layout) and writes k and v into k_cache/v_cache
// [S, Hkv, L, hd]; phase 2 writes softmax(q k^T / sqrt(hd)) v over positions
// [0, positions[r]] of slot slots[r] to out [N, H * hd]. So a prompt's rows may arrive in one
// call: each attends to the keys the same call wrote before it in its sequence. Query head h
// reads KV head h / (H / Hkv). Precondition: no two rows share a (slot, position).
// Qwen3: when q_norm / k_norm ([hd] each, the model dtype) are defined, every query and key
// head is RMS-normalised with them (epsilon `eps`, rounded like RmsNormRows) before RoPE.
// Shared prompts: when copies (int64 [C, 3] rows of source slot, destination slot, length) is
// defined, positions [0, length) of each source slot's keys and values are copied to its
// destination slot right after this call wrote them, before attention: the other samples of a
// group get their prompt's cache in the same pass over the layer, while it is in cache, instead
// of a copy of every layer afterwards.
void PackedAttention(at::Tensor& qkv, const at::Tensor& slots, const at::Tensor& positions,
                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     at::Tensor& out, const at::Tensor& q_norm = {},
                     const at::Tensor& k_norm = {}, double eps = 1e-6,
                     const at::Tensor& copies = {});

}  // namespace troupe::engine::cpu
