#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace troupe::engine::cpu {
namespace {

void CheckRows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() == 2, what,
              " must be a contiguous 2-D CPU tensor, got ", t.sizes(), " on ", t.device());
}

// Arguments of the attention phase of PackedAttention.
template <typename scalar_t>
struct AttendArgs {
  const scalar_t* qkv;  // [n, (H + 2*Hkv) * hd], q already rotated
  const scalar_t* k_cache;
  const scalar_t* v_cache;
  scalar_t* out;  // [n, H * hd]
  const int64_t* positions;
  const int64_t* slots;
  int64_t n_heads, n_kv_heads, head_dim, max_len;
  float scale;
};

// In place: x[i] = w[i] * (x[i] / sqrt(mean(x^2) + eps)), with the rounding of RmsNormRows
// (normalise in float32, round to the dtype, scale, round).
template <typename scalar_t>
void HeadRmsNorm(scalar_t* x, const scalar_t* w, int64_t hd, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < hd; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
  for (int64_t i = 0; i < hd; ++i) {
    scalar_t normed = static_cast<scalar_t>(static_cast<float>(x[i]) * inv);
    x[i] = static_cast<scalar_t>(static_cast<float>(normed) * static_cast<float>(w[i]));
  }
}

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

}  // namespace

// The attention loop, compiled twice: for AVX2+FMA (picked at run time when the CPU has them)
// and for the baseline ISA.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "attend_rows.inc"
}  // namespace avx2
#pragma GCC pop_options
namespace generic {
#include "attend_rows.inc"
}  // namespace generic

at::Tensor RmsNormRows(const at::Tensor& x, const at::Tensor& w, double eps) {
  CheckRows(x, "RmsNormRows input");
  const int64_t n = x.size(0), d = x.size(1);
  TORCH_CHECK(w.numel() == d && w.is_contiguous() && w.scalar_type() == x.scalar_type());
  at::Tensor out = at::empty({n, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "RmsNormRows", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* xr = xp + r * d;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t i = 0;
        for (; i + 8 <= d; i += 8)
          for (int j = 0; j < 8; ++j) {
            float v = static_cast<float>(xr[i + j]);
            acc[j] += v * v;
          }
        float ss =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < d; ++i) ss += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + static_cast<float>(eps));
        scalar_t* orow = op + r * d;
        for (i = 0; i < d; ++i) {
          // Same rounding order as the module path: normalise, cast to dtype, scale.
          scalar_t normed = static_cast<scalar_t>(static_cast<float>(xr[i]) * inv);
          orow[i] = static_cast<scalar_t>(static_cast<float>(normed) * static_cast<float>(wp[i]));
        }
      }
    });
  });
  return out;
}

at::Tensor SiluMulRows(const at::Tensor& gu) {
  CheckRows(gu, "SiluMulRows input");
  const int64_t n = gu.size(0), f = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) == 2 * f);
  at::Tensor out = at::empty({n, f}, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "SiluMulRows", [&] {
    const scalar_t* gp = gu.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* g = gp + r * 2 * f;
        const scalar_t* u = g + f;
        scalar_t* o = op + r * f;
        for (int64_t i = 0; i < f; ++i) {
          float gv = static_cast<float>(g[i]);
          scalar_t act = static_cast<scalar_t>(gv / (1.0f + std::exp(-gv)));
          o[i] = static_cast<scalar_t>(static_cast<float>(act) * static_cast<float>(u[i]));
        }
      }
    });
  });
  return out;
}

