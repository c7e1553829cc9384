#include "troupe/trainer/loss.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "troupe/core/check.h"
#include "troupe/trainer/metrics.h"

namespace troupe::trainer {

void PolicyLossStats::Add(const PolicyLossStats& o) {
  loss += o.loss;
  pg_loss += o.pg_loss;
  tokens += o.tokens;
  kl_sum += o.kl_sum;
  entropy_sum += o.entropy_sum;
  clipped += o.clipped;
  ratio_max = std::max(ratio_max, o.ratio_max);
  is_weight_sum += o.is_weight_sum;
  is_weight_max = std::max(is_weight_max, o.is_weight_max);
  truncated += o.truncated;
  mismatch_sum += o.mismatch_sum;
  mismatch_max = std::max(mismatch_max, o.mismatch_max);
  if (is_weight_histogram.size() < o.is_weight_histogram.size())
    is_weight_histogram.resize(o.is_weight_histogram.size(), 0.0);
  for (size_t i = 0; i < o.is_weight_histogram.size(); ++i)
    is_weight_histogram[i] += o.is_weight_histogram[i];
}

namespace {
// Log-ratios are clamped to +-kLogClamp before exp so a wild token can not
// overflow float32 (exp(20) ~ 5e8 is far beyond any clip or cap).
constexpr double kLogClamp = 20.0;
}  // namespace

PolicyLossResult ComputePolicyLoss(const PolicyLossInputs& in, const PolicyLossCoefficients& c) {
  TROUPE_CHECK(in.logprobs.defined() && in.proximal_logprobs.defined() &&
               in.behaviour_logprobs.defined() && in.advantages.defined() && in.mask.defined() &&
               in.token_weights.defined());
  TROUPE_CHECK_MSG(in.logprobs.sizes() == in.mask.sizes(), "logprobs [{}] vs mask [{}]",
                   fmt::join(in.logprobs.sizes(), ","), fmt::join(in.mask.sizes(), ","));
  const at::Tensor on = in.mask > 0;
  const at::Tensor zero = at::zeros({}, in.logprobs.options().requires_grad(false));

  // Everything computed on masked-out positions is replaced by 0 BEFORE any exp,
  // so padding can never produce inf * 0 = NaN.
  const at::Tensor prox = at::where(on, in.proximal_logprobs, zero).detach();
  const at::Tensor behav = at::where(on, in.behaviour_logprobs, zero);
  const at::Tensor logp = at::where(on, in.logprobs, zero);

  // Behaviour importance weight w = min(pi_prox / pi_behav, is_cap), no gradient.
  const at::Tensor log_w_raw = (prox - behav).clamp(-kLogClamp, kLogClamp);
  const at::Tensor w_raw = log_w_raw.exp();
  const at::Tensor w = w_raw.clamp_max(c.is_cap);

  // PPO ratio against the proximal policy, clipped asymmetrically.
  const at::Tensor ratio = (logp - prox).clamp(-kLogClamp, kLogClamp).exp();
  const at::Tensor adv = in.advantages;
  const at::Tensor surr_unclipped = ratio * adv;
  const at::Tensor surr_clipped = ratio.clamp(1.0 - c.clip_low, 1.0 + c.clip_high) * adv;
  const at::Tensor surr = at::minimum(surr_unclipped, surr_clipped);
  at::Tensor token_loss = -(w * surr);
  const at::Tensor pg_token_loss = token_loss;

  at::Tensor kl;
  if (in.reference_logprobs.defined()) {
    const at::Tensor d = at::where(on, in.reference_logprobs, zero) - logp;  // log pi_ref - log pi
    const at::Tensor dc = d.clamp(-kLogClamp, kLogClamp);
    kl = dc.exp() - dc - 1.0;
    if (c.kl_coef > 0) token_loss = token_loss + c.kl_coef * kl;
  }
  if (in.entropy.defined() && c.entropy_coef > 0) {
    token_loss = token_loss - c.entropy_coef * at::where(on, in.entropy, zero);
  }
  const at::Tensor weights = at::where(on, in.token_weights, zero);
  PolicyLossResult out;
  out.loss = (token_loss * weights).sum();

  // Metrics: one stacked tensor, one read.
  at::NoGradGuard no_grad;
  const at::Tensor onf = on.to(at::kFloat);
  const at::Tensor neg_inf = at::full({}, -1.0, in.logprobs.options());
  const at::Tensor mismatch = (prox - behav).abs();
  const at::Tensor clipped = (surr_clipped < surr_unclipped).logical_and(on).to(at::kFloat);
  std::vector<at::Tensor> parts = {
      out.loss.detach().to(at::kFloat),
      (pg_token_loss.detach() * weights).sum(),
      onf.sum(),
      kl.defined() ? (kl.detach() * onf).sum() : zero,
      in.entropy.defined() ? (at::where(on, in.entropy.detach(), zero)).sum() : zero,
      clipped.sum(),
      at::where(on, ratio.detach(), neg_inf).max(),
      (w * onf).sum(),
      at::where(on, w_raw, neg_inf).max(),
      ((w_raw >= c.is_cap).logical_and(on)).to(at::kFloat).sum(),
      (mismatch * onf).sum(),
      at::where(on, mismatch, neg_inf).max(),
  };
  // Trained tokens with w_raw <= edge, per edge (the histogram is their differences).
  for (double edge : IsWeightEdges()) parts.push_back(((w_raw <= edge).logical_and(on)).to(at::kFloat).sum());
  const at::Tensor all = at::stack(parts).to(at::kDouble).contiguous();
  const double* v = all.data_ptr<double>();
  PolicyLossStats& s = out.stats;
  s.loss = v[0];
  s.pg_loss = v[1];
  s.tokens = v[2];
  s.kl_sum = v[3];
  s.entropy_sum = v[4];
  s.clipped = v[5];
  s.ratio_max = std::max(0.0, v[6]);
  s.is_weight_sum = v[7];
  s.is_weight_max = std::max(0.0, v[8]);
  s.truncated = v[9];
  s.mismatch_sum = v[10];
  s.mismatch_max = std::max(0.0, v[11]);
  const size_t edges = IsWeightEdges().size();
  s.is_weight_histogram.assign(edges + 1, 0.0);
  double below = 0;
  for (size_t i = 0; i < edges; ++i) {
    s.is_weight_histogram[i] = v[12 + i] - below;
    below = v[12 + i];
  }
  s.is_weight_histogram[edges] = s.tokens - below;
  return out;
}

at::Tensor TokenEntropy(const at::Tensor& logits, double temperature) {
  const at::Tensor scaled = temperature == 1.0 ? logits : logits / temperature;
  const at::Tensor logp = at::log_softmax(scaled, -1);
  return -(logp.exp() * logp).sum(-1);
}

}  // namespace troupe::trainer
