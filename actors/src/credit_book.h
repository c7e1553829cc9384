// The learner's credit book: how many rollout groups may be started now.
//
// Staleness control (DESIGN invariant 3, AReaL's admission rule): the groups
// granted stay within (max_lag + 1) updates' worth beyond the groups already
// consumed (trained, or dropped as stale/invalid). Counting consumed data
// rather than versions keeps the pipeline moving when an update is skipped
// (all groups uniform) or data is dropped. Grants come in whole messages
// (groups_per_message groups), so no rollout actor is left holding a partial
// message it cannot complete. A grant carries the learner's version: the
// actor starts those groups only with weights at least that new.
//
// Grants a rollout actor will never use — it drained and left, or died and
// came back as a new incarnation — would otherwise hold capacity forever (and
// once they add up to more than (max_lag + 1) updates minus one update's
// worth, training stalls). So the book keeps, per actor, the groups granted
// and not yet received, and Reclaim() gives them back. Groups of a reclaimed
// grant that arrive after all are consumed like any other: capacity then runs
// ahead by at most that actor's in-flight groups, and the lag gate still drops
// anything too stale. A draining actor does not wait for that: it returns the
// grants it will not start as soon as it stops starting groups (Return()).
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

class CreditBook {
 public:
  CreditBook(int64_t max_lag, int64_t groups_per_update, int64_t unit)
      : lag_(max_lag), per_update_(groups_per_update), unit_(unit) {}

  // `peer` asks for `groups` (its current want, not an increment).
  void Request(const std::string& peer, int64_t groups) {
    pending_[peer] = std::max<int64_t>(0, groups);
  }
  // Groups whose fate the learner decided (trained or dropped).
  void Consumed(int64_t groups) { consumed_ += groups; }
  // Groups produced by `peer` reached the learner.
  void Received(const std::string& peer, int64_t groups) {
    auto it = outstanding_.find(peer);
    if (it != outstanding_.end()) it->second = std::max<int64_t>(0, it->second - groups);
  }
  // Grants what capacity allows, one message at a time round robin.
  std::vector<std::pair<std::string, int64_t>> Grant() {
    std::vector<std::pair<std::string, int64_t>> out;
    int64_t cap = capacity();
    bool any = true;
    while (cap >= unit_ && any) {
      any = false;
      for (auto& [peer, want] : pending_) {
        if (cap < unit_) break;
        if (want < unit_) continue;
        want -= unit_;
        cap -= unit_;
        granted_ += unit_;
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
      pending_[peer] = want;  // the new incarnation's request stands
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
  int64_t capacity() const { return (lag_ + 1) * per_update_ + consumed_ - granted_; }
  int64_t granted() const { return granted_; }

 private:
  int64_t lag_, per_update_, unit_;
  int64_t granted_ = 0, consumed_ = 0;
  std::map<std::string, int64_t> pending_;      // what each actor wants
  std::map<std::string, int64_t> outstanding_;  // granted, not yet received, per actor
  std::map<std::string, uint64_t> incarnation_;
};

}  // namespace troupe::actors
