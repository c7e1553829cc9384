// Framing and decoding without sockets: round trips, zero-copy views,
// alignment handling, re-sequencing, and every kind of bad input.
#include <cstring>
#include <random>

#include <capnp/message.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/transport/message.h"
#include "troupe/transport/tensor.h"

namespace troupe::transport {
namespace {

using testing::MakeEcho;

// The frames of one transmission, pointing straight at the message's memory
// (what MemoryNetwork delivers).
struct Wire {
  std::string header;
  std::vector<std::string> owned;  // only when copies are requested
  FrameSet frames;
};

Wire Encode(const OutMessage& m, uint64_t floor = 0) {
  m.Seal(SealInfo{"tester", 42});
  Wire w;
  EncodeHeader(m, floor, &w.header);
  w.frames.frames.push_back({w.header.data(), w.header.size()});
  for (auto s : Segments(m)) w.frames.frames.push_back({s.data, s.size});
  w.frames.owner = m.state();
  return w;
}

// Copies every frame to `offset` bytes past an 8-aligned address.
struct Shifted {
  std::vector<std::unique_ptr<uint64_t[]>> bufs;
  FrameSet frames;
};
Shifted CopyFrames(const FrameSet& in, size_t offset) {
  Shifted s;
  for (const auto& f : in.frames) {
    auto buf = std::unique_ptr<uint64_t[]>(new uint64_t[f.size / 8 + 2]);
    char* p = reinterpret_cast<char*>(buf.get()) + offset;
    std::memcpy(p, f.data, f.size);
    s.frames.frames.push_back({p, f.size});
    s.bufs.push_back(std::move(buf));
  }
  return s;
}

Result<InMessage> Decode(const FrameSet& fs, const DecodeLimits& limits = {},
                         TransportCounters* c = nullptr) {
  FrameSet copy = fs;
  return DecodeMessage(std::move(copy), limits, c);
}

TEST(Message, RoundTripWithZeroCopyTensor) {
  const size_t n = 100001;  // odd: exercises padding
  OutMessage m = MakeEcho("hello", n, 7);
  EXPECT_EQ(m.copied_tensor_bytes(), 0u);
  Wire w = Encode(m, 5);
  ASSERT_GE(w.frames.frames.size(), 3u);  // header, root segment, tensor segment
  TransportCounters c;
  auto in = Decode(w.frames, {}, &c);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->kind(), MessageKind::ECHO);
  EXPECT_EQ(in->sender(), "tester");
  EXPECT_EQ(in->incarnation(), 42u);
  EXPECT_EQ(in->ack_floor(), 5u);
  EXPECT_EQ(in->envelope().getSchemaVersion(), wire::SCHEMA_VERSION);
  auto t = in->ReadTensor(in->envelope().getBody().getEcho().getPayload(), "payload");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->numel, static_cast<int64_t>(n));
  EXPECT_EQ(t->bytes, n * 4);
  const int32_t* v = t->as<int32_t>();
  for (size_t i = 0; i < n; i += 997) EXPECT_EQ(v[i], 7 + static_cast<int32_t>(i));
  // The view points at the sender's bytes: the tensor travelled as its own
  // segment and nothing copied it.
  auto sent = m.reader().getBody().getEcho().getPayload().getData();
  EXPECT_EQ(t->data, static_cast<const void*>(sent.begin()));
  EXPECT_EQ(in->copied_segments(), 0u);
  EXPECT_EQ(c.messages_received.load(), 1u);
  EXPECT_EQ(c.unaligned_copies.load(), 0u);
}

