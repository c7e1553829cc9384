// Fuzzing the readers of rollout data: what the reward actor (ReadScoringItems, ForwardScored)
// and the learner (ReadTrainBatch, then what it does before it offers a batch: RemoveSequences
// for unscored samples, RemoveStaleSequences, ValidateTrainBatch) make of whatever a peer sends.
// The transport's own fuzzing (transport_fuzz_corpus_test, scripts/fuzz-transport.sh) stops at
// a decoded envelope; this goes on into the columns.
//
// Inputs, from one seed (printed; TROUPE_TEST_SEED replays a run):
//  * structural corruption through Cap'n Proto builders: a good scored batch with one to three
//    of its columns or scalars made wrong (dtype, length, missing, offsets, token ids, versions,
//    NaN and infinities, counts that disagree, group size 0);
//  * byte mutations (flips, interesting words, truncation, frames dropped or repeated) of the
//    encoded frames of good and corrupted batches, decoded as a receiver decodes them.
// Properties: nothing crashes or throws; every refusal names the field at fault; a batch that
// is read is thinned with its books kept (sequences before = kept + removed, each kept
// sequence exactly as sent) and a valid batch stays valid. Named cases pin the one-fault
// refusals: each fault is refused, at the stage that should see it, naming its field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/test_seed.h"
#include "batch_codec.h"
#include "fuzz_input.h"
#include "troupe/trainer/batch.h"
#include "troupe/trainer/lag_gate.h"
#include "troupe/transport/message.h"
#include "troupe/transport/tensor.h"

namespace troupe::actors {
namespace {

using Rng = std::mt19937_64;

uint64_t Seed() {
  return test_support::TestSeed("batch_codec_fuzz_test");
}

// One tensor of the message as it will be sent: any dtype, any length, or absent.
struct Column {
  bool present = true;
  wire::DType dtype = wire::DType::UINT8;
  std::vector<uint8_t> bytes;

  template <typename T>
  static Column Of(const std::vector<T>& v) {
    Column c;
    c.dtype = transport::WireDType<T>();
    c.bytes.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(c.bytes.data(), v.data(), c.bytes.size());
    return c;
  }
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / transport::ItemSize(dtype)); }
  template <typename T>
  T Get(int64_t i) const {
    T x;
    std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
    return x;
  }
  template <typename T>
  void Set(int64_t i, T x) {
    std::memcpy(bytes.data() + i * sizeof(T), &x, sizeof(T));
  }
};

enum Col {
  kPromptTokens,
  kPromptOffsets,
  kResponseTokens,
  kResponseOffsets,
  kLogprobs,
  kMask,
  kTokenVersions,
  kSequenceVersions,
  kRewards,
  kNumCols
};
const char* const kWireName[kNumCols] = {"promptTokens",    "promptOffsets",     "responseTokens",
                                         "responseOffsets", "behaviourLogprobs", "lossMask",
                                         "tokenVersions",   "sequenceVersions",  "rewards"};

// A scored batch as a peer could send it: every field settable.
struct Draft {
  std::string batch_id = "rollout-0/1f/3";
  uint64_t policy_version = 0;
  uint32_t num_sequences = 0, group_size = 1;
  std::vector<uint32_t> group_of;  // SequenceMeta.groupIndex, one per meta record
  std::vector<uint8_t> unscored;   // RewardDetail.unscored, one per detail
  Column cols[kNumCols];
};

constexpr int64_t kVocab = 32;

