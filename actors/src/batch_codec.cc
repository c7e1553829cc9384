#include "batch_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace troupe::actors {

using transport::TensorBytes;

namespace {

template <typename T>
Status PutColumn(transport::OutMessage* msg, wire::Tensor::Builder t, std::vector<T> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return msg->SetTensor(t, transport::WireDType<T>(), {n}, TensorBytes::FromVector(std::move(v)));
}

template <typename T>
Result<std::vector<T>> GetColumn(const transport::InMessage& msg, wire::Tensor::Reader t,
                                 const char* what, int64_t expected_len) {
  TROUPE_ASSIGN_OR_RETURN(transport::TensorView v, msg.ReadTensor(t, what));
  if (v.dtype != transport::WireDType<T>()) {
    return InvalidArgument("{}: dtype {}, expected {}", what, transport::DTypeName(v.dtype),
                           transport::DTypeName(transport::WireDType<T>()));
  }
  if (v.rank() != 1) return InvalidArgument("{}: rank {}, expected 1", what, v.rank());
  if (expected_len >= 0 && v.numel != expected_len) {
    return InvalidArgument("{}: {} elements, expected {}", what, v.numel, expected_len);
  }
  const T* p = v.as<T>();
  return std::vector<T>(p, p + v.numel);
}

Status CheckOffsets(const std::vector<int64_t>& off, size_t total, const char* what) {
  if (off.empty() || off.front() != 0) return InvalidArgument("{}: must start at 0", what);
  for (size_t i = 1; i < off.size(); ++i) {
    if (off[i] < off[i - 1]) return InvalidArgument("{}: decreasing at sequence {}", what, i - 1);
  }
  if (static_cast<size_t>(off.back()) != total) {
    return InvalidArgument("{}: end at {} but the column has {} tokens", what, off.back(), total);
  }
  return Status::Ok();
}

}  // namespace

Status BuildRolloutBatch(const RolloutBatchInfo& info, const std::vector<SequenceRecord>& seqs,
                         transport::OutMessage* msg) {
  std::vector<const SequenceRecord*> ptrs;
  ptrs.reserve(seqs.size());
  for (const auto& s : seqs) ptrs.push_back(&s);
  return BuildRolloutBatch(info, ptrs, msg);
}

