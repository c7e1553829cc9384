// Shared fixtures of the trainer tests: a small real model and batches whose
// behaviour log-probs come from the model itself (on-policy data).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "troupe/engine/logprob.h"
#include "troupe/engine/model.h"
#include "troupe/trainer/batch.h"

namespace troupe::trainer::testing {

// A small Llama decoder that builds in milliseconds (the default job's model is bigger).
inline engine::ModelConfig SmallModelConfig() {
  engine::ModelConfig mc;
  mc.vocab_size = 16;
  mc.d_model = 32;
  mc.n_layers = 2;
  mc.n_heads = 2;
  mc.n_kv_heads = 1;
  mc.ffn_dim = 64;
  mc.max_seq_len = 32;
  return mc;
}

inline std::shared_ptr<engine::LlamaModel> SmallModel(uint64_t seed) {
  return std::make_shared<engine::LlamaModel>(SmallModelConfig(), seed);
}

// Log-probs (temperature 1) the model gives `response` after `prompt`, computed
// one sequence at a time (unpadded), as a sampler would.
inline std::vector<float> SequenceLogprobs(engine::LlamaModel& model,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& response,
                                           double temperature = 1.0) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), response.begin(), response.end());
  at::Tensor t = at::tensor(ids, at::kLong).view({1, -1});
  at::Tensor logits = model.Forward(t.slice(1, 0, t.size(1) - 1));
  at::Tensor targets = t.slice(1, 1);
  at::Tensor lp = engine::TokenLogprobs(logits, targets, temperature)
                      .slice(1, static_cast<int64_t>(prompt.size()) - 1)
                      .contiguous();
  return std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel());
}

// Mean log-prob of the response tokens under the model.
inline double MeanLogprob(engine::LlamaModel& model, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& response) {
  double sum = 0;
  auto lp = SequenceLogprobs(model, prompt, response);
  for (float v : lp) sum += v;
  return sum / static_cast<double>(lp.size());
}

// A batch of sequences with on-policy behaviour log-probs from `model`.
struct SeqSpec {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  float reward = 0;
  std::vector<uint8_t> mask;  // empty: all trained
};

inline TrainBatch OnPolicyBatch(engine::LlamaModel& model, const std::string& id, uint64_t version,
                                uint32_t group_size, const std::vector<SeqSpec>& seqs) {
  TrainBatch b;
  b.batch_id = id;
  b.policy_version = version;
  b.group_size = group_size;
  for (const auto& s : seqs) {
    std::vector<uint8_t> mask =
        s.mask.empty() ? std::vector<uint8_t>(s.response.size(), 1) : s.mask;
    std::vector<float> lp = SequenceLogprobs(model, s.prompt, s.response);
    for (size_t j = 0; j < lp.size(); ++j) {
      if (!mask[j]) lp[j] = 0.0f;
    }
    b.AddSequence(s.prompt, s.response, lp, mask, s.reward);
  }
  return b;
}

}  // namespace troupe::trainer::testing
