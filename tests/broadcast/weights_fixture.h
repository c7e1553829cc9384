// Deterministic weight sets for the broadcast tests: a Llama-shaped model of a
// few hundred tensors with mixed dtypes and shapes, reproducible from
// (seed, version) in any process, plus comparison helpers.
#pragma once

#include <cmath>
#include <cstring>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "troupe/broadcast/types.h"
#include "troupe/core/status.h"

namespace troupe::broadcast::testing {

struct WeightsSpec {
  int layers = 24;
  int hidden = 64;
  int intermediate = 128;
  int vocab = 512;
};

// ~9 tensors per layer plus embeddings, norms and a few odd ones (non-contiguous, 0-d,
// empty, bf16, fp16, int64, bool, uint8).
inline NamedTensors MakeWeights(uint64_t seed, uint64_t version, const WeightsSpec& s = {}) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + version);
  auto randn = [&](std::vector<int64_t> shape) {
    return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
  };
  NamedTensors w;
  w.emplace_back("model.embed_tokens.weight", randn({s.vocab, s.hidden}));
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    w.emplace_back(p + "self_attn.q_proj.weight", randn({s.hidden, s.hidden}));
    w.emplace_back(p + "self_attn.k_proj.weight", randn({s.hidden / 2, s.hidden}));
    w.emplace_back(p + "self_attn.v_proj.weight", randn({s.hidden / 2, s.hidden}));
    w.emplace_back(p + "self_attn.o_proj.weight", randn({s.hidden, s.hidden}));
    w.emplace_back(p + "mlp.gate_proj.weight", randn({s.intermediate, s.hidden}));
    w.emplace_back(p + "mlp.up_proj.weight", randn({s.intermediate, s.hidden}));
    w.emplace_back(p + "mlp.down_proj.weight", randn({s.hidden, s.intermediate}));
    w.emplace_back(p + "input_layernorm.weight", randn({s.hidden}));
    w.emplace_back(p + "post_attention_layernorm.weight", randn({s.hidden + l % 3}));
  }
  w.emplace_back("model.norm.weight", randn({s.hidden}));
  w.emplace_back("lm_head.weight.transposed", randn({s.hidden, s.vocab}).t());  // non-contiguous
  w.emplace_back("extra.bf16", randn({33, 7}).to(at::kBFloat16));
  w.emplace_back("extra.fp16", randn({5, 3, 2}).to(at::kHalf));
  w.emplace_back("extra.fp64", randn({9}).to(at::kDouble));
  w.emplace_back("extra.position_ids",
                 at::arange(static_cast<int64_t>(version), static_cast<int64_t>(version) + 100,
                            at::TensorOptions().dtype(at::kLong)));
  w.emplace_back("extra.mask", randn({17}).gt(0));
  w.emplace_back("extra.bytes", (randn({13}) * 50).abs().to(at::kByte));
  w.emplace_back("extra.logit_scale", randn({}));  // 0-d scalar
  w.emplace_back("extra.empty", at::zeros({0, 4}, at::TensorOptions().dtype(at::kFloat)));
  return w;
}

// What a receiver must hold after `sent` travelled with `wire` (float32 -> bf16 -> float32).
inline NamedTensors ExpectedAfterWire(const NamedTensors& sent, WireDtype wire) {
  NamedTensors out;
  for (const auto& [name, t] : sent) {
    at::Tensor e = t.contiguous();
    if (wire == WireDtype::kBFloat16 && t.scalar_type() == at::kFloat)
      e = e.to(at::kBFloat16).to(at::kFloat);
    out.emplace_back(name, e);
  }
  return out;
}

// Bit-exact comparison; for bf16 wire also checks every float32 value lies within bf16
// precision (relative 2^-8) of the original.
inline Status CompareWeights(const NamedTensors& got, const NamedTensors& sent, WireDtype wire) {
  if (got.size() != sent.size())
    return InvalidArgument("{} tensors received, {} sent", got.size(), sent.size());
  NamedTensors expected = ExpectedAfterWire(sent, wire);
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& [name, g0] = got[i];
    const auto& e = expected[i].second;
    if (name != expected[i].first)
      return InvalidArgument("tensor #{} is '{}', expected '{}'", i, name, expected[i].first);
    if (g0.scalar_type() != e.scalar_type() || !g0.sizes().equals(e.sizes()))
      return InvalidArgument("tensor '{}' has dtype/shape {}/{} expected {}/{}", name,
                             c10::toString(g0.scalar_type()), c10::str(g0.sizes()),
                             c10::toString(e.scalar_type()), c10::str(e.sizes()));
    at::Tensor g = g0.contiguous();
    if (g.nbytes() != e.nbytes() ||
        (g.nbytes() > 0 && std::memcmp(g.data_ptr(), e.data_ptr(), g.nbytes()) != 0))
      return InvalidArgument("tensor '{}' differs from what was sent", name);
    if (wire == WireDtype::kBFloat16 && e.scalar_type() == at::kFloat && e.numel() > 0) {
      at::Tensor orig = sent[i].second.contiguous();
      double worst = ((g - orig).abs() - orig.abs() * (1.0 / 256) - 1e-30).max().item<double>();
      if (worst > 0) return InvalidArgument("tensor '{}' is off by more than bf16 precision", name);
    }
  }
  return Status::Ok();
}

}  // namespace troupe::broadcast::testing
