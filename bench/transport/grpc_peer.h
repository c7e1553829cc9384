// The gRPC + protobuf peer: the same RolloutBatch streamed over a gRPC
// bidirectional stream on tcp loopback, one ack per processed batch.
#pragma once

#include "batch.h"
#include "troupe/core/status.h"

namespace troupe::bench {

struct GrpcResult {
  double batches_per_s = 0;
  size_t message_bytes = 0;  // serialized protobuf size of one batch
};

// Streams `count` batches built from `data` (tensor bytes copied into the
// protobuf, as protobuf requires) and waits for every ack.
Result<GrpcResult> RunGrpcPeer(const BatchData& data, int count);

}  // namespace troupe::bench
