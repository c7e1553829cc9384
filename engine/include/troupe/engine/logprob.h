// The behaviour log-prob: ONE definition shared by the sampler and the learner.
//
// For logits z over the vocabulary and sampling temperature tau, the log-prob
// of token y is
//
//     logp(y) = log_softmax(z / tau)[y]      computed in float32,
//
// i.e. the log-probability under the temperature-scaled policy distribution.
// Top-k / top-p truncation is NOT part of it: the sampler draws from the
// truncated distribution but records this untruncated value, which is what the
// learner can recompute from its own forward pass (the convention of
// verl/OpenRLHF). Greedy decoding (tau == 0) records the tau = 1 value.
//
// The generation engine computes ScaledLogSoftmax once per step for all rows,
// samples from exp() of it and records the sampled entry; the learner calls
// TokenLogprobs on its logits. Both are the same code. Pure functions, safe
// from any thread; differentiable (autograd flows through logits).
#pragma once

#include <ATen/core/Tensor.h>

namespace troupe::engine {

// The temperature the log-prob is computed at: tau when tau > 0, else 1 (greedy).
inline double EffectiveTemperature(double temperature) {
  return temperature > 0.0 ? temperature : 1.0;
}

// log_softmax(logits / temperature) over the last dim, in float32. logits [..., V] of any
// floating dtype on any device.
at::Tensor ScaledLogSoftmax(const at::Tensor& logits, double temperature);
// Same with a per-row temperature: `temperature` is float32 broadcastable against
// logits[..., :1] (e.g. [N, 1] for logits [N, V]), already passed through
// EffectiveTemperature (every entry > 0).
at::Tensor ScaledLogSoftmax(const at::Tensor& logits, const at::Tensor& temperature);

// ScaledLogSoftmax(logits, temperature) gathered at `targets` (integer, shape
// logits.shape[:-1]): float32 [...]. Throws c10::Error on mismatched shapes.
at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature);

}  // namespace troupe::engine
