// Chaos: a seeded schedule of faults against the default job, every role hit.
//
//   SIGKILL the learner (twice: once in the middle of a checkpoint write),
//   SIGKILL the reward actor while it holds scored batches, SIGKILL a rollout
//   actor, SIGSTOP/SIGCONT a rollout actor — in a seeded order, each after a
//   seeded number of further updates (never after a wall-clock sleep).
//
// Then the job must complete, and:
//   * the learner resumed each time (no second warm start, the version line
//     continues: final version = warm start + updates);
//   * the accounting equation holds exactly with every term reported, and no
//     check of the head's failed (nothing counted twice, no decision lost);
//   * the learner's ledger (<run>/batches.tsv) names every batch once, and its
//     sums are the summary's trained / skipped / dropped figures;
//   * no actor process outlives the job.
//
// The seed comes from TROUPE_CHAOS_SEED (bench/actors/chaos.py runs many) or
// is random; it is printed first. A failed run leaves its folder for reading.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using e2e::Job;

enum class Fault { kKillLearner, kKillLearnerInCheckpoint, kKillReward, kKillRollout, kStopRollout };

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kKillLearner:
      return "SIGKILL learner-0";
    case Fault::kKillLearnerInCheckpoint:
      return "SIGKILL learner-0 during a checkpoint write";
    case Fault::kKillReward:
      return "SIGKILL reward-0 holding scored batches";
    case Fault::kKillRollout:
      return "SIGKILL a rollout actor";
    case Fault::kStopRollout:
      return "SIGSTOP a rollout actor, SIGCONT later";
  }
  return "?";
}

uint32_t Seed() {
  const char* s = std::getenv("TROUPE_CHAOS_SEED");
  return s && *s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
}

double Step(const ControlResult& st) {
  auto it = st.progress.find("step");
  return it == st.progress.end() ? -1 : it->second;
}

class Chaos {
 public:
  Chaos(Job& job, std::mt19937& rng) : job_(job), rng_(rng) {}

  // Waits until the job made `n` more updates than the furthest seen so far
  // (a restarted learner repeats updates since its checkpoint: counted once).
  bool Advance(int n) {
    double target = furthest_ + n;
    return job_.WaitStatus(
        [&](const ControlResult& st) {
          furthest_ = std::max(furthest_, Step(st));
          return Step(st) >= target;
        },
        300000);
  }

  void Apply(Fault f) {
    std::printf("[chaos] at update %.0f: %s\n", furthest_, FaultName(f));
    std::fflush(stdout);
    switch (f) {
      case Fault::kKillLearner:
        return Kill(job_.PidOf("learner-0"));
      case Fault::kKillLearnerInCheckpoint:
        return KillInCheckpoint();
      case Fault::kKillReward:
        return KillRewardHolding();
      case Fault::kKillRollout:
        return Kill(job_.PidOf(Rollout()));
      case Fault::kStopRollout:
        return StopAndContinue();
    }
  }

 private:
  std::string Rollout() { return rng_() % 2 ? "rollout-1" : "rollout-0"; }

  void Kill(int pid) {
    ASSERT_GT(pid, 0) << job_.Output();
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
  }

  // The learner stalls at the checkpoint stage the job names
  // (checkpoint.fault_stall_stage) once the trigger file exists; it is killed there.
  void KillInCheckpoint() {
    auto run = job_.run();
    ASSERT_TRUE(run.ok());
    const int pid = job_.PidOf("learner-0");
    const fs::path marker = fs::path(run->path) / "fault-stalled-checkpoint";
    fs::remove(marker);
    std::ofstream(fs::path(run->path) / "fault-stall-checkpoint") << "chaos\n";
    ASSERT_TRUE(e2e::Eventually([&] { return fs::exists(marker); }, 120000))
        << "the learner never reached the stalled checkpoint stage\n"
        << job_.Output();
    Kill(pid);
    fs::remove(marker);
  }

  // Killed while it waits for the learner's answer on scored batches (with
  // ack = checkpoint it almost always does): they are re-sent and not lost.
  void KillRewardHolding() {
    int pid = 0;
    ASSERT_TRUE(job_.WaitStatus(
        [&](const ControlResult& st) {
          for (const auto& a : st.actors) {
            auto it = a.stats.find("awaiting_learner");
            if (a.id == "reward-0" && a.state == "ready" && it != a.stats.end() &&
                it->second > 0)
              pid = a.pid;
          }
          return pid > 0;
        },
        120000))
        << job_.Output();
    Kill(pid);
  }

