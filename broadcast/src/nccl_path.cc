// nccl backend: non-blocking communicator with abort on timeout (nccl_path.h).
#include "nccl_path.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

namespace troupe::broadcast {
namespace {

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Unavailable("{}: {}", what, cudaGetErrorString(e));
}

Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return Status::Ok();
  return Unavailable("{}: {}", what, ncclGetErrorString(r));
}

}  // namespace

struct NcclGroup::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* device_buffer = nullptr;
  size_t device_bytes = 0;
  int device = 0;
  int rank = 0;
  int size = 0;
  bool broken = false;  // aborted or failed: never destroy gracefully

  // Polls the communicator until its pending operation settles. On the deadline, an async
  // error or should_abort(), aborts the communicator.
  Status Settle(Deadline deadline, const std::function<bool()>& should_abort, const char* what) {
    while (true) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess) return Abort(NcclStatus(r, "ncclCommGetAsyncError"));
      if (async == ncclSuccess) return Status::Ok();
      if (async != ncclInProgress) return Abort(NcclStatus(async, what));
      if (deadline.expired()) return Abort(Timeout("{}: no progress before the deadline", what));
      if (should_abort && should_abort()) return Abort(Cancelled("{}: a newer epoch began", what));
    }
  }

  Status Abort(Status why) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    broken = true;
    return why;
  }
};

int NcclGroup::VisibleDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Result<std::string> NcclGroup::NewUniqueId() {
  ncclUniqueId id;
  TROUPE_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

NcclGroup::NcclGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclGroup::~NcclGroup() {
  if (impl_->comm != nullptr) {
    if (impl_->broken) {
      ncclCommAbort(impl_->comm);
    } else {
      ncclCommDestroy(impl_->comm);
    }
  }
  cudaSetDevice(impl_->device);
  if (impl_->device_buffer != nullptr) cudaFree(impl_->device_buffer);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::Form(const std::string& unique_id, int rank, int size,
                                                   int device, Deadline deadline,
                                                   const std::function<bool()>& should_abort) {
  if (unique_id.size() != sizeof(ncclUniqueId))
    return Malformed("ncclUniqueId of {} bytes (expected {})", unique_id.size(),
                     sizeof(ncclUniqueId));
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument("nccl rank {} of size {}", rank, size);
  int devices = VisibleDevices();
  if (device >= devices)
    return Unavailable("nccl_device {} but {} CUDA devices are visible", device, devices);
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->rank = rank;
  impl->size = size;
  TROUPE_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  TROUPE_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "stream"));
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, size, id, rank, &config);
  std::unique_ptr<NcclGroup> group(new NcclGroup(std::move(impl)));
  if (r != ncclSuccess && r != ncclInProgress)
    return group->impl_->Abort(NcclStatus(r, "ncclCommInitRankConfig"));
  TROUPE_RETURN_IF_ERROR(group->impl_->Settle(deadline, should_abort, "ncclCommInitRankConfig"));
  return group;
}

Status NcclGroup::Transfer(uint8_t* flat, const Layout& layout, Deadline deadline,
                           const std::function<bool()>& should_abort) {
  Impl& g = *impl_;
  if (g.broken || g.comm == nullptr) return Unavailable("nccl communicator was aborted");
  if (layout.total_bytes == 0) return Status::Ok();
  TROUPE_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(g.device), "cudaSetDevice"));
  // A stream in this GPU's memory moves as it is; a host one is staged through a device buffer.
  cudaPointerAttributes attr{};
  TROUPE_RETURN_IF_ERROR(
      CudaStatus(cudaPointerGetAttributes(&attr, flat), "cudaPointerGetAttributes"));
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (on_device && attr.device != g.device)
    return InvalidArgument("the stream is in the memory of CUDA device {}, the communicator on {}",
                           attr.device, g.device);
  uint8_t* dev = flat;
  if (on_device) {
    // PackTensors queued the packing on torch's default (legacy) stream: NCCL's stream waits
    // for it on the device, the host does not block.
    cudaEvent_t packed = nullptr;
    TROUPE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&packed, cudaEventDisableTiming), "cudaEventCreate"));
    cudaError_t e = cudaEventRecord(packed, cudaStreamLegacy);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g.stream, packed, 0);
    cudaEventDestroy(packed);
    TROUPE_RETURN_IF_ERROR(CudaStatus(e, "waiting for the packed stream"));
  } else {
    if (g.device_bytes < layout.total_bytes) {
      if (g.device_buffer != nullptr) cudaFree(g.device_buffer);
      g.device_buffer = nullptr;
      g.device_bytes = 0;
      TROUPE_RETURN_IF_ERROR(
          CudaStatus(cudaMalloc(&g.device_buffer, layout.total_bytes), "cudaMalloc"));
      g.device_bytes = layout.total_bytes;
    }
    dev = static_cast<uint8_t*>(g.device_buffer);
  }
  // A single-rank communicator still runs the whole path (staging copies + ncclBroadcast).
  for (uint64_t b = 0; b < layout.num_buckets(); ++b) {
    uint64_t begin = layout.bucket_begin(b);
    uint64_t len = layout.bucket_end(b) - begin;
    if (g.rank == 0 && !on_device)
      TROUPE_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(dev + begin, flat + begin, len, cudaMemcpyHostToDevice, g.stream),
          "cudaMemcpyAsync H2D"));
    ncclResult_t r = ncclBroadcast(dev + begin, dev + begin, len, ncclUint8, 0, g.comm, g.stream);
    if (r != ncclSuccess && r != ncclInProgress) return g.Abort(NcclStatus(r, "ncclBroadcast"));
    TROUPE_RETURN_IF_ERROR(g.Settle(deadline, should_abort, "ncclBroadcast enqueue"));
    if (g.rank != 0 && !on_device)
      TROUPE_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(flat + begin, dev + begin, len, cudaMemcpyDeviceToHost, g.stream),
          "cudaMemcpyAsync D2H"));
  }
  // Wait for the stream without blocking in CUDA: query, check NCCL's async state, abort on time.
  while (true) {
    cudaError_t q = cudaStreamQuery(g.stream);
    if (q == cudaSuccess) return Status::Ok();
    if (q != cudaErrorNotReady) return g.Abort(CudaStatus(q, "nccl transfer stream"));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(g.comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      return g.Abort(NcclStatus(async, "ncclBroadcast"));
    if (deadline.expired())
      return g.Abort(Timeout("nccl broadcast of version {} did not finish before the deadline",
                             layout.version));
    if (should_abort && should_abort())
      return g.Abort(
          Cancelled("nccl broadcast of version {} abandoned: a newer epoch began", layout.version));
  }
}

