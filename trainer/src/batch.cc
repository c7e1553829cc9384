#include "troupe/trainer/batch.h"

#include <algorithm>
#include <cmath>

namespace troupe::trainer {

void TrainBatch::AddSequence(const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& response,
                             const std::vector<float>& behaviour, const std::vector<uint8_t>& mask,
                             float reward) {
  if (prompt_offsets.empty()) prompt_offsets.push_back(0);
  if (response_offsets.empty()) response_offsets.push_back(0);
  prompt_tokens.insert(prompt_tokens.end(), prompt.begin(), prompt.end());
  prompt_offsets.push_back(static_cast<int64_t>(prompt_tokens.size()));
  response_tokens.insert(response_tokens.end(), response.begin(), response.end());
  response_offsets.push_back(static_cast<int64_t>(response_tokens.size()));
  behaviour_logprobs.insert(behaviour_logprobs.end(), behaviour.begin(), behaviour.end());
  loss_mask.insert(loss_mask.end(), mask.begin(), mask.end());
  rewards.push_back(reward);
}

int64_t TrainBatch::RemoveSequences(const std::vector<uint8_t>& drop) {
  const int64_t n = num_sequences();
  if (n <= 0 || static_cast<int64_t>(drop.size()) != n ||
      static_cast<int64_t>(rewards.size()) != n ||
      static_cast<int64_t>(response_offsets.size()) != n + 1 ||
      static_cast<int64_t>(behaviour_logprobs.size()) != num_response_tokens() ||
      static_cast<int64_t>(loss_mask.size()) != num_response_tokens() ||
      (!group_index.empty() && static_cast<int64_t>(group_index.size()) != n) ||
      (!sequence_versions.empty() && static_cast<int64_t>(sequence_versions.size()) != n))
    return 0;
  if (std::none_of(drop.begin(), drop.end(), [](uint8_t d) { return d != 0; })) return 0;
  for (int64_t i = 0; i < n; ++i) {  // offsets must be in order and in bounds
    if (prompt_offsets[i] < 0 || prompt_offsets[i] > prompt_offsets[i + 1] ||
        prompt_offsets[i + 1] > static_cast<int64_t>(prompt_tokens.size()) ||
        response_offsets[i] < 0 || response_offsets[i] > response_offsets[i + 1] ||
        response_offsets[i + 1] > num_response_tokens())
      return 0;
  }
  if (group_index.empty()) {
    const int64_t g = std::max<int64_t>(1, group_size);
    for (int64_t i = 0; i < n; ++i) group_index.push_back(static_cast<uint32_t>(i / g));
  }
  TrainBatch kept;
  kept.batch_id = batch_id;
  kept.policy_version = policy_version;
  kept.group_size = group_size;
  kept.prompt_offsets.push_back(0);
  kept.response_offsets.push_back(0);
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (drop[i]) {
      ++removed;
      continue;
    }
    const int64_t p0 = prompt_offsets[i], p1 = prompt_offsets[i + 1];
    const int64_t r0 = response_offsets[i], r1 = response_offsets[i + 1];
    kept.prompt_tokens.insert(kept.prompt_tokens.end(), prompt_tokens.begin() + p0,
                              prompt_tokens.begin() + p1);
    kept.prompt_offsets.push_back(static_cast<int64_t>(kept.prompt_tokens.size()));
    kept.response_tokens.insert(kept.response_tokens.end(), response_tokens.begin() + r0,
                                response_tokens.begin() + r1);
    kept.behaviour_logprobs.insert(kept.behaviour_logprobs.end(),
                                   behaviour_logprobs.begin() + r0, behaviour_logprobs.begin() + r1);
    kept.loss_mask.insert(kept.loss_mask.end(), loss_mask.begin() + r0, loss_mask.begin() + r1);
    kept.response_offsets.push_back(static_cast<int64_t>(kept.response_tokens.size()));
    kept.rewards.push_back(rewards[i]);
    kept.group_index.push_back(group_index[i]);
    if (!sequence_versions.empty()) kept.sequence_versions.push_back(sequence_versions[i]);
  }
  *this = std::move(kept);
  return removed;
}

