// The learner's credit book: the lag window caps grants; grants a rollout
// actor will never use (it left, or restarted) come back; nothing else does.
#include <gtest/gtest.h>

#include <deque>

#include "credit_book.h"

namespace troupe::actors {
namespace {

int64_t Total(const std::vector<std::pair<std::string, int64_t>>& g) {
  int64_t n = 0;
  for (const auto& [peer, k] : g) n += k;
  return n;
}

TEST(CreditBook, GrantsStayWithinTheLagWindowInWholeMessages) {
  CreditBook book(/*max_lag=*/2, /*groups_per_update=*/16, /*unit=*/4);
  book.Request("rollout-0", 100, 0);
  book.Request("rollout-1", 100, 0);
  auto g = book.Grant();
  EXPECT_EQ(Total(g), 40);  // (2 + 1/2) updates x 16 groups
  for (const auto& [peer, k] : g) EXPECT_EQ(k % 4, 0) << peer;
  EXPECT_EQ(Total(book.Grant()), 0);
  book.Consumed(16);  // one update's worth decided
  EXPECT_EQ(Total(book.Grant()), 16);
  // The window at other lags: lag + 1 updates at lags 0 and 1 (at lag 1 one stalled actor
  // must leave the others a whole update), lag + 1/2 updates from lag 2 on, the half rounded
  // up to whole messages.
  EXPECT_EQ(CreditBook(0, 16, 4).window(), 16);
  EXPECT_EQ(CreditBook(1, 16, 4).window(), 32);
  EXPECT_EQ(CreditBook(8, 16, 4).window(), 136);
  EXPECT_EQ(CreditBook(2, 12, 4).window(), 32);  // half of 12 is 6: two messages
  EXPECT_EQ(CreditBook(2, 4, 4).window(), 12);   // a message is the least margin
  EXPECT_EQ(CreditBook(2, 16, 16).window(), 48);
}

// One rollout actor (16 groups generating at most, 16 in reserve) against the
// book: the first grants fill its engine and its reserve; every group that
// finishes is replaced from the reserve at once, so the engine stays full while
// the learner has capacity; and what it holds never exceeds the lag window.
TEST(CreditBook, ARolloutReserveKeepsTheEngineFullWithinTheWindow) {
  EXPECT_EQ(RolloutCreditWant(16, 16, 0, 0, 4), 32);
  EXPECT_EQ(RolloutCreditWant(16, 16, 13, 16, 4), 0);  // 3 short of a message: wait
  EXPECT_EQ(RolloutCreditWant(16, 16, 12, 16, 4), 4);
  EXPECT_EQ(RolloutCreditWant(16, 0, 0, 13, 4), 0);    // no reserve: a slot waits for 4
  EXPECT_EQ(RolloutCreditWant(16, 16, 40, 16, 4), 0);  // more than asked (a late grant)
  for (int64_t lag : {0, 1, 2, 8}) {
    CreditBook book(lag, /*groups_per_update=*/16, /*unit=*/4);
    int64_t credits = 0, in_flight = 0, finished = 0, full_steps = 0, steps = 0, seen = 0;
    for (int step = 0; step < 400; ++step) {
      book.Request("rollout-0", RolloutCreditWant(16, 16, credits, in_flight, 4), seen);
      const int64_t got = Total(book.Grant());
      credits += got, seen += got;
      while (credits > 0 && in_flight < 16) --credits, ++in_flight;  // start groups
      ASSERT_LE(credits + in_flight + finished, book.window()) << "lag " << lag;
      ++steps;
      full_steps += in_flight == 16;
      --in_flight, ++finished;  // a group finishes
      if (finished == 16) {     // an update's worth delivered and trained
        ASSERT_EQ(book.Received("rollout-0", 0, 0, 16), 16);
        book.Consumed(16);
        finished = 0;
      }
    }
    // With room for more than one update, the engine is full every step; at lag 0 it
    // drains while the update's groups finish (the window holds one update).
    if (lag >= 1) {
      EXPECT_EQ(full_steps, steps) << "lag " << lag;
    }
  }
}

// Batches trained updates_per_batch (k) times: the versions advance k times an update's worth
// of groups, and a group is consumed only once retired. A learner fed at once (the rollout is
// never the bottleneck) against the book: every update uses the oldest k-times-reused set,
// groups are generated at the version of their grant. Within the window every group gets all
// its k uses within the lag (its last use at most max_lag versions after its own); with the
// window counted in updates, as without reuse, the group granted last would be first used
// beyond it (at lag 2 and k 3: 4-5 versions old, a third of the job's sequences dropped), and
// with part of an update more, that part would be trained an update later than the rest.
TEST(CreditBook, WithReuseEveryGrantedGroupGetsAllItsUpdatesWithinTheLag) {
  EXPECT_EQ(CreditBook(2, 16, 4, 0, 3).window(), 16);  // lag k - 1: one update, taking turns
  EXPECT_EQ(CreditBook(1, 16, 4, 0, 2).window(), 16);
  EXPECT_EQ(CreditBook(3, 16, 4, 0, 2).window(), 32);  // (3 + 1) / 2 updates
  EXPECT_EQ(CreditBook(5, 16, 4, 0, 3).window(), 32);  // (5 + 1) / 3
  EXPECT_EQ(CreditBook(8, 16, 4, 0, 2).window(), 64);  // 4.5 updates: whole ones
  EXPECT_EQ(CreditBook(8, 16, 4, 0, 1).window(), 136);  // k = 1: unchanged
  struct Case { int64_t lag, k; };
  for (Case c : {Case{2, 3}, Case{1, 2}, Case{3, 2}, Case{5, 3}, Case{8, 3}, Case{8, 2}}) {
    CreditBook book(c.lag, 16, 4, 0, c.k);
    std::deque<uint64_t> queue;  // one entry per group: the version it was generated at
    uint64_t version = 0;
    int64_t updates = 0, worst_last_use = 0, seen = 0;
    for (int round = 0; round < 200; ++round) {
      book.Request("rollout-0", 1000, seen);
      for (const auto& [peer, n] : book.Grant()) {
        seen += n;
        for (int64_t i = 0; i < n; ++i) queue.push_back(version);
      }
      ASSERT_GE(queue.size(), 16u) << "the window holds less than an update: lag " << c.lag;
      std::vector<uint64_t> set(queue.begin(), queue.begin() + 16);
      queue.erase(queue.begin(), queue.begin() + 16);
      for (int64_t use = 0; use < c.k; ++use, ++version, ++updates)
        for (uint64_t v : set) worst_last_use = std::max<int64_t>(worst_last_use, version - v);
      ASSERT_EQ(book.Received("rollout-0", 0, 0, 16), 16);
      book.Consumed(16);
    }
    EXPECT_LE(worst_last_use, c.lag) << "lag " << c.lag << ", k " << c.k;
  }
}

// A drained actor leaves holding grants it never used: without Reclaim the
// remaining actor gets less than one update's worth and training stalls.
TEST(CreditBook, GrantsOfAnActorThatLeftAreReclaimed) {
  CreditBook book(2, 16, 4);
  book.Request("rollout-0", 100, 0);
  book.Request("rollout-1", 100, 0);
  book.Request("rollout-2", 100, 0);
  ASSERT_EQ(Total(book.Grant()), 40);  // 16, 12, 12: a message each in turn
  // rollout-0 delivers its 16; rollout-1 delivered 4 of its 12 before leaving;
  // rollout-2 delivered none.
  EXPECT_EQ(book.outstanding("rollout-0"), 16);
  EXPECT_EQ(book.Received("rollout-0", 0, 0, 16), 16);
  EXPECT_EQ(book.Received("rollout-1", 0, 0, 4), 4);
  book.Consumed(20);
  EXPECT_EQ(book.outstanding("rollout-1"), 8);
  EXPECT_EQ(book.outstanding("rollout-2"), 12);
  book.Request("rollout-1", 0, 0);
  book.Request("rollout-2", 0, 0);
  auto g = book.Grant();
  EXPECT_EQ(Total(g), 20);  // only what was consumed comes back: 20 groups are stuck
  EXPECT_EQ(book.Reclaim("rollout-1"), 8);
  EXPECT_EQ(book.Reclaim("rollout-2"), 12);
  EXPECT_EQ(book.Reclaim("rollout-2"), 0);  // idempotent
  g = book.Grant();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].first, "rollout-0");
  EXPECT_EQ(Total(g), 20);
  EXPECT_EQ(book.capacity(), 0);
}

