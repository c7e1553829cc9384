#include "troupe/engine/logprob.h"

#include <ATen/ops/log_softmax.h>

namespace troupe::engine {

at::Tensor ScaledLogSoftmax(const at::Tensor& logits, double temperature) {
  at::Tensor z = logits.to(at::kFloat);
  const double t = EffectiveTemperature(temperature);
  if (t != 1.0) z = z.div(t);
  return at::log_softmax(z, -1);
}

at::Tensor ScaledLogSoftmax(const at::Tensor& logits, const at::Tensor& temperature) {
  return at::log_softmax(logits.to(at::kFloat).div(temperature), -1);
}

at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature) {
  TORCH_CHECK(targets.dim() == logits.dim() - 1, "TokenLogprobs: targets ", targets.sizes(),
              " do not match logits ", logits.sizes());
  return ScaledLogSoftmax(logits, temperature)
      .gather(-1, targets.to(at::kLong).unsqueeze(-1))
      .squeeze(-1);
}

}  // namespace troupe::engine
