#include "train_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cpu_kernels.h"

namespace troupe::engine::cpu {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void CheckFloatRows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, what,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.dim() == 2, what, " must be 2-D [rows, width], got ", t.sizes());
}

// Eight partial sums, so that the compiler vectorises the loop (a single float accumulator
// fixes the order of the additions and keeps it scalar).
float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// ------------------------------------------------------------------ RMSNorm

// Forward: the decode step's kernel (cpu_kernels.h); the backward recomputes each row's
// 1 / rms (one dot product) instead of keeping it.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w,
                            double eps) {
    const at::Tensor x = x_in.contiguous();
    ctx->save_for_backward({x, w});
    ctx->saved_data["eps"] = eps;
    return RmsNormRows(x, w, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const float eps = static_cast<float>(ctx->saved_data["eps"].toDouble());
    const at::Tensor dy = grads[0].contiguous();
    const int64_t n = x.size(0), d = x.size(1);
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor dx = want_x ? at::empty({n, d}, x.options()) : at::Tensor();
    at::Tensor dw = want_w ? at::zeros({d}, x.options()) : at::Tensor();
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* gp = dy.data_ptr<float>();
    float* dxp = want_x ? dx.data_ptr<float>() : nullptr;
    float* dwp = want_w ? dw.data_ptr<float>() : nullptr;
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = xp + r * d;
      const float* gr = gp + r * d;
      const float ir = 1.0f / std::sqrt(Dot(xr, xr, d) / static_cast<float>(d) + eps);
      if (dwp != nullptr)
        for (int64_t i = 0; i < d; ++i) dwp[i] += gr[i] * xr[i] * ir;
      if (dxp == nullptr) continue;
      // y_i = w_i x_i r, r = (mean(x^2) + eps)^-1/2:
      // dx_k = r w_k g_k - x_k r^3 / d * sum_i g_i w_i x_i.
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= d; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += gr[i + j] * wp[i + j] * xr[i + j];
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; i < d; ++i) s += gr[i] * wp[i] * xr[i];
      const float c = s * ir * ir * ir / static_cast<float>(d);
      float* dr = dxp + r * d;
      for (i = 0; i < d; ++i) dr[i] = ir * wp[i] * gr[i] - c * xr[i];
    }
    return {dx, dw, at::Tensor()};
  }
};

// ------------------------------------------------------------------ SiLU * up

// Forward: the decode step's kernel (cpu_kernels.h).
struct SiluMulFn : public torch::autograd::Function<SiluMulFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gu_in) {
    const at::Tensor gu = gu_in.contiguous();
    ctx->save_for_backward({gu});
    return SiluMulRows(gu);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gu = ctx->get_saved_variables()[0];
    const at::Tensor da = grads[0].contiguous();
    const int64_t n = gu.size(0), f = gu.size(1) / 2;
    at::Tensor dgu = at::empty({n, 2 * f}, gu.options());
    const float* gp = gu.data_ptr<float>();
    const float* ap = da.data_ptr<float>();
    float* dp = dgu.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      const float* g = gp + r * 2 * f;
      const float* u = g + f;
      const float* a = ap + r * f;
      float* dg = dp + r * 2 * f;
      float* du = dg + f;
      for (int64_t i = 0; i < f; ++i) {
        const float s = 1.0f / (1.0f + std::exp(-g[i]));
        du[i] = a[i] * g[i] * s;
        dg[i] = a[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
      }
    }
    return {dgu};
  }
};

// ------------------------------------------------------------------ attention

// Rotate-half RoPE of one head at a position: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
void Rotate(const float* x, const float* c, const float* s, int64_t half, float* out) {
  for (int64_t i = 0; i < half; ++i) {
    out[i] = x[i] * c[i] - x[half + i] * s[i];
    out[half + i] = x[half + i] * c[i] + x[i] * s[i];
  }
}

// The transpose of Rotate (its inverse), added into out.
void UnrotateAdd(const float* g, const float* c, const float* s, int64_t half, float* out) {
  for (int64_t i = 0; i < half; ++i) {
    out[i] += g[i] * c[i] + g[half + i] * s[i];
    out[half + i] += g[half + i] * c[i] - g[i] * s[i];
  }
}

struct Shape {
  int64_t n, heads, kv_heads, hd, width, q_off, k_off, v_off;
};

Shape ShapeOf(const at::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  Shape s;
  s.n = qkv.size(0);
  s.heads = n_heads;
  s.kv_heads = n_kv_heads;
  s.hd = head_dim;
  s.width = (n_heads + 2 * n_kv_heads) * head_dim;
  s.q_off = 0;
  s.k_off = n_heads * head_dim;
  s.v_off = (n_heads + n_kv_heads) * head_dim;
  return s;
}

