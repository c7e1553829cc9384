// The job summary's accounting (DESIGN invariant 4) from the actors' reports:
// generated = trained + skipped + dropped_* + in_flight + lost_*, with every
// sequence in exactly one column, and the checks that catch what a sum cannot
// (a batch trained twice, decisions lost with a learner).
#include <gtest/gtest.h>

#include "accounting.h"

namespace troupe::launcher {
namespace {

using Kind = IncarnationReport::Kind;

double Rest(const Accounting& a) {
  double s = 0;
  for (const auto& t : AccountingTerms()) s += a.terms.at(t);
  return s;
}

IncarnationReport Producer(const std::string& source, double generated, double resolved,
                           Kind kind = Kind::kFinal, double by_reward = 0) {
  return {source,
          {{"generated", generated},
           {"resolved", resolved},
           {"in_flight", generated - resolved},
           {"rejected_by_reward", by_reward}},
          kind,
          "rollout"};
}

// The learner's final report: its ledger per source ("<term>:<source>").
IncarnationReport Learner(std::map<std::string, double> ledger, const std::string& source = "l/1") {
  ledger["ledger_batches"] = 1;
  return {source, ledger, Kind::kFinal, "learner"};
}

// CI failure of an earlier design (scale 3 -> 1): two drained rollout actors
// left before the learner's next checkpoint acknowledged their last batches;
// the learner then trained all of them. They are trained, not also in flight.
TEST(Accounting, BatchesDecidedAfterTheirProducerLeftAreNotAlsoInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 3104, 3040),
      Producer("rollout-1/b", 2112, 1664),
      Producer("rollout-2/c", 608, 224),
      Learner({{"trained:rollout-0/a", 3040},
               {"trained:rollout-1/b", 2112},
               {"trained:rollout-2/c", 608}}),
      {"reward-0/e", {{"scored", 5824}}, Kind::kFinal, "reward"}};
  auto a = SumAccounting(r);
  EXPECT_TRUE(a.holds()) << a.problems.size();
  EXPECT_EQ(a.terms["generated"], 5824);
  EXPECT_EQ(a.terms["trained"], 5760);
  EXPECT_EQ(a.terms["in_flight"], 64);
  EXPECT_EQ(a.terms["generated"], Rest(a));
}

// Still undecided at the end (held by the learner, or between the actors).
TEST(Accounting, UndecidedSequencesStayInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 640, 448),
      Learner({{"trained:rollout-0/a", 448}, {"held:rollout-0/a", 128}})};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["in_flight"], 192);  // 128 at the learner, 64 still on their way
  EXPECT_TRUE(a.holds());
}

// Updates without signal (every group uniform) train nothing: their
// sequences are skipped, a term of their own, not trained.
TEST(Accounting, SkippedSequencesAreNotTrained) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 256),
      Learner({{"trained:rollout-0/a", 64}, {"skipped:rollout-0/a", 192}})};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["trained"], 64);
  EXPECT_EQ(a.terms["skipped"], 192);
  EXPECT_TRUE(a.holds());
}

// A batch the reward actor rejected as unscorable: the producer got its
// answer (not in flight), the learner never saw it.
TEST(Accounting, RejectedByTheRewardActorIsInvalidNotInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 256, Kind::kFinal, 64),
      Learner({{"trained:rollout-0/a", 192}}),
      // A reward actor's own count is not added again (the producer's is the record).
      {"reward-0/e", {{"dropped_invalid", 64}}, Kind::kFinal, "reward"}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["in_flight"], 0);
  EXPECT_EQ(a.terms["dropped_invalid"], 64);
  EXPECT_TRUE(a.holds());
}

// A producer that died: its last stats may predate batches that reached the
// learner; what the learner never got is lost with it.
TEST(Accounting, ADeadProducerGeneratedAtLeastWhatReachedTheLearner) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 128, 64, Kind::kDead),  // stats from before its last 2 batches
      Producer("rollout-0/b", 320, 320),              // its replacement
      Learner({{"trained:rollout-0/a", 128},
               {"held:rollout-0/a", 64},
               {"trained:rollout-0/b", 256},
               {"dropped_stale:rollout-0/b", 64}})};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["generated"], 128 + 64 + 320);
  EXPECT_EQ(a.terms["in_flight"], 64);
  EXPECT_EQ(a.terms["dropped_stale"], 64);
  EXPECT_EQ(a.terms["lost_with_actor"], 0);
  EXPECT_TRUE(a.holds());

  // Its last stats claim more than the learner ever got: the rest is lost.
  r[0] = Producer("rollout-0/a", 320, 64, Kind::kDead);
  a = SumAccounting(r);
  EXPECT_EQ(a.terms["lost_with_actor"], 320 - 128 - 64);
  EXPECT_TRUE(a.holds());
}

// A batch trained twice (e.g. a restarted learner that lost its dedupe
// state): the learner decided more than the producer made. The sum cannot
// show that by itself; the check does, and the equation does not hold.
TEST(Accounting, ALearnerDecidingMoreThanWasGeneratedIsAMismatch) {
  std::vector<IncarnationReport> r = {Producer("rollout-0/a", 256, 256),
                                      Learner({{"trained:rollout-0/a", 320}})};
  auto a = SumAccounting(r);
  EXPECT_FALSE(a.holds());
  ASSERT_EQ(a.problems.size(), 1u);
  EXPECT_NE(a.problems[0].find("64 counted twice"), std::string::npos) << a.problems[0];
}

// Answered to the producer but absent from the learner's ledger: decisions
// lost with a learner (acknowledged before a checkpoint covered them:
// checkpoint.ack = trained, then a crash). A term of its own.
TEST(Accounting, AnsweredButUndecidedIsLostWithTheLearner) {
  std::vector<IncarnationReport> r = {Producer("rollout-0/a", 256, 256),
                                      Learner({{"trained:rollout-0/a", 192}})};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["lost_with_learner"], 64);
  EXPECT_EQ(a.terms["in_flight"], 0);
  EXPECT_TRUE(a.holds());
}

// Only the learner's last report counts: its ledger came back with its
// checkpoint, so a dead incarnation's figures are already in it.
TEST(Accounting, ADeadLearnersCountersAreNotAddedToItsRestoredOnes) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 256),
      {"learner-0/old", {{"trained", 128}}, Kind::kDead, "learner"},
      Learner({{"trained:rollout-0/a", 256}}, "learner-0/new")};
  auto a = SumAccounting(r);
  EXPECT_EQ(a.terms["trained"], 256);
  EXPECT_TRUE(a.holds());
}

// Decisions about a producer nobody reported (a forged batch id): named.
TEST(Accounting, DecisionsAboutAnUnknownProducerAreNamed) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 256),
      Learner({{"trained:rollout-0/a", 256}, {"trained:evil-0/x", 64}})};
  auto a = SumAccounting(r);
  EXPECT_FALSE(a.holds());
  ASSERT_EQ(a.problems.size(), 1u);
  EXPECT_NE(a.problems[0].find("evil-0/x"), std::string::npos);
}

// Without the learner's final report the producers' own figures stand in,
// and the summary says the accounting is incomplete.
TEST(Accounting, NoFinalLearnerReportIsNamed) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 192),
      {"learner-0/x", {{"trained", 192}}, Kind::kFinal, "learner"}};
  auto a = SumAccounting(r);
  EXPECT_FALSE(a.holds());
  EXPECT_EQ(a.terms["in_flight"], 64);
}

}  // namespace
}  // namespace troupe::launcher
