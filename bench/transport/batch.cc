#include "batch.h"

#include <random>

#include <fmt/format.h>

#include "troupe/core/check.h"

namespace troupe::bench {

using transport::AlignedBuffer;
using transport::TensorBytes;

BatchData MakeBatchData(int sequences, uint64_t seed) {
  std::mt19937_64 rng(seed);
  BatchData d;
  d.sequences = sequences;
  const size_t np = static_cast<size_t>(sequences) * kPromptTokens;
  const size_t nr = static_cast<size_t>(sequences) * kResponseTokens;
  d.prompt_tokens = AlignedBuffer::Make(np * 4);
  d.response_tokens = AlignedBuffer::Make(nr * 4);
  d.prompt_offsets = AlignedBuffer::Make((sequences + 1) * 8);
  d.response_offsets = AlignedBuffer::Make((sequences + 1) * 8);
  d.logprobs = AlignedBuffer::Make(nr * 4);
  d.mask = AlignedBuffer::Make(nr);
  for (size_t i = 0; i < np; ++i)
    d.prompt_tokens->as<int32_t>()[i] = static_cast<int32_t>(rng() % 32000);
  for (size_t i = 0; i < nr; ++i) {
    d.response_tokens->as<int32_t>()[i] = static_cast<int32_t>(rng() % 32000);
    d.logprobs->as<float>()[i] = -static_cast<float>(rng() % 1000) / 100.f;
    d.mask->as<uint8_t>()[i] = (rng() % 8) != 0;
  }
  for (int s = 0; s <= sequences; ++s) {
    d.prompt_offsets->as<int64_t>()[s] = static_cast<int64_t>(s) * kPromptTokens;
    d.response_offsets->as<int64_t>()[s] = static_cast<int64_t>(s) * kResponseTokens;
  }
  return d;
}

transport::OutMessage BuildBatch(const BatchData& d, uint64_t index) {
  // Room for the metadata and the small tensors in segment 0 (see OutMessage).
  transport::OutMessage m(4096 + static_cast<size_t>(d.sequences) * 160 +
                          (d.sequences < 32 ? d.tensor_bytes() : 0));
  auto b = m.envelope().getBody().initRolloutBatch();
  b.setBatchId(fmt::format("rollout-0/1/{}", index));
  b.setPolicyVersion(7);
  b.setProducer("rollout-0");
  b.setNumSequences(static_cast<uint32_t>(d.sequences));
  b.setGroupSize(8);
  const int64_t s = d.sequences;
  auto set = [&](wire::Tensor::Builder t, wire::DType dt, int64_t n,
                 const std::shared_ptr<AlignedBuffer>& buf) {
    Status st = m.SetTensor(t, dt, {n}, TensorBytes::FromBuffer(buf));
    TROUPE_CHECK_MSG(st.ok(), "{}", st.ToString());
  };
  set(b.initPromptTokens(), wire::DType::INT32, s * kPromptTokens, d.prompt_tokens);
  set(b.initPromptOffsets(), wire::DType::INT64, s + 1, d.prompt_offsets);
  set(b.initResponseTokens(), wire::DType::INT32, s * kResponseTokens, d.response_tokens);
  set(b.initResponseOffsets(), wire::DType::INT64, s + 1, d.response_offsets);
  set(b.initBehaviourLogprobs(), wire::DType::FLOAT32, s * kResponseTokens, d.logprobs);
  set(b.initLossMask(), wire::DType::UINT8, s * kResponseTokens, d.mask);
  auto seqs = b.initSequences(static_cast<unsigned>(s));
  char id[32];
  for (unsigned i = 0; i < seqs.size(); ++i) {
    auto q = seqs[i];
    const int n = std::snprintf(id, sizeof id, "prompt-%u", i / 8);
    q.setPromptId(capnp::Text::Reader(id, static_cast<size_t>(n)));
    q.setGroupIndex(i / 8);
    q.setFinishReason(wire::FinishReason::STOP);
    q.setTask("reverse");
  }
  b.setGenerateTimeNs(123456);
  b.setCreatedNs(static_cast<int64_t>(index));
  return m;
}

}  // namespace troupe::bench