TEST(Message, UnalignedFramesAreCopiedAndCounted) {
  OutMessage m = MakeEcho("shifted", 5000, 1);
  Wire w = Encode(m);
  Shifted s = CopyFrames(w.frames, 3);
  TransportCounters c;
  auto pool = std::make_shared<SegmentBufferPool>();
  FrameSet fs = s.frames;
  auto in = DecodeMessage(std::move(fs), {}, &c, pool);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->copied_segments(), w.frames.frames.size() - 1);
  EXPECT_EQ(c.unaligned_copies.load(), w.frames.frames.size() - 1);
  auto t = ReadTensor(in->envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 8, 0u);
  EXPECT_EQ(t->as<int32_t>()[4999], 5000);
  // Buffers go back to the pool and are reused by the next message.
  in = InMessage();
  FrameSet fs2 = s.frames;
  auto again = DecodeMessage(std::move(fs2), {}, &c, pool);
  ASSERT_TRUE(again.ok());
  EXPECT_GE(pool->reused(), 1u);
}

TEST(Message, SetTensorCopiesUnalignedOrUnpaddedBytes) {
  std::vector<uint8_t> raw(64 * 1024 + 9);
  OutMessage m;
  auto echo = m.envelope().getBody().initEcho();
  // Unaligned pointer: copied once, counted.
  Status st = m.SetTensor(echo.initPayload(), wire::DType::UINT8, {64 * 1024},
                          TensorBytes::Borrow(raw.data() + 1, 64 * 1024, nullptr));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(m.copied_tensor_bytes(), 64u * 1024);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 7);
  Wire w = Encode(m);
  auto in = Decode(w.frames);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto t = ReadTensor(in->envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->data, static_cast<const void*>(raw.data() + 1));  // a copy, taken at SetTensor
  EXPECT_EQ(t->as<uint8_t>()[100], static_cast<uint8_t>(0));     // raw was zero then
}

TEST(Message, SetTensorRejectsBadArguments) {
  OutMessage m;
  auto p = m.envelope().getBody().initEcho().initPayload();
  std::vector<float> v(6);
  auto bytes = [&] { return TensorBytes::Borrow(v.data(), v.size() * 4, nullptr); };
  Status st = m.SetTensor(p, wire::DType::FLOAT32, {2, 4}, bytes());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("needs 32 bytes, got 24"), std::string::npos) << st.message();
  st = m.SetTensor(p, wire::DType::FLOAT32, {-2, 3}, bytes());
  EXPECT_NE(st.message().find("dimension 0 is -2"), std::string::npos) << st.message();
  st = m.SetTensor(p, static_cast<wire::DType>(99), {6}, bytes());
  EXPECT_NE(st.message().find("unknown dtype 99"), std::string::npos) << st.message();
  EXPECT_TRUE(m.SetTensor(p, wire::DType::FLOAT32, {2, 3}, bytes()).ok());
}

TEST(Message, WithSeqSharesTensorsAndPatchesOnlyTheCopy) {
  OutMessage m = MakeEcho("seq", 20000);
  m.set_seq(3);
  Wire w = Encode(m);
  OutMessage m2 = m.WithSeq(9);
  EXPECT_EQ(m.seq(), 3u);
  EXPECT_EQ(m2.seq(), 9u);
  Wire w2 = Encode(m2);
  auto a = Decode(w.frames);
  auto b = Decode(w2.frames);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->seq(), 3u);
  EXPECT_EQ(b->seq(), 9u);
  EXPECT_EQ(testing::EchoText(*b), "seq");
  auto ta = ReadTensor(a->envelope().getBody().getEcho().getPayload());
  auto tb = ReadTensor(b->envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(ta->data, tb->data);  // the tensor segment is shared, not copied
  EXPECT_EQ(b->sender(), "tester");
}

TEST(Message, ForwardingAReceivedTensorDoesNotCopy) {
  OutMessage m = MakeEcho("in", 100003, 5);  // odd size: padding must come from the frame
  Wire w = Encode(m);
  auto in = Decode(w.frames);
  ASSERT_TRUE(in.ok());
  auto view = ReadTensor(in->envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(view.ok());
  OutMessage fwd;
  auto e = fwd.envelope().getBody().initEcho();
  ASSERT_TRUE(fwd.SetTensor(e.initPayload(), view->dtype, view->shape,
                            TensorBytes::FromView(*view, in->KeepAlive()))
                  .ok());
  EXPECT_EQ(fwd.copied_tensor_bytes(), 0u);
  Wire w2 = Encode(fwd);
  auto in2 = Decode(w2.frames);
  ASSERT_TRUE(in2.ok());
  auto v2 = ReadTensor(in2->envelope().getBody().getEcho().getPayload());
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->data, view->data);  // same bytes, end to end
  EXPECT_EQ(v2->as<int32_t>()[100002], 5 + 100002);
}

