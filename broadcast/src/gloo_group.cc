// gloo backend: c10d TCPStore + ProcessGroupGloo per epoch (gloo_group.h).
#include "gloo_group.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <vector>

#include <ATen/ops/from_blob.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace troupe::broadcast {
namespace {

// A gloo/c10d exception as a Status: timeouts become Code::kTimeout, the rest kUnavailable
// (a peer closed its connection, a socket error).
Status FromException(std::string_view what, std::string_view context) {
  std::string msg(what);
  auto nl = msg.find('\n');  // c10 messages may carry a trailing backtrace
  if (nl != std::string::npos) msg.resize(nl);
  if (msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos)
    return Timeout("{}: {}", context, msg);
  return Unavailable("{}: {}", context, msg);
}

#define TROUPE_GLOO_CATCH(context)                             \
  catch (const c10::Error& e) {                                \
    return FromException(e.what_without_backtrace(), context); \
  }                                                            \
  catch (const std::exception& e) {                            \
    return FromException(e.what(), context);                   \
  }

std::chrono::milliseconds WaitBudget(Deadline deadline, std::chrono::milliseconds stall) {
  auto rem = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
  return std::max(std::chrono::milliseconds(1), std::min(rem, stall));
}

}  // namespace

struct GlooStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

GlooStore::GlooStore(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}
GlooStore::~GlooStore() = default;

Result<std::unique_ptr<GlooStore>> GlooStore::Host(const std::string& host, uint16_t port,
                                                   std::chrono::milliseconds timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = port;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = timeout;
    auto impl = std::make_unique<Impl>();
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, o);
    std::string address = fmt::format("{}:{}", host, impl->store->getPort());
    return std::unique_ptr<GlooStore>(new GlooStore(std::move(impl), std::move(address)));
  }
  TROUPE_GLOO_CATCH(fmt::format("hosting the TCPStore on {}:{}", host, port))
}

Result<std::unique_ptr<GlooStore>> GlooStore::Connect(const std::string& address,
                                                      std::chrono::milliseconds timeout) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size())
    return Malformed("store address '{}' is not host:port", address);
  int port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535)
      return Malformed("store address '{}' has a bad port", address);
    port = port * 10 + (c - '0');
  }
  if (port == 0 || port > 65535) return Malformed("store address '{}' has a bad port", address);
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = false;
    o.timeout = timeout;
    auto impl = std::make_unique<Impl>();
    impl->store = c10::make_intrusive<c10d::TCPStore>(address.substr(0, colon), o);
    return std::unique_ptr<GlooStore>(new GlooStore(std::move(impl), address));
  }
  TROUPE_GLOO_CATCH(fmt::format("connecting to the TCPStore at {}", address))
}

struct GlooGroup::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  int rank = 0;
  int size = 0;
  std::chrono::milliseconds timeout{0};
};

GlooGroup::GlooGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GlooGroup::~GlooGroup() = default;
int GlooGroup::rank() const {
  return impl_->rank;
}
int GlooGroup::size() const {
  return impl_->size;
}

Result<std::unique_ptr<GlooGroup>> GlooGroup::Form(const GlooStore& store, uint64_t epoch, int rank,
                                                   int size, const std::string& hostname,
                                                   std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument("gloo group rank {} of size {}", rank, size);
  try {
    auto prefix = c10::make_intrusive<c10d::PrefixStore>(fmt::format("troupe/weights/{}", epoch),
                                                         store.impl()->store);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    opts->threads = 2;
    auto impl = std::make_unique<Impl>();
    impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, rank, size, opts);
    impl->rank = rank;
    impl->size = size;
    impl->timeout = timeout;
    return std::unique_ptr<GlooGroup>(new GlooGroup(std::move(impl)));
  }
  TROUPE_GLOO_CATCH(fmt::format("forming gloo group epoch {} (rank {} of {})", epoch, rank, size))
}

Status GlooGroup::Transfer(const std::shared_ptr<void>& buffer, uint8_t* flat, const Layout& layout,
                           GlooAlgorithm algorithm, Deadline deadline,
                           const std::function<void(uint64_t)>& progress) {
  auto& pg = impl_->pg;
  const int rank = impl_->rank;
  const int size = impl_->size;
  if (size == 1 || layout.total_bytes == 0) return Status::Ok();
  std::shared_ptr<void> keep = buffer;
  auto view = [&](uint64_t begin, uint64_t end) {
    return at::from_blob(
        flat + begin, {static_cast<int64_t>(end - begin)}, [keep](void*) {},
        at::TensorOptions().dtype(at::kByte));
  };
  auto wait = [&](const c10::intrusive_ptr<c10d::Work>& w) {
    w->wait(WaitBudget(deadline, impl_->timeout));
  };
  try {
    if (algorithm == GlooAlgorithm::kBroadcast) {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (uint64_t b = 0; b < layout.num_buckets(); ++b) {
        std::vector<at::Tensor> ts{view(layout.bucket_begin(b), layout.bucket_end(b))};
        c10d::BroadcastOptions o;
        o.rootRank = 0;
        o.timeout = impl_->timeout;
        works.push_back(pg->broadcast(ts, o));
      }
      for (uint64_t b = 0; b < works.size(); ++b) {
        wait(works[b]);
        if (rank != 0 && progress) progress(layout.bucket_end(b));
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
    if (rank == 0) {
      for (uint64_t c = 0; c < chunks; ++c) {
        std::vector<at::Tensor> ts{chunk_view(c)};
        sends.push_back(pg->send(ts, 1, static_cast<int>(c)));
      }
    } else {
      std::vector<c10::intrusive_ptr<c10d::Work>> recvs;
      recvs.reserve(chunks);
      for (uint64_t c = 0; c < chunks; ++c) {
        std::vector<at::Tensor> ts{chunk_view(c)};
        recvs.push_back(pg->recv(ts, rank - 1, static_cast<int>(c)));
      }
      for (uint64_t c = 0; c < chunks; ++c) {
        wait(recvs[c]);
        if (rank + 1 < size) {
          std::vector<at::Tensor> ts{chunk_view(c)};
          sends.push_back(pg->send(ts, rank + 1, static_cast<int>(c)));
        }
        if (progress) progress(std::min(layout.total_bytes, (c + 1) * layout.chunk_bytes));
      }
    }
    for (auto& s : sends) wait(s);
    return Status::Ok();
  }
  TROUPE_GLOO_CATCH(fmt::format("gloo {} of version {} (rank {} of {})",
                                GlooAlgorithmName(algorithm), layout.version, rank, size))
}

}  // namespace troupe::broadcast
