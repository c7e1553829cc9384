// The learner's credit book: how many rollout groups may be started now.
//
// Staleness control (DESIGN invariant 3, AReaL's admission rule with a margin):
// the groups granted stay within (max_lag + 1/2) updates' worth (max_lag + 1
// at lags 0 and 1, see window()) beyond the groups already consumed (trained, or dropped as
// stale/invalid). AReaL's (max_lag + 1) puts a group granted at the window's
// last place at exactly max_lag when groups finish in the order they were
// granted, so every group overtaken by younger ones (long responses among
// short ones) arrived too old: 12-19 % of the long-tail task's sequences at lag
// 2. Half an update of margin took that to ~5 % and the job's updates/s up
// ~8 % (docs/architecture.md, "Credits"). With updates_per_batch k > 1 the
// window is floor((max_lag + 1) / k) whole updates (window()). Counting consumed data
// rather than versions keeps the pipeline moving when an update is skipped
// (all groups uniform) or data is dropped. Grants come in whole messages
// (groups_per_message groups), so no rollout actor is left holding a partial
// message it cannot complete. A grant carries the learner's version: the
// actor starts those groups only with weights at least that new.
//
// Grants a rollout actor will never use — it drained and left, or died and
// came back as a new incarnation — would otherwise hold capacity forever (and
// once they add up to more than the window minus one update's
// worth, training stalls). So the book keeps, per actor, the groups granted
// and not yet received, and Reclaim() gives them back. Only groups this book
// granted free capacity when they are consumed: Received() says how many of
// an arriving batch's groups were covered by the producer incarnation's
// outstanding grants, and the caller consumes that many. A batch says which
// learner process granted its groups (RolloutBatch.grantLearner) and how many
// of them (grantedGroups). Groups nobody here granted — a reclaimed grant delivered after all, a previous incarnation's
// late batch, work granted by a learner process that has since restarted —
// are trained or dropped like any other but never widen the lag window
// (counting them let a restarted learner's window run ahead for good, and
// half of every later update arrived one version too old). A draining actor
// does not wait for reclaim: it returns the grants it will not start as soon
// as it stops starting groups (Return()).
//
// Not thread-safe: the learner's loop owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors {

// What a rollout actor asks the learner for (Credit.requested, its whole
// current want): enough to keep `max_in_flight` groups generating plus
// `reserve` granted groups in hand, less what it holds (`credits` not
// started, `in_flight` started), in whole messages of `unit` groups. The
// reserve refills a finished group's slot at once: the learner answers
// between optimizer steps, and without it each freed slot waited a round trip.
inline int64_t RolloutCreditWant(int64_t max_in_flight, int64_t reserve, int64_t credits,
                                 int64_t in_flight, int64_t unit) {
  int64_t want = max_in_flight + reserve - credits - in_flight;
  return want > 0 ? want / unit * unit : 0;
}

class CreditBook {
 public:
  // `self` is the learner process's incarnation: the grants it makes carry it.
  // `updates_per_batch` is the trainer's (PPO epochs): each update's worth of groups then
  // advances the version that many times, and the window shrinks to match (window()).
  CreditBook(int64_t max_lag, int64_t groups_per_update, int64_t unit, uint64_t self = 0,
             int64_t updates_per_batch = 1)
      : lag_(max_lag),
        per_update_(groups_per_update),
        unit_(unit),
        self_(self),
        reuse_(std::max<int64_t>(1, updates_per_batch)) {}