Status BuildRolloutBatch(const RolloutBatchInfo& info, const std::vector<const SequenceRecord*>& seqs,
                         transport::OutMessage* msg) {
  auto b = msg->envelope().getBody().initRolloutBatch();
  b.setBatchId(info.batch_id);
  b.setPolicyVersion(info.policy_version);
  b.setProducer(info.producer);
  b.setProducerIncarnation(info.producer_incarnation);
  b.setGrantLearner(info.grant_learner);
  b.setGrantedGroups(info.granted_groups);
  b.setNumSequences(static_cast<uint32_t>(seqs.size()));
  b.setGroupSize(info.group_size);
  b.setGenerateTimeNs(info.generate_time_ns);
  b.setCreatedNs(info.created_ns);
  std::vector<int32_t> prompt, response;
  std::vector<int64_t> poff{0}, roff{0}, versions;
  std::vector<float> logprobs;
  std::vector<uint8_t> mask;
  bool with_versions = true;
  bool with_start_versions = !seqs.empty();
  size_t prompt_total = 0, response_total = 0;
  for (const SequenceRecord* s : seqs) {
    prompt_total += s->prompt.size();
    response_total += s->response.size();
  }
  prompt.reserve(prompt_total);
  response.reserve(response_total);
  logprobs.reserve(response_total);
  mask.reserve(response_total);
  poff.reserve(seqs.size() + 1);
  roff.reserve(seqs.size() + 1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRecord& s = *seqs[i];
    if (s.logprobs.size() != s.response.size() || s.mask.size() != s.response.size()) {
      return Internal("sequence {} of {}: {} response tokens, {} log-probs, {} mask entries", i,
                      info.batch_id, s.response.size(), s.logprobs.size(), s.mask.size());
    }
    with_versions &= s.token_versions.size() == s.response.size();
    with_start_versions &= s.start_version != SequenceRecord::kNoVersion;
    prompt.insert(prompt.end(), s.prompt.begin(), s.prompt.end());
    response.insert(response.end(), s.response.begin(), s.response.end());
    logprobs.insert(logprobs.end(), s.logprobs.begin(), s.logprobs.end());
    mask.insert(mask.end(), s.mask.begin(), s.mask.end());
    poff.push_back(static_cast<int64_t>(prompt.size()));
    roff.push_back(static_cast<int64_t>(response.size()));
  }
  if (with_versions) {
    versions.reserve(response_total);
    for (const SequenceRecord* s : seqs)
      for (uint64_t v : s->token_versions) versions.push_back(static_cast<int64_t>(v));
  }
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initPromptTokens(), std::move(prompt)));
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initPromptOffsets(), std::move(poff)));
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initResponseTokens(), std::move(response)));
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initResponseOffsets(), std::move(roff)));
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initBehaviourLogprobs(), std::move(logprobs)));
  TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initLossMask(), std::move(mask)));
  if (with_versions && !seqs.empty()) {
    TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initTokenVersions(), std::move(versions)));
  }
  if (with_start_versions) {
    std::vector<int64_t> starts;
    starts.reserve(seqs.size());
    for (const SequenceRecord* s : seqs) starts.push_back(static_cast<int64_t>(s->start_version));
    TROUPE_RETURN_IF_ERROR(PutColumn(msg, b.initSequenceVersions(), std::move(starts)));
  }
  auto meta = b.initSequences(static_cast<unsigned>(seqs.size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRecord& s = *seqs[i];
    auto m = meta[static_cast<unsigned>(i)];
    m.setPromptId(s.prompt_id);
    m.setGroupIndex(s.group_index);
    m.setFinishReason(s.finish);
    if (!s.reject_reason.empty()) m.setRejectReason(s.reject_reason);
    m.setTask(s.task);
    m.setReference(s.reference);
    if (!s.service.empty()) m.setService(s.service);
    m.setPromptText(s.prompt_text);
    m.setResponseText(s.response_text);
    if (!s.extra.empty()) m.setExtra(s.extra);
  }
  return Status::Ok();
}

Result<std::vector<ScoringItem>> ReadScoringItems(const transport::InMessage& msg,
                                                  std::string* batch_id, uint32_t* num_sequences) {
  if (msg.kind() != transport::MessageKind::ROLLOUT_BATCH) {
    return ProtocolError("expected a rolloutBatch, got {}", transport::KindName(msg.kind()));
  }
  auto b = msg.envelope().getBody().getRolloutBatch();
  *batch_id = b.getBatchId();
  if (batch_id->empty()) return InvalidArgument("rollout batch without a batch id");
  *num_sequences = b.getNumSequences();
  auto meta = b.getSequences();
  if (meta.size() != *num_sequences) {
    return InvalidArgument("batch {}: numSequences {} but {} sequence records", *batch_id,
                           *num_sequences, meta.size());
  }
  std::vector<ScoringItem> items;
  items.reserve(meta.size());
  for (auto m : meta) {
    items.push_back({m.getTask(), m.getPromptText(), m.getResponseText(), m.getReference(),
                     m.getService(), m.getExtra()});
  }
  return items;
}