// A good batch: 1-4 groups of 1-4 samples, multi-turn masks, per-group versions.
Draft GoodDraft(Rng& rng) {
  Draft d;
  const uint32_t G = 1 + rng() % 4, groups = 1 + rng() % 4, n = G * groups;
  d.num_sequences = n;
  d.group_size = G;
  d.policy_version = 5 + rng() % 20;
  std::vector<int32_t> pt, rt;
  std::vector<int64_t> po{0}, ro{0}, tv, sv;
  std::vector<float> lp, rewards;
  std::vector<uint8_t> mask;
  std::vector<uint64_t> group_version(groups);
  for (uint32_t g = 0; g < groups; ++g)
    group_version[g] = g == 0 ? d.policy_version : d.policy_version + rng() % 3;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t g = i / G;
    for (int k = 0, len = 1 + static_cast<int>(rng() % 6); k < len; ++k)
      pt.push_back(static_cast<int32_t>(rng() % kVocab));
    po.push_back(static_cast<int64_t>(pt.size()));
    for (int k = 0, len = 1 + static_cast<int>(rng() % 8); k < len; ++k) {
      const bool env_token = rng() % 5 == 0;  // a tool's tokens in a multi-turn episode
      rt.push_back(static_cast<int32_t>(rng() % kVocab));
      mask.push_back(env_token ? 0 : 1);
      lp.push_back(env_token ? 0.0f : -static_cast<float>(rng() % 1000) / 200.0f);
      tv.push_back(static_cast<int64_t>(group_version[g] + rng() % 2));
    }
    ro.push_back(static_cast<int64_t>(rt.size()));
    sv.push_back(static_cast<int64_t>(group_version[g]));
    rewards.push_back(static_cast<float>(rng() % 3) / 2.0f);
    d.group_of.push_back(g);
    d.unscored.push_back(rng() % 6 == 0 ? 1 : 0);
  }
  d.cols[kPromptTokens] = Column::Of(pt);
  d.cols[kPromptOffsets] = Column::Of(po);
  d.cols[kResponseTokens] = Column::Of(rt);
  d.cols[kResponseOffsets] = Column::Of(ro);
  d.cols[kLogprobs] = Column::Of(lp);
  d.cols[kMask] = Column::Of(mask);
  d.cols[kTokenVersions] = Column::Of(tv);
  d.cols[kSequenceVersions] = Column::Of(sv);
  d.cols[kRewards] = Column::Of(rewards);
  return d;
}