  // Stopped long enough, with the seed's luck, to be declared lost and
  // replaced (the head SIGKILLs it) or to come back and carry on.
  void StopAndContinue() {
    const int pid = job_.PidOf(Rollout());
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    const int stopped_for = 5 + static_cast<int>(rng_() % 25);  // updates of the other actor
    Advance(stopped_for);
    if (e2e::Alive(pid)) ::kill(pid, SIGCONT);
  }

  Job& job_;
  std::mt19937& rng_;
  double furthest_ = 0;
};

TEST(Chaos, EveryRoleKilledTheLearnerTwiceAndTheAccountingStaysExact) {
  const uint32_t seed = Seed();
  std::printf("chaos seed %u (rerun: TROUPE_CHAOS_SEED=%u)\n", seed, seed);
  std::fflush(stdout);
  std::mt19937 rng(seed);
  std::vector<Fault> faults = {Fault::kKillLearner, Fault::kKillLearnerInCheckpoint,
                               Fault::kKillReward, Fault::kKillRollout, Fault::kStopRollout};
  std::shuffle(faults.begin(), faults.end(), rng);
  const char* stages[] = {"model", "optimizer", "state", "extra", "renamed"};
  const std::string stage = stages[rng() % 5];
  std::printf("checkpoint stage for the stalled write: %s\n", stage.c_str());

  const int kMaxSteps = 260;
  Job job("tiny_reverse.yaml",
          e2e::Short(kMaxSteps, {"learner.max_restarts=8", "rollout.max_restarts=8",
                                 "reward.max_restarts=8", "checkpoint.fault_stall_stage=" + stage}),
          e2e::TestDir("chaos"));
  Chaos chaos(job, rng);
  ASSERT_TRUE(chaos.Advance(10)) << job.Output();
  for (Fault f : faults) {
    chaos.Apply(f);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(chaos.Advance(8 + static_cast<int>(rng() % 20))) << job.Output();
  }
  auto e = job.Wait(900000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();

  // Resumed, never restarted from scratch.
  EXPECT_EQ(job.Metrics("warm_start").size(), 1u) << "a restarted learner warmed up again";
  EXPECT_EQ(job.Metrics("resume").size(), 2u) << job.Output();
  auto summary = job.Metrics("summary");
  ASSERT_FALSE(summary.empty());
  const auto& s = summary.back();
  EXPECT_EQ(s.value("learner_restarts", 0.0), 2.0) << s.dump();
  EXPECT_GT(s.value("restart_lost_s", 0.0), 0.0) << s.dump();
  const double steps = s.value("steps", 0.0), skipped = s.value("skipped_updates", 0.0);
  EXPECT_EQ(steps + skipped, kMaxSteps) << s.dump();
  // The version line continued: warm start (100 supervised updates) + RL updates.
  auto finals = job.Finals("learner-0");
  ASSERT_FALSE(finals.empty());
  EXPECT_EQ(finals.back().value("policy_version", 0.0), 100.0 + steps) << finals.back().dump();

  e2e::ExpectAccountingHolds(job);
  auto js = job.Metrics("job_summary");
  ASSERT_EQ(js.size(), 1u);
  const auto& a = js[0]["accounting"];
  for (const char* t : {"generated", "trained", "skipped", "dropped_stale", "dropped_invalid",
                        "dropped_unscored", "in_flight", "lost_with_actor", "lost_with_learner"})
    EXPECT_TRUE(a.contains(t)) << "accounting term not reported: " << t << " in " << a.dump();
  EXPECT_EQ(a.value("dropped_invalid", -1.0), 0.0) << a.dump();

  // The ledger: every batch once; its sums are the summary's.
  auto run = job.run();
  ASSERT_TRUE(run.ok());
  auto ledger = e2e::ReadLedger(run->path);
  ASSERT_TRUE(ledger) << "no batch ledger";
  std::set<std::string> ids;
  std::map<std::string, double> sums;
  for (const e2e::LedgerRow& r : *ledger) {
    ASSERT_GE(r.columns, 4) << r.line;
    EXPECT_TRUE(ids.insert(r.id).second) << "batch " << r.id << " decided twice";
    sums[r.fate] += r.sequences;
    sums["dropped_unscored"] += r.unscored;
    sums["dropped_stale"] += r.stale;  // sequences of groups too old on arrival, left out
  }
  EXPECT_GT(ids.size(), 0u);
  for (const char* t : {"trained", "skipped", "dropped_stale", "dropped_unscored"})
    EXPECT_EQ(sums[t], a.value(t, -1.0)) << t;
}

}  // namespace
}  // namespace troupe::launcher