Status ForwardScored(const transport::InMessage& rollout, const std::vector<RewardRecord>& rewards,
                     const std::string& scorer, int64_t score_time_ns, transport::OutMessage* out) {
  auto in = rollout.envelope().getBody().getRolloutBatch();
  auto sb = out->envelope().getBody().initScoredBatch();
  auto r = sb.initRollout();
  r.setBatchId(in.getBatchId());
  r.setPolicyVersion(in.getPolicyVersion());
  r.setProducer(in.getProducer());
  r.setProducerIncarnation(in.getProducerIncarnation());
  r.setGrantLearner(in.getGrantLearner());
  r.setGrantedGroups(in.getGrantedGroups());
  r.setNumSequences(in.getNumSequences());
  r.setGroupSize(in.getGroupSize());
  r.setGenerateTimeNs(in.getGenerateTimeNs());
  r.setCreatedNs(in.getCreatedNs());
  r.setSequences(in.getSequences());
  auto keep = rollout.KeepAlive();
  // Tensors: reference the received frames (no copy).
  auto ref = [&](wire::Tensor::Reader src, wire::Tensor::Builder dst, const char* what) -> Status {
    TROUPE_ASSIGN_OR_RETURN(transport::TensorView v, rollout.ReadTensor(src, what));
    return out->SetTensor(dst, v.dtype, v.shape, TensorBytes::FromView(v, keep));
  };
  TROUPE_RETURN_IF_ERROR(ref(in.getPromptTokens(), r.initPromptTokens(), "promptTokens"));
  TROUPE_RETURN_IF_ERROR(ref(in.getPromptOffsets(), r.initPromptOffsets(), "promptOffsets"));
  TROUPE_RETURN_IF_ERROR(ref(in.getResponseTokens(), r.initResponseTokens(), "responseTokens"));
  TROUPE_RETURN_IF_ERROR(ref(in.getResponseOffsets(), r.initResponseOffsets(), "responseOffsets"));
  TROUPE_RETURN_IF_ERROR(
      ref(in.getBehaviourLogprobs(), r.initBehaviourLogprobs(), "behaviourLogprobs"));
  TROUPE_RETURN_IF_ERROR(ref(in.getLossMask(), r.initLossMask(), "lossMask"));
  if (in.hasTokenVersions()) {
    TROUPE_RETURN_IF_ERROR(ref(in.getTokenVersions(), r.initTokenVersions(), "tokenVersions"));
  }
  if (in.hasSequenceVersions()) {
    TROUPE_RETURN_IF_ERROR(
        ref(in.getSequenceVersions(), r.initSequenceVersions(), "sequenceVersions"));
  }
  std::vector<float> values;
  values.reserve(rewards.size());
  for (const auto& x : rewards) values.push_back(x.reward);
  int64_t n = static_cast<int64_t>(values.size());
  TROUPE_RETURN_IF_ERROR(out->SetTensor(sb.initRewards(), wire::DType::FLOAT32, {n},
                                        TensorBytes::FromVector(std::move(values))));
  auto details = sb.initDetails(static_cast<unsigned>(rewards.size()));
  for (size_t i = 0; i < rewards.size(); ++i) {
    auto d = details[static_cast<unsigned>(i)];
    d.setScorer(rewards[i].scorer);
    if (!rewards[i].failure.empty()) d.setFailure(rewards[i].failure);
    if (rewards[i].unscored) d.setUnscored(true);
    if (!rewards[i].components.empty()) {
      auto c = d.initComponents(static_cast<unsigned>(rewards[i].components.size()));
      for (size_t j = 0; j < rewards[i].components.size(); ++j) {
        c[static_cast<unsigned>(j)].setName(rewards[i].components[j].first);
        c[static_cast<unsigned>(j)].setValue(rewards[i].components[j].second);
      }
    }
  }
  sb.setScorer(scorer);
  sb.setScoreTimeNs(score_time_ns);
  return Status::Ok();
}

std::string BatchOrigin::Source() const {
  return fmt::format("{}/{:x}", producer, incarnation);
}

