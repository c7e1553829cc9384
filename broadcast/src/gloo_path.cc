// gloo backend: one ProcessGroupGloo per epoch through the transport rendezvous (gloo_path.h).
#include "gloo_path.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <vector>

#include <ATen/ops/from_blob.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "rendezvous.h"

namespace troupe::broadcast {
namespace {

// A gloo/c10d exception as a Status: timeouts become Code::kTimeout, a cancelled rendezvous
// kCancelled, the rest kUnavailable (a peer closed its connection, a socket error).
Status FromException(std::string_view what, std::string_view context) {
  std::string msg(what);
  auto nl = msg.find('\n');  // c10 messages may carry a trailing backtrace
  if (nl != std::string::npos) msg.resize(nl);
  if (msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos)
    return Timeout("{}: {}", context, msg);
  if (msg.find("cancelled") != std::string::npos) return Cancelled("{}: {}", context, msg);
  return Unavailable("{}: {}", context, msg);
}

#define TROUPE_GLOO_CATCH(context)                             \
  catch (const c10::Error& e) {                                \
    return FromException(e.what_without_backtrace(), context); \
  }                                                            \
  catch (const std::exception& e) {                            \
    return FromException(e.what(), context);                   \
  }

// One epoch's process group. Destroying it may block until failed operations time out:
// hand it to the Reaper.
class GlooGroup {
 public:
  static Result<std::shared_ptr<GlooGroup>> Form(c10::intrusive_ptr<c10d::Store> store,
                                                 const std::string& prefix, uint64_t epoch,
                                                 int rank, int size, const std::string& hostname,
                                                 std::chrono::milliseconds timeout) {
    if (size < 1 || rank < 0 || rank >= size)
      return InvalidArgument("gloo group rank {} of size {}", rank, size);
    try {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
      opts->threads = 2;
      auto g = std::make_shared<GlooGroup>();
      g->pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
      g->rank_ = rank;
      g->size_ = size;
      g->timeout_ = timeout;
      return g;
    }
    TROUPE_GLOO_CATCH(fmt::format("forming gloo group epoch {} (rank {} of {})", epoch, rank, size))
  }

  // Moves the stream from rank 0 to every rank: rank 0 reads `flat`, the others write into it.
  // `buffer` stays referenced as long as any operation may touch it (also after a failure).
  Status Transfer(const std::shared_ptr<void>& buffer, uint8_t* flat, const Layout& layout,
                  GlooAlgorithm algorithm, Deadline deadline, const Progress& progress) {
    if (size_ == 1 || layout.total_bytes == 0) return Status::Ok();
    std::shared_ptr<void> keep = buffer;
    auto view = [&](uint64_t begin, uint64_t end) {
      return at::from_blob(
          flat + begin, {static_cast<int64_t>(end - begin)}, [keep](void*) {},
          at::TensorOptions().dtype(at::kByte));
    };
    auto wait = [&](const c10::intrusive_ptr<c10d::Work>& w) {
      w->wait(Budget(deadline, timeout_));
    };
    auto report = [&](uint64_t got) {
      if (rank_ != 0 && progress) progress(got, layout.total_bytes);
    };
    try {
      if (algorithm == GlooAlgorithm::kBroadcast) {
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (uint64_t b = 0; b < layout.num_buckets(); ++b) {
          std::vector<at::Tensor> ts{view(layout.bucket_begin(b), layout.bucket_end(b))};
          c10d::BroadcastOptions o;
          o.rootRank = 0;
          o.timeout = timeout_;
          works.push_back(pg_->broadcast(ts, o));
        }
        for (uint64_t b = 0; b < works.size(); ++b) {
          wait(works[b]);
          report(layout.bucket_end(b));
        }
        return Status::Ok();
      }
      // Chain: rank r receives chunk c from r-1 and forwards it to r+1 at once.
      const uint64_t chunks = layout.num_chunks();
      auto chunk_view = [&](uint64_t c) {
        return view(c * layout.chunk_bytes,
                    std::min(layout.total_bytes, (c + 1) * layout.chunk_bytes));
      };
      std::vector<c10::intrusive_ptr<c10d::Work>> sends;
      sends.reserve(chunks);
      if (rank_ == 0) {
        for (uint64_t c = 0; c < chunks; ++c) {
          std::vector<at::Tensor> ts{chunk_view(c)};
          sends.push_back(pg_->send(ts, 1, static_cast<int>(c)));
        }
      } else {
        std::vector<c10::intrusive_ptr<c10d::Work>> recvs;
        recvs.reserve(chunks);
        for (uint64_t c = 0; c < chunks; ++c) {
          std::vector<at::Tensor> ts{chunk_view(c)};
          recvs.push_back(pg_->recv(ts, rank_ - 1, static_cast<int>(c)));
        }
        for (uint64_t c = 0; c < chunks; ++c) {
          wait(recvs[c]);
          if (rank_ + 1 < size_) {
            std::vector<at::Tensor> ts{chunk_view(c)};
            sends.push_back(pg_->send(ts, rank_ + 1, static_cast<int>(c)));
          }
          report(std::min(layout.total_bytes, (c + 1) * layout.chunk_bytes));
        }
      }
      for (auto& s : sends) wait(s);
      return Status::Ok();
    }
    TROUPE_GLOO_CATCH(fmt::format("gloo {} of version {} (rank {} of {})",
                                  GlooAlgorithmName(algorithm), layout.version, rank_, size_))
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_ = 0;
  int size_ = 0;
  std::chrono::milliseconds timeout_{0};
};

std::chrono::milliseconds GroupTimeout(const proto::GroupMsg& g) {
  return std::chrono::milliseconds(g.timeout_ms > 0 ? g.timeout_ms : 10000);
}

class GlooSenderPath final : public SenderPath {
 public:
  explicit GlooSenderPath(const SenderContext& c) : c_(c) {}
  ~GlooSenderPath() override { Abort(); }