// A draining actor returns the grants it will not start while it still
// delivers (and stays in the directory): the others go on at once instead of
// waiting for it to leave (scale-down stalled training for the whole drain).
TEST(CreditBook, ADrainingActorsReturnedGrantsGoToTheOthersAtOnce) {
  CreditBook book(2, 16, 4);
  book.Request("rollout-0", 100, 0);
  book.Request("rollout-1", 100, 0);
  book.Request("rollout-2", 100, 0);
  ASSERT_EQ(Total(book.Grant()), 40);  // 16, 12, 12
  // rollout-1 started 4 of its 12 groups and drains: 8 come back now.
  EXPECT_EQ(book.outstanding("rollout-1"), 12);
  book.Return("rollout-1", 8);
  EXPECT_EQ(book.outstanding("rollout-1"), 4);  // the 4 it started are still expected
  auto g = book.Grant();
  EXPECT_EQ(Total(g), 8);
  for (const auto& [peer, k] : g) EXPECT_NE(peer, "rollout-1") << "a draining actor got grants";
  // More than it holds (a grant crossed its return) never goes negative.
  const int64_t held = book.outstanding("rollout-2");
  book.Return("rollout-2", 100);
  EXPECT_EQ(book.outstanding("rollout-2"), 0);
  EXPECT_EQ(book.granted(), 40 - held);
  // Its started groups arrive and are consumed as usual.
  EXPECT_EQ(book.Received("rollout-1", 0, 0, 4), 4);
  EXPECT_EQ(book.outstanding("rollout-1"), 0);
}

