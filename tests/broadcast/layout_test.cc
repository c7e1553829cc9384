// Unit tests of the broadcast's building blocks: layout planning, packing,
// bf16 wire cast, checksums, the message codec on top of the transport's
// decoder (including malformed and foreign input) and config validation.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "protocol.h"
#include "troupe/broadcast/config.h"
#include "troupe/broadcast/layout.h"
#include "troupe/transport/message.h"
#include "weights_fixture.h"

namespace troupe::broadcast {
namespace {

using testing::CompareWeights;
using testing::MakeWeights;

uint64_t Seed() {
  static uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("broadcast_layout_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

struct Packed {
  Layout layout;
  std::vector<uint8_t> bytes;
};

Packed PackAll(const NamedTensors& w, WireDtype wire, uint64_t bucket, bool checksum) {
  auto layout = PlanLayout(w, wire, bucket, 4096);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  Packed p{*layout, std::vector<uint8_t>(layout->total_bytes)};
  EXPECT_TRUE(PackTensors(w, p.layout, p.bytes.data()).ok());
  if (checksum) ComputeChecksums(&p.layout, p.bytes.data());
  return p;
}

NamedTensors UnpackAll(const Packed& p) {
  auto cast = std::make_shared<std::vector<uint8_t>>(CastAreaBytes(p.layout) + 1);
  auto owner = std::make_shared<int>(0);
  auto named = UnpackTensors(p.layout, p.bytes.data(), owner, cast->data(), cast);
  EXPECT_TRUE(named.ok()) << named.status().ToString();
  return named.ok() ? *named : NamedTensors{};
}

TEST(Layout, PacksHundredsOfMixedTensorsBitExact) {
  auto w = MakeWeights(Seed(), 1);
  ASSERT_GT(w.size(), 200u);
  Packed p = PackAll(w, WireDtype::kAsStored, 64 * 1024, false);
  EXPECT_GT(p.layout.num_buckets(), 10u);  // many small tensors, few buckets
  for (const Slot& s : p.layout.slots) EXPECT_EQ(s.offset % kSlotAlignment, 0u) << s.name;
  EXPECT_TRUE(p.layout.ValidateReceived(uint64_t{1} << 40).ok());
  auto got = UnpackAll(p);
  Status st = CompareWeights(got, w, WireDtype::kAsStored);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(Layout, TensorLargerThanABucketSpansBuckets) {
  NamedTensors w{{"big", at::randn({3000, 7})}, {"small", at::randn({5})}};
  Packed p = PackAll(w, WireDtype::kAsStored, 4096, true);
  EXPECT_GE(p.layout.num_buckets(), 20u);
  EXPECT_EQ(p.layout.checksums.size(), p.layout.num_buckets());
  EXPECT_TRUE(VerifyChecksums(p.layout, p.bytes.data()).ok());
  Status st = CompareWeights(UnpackAll(p), w, WireDtype::kAsStored);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(Layout, BFloat16WireRoundTripsWithinBf16Precision) {
  auto w = MakeWeights(Seed(), 2);
  Packed full = PackAll(w, WireDtype::kAsStored, 1 << 20, false);
  Packed half = PackAll(w, WireDtype::kBFloat16, 1 << 20, false);
  EXPECT_LT(half.layout.total_bytes, full.layout.total_bytes * 6 / 10);
  auto got = UnpackAll(half);
  for (const auto& [name, t] : got) {
    if (name == "extra.fp64") {
      EXPECT_EQ(t.scalar_type(), at::kDouble);  // only float32 is cast
    }
  }
  Status st = CompareWeights(got, w, WireDtype::kBFloat16);
  EXPECT_TRUE(st.ok()) << st.ToString();
  // And it is not bit-exact (the values really went through bf16).
  EXPECT_FALSE(CompareWeights(got, w, WireDtype::kAsStored).ok());
}

TEST(Layout, ChecksumDetectsAFlippedBitAndNamesTheBucket) {
  auto w = MakeWeights(Seed(), 3);
  Packed p = PackAll(w, WireDtype::kAsStored, 8192, true);
  std::mt19937_64 rng(Seed());
  for (int trial = 0; trial < 50; ++trial) {
    size_t byte = rng() % p.bytes.size();
    int bit = static_cast<int>(rng() % 8);
    p.bytes[byte] ^= static_cast<uint8_t>(1 << bit);
    Status st = VerifyChecksums(p.layout, p.bytes.data());
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(fmt::format("bucket {}", byte / 8192)), std::string::npos)
        << st.message();
    p.bytes[byte] ^= static_cast<uint8_t>(1 << bit);
  }
  EXPECT_TRUE(VerifyChecksums(p.layout, p.bytes.data()).ok());
}

// The stream checksum both sides log: the same for the same bytes, different when one bucket
// differs, 0 without checksums.
TEST(Layout, StreamChecksumFollowsEveryBucket) {
  auto w = MakeWeights(Seed(), 4);
  Packed a = PackAll(w, WireDtype::kAsStored, 8192, true);
  Packed b = PackAll(w, WireDtype::kAsStored, 8192, true);
  EXPECT_EQ(StreamChecksum(a.layout), StreamChecksum(b.layout));
  EXPECT_NE(StreamChecksum(a.layout), 0u);
  b.bytes[b.bytes.size() / 2] ^= 1;
  ComputeChecksums(&b.layout, b.bytes.data());
  EXPECT_NE(StreamChecksum(a.layout), StreamChecksum(b.layout));
  EXPECT_EQ(StreamChecksum(PackAll(w, WireDtype::kAsStored, 8192, false).layout), 0u);
}

// Learner and receivers pick the same versions to trace from the same sequence.
TEST(Layout, ChecksumTracePicksTheFirstVersionPastEachMultiple) {
  uint64_t last = 0;
  std::vector<uint64_t> traced;
  for (uint64_t v : {3, 7, 49, 52, 53, 99, 120, 121, 30, 31})
    if (TraceChecksum(v, &last)) traced.push_back(v);
  EXPECT_EQ(traced, (std::vector<uint64_t>{3, 52, 120, 30}));  // 30: a restarted learner
}

TEST(Layout, ChecksumDependsOnEveryByteAndLength) {
  std::vector<uint8_t> a(1000, 7);
  uint64_t h = Checksum64(a.data(), a.size());
  EXPECT_NE(h, Checksum64(a.data(), a.size() - 1));
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{999}}) {
    a[i] ^= 0x80;
    EXPECT_NE(h, Checksum64(a.data(), a.size())) << i;
    a[i] ^= 0x80;
  }
}

TEST(Layout, RejectsBadTensorSets) {
  auto plan = [](NamedTensors w) { return PlanLayout(w, WireDtype::kAsStored, 1 << 20, 1 << 16); };
  auto msg = [](const Result<Layout>& r) { return r.status().message(); };
  auto dup = plan({{"a", at::randn({2})}, {"a", at::randn({2})}});
  EXPECT_EQ(dup.status().code(), Code::kInvalidArgument);
  EXPECT_NE(msg(dup).find("'a' appears twice"), std::string::npos);
  EXPECT_NE(msg(plan({{"", at::randn({2})}})).find("name of 0 bytes"), std::string::npos);
  EXPECT_NE(msg(plan({{"u", at::Tensor()}})).find("'u' is undefined"), std::string::npos);
  auto complex = plan({{"c", at::randn({2}).to(at::kComplexFloat)}});
  EXPECT_NE(msg(complex).find("unsupported tensor dtype"), std::string::npos) << msg(complex);
  EXPECT_FALSE(PlanLayout({}, WireDtype::kAsStored, 100, 1 << 16).ok());  // bucket too small
  // Packing tensors that no longer match the plan is an error, not a crash.
  NamedTensors w{{"a", at::randn({4})}};
  auto layout = PlanLayout(w, WireDtype::kAsStored, 1 << 20, 1 << 16);
  ASSERT_TRUE(layout.ok());
  std::vector<uint8_t> buf(layout->total_bytes);
  NamedTensors changed{{"a", at::randn({5})}};
  EXPECT_EQ(PackTensors(changed, *layout, buf.data()).code(), Code::kInvalidArgument);
  // Only CPU and CUDA tensors and streams (a meta tensor has no bytes at all).
  const at::Device meta(at::kMeta);
  auto on_meta = plan({{"m", at::empty({2}, at::TensorOptions().device(meta))}});
  EXPECT_NE(msg(on_meta).find("only CPU and CUDA tensors"), std::string::npos) << msg(on_meta);
  Status st = PackTensors(w, *layout, buf.data(), meta);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("only host or CUDA memory"), std::string::npos) << st.message();
  EXPECT_FALSE(UnpackTensors(*layout, buf.data(), nullptr, nullptr, nullptr, meta).ok());
}

TEST(Layout, ValidateReceivedRejectsInconsistentManifests) {
  auto w = MakeWeights(Seed(), 4, {2, 16, 32, 64});
  Packed p = PackAll(w, WireDtype::kAsStored, 4096, true);
  auto expect_bad = [&](const char* what, auto mutate, const char* needle) {
    Layout l = p.layout;
    mutate(l);
    Status st = l.ValidateReceived(uint64_t{1} << 40);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(needle), std::string::npos) << what << ": " << st.message();
  };
  expect_bad(
      "past end", [](Layout& l) { l.slots[0].offset = l.total_bytes; }, "past the stream end");
  expect_bad(
      "overlap", [](Layout& l) { l.slots[1].offset = l.slots[0].offset; }, "overlaps");
  expect_bad(
      "bytes", [](Layout& l) { l.slots[0].bytes += 4; }, "bytes on the wire");
  expect_bad(
      "align", [](Layout& l) { l.slots[1].offset += 4; }, "aligned");
  expect_bad(
      "dup", [](Layout& l) { l.slots[1].name = l.slots[0].name; }, "appears twice");
  expect_bad(
      "neg", [](Layout& l) { l.slots[0].shape[0] = -1; }, "negative");
  expect_bad(
      "huge",
      [](Layout& l) {
        l.slots[0].shape = {1LL << 40, 1LL << 40};
      },
      "overflow");
  expect_bad(
      "sums", [](Layout& l) { l.checksums.pop_back(); }, "checksums");
  expect_bad(
      "cast", [](Layout& l) { l.slots[0].wire = DType::kFloat16; }, "travels as");
  expect_bad(
      "bucket", [](Layout& l) { l.bucket_bytes = 1; }, "bucketBytes");
  Layout l = p.layout;
  EXPECT_EQ(l.ValidateReceived(100).code(), Code::kResourceExhausted);
}

// The frames a transport socket would send for `m` (header + segments).
struct Wire {
  std::string header;
  std::vector<std::string> segments;
};

Wire Frames(const transport::OutMessage& m) {
  m.Seal({"test", 1});
  Wire w;
  transport::EncodeHeader(m, 0, &w.header);
  for (const auto& seg : transport::Segments(m))
    w.segments.emplace_back(static_cast<const char*>(seg.data), seg.size);
  return w;
}

// What a receiving socket hands the broadcast: the transport's decode, then ours. The
// InMessage stays alive in `in` (chunk payloads point into it).
Result<proto::Message> Receive(const Wire& w, transport::InMessage* in) {
  auto owned = std::make_shared<Wire>(w);
  transport::FrameSet fs;
  fs.frames.push_back({owned->header.data(), owned->header.size()});
  for (const auto& seg : owned->segments) fs.frames.push_back({seg.data(), seg.size()});
  fs.owner = owned;
  TROUPE_ASSIGN_OR_RETURN(*in, transport::DecodeMessage(std::move(fs), transport::DecodeLimits{}));
  return proto::Decode(*in);
}

Result<proto::Message> RoundTrip(const transport::OutMessage& m) {
  transport::InMessage in;
  return Receive(Frames(m), &in);
}

TEST(Protocol, MessagesRoundTrip) {
  proto::Header h{"learner", 42};
  {
    proto::GroupMsg g{7,
                      "gloo",
                      {"learner", "r1"},
                      {"", "tcp://127.0.0.1:5"},
                      "tcp://127.0.0.1:99",
                      "troupe/weights/7/0123abcd",
                      std::string(128, '\x01'),
                      1234,
                      "chain"};
    auto m = RoundTrip(proto::EncodeGroup(h, g));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->kind, proto::Kind::kGroup);
    EXPECT_EQ(m->sender, "learner");
    EXPECT_EQ(m->incarnation, 42u);
    EXPECT_EQ(m->group.members, g.members);
    EXPECT_EQ(m->group.endpoints, g.endpoints);
    EXPECT_EQ(m->group.store_address, g.store_address);
    EXPECT_EQ(m->group.store_prefix, g.store_prefix);
    EXPECT_EQ(m->group.nccl_id, g.nccl_id);
    EXPECT_EQ(m->group.timeout_ms, 1234u);
    EXPECT_EQ(m->group.algorithm, "chain");
  }
  {
    auto w = MakeWeights(Seed(), 5, {3, 16, 32, 64});
    Packed p = PackAll(w, WireDtype::kBFloat16, 8192, true);
    p.layout.version = 9;
    p.layout.transfer = kCatchUpBit | 3;
    proto::ManifestMsg mm{p.layout, "/seg", 4096, 6};
    auto m = RoundTrip(proto::EncodeManifest(h, mm));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Layout& l = m->manifest.layout;
    EXPECT_EQ(l.version, 9u);
    EXPECT_EQ(l.transfer, kCatchUpBit | 3);
    EXPECT_EQ(l.wire_dtype, WireDtype::kBFloat16);
    EXPECT_TRUE(l.SameTensors(p.layout));
    EXPECT_EQ(l.checksums, p.layout.checksums);
    EXPECT_EQ(m->manifest.shm_segment, "/seg");
    EXPECT_EQ(m->manifest.shm_generation, 6u);
    EXPECT_TRUE(l.ValidateReceived(uint64_t{1} << 40).ok());
  }
  {
    // The payload is its own frame, sent without a copy, and arrives as a view over it.
    std::vector<uint8_t> bytes(20000);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
    proto::ChunkMsg c{3, 4, 2, 100, true, {}};
    auto out = proto::EncodeChunk(h, c, transport::TensorBytes::FromVector(bytes));
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    Wire w = Frames(*out);
    EXPECT_EQ(w.segments.size(), 2u);  // the header struct, then the payload
    transport::InMessage in;
    auto m = Receive(w, &in);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    uint64_t abs = 0;
    ASSERT_TRUE(m->chunk.Absolute(1000, &abs));
    EXPECT_EQ(abs, 2100u);
    EXPECT_TRUE(m->chunk.last);
    ASSERT_EQ(m->chunk.payload.bytes, bytes.size());
    EXPECT_EQ(std::memcmp(m->chunk.payload.data, bytes.data(), bytes.size()), 0);
  }
  {
    auto m = RoundTrip(proto::EncodeAck({"r1", 5}, proto::AckMsg{3, 4, false, "checksum"}));
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE(m->ack.ok);
    EXPECT_EQ(m->ack.reason, "checksum");
    m = RoundTrip(proto::EncodeHeartbeat({"r1", 5}, {proto::PeerState::kLeaving, 8}));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->heartbeat.state, proto::PeerState::kLeaving);
    m = RoundTrip(proto::EncodeRegister({"r1", 5}, {"host", 77, "tcp://1.2.3.4:5", 3}));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->reg.data_endpoint, "tcp://1.2.3.4:5");
    EXPECT_EQ(m->reg.pid, 77);
  }
  {
    proto::StoreRequestMsg r{9, proto::StoreOp::kCompareSet, {"p/a", "p/b"}, "new", "old", -3, 77};
    auto m = RoundTrip(proto::EncodeStoreRequest({"r1", 5}, r));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->kind, proto::Kind::kStoreRequest);
    EXPECT_EQ(m->store_request.op, proto::StoreOp::kCompareSet);
    EXPECT_EQ(m->store_request.keys, r.keys);
    EXPECT_EQ(m->store_request.value, "new");
    EXPECT_EQ(m->store_request.expected, "old");
    EXPECT_EQ(m->store_request.delta, -3);
    EXPECT_EQ(m->store_request.timeout_ms, 77u);
    m = RoundTrip(proto::EncodeStoreReply(h, {9, false, "timed out", std::string("\0x", 2), 4}));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->store_reply.id, 9u);
    EXPECT_FALSE(m->store_reply.ok);
    EXPECT_EQ(m->store_reply.error, "timed out");
    EXPECT_EQ(m->store_reply.value, std::string("\0x", 2));
  }
}