  Status Announce(proto::GroupMsg* group) override {
    group->algorithm = GlooAlgorithmName(c_.config->gloo_algorithm);
    if (group->members.size() <= 1) return Status::Ok();  // nobody to form with
    // A fresh rendezvous per epoch: new port, new secret prefix, only this epoch's members.
    rendezvous_.reset();
    std::vector<std::string> members(group->members.begin() + 1, group->members.end());
    TROUPE_ASSIGN_OR_RETURN(
        rendezvous_,
        RendezvousServer::Start(c_.network, c_.config->store_host, c_.header,
                                fmt::format("troupe/weights/{}/{}", group->epoch, RandomHex(16)),
                                std::move(members)));
    group->store_address = rendezvous_->endpoint();
    group->store_prefix = rendezvous_->prefix();
    return Status::Ok();
  }

  Status Form(const proto::GroupMsg& group, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt) override {
    Abort();
    if (members.empty()) return Status::Ok();
    if (!rendezvous_) return Internal("epoch {}: no rendezvous store", group.epoch);
    auto t = std::max(Millis(10), Budget(deadline, GroupTimeout(group)));
    TROUPE_ASSIGN_OR_RETURN(
        gloo_,
        GlooGroup::Form(rendezvous_->LocalStore(t, interrupt), rendezvous_->prefix(), group.epoch,
                        0, static_cast<int>(members.size() + 1), c_.config->gloo_hostname, t));
    return Status::Ok();
  }

  Result<Stream> Acquire(uint64_t bytes) override {
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(bytes));
    return Stream{buf->data(), buf};
  }

  Status Send(const Layout& layout, const Stream& stream, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt, uint64_t* bytes_sent) override {
    (void)interrupt;  // gloo operations cannot be interrupted; the group timeout bounds them
    if (members.empty()) return Status::Ok();
    if (!gloo_) return Internal("the gloo group of epoch {} is missing", layout.transfer);
    TROUPE_RETURN_IF_ERROR(gloo_->Transfer(stream.owner, stream.data, layout,
                                           c_.config->gloo_algorithm, deadline, nullptr));
    *bytes_sent += layout.total_bytes;  // handed to gloo once
    return Status::Ok();
  }

  // Every member formed its group (each received a transfer of it): nobody needs the store.
  void Acknowledged() override { rendezvous_.reset(); }

  void Abort() override {
    c_.reaper->Add(std::move(gloo_));
    gloo_.reset();
  }

 private:
  SenderContext c_;
  std::unique_ptr<RendezvousServer> rendezvous_;
  std::shared_ptr<GlooGroup> gloo_;
};

class GlooReceiverPath final : public ReceiverPath {
 public:
  explicit GlooReceiverPath(const ReceiverContext& c) : c_(c) {}
  ~GlooReceiverPath() override { Abort(); }

  Status Join(const proto::GroupMsg& group, int rank, Deadline deadline,
              const Interrupt& interrupt) override {
    Abort();
    timeout_ = GroupTimeout(group);
    algorithm_ = group.algorithm == "broadcast" ? GlooAlgorithm::kBroadcast : GlooAlgorithm::kChain;
    if (group.store_address.empty() || group.store_prefix.empty())
      return ProtocolError("epoch {}: gloo group without a rendezvous store", group.epoch);
    const auto t = std::max(Millis(10), Budget(deadline, timeout_));
    try {
      auto store = ConnectRendezvous(c_.network, group.store_address, c_.header, t, interrupt);
      TROUPE_ASSIGN_OR_RETURN(
          gloo_,
          GlooGroup::Form(std::move(store), group.store_prefix, group.epoch, rank,
                          static_cast<int>(group.members.size()), c_.config->gloo_hostname, t));
    }
    TROUPE_GLOO_CATCH(fmt::format("joining gloo epoch {}", group.epoch))
    return Status::Ok();
  }

  Result<Landed> Receive(const proto::ManifestMsg& manifest, const Interrupt& interrupt,
                         const Progress& progress) override {
    (void)interrupt;  // gloo waits are bounded by the group timeout, not interruptible
    const Layout& layout = manifest.layout;
    if (!gloo_) return Unavailable("no gloo group for epoch {}", layout.transfer);
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(layout.total_bytes));
    TROUPE_RETURN_IF_ERROR(
        gloo_->Transfer(buf, buf->data(), layout, algorithm_, Deadline::Never(), progress));
    Landed l;
    l.data = buf->data();
    l.owner = buf;
    l.bytes_received = layout.total_bytes;
    return l;
  }

  bool BreaksOnFailure() const override { return true; }

  void Abort() override {
    c_.reaper->Add(std::move(gloo_));
    gloo_.reset();
  }

 private:
  ReceiverContext c_;
  std::shared_ptr<GlooGroup> gloo_;
  std::chrono::milliseconds timeout_{10000};
  GlooAlgorithm algorithm_ = GlooAlgorithm::kChain;
};

}  // namespace

Result<std::unique_ptr<SenderPath>> NewGlooSenderPath(const SenderContext& context) {
  return std::unique_ptr<SenderPath>(new GlooSenderPath(context));
}

Result<std::unique_ptr<ReceiverPath>> NewGlooReceiverPath(const ReceiverContext& context) {
  return std::unique_ptr<ReceiverPath>(new GlooReceiverPath(context));
}

}  // namespace troupe::broadcast