void Demonstrations::Add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response) {
  if (prompt_offsets.empty()) prompt_offsets.push_back(0);
  if (response_offsets.empty()) response_offsets.push_back(0);
  // A mask column that is aligned so far stays aligned (this pair is all trained);
  // a misaligned one stays misaligned, for ValidateDemonstrations to report.
  const bool extend_mask = !loss_mask.empty() && loss_mask.size() == response_tokens.size();
  prompt_tokens.insert(prompt_tokens.end(), prompt.begin(), prompt.end());
  prompt_offsets.push_back(static_cast<int64_t>(prompt_tokens.size()));
  response_tokens.insert(response_tokens.end(), response.begin(), response.end());
  response_offsets.push_back(static_cast<int64_t>(response_tokens.size()));
  if (extend_mask) loss_mask.resize(response_tokens.size(), 1);
}

void Demonstrations::Add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
                         const std::vector<uint8_t>& mask) {
  // Pairs added earlier without a mask are all trained: materialise their ones first.
  if (loss_mask.empty()) loss_mask.assign(response_tokens.size(), 1);
  const bool aligned = loss_mask.size() == response_tokens.size();
  Add(prompt, response);
  if (aligned) loss_mask.resize(response_tokens.size() - response.size());
  loss_mask.insert(loss_mask.end(), mask.begin(), mask.end());
}

namespace {

// Offsets must have n+1 entries, start at 0, never decrease and end at `total`.
Status CheckOffsets(const char* name, const std::vector<int64_t>& offsets, int64_t n,
                    int64_t total) {
  if (static_cast<int64_t>(offsets.size()) != n + 1) {
    return InvalidArgument("{} has {} entries, expected num_sequences + 1 = {}", name,
                           offsets.size(), n + 1);
  }
  if (offsets[0] != 0) return InvalidArgument("{}[0] = {}, expected 0", name, offsets[0]);
  for (int64_t i = 0; i < n; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      return InvalidArgument("{} decreases at sequence {}: {} then {}", name, i, offsets[i],
                             offsets[i + 1]);
    }
  }
  if (offsets[n] != total) {
    return InvalidArgument("{} ends at {} but the token column has {} tokens", name, offsets[n],
                           total);
  }
  return Status::Ok();
}

Status CheckTokens(const char* name, const std::vector<int32_t>& tokens, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || (vocab > 0 && tokens[i] >= vocab)) {
      return InvalidArgument("{}[{}] = {} is outside the vocabulary [0, {})", name, i, tokens[i],
                             vocab);
    }
  }
  return Status::Ok();
}

