// The policy loss: decoupled PPO-clip with truncated importance weights,
// optional k3 KL penalty and entropy bonus.
//
// Three policies meet in one token's loss:
//   pi_behav  the sampler's policy that generated the token (its log-prob travels
//             with the batch; the batch may be k versions old),
//   pi_prox   the learner's policy when it started training on the batch
//             (computed, detached, in the batch's first forward pass),
//   pi_theta  the current, differentiable policy.
// With r = pi_theta / pi_prox, w = min(pi_prox / pi_behav, is_cap) and the
// sequence's advantage A, the per-token loss is
//
//   l_t = - w * min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
//         + kl_coef * k3(pi_theta, pi_ref) - entropy_coef * H(pi_theta)
//   k3  = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1
//
// and the loss is sum_t l_t * weight_t, where the caller's weights encode the
// aggregation (token mean or sequence mean) and the normalisation across the
// micro-batches of one update. w corrects for the batch being stale (and for
// numerical mismatch between sampler and learner); clipping r keeps the update
// close to pi_prox. On fresh data pi_behav = pi_prox = pi_theta at the first
// update: w = 1, r = 1 and the gradient is the plain policy gradient
// -A * grad log pi_theta. Pure functions over tensors; thread-compatible.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace troupe::trainer {

struct PolicyLossCoefficients {
  double clip_low = 0.2;
  double clip_high = 0.28;
  double is_cap = 5.0;
  double kl_coef = 0.0;
  double entropy_coef = 0.0;
};

// All tensors share one shape (e.g. [B, T]) and are float32.
struct PolicyLossInputs {
  at::Tensor logprobs;            // log pi_theta(token), differentiable
  at::Tensor proximal_logprobs;   // log pi_prox(token), no grad
  at::Tensor behaviour_logprobs;  // log pi_behav(token) from the sampler
  at::Tensor advantages;          // the token's sequence advantage
  at::Tensor mask;                // 1 = trained token, 0 = prompt/padding/environment token
  at::Tensor token_weights;       // aggregation weight per token (0 where mask is 0)
  at::Tensor reference_logprobs;  // log pi_ref(token); undefined = no KL term
  at::Tensor entropy;             // per-token entropy of pi_theta; undefined = no entropy term
};

// Sums over the trained tokens of the inputs, for metrics (plain doubles).
struct PolicyLossStats {
  double loss = 0;           // sum l_t * weight_t (the loss value)
  double pg_loss = 0;        // the policy-gradient part of the same
  double tokens = 0;         // trained tokens
  double kl_sum = 0;         // sum of k3 over trained tokens
  double entropy_sum = 0;    // sum of entropy over trained tokens
  double clipped = 0;        // tokens where the clipped branch of the min was taken
  double ratio_max = 0;      // max r
  double is_weight_sum = 0;  // sum of w (after truncation)
  double is_weight_max = 0;  // max of pi_prox/pi_behav before truncation
  double truncated = 0;      // tokens where w hit is_cap
  double mismatch_sum = 0;   // sum |log pi_prox - log pi_behav|
  double mismatch_max = 0;   // max of the same
  // Trained tokens by pi_prox/pi_behav before truncation, over IsWeightEdges() (metrics.h).
  std::vector<double> is_weight_histogram;

  void Add(const PolicyLossStats& o);
};

struct PolicyLossResult {
  at::Tensor loss;  // scalar, differentiable
  PolicyLossStats stats;
};

PolicyLossResult ComputePolicyLoss(const PolicyLossInputs& in, const PolicyLossCoefficients& c);

// Per-position entropy -sum_v p_v log p_v of softmax(logits / temperature),
// logits [..., V] -> [...]. Differentiable.
at::Tensor TokenEntropy(const at::Tensor& logits, double temperature);

}  // namespace troupe::trainer
