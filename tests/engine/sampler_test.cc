// SampleRow (engine/src/sampler.h, private to the engine): inverse-CDF sampling over a
// vocabulary-sized row of log-probs, as the engine draws every token. Rows are Qwen-sized
// (151,936 ids) so the block skipping of the scan is exercised across many blocks and at
// block edges.
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "../../engine/src/sampler.h"

namespace troupe::engine {
namespace {

constexpr int64_t kVocab = 151936;

// Log-probs of a distribution given as {id: probability}; every other id shares `rest`.
std::vector<float> Row(const std::map<int64_t, double>& mass, double rest) {
  double given = 0;
  for (const auto& [id, p] : mass) given += p;
  const double other = rest / static_cast<double>(kVocab - static_cast<int64_t>(mass.size()));
  std::vector<float> logp(kVocab, static_cast<float>(std::log(other)));
  for (const auto& [id, p] : mass) logp[static_cast<size_t>(id)] = static_cast<float>(std::log(p));
  EXPECT_NEAR(given + rest, 1.0, 1e-12);
  return logp;
}

// The plain definition: the first id whose running sum (in double) of the row's float
// probabilities exceeds u times their total.
int32_t Reference(const std::vector<float>& probs, double total, double u) {
  double cum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    cum += static_cast<double>(probs[i]);
    if (cum > u * total) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(probs.size() - 1);
}

TEST(Sampler, FrequenciesMatchTheDistributionAcrossBlocks) {
  // Mass at both sides of block edges (512-id blocks), deep inside, and on the last id.
  const std::map<int64_t, double> mass = {{0, 0.05},    {511, 0.10},   {512, 0.15},  {70001, 0.2},
                                          {151423, 0.1}, {151935, 0.3}};
  const double rest = 0.1;  // spread over the other 151,930 ids
  const std::vector<float> logp = Row(mass, rest);
  SamplingParams sp;
  sp.temperature = 1.0;
  const uint64_t seed = 20261201;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  constexpr int kDraws = 16000;
  std::map<int32_t, int> counts;
  SampleScratch scratch;
  int others = 0;
  for (int d = 0; d < kDraws; ++d) {
    Rng rng(seed, static_cast<uint64_t>(d));
    const int32_t tok = SampleRow(logp.data(), kVocab, sp, rng, scratch);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, kVocab);
    if (mass.count(tok)) ++counts[tok];
    else ++others;
  }
  auto expect_binomial = [&](int got, double p, const std::string& what) {
    const double mean = p * kDraws, sd = std::sqrt(kDraws * p * (1 - p));
    EXPECT_NEAR(got, mean, 5 * sd) << what << ": " << got << " of " << kDraws;
  };
  for (const auto& [id, p] : mass) expect_binomial(counts[static_cast<int32_t>(id)], p, "id " + std::to_string(id));
  expect_binomial(others, rest, "the other ids");
}

TEST(Sampler, SameTokenAsThePlainSequentialScan) {
  // Random rows (a peaked part and a long tail), random u: the block-skipping scan picks
  // exactly the token the one-id-at-a-time definition picks.
  SampleScratch scratch;
  SamplingParams sp;
  sp.temperature = 1.0;
  const uint64_t seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng gen(seed, 99);
  std::vector<float> logp(kVocab);
  for (int row = 0; row < 8; ++row) {
    double z = 0;
    for (auto& l : logp) {
      const double g = -std::log(1.0 - gen.Uniform());  // Exp(1): a peaked row
      l = static_cast<float>(-g * (row + 1));
      z += std::exp(static_cast<double>(l));
    }
    for (auto& l : logp) l = static_cast<float>(l - std::log(z));
    // exp in float as SampleRow takes it (ATen's vectorised exp, equal to within 1 ulp: the
    // few draws that land within that of a boundary are not expected among 300).
    std::vector<float> probs(logp.size());
    double total = 0;
    for (size_t i = 0; i < logp.size(); ++i) total += probs[i] = std::exp(logp[i]);
    for (int d = 0; d < 300; ++d) {
      Rng a(seed + static_cast<uint64_t>(row), static_cast<uint64_t>(d));
      Rng b = a;
      const int32_t got = SampleRow(logp.data(), kVocab, sp, a, scratch);
      ASSERT_EQ(got, Reference(probs, total, b.Uniform())) << "row " << row << " draw " << d;
    }
  }
}

TEST(Sampler, GreedyTopKAndTopPKeepTheirCandidates) {
  const std::vector<float> logp = Row({{5, 0.5}, {600, 0.3}, {151000, 0.15}}, 0.05);
  SampleScratch scratch;
  Rng rng(1, 0);
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(SampleRow(logp.data(), kVocab, greedy, rng, scratch), 5);
  SamplingParams top2;
  top2.temperature = 1.0;
  top2.top_k = 2;
  SamplingParams nucleus;
  nucleus.temperature = 1.0;
  nucleus.top_p = 0.9;  // 0.5 + 0.3 + 0.15 reaches it
  std::map<int32_t, int> k2, p9;
  for (int d = 0; d < 400; ++d) {  // top-p sorts the whole row per draw: few draws
    Rng a(3, static_cast<uint64_t>(d)), b(4, static_cast<uint64_t>(d));
    ++k2[SampleRow(logp.data(), kVocab, top2, a, scratch)];
    ++p9[SampleRow(logp.data(), kVocab, nucleus, b, scratch)];
  }
  EXPECT_EQ(k2.size(), 2u);
  EXPECT_GT(k2[5], k2[600]);
  EXPECT_EQ(p9.size(), 3u);
  EXPECT_GT(p9[151000], 0);
}

}  // namespace
}  // namespace troupe::engine
