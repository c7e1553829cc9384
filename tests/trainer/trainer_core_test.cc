// Unit tests of the trainer's pure parts: advantages, the decoupled PPO loss
// (hand-computed values), the lag gate, config and batch validation, the
// learning-rate schedule and micro-batch packing.
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "troupe/trainer/advantages.h"
#include "troupe/trainer/batch.h"
#include "troupe/trainer/config.h"
#include "troupe/trainer/lag_gate.h"
#include "troupe/trainer/loss.h"
#include "troupe/trainer/metrics.h"
#include "troupe/trainer/lr_schedule.h"
#include "troupe/trainer/packing.h"

namespace troupe::trainer {
namespace {

using ::testing::HasSubstr;

AdvantageResult Adv(const std::vector<float>& rewards, uint32_t group_size, AdvantageEstimator e) {
  std::vector<int64_t> group_of;
  int64_t groups = AssignGroups({}, group_size, static_cast<int64_t>(rewards.size()), &group_of);
  return ComputeAdvantages(rewards, group_of, groups, e, 1e-6);
}

TEST(Advantages, GrpoHandComputed) {
  // Group 0: rewards 1,0,0,1: mean 0.5, unbiased std sqrt(1/3). Group 1: all equal.
  auto r = Adv({1, 0, 0, 1, 2, 2, 2, 2}, 4, AdvantageEstimator::kGrpo);
  const double a = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-6);
  EXPECT_NEAR(r.advantages[0], a, 1e-6);
  EXPECT_NEAR(r.advantages[1], -a, 1e-6);
  EXPECT_NEAR(r.advantages[2], -a, 1e-6);
  EXPECT_NEAR(r.advantages[3], a, 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(r.advantages[i], 0.0f);
  EXPECT_EQ(r.groups, 2);
  EXPECT_EQ(r.uniform_groups, 1);
  EXPECT_EQ(r.in_uniform, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(Advantages, DrGrpoAndRlooHandComputed) {
  auto dr = Adv({3, 1, 2}, 3, AdvantageEstimator::kDrGrpo);
  EXPECT_NEAR(dr.advantages[0], 1.0, 1e-6);
  EXPECT_NEAR(dr.advantages[1], -1.0, 1e-6);
  EXPECT_NEAR(dr.advantages[2], 0.0, 1e-6);
  // RLOO: r_i - mean of the others: 3 - 1.5, 1 - 2.5, 2 - 2.
  auto rl = Adv({3, 1, 2}, 3, AdvantageEstimator::kRloo);
  EXPECT_NEAR(rl.advantages[0], 1.5, 1e-6);
  EXPECT_NEAR(rl.advantages[1], -1.5, 1e-6);
  EXPECT_NEAR(rl.advantages[2], 0.0, 1e-6);
  EXPECT_EQ(rl.uniform_groups, 0);
}

TEST(Advantages, SingletonAndExplicitGroupsAreHandled) {
  // Uneven groups given by index, in any order; a singleton group is uniform.
  std::vector<int64_t> group_of;
  int64_t groups = AssignGroups({7, 3, 7, 9, 3}, 1, 5, &group_of);
  EXPECT_EQ(groups, 3);
  EXPECT_EQ(group_of, (std::vector<int64_t>{0, 1, 0, 2, 1}));
  auto r = ComputeAdvantages({1, 5, 0, 4, 5}, group_of, groups, AdvantageEstimator::kRloo, 1e-6);
  EXPECT_NEAR(r.advantages[0], 1.0, 1e-6);
  EXPECT_NEAR(r.advantages[2], -1.0, 1e-6);
  EXPECT_EQ(r.advantages[1], 0.0f);
  EXPECT_EQ(r.advantages[3], 0.0f);
  EXPECT_EQ(r.uniform_groups, 2);
}

TEST(Loss, ClippedDecoupledHandComputed) {
  // Token 0: on-policy ratio 1, stale weight exp(0.2), A=+1 -> -exp(0.2).
  // Token 1: ratio e^0.5 > 1.28 with A=+2 -> clipped to 1.28*2, w=1 -> -2.56.
  // Token 2: ratio e^-1 < 0.8 with A=-1 -> min(-0.368, -0.8) = -0.8 (clipped),
  //          weight e^2 truncated to the cap 5 -> +4.
  // Token 3: environment token (mask 0) with wild values: ignored.
  auto f = [](std::vector<float> v) { return at::tensor(v, at::kFloat); };
  PolicyLossInputs in;
  in.logprobs = f({-1.0f, -0.5f, -2.0f, -100.0f}).requires_grad_(true);
  in.proximal_logprobs = f({-1.0f, -1.0f, -1.0f, 0.0f});
  in.behaviour_logprobs = f({-1.2f, -1.0f, -3.0f, -50.0f});
  in.advantages = f({1.0f, 2.0f, -1.0f, 7.0f});
  in.mask = f({1, 1, 1, 0});
  in.token_weights = f({1.0f / 3, 1.0f / 3, 1.0f / 3, 0.0f});
  PolicyLossCoefficients c;
  c.clip_low = 0.2;
  c.clip_high = 0.28;
  c.is_cap = 5.0;
  auto out = ComputePolicyLoss(in, c);
  const double expected = (-std::exp(0.2) - 2.56 + 4.0) / 3.0;
  EXPECT_NEAR(out.loss.item<double>(), expected, 1e-5);
  EXPECT_NEAR(out.stats.loss, expected, 1e-5);
  EXPECT_EQ(out.stats.tokens, 3);
  EXPECT_EQ(out.stats.clipped, 2);
  EXPECT_EQ(out.stats.truncated, 1);
  EXPECT_NEAR(out.stats.is_weight_sum, std::exp(0.2) + 1.0 + 5.0, 1e-4);
  EXPECT_NEAR(out.stats.is_weight_max, std::exp(2.0), 1e-3);
  EXPECT_NEAR(out.stats.ratio_max, std::exp(0.5), 1e-5);
  EXPECT_NEAR(out.stats.mismatch_sum, 0.2 + 0.0 + 2.0, 1e-5);
  EXPECT_NEAR(out.stats.mismatch_max, 2.0, 1e-5);
  // Raw weights 1 in (0.95, 1.05], e^0.2 in (1.1, 1.25], e^2 above the last edge (2); the
  // masked token in none.
  ASSERT_EQ(out.stats.is_weight_histogram.size(), IsWeightEdges().size() + 1);
  EXPECT_EQ(out.stats.is_weight_histogram, (std::vector<double>{0, 0, 0, 0, 1, 0, 1, 0, 1}));
  // Gradient: only the unclipped token carries one, -w*A*ratio*weight.
  out.loss.backward();
  auto g = in.logprobs.grad();
  EXPECT_NEAR(g[0].item<double>(), -std::exp(0.2) / 3.0, 1e-5);
  EXPECT_EQ(g[1].item<double>(), 0.0);
  EXPECT_EQ(g[2].item<double>(), 0.0);
  EXPECT_EQ(g[3].item<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(out.loss.item<double>()));
}

TEST(Loss, KlK3AndEntropyTerms) {
  auto f = [](std::vector<float> v) { return at::tensor(v, at::kFloat); };
  PolicyLossInputs in;
  in.logprobs = f({-1.0f, -3.0f}).requires_grad_(true);
  in.proximal_logprobs = f({-1.0f, -3.0f});
  in.behaviour_logprobs = f({-1.0f, -3.0f});
  in.advantages = f({0.0f, 0.0f});
  in.mask = f({1, 0});
  in.token_weights = f({1.0f, 0.0f});
  in.reference_logprobs = f({-1.5f, -90.0f});
  in.entropy = f({0.7f, 3.0f});
  PolicyLossCoefficients c;
  c.kl_coef = 0.1;
  c.entropy_coef = 0.01;
  auto out = ComputePolicyLoss(in, c);
  const double k3 = std::exp(-0.5) + 0.5 - 1.0;
  EXPECT_NEAR(out.stats.kl_sum, k3, 1e-6);
  EXPECT_NEAR(out.stats.entropy_sum, 0.7, 1e-6);
  EXPECT_NEAR(out.loss.item<double>(), 0.1 * k3 - 0.01 * 0.7, 1e-6);
  EXPECT_NEAR(out.stats.pg_loss, 0.0, 1e-9);
}

TEST(Loss, OnPolicyFirstUpdateIsPlainPolicyGradient) {
  // logp == prox == behav: ratio 1, weight 1, gradient -A * weight per token.
  at::manual_seed(1);
  at::Tensor lp = -at::rand({4, 5}) * 3;
  PolicyLossInputs in;
  in.logprobs = lp.clone().requires_grad_(true);
  in.proximal_logprobs = lp;
  in.behaviour_logprobs = lp;
  in.advantages = at::randn({4, 5});
  in.mask = at::ones({4, 5});
  in.token_weights = at::full({4, 5}, 1.0f / 20);
  auto out = ComputePolicyLoss(in, PolicyLossCoefficients{});
  out.loss.backward();
  EXPECT_TRUE(at::allclose(in.logprobs.grad(), -in.advantages / 20, 1e-6, 1e-7));
  EXPECT_EQ(out.stats.clipped, 0);
  EXPECT_NEAR(out.stats.mismatch_max, 0.0, 1e-7);
  EXPECT_NEAR(out.stats.is_weight_sum, 20.0, 1e-5);
}

TEST(Entropy, UniformAndPeaked) {
  at::Tensor logits = at::zeros({1, 2, 8});
  logits[0][1][3] = 100.0;
  at::Tensor h = TokenEntropy(logits, 1.0);
  EXPECT_NEAR(h[0][0].item<double>(), std::log(8.0), 1e-5);
  EXPECT_NEAR(h[0][1].item<double>(), 0.0, 1e-5);
}

TEST(LagGate, AcceptsWithinLagRejectsStaleAndFuture) {
  LagGate gate(2);
  EXPECT_TRUE(gate.Check(5, 5).ok());
  EXPECT_TRUE(gate.Check(5, 3).ok());
  Status stale = gate.Check(5, 2);
  EXPECT_EQ(stale.code(), Code::kStale);
  EXPECT_THAT(stale.message(), HasSubstr("3 versions behind"));
  EXPECT_THAT(stale.message(), HasSubstr("max_policy_lag 2"));
  Status future = gate.Check(5, 6);
  EXPECT_EQ(future.code(), Code::kProtocol);
  EXPECT_THAT(future.message(), HasSubstr("version 6"));
  EXPECT_THAT(future.message(), HasSubstr("version 5"));
  EXPECT_TRUE(LagGate(0).Check(0, 0).ok());
  EXPECT_EQ(LagGate(0).Check(1, 0).code(), Code::kStale);
}

TEST(Config, DefaultsValidAndErrorsNameTheField) {
  LearnerConfig c;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  EXPECT_EQ(c.effective_max_policy_lag(), 0);
  c.updates_per_batch = 3;
  EXPECT_EQ(c.effective_max_policy_lag(), 2);
  c.max_policy_lag = -1;
  Status s = c.Validate();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_policy_lag = -1"));
  c.max_policy_lag = 1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("updates_per_batch - 1 = 2"));
  c.max_policy_lag = 4;
  EXPECT_TRUE(c.Validate().ok());
  c.lr = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(c.Validate().message(), HasSubstr("trainer.lr"));
  c = LearnerConfig{};
  c.clip_low = 1.5;
  EXPECT_THAT(c.Validate().message(), HasSubstr("clip_low"));
  c = LearnerConfig{};
  c.is_cap = 0.5;
  EXPECT_THAT(c.Validate().message(), HasSubstr("is_cap"));
  c = LearnerConfig{};
  c.warmup_steps = 20;
  c.total_steps = 10;
  EXPECT_THAT(c.Validate().message(), HasSubstr("warmup_steps"));
  // trainer.device: cpu, cuda or cuda:N; a CUDA learner trains with one thread.
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:12"}) {
    c = LearnerConfig{};
    c.device = ok;
    EXPECT_TRUE(c.Validate().ok()) << ok << ": " << c.Validate().ToString();
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:1a", "CPU", ""}) {
    c = LearnerConfig{};
    c.device = bad;
    EXPECT_THAT(c.Validate().message(), HasSubstr("trainer.device = '" + std::string(bad) + "'"))
        << bad;
  }
  c = LearnerConfig{};
  c.device = "cuda";
  c.threads = 2;
  EXPECT_THAT(c.Validate().message(), HasSubstr("trainer.threads = 2 with trainer.device cuda"));
  EXPECT_EQ(ParseAdvantageEstimator("rloo").value(), AdvantageEstimator::kRloo);
  EXPECT_THAT(ParseAdvantageEstimator("ppo").status().message(), HasSubstr("'ppo'"));
  EXPECT_EQ(ParseLossAggregation("sequence_mean").value(), LossAggregation::kSequenceMean);
}

TEST(LrSchedule, WarmupCosineFloor) {
  LrSchedule s{1e-3, 4, 104, 0.1};
  EXPECT_NEAR(s.At(0), 0.25e-3, 1e-12);
  EXPECT_NEAR(s.At(3), 1e-3, 1e-12);
  EXPECT_NEAR(s.At(4), 1e-3, 1e-12);
  EXPECT_NEAR(s.At(54), 1e-3 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_NEAR(s.At(104), 1e-4, 1e-12);
  EXPECT_NEAR(s.At(10000), 1e-4, 1e-12);
  for (int64_t i = 4; i < 104; ++i) EXPECT_LE(s.At(i + 1), s.At(i) + 1e-15);
}

TrainBatch GoodBatch() {
  TrainBatch b;
  b.batch_id = "r0/1";
  b.group_size = 2;
  b.AddSequence({1, 2}, {3, 4}, {-0.5f, -0.1f}, {1, 1}, 1.0f);
  b.AddSequence({1, 2}, {5, 6, 7}, {-0.5f, 0.0f, -0.2f}, {1, 0, 1}, 0.0f);
  return b;
}

TEST(BatchValidation, AcceptsGoodBatch) {
  EXPECT_TRUE(ValidateTrainBatch(GoodBatch(), {32, 0}).ok());
}

TEST(BatchValidation, RewardShapeAndFiniteness) {
  TrainBatch b = GoodBatch();
  b.rewards.push_back(1.0f);
  Status s = ValidateTrainBatch(b, {32, 0});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rewards has 3 entries but the batch has 2 sequences"));
  b = GoodBatch();
  b.rewards.clear();
  EXPECT_THAT(ValidateRewards(b).message(), HasSubstr("rewards has 0 entries"));
  b = GoodBatch();
  b.rewards[1] = std::numeric_limits<float>::quiet_NaN();
  s = ValidateTrainBatch(b, {32, 0});
  EXPECT_THAT(s.message(), HasSubstr("reward of sequence 1 is nan"));
  b.rewards[1] = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(ValidateRewards(b).message(), HasSubstr("reward of sequence 1 is -inf"));
}

TEST(BatchValidation, ColumnsAndRanges) {
  auto msg = [](const TrainBatch& b) { return ValidateTrainBatch(b, {32, 6}).message(); };
  TrainBatch b = GoodBatch();
  b.response_tokens[1] = 40;
  EXPECT_THAT(msg(b), HasSubstr("response_tokens[1] = 40 is outside the vocabulary"));
  b = GoodBatch();
  b.prompt_offsets[1] = 5;
  EXPECT_THAT(msg(b), HasSubstr("prompt_offsets decreases"));
  b = GoodBatch();
  b.response_offsets.back() = 9;
  EXPECT_THAT(msg(b), HasSubstr("response_offsets ends at 9"));
  b = GoodBatch();
  b.loss_mask[0] = 2;
  EXPECT_THAT(msg(b), HasSubstr("loss_mask[0] = 2"));
  b = GoodBatch();
  b.behaviour_logprobs[4] = 0.5f;
  EXPECT_THAT(msg(b), HasSubstr("behaviour_logprobs[4] = 0.5"));
  b = GoodBatch();
  b.behaviour_logprobs[1] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(msg(b), HasSubstr("behaviour_logprobs[1] = inf"));
  b = GoodBatch();
  b.behaviour_logprobs.pop_back();
  EXPECT_THAT(msg(b), HasSubstr("behaviour_logprobs has 4 entries"));
  b = GoodBatch();
  b.group_size = 3;
  EXPECT_THAT(msg(b), HasSubstr("group_size 3"));
  b = GoodBatch();
  b.AddSequence({1, 2, 3, 4}, {5, 6, 7}, {-1, -1, -1}, {1, 1, 1}, 0.0f);
  b.AddSequence({1}, {5}, {-1}, {1}, 0.0f);
  EXPECT_THAT(msg(b), HasSubstr("sequence 2 has 7 tokens (prompt 4 + response 3), limit 6"));
  b = GoodBatch();
  b.AddSequence({}, {5}, {-1}, {1}, 0.0f);
  b.AddSequence({1}, {5}, {-1}, {1}, 0.0f);
  EXPECT_THAT(msg(b), HasSubstr("sequence 2 has an empty prompt"));
  EXPECT_THAT(ValidateTrainBatch(TrainBatch{}, {32, 0}).message(), HasSubstr("no sequences"));
  // The batch id is named in every message.
  EXPECT_THAT(msg(b), HasSubstr("batch 'r0/1'"));
  b = GoodBatch();
  b.batch_id.clear();
  EXPECT_THAT(msg(b), HasSubstr("batch_id is empty"));
}

TEST(Packing, LayoutMatchesTheDefinition) {
  // Sequence A: prompt [1 2], response [3 4]   -> inputs [1 2 3],   targets at 1,2.
  // Sequence B: prompt [5], response [6 7 8] with mask 1 0 1 -> inputs [5 6 7].
  std::vector<int32_t> pa = {1, 2}, ra = {3, 4}, pb = {5}, rb = {6, 7, 8};
  std::vector<float> ba = {-0.1f, -0.2f}, bb = {-0.3f, 0.0f, -0.5f};
  std::vector<uint8_t> ma = {1, 1}, mb_ = {1, 0, 1};
  std::vector<SequenceView> seqs(2);
  seqs[0] = {pa.data(), 2, ra.data(), 2, ba.data(), ma.data(), 1.5f, 0.25f, 0};
  seqs[1] = {pb.data(), 1, rb.data(), 3, bb.data(), mb_.data(), -1.0f, 0.5f, 2};
  auto plan = PlanMicroBatches(seqs, 6);
  ASSERT_EQ(plan.size(), 1u);
  auto mb = PackMicroBatch(seqs, plan[0]);
  EXPECT_EQ(mb.rows, 2);
  EXPECT_EQ(mb.length, 3);
  EXPECT_EQ(mb.trained_tokens, 4);
  auto L = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).view({2, 3}); };
  auto F = [](std::vector<float> v) { return at::tensor(v, at::kFloat).view({2, 3}); };
  EXPECT_TRUE(at::equal(mb.ids, L({1, 2, 3, 5, 6, 7})));
  EXPECT_TRUE(at::equal(mb.targets, L({0, 3, 4, 6, 7, 8})));
  EXPECT_TRUE(at::equal(mb.mask, F({0, 1, 1, 1, 0, 1})));
  EXPECT_TRUE(at::equal(mb.behaviour, F({0, -0.1f, -0.2f, -0.3f, 0, -0.5f})));
  EXPECT_TRUE(at::equal(mb.advantages, F({0, 1.5f, 1.5f, -1, -1, -1})));
  EXPECT_TRUE(at::equal(mb.weights, F({0, 0.25f, 0.25f, 0.5f, 0, 0.5f})));
  EXPECT_TRUE(at::equal(mb.flat_index, L({-1, 0, 1, 2, 3, 4})));
  EXPECT_TRUE(at::equal(mb.valid_flat_index, at::tensor(std::vector<int64_t>{0, 1, 2, 3, 4})));
  // A budget of 3 tokens splits them; longer first.
  plan = PlanMicroBatches(seqs, 3);
  ASSERT_EQ(plan.size(), 2u);
}

TEST(Packing, BudgetIsRespected) {
  std::vector<int32_t> tok(40, 1);
  std::vector<SequenceView> seqs;
  for (int len : {5, 9, 3, 12, 7, 7, 2, 30}) {
    SequenceView v;
    v.prompt = tok.data();
    v.prompt_len = 2;
    v.response = tok.data();
    v.response_len = len;
    seqs.push_back(v);
  }
  auto plan = PlanMicroBatches(seqs, 24);
  size_t total = 0;
  for (const auto& rows : plan) {
    int64_t longest = 0;
    for (int64_t r : rows) longest = std::max(longest, seqs[r].input_len());
    if (rows.size() > 1) {
      EXPECT_LE(static_cast<int64_t>(rows.size()) * longest, 24);
    }
    total += rows.size();
  }
  EXPECT_EQ(total, seqs.size());
}

}  // namespace
}  // namespace troupe::trainer
