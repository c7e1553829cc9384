// shm backend: pack once into shared memory, local members map it (shm_path.h).
#include "shm_path.h"

#include <cstring>
#include <map>

#include "chunk_stream.h"
#include "shm_segment.h"

namespace troupe::broadcast {
namespace {

class ShmSenderPath final : public SenderPath {
 public:
  explicit ShmSenderPath(const SenderContext& c) : c_(c) {}

  Status Announce(proto::GroupMsg* group) override {
    group->algorithm = "shm";
    return Status::Ok();
  }
  Status Form(const proto::GroupMsg&, const std::vector<PathMember>&, Deadline,
              const Interrupt&) override {
    return Status::Ok();
  }

  Result<Stream> Acquire(uint64_t bytes) override {
    if (!shm_ || shm_->capacity() < bytes) {
      TROUPE_ASSIGN_OR_RETURN(shm_, ShmWriter::Create(c_.config->shm_prefix, bytes));
      slot_ = 1;
    }
    writing_ = slot_ ^ 1;  // the slot not holding the current version
    shm_->BeginWrite(writing_);
    return Stream{shm_->slot_data(writing_), shm_};
  }

  void Packed() override {
    generation_ = shm_->EndWrite(writing_);
    slot_ = writing_;
  }

  void Describe(const PathMember& member, proto::ManifestMsg* manifest) const override {
    if (member.node != c_.node || !shm_) return;  // served over the chunk stream
    manifest->shm_segment = shm_->name();
    manifest->shm_offset = shm_->slot_offset(slot_);
    manifest->shm_generation = generation_;
  }

  Status Send(const Layout& layout, const Stream& stream, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt, uint64_t* bytes_sent) override {
    std::vector<std::string> remote;  // members on other nodes: star over the chunk stream
    for (const auto& m : members)
      if (m.node != c_.node) remote.push_back(m.data_endpoint);
    if (remote.empty()) return Status::Ok();  // local members map the segment
    return c_.chunks->Send(remote, layout, stream.data, stream.owner, deadline, interrupt,
                           bytes_sent);
  }

  void Abort() override {}

 private:
  SenderContext c_;
  std::shared_ptr<ShmWriter> shm_;
  int slot_ = 1;     // slot of the current version
  int writing_ = 0;  // slot being packed
  uint64_t generation_ = 0;
};

class ShmReceiverPath final : public ReceiverPath {
 public:
  explicit ShmReceiverPath(const ReceiverContext& c) : c_(c) {}

  Status Join(const proto::GroupMsg& group, int, Deadline, const Interrupt&) override {
    learner_ = group.members[0];
    timeout_ = std::chrono::milliseconds(group.timeout_ms > 0 ? group.timeout_ms : 10000);
    return Status::Ok();
  }

  Result<Landed> Receive(const proto::ManifestMsg& manifest, const Interrupt& interrupt,
                         const Progress& progress) override {
    const Layout& layout = manifest.layout;
    if (manifest.shm_segment.empty()) {  // we are on another node: the learner streams it
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(layout.total_bytes));
      Landed l;
      TROUPE_RETURN_IF_ERROR(c_.chunks->Receive(layout, learner_, buf->data(), nullptr, timeout_,
                                                interrupt, progress, &l.bytes_received));
      l.data = buf->data();
      l.owner = buf;
      return l;
    }
    return Map(manifest, progress);
  }

  bool BreaksOnFailure() const override { return false; }
  void Abort() override {}

 private:
  Result<Landed> Map(const proto::ManifestMsg& manifest, const Progress& progress) {
    const Layout& layout = manifest.layout;
    if (!shm_ || shm_->name() != manifest.shm_segment) {
      views_.clear();  // they point into the old mapping
      shm_.reset();
      TROUPE_ASSIGN_OR_RETURN(shm_, ShmReader::Open(manifest.shm_segment));
    }
    TROUPE_ASSIGN_OR_RETURN(const uint8_t* src,
                            shm_->Slot(manifest.shm_offset, layout.total_bytes));
    const ShmReader* reader = shm_.get();
    const uint64_t offset = manifest.shm_offset, generation = manifest.shm_generation;
    const uint64_t version = layout.version;
    auto torn = [reader, offset, generation, version](const char* when) -> Status {
      uint64_t now = reader->Generation(offset);
      if (now == generation) return Status::Ok();
      return Unavailable("shm slot of version {} was rewritten {} (generation {} != {})", version,
                         when, now, generation);
    };
    TROUPE_RETURN_IF_ERROR(torn("before it was read"));
    Landed l;
    if (!c_.zero_copy) {
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(layout.total_bytes));
      std::memcpy(buf->data(), src, layout.total_bytes);
      TROUPE_RETURN_IF_ERROR(torn("while it was copied"));
      if (progress) progress(layout.total_bytes, layout.total_bytes);
      l.data = buf->data();
      l.owner = buf;
      return l;
    }
    if (progress) progress(layout.total_bytes, layout.total_bytes);
    // Views over a slot stay valid as long as the mapping: build them once per slot and layout.
    if (CastAreaBytes(layout) == 0) {
      Views& v = views_[offset];
      if (!v.layout.SameTensors(layout) || v.named.size() != layout.slots.size()) {
        TROUPE_ASSIGN_OR_RETURN(v.named, UnpackTensors(layout, src, nullptr, nullptr, nullptr));
        v.layout = layout;
      }
      l.views = &v.named;
    }
    l.data = src;
    l.still_valid = [torn] { return torn("while the sink used it"); };
    return l;
  }

  struct Views {
    Layout layout;
    NamedTensors named;
  };

  ReceiverContext c_;
  std::string learner_;
  std::chrono::milliseconds timeout_{10000};
  std::unique_ptr<ShmReader> shm_;
  std::map<uint64_t, Views> views_;  // by slot offset; cleared before shm_ changes
};

}  // namespace

Result<std::unique_ptr<SenderPath>> NewShmSenderPath(const SenderContext& context) {
  return std::unique_ptr<SenderPath>(new ShmSenderPath(context));
}

Result<std::unique_ptr<ReceiverPath>> NewShmReceiverPath(const ReceiverContext& context) {
  return std::unique_ptr<ReceiverPath>(new ShmReceiverPath(context));
}

}  // namespace troupe::broadcast