TEST(CreditBook, ANewIncarnationReclaimsThePreviousOnesGrantsButKeepsItsRequest) {
  CreditBook book(1, 8, 4);
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xa), 0);
  book.Request("rollout-0", 8, 0);
  ASSERT_EQ(Total(book.Grant()), 8);
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xa), 0);  // same process: nothing
  EXPECT_EQ(book.capacity(), 8);
  // SIGKILLed with 8 groups granted and undelivered; the new process asks again.
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xb), 8);
  book.Request("rollout-0", 16, 0);
  EXPECT_EQ(Total(book.Grant()), 16);
  // A late batch of the old process is not the new one's grant: it frees nothing.
  EXPECT_EQ(book.Received("rollout-0", 0xa, 0, 4), 0);
  EXPECT_EQ(book.outstanding("rollout-0"), 16);
  EXPECT_EQ(book.capacity(), 0);
  // The new process's groups are.
  EXPECT_EQ(book.Received("rollout-0", 0xb, 0, 4), 4);
  book.Consumed(4);
  EXPECT_EQ(book.outstanding("rollout-0"), 12);
  EXPECT_EQ(book.capacity(), 4);
}

// A restarted learner has a fresh book; the groups the rollout actors started
// under the previous learner process's grants still arrive. They are trained
// (or dropped) but must not widen the window: counting them as consumed let
// the window run ahead for good, and half of every later update arrived stale.
TEST(CreditBook, GroupsAnotherLearnerProcessGrantedDoNotWidenTheWindow) {
  CreditBook book(2, 16, 4, /*self=*/0x1e);
  book.Request("rollout-0", 100, 0);
  ASSERT_EQ(Total(book.Grant()), 40);
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xa), 0);
  // 60 groups granted by the previous learner process (0x1d) arrive.
  EXPECT_EQ(book.Received("rollout-0", 0xa, 0x1d, 60), 0);
  EXPECT_EQ(book.outstanding("rollout-0"), 40);
  EXPECT_EQ(book.capacity(), 0);  // still the window, not beyond
  EXPECT_EQ(Total(book.Grant()), 0);
  // This book's own grants are covered as usual.
  EXPECT_EQ(book.Received("rollout-0", 0xa, 0x1e, 16), 16);
  book.Consumed(16);
  EXPECT_EQ(Total(book.Grant()), 16);
}