void PackedAttention(at::Tensor& qkv, const at::Tensor& slots, const at::Tensor& positions,
                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     at::Tensor& out, const at::Tensor& q_norm, const at::Tensor& k_norm,
                     double eps, const at::Tensor& copies) {
  CheckRows(qkv, "PackedAttention qkv");
  CheckRows(out, "PackedAttention out");
  const int64_t n = qkv.size(0), hd = head_dim, half = hd / 2;
  const int64_t q_size = n_heads * hd, kv_size = n_kv_heads * hd, width = q_size + 2 * kv_size;
  TORCH_CHECK(qkv.size(1) == width, "qkv width ", qkv.size(1));
  TORCH_CHECK(out.size(0) == n && out.size(1) == q_size);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4);
  TORCH_CHECK(k_cache.size(1) == n_kv_heads && k_cache.size(3) == hd);
  TORCH_CHECK(k_cache.scalar_type() == qkv.scalar_type() && out.scalar_type() == qkv.scalar_type());
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == n &&
              positions.is_contiguous());
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == n && slots.is_contiguous());
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.size(1) == half);
  TORCH_CHECK(q_norm.defined() == k_norm.defined(), "q_norm and k_norm come together");
  const bool qk_norm = q_norm.defined();
  if (qk_norm) {
    for (const at::Tensor* w : {&q_norm, &k_norm})
      TORCH_CHECK(w->numel() == hd && w->is_contiguous() && w->scalar_type() == qkv.scalar_type(),
                  "q/k norm weights must be contiguous [", hd, "] in the qkv dtype");
  }
  const float feps = static_cast<float>(eps);
  const int64_t num_slots = k_cache.size(0), max_len = k_cache.size(2);
  const int64_t group = n_heads / n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t* pos_p = positions.data_ptr<int64_t>();
  const int64_t* slot_p = slots.data_ptr<int64_t>();
  const float* cos_p = cos.data_ptr<float>();
  const float* sin_p = sin.data_ptr<float>();
  const int64_t* cp = nullptr;
  int64_t n_copies = 0;
  if (copies.defined() && copies.numel() > 0) {
    TORCH_CHECK(copies.scalar_type() == at::kLong && copies.is_contiguous() && copies.dim() == 2 &&
                    copies.size(1) == 3,
                "PackedAttention: copies must be int64 [C, 3] (source slot, destination slot, "
                "length)");
    cp = copies.data_ptr<int64_t>();
    n_copies = copies.size(0);
    for (int64_t c = 0; c < n_copies; ++c) {
      const int64_t* x = cp + 3 * c;
      TORCH_CHECK(x[0] >= 0 && x[0] < num_slots && x[1] >= 0 && x[1] < num_slots && x[0] != x[1],
                  "PackedAttention: copy ", c, " from slot ", x[0], " to slot ", x[1],
                  " outside [0, ", num_slots, ") or onto itself");
      TORCH_CHECK(x[2] >= 0 && x[2] <= max_len, "PackedAttention: copy ", c, " of ", x[2],
                  " positions outside the cache length ", max_len);
    }
  }
  int64_t longest = 0;
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(pos_p[r] >= 0 && pos_p[r] < max_len && pos_p[r] < cos.size(0), "position ",
                pos_p[r], " of row ", r, " outside the cache length ", max_len);
    TORCH_CHECK(slot_p[r] >= 0 && slot_p[r] < num_slots, "slot ", slot_p[r], " of row ", r,
                " outside [0, ", num_slots, ")");
    longest = std::max(longest, pos_p[r] + 1);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, qkv.scalar_type(), "PackedAttention", [&] {
        scalar_t* qkv_p = qkv.data_ptr<scalar_t>();
        scalar_t* kc = k_cache.data_ptr<scalar_t>();
        scalar_t* vc = v_cache.data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        const scalar_t* qn = qk_norm ? q_norm.data_ptr<scalar_t>() : nullptr;
        const scalar_t* kn = qk_norm ? k_norm.data_ptr<scalar_t>() : nullptr;
        // Phase 1: (q/k norm and) RoPE on q (in place) and k; k and v into the cache.
        at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
          std::vector<scalar_t> knormed(qk_norm ? static_cast<size_t>(hd) : 0);
          for (int64_t r = begin; r < end; ++r) {
            const int64_t pos = pos_p[r], slot = slot_p[r];
            const float* c = cos_p + pos * half;
            const float* sn = sin_p + pos * half;
            scalar_t* row = qkv_p + r * width;
            for (int64_t h = 0; h < n_heads; ++h) {
              scalar_t* x = row + h * hd;
              if (qn != nullptr) HeadRmsNorm(x, qn, hd, feps);
              for (int64_t i = 0; i < half; ++i) {
                const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[half + i]);
                x[i] = static_cast<scalar_t>(x1 * c[i] - x2 * sn[i]);
                x[half + i] = static_cast<scalar_t>(x2 * c[i] + x1 * sn[i]);
              }
            }
            for (int64_t h = 0; h < n_kv_heads; ++h) {
              const scalar_t* x = row + q_size + h * hd;
              if (kn != nullptr) {
                std::copy(x, x + hd, knormed.data());
                HeadRmsNorm(knormed.data(), kn, hd, feps);
                x = knormed.data();
              }
              const scalar_t* xv = row + q_size + kv_size + h * hd;
              scalar_t* kd = kc + ((slot * n_kv_heads + h) * max_len + pos) * hd;
              scalar_t* vd = vc + ((slot * n_kv_heads + h) * max_len + pos) * hd;
              for (int64_t i = 0; i < half; ++i) {
                const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[half + i]);
                kd[i] = static_cast<scalar_t>(x1 * c[i] - x2 * sn[i]);
                kd[half + i] = static_cast<scalar_t>(x2 * c[i] + x1 * sn[i]);
              }
              std::copy(xv, xv + hd, vd);
            }
          }
        });
        // The shared prompts' cache rows, copied while they are still in cache.
        at::parallel_for(0, n_copies, 1, [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c) {
            const int64_t src = cp[3 * c], dst = cp[3 * c + 1], len = cp[3 * c + 2];
            for (int64_t h = 0; h < n_kv_heads; ++h) {
              const int64_t from = (src * n_kv_heads + h) * max_len * hd;
              const int64_t to = (dst * n_kv_heads + h) * max_len * hd;
              std::copy(kc + from, kc + from + len * hd, kc + to);
              std::copy(vc + from, vc + from + len * hd, vc + to);
            }
          }
        });
        // Phase 2: attention over each row's slot, positions [0, pos].
        AttendArgs<scalar_t> args{qkv_p,   kc,         vc, op,      pos_p, slot_p,
                                  n_heads, n_kv_heads, hd, max_len, scale};
        at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
          std::vector<float> q(static_cast<size_t>(hd)), acc(static_cast<size_t>(hd));
          std::vector<float> scores(static_cast<size_t>(group * longest));
          if (HasAvx2Fma())
            avx2::AttendRows(begin, end, args, q.data(), scores.data(), acc.data());
          else
            generic::AttendRows(begin, end, args, q.data(), scores.data(), acc.data());
        });
      });
}

}  // namespace troupe::engine::cpu