TEST(Message, LimitsValidate) {
  DecodeLimits l;
  EXPECT_TRUE(l.Validate().ok());
  l.traversal_limit_words = 10;
  EXPECT_NE(l.Validate().message().find("traversal_limit_words"), std::string::npos);
  l = {};
  l.max_segments = 0;
  EXPECT_FALSE(l.Validate().ok());
}

TEST(Message, KindNamesComeFromTheSchema) {
  EXPECT_EQ(KindName(MessageKind::ROLLOUT_BATCH), "rolloutBatch");
  EXPECT_EQ(KindName(static_cast<MessageKind>(999)), "kind(999)");
  EXPECT_GE(static_cast<int>(MaxKnownKind()), static_cast<int>(MessageKind::ECHO));
}

// ---------------------------------------------------------------- bad input

struct BadCase {
  Code code;
  RejectReason reason;
  std::string needle;
};

void ExpectRejected(const FrameSet& fs, const BadCase& bc, const DecodeLimits& limits = {}) {
  TransportCounters c;
  auto in = Decode(fs, limits, &c);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), bc.code) << in.status().ToString();
  EXPECT_NE(in.status().message().find(bc.needle), std::string::npos)
      << "message '" << in.status().message() << "' lacks '" << bc.needle << "'";
  EXPECT_EQ(c.rejected_count(bc.reason), 1u) << RejectReasonName(bc.reason);
  EXPECT_EQ(c.rejected_total(), 1u);
  EXPECT_EQ(c.messages_received.load(), 0u);
}

// Segment 0 of a sealed message as a mutable copy.
struct Mutable {
  Wire w;
  std::unique_ptr<uint64_t[]> seg0;
  size_t seg0_size;
  char* bytes() { return reinterpret_cast<char*>(seg0.get()); }
};
Mutable MakeMutable(OutMessage m) {
  Mutable mu;
  mu.w = Encode(m);
  auto& f = mu.w.frames.frames[1];
  mu.seg0_size = f.size;
  mu.seg0.reset(new uint64_t[f.size / 8]);
  std::memcpy(mu.seg0.get(), f.data, f.size);
  f.data = mu.seg0.get();
  return mu;
}

TEST(BadInput, Truncated) {
  Wire w = Encode(MakeEcho("x"));
  FrameSet one;
  one.frames.push_back(w.frames.frames[0]);
  ExpectRejected(one, {Code::kMalformed, RejectReason::kTruncated, "1 frame(s)"});
  FrameSet shorthdr = w.frames;
  shorthdr.frames[0].size = 12;
  ExpectRejected(shorthdr, {Code::kMalformed, RejectReason::kTruncated, "shorter than the"});
  // A segment cut short: the table points past the end of its frame.
  FrameSet cut = w.frames;
  cut.frames[1].size -= 8;
  ExpectRejected(cut, {Code::kMalformed, RejectReason::kSegmentTable, "points past the end"});
}