TEST(Protocol, ForeignOrInconsistentMessagesAreRefusedByName) {
  // A well-formed message of another channel (an echo) is not part of the broadcast.
  transport::OutMessage echo;
  echo.envelope().initBody().initEcho().setText("hi");
  auto m = RoundTrip(echo);
  EXPECT_EQ(m.status().code(), Code::kProtocol);
  EXPECT_NE(m.status().message().find("echo"), std::string::npos) << m.status().ToString();
  // A Register whose actor id is not its sender's.
  transport::OutMessage reg = proto::EncodeRegister({"r1", 5}, {"host", 1, "tcp://1.2.3.4:5", 0});
  reg.envelope().getBody().getRegister().setActorId("rollout-0");
  m = RoundTrip(reg);
  EXPECT_EQ(m.status().code(), Code::kProtocol);
  EXPECT_NE(m.status().message().find("differs from the envelope sender"), std::string::npos);
  // A chunk without its payload, or with inline data.
  transport::OutMessage bare;
  bare.envelope().initBody().initWeightsChunk().setVersion(1);
  EXPECT_NE(RoundTrip(bare).status().message().find("without a payload"), std::string::npos);
}

TEST(Protocol, GarbageNeverCrashesTheDecoder) {
  std::mt19937_64 rng(Seed());
  auto w = MakeWeights(Seed(), 6, {2, 16, 32, 64});
  Packed p = PackAll(w, WireDtype::kAsStored, 8192, true);
  const Wire good = Frames(proto::EncodeManifest({"learner", 1}, {p.layout, "", 0, 0}));
  ASSERT_EQ(good.segments.size(), 1u);
  int decoded = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Wire bad = good;
    std::string& seg = bad.segments[0];
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) seg[rng() % seg.size()] = static_cast<char>(rng());
    transport::InMessage in;
    auto m = Receive(bad, &in);
    if (!m.ok()) {
      EXPECT_FALSE(m.status().message().empty());
      continue;
    }
    ++decoded;
    if (m->kind == proto::Kind::kManifest)  // validation must hold whatever decoded
      m->manifest.layout.ValidateReceived(uint64_t{1} << 30).IgnoreError();
  }
  std::printf("%d of 3000 corrupted manifests still decoded (then validated)\n", decoded);
}