// A rollout actor re-sends its whole want as soon as it grows (a group finished), without
// waiting for the answer to the last one: the learner then answers the current want, so
// grants arrive in large pieces and the engine's batches stay full. Grants the actor has not
// received yet are counted against the re-sent want: nothing is granted twice.
TEST(CreditBook, AWantReSentBeforeItsGrantArrivesIsNotGrantedTwice) {
  CreditBook book(/*max_lag=*/8, /*groups_per_update=*/16, /*unit=*/4);
  book.Request("rollout-0", 16, 0);
  ASSERT_EQ(Total(book.Grant()), 16);  // in transit
  // Before the grant lands, 4 of its earlier groups finish: the want, re-sent, is 20 of which
  // 16 are on their way.
  book.Request("rollout-0", 20, 0);
  EXPECT_EQ(Total(book.Grant()), 4);
  // It has both grants now; its want is met.
  book.Request("rollout-0", 0, 20);
  EXPECT_EQ(Total(book.Grant()), 0);
  // A want that arrives after its grants were seen is answered in full.
  book.Request("rollout-0", 8, 20);
  EXPECT_EQ(Total(book.Grant()), 8);
  // An actor never reports more than it was granted; if it did, nothing goes negative.
  book.Request("rollout-0", 4, 1000);
  EXPECT_EQ(Total(book.Grant()), 4);
  // A new process of the actor has seen none of the old one's grants.
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xa), 0);
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xb), 32);
  book.Request("rollout-0", 12, 0);
  EXPECT_EQ(Total(book.Grant()), 12);
}

// A rollout actor cuts short the groups that outlived the lag window (the engine's
// abort_beyond_lag) and reports them, cumulative, with its next request: their capacity is
// freed once however often the total is repeated, only for this learner process's grants,
// never beyond what the actor holds, and a new incarnation counts from 0 again.
TEST(CreditBook, GroupsCutShortAsStaleFreeTheirCapacityOnce) {
  CreditBook book(2, 16, 4, /*self=*/0x1e);
  book.Request("rollout-0", 40, 0);
  ASSERT_EQ(Total(book.Grant()), 40);
  EXPECT_EQ(book.capacity(), 0);
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 3), 3);
  EXPECT_EQ(book.outstanding("rollout-0"), 37);
  EXPECT_EQ(book.capacity(), 3);
  // The same total again (a repeated or re-sent request) frees nothing more.
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 3), 0);
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 2), 0);  // an older message, reordered
  EXPECT_EQ(book.capacity(), 3);
  // Its request stands: the freed groups are granted again (in whole messages).
  book.Request("rollout-0", 4, 40);
  EXPECT_EQ(Total(book.Grant()), 0);  // 3 free: less than a message
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 4), 1);
  EXPECT_EQ(Total(book.Grant()), 4);
  // Grants of another learner process are not this book's to free.
  EXPECT_EQ(book.Abandoned("rollout-0", 0x2f, 100), 0);
  EXPECT_EQ(book.capacity(), 0);
  // Never more than the actor holds: a total beyond it frees what is outstanding.
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 1000), 40);
  EXPECT_EQ(book.outstanding("rollout-0"), 0);
  EXPECT_EQ(book.capacity(), 40);
  // A new incarnation of the actor counts its own groups from 0.
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xa), 0);
  EXPECT_EQ(book.SeenIncarnation("rollout-0", 0xb), 0);
  book.Request("rollout-0", 8, 0);
  ASSERT_EQ(Total(book.Grant()), 8);
  EXPECT_EQ(book.Abandoned("rollout-0", 0x1e, 2), 2);
  EXPECT_EQ(book.outstanding("rollout-0"), 6);
}

TEST(CreditBook, UndoneGrantsAreNotOutstanding) {
  CreditBook book(0, 8, 4);
  book.Request("rollout-0", 8, 0);
  ASSERT_EQ(Total(book.Grant()), 8);
  book.Undo("rollout-0", 8);  // never reached the actor
  EXPECT_EQ(book.outstanding("rollout-0"), 0);
  EXPECT_EQ(book.capacity(), 8);
  EXPECT_TRUE(book.PeersWithOutstanding().empty());
  // Nor in transit: the actor's next want (it saw none of them) is answered in full.
  book.Request("rollout-0", 8, 0);
  EXPECT_EQ(Total(book.Grant()), 8);
}

}  // namespace
}  // namespace troupe::actors
