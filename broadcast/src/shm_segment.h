// The shm backend's POSIX shared-memory segment.
//
// Layout: one 4 KiB header page, then two slots of `capacity` bytes. The
// learner packs version v straight into the slot not used by v-1 (the one
// copy of the whole broadcast) and publishes it by generation number: a slot's
// generation is odd while it is written and even once complete (a seqlock).
// Readers map the segment read-only, check the generation the manifest names
// before and after they use the bytes, and so detect a slot overwritten under
// them (which the protocol prevents for members: the learner rewrites a slot
// only after every member acknowledged the version after it).
//
// Segment names are "<prefix>-<pid>-<n>"; a writer unlinks its segment on
// destruction and removes stale ones of dead learners (same prefix) on start.
// Writer and reader objects are used by one thread each.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "troupe/core/status.h"

namespace troupe::broadcast {

struct ShmHeader {
  uint64_t magic;
  uint64_t format;
  uint64_t capacity;        // bytes per slot
  uint64_t slot_offset[2];  // byte offset of each slot from the segment start
  std::atomic<uint64_t> generation[2];
  uint64_t owner_pid;
};

class ShmWriter {
 public:
  // Creates "<prefix>-<pid>-<n>" with two slots of at least `capacity` bytes.
  static Result<std::shared_ptr<ShmWriter>> Create(const std::string& prefix, uint64_t capacity);
  ~ShmWriter();
  ShmWriter(const ShmWriter&) = delete;
  ShmWriter& operator=(const ShmWriter&) = delete;

  const std::string& name() const { return name_; }
  uint64_t capacity() const { return header_->capacity; }
  uint64_t slot_offset(int slot) const { return header_->slot_offset[slot]; }
  uint8_t* slot_data(int slot) const { return base_ + header_->slot_offset[slot]; }
  // Marks `slot` as being written (odd generation).
  void BeginWrite(int slot);
  // Publishes `slot` and returns its new (even) generation.
  uint64_t EndWrite(int slot);

  // Removes segments "<prefix>-<pid>-*" whose pid no longer runs. Returns how many.
  static int RemoveStale(const std::string& prefix);

 private:
  ShmWriter(std::string name, uint8_t* base, size_t bytes)
      : name_(std::move(name)),
        base_(base),
        bytes_(bytes),
        header_(reinterpret_cast<ShmHeader*>(base)) {}
  std::string name_;
  uint8_t* base_;
  size_t bytes_;
  ShmHeader* header_;
};

class ShmReader {
 public:
  static Result<std::unique_ptr<ShmReader>> Open(const std::string& name);
  ~ShmReader();
  ShmReader(const ShmReader&) = delete;
  ShmReader& operator=(const ShmReader&) = delete;

  const std::string& name() const { return name_; }
  // The `bytes` at `offset` if they lie inside one slot; error otherwise.
  Result<const uint8_t*> Slot(uint64_t offset, uint64_t bytes) const;
  // Generation of the slot starting at `offset` (acquire load).
  uint64_t Generation(uint64_t offset) const;

 private:
  ShmReader(std::string name, uint8_t* base, size_t bytes)
      : name_(std::move(name)),
        base_(base),
        bytes_(bytes),
        header_(reinterpret_cast<const ShmHeader*>(base)) {}
  std::string name_;
  uint8_t* base_;
  size_t bytes_;
  const ShmHeader* header_;
};

}  // namespace troupe::broadcast