  // `peer` asks for `groups` (its current want, not an increment), having received
  // `grants_seen` of the groups this book granted it (Credit.grantsSeen). Grants it has not
  // received yet are in transit: they already answer part of the want, so an actor may re-send
  // its want whenever it grows without being granted twice.
  void Request(const std::string& peer, int64_t groups, int64_t grants_seen) {
    const int64_t in_transit = std::max<int64_t>(0, granted_to_[peer] - grants_seen);
    pending_[peer] = std::max<int64_t>(0, groups - in_transit);
  }
  // Granted groups whose fate the learner decided (trained or dropped): what
  // Received() returned for their batch.
  void Consumed(int64_t groups) { consumed_ += groups; }
  // A batch of incarnation `incarnation` of `peer` reached the learner; it
  // holds `groups` groups granted by learner process `granted_by`. Returns how
  // many of them this book had granted (and still expected from that
  // incarnation): the caller consumes that many once the batch is decided.
  // Incarnation 0 means "the current one".
  int64_t Received(const std::string& peer, uint64_t incarnation, uint64_t granted_by,
                   int64_t groups) {
    if (granted_by != self_) return 0;  // granted by another learner process
    auto inc = incarnation_.find(peer);
    if (incarnation != 0 && inc != incarnation_.end() && inc->second != 0 &&
        inc->second != incarnation)
      return 0;  // a previous (or unknown) process of that actor: not granted here
    auto it = outstanding_.find(peer);
    if (it == outstanding_.end()) return 0;
    const int64_t covered = std::min(std::max<int64_t>(0, groups), it->second);
    it->second -= covered;
    return covered;
  }
  // Grants what capacity allows, one message at a time round robin.
  std::vector<std::pair<std::string, int64_t>> Grant() {
    std::vector<std::pair<std::string, int64_t>> out;
    int64_t cap = capacity();
    bool any = true;
    while (cap >= unit_ && any) {
      any = false;
      for (auto& entry : pending_) {
        const std::string& peer = entry.first;
        int64_t& want = entry.second;
        if (cap < unit_) break;
        if (want < unit_) continue;
        want -= unit_;
        cap -= unit_;
        granted_ += unit_;
        granted_to_[peer] += unit_;
        outstanding_[peer] += unit_;
        auto it = std::find_if(out.begin(), out.end(), [&](auto& p) { return p.first == peer; });
        if (it == out.end())
          out.emplace_back(peer, unit_);
        else
          it->second += unit_;
        any = true;
      }
    }
    return out;
  }
  // A grant that never reached its actor.
  void Undo(const std::string& peer, int64_t groups) {
    granted_ -= groups;
    granted_to_[peer] -= groups;
    auto it = outstanding_.find(peer);
    if (it != outstanding_.end()) it->second = std::max<int64_t>(0, it->second - groups);
  }
  // `peer` (draining) will never start `groups` of its grants: they go back to
  // the pool at once, and its request is forgotten. What it already started is
  // still expected (and reclaimed if it leaves without delivering it).
  void Return(const std::string& peer, int64_t groups) {
    pending_.erase(peer);
    auto it = outstanding_.find(peer);
    if (it == outstanding_.end()) return;
    int64_t n = std::min(std::max<int64_t>(0, groups), it->second);
    it->second -= n;
    granted_ -= n;
  }
  // `peer` started `total` groups granted by learner process `granted_by` and cut them short
  // (they outlived the lag window: stale before they could arrive), cumulative over its
  // incarnation: the ones not counted before free their capacity now, like consumed groups.
  // Its request stands. Returns the groups freed.
  int64_t Abandoned(const std::string& peer, uint64_t granted_by, uint64_t total) {
    if (granted_by != self_) return 0;  // another learner process's grants
    uint64_t& seen = abandoned_seen_[peer];
    if (total <= seen) return 0;
    const uint64_t delta = total - seen;
    seen = total;
    auto it = outstanding_.find(peer);
    if (it == outstanding_.end()) return 0;
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(delta), it->second);
    it->second -= n;
    granted_ -= n;
    return n;
  }
  // Gives back what `peer` was granted and never delivered, and forgets its
  // request. Returns the groups reclaimed.
  int64_t Reclaim(const std::string& peer) {
    pending_.erase(peer);
    auto it = outstanding_.find(peer);
    if (it == outstanding_.end()) return 0;
    int64_t n = it->second;
    granted_ -= n;
    outstanding_.erase(it);
    return n;
  }
  // Notes the incarnation `peer` speaks from; a new one means the previous
  // process is gone with its grants: they are reclaimed (returned).
  int64_t SeenIncarnation(const std::string& peer, uint64_t incarnation) {
    uint64_t& known = incarnation_[peer];
    int64_t n = 0;
    if (known != 0 && incarnation != 0 && known != incarnation) {
      int64_t want = pending_.count(peer) ? pending_[peer] : 0;
      n = Reclaim(peer);
      granted_to_.erase(peer);  // the new process has seen none of the old one's grants
      abandoned_seen_.erase(peer);  // and counts its abandoned groups from 0
      pending_[peer] = want;    // the new incarnation's request stands
    }
    if (incarnation != 0) known = incarnation;
    return n;
  }
  // Actors holding grants they have not delivered yet.
  std::vector<std::string> PeersWithOutstanding() const {
    std::vector<std::string> out;
    for (const auto& [peer, n] : outstanding_)
      if (n > 0) out.push_back(peer);
    return out;
  }
  int64_t outstanding(const std::string& peer) const {
    auto it = outstanding_.find(peer);
    return it == outstanding_.end() ? 0 : it->second;
  }
  // Groups that may be granted beyond those consumed: max_lag + 1/2 updates' worth (the half
  // rounded up to whole messages) from lag 2 on, max_lag + 1 below. At lag 1 half an update
  // less left too little beside one stalled actor: with 2 actors sharing 24 groups, the one
  // holding its 16 (rollout.slow_actor) left the other 8, less than an update, and the job ran
  // at the stalled actor's pace (EndToEnd.SlowRolloutActorsBatchesAreDroppedAsStaleAndCounted).
  //
  // With updates_per_batch k > 1 the versions advance k times for every update's worth
  // consumed (a batch is consumed once retired), so that window held k times too many
  // versions: at k = 3 and lag 2 the group granted last was first trained 4-5 versions old,
  // and a third of all sequences were dropped stale. The window is then floor((max_lag + 1) /
  // k) updates' worth, at least one (the learner needs a whole update to step): the learner
  // takes whole updates' worth, so the group granted last is in the last of them and gets all
  // its k uses within the lag (its last at exactly max_lag when groups finish in order; one
  // that finishes late loses uses before it is dropped, so no margin). At the default lag
  // (k - 1) that is one update's worth: generation and training take turns, as fresh data for
  // every epoch requires.
  int64_t window() const {
    if (reuse_ > 1) return per_update_ * std::max<int64_t>(1, (lag_ + 1) / reuse_);
    if (lag_ <= 1) return (lag_ + 1) * per_update_;
    const int64_t half = (per_update_ / 2 + unit_ - 1) / unit_ * unit_;
    return lag_ * per_update_ + std::min(per_update_, std::max(unit_, half));
  }
  int64_t capacity() const { return window() + consumed_ - granted_; }
  int64_t granted() const { return granted_; }

 private:
  int64_t lag_, per_update_, unit_;
  uint64_t self_;
  int64_t reuse_;  // updates_per_batch
  int64_t granted_ = 0, consumed_ = 0;
  std::map<std::string, int64_t> pending_;      // what each actor wants
  std::map<std::string, int64_t> outstanding_;  // granted, not yet received, per actor
  std::map<std::string, int64_t> granted_to_;   // granted to each actor's process, ever
  std::map<std::string, uint64_t> incarnation_;
  std::map<std::string, uint64_t> abandoned_seen_;  // Abandoned() totals already freed
};

}  // namespace troupe::actors
