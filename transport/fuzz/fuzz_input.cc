#include "fuzz_input.h"

#include <cstring>

#include "troupe/transport/tensor.h"

namespace troupe::transport::fuzz {

std::vector<FrameRef> SplitFrames(const uint8_t* data, size_t size) {
  std::vector<FrameRef> frames;
  size_t pos = 0;
  while (pos + 4 <= size && frames.size() < 1024) {
    uint32_t len;
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    const size_t take = std::min<size_t>(len, size - pos);
    frames.push_back({data + pos, take});
    pos += take;
  }
  return frames;
}

std::string JoinFrames(const std::vector<std::string>& frames) {
  std::string out;
  for (const auto& f : frames) {
    const uint32_t len = static_cast<uint32_t>(f.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += f;
  }
  return out;
}

namespace {

uint64_t Touch(const Result<TensorView>& t) {
  if (!t.ok()) return 0;
  uint64_t sum = 0;
  const auto* p = static_cast<const uint8_t*>(t->data);
  for (size_t i = 0; i < t->bytes; ++i) sum += p[i];
  return sum;
}

}  // namespace

int DecodeOne(const uint8_t* data, size_t size) {
  FrameSet fs;
  fs.frames = SplitFrames(data, size);
  DecodeLimits limits;
  limits.max_message_bytes = 1 << 20;
  limits.traversal_limit_words = 1 << 18;
  limits.max_segments = 64;
  auto in = DecodeMessage(std::move(fs), limits);
  if (!in.ok()) return 0;
  // A decoded message must be fully readable without throwing.
  auto env = in->envelope();
  volatile uint64_t sink = env.getSeq() + env.getSender().size() + in->ack_floor();
  auto body = env.getBody();
  switch (body.which()) {
    case wire::Envelope::Body::ECHO:
      sink =
          sink + Touch(ReadTensor(body.getEcho().getPayload())) + body.getEcho().getText().size();
      break;
    case wire::Envelope::Body::ROLLOUT_BATCH: {
      auto b = body.getRolloutBatch();
      sink = sink + Touch(ReadTensor(b.getPromptTokens())) +
             Touch(ReadTensor(b.getResponseTokens())) +
             Touch(ReadTensor(b.getBehaviourLogprobs())) + Touch(ReadTensor(b.getLossMask()));
      for (auto s : b.getSequences())
        sink = sink + s.getPromptId().size() + s.getResponseText().size();
      break;
    }
    case wire::Envelope::Body::ACK: {
      auto a = body.getAck();
      for (auto s : a.getSeqs()) sink = sink + s;
      for (auto r : a.getRejected()) sink = sink + r.getReason().size();
      break;
    }
    case wire::Envelope::Body::DIRECTORY:
      for (auto a : body.getDirectory().getActors()) {
        sink = sink + a.getActorId().size();
        for (auto e : a.getEndpoints()) sink = sink + e.getAddress().size();
      }
      break;
    default:
      break;
  }
  (void)sink;
  return 1;
}

std::vector<std::string> EncodeFrames(const OutMessage& m, uint64_t ack_floor,
                                      std::string_view sender) {
  m.Seal(SealInfo{sender, 7});
  std::vector<std::string> frames(1);
  EncodeHeader(m, ack_floor, &frames[0]);
  for (auto s : Segments(m)) frames.emplace_back(static_cast<const char*>(s.data), s.size);
  return frames;
}

std::vector<std::pair<std::string, std::string>> SeedInputs() {
  std::vector<std::pair<std::string, std::string>> out;
  {
    OutMessage m;
    auto e = m.envelope().getBody().initEcho();
    e.setText("hello");
    std::vector<int32_t> v(3000, 7);  // 12 KB: its own segment
    (void)m.SetTensor(e.initPayload(), wire::DType::INT32, {3000}, TensorBytes::FromVector(v));
    m.set_seq(3);
    out.emplace_back("seed-echo-tensor", JoinFrames(EncodeFrames(m, 2)));
  }
  {
    OutMessage m;
    auto b = m.envelope().getBody().initRolloutBatch();
    b.setBatchId("rollout-0/1/1");
    b.setPolicyVersion(4);
    b.setNumSequences(2);
    std::vector<int32_t> tok = {1, 2, 3, 4, 5};
    std::vector<int64_t> off = {0, 2, 5};
    std::vector<float> lp = {-0.5f, -1.f, -0.25f, -2.f, -0.1f};
    std::vector<uint8_t> mask = {1, 1, 0, 1, 1};
    (void)m.SetTensorCopy(b.initResponseTokens(), wire::DType::INT32, {5}, tok.data(), 20);
    (void)m.SetTensorCopy(b.initResponseOffsets(), wire::DType::INT64, {3}, off.data(), 24);
    (void)m.SetTensorCopy(b.initBehaviourLogprobs(), wire::DType::FLOAT32, {5}, lp.data(), 20);
    (void)m.SetTensorCopy(b.initLossMask(), wire::DType::UINT8, {5}, mask.data(), 5);
    auto seqs = b.initSequences(2);
    seqs[0].setPromptId("p0");
    seqs[1].setResponseText("olleh");
    out.emplace_back("seed-rollout-batch", JoinFrames(EncodeFrames(m, 0)));
  }
  {
    OutMessage m;
    auto a = m.envelope().getBody().initAck();
    auto s = a.initSeqs(3);
    for (unsigned i = 0; i < 3; ++i) s.set(i, i + 1);
    auto r = a.initRejected(1);
    r[0].setSeq(9);
    r[0].setReason("stale");
    a.setProcessedThrough(4);
    out.emplace_back("seed-ack", JoinFrames(EncodeFrames(m, 0)));
  }
  {
    OutMessage m;
    auto actors = m.envelope().getBody().initDirectory().initActors(1);
    actors[0].setActorId("reward-0");
    auto eps = actors[0].initEndpoints(1);
    eps[0].setName("data");
    eps[0].setAddress("tcp://127.0.0.1:5555");
    out.emplace_back("seed-directory", JoinFrames(EncodeFrames(m, 0)));
  }
  return out;
}

}  // namespace troupe::transport::fuzz