Result<trainer::TrainBatch> ReadTrainBatch(const transport::InMessage& msg, BatchOrigin* origin,
                                           std::vector<uint8_t>* unscored) {
  if (msg.kind() != transport::MessageKind::SCORED_BATCH) {
    return ProtocolError("expected a scoredBatch, got {}", transport::KindName(msg.kind()));
  }
  auto sb = msg.envelope().getBody().getScoredBatch();
  auto r = sb.getRollout();
  trainer::TrainBatch t;
  t.batch_id = r.getBatchId();
  if (t.batch_id.empty()) return InvalidArgument("scored batch without a batch id");
  origin->producer = r.getProducer();
  origin->incarnation = r.getProducerIncarnation();
  origin->grant_learner = r.getGrantLearner();
  origin->granted_groups = r.getGrantedGroups();
  t.policy_version = r.getPolicyVersion();
  t.group_size = r.getGroupSize();
  int64_t n = r.getNumSequences();
  TROUPE_ASSIGN_OR_RETURN(t.prompt_offsets,
                          GetColumn<int64_t>(msg, r.getPromptOffsets(), "promptOffsets", n + 1));
  TROUPE_ASSIGN_OR_RETURN(t.response_offsets, GetColumn<int64_t>(msg, r.getResponseOffsets(),
                                                                 "responseOffsets", n + 1));
  TROUPE_ASSIGN_OR_RETURN(t.prompt_tokens,
                          GetColumn<int32_t>(msg, r.getPromptTokens(), "promptTokens", -1));
  TROUPE_ASSIGN_OR_RETURN(t.response_tokens,
                          GetColumn<int32_t>(msg, r.getResponseTokens(), "responseTokens", -1));
  int64_t rt = static_cast<int64_t>(t.response_tokens.size());
  TROUPE_ASSIGN_OR_RETURN(t.behaviour_logprobs,
                          GetColumn<float>(msg, r.getBehaviourLogprobs(), "behaviourLogprobs", rt));
  TROUPE_ASSIGN_OR_RETURN(t.loss_mask, GetColumn<uint8_t>(msg, r.getLossMask(), "lossMask", rt));
  TROUPE_RETURN_IF_ERROR(CheckOffsets(t.prompt_offsets, t.prompt_tokens.size(), "promptOffsets"));
  TROUPE_RETURN_IF_ERROR(
      CheckOffsets(t.response_offsets, t.response_tokens.size(), "responseOffsets"));
  TROUPE_ASSIGN_OR_RETURN(auto rewards_view, msg.ReadTensor(sb.getRewards(), "rewards"));
  if (rewards_view.dtype != wire::DType::FLOAT32) {
    return InvalidArgument("rewards: dtype {}, expected float32",
                           transport::DTypeName(rewards_view.dtype));
  }
  // Shape is checked by the learner (one reward per sequence) so it can name the mismatch.
  const float* rp = rewards_view.as<float>();
  t.rewards.assign(rp, rp + rewards_view.numel);
  if (unscored) {
    auto details = sb.getDetails();
    unscored->assign(static_cast<size_t>(std::max<int64_t>(0, n)), 0);
    if (details.size() == static_cast<unsigned>(n))
      for (unsigned i = 0; i < details.size(); ++i) (*unscored)[i] = details[i].getUnscored();
  }
  if (r.hasSequenceVersions()) {
    TROUPE_ASSIGN_OR_RETURN(
        auto v, GetColumn<int64_t>(msg, r.getSequenceVersions(), "sequenceVersions", n));
    t.sequence_versions.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || static_cast<uint64_t>(v[i]) < t.policy_version) {
        return InvalidArgument(
            "sequenceVersions[{}] = {} is below the batch's policyVersion {} (its minimum)", i,
            v[i], t.policy_version);
      }
      t.sequence_versions.push_back(static_cast<uint64_t>(v[i]));
    }
  }
  auto meta = r.getSequences();
  if (meta.size() == static_cast<unsigned>(n)) {
    t.group_index.reserve(meta.size());
    for (auto m : meta) t.group_index.push_back(m.getGroupIndex());
  }
  return t;
}

}  // namespace troupe::actors