// The RolloutBatch part of a draft into `r`; tensors through `m`.
void FillRollout(const Draft& d, transport::OutMessage& m, wire::RolloutBatch::Builder r) {
  r.setBatchId(d.batch_id);
  r.setPolicyVersion(d.policy_version);
  r.setProducer("rollout-0");
  r.setProducerIncarnation(0x1f);
  r.setNumSequences(d.num_sequences);
  r.setGroupSize(d.group_size);
  auto put = [&](Col c, auto init) {
    const Column& col = d.cols[c];
    if (!col.present) return;
    const int64_t numel = col.numel();
    Status st = m.SetTensorCopy(init(), col.dtype, {numel}, col.bytes.data(),
                                static_cast<size_t>(numel) * transport::ItemSize(col.dtype));
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  put(kPromptTokens, [&] { return r.initPromptTokens(); });
  put(kPromptOffsets, [&] { return r.initPromptOffsets(); });
  put(kResponseTokens, [&] { return r.initResponseTokens(); });
  put(kResponseOffsets, [&] { return r.initResponseOffsets(); });
  put(kLogprobs, [&] { return r.initBehaviourLogprobs(); });
  put(kMask, [&] { return r.initLossMask(); });
  put(kTokenVersions, [&] { return r.initTokenVersions(); });
  put(kSequenceVersions, [&] { return r.initSequenceVersions(); });
  auto meta = r.initSequences(static_cast<unsigned>(d.group_of.size()));
  for (unsigned i = 0; i < meta.size(); ++i) {
    meta[i].setGroupIndex(d.group_of[i]);
    meta[i].setTask("reverse");
    meta[i].setPromptText("ab=");
    meta[i].setResponseText("ba");
  }
}

void BuildScored(const Draft& d, transport::OutMessage* m) {
  auto sb = m->envelope().getBody().initScoredBatch();
  FillRollout(d, *m, sb.initRollout());
  const Column& rw = d.cols[kRewards];
  if (rw.present) {
    const int64_t numel = rw.numel();
    Status st = m->SetTensorCopy(sb.initRewards(), rw.dtype, {numel}, rw.bytes.data(),
                                 static_cast<size_t>(numel) * transport::ItemSize(rw.dtype));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  auto details = sb.initDetails(static_cast<unsigned>(d.unscored.size()));
  for (unsigned i = 0; i < details.size(); ++i) {
    details[i].setScorer("reverse");
    if (d.unscored[i]) details[i].setUnscored(true);
  }
  sb.setScorer("reward-0");
}

std::vector<std::string> Frames(const transport::OutMessage& m) {
  return transport::fuzz::EncodeFrames(m, 0, "reward-0");
}

Result<transport::InMessage> Decode(std::vector<std::string> frames) {
  auto owner = std::make_shared<std::vector<std::string>>(std::move(frames));
  transport::FrameSet fs;
  for (const auto& f : *owner) fs.frames.push_back({f.data(), f.size()});
  fs.owner = owner;
  transport::DecodeLimits limits;  // the receive path's validation (deep), smaller sizes
  limits.max_message_bytes = 4 << 20;
  limits.traversal_limit_words = 1 << 20;
  return transport::DecodeMessage(std::move(fs), limits);
}

// A refusal must say what is wrong: one of the fields, in the wire's or the trainer's spelling.
bool NamesAField(const std::string& message) {
  static const char* const kNames[] = {
      "batch id",           "batch_id",         "promptTokens",       "promptOffsets",
      "responseTokens",     "responseOffsets",  "behaviourLogprobs",  "lossMask",
      "sequenceVersions",   "rewards",          "reward of sequence", "scoredBatch",
      "prompt_offsets",     "response_offsets", "prompt_tokens",      "response_tokens",
      "behaviour_logprobs", "loss_mask",        "group_size",         "group_index",
      "sequence_versions",  "empty prompt",     "has no sequences"};
  for (const char* n : kNames)
    if (message.find(n) != std::string::npos) return true;
  return false;
}

// What the learner does with a received message before it offers the batch, with the
// properties checked on the way. Returns "read" / "valid" / the stage that refused it.
std::string LearnerPipeline(const transport::InMessage& msg, Rng& rng, const std::string& what) {
  BatchOrigin origin;
  std::vector<uint8_t> unscored;
  auto read = ReadTrainBatch(msg, &origin, &unscored);
  if (!read.ok()) {
    EXPECT_TRUE(NamesAField(read.status().message())) << what << ": " << read.status().ToString();
    return "read";
  }
  trainer::TrainBatch b = std::move(read).value();
  const trainer::BatchLimits limits{kVocab, 0};
  const trainer::TrainBatch sent = b;
  const Status valid = trainer::ValidateTrainBatch(b, limits);
  if (!valid.ok()) {
    EXPECT_TRUE(NamesAField(valid.message())) << what << ": " << valid.ToString();
  }
  EXPECT_EQ(static_cast<int64_t>(unscored.size()),
            std::max<int64_t>(
                0, msg.envelope().getBody().getScoredBatch().getRollout().getNumSequences()))
      << what;

  // Unscored samples out, then the per-group lag gate at a learner version near the batch's.
  const int64_t n0 = b.num_sequences();
  const int64_t removed_unscored = b.RemoveSequences(unscored);
  const uint64_t learner = b.policy_version + rng() % 5;
  const trainer::LagGate gate(static_cast<int64_t>(rng() % 3));
  const int64_t removed_stale = trainer::RemoveStaleSequences(&b, gate, learner);
  EXPECT_GE(removed_unscored, 0);
  EXPECT_GE(removed_stale, 0);
  EXPECT_EQ(n0, b.num_sequences() + removed_unscored + removed_stale) << what;
  // Which sent sequences should be left, in order: exactly the flagged ones leave in the first
  // step, exactly the stale ones in the second.
  std::vector<int64_t> expect;
  for (int64_t i = 0; i < n0; ++i) {
    if (removed_unscored > 0 && unscored[static_cast<size_t>(i)]) continue;
    if (removed_stale > 0 &&
        gate.Check(learner, sent.sequence_versions[static_cast<size_t>(i)]).code() == Code::kStale)
      continue;
    expect.push_back(i);
  }
  EXPECT_EQ(static_cast<int64_t>(expect.size()), b.num_sequences()) << what;
  auto same_bytes = [](const auto& x, const auto& y) {  // NaN equals itself here
    using T = typename std::decay_t<decltype(x)>::value_type;
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
  };
  if (removed_unscored + removed_stale == 0) {
    // Nothing removed: the batch is exactly as read.
    EXPECT_TRUE(same_bytes(sent.prompt_tokens, b.prompt_tokens) &&
                same_bytes(sent.response_offsets, b.response_offsets) &&
                same_bytes(sent.behaviour_logprobs, b.behaviour_logprobs) &&
                same_bytes(sent.rewards, b.rewards) && sent.policy_version == b.policy_version)
        << what;
  }
  const int64_t kept = removed_unscored + removed_stale == 0
                           ? 0
                           : std::min<int64_t>(b.num_sequences(), expect.size());
  for (int64_t k = 0; k < kept; ++k) {
    const int64_t i = expect[static_cast<size_t>(k)];
    auto span = [](const auto& col, const std::vector<int64_t>& off, int64_t s) {
      using T = typename std::decay_t<decltype(col)>::value_type;
      return std::vector<T>(col.begin() + off[s], col.begin() + off[s + 1]);
    };
    EXPECT_EQ(span(sent.prompt_tokens, sent.prompt_offsets, i),
              span(b.prompt_tokens, b.prompt_offsets, k))
        << what << " sequence " << i;
    EXPECT_EQ(span(sent.response_tokens, sent.response_offsets, i),
              span(b.response_tokens, b.response_offsets, k))
        << what << " sequence " << i;
    EXPECT_EQ(span(sent.loss_mask, sent.response_offsets, i),
              span(b.loss_mask, b.response_offsets, k))
        << what << " sequence " << i;
    EXPECT_TRUE(same_bytes(span(sent.behaviour_logprobs, sent.response_offsets, i),
                           span(b.behaviour_logprobs, b.response_offsets, k)))
        << what << " sequence " << i;
    // Removal happens only when there is one reward per sequence (RemoveSequences' guard).
    EXPECT_TRUE(same_bytes(std::vector<float>{sent.rewards[static_cast<size_t>(i)]},
                           std::vector<float>{b.rewards[static_cast<size_t>(k)]}))
        << what << " sequence " << i;
  }
  if (valid.ok() && b.num_sequences() > 0) {
    const Status after = trainer::ValidateTrainBatch(b, limits);
    EXPECT_TRUE(after.ok()) << what
                            << ": a valid batch became invalid when thinned: " << after.ToString();
    if (!b.sequence_versions.empty()) {
      for (uint64_t v : b.sequence_versions) EXPECT_GE(v, b.policy_version) << what;
    }
  }
  return valid.ok() ? "valid" : "validate";
}

// One to three faults of the kinds a peer (buggy or hostile) could send.
std::string Corrupt(Draft* d, Rng& rng) {
  std::string said;
  const int faults = 1 + static_cast<int>(rng() % 3);
  for (int f = 0; f < faults; ++f) {
    const Col c = static_cast<Col>(rng() % kNumCols);
    Column& col = d->cols[c];
    const int64_t n = col.numel();
    switch (rng() % 12) {
      case 0:
        col.present = false;
        said += std::string(kWireName[c]) + " missing; ";
        break;
      case 1: {  // another dtype over the same bytes
        static const wire::DType kTypes[] = {wire::DType::INT32, wire::DType::INT64,
                                             wire::DType::FLOAT32, wire::DType::UINT8,
                                             wire::DType::FLOAT64};
        col.dtype = kTypes[rng() % 5];
        col.bytes.resize(col.bytes.size() / transport::ItemSize(col.dtype) *
                         transport::ItemSize(col.dtype));
        said += std::string(kWireName[c]) + " dtype " + transport::DTypeName(col.dtype) + "; ";
        break;
      }
      case 2:  // one element short
        if (n > 0) col.bytes.resize(col.bytes.size() - transport::ItemSize(col.dtype));
        said += std::string(kWireName[c]) + " one short; ";
        break;
      case 3: {  // one element long
        const size_t item = transport::ItemSize(col.dtype);
        for (size_t k = 0; k < item; ++k) col.bytes.push_back(static_cast<uint8_t>(rng()));
        said += std::string(kWireName[c]) + " one long; ";
        break;
      }
      case 4:
      case 5:
      case 6: {  // an interesting value at a random place
        if (n == 0) break;
        const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
        switch (col.dtype) {
          case wire::DType::INT64: {
            static const int64_t kV[] = {-1,
                                         0,
                                         1,
                                         1 << 20,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()};
            col.Set<int64_t>(i, kV[rng() % 6]);
            break;
          }
          case wire::DType::INT32: {
            static const int32_t kV[] = {-1, kVocab, std::numeric_limits<int32_t>::max(),
                                         std::numeric_limits<int32_t>::min()};
            col.Set<int32_t>(i, kV[rng() % 4]);
            break;
          }
          case wire::DType::FLOAT32: {
            static const float kV[] = {std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(), 1.5f, -1e30f};
            col.Set<float>(i, kV[rng() % 5]);
            break;
          }
          default:
            col.bytes[static_cast<size_t>(i) * transport::ItemSize(col.dtype)] =
                static_cast<uint8_t>(2 + rng() % 254);
        }
        said += std::string(kWireName[c]) + "[" + std::to_string(i) + "] odd; ";
        break;
      }
      case 7:
        d->num_sequences = rng() % 2 ? d->num_sequences + 1
                                     : (rng() % 2 ? 0 : std::numeric_limits<uint32_t>::max());
        said += "numSequences " + std::to_string(d->num_sequences) + "; ";
        break;
      case 8:
        d->policy_version += 1 + rng() % 3;  // above a group's version
        said += "policyVersion raised; ";
        break;
      case 9:
        d->group_size = rng() % 2 ? 0 : d->group_size + 1;
        said += "groupSize " + std::to_string(d->group_size) + "; ";
        break;
      case 10:
        if (rng() % 2 && !d->group_of.empty())
          d->group_of.pop_back();
        else
          d->unscored.push_back(1);
        said += "meta/detail count off; ";
        break;
      default:
        if (rng() % 2)
          d->batch_id.clear();
        else
          d->unscored.assign(d->unscored.size(), 1);
        said += "batch id empty or all unscored; ";
    }
  }
  return said;
}

void Mutate(std::vector<std::string>* frames, Rng& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !frames->empty(); ++e) {
    std::string& f = (*frames)[rng() % frames->size()];
    switch (rng() % 6) {
      case 0:
      case 1:
        if (!f.empty()) f[rng() % f.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 2:
        if (f.size() >= 8) {
          static const uint64_t kWords[] = {0, ~uint64_t{0}, 1, 0x7fffffff, 0xfffffff0ull << 32};
          const uint64_t w = kWords[rng() % 5];
          std::memcpy(&f[(rng() % (f.size() / 8)) * 8], &w, 8);
        }
        break;
      case 3:
        f.resize(rng() % (f.size() + 1));
        break;
      case 4:
        frames->erase(frames->begin() + static_cast<long>(rng() % frames->size()));
        break;
      default:
        frames->push_back((*frames)[rng() % frames->size()]);
    }
  }
}

TEST(BatchCodecFuzz, StructuralCorruptionIsRefusedNamingTheFieldAndNothingElseChanges) {
  Rng rng(Seed());
  int refused_read = 0, refused_valid = 0, valid = 0;
  for (int it = 0; it < 30000; ++it) {
    Draft d = GoodDraft(rng);
    const std::string said = it % 10 == 0 ? "good" : Corrupt(&d, rng);
    try {
      transport::OutMessage m;
      BuildScored(d, &m);
      if (::testing::Test::HasFatalFailure()) return;
      auto in = Decode(Frames(m));
      ASSERT_TRUE(in.ok()) << said << in.status().ToString();
      const std::string stage = LearnerPipeline(*in, rng, said);
      refused_read += stage == "read";
      refused_valid += stage == "validate";
      valid += stage == "valid";
      if (said == "good") {
        EXPECT_EQ(stage, "valid");
      }
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << " (" << said << ") threw: " << e.what();
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "iteration " << it << ": " << said;
      return;
    }
  }
  std::printf("structural: refused at read %d, at validation %d, valid %d\n", refused_read,
              refused_valid, valid);
  // Every stage was reached (the corruption is neither too weak nor too strong to test them).
  EXPECT_GT(refused_read, 1000);
  EXPECT_GT(refused_valid, 1000);
  EXPECT_GT(valid, 3000);
}

TEST(BatchCodecFuzz, MutatedFramesNeverCrashTheRewardOrTheLearnerPath) {
  Rng rng(Seed() + 1);
  int decoded = 0, scored_read = 0, forwarded = 0;
  for (int it = 0; it < 40000; ++it) {
    Draft d = GoodDraft(rng);
    if (rng() % 3 == 0) Corrupt(&d, rng);
    const bool rollout = rng() % 2 == 0;  // what the reward actor receives, or the learner
    transport::OutMessage m;
    if (rollout)
      FillRollout(d, m, m.envelope().getBody().initRolloutBatch());
    else
      BuildScored(d, &m);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<std::string> frames = Frames(m);
    Mutate(&frames, rng);
    const std::string what = "iteration " + std::to_string(it);
    try {
      auto in = Decode(std::move(frames));
      if (!in.ok()) continue;
      ++decoded;
      if (in->kind() == transport::MessageKind::ROLLOUT_BATCH) {
        // The reward actor: read what to score, forward the scores, then the learner reads it.
        std::string id;
        uint32_t n = 0;
        auto items = ReadScoringItems(*in, &id, &n);
        if (!items.ok()) {
          EXPECT_TRUE(NamesAField(items.status().message()) ||
                      items.status().message().find("numSequences") != std::string::npos ||
                      items.status().message().find("rolloutBatch") != std::string::npos)
              << what << ": " << items.status().ToString();
          continue;
        }
        std::vector<RewardRecord> rewards(items->size());
        transport::OutMessage scored;
        Status st = ForwardScored(*in, rewards, "reward-0", 1, &scored);
        if (!st.ok()) {
          EXPECT_TRUE(NamesAField(st.message()) ||
                      st.message().find("tokenVersions") != std::string::npos)
              << what << ": " << st.ToString();
          continue;
        }
        ++forwarded;
        auto again = Decode(Frames(scored));
        ASSERT_TRUE(again.ok()) << what << ": a forwarded batch does not decode: "
                                << again.status().ToString();
        LearnerPipeline(*again, rng, what + " (forwarded)");
      } else if (in->kind() == transport::MessageKind::SCORED_BATCH) {
        ++scored_read;
        LearnerPipeline(*in, rng, what);
      } else {
        // Another kind altogether: the learner refuses it by kind, naming what it expected.
        BatchOrigin origin;
        auto b = ReadTrainBatch(*in, &origin);
        ASSERT_FALSE(b.ok()) << what;
        EXPECT_NE(b.status().message().find("expected a scoredBatch"), std::string::npos);
      }
    } catch (const std::exception& e) {
      FAIL() << what << " threw: " << e.what();
    }
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("bytes: decoded %d of 40000, scored batches read %d, rollout batches forwarded %d\n",
              decoded, scored_read, forwarded);
  EXPECT_GT(decoded, 2000);
  EXPECT_GT(forwarded, 500);
}

// One fault each: refused, at the stage that should see it, naming the field.
TEST(BatchCodecFuzz, EachFaultIsRefusedWhereItShouldBeNamingItsField) {
  struct Case {
    const char* name;
    void (*apply)(Draft*);
    const char* stage;  // "read" or "validate"
    const char* field;
  };
  const Case cases[] = {
      {"empty batch id", [](Draft* d) { d->batch_id.clear(); }, "read", "batch id"},
      {"promptOffsets missing", [](Draft* d) { d->cols[kPromptOffsets].present = false; }, "read",
       "promptOffsets"},
      {"promptOffsets as int32",
       [](Draft* d) { d->cols[kPromptOffsets].dtype = wire::DType::INT32; }, "read",
       "promptOffsets"},
      {"responseOffsets decreasing",
       [](Draft* d) { d->cols[kResponseOffsets].Set<int64_t>(1, -1); }, "read", "responseOffsets"},
      {"responseTokens one short",
       [](Draft* d) {
         d->cols[kResponseTokens].bytes.resize(d->cols[kResponseTokens].bytes.size() - 4);
       },
       "read", "behaviourLogprobs"},  // the column sized by the response tokens says so first
      {"lossMask one long", [](Draft* d) { d->cols[kMask].bytes.push_back(1); }, "read",
       "lossMask"},
      {"rewards as int32", [](Draft* d) { d->cols[kRewards].dtype = wire::DType::INT32; }, "read",
       "rewards"},
      {"sequenceVersions one short",
       [](Draft* d) {
         d->cols[kSequenceVersions].bytes.resize(d->cols[kSequenceVersions].bytes.size() - 8);
       },
       "read", "sequenceVersions"},
      {"a group older than the batch", [](Draft* d) { d->policy_version += 1; }, "read",
       "sequenceVersions"},
      {"numSequences one more", [](Draft* d) { d->num_sequences += 1; }, "read", "promptOffsets"},
      {"a reward NaN",
       [](Draft* d) { d->cols[kRewards].Set<float>(0, std::numeric_limits<float>::quiet_NaN()); },
       "validate", "reward of sequence 0"},
      {"one reward short",
       [](Draft* d) { d->cols[kRewards].bytes.resize(d->cols[kRewards].bytes.size() - 4); },
       "validate", "rewards has"},
      {"a token outside the vocabulary",
       [](Draft* d) { d->cols[kPromptTokens].Set<int32_t>(0, kVocab); }, "validate",
       "prompt_tokens[0]"},
      {"a positive log-prob on a trained token",
       [](Draft* d) {
         Column& mask = d->cols[kMask];
         mask.Set<uint8_t>(0, 1);
         d->cols[kLogprobs].Set<float>(0, 0.5f);
       },
       "validate", "behaviour_logprobs[0]"},
      {"a loss mask of 2", [](Draft* d) { d->cols[kMask].Set<uint8_t>(0, 2); }, "validate",
       "loss_mask[0]"},
      {"group size 0", [](Draft* d) { d->group_size = 0; }, "validate", "group_size"},
  };
  Rng rng(Seed() + 2);
  for (const Case& c : cases) {
    for (int rep = 0; rep < 20; ++rep) {
      Draft d = GoodDraft(rng);
      d.unscored.assign(d.unscored.size(), 0);
      c.apply(&d);
      transport::OutMessage m;
      BuildScored(d, &m);
      auto in = Decode(Frames(m));
      ASSERT_TRUE(in.ok()) << c.name << ": " << in.status().ToString();
      BatchOrigin origin;
      auto b = ReadTrainBatch(*in, &origin);
      Status st = b.ok() ? trainer::ValidateTrainBatch(*b, {kVocab, 0}) : b.status();
      const std::string stage = b.ok() ? "validate" : "read";
      ASSERT_FALSE(st.ok()) << c.name << ": accepted";
      EXPECT_EQ(stage, c.stage) << c.name << ": " << st.ToString();
      EXPECT_NE(st.message().find(c.field), std::string::npos)
          << c.name << ": does not name " << c.field << ": " << st.ToString();
    }
  }
}

}  // namespace
}  // namespace troupe::actors
