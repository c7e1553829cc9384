// Fused CPU kernels of the training forward and backward (private to engine/).
//
// A learner step of a small model is dominated by per-op costs, not by its matmuls: under
// autograd every element-wise op of RMSNorm, RoPE, attention and SiLU*up is a kernel launch,
// an allocation and a graph node forward, and two or three more backward. These autograd
// functions run each block as one loop forward and one loop backward, on float32 CPU tensors
// (callers fall back to the module path otherwise); RMSNorm's and SiLU*up's forwards are the
// decode step's kernels (cpu_kernels.h). Matmuls stay in BLAS. Every function
// returns a tensor differentiable in its tensor inputs; kernels run on the calling thread
// (the learner's update threads run their shares side by side) and are deterministic.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace troupe::engine::cpu {

// y[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) over the rows of x [n, d]; float32.
at::Tensor RmsNormTrain(const at::Tensor& x, const at::Tensor& w, double eps);

// gu [n, 2f] = [gate | up] -> silu(gate) * up [n, f]; float32.
at::Tensor SiluMulTrain(const at::Tensor& gu);

// Causal self-attention of packed sequences. qkv [N, (H + 2*Hkv) * hd] (float32) holds the
// query, key and value heads of N token rows; sequence s is rows [offsets[s], offsets[s+1])
// (offsets: int64 CPU [S+1], 0 first, N last, non-decreasing), its row t at position t.
// Queries and keys are rotated at their positions (cos/sin float32 [max_len, hd/2],
// rotate-half layout, as the module path), and row t of a sequence attends to rows 0..t of
// the same sequence only. Query head h reads KV head h / (H / Hkv). Returns [N, H * hd].
at::Tensor PackedCausalAttentionTrain(const at::Tensor& qkv, const at::Tensor& offsets,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

}  // namespace troupe::engine::cpu
