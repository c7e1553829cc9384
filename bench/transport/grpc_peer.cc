#include "grpc_peer.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "rollout.grpc.pb.h"

namespace troupe::bench {
namespace {

class Service final : public troupe::bench::Rollouts::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<Ack, RolloutBatch>* stream) override {
    RolloutBatch b;
    uint64_t n = 0;
    while (stream->Read(&b)) {
      // "Process": look at the tensors as the Troupe receiver does.
      if (b.response_tokens().data().size() != b.response_tokens().shape(0) * 4) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad tensor");
      }
      Ack a;
      a.set_received(++n);
      stream->Write(a);
    }
    return grpc::Status::OK;
  }
};

void SetArray(NDArray* a, int dtype, int64_t n, const transport::AlignedBuffer& buf) {
  a->set_dtype(dtype);
  a->add_shape(n);
  a->set_data(buf.data(), buf.size());
}

void Fill(RolloutBatch* p, const BatchData& d, uint64_t index) {
  p->Clear();
  p->set_batch_id(fmt::format("rollout-0/1/{}", index));
  p->set_policy_version(7);
  p->set_producer("rollout-0");
  p->set_num_sequences(static_cast<uint32_t>(d.sequences));
  p->set_group_size(8);
  const int64_t s = d.sequences;
  SetArray(p->mutable_prompt_tokens(), 7, s * kPromptTokens, *d.prompt_tokens);
  SetArray(p->mutable_prompt_offsets(), 8, s + 1, *d.prompt_offsets);
  SetArray(p->mutable_response_tokens(), 7, s * kResponseTokens, *d.response_tokens);
  SetArray(p->mutable_response_offsets(), 8, s + 1, *d.response_offsets);
  SetArray(p->mutable_behaviour_logprobs(), 0, s * kResponseTokens, *d.logprobs);
  SetArray(p->mutable_loss_mask(), 5, s * kResponseTokens, *d.mask);
  char id[32];
  for (int i = 0; i < d.sequences; ++i) {
    auto* q = p->add_sequences();
    const int n = std::snprintf(id, sizeof id, "prompt-%d", i / 8);
    q->set_prompt_id(id, static_cast<size_t>(n));
    q->set_group_index(static_cast<uint32_t>(i / 8));
    q->set_finish_reason(0);
    q->set_task("reverse");
  }
}

}  // namespace

Result<GrpcResult> RunGrpcPeer(const BatchData& data, int count) {
  Service service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Unavailable("gRPC server did not start");

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(fmt::format("127.0.0.1:{}", port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = Rollouts::NewStub(channel);
  GrpcResult result;
  auto run = [&](int n, double* seconds) -> Status {
    grpc::ClientContext ctx;
    auto stream = stub->Stream(&ctx);
    uint64_t acked = 0;
    std::thread reader([&] {
      Ack a;
      while (acked < static_cast<uint64_t>(n) && stream->Read(&a)) acked = a.received();
    });
    RolloutBatch b;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      Fill(&b, data, static_cast<uint64_t>(i));
      if (i == 0) result.message_bytes = b.ByteSizeLong();
      if (!stream->Write(b)) break;
    }
    stream->WritesDone();
    reader.join();
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    grpc::Status st = stream->Finish();
    if (!st.ok()) return Internal("gRPC stream failed: {}", st.error_message());
    if (acked != static_cast<uint64_t>(n)) return Internal("gRPC acked {} of {}", acked, n);
    return Status::Ok();
  };
  double warm = 0, seconds = 0;
  TROUPE_RETURN_IF_ERROR(run(std::max(1, count / 10), &warm));
  TROUPE_RETURN_IF_ERROR(run(count, &seconds));
  result.batches_per_s = count / seconds;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return result;
}

}  // namespace troupe::bench
