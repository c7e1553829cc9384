// The job summary's accounting (DESIGN invariant 4) from the actors' reports:
// generated = trained + dropped_stale + dropped_invalid + in_flight + lost_with_actor,
// with every sequence in exactly one column.
#include <gtest/gtest.h>

#include "accounting.h"

namespace troupe::launcher {
namespace {

using Kind = IncarnationReport::Kind;

double Rest(std::map<std::string, double> a) {
  return a["trained"] + a["dropped_stale"] + a["dropped_invalid"] + a["in_flight"] +
         a["lost_with_actor"];
}

IncarnationReport Producer(const std::string& source, double generated, double in_flight,
                           Kind kind = Kind::kFinal) {
  return {source, {{"generated", generated}, {"in_flight", in_flight}}, kind};
}

// The e2e failure this was written for (CI, scale 3 -> 1): two drained rollout
// actors left before the learner's next checkpoint acknowledged their last
// batches (2112 - 1664 and 608 - 224 sequences unanswered); the learner then
// trained all of them. Counting the actors' own "in flight" as well put those
// 832 sequences in two columns.
TEST(Accounting, BatchesDecidedAfterTheirProducerLeftAreNotAlsoInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 3104, 64),
      Producer("rollout-1/b", 2112, 448),
      Producer("rollout-2/c", 608, 384),
      {"learner-0/d",
       {{"trained", 5760},
        {"decided:rollout-0/a", 3040},
        {"decided:rollout-1/b", 2112},
        {"decided:rollout-2/c", 608}},
       Kind::kFinal},
      {"reward-0/e", {{"dropped_invalid", 0}, {"scored", 5824}}, Kind::kFinal}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a["generated"], 5824);
  EXPECT_EQ(a["trained"], 5760);
  EXPECT_EQ(a["in_flight"], 64);
  EXPECT_EQ(a["generated"], Rest(a));
}

// Still undecided at the end (held by the learner, or between the actors):
// in flight, whichever way the producer ended.
TEST(Accounting, UndecidedSequencesStayInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 640, 192),
      {"learner-0/d",
       {{"trained", 448}, {"decided:rollout-0/a", 448}, {"held:rollout-0/a", 128}},
       Kind::kFinal}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a["in_flight"], 192);  // 128 at the learner, 64 still on their way
  EXPECT_EQ(a["generated"], Rest(a));
}

// A batch the reward actor rejected as invalid: the producer got its answer
// (not in flight), the learner never saw it (not decided there).
TEST(Accounting, RejectedByTheRewardActorIsNotInFlight) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 0),
      {"learner-0/d", {{"trained", 192}, {"decided:rollout-0/a", 192}}, Kind::kFinal},
      {"reward-0/e", {{"dropped_invalid", 64}}, Kind::kFinal}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a["in_flight"], 0);
  EXPECT_EQ(a["dropped_invalid"], 64);
  EXPECT_EQ(a["generated"], Rest(a));
}

// A producer that died: its last stats may predate batches that reached the
// learner; what the learner never got is lost with it.
TEST(Accounting, ADeadProducerGeneratedAtLeastWhatReachedTheLearner) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 128, 64, Kind::kDead),  // stats from before its last 2 batches
      Producer("rollout-0/b", 320, 0),                // its replacement
      {"learner-0/d",
       {{"trained", 448},
        {"decided:rollout-0/a", 128},
        {"held:rollout-0/a", 64},
        {"decided:rollout-0/b", 320}},
       Kind::kFinal}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a["generated"], 128 + 64 + 320);
  EXPECT_EQ(a["in_flight"], 64);
  EXPECT_EQ(a["lost_with_actor"], 0);
  EXPECT_EQ(a["generated"] - a["in_flight"], 448);

  // Its last stats claim more than the learner ever got: the rest is lost.
  r[0] = Producer("rollout-0/a", 320, 192, Kind::kDead);
  a = SumAccounting(r);
  EXPECT_EQ(a["lost_with_actor"], 320 - 128 - 64);
  EXPECT_EQ(a["generated"], Rest(a) + 0.0);
}

// Counters of actors that are not producers count from their current
// incarnation only: a restarted learner restored them from its checkpoint.
TEST(Accounting, ADeadLearnersCountersAreNotAddedToItsRestoredOnes) {
  std::vector<IncarnationReport> r = {
      Producer("rollout-0/a", 256, 0),
      {"learner-0/old", {{"trained", 128}}, Kind::kDead},
      {"learner-0/new", {{"trained", 256}, {"decided:rollout-0/a", 256}}, Kind::kFinal}};
  auto a = SumAccounting(r);
  EXPECT_EQ(a["trained"], 256);
  EXPECT_EQ(a["generated"], Rest(a));
}

}  // namespace
}  // namespace troupe::launcher
