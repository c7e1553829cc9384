// RolloutSampler: what a scored batch puts in rollouts.jsonl. Real wire
// messages (BuildRolloutBatch -> ForwardScored over the in-memory network),
// a character tokenizer; a multi-turn sequence's environment tokens come out
// as their own segment, the quota per update holds across batches, and
// every figure is the batch's. Also the codec's per-group versions and the learner's
// per-group lag gate on them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "batch_codec.h"
#include "rollout_sampler.h"
#include "troupe/trainer/lag_gate.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/transport/memory_network.h"

namespace troupe::actors {
namespace {

using nlohmann::json;

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = engine::CharTokenizer::Create("=abcdefghijklmnopqrstuvwxyz<>");
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(tok).value();
    a_ = fabric_.NewNetwork({"a", 1});
    b_ = fabric_.NewNetwork({"b", 2});
    auto srv = b_->Bind(transport::SocketKind::kServer, "mem://sampler", {});
    ASSERT_TRUE(srv.ok());
    server_ = std::move(srv).value();
    transport::SocketOptions o;
    o.identity = "a";
    auto cli = a_->Connect(transport::SocketKind::kClient, server_->endpoint(), o);
    ASSERT_TRUE(cli.ok()) << cli.status().ToString();
    client_ = std::move(cli).value();
  }
  transport::InMessage RoundTrip(const transport::OutMessage& m) {
    EXPECT_TRUE(client_->Send(m, Deadline::InMs(2000)).ok());
    auto in = server_->Recv(Deadline::InMs(2000));
    EXPECT_TRUE(in.ok()) << in.status().ToString();
    return in.ok() ? std::move(in->message) : transport::InMessage();
  }
  std::vector<int32_t> Ids(const std::string& s) { return *tok_->Encode(s); }
  // A scored batch of `n` sequences (one group); sequence 1 is multi-turn:
  // model "read", tool output "<xy>" (mask 0), model "yx".
  transport::InMessage Scored(const std::string& id, int n, uint64_t version) {
    std::vector<SequenceRecord> seqs;
    for (int i = 0; i < n; ++i) {
      SequenceRecord r;
      r.prompt = Ids("ab=");
      r.prompt_text = "ab=";
      r.task = "reverse";
      r.prompt_id = "reverse/train/" + std::to_string(i);
      r.reference = "ba";
      if (i == 1) {
        r.response = Ids("read<xy>yx");
        r.mask = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1};
        r.response_text = "read<xy>yx";
      } else {
        r.response = Ids("ba");
        r.mask = {1, 1};
        r.response_text = "ba";
      }
      r.logprobs.assign(r.response.size(), -0.5f);
      for (size_t k = 0; k < r.mask.size(); ++k)
        if (!r.mask[k]) r.logprobs[k] = 0;
      r.token_versions.assign(r.response.size(), version);
      seqs.push_back(r);
    }
    RolloutBatchInfo info;
    info.batch_id = id;
    info.policy_version = version;
    info.producer = "rollout-0";
    info.group_size = static_cast<uint32_t>(n);
    transport::OutMessage rollout;
    EXPECT_TRUE(BuildRolloutBatch(info, seqs, &rollout).ok());
    transport::InMessage in = RoundTrip(rollout);
    std::vector<RewardRecord> rewards(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      rewards[static_cast<size_t>(i)].reward = i == 1 ? 0.25f : 1.0f;
      rewards[static_cast<size_t>(i)].scorer = "reverse";
      rewards[static_cast<size_t>(i)].components = {{"exact", i == 1 ? 0.0 : 1.0}};
    }
    rewards[2 % static_cast<size_t>(n)].failure = n > 2 ? "verifier timed out" : "";
    transport::OutMessage scored;
    EXPECT_TRUE(ForwardScored(in, rewards, "reward-0", 5, &scored).ok());
    return RoundTrip(scored);
  }
  launcher::JobConfig Job(uint32_t per_update) {
    launcher::JobConfig j;
    j.rollout_samples.per_update = per_update;
    j.batch.prompts_per_update = 4;  // 2 batches per update
    j.batch.groups_per_message = 2;
    return j;
  }

  std::unique_ptr<engine::Tokenizer> tok_;
  transport::MemoryFabric fabric_;
  std::unique_ptr<transport::Network> a_, b_;
  std::unique_ptr<transport::Socket> server_, client_;
};

