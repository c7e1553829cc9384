// The learner's batch ledger: decisions survive a restart exactly as a
// checkpoint recorded them, and nothing else does.
#include "batch_ledger.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

struct TempFile {
  fs::path dir = fs::path(::testing::TempDir()) / ("ledger." + std::to_string(::getpid()));
  TempFile() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempFile() { fs::remove_all(dir); }
  std::string path() const { return (dir / "batches.tsv").string(); }
};

TEST(BatchLedger, CountsPerSourceAndTerm) {
  TempFile f;
  auto l = BatchLedger::Open(f.path(), 0);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->Record("r0/a/1", "r0/a", "trained", 32, 0).ok());
  ASSERT_TRUE((*l)->Record("r0/a/2", "r0/a", "dropped_stale", 32, 0).ok());
  ASSERT_TRUE((*l)->Record("r1/b/1", "r1/b", "trained", 28, 4).ok());
  ASSERT_TRUE((*l)->Record("r1/b/2", "r1/b", "skipped", 32, 0).ok());
  const auto& c = (*l)->Counts();
  EXPECT_EQ(c.at("r0/a").trained, 32);
  EXPECT_EQ(c.at("r0/a").dropped_stale, 32);
  EXPECT_EQ(c.at("r1/b").trained, 28);
  EXPECT_EQ(c.at("r1/b").dropped_unscored, 4);
  EXPECT_EQ(c.at("r1/b").skipped, 32);
  EXPECT_EQ((*l)->Total().decided(), 32 + 32 + 28 + 4 + 32);
  ASSERT_NE((*l)->Find("r0/a/2"), nullptr);
  EXPECT_EQ((*l)->Find("r0/a/2")->fate, "dropped_stale");
  EXPECT_EQ((*l)->Find("r9/x/1"), nullptr);
}

// Sequences of a batch's groups left out as too old on arrival (the per-group lag gate) count
// as dropped_stale, also after a reopen; a ledger line of five columns (written before the
// per-group gate) reads as none left out.
TEST(BatchLedger, GroupsLeftOutAsStaleCountAsDroppedStaleAndOldLinesStillRead) {
  TempFile f;
  {
    std::ofstream old(f.path());
    old << "r0/a/1\ttrained\t32\t0\tr0/a\n";
  }
  {
    auto l = BatchLedger::Open(f.path(), -1);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ((*l)->Find("r0/a/1")->stale, 0);
    ASSERT_TRUE((*l)->Record("r0/a/2", "r0/a", "trained", 24, 0, 8).ok());
    ASSERT_TRUE((*l)->Record("r0/a/3", "r0/a", "trained", 20, 4, 8).ok());
    const LedgerCounts& c = (*l)->Counts().at("r0/a");
    EXPECT_EQ(c.trained, 32 + 24 + 20);
    EXPECT_EQ(c.dropped_stale, 16);
    EXPECT_EQ(c.dropped_unscored, 4);
    EXPECT_EQ(c.decided(), 32 + 32 + 32);
    ASSERT_TRUE((*l)->Sync().ok());
  }
  auto again = BatchLedger::Open(f.path(), -1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->Find("r0/a/2")->stale, 8);
  EXPECT_EQ((*again)->Total().dropped_stale, 16);
  EXPECT_EQ((*again)->Total().decided(), 96);
  {
    std::ofstream bad(f.path(), std::ios::app);
    bad << "r0/a/4\ttrained\t8\t0\tr0/a\tmany\n";
  }
  auto malformed = BatchLedger::Open(f.path(), -1);
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("line 4"), std::string::npos)
      << malformed.status().ToString();
}

TEST(BatchLedger, ReopenedAtACheckpointsSizeForgetsLaterDecisions) {
  TempFile f;
  int64_t at_checkpoint = 0;
  {
    auto l = BatchLedger::Open(f.path(), 0);
    ASSERT_TRUE(l.ok());
    ASSERT_TRUE((*l)->Record("r0/a/1", "r0/a", "trained", 8, 0).ok());
    auto size = (*l)->Sync();
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    at_checkpoint = *size;
    EXPECT_GT(at_checkpoint, 0);
    // Decided after the checkpoint, then the process dies (buffered or not).
    ASSERT_TRUE((*l)->Record("r0/a/2", "r0/a", "trained", 8, 0).ok());
    ASSERT_TRUE((*l)->Sync().ok());
  }
  auto l = BatchLedger::Open(f.path(), at_checkpoint);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ((*l)->size(), 1u);
  EXPECT_NE((*l)->Find("r0/a/1"), nullptr);
  EXPECT_EQ((*l)->Find("r0/a/2"), nullptr) << "a decision the checkpoint did not cover survived";
  // The batch is decided again after the restart: one line, not two.
  ASSERT_TRUE((*l)->Record("r0/a/2", "r0/a", "dropped_stale", 8, 0).ok());
  ASSERT_TRUE((*l)->Sync().ok());
  auto again = BatchLedger::Open(f.path(), -1);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->Find("r0/a/2")->fate, "dropped_stale");
  EXPECT_EQ((*again)->Total().trained, 8);
  EXPECT_EQ((*again)->Total().dropped_stale, 8);
}

TEST(BatchLedger, FreshStartTruncatesALeftover) {
  TempFile f;
  {
    auto l = BatchLedger::Open(f.path(), 0);
    ASSERT_TRUE(l.ok());
    ASSERT_TRUE((*l)->Record("x/1", "x", "trained", 1, 0).ok());
    ASSERT_TRUE((*l)->Sync().ok());
  }
  auto l = BatchLedger::Open(f.path(), 0);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->size(), 0u);
}

TEST(BatchLedger, DamagedFilesAreRefusedByName) {
  TempFile f;
  {
    std::ofstream out(f.path());
    out << "r0/a/1\ttrained\t8\t0\tr0/a\n";
    out << "r0/a/2\teaten\t8\t0\tr0/a\n";
  }
  auto bad = BatchLedger::Open(f.path(), -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find(f.path()), std::string::npos);
  // A checkpoint that recorded more bytes than the file has: refused, not guessed.
  auto longer = BatchLedger::Open(f.path(), 100000);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("truncated or replaced"), std::string::npos);
  {
    std::ofstream out(f.path());
    out << "r0/a/1\ttrained\t8\t0\tr0/a\nr0/a/1\ttrained\t8\t0\tr0/a\n";
  }
  auto twice = BatchLedger::Open(f.path(), -1);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("second time"), std::string::npos);
  {
    std::ofstream out(f.path());
    out << "r0/a/1\ttrained\t8\t0\tr0/a\nr0/a/2\ttrai";
  }
  auto cut = BatchLedger::Open(f.path(), -1);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("incomplete"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