struct AttentionFn : public torch::autograd::Function<AttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv_in,
                            const at::Tensor& offsets, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t n_heads, int64_t n_kv_heads,
                            int64_t head_dim) {
    const at::Tensor qkv = qkv_in.contiguous();
    const Shape sh = ShapeOf(qkv, n_heads, n_kv_heads, head_dim);
    const int64_t S = offsets.numel() - 1, half = sh.hd / 2, G = sh.heads / sh.kv_heads;
    const int64_t* off = offsets.data_ptr<int64_t>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    const float* x = qkv.data_ptr<float>();
    // Rotated queries and keys [N, heads, hd], kept for the backward.
    at::Tensor qr = at::empty({sh.n, sh.heads, sh.hd}, qkv.options());
    at::Tensor kr = at::empty({sh.n, sh.kv_heads, sh.hd}, qkv.options());
    float* qrp = qr.data_ptr<float>();
    float* krp = kr.data_ptr<float>();
    // Softmax probabilities of every (sequence, head): an L x L block each, lower triangle.
    int64_t p_size = 0;
    for (int64_t s = 0; s < S; ++s) p_size += sh.heads * (off[s + 1] - off[s]) * (off[s + 1] - off[s]);
    at::Tensor probs = at::empty({p_size}, qkv.options());
    float* pp = probs.data_ptr<float>();
    at::Tensor out = at::zeros({sh.n, sh.heads * sh.hd}, qkv.options());
    float* op = out.data_ptr<float>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    int64_t p_base = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t o = off[s], L = off[s + 1] - off[s];
      for (int64_t t = 0; t < L; ++t) {
        const float* c = cp + t * half;
        const float* sn = sp + t * half;
        const float* row = x + (o + t) * sh.width;
        for (int64_t h = 0; h < sh.heads; ++h)
          Rotate(row + sh.q_off + h * sh.hd, c, sn, half, qrp + ((o + t) * sh.heads + h) * sh.hd);
        for (int64_t h = 0; h < sh.kv_heads; ++h)
          Rotate(row + sh.k_off + h * sh.hd, c, sn, half,
                 krp + ((o + t) * sh.kv_heads + h) * sh.hd);
      }
      for (int64_t h = 0; h < sh.heads; ++h) {
        const int64_t kvh = h / G;
        float* P = pp + p_base + h * L * L;
        for (int64_t i = 0; i < L; ++i) {
          const float* qi = qrp + ((o + i) * sh.heads + h) * sh.hd;
          float* Pi = P + i * L;
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            Pi[j] = Dot(qi, krp + ((o + j) * sh.kv_heads + kvh) * sh.hd, sh.hd) * scale;
            m = std::max(m, Pi[j]);
          }
          float sum = 0.f;
          for (int64_t j = 0; j <= i; ++j) {
            Pi[j] = std::exp(Pi[j] - m);
            sum += Pi[j];
          }
          const float inv = 1.0f / sum;
          float* oi = op + (o + i) * sh.heads * sh.hd + h * sh.hd;
          for (int64_t j = 0; j <= i; ++j) {
            Pi[j] *= inv;
            Axpy(Pi[j], x + (o + j) * sh.width + sh.v_off + kvh * sh.hd, oi, sh.hd);
          }
        }
      }
      p_base += sh.heads * L * L;
    }
    ctx->save_for_backward({qkv, qr, kr, probs, offsets, cos, sin});
    ctx->saved_data["heads"] = n_heads;
    ctx->saved_data["kv_heads"] = n_kv_heads;
    ctx->saved_data["hd"] = head_dim;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &qkv = saved[0], &qr = saved[1], &kr = saved[2], &probs = saved[3],
                     &offsets = saved[4], &cos = saved[5], &sin = saved[6];
    const Shape sh = ShapeOf(qkv, ctx->saved_data["heads"].toInt(),
                             ctx->saved_data["kv_heads"].toInt(), ctx->saved_data["hd"].toInt());
    const at::Tensor dout = grads[0].contiguous();
    const int64_t S = offsets.numel() - 1, half = sh.hd / 2, G = sh.heads / sh.kv_heads;
    const int64_t* off = offsets.data_ptr<int64_t>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    const float* x = qkv.data_ptr<float>();
    const float* qrp = qr.data_ptr<float>();
    const float* krp = kr.data_ptr<float>();
    const float* pp = probs.data_ptr<float>();
    const float* gp = dout.data_ptr<float>();
    at::Tensor dqkv = at::zeros({sh.n, sh.width}, qkv.options());
    float* dx = dqkv.data_ptr<float>();
    // Gradients of the rotated queries and keys, unrotated into dqkv at the end.
    at::Tensor dqr = at::zeros({sh.n, sh.heads, sh.hd}, qkv.options());
    at::Tensor dkr = at::zeros({sh.n, sh.kv_heads, sh.hd}, qkv.options());
    float* dqrp = dqr.data_ptr<float>();
    float* dkrp = dkr.data_ptr<float>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    int64_t longest = 0;
    for (int64_t s = 0; s < S; ++s) longest = std::max(longest, off[s + 1] - off[s]);
    std::vector<float> dP(static_cast<size_t>(longest));
    int64_t p_base = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t o = off[s], L = off[s + 1] - off[s];
      for (int64_t h = 0; h < sh.heads; ++h) {
        const int64_t kvh = h / G;
        const float* P = pp + p_base + h * L * L;
        for (int64_t i = 0; i < L; ++i) {
          const float* Pi = P + i * L;
          const float* gi = gp + (o + i) * sh.heads * sh.hd + h * sh.hd;
          // dP_ij = dO_i . v_j; dV_j += P_ij dO_i; D_i = sum_j P_ij dP_ij.
          float D = 0.f;
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t vj = (o + j) * sh.width + sh.v_off + kvh * sh.hd;
            dP[static_cast<size_t>(j)] = Dot(gi, x + vj, sh.hd);
            D += Pi[j] * dP[static_cast<size_t>(j)];
            Axpy(Pi[j], gi, dx + vj, sh.hd);
          }
          // dS_ij = P_ij (dP_ij - D_i); scores = q_i . k_j * scale.
          const float* qi = qrp + ((o + i) * sh.heads + h) * sh.hd;
          float* dqi = dqrp + ((o + i) * sh.heads + h) * sh.hd;
          for (int64_t j = 0; j <= i; ++j) {
            const float ds = Pi[j] * (dP[static_cast<size_t>(j)] - D) * scale;
            if (ds == 0.f) continue;
            const int64_t kj = ((o + j) * sh.kv_heads + kvh) * sh.hd;
            Axpy(ds, krp + kj, dqi, sh.hd);
            Axpy(ds, qi, dkrp + kj, sh.hd);
          }
        }
      }
      p_base += sh.heads * L * L;
      for (int64_t t = 0; t < L; ++t) {
        const float* c = cp + t * half;
        const float* sn = sp + t * half;
        float* row = dx + (o + t) * sh.width;
        for (int64_t h = 0; h < sh.heads; ++h)
          UnrotateAdd(dqrp + ((o + t) * sh.heads + h) * sh.hd, c, sn, half,
                      row + sh.q_off + h * sh.hd);
        for (int64_t h = 0; h < sh.kv_heads; ++h)
          UnrotateAdd(dkrp + ((o + t) * sh.kv_heads + h) * sh.hd, c, sn, half,
                      row + sh.k_off + h * sh.hd);
      }
    }
    return {dqkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor RmsNormTrain(const at::Tensor& x, const at::Tensor& w, double eps) {
  CheckFloatRows(x, "RmsNormTrain input");
  TORCH_CHECK(w.dim() == 1 && w.numel() == x.size(1) && w.is_contiguous() &&
                  w.scalar_type() == at::kFloat && w.device().is_cpu(),
              "RmsNormTrain weight must be a contiguous float32 CPU [", x.size(1), "], got ",
              w.scalar_type(), " ", w.sizes());
  return RmsNormFn::apply(x, w, eps);
}

at::Tensor SiluMulTrain(const at::Tensor& gu) {
  CheckFloatRows(gu, "SiluMulTrain input");
  TORCH_CHECK(gu.size(1) % 2 == 0, "SiluMulTrain input width ", gu.size(1),
              " must be even ([gate | up])");
  return SiluMulFn::apply(gu);
}

at::Tensor PackedCausalAttentionTrain(const at::Tensor& qkv, const at::Tensor& offsets,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  CheckFloatRows(qkv, "PackedCausalAttentionTrain qkv");
  TORCH_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0 &&
                  head_dim % 2 == 0,
              "PackedCausalAttentionTrain: bad heads ", n_heads, "/", n_kv_heads, " x ", head_dim);
  TORCH_CHECK(qkv.size(1) == (n_heads + 2 * n_kv_heads) * head_dim,
              "PackedCausalAttentionTrain qkv width ", qkv.size(1), " != (", n_heads, " + 2 * ",
              n_kv_heads, ") * ", head_dim);
  TORCH_CHECK(offsets.device().is_cpu() && offsets.scalar_type() == at::kLong &&
                  offsets.dim() == 1 && offsets.numel() >= 1 && offsets.is_contiguous(),
              "PackedCausalAttentionTrain offsets must be a contiguous int64 CPU [S + 1]");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 2 &&
                    t->size(1) == head_dim / 2 && t->is_contiguous(),
                "PackedCausalAttentionTrain cos/sin must be contiguous float32 [max_len, ",
                head_dim / 2, "]");
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t S = offsets.numel() - 1;
  TORCH_CHECK(off[0] == 0 && off[S] == qkv.size(0),
              "PackedCausalAttentionTrain offsets must run from 0 to the ", qkv.size(0),
              " rows, got ", off[0], "..", off[S]);
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(off[s + 1] >= off[s], "PackedCausalAttentionTrain offsets decrease at ", s);
    TORCH_CHECK(off[s + 1] - off[s] <= cos.size(0), "PackedCausalAttentionTrain sequence ", s,
                " has ", off[s + 1] - off[s], " rows, more than the ", cos.size(0),
                " RoPE positions");
  }
  return AttentionFn::apply(qkv, offsets, cos, sin, n_heads, n_kv_heads, head_dim);
}

}  // namespace troupe::engine::cpu