TEST(Config, ValidationNamesTheField) {
  BroadcastConfig c;
  EXPECT_TRUE(c.Validate().ok());
  c.bucket_bytes = 10;
  EXPECT_NE(c.Validate().message().find("bucket_bytes"), std::string::npos);
  c = {};
  c.control_endpoint = "udp://x";
  EXPECT_NE(c.Validate().message().find("control_endpoint"), std::string::npos);
  c = {};
  c.member_timeout_ms = 1;
  EXPECT_NE(c.Validate().message().find("member_timeout_ms"), std::string::npos);
  c = {};
  c.shm_prefix = "no-slash";
  EXPECT_NE(c.Validate().message().find("shm_prefix"), std::string::npos);
  c = {};
  c.chunk_bytes = 4096 + 4;
  EXPECT_NE(c.Validate().message().find("multiple of 8"), std::string::npos);
  ReceiverConfig r;
  EXPECT_NE(r.Validate().message().find("learner_endpoint"), std::string::npos);
  r.actor_id = "rollout 0";  // empty means the network's actor id; a bad one is named
  r.learner_endpoint = "tcp://127.0.0.1:5555";
  EXPECT_NE(r.Validate().message().find("actor_id"), std::string::npos);
  r.actor_id = "rollout-0";
  r.learner_endpoint = "tcp://127.0.0.1:5555";
  EXPECT_TRUE(r.Validate().ok());
  r.data_endpoint = "tcp://*:0";
  EXPECT_NE(r.Validate().message().find("wildcard"), std::string::npos);
  EXPECT_FALSE(ParseBackend("mpi").ok());
  EXPECT_EQ(*ParseBackend("zmq"), Backend::kZmq);
  EXPECT_EQ(*ParseWireDtype("bf16"), WireDtype::kBFloat16);
}

}  // namespace
}  // namespace troupe::broadcast