// ----------------------------------------------------------------- paths

namespace {

std::chrono::milliseconds GroupTimeout(const proto::GroupMsg& g) {
  return std::chrono::milliseconds(g.timeout_ms > 0 ? g.timeout_ms : 10000);
}

class NcclSenderPath final : public SenderPath {
 public:
  explicit NcclSenderPath(const SenderContext& c) : c_(c) {}
  ~NcclSenderPath() override { Abort(); }

  Status Announce(proto::GroupMsg* group) override {
    group->algorithm = "broadcast";
    if (group->members.size() > 1) {
      TROUPE_ASSIGN_OR_RETURN(group->nccl_id, NcclGroup::NewUniqueId());
    }
    return Status::Ok();
  }
  Status Form(const proto::GroupMsg& group, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt) override {
    Abort();
    if (members.empty()) return Status::Ok();
    auto t = std::max(Millis(10), Budget(deadline, GroupTimeout(group)));
    auto g = NcclGroup::Form(group.nccl_id, 0, static_cast<int>(members.size() + 1),
                             c_.config->nccl_device, Deadline::In(t), interrupt);
    if (!g.ok()) return g.status();
    nccl_ = std::shared_ptr<NcclGroup>(std::move(g).value());
    return Status::Ok();
  }
  Result<Stream> Acquire(uint64_t bytes) override {
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(bytes));
    return Stream{buf->data(), buf};
  }
  Status Send(const Layout& layout, const Stream& stream, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt, uint64_t* bytes_sent) override {
    if (members.empty()) return Status::Ok();
    if (!nccl_) return Internal("the nccl communicator of epoch {} is missing", layout.transfer);
    TROUPE_RETURN_IF_ERROR(nccl_->Transfer(stream.data, layout, deadline, interrupt));
    *bytes_sent += layout.total_bytes;
    return Status::Ok();
  }
  void Abort() override {
    c_.reaper->Add(std::move(nccl_));
    nccl_.reset();
  }

 private:
  SenderContext c_;
  std::shared_ptr<NcclGroup> nccl_;
};

class NcclReceiverPath final : public ReceiverPath {
 public:
  explicit NcclReceiverPath(const ReceiverContext& c) : c_(c) {}
  ~NcclReceiverPath() override { Abort(); }

  Status Join(const proto::GroupMsg& group, int rank, Deadline deadline,
              const Interrupt& interrupt) override {
    Abort();
    timeout_ = GroupTimeout(group);
    auto g = NcclGroup::Form(group.nccl_id, rank, static_cast<int>(group.members.size()),
                             c_.config->nccl_device, deadline, interrupt);
    if (!g.ok()) return g.status();
    nccl_ = std::shared_ptr<NcclGroup>(std::move(g).value());
    return Status::Ok();
  }
  Result<Landed> Receive(const proto::ManifestMsg& manifest, const Interrupt& interrupt,
                         const Progress& progress) override {
    const Layout& layout = manifest.layout;
    if (!nccl_) return Unavailable("no nccl communicator for epoch {}", layout.transfer);
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(layout.total_bytes));
    TROUPE_RETURN_IF_ERROR(
        nccl_->Transfer(buf->data(), layout, Deadline::In(timeout_ * 10), interrupt));
    if (progress) progress(layout.total_bytes, layout.total_bytes);
    Landed l;
    l.data = buf->data();
    l.owner = buf;
    l.bytes_received = layout.total_bytes;
    return l;
  }
  bool BreaksOnFailure() const override { return true; }
  void Abort() override {
    c_.reaper->Add(std::move(nccl_));
    nccl_.reset();
  }

 private:
  ReceiverContext c_;
  std::shared_ptr<NcclGroup> nccl_;
  std::chrono::milliseconds timeout_{10000};
};

}  // namespace

Result<std::unique_ptr<SenderPath>> NewNcclSenderPath(const SenderContext& context) {
  const int devices = NcclGroup::VisibleDevices();
  if (devices <= context.config->nccl_device)
    return Unavailable("nccl backend: CUDA device {} is not visible ({} devices)",
                       context.config->nccl_device, devices);
  return std::unique_ptr<SenderPath>(new NcclSenderPath(context));
}

Result<std::unique_ptr<ReceiverPath>> NewNcclReceiverPath(const ReceiverContext& context) {
  return std::unique_ptr<ReceiverPath>(new NcclReceiverPath(context));
}

}  // namespace troupe::broadcast
