// The gloo backend's process group for one epoch (libtorch c10d
// ProcessGroupGloo), behind an interface free of c10d headers.
//
// The learner hosts a c10d TCPStore; every epoch forms a fresh group under the
// store prefix "troupe/weights/<epoch>", so a group that failed (a member died
// mid-collective) is simply dropped and the next epoch starts clean. Two data
// paths move the stream from rank 0 (the learner) to every member:
//   broadcast  ProcessGroupGloo::broadcast per bucket (gloo's own algorithm);
//   chain      chunked send/recv along ranks 0 -> 1 -> 2 -> ...: each member
//              forwards a chunk as soon as it has it, so every link (and the
//              learner's in particular) carries each byte once.
// Every wait is bounded by the group timeout (a dead peer fails the transfer
// within it). Destroying a group can block until its in-flight operations time
// out: hand it to a Reaper. Not thread-safe; one transfer at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "buffer_pool.h"
#include "troupe/broadcast/config.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::broadcast {

class GlooStore {
 public:
  // Hosts a TCPStore server at host:port (0 = pick a free port).
  static Result<std::unique_ptr<GlooStore>> Host(const std::string& host, uint16_t port,
                                                 std::chrono::milliseconds timeout);
  // Connects to "host:port" (blocks until connected or `timeout`).
  static Result<std::unique_ptr<GlooStore>> Connect(const std::string& address,
                                                    std::chrono::milliseconds timeout);
  ~GlooStore();
  const std::string& address() const { return address_; }

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  GlooStore(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

class GlooGroup {
 public:
  // Forms the group of `size` ranks for `epoch` (blocks for the rendezvous, up to `timeout`).
  // `hostname` is the address this rank's gloo device binds.
  static Result<std::unique_ptr<GlooGroup>> Form(const GlooStore& store, uint64_t epoch, int rank,
                                                 int size, const std::string& hostname,
                                                 std::chrono::milliseconds timeout);
  ~GlooGroup();

  int rank() const;
  int size() const;

  // Moves the stream described by `layout` from rank 0 to every rank: rank 0 reads `flat`,
  // the others write into it. `buffer` is kept alive as long as any operation may touch it
  // (also after a failure). `progress(bytes)` is called as data lands (receivers only).
  Status Transfer(const std::shared_ptr<void>& buffer, uint8_t* flat, const Layout& layout,
                  GlooAlgorithm algorithm, Deadline deadline,
                  const std::function<void(uint64_t)>& progress);

 private:
  struct Impl;
  explicit GlooGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::broadcast