TEST(BadInput, RandomBytes) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int round = 0; round < 200; ++round) {
    std::vector<uint64_t> a(1 + rng() % 8), b(1 + rng() % 64);
    for (auto& x : a) x = rng();
    for (auto& x : b) x = rng();
    if (static_cast<uint32_t>(a[0]) == kHeaderMagic) continue;
    FrameSet fs;
    fs.frames.push_back({a.data(), a.size() * 8});
    fs.frames.push_back({b.data(), b.size() * 8});
    ExpectRejected(fs, {Code::kMalformed, RejectReason::kBadMagic, "not a Troupe message"});
  }
  // Random bytes after a valid header: Cap'n Proto must reject or accept
  // them cleanly, never crash.
  for (int round = 0; round < 500; ++round) {
    std::vector<uint64_t> seg(1 + rng() % 32);
    for (auto& x : seg) x = rng();
    std::string header(32, '\0');
    uint32_t magic = kHeaderMagic, n = 1, words = static_cast<uint32_t>(seg.size());
    uint16_t ver = kFrameFormatVersion;
    std::memcpy(&header[0], &magic, 4);
    std::memcpy(&header[4], &ver, 2);
    std::memcpy(&header[8], &n, 4);
    std::memcpy(&header[24], &words, 4);
    FrameSet fs;
    fs.frames.push_back({header.data(), header.size()});
    fs.frames.push_back({seg.data(), seg.size() * 8});
    TransportCounters c;
    auto in = Decode(fs, {}, &c);
    if (!in.ok()) {
      EXPECT_TRUE(in.status().code() == Code::kMalformed || in.status().code() == Code::kProtocol)
          << in.status().ToString();
      EXPECT_EQ(c.rejected_total(), 1u);
    }
  }
}

TEST(BadInput, WrongSchemaVersion) {
  // Build an envelope by hand (OutMessage would stamp the right version).
  capnp::MallocMessageBuilder b;
  auto env = b.initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION + 6);
  env.setSender("future-peer");
  env.getBody().initEcho().setText("hi");
  auto segs = b.getSegmentsForOutput();
  std::string header(32, '\0');
  uint32_t magic = kHeaderMagic, n = 1, words = static_cast<uint32_t>(segs[0].size());
  uint16_t ver = kFrameFormatVersion;
  std::memcpy(&header[0], &magic, 4);
  std::memcpy(&header[4], &ver, 2);
  std::memcpy(&header[8], &n, 4);
  std::memcpy(&header[24], &words, 4);
  FrameSet fs;
  fs.frames.push_back({header.data(), header.size()});
  fs.frames.push_back({segs[0].begin(), segs[0].size() * 8});
  ExpectRejected(fs,
                 {Code::kProtocol, RejectReason::kSchemaVersion,
                  fmt::format("schema version {} from 'future-peer'", wire::SCHEMA_VERSION + 6)});
}

TEST(BadInput, WrongFrameFormatVersion) {
  Wire w = Encode(MakeEcho("x"));
  std::string h = w.header;
  uint16_t v = 9;
  std::memcpy(&h[4], &v, 2);
  FrameSet fs = w.frames;
  fs.frames[0] = {h.data(), h.size()};
  ExpectRejected(fs, {Code::kProtocol, RejectReason::kFrameVersion, "frame format version 9"});
}

TEST(BadInput, UnknownMessageKind) {
  Mutable mu = MakeMutable(MakeEcho("kind"));
  // The union discriminant lives in the root struct's data section, which
  // starts at word 1 (right after the root pointer).
  auto body = capnp::Schema::from<wire::Envelope::Body>();
  const uint32_t off = body.getProto().getStruct().getDiscriminantOffset();
  uint16_t unknown = 200;
  std::memcpy(mu.bytes() + 8 + off * 2, &unknown, 2);
  ExpectRejected(mu.w.frames, {Code::kProtocol, RejectReason::kUnknownKind,
                               "unknown message kind (union ordinal 200)"});
}

TEST(BadInput, OverTheSizeLimit) {
  Wire w = Encode(MakeEcho("big", 64 * 1024));
  DecodeLimits limits;
  limits.max_message_bytes = 4096;
  limits.traversal_limit_words = 4096;
  ExpectRejected(
      w.frames, {Code::kResourceExhausted, RejectReason::kTooLarge, "over the limit of 4096 bytes"},
      limits);
}

TEST(BadInput, TooManySegments) {
  Wire w = Encode(MakeEcho("segs", 64 * 1024));
  DecodeLimits limits;
  limits.max_segments = 1;
  ExpectRejected(w.frames,
                 {Code::kResourceExhausted, RejectReason::kTooManySegments, "limits.max_segments"},
                 limits);
}

