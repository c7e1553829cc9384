// zmq backend: chain or star over the chunk stream (zmq_path.h).
#include "zmq_path.h"

#include "chunk_stream.h"

namespace troupe::broadcast {
namespace {

class ZmqSenderPath final : public SenderPath {
 public:
  explicit ZmqSenderPath(const SenderContext& c) : c_(c) {}

  Status Announce(proto::GroupMsg* group) override {
    group->algorithm = ZmqTopologyName(c_.config->zmq_topology);
    return Status::Ok();
  }
  Status Form(const proto::GroupMsg&, const std::vector<PathMember>&, Deadline,
              const Interrupt&) override {
    return Status::Ok();  // members connect their relays when they join
  }
  Result<Stream> Acquire(uint64_t bytes) override {
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(bytes));
    return Stream{buf->data(), buf};
  }
  Status Send(const Layout& layout, const Stream& stream, const std::vector<PathMember>& members,
              Deadline deadline, const Interrupt& interrupt, uint64_t* bytes_sent) override {
    if (members.empty()) return Status::Ok();
    std::vector<std::string> targets;
    for (const auto& m : members) targets.push_back(m.data_endpoint);
    if (c_.config->zmq_topology == ZmqTopology::kChain) targets.resize(1);  // the rest relay
    return c_.chunks->Send(targets, layout, stream.data, stream.owner, deadline, interrupt,
                           bytes_sent);
  }
  void Abort() override {}

 private:
  SenderContext c_;
};

class ZmqReceiverPath final : public ReceiverPath {
 public:
  explicit ZmqReceiverPath(const ReceiverContext& c) : c_(c) {}

  Status Join(const proto::GroupMsg& group, int rank, Deadline, const Interrupt&) override {
    Abort();
    const bool chain = group.algorithm == "chain";
    timeout_ = std::chrono::milliseconds(group.timeout_ms > 0 ? group.timeout_ms : 10000);
    // Chunks come from the predecessor on a chain, from the learner on a star.
    from_ = group.members[chain ? rank - 1 : 0];
    if (chain && rank + 1 < static_cast<int>(group.members.size())) {
      relay_.next_endpoint = group.endpoints[rank + 1];
      TROUPE_ASSIGN_OR_RETURN(next_,
                              ConnectDataSocket(c_.network, relay_.next_endpoint, c_.header.sender,
                                                c_.config->zmq_hwm_chunks));
      relay_.next = next_.get();
      relay_.header = c_.header;
    }
    return Status::Ok();
  }

  Result<Landed> Receive(const proto::ManifestMsg& manifest, const Interrupt& interrupt,
                         const Progress& progress) override {
    const Layout& layout = manifest.layout;
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, c_.pool->Get(layout.total_bytes));
    Landed l;
    TROUPE_RETURN_IF_ERROR(c_.chunks->Receive(layout, from_, buf->data(), next_ ? &relay_ : nullptr,
                                              timeout_, interrupt, progress, &l.bytes_received));
    l.data = buf->data();
    l.owner = buf;
    return l;
  }

  bool BreaksOnFailure() const override { return false; }

  void Abort() override {
    relay_ = ChunkReceiver::Relay{};
    next_.reset();
  }

 private:
  ReceiverContext c_;
  std::string from_;
  std::chrono::milliseconds timeout_{10000};
  std::unique_ptr<transport::Socket> next_;
  ChunkReceiver::Relay relay_;
};

}  // namespace

Result<std::unique_ptr<SenderPath>> NewZmqSenderPath(const SenderContext& context) {
  return std::unique_ptr<SenderPath>(new ZmqSenderPath(context));
}

Result<std::unique_ptr<ReceiverPath>> NewZmqReceiverPath(const ReceiverContext& context) {
  return std::unique_ptr<ReceiverPath>(new ZmqReceiverPath(context));
}

}  // namespace troupe::broadcast
