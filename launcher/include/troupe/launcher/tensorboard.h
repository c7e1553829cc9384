// TensorBoard event files: what the head writes to <run>/tb/ so that
// `tensorboard --logdir runs/` shows every metric of a job.
//
//   metrics.jsonl line ──Telemetry──▶ TbWriter ──Event protobuf──▶ TFRecord ──▶ tb/events.out.tfevents.*
//
// A file is a sequence of TFRecords (the published framing):
//   uint64 length (little endian) | uint32 masked_crc32c(length bytes) |
//   data[length] | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 with c the
// CRC-32C (Castagnoli) of x. Each record holds one serialized Event (Debian's
// libprotobuf, schema in src/proto/tensorboard_event.proto); the first carries
// file_version "brain.Event:2". Scalars are simple_value summaries, histograms
// HistogramProto, texts DT_STRING tensors for the "text" plugin.
//
// Thread-safety: one TbWriter per thread (the head uses it on its own thread).
// Every Add* writes through to the file (flushed, not fsynced), so a reader
// sees each event once the call returns.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::launcher {

// The masked CRC-32C of the TFRecord framing (exposed for tests).
uint32_t MaskedCrc32c(const void* data, size_t size);

class TbWriter {
 public:
  // Creates `dir` if needed and opens a new events file in it
  // (events.out.tfevents.<unix seconds>.<host>.<pid>), writing its
  // file_version record.
  static Result<std::unique_ptr<TbWriter>> Open(const std::string& dir);
  ~TbWriter();
  TbWriter(const TbWriter&) = delete;
  TbWriter& operator=(const TbWriter&) = delete;

  const std::string& path() const { return path_; }

  // `wall_time`: seconds since the epoch (the metrics line's time).
  Status AddScalar(const std::string& tag, int64_t step, double value, double wall_time);
  // A histogram of `values` over `edges` (ascending bucket upper limits; a
  // last bucket up to +DBL_MAX holds the rest). Empty `values`: nothing written.
  Status AddHistogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                      const std::vector<double>& edges, double wall_time);
  // A histogram given as counts per integer value k = 0..counts.size()-1
  // (e.g. the policy-lag histogram: batches at lag k).
  Status AddIntegerHistogram(const std::string& tag, int64_t step,
                             const std::vector<double>& counts, double wall_time);
  // A histogram given as counts per bucket: counts[i] values in
  // (edges[i-1], edges[i]], counts[edges.size()] above the last edge (the
  // learner's IS-weight histogram). min/max/sum are bucket-edge estimates.
  Status AddBucketCounts(const std::string& tag, int64_t step, const std::vector<double>& edges,
                         const std::vector<double>& counts, double wall_time);
  // A text (markdown, as TensorBoard's text plugin renders it).
  Status AddText(const std::string& tag, int64_t step, const std::string& text,
                 double wall_time);

  uint64_t events_written() const { return events_; }

 private:
  TbWriter(std::string path, FILE* f) : path_(std::move(path)), f_(f) {}
  Status WriteRecord(const std::string& data);

  std::string path_;
  FILE* f_ = nullptr;
  uint64_t events_ = 0;
};

}  // namespace troupe::launcher
