// Fused CPU kernels of the decode step (private to engine/).
//
// A decode step of a small model is dominated by per-op overhead, not FLOPs, so
// the element-wise parts of a layer run as single raw loops: RMSNorm, SiLU*up,
// and RoPE + KV-cache write + attention over the cache. Matmuls stay in
// BLAS. All kernels accept float32, bfloat16 and float16 tensors and compute in
// float32. Inputs must be contiguous CPU tensors (checked with TORCH_CHECK).
// Work is split over rows with at::parallel_for (the calling thread's intra-op
// pool); kernels allocate only small per-chunk scratch.
#pragma once

#include <ATen/core/Tensor.h>

namespace troupe::engine::cpu {

// out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), rows of x [n, d]. Returns a new tensor.
at::Tensor RmsNormRows(const at::Tensor& x, const at::Tensor& w, double eps);

// gu [n, 2f] = [gate | up] -> silu(gate) * up [n, f].
at::Tensor SiluMulRows(const at::Tensor& gu);

// One decode step of attention for rows s = 0..n-1 of qkv [n, (H + 2*Hkv) * hd]:
// rotates q and k at positions[s] (cos/sin float32 [max_len, hd/2], rotate-half layout),
// writes k and v into k_cache/v_cache [S, Hkv, L, hd] at (slot s, position positions[s]),
// and writes softmax(q k^T / sqrt(hd)) v over cache positions [0, positions[s]] to
// out [n, H * hd]. Query head h reads KV head h / (H / Hkv).
void DecodeAttention(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                     const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, at::Tensor& out);

}  // namespace troupe::engine::cpu