TEST_F(SamplerTest, RecordsCarryTheBatchsFiguresAndMarkEnvironmentTokens) {
  RolloutSampler s(Job(100), tok_.get(), 7);
  json out = s.Sample(Scored("rollout-0/x/1", 3, 10), 12, 5);
  ASSERT_EQ(out.size(), 3u) << out.dump();  // the quota allows all of them
  for (const auto& r : out) {
    EXPECT_EQ(r["step"], 5);
    EXPECT_EQ(r["learner_version"], 12);
    EXPECT_EQ(r["policy_version"], 10);
    EXPECT_EQ(r["lag"], 2);
    EXPECT_EQ(r["batch_id"], "rollout-0/x/1");
    EXPECT_EQ(r["producer"], "rollout-0");
    EXPECT_EQ(r["task"], "reverse");
    EXPECT_EQ(r["scorer"], "reverse");
    EXPECT_EQ(r["prompt_text"], "ab=");
    EXPECT_EQ(r["reference"], "ba");
    EXPECT_EQ(r["prompt_tokens"].size(), 3u) << r.dump();
    EXPECT_EQ(r["response_tokens"].size(), r["loss_mask"].size());
    EXPECT_EQ(r["token_versions"][0], 10);
  }
  const json& multi = out[1];
  EXPECT_EQ(multi["index"], 1);
  EXPECT_DOUBLE_EQ(multi["reward"].get<double>(), 0.25);
  EXPECT_EQ(multi["env_tokens"], 4);
  ASSERT_EQ(multi["segments"].size(), 3u) << multi.dump();
  EXPECT_EQ(multi["segments"][0], json({{"mask", 1}, {"text", "read"}}));
  EXPECT_EQ(multi["segments"][1], json({{"mask", 0}, {"text", "<xy>"}}));
  EXPECT_EQ(multi["segments"][2], json({{"mask", 1}, {"text", "yx"}}));
  EXPECT_FALSE(out[0].contains("segments")) << "single-turn: the response text says it all";
  EXPECT_EQ(out[2]["failure"], "verifier timed out");
  EXPECT_EQ(out[0]["components"]["exact"], 1.0);
}

TEST_F(SamplerTest, AtMostPerUpdateSpreadOverTheUpdatesBatches) {
  RolloutSampler s(Job(3), tok_.get(), 7);  // 2 batches per update: 2 from each until 3
  EXPECT_EQ(s.Sample(Scored("b1", 8, 0), 0, 1).size(), 2u);
  EXPECT_EQ(s.Sample(Scored("b2", 8, 0), 0, 1).size(), 1u);
  EXPECT_TRUE(s.Sample(Scored("b3", 8, 0), 0, 1).empty()) << "update 1's quota is used";
  EXPECT_EQ(s.Sample(Scored("b4", 8, 1), 1, 2).size(), 2u) << "a new update, a new quota";
  RolloutSampler off(Job(0), tok_.get(), 7);
  EXPECT_TRUE(off.Sample(Scored("b5", 8, 0), 0, 1).empty());
  // Distinct sequences, seeded: the same seed picks the same ones.
  RolloutSampler x(Job(8), tok_.get(), 42), y(Job(8), tok_.get(), 42);
  json px = x.Sample(Scored("c", 8, 0), 0, 1), py = y.Sample(Scored("c", 8, 0), 0, 1);
  ASSERT_EQ(px.size(), 4u);
  std::set<int> idx;
  for (size_t i = 0; i < px.size(); ++i) {
    idx.insert(px[i]["index"].get<int>());
    EXPECT_EQ(px[i]["index"], py[i]["index"]);
  }
  EXPECT_EQ(idx.size(), 4u);
}

TEST_F(SamplerTest, ABurstQueuedDuringAStepIsSampledForEachUpdateItFeeds) {
  // One batch per update: after 7 updates, batches queued 1st..4th are trained by 8..11.
  EXPECT_EQ(UpdateThatTrains(7, 1, 1), 8u);
  EXPECT_EQ(UpdateThatTrains(7, 4, 1), 11u);
  // Two per update: the 1st and 2nd feed update 8, the 3rd and 4th update 9.
  EXPECT_EQ(UpdateThatTrains(7, 2, 2), 8u);
  EXPECT_EQ(UpdateThatTrains(7, 3, 2), 9u);
  // A burst of 4 batches (2 updates' worth) arrives while the learner steps: each of the two
  // updates it feeds gets its quota, as if the batches had arrived one by one.
  RolloutSampler s(Job(3), tok_.get(), 7);
  size_t per_update[2] = {0, 0};
  for (uint64_t q = 1; q <= 4; ++q) {
    const uint64_t u = UpdateThatTrains(7, q, 2);
    per_update[u - 8] += s.Sample(Scored("burst" + std::to_string(q), 8, 0), 0, u).size();
  }
  EXPECT_EQ(per_update[0], 3u);
  EXPECT_EQ(per_update[1], 3u) << "the burst's second update got no sample";
}