TEST(BadInput, SegmentTablePointsPastTheEnd) {
  Wire w = Encode(MakeEcho("table", 4096));
  std::string h = w.header;
  uint32_t words;
  std::memcpy(&words, &h[kHeaderFixedBytes], 4);
  words += 1000;
  std::memcpy(&h[kHeaderFixedBytes], &words, 4);
  FrameSet fs = w.frames;
  fs.frames[0] = {h.data(), h.size()};
  ExpectRejected(fs, {Code::kMalformed, RejectReason::kSegmentTable, "points past the end"});
  // A table that lists more segments than arrived.
  FrameSet missing = w.frames;
  std::string h2(RoundUpToWord(kHeaderFixedBytes + 12), '\0');
  std::memcpy(h2.data(), w.header.data(), w.header.size());
  uint32_t n = 3;
  std::memcpy(&h2[8], &n, 4);
  missing.frames[0] = {h2.data(), h2.size()};
  ExpectRejected(missing,
                 {Code::kMalformed, RejectReason::kSegmentTable, "lists 3 segments but 2"});
}

TEST(BadInput, PointerPastTheEndOfTheSegment) {
  Mutable mu = MakeMutable(MakeEcho("pointer"));
  // Root pointer: struct pointer with a huge offset.
  uint64_t root;
  std::memcpy(&root, mu.bytes(), 8);
  root = (root & ~uint64_t{0xfffffffc}) | (uint64_t{0x1000000} << 2);
  std::memcpy(mu.bytes(), &root, 8);
  ExpectRejected(mu.w.frames, {Code::kMalformed, RejectReason::kCapnp, "Cap'n Proto rejected"});
}

TEST(BadInput, TextWithoutNulTerminator) {
  Mutable mu = MakeMutable(MakeEcho("unterminated-text"));
  const std::string needle("unterminated-text");
  char* p = static_cast<char*>(memmem(mu.bytes(), mu.seg0_size, needle.data(), needle.size()));
  ASSERT_NE(p, nullptr);
  p[needle.size()] = 'X';  // overwrite the NUL
  ExpectRejected(mu.w.frames, {Code::kMalformed, RejectReason::kCapnp, "NUL-terminated"});
}

TEST(BadInput, TensorWhoseBytesDoNotMatchItsShape) {
  OutMessage m;
  auto echo = m.envelope().getBody().initEcho();
  echo.setText("t");
  auto t = echo.initPayload();
  t.setDtype(wire::DType::INT32);
  t.initShape(1).set(0, 3);
  t.initData(8);  // needs 12
  Wire w = Encode(m);
  ExpectRejected(w.frames, {Code::kProtocol, RejectReason::kBadTensor,
                            "body.echo.payload: int32 tensor of shape [3] needs 3 x 4 bytes but "
                            "carries 8 bytes"});
  OutMessage m2;
  auto t2 = m2.envelope().getBody().initEcho().initPayload();
  t2.setDtype(static_cast<wire::DType>(77));
  Wire w2 = Encode(m2);
  ExpectRejected(w2.frames, {Code::kProtocol, RejectReason::kBadTensor, "unknown dtype 77"});
  OutMessage m3;
  auto rb = m3.envelope().getBody().initRolloutBatch();
  auto t3 = rb.initPromptTokens();
  t3.setDtype(wire::DType::INT32);
  t3.initShape(2).set(0, -1);
  Wire w3 = Encode(m3);
  ExpectRejected(w3.frames, {Code::kProtocol, RejectReason::kBadTensor,
                             "body.rolloutBatch.promptTokens: dimension 0 is -1"});
}

TEST(BadInput, NestingLimit) {
  OutMessage m;
  auto actors = m.envelope().getBody().initDirectory().initActors(1);
  auto eps = actors[0].initEndpoints(1);
  eps[0].setName("data");
  Wire w = Encode(m);
  EXPECT_TRUE(Decode(w.frames).ok());
  DecodeLimits limits;
  limits.nesting_limit = 4;  // envelope > directory > actors > actor > endpoints: too deep
  ExpectRejected(w.frames, {Code::kMalformed, RejectReason::kCapnp, "too deeply-nested"}, limits);
}

}  // namespace
}  // namespace troupe::transport