// Shared checks of the prompt/response columns.
Status CheckColumns(const std::vector<int32_t>& prompt_tokens,
                    const std::vector<int64_t>& prompt_offsets,
                    const std::vector<int32_t>& response_tokens,
                    const std::vector<int64_t>& response_offsets, const BatchLimits& limits) {
  if (prompt_offsets.size() < 2) {
    return InvalidArgument("batch has no sequences (prompt_offsets has {} entries)",
                           prompt_offsets.size());
  }
  const int64_t n = static_cast<int64_t>(prompt_offsets.size()) - 1;
  TROUPE_RETURN_IF_ERROR(CheckOffsets("prompt_offsets", prompt_offsets, n,
                                      static_cast<int64_t>(prompt_tokens.size())));
  TROUPE_RETURN_IF_ERROR(CheckOffsets("response_offsets", response_offsets, n,
                                      static_cast<int64_t>(response_tokens.size())));
  TROUPE_RETURN_IF_ERROR(CheckTokens("prompt_tokens", prompt_tokens, limits.vocab_size));
  TROUPE_RETURN_IF_ERROR(CheckTokens("response_tokens", response_tokens, limits.vocab_size));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = prompt_offsets[i + 1] - prompt_offsets[i];
    const int64_t r = response_offsets[i + 1] - response_offsets[i];
    if (p == 0) return InvalidArgument("sequence {} has an empty prompt", i);
    if (limits.max_sequence_tokens > 0 && p + r > limits.max_sequence_tokens) {
      return InvalidArgument("sequence {} has {} tokens (prompt {} + response {}), limit {}", i,
                             p + r, p, r, limits.max_sequence_tokens);
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateRewards(const TrainBatch& b) {
  const int64_t n = b.num_sequences();
  if (static_cast<int64_t>(b.rewards.size()) != n) {
    return InvalidArgument(
        "rewards has {} entries but the batch has {} sequences (one reward per "
        "sequence expected)",
        b.rewards.size(), n);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(b.rewards[i])) {
      return InvalidArgument("reward of sequence {} is {} (rewards must be finite)", i,
                             b.rewards[i]);
    }
  }
  return Status::Ok();
}

Status ValidateTrainBatch(const TrainBatch& b, const BatchLimits& limits) {
  Status st = CheckColumns(b.prompt_tokens, b.prompt_offsets, b.response_tokens, b.response_offsets,
                           limits);
  if (!st.ok()) return st.WithContext(fmt::format("batch '{}'", b.batch_id));
  const int64_t n = b.num_sequences();
  const size_t tokens = b.response_tokens.size();
  auto fail = [&](Status s) { return s.WithContext(fmt::format("batch '{}'", b.batch_id)); };
  if (b.batch_id.empty()) {
    return fail(InvalidArgument("batch_id is empty (the learner deduplicates batches by id)"));
  }
  if (b.behaviour_logprobs.size() != tokens) {
    return fail(
        InvalidArgument("behaviour_logprobs has {} entries, expected one per response "
                        "token ({})",
                        b.behaviour_logprobs.size(), tokens));
  }
  if (b.loss_mask.size() != tokens) {
    return fail(InvalidArgument("loss_mask has {} entries, expected one per response token ({})",
                                b.loss_mask.size(), tokens));
  }
  for (size_t i = 0; i < tokens; ++i) {
    if (b.loss_mask[i] > 1) {
      return fail(InvalidArgument("loss_mask[{}] = {}, expected 0 or 1", i, b.loss_mask[i]));
    }
    if (b.loss_mask[i] == 1) {
      const float lp = b.behaviour_logprobs[i];
      if (!std::isfinite(lp) || lp > 1e-4f) {
        return fail(
            InvalidArgument("behaviour_logprobs[{}] = {} on a trained token (must be a finite "
                            "log-probability <= 0)",
                            i, lp));
      }
    }
  }
  if (b.group_size == 0) return fail(InvalidArgument("group_size is 0"));
  if (!b.group_index.empty() && static_cast<int64_t>(b.group_index.size()) != n) {
    return fail(InvalidArgument("group_index has {} entries, expected one per sequence ({})",
                                b.group_index.size(), n));
  }
  if (b.group_index.empty() && n % b.group_size != 0) {
    return fail(InvalidArgument(
        "{} sequences do not split into groups of group_size {} (give group_index for uneven "
        "groups)",
        n, b.group_size));
  }
  if (!b.sequence_versions.empty()) {
    if (static_cast<int64_t>(b.sequence_versions.size()) != n) {
      return fail(InvalidArgument("sequence_versions has {} entries, expected one per sequence ({})",
                                  b.sequence_versions.size(), n));
    }
    for (size_t i = 0; i < b.sequence_versions.size(); ++i) {
      if (b.sequence_versions[i] < b.policy_version) {
        return fail(InvalidArgument(
            "sequence_versions[{}] = {} is below the batch's policy_version {} (its minimum)", i,
            b.sequence_versions[i], b.policy_version));
      }
    }
  }
  st = ValidateRewards(b);
  if (!st.ok()) return fail(st);
  return Status::Ok();
}

Status ValidateDemonstrations(const Demonstrations& d, const BatchLimits& limits) {
  TROUPE_RETURN_IF_ERROR(
      CheckColumns(d.prompt_tokens, d.prompt_offsets, d.response_tokens, d.response_offsets, limits)
          .WithContext("demonstrations"));
  if (d.response_tokens.empty()) {
    return InvalidArgument("demonstrations: no response tokens to train on");
  }
  if (d.loss_mask.empty()) return Status::Ok();
  if (d.loss_mask.size() != d.response_tokens.size()) {
    return InvalidArgument(
        "demonstrations: loss_mask has {} entries, expected one per response token ({}) or none",
        d.loss_mask.size(), d.response_tokens.size());
  }
  size_t trained = 0;
  for (size_t i = 0; i < d.loss_mask.size(); ++i) {
    if (d.loss_mask[i] > 1) {
      return InvalidArgument("demonstrations: loss_mask[{}] = {}, expected 0 or 1", i,
                             d.loss_mask[i]);
    }
    trained += d.loss_mask[i];
  }
  if (trained == 0) {
    return InvalidArgument(
        "demonstrations: the loss mask is 0 on all {} response tokens (nothing to train on)",
        d.loss_mask.size());
  }
  return Status::Ok();
}

}  // namespace troupe::trainer