// The codec's per-group versions (RolloutBatch.sequenceVersions) through the reward actor's
// forward, and the learner's per-group gate on them (RemoveStaleSequences).
TEST_F(SamplerTest, GroupVersionsTravelAndOnlyTheGroupsTooOldAreLeftOut) {
  auto scored = [&](std::vector<uint64_t> starts, uint64_t batch_version) {
    std::vector<SequenceRecord> seqs;
    for (size_t i = 0; i < starts.size(); ++i) {
      SequenceRecord r;
      r.prompt = Ids("ab=");
      r.response = Ids("ba");
      r.mask = {1, 1};
      r.logprobs = {-0.5f, -0.5f};
      r.group_index = static_cast<uint32_t>(i / 2);
      r.start_version = starts[i];
      seqs.push_back(r);
    }
    RolloutBatchInfo info;
    info.batch_id = "rollout-0/x/" + std::to_string(batch_version);
    info.policy_version = batch_version;
    info.producer = "rollout-0";
    info.group_size = 2;
    transport::OutMessage rollout;
    EXPECT_TRUE(BuildRolloutBatch(info, seqs, &rollout).ok());
    transport::InMessage in = RoundTrip(rollout);
    std::vector<RewardRecord> rewards(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) rewards[i].reward = static_cast<float>(i);
    transport::OutMessage out;
    EXPECT_TRUE(ForwardScored(in, rewards, "reward-0", 5, &out).ok());
    return RoundTrip(out);
  };
  BatchOrigin origin;
  const trainer::LagGate gate(2);
  auto b = ReadTrainBatch(scored({7, 7, 9, 9}, 7), &origin);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->sequence_versions, (std::vector<uint64_t>{7, 7, 9, 9}));
  EXPECT_EQ(b->policy_version, 7u);

  // Nothing too old (learner 9, lag 2), or all of it (learner 12): the batch stays as it came
  // (the whole-batch gate decides).
  for (uint64_t learner : {9u, 12u}) {
    trainer::TrainBatch same = *b;
    EXPECT_EQ(trainer::RemoveStaleSequences(&same, gate, learner), 0) << learner;
    EXPECT_EQ(same.num_sequences(), 4);
    EXPECT_EQ(same.policy_version, 7u);
  }
  // Learner 10: the group of version 7 is 3 behind, the one of 9 only 1.
  EXPECT_EQ(trainer::RemoveStaleSequences(&*b, gate, 10), 2);
  EXPECT_EQ(b->num_sequences(), 2);
  EXPECT_EQ(b->policy_version, 9u) << "the batch's version is its oldest group kept";
  EXPECT_EQ(b->sequence_versions, (std::vector<uint64_t>{9, 9}));
  EXPECT_EQ(b->rewards, (std::vector<float>{2.0f, 3.0f})) << "the fresh group's own rewards";
  EXPECT_TRUE(trainer::ValidateTrainBatch(*b, {}).ok());

  // A group older than the batch says it is: refused, naming the field.
  auto bad = ReadTrainBatch(scored({6, 6, 9, 9}, 7), &origin);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sequenceVersions[0] = 6"), std::string::npos)
      << bad.status().ToString();
  // A batch without them (a sequence has no version): none read, nothing removed.
  auto none = ReadTrainBatch(scored({7, 7, 9, SequenceRecord::kNoVersion}, 7), &origin);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->sequence_versions.empty());
  EXPECT_EQ(trainer::RemoveStaleSequences(&*none, gate, 10), 0);
}

TEST_F(SamplerTest, AnUnreadableBatchIsSkipped) {
  RolloutSampler s(Job(4), tok_.get(), 7);
  transport::OutMessage m;
  m.envelope().getBody().initScoredBatch();  // no batch id, no tensors
  EXPECT_TRUE(s.Sample(RoundTrip(m), 0, 1).empty());
}

}  // namespace
}  // namespace troupe::actors
