#include "troupe/launcher/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <boost/crc.hpp>

#include "tensorboard_event.pb.h"
#include "troupe/core/text.h"
#include "troupe/launcher/spawner.h"

namespace troupe::launcher {

uint32_t MaskedCrc32c(const void* data, size_t size) {
  // CRC-32C (Castagnoli): reflected polynomial 0x1EDC6F41, init and final xor all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

Result<std::unique_ptr<TbWriter>> TbWriter::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create TensorBoard folder '{}': {}", dir, ec.message());
  // TensorBoard finds files by "tfevents" in the name; host and pid keep
  // two writers (a resumed run's head) apart.
  std::string path = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir,
                                 static_cast<long long>(std::time(nullptr)), HostName(),
                                 static_cast<int>(::getpid()));
  FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return IoError("cannot create '{}': {}", path, std::strerror(errno));
  std::unique_ptr<TbWriter> w(new TbWriter(path, f));
  tb::Event e;
  e.set_wall_time(static_cast<double>(std::time(nullptr)));
  e.set_file_version("brain.Event:2");
  TROUPE_RETURN_IF_ERROR(w->WriteRecord(e.SerializeAsString()));
  return w;
}

TbWriter::~TbWriter() {
  if (f_) std::fclose(f_);
}

Status TbWriter::WriteRecord(const std::string& data) {
  char header[12];
  const uint64_t len = data.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((len >> (8 * i)) & 0xff);  // LE
  const uint32_t len_crc = MaskedCrc32c(header, 8);
  const uint32_t data_crc = MaskedCrc32c(data.data(), data.size());
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<char>((len_crc >> (8 * i)) & 0xff);
  char footer[4];
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<char>((data_crc >> (8 * i)) & 0xff);
  if (std::fwrite(header, 1, sizeof(header), f_) != sizeof(header) ||
      std::fwrite(data.data(), 1, data.size(), f_) != data.size() ||
      std::fwrite(footer, 1, sizeof(footer), f_) != sizeof(footer) || std::fflush(f_) != 0)
    return IoError("cannot write '{}': {}", path_, std::strerror(errno));
  ++events_;
  return Status::Ok();
}

namespace {

tb::Event EventAt(int64_t step, double wall_time) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  return e;
}

}  // namespace

Status TbWriter::AddScalar(const std::string& tag, int64_t step, double value, double wall_time) {
  tb::Event e = EventAt(step, wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  return WriteRecord(e.SerializeAsString());
}

Status TbWriter::AddHistogram(const std::string& tag, int64_t step,
                              const std::vector<double>& values, const std::vector<double>& edges,
                              double wall_time) {
  if (values.empty()) return Status::Ok();
  tb::Event e = EventAt(step, wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* h = v->mutable_histo();
  std::vector<double> counts(edges.size() + 1, 0.0);
  double lo = values[0], hi = values[0], sum = 0, sq = 0;
  for (double x : values) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
    sq += x * x;
    // Bucket i holds (edges[i-1], edges[i]].
    size_t i = static_cast<size_t>(std::lower_bound(edges.begin(), edges.end(), x) - edges.begin());
    counts[i] += 1;
  }
  h->set_min(lo);
  h->set_max(hi);
  h->set_num(static_cast<double>(values.size()));
  h->set_sum(sum);
  h->set_sum_squares(sq);
  for (size_t i = 0; i < counts.size(); ++i) {
    h->add_bucket_limit(i < edges.size() ? edges[i] : DBL_MAX);
    h->add_bucket(counts[i]);
  }
  return WriteRecord(e.SerializeAsString());
}

Status TbWriter::AddIntegerHistogram(const std::string& tag, int64_t step,
                                     const std::vector<double>& counts, double wall_time) {
  double num = 0;
  for (double c : counts) num += c;
  if (num <= 0) return Status::Ok();
  tb::Event e = EventAt(step, wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* h = v->mutable_histo();
  double sum = 0, sq = 0, lo = -1, hi = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const double x = static_cast<double>(k);
    sum += counts[k] * x;
    sq += counts[k] * x * x;
    if (counts[k] > 0) {
      if (lo < 0) lo = x;
      hi = x;
    }
  }
  h->set_min(lo);
  h->set_max(hi);
  h->set_num(num);
  h->set_sum(sum);
  h->set_sum_squares(sq);
  // Bucket k covers (k - 0.5, k + 0.5]: one bar per integer value.
  for (size_t k = 0; k < counts.size(); ++k) {
    h->add_bucket_limit(static_cast<double>(k) + 0.5);
    h->add_bucket(counts[k]);
  }
  return WriteRecord(e.SerializeAsString());
}

Status TbWriter::AddBucketCounts(const std::string& tag, int64_t step,
                                 const std::vector<double>& edges,
                                 const std::vector<double>& counts, double wall_time) {
  if (counts.size() != edges.size() + 1 || edges.empty())
    return InvalidArgument("histogram '{}': {} counts for {} edges (want edges + 1)", tag,
                           counts.size(), edges.size());
  double num = 0, sum = 0, sq = 0, lo = 0, hi = 0;
  bool any = false;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] <= 0) continue;
    // A bucket's values stand at its middle (the open ends at their one edge).
    const double low = i == 0 ? std::min(0.0, edges[0]) : edges[i - 1];
    const double high = i < edges.size() ? edges[i] : edges.back();
    const double mid = i == 0 || i == edges.size() ? high : 0.5 * (low + high);
    if (!any) lo = low;
    hi = high;
    any = true;
    num += counts[i];
    sum += counts[i] * mid;
    sq += counts[i] * mid * mid;
  }
  if (!any) return Status::Ok();
  tb::Event e = EventAt(step, wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* h = v->mutable_histo();
  h->set_min(lo);
  h->set_max(hi);
  h->set_num(num);
  h->set_sum(sum);
  h->set_sum_squares(sq);
  for (size_t i = 0; i < counts.size(); ++i) {
    h->add_bucket_limit(i < edges.size() ? edges[i] : DBL_MAX);
    h->add_bucket(counts[i]);
  }
  return WriteRecord(e.SerializeAsString());
}

Status TbWriter::AddText(const std::string& tag, int64_t step, const std::string& text,
                         double wall_time) {
  tb::Event e = EventAt(step, wall_time);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(7);  // DT_STRING
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
  return WriteRecord(e.SerializeAsString());
}

}  // namespace troupe::launcher
