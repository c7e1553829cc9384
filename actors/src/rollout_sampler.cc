#include "rollout_sampler.h"

#include <algorithm>
#include <numeric>

#include "batch_codec.h"
#include "troupe/core/log.h"

namespace troupe::actors {
namespace {

const char* FinishName(wire::FinishReason f) {
  switch (f) {
    case wire::FinishReason::STOP:
      return "stop";
    case wire::FinishReason::LENGTH:
      return "length";
    case wire::FinishReason::REJECTED:
      return "rejected";
    case wire::FinishReason::SUBMITTED:
      return "submitted";
    case wire::FinishReason::TURN_LIMIT:
      return "turn_limit";
  }
  return "?";
}

std::string Cut(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // a UTF-8 boundary
  s.resize(n);
  return s + "…";
}

}  // namespace

RolloutSampler::RolloutSampler(const launcher::JobConfig& job, const engine::Tokenizer* tokenizer,
                               uint64_t seed)
    : spec_(job.rollout_samples), tokenizer_(tokenizer), rng_(seed) {
  const uint32_t batches =
      std::max<uint32_t>(1, job.batch.prompts_per_update / std::max<uint32_t>(1, job.batch.groups_per_message));
  per_batch_ = (spec_.per_update + batches - 1) / batches;
}

nlohmann::json RolloutSampler::Sample(const transport::InMessage& scored, uint64_t learner_version,
                                      uint64_t update) {
  if (spec_.per_update == 0) return nlohmann::json();
  if (update != update_) {
    update_ = update;
    taken_ = 0;
  }
  if (taken_ >= spec_.per_update) return nlohmann::json();
  BatchOrigin origin;
  auto batch = ReadTrainBatch(scored, &origin, nullptr);
  if (!batch.ok()) return nlohmann::json();
  auto sb = scored.envelope().getBody().getScoredBatch();
  auto r = sb.getRollout();
  auto meta = r.getSequences();
  auto details = sb.getDetails();
  const int64_t n = batch->num_sequences();
  if (n <= 0 || static_cast<int64_t>(batch->rewards.size()) != n) return nlohmann::json();
  std::vector<int64_t> versions;
  if (spec_.tokens && r.hasTokenVersions()) {
    auto v = scored.ReadTensor(r.getTokenVersions(), "tokenVersions");
    if (v.ok() && v->dtype == wire::DType::INT64 &&
        v->numel == static_cast<int64_t>(batch->response_tokens.size()))
      versions.assign(v->as<int64_t>(), v->as<int64_t>() + v->numel);
  }
  // k distinct sequences, uniformly.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng_);
  const size_t k = std::min<size_t>({order.size(), per_batch_, spec_.per_update - taken_});
  order.resize(k);
  std::sort(order.begin(), order.end());
  const uint64_t bv = batch->policy_version;
  nlohmann::json out = nlohmann::json::array();
  for (int64_t i : order) {
    const auto ui = static_cast<size_t>(i);
    const size_t r0 = static_cast<size_t>(batch->response_offsets[ui]);
    const size_t r1 = static_cast<size_t>(batch->response_offsets[ui + 1]);
    const size_t p0 = static_cast<size_t>(batch->prompt_offsets[ui]);
    const size_t p1 = static_cast<size_t>(batch->prompt_offsets[ui + 1]);
    nlohmann::json s;
    s["step"] = update;
    s["learner_version"] = learner_version;
    s["policy_version"] = bv;
    s["lag"] = learner_version >= bv ? learner_version - bv : 0;
    s["batch_id"] = batch->batch_id;
    s["producer"] = origin.producer;
    s["index"] = i;
    s["reward"] = batch->rewards[ui];
    if (meta.size() == static_cast<unsigned>(n)) {
      auto m = meta[static_cast<unsigned>(i)];
      s["prompt_id"] = std::string(m.getPromptId());
      s["task"] = std::string(m.getTask());
      s["group"] = m.getGroupIndex();
      s["finish"] = FinishName(m.getFinishReason());
      s["prompt_text"] = Cut(m.getPromptText(), spec_.max_text_chars);
      s["response_text"] = Cut(m.getResponseText(), spec_.max_text_chars);
      if (m.getReference().size() > 0) s["reference"] = Cut(m.getReference(), spec_.max_text_chars);
      auto extra = nlohmann::json::parse(std::string(m.getExtra()), nullptr, false);
      if (!extra.is_discarded() && extra.is_object() && !extra.empty()) s["extra"] = extra;
    }
    if (details.size() == static_cast<unsigned>(n)) {
      auto d = details[static_cast<unsigned>(i)];
      s["scorer"] = std::string(d.getScorer());
      if (d.getFailure().size() > 0) s["failure"] = std::string(d.getFailure());
      nlohmann::json comps = nlohmann::json::object();
      for (auto c : d.getComponents()) comps[std::string(c.getName())] = c.getValue();
      if (!comps.empty()) s["components"] = comps;
    }
    // The response as runs of equal mask: environment tokens (mask 0) show as such.
    nlohmann::json segs = nlohmann::json::array();
    bool any_env = false;
    for (size_t a = r0; a < r1;) {
      size_t b = a;
      while (b < r1 && batch->loss_mask[b] == batch->loss_mask[a]) ++b;
      std::vector<int32_t> ids(batch->response_tokens.begin() + static_cast<long>(a),
                               batch->response_tokens.begin() + static_cast<long>(b));
      auto text = tokenizer_ ? tokenizer_->Decode(ids, true) : Result<std::string>(std::string());
      any_env |= batch->loss_mask[a] == 0;
      segs.push_back({{"mask", batch->loss_mask[a]},
                      {"text", text.ok() ? Cut(*text, spec_.max_text_chars) : "<undecodable>"}});
      a = b;
    }
    if (any_env || !s.contains("response_text")) s["segments"] = std::move(segs);
    s["response_tokens_count"] = r1 - r0;
    s["env_tokens"] = std::count(batch->loss_mask.begin() + static_cast<long>(r0),
                                 batch->loss_mask.begin() + static_cast<long>(r1), uint8_t{0});
    if (spec_.tokens) {
      s["prompt_tokens"] = std::vector<int32_t>(batch->prompt_tokens.begin() + static_cast<long>(p0),
                                                batch->prompt_tokens.begin() + static_cast<long>(p1));
      s["response_tokens"] =
          std::vector<int32_t>(batch->response_tokens.begin() + static_cast<long>(r0),
                               batch->response_tokens.begin() + static_cast<long>(r1));
      s["loss_mask"] = std::vector<uint8_t>(batch->loss_mask.begin() + static_cast<long>(r0),
                                            batch->loss_mask.begin() + static_cast<long>(r1));
      if (!versions.empty())
        s["token_versions"] = std::vector<int64_t>(versions.begin() + static_cast<long>(r0),
                                                   versions.begin() + static_cast<long>(r1));
    }
    out.push_back(std::move(s));
  }
  taken_ += static_cast<uint32_t>(k);
  return out;
}

void RolloutSampler::Offer(ActorRuntime& rt, const transport::InMessage& scored,
                           uint64_t learner_version, uint64_t update) {
  nlohmann::json seqs = Sample(scored, learner_version, update);
  if (!seqs.is_array() || seqs.empty()) return;
  nlohmann::json j = {{"sequences", std::move(seqs)}};
  rt.SendMetrics("rollouts", update, learner_version, {},
                 j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace troupe::actors
