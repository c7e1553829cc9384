#include "troupe/engine/safetensors.h"

#include "troupe/core/check.h"
#include "troupe/engine/hf_folder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe::engine {
namespace {

using Json = nlohmann::json;

struct DTypeInfo {
  const char* name;
  at::ScalarType type;
};
constexpr DTypeInfo kDTypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

at::ScalarType TorchType(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.type;
  TROUPE_CHECK_MSG(false, "dtype '{}' passed header validation but has no torch type", name);
  return at::kFloat;
}

// Validates the file image [base, base+size) (hf_folder.h) and builds tensors viewing it;
// `owner` keeps the bytes alive for as long as any tensor does.
Result<SafetensorsFile> ParseImage(const std::string& src, std::shared_ptr<void> owner,
                                   const uint8_t* base, size_t size) {
  TROUPE_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(src, base, size, size));
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  const uint8_t* data = base + header.data_offset;
  for (const SafetensorsEntry& e : header.entries) {
    auto opts = at::TensorOptions().dtype(TorchType(e.dtype));
    void* ptr = const_cast<uint8_t*>(data + e.begin);
    at::Tensor t;
    if (e.end == e.begin) {
      t = at::empty(e.shape, opts);
    } else if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(e.itemsize) != 0) {
      // Misaligned (odd header padding): copy into an aligned tensor.
      t = at::empty(e.shape, opts);
      std::memcpy(t.data_ptr(), ptr, e.end - e.begin);
    } else {
      std::shared_ptr<void> keep = owner;
      t = at::from_blob(
          ptr, e.shape, [keep](void*) mutable { keep.reset(); }, opts);
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

// A private, copy-on-write mapping of a whole file.
struct Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) munmap(addr, size);
  }
};

}  // namespace

Result<std::string> SafetensorsDType(c10::ScalarType dtype) {
  for (const auto& d : kDTypes)
    if (d.type == dtype) return std::string(d.name);
  return InvalidArgument("dtype {} has no safetensors equivalent", c10::toString(dtype));
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("safetensors file '{}' does not exist", path);
    return IoError("cannot open '{}': {}", path, std::strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("'{}' is not a regular file", path);
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  if (map->size < 8) {
    ::close(fd);
    return Malformed("{}: {} bytes is too short for the 8-byte header length", path, map->size);
  }
  map->addr = mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (map->addr == MAP_FAILED) return IoError("cannot map '{}': {}", path, std::strerror(err));
  const auto* base = static_cast<const uint8_t*>(map->addr);
  return ParseImage(path, map, base, map->size);
}

Result<SafetensorsFile> ParseSafetensors(const uint8_t* data, size_t size) {
  // at::empty gives an aligned buffer; the tensors share it.
  at::Tensor buf = at::empty({static_cast<int64_t>(size)}, at::kByte);
  if (size > 0) std::memcpy(buf.data_ptr(), data, size);
  auto owner = std::make_shared<at::Tensor>(buf);
  return ParseImage("<memory>", owner, buf.data_ptr<uint8_t>(), size);
}

Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::vector<at::Tensor> cpu;
  cpu.reserve(tensors.size());
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty())
      return InvalidArgument("cannot write a tensor with an empty name to '{}'", path);
    if (name == "__metadata__") return InvalidArgument("tensor name '__metadata__' is reserved");
    if (!names.insert(name).second) return InvalidArgument("tensor '{}' given twice", name);
    if (!t.defined()) return InvalidArgument("tensor '{}' is undefined", name);
    TROUPE_ASSIGN_OR_RETURN(std::string dt, SafetensorsDType(t.scalar_type()));
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = c.nbytes();
    nlohmann::ordered_json e;
    e["dtype"] = dt;
    e["shape"] = c.sizes().vec();
    e["data_offsets"] = {offset, offset + nbytes};
    header[name] = e;
    offset += nbytes;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError("cannot create '{}': {}", tmp, std::strerror(errno));
  uint8_t len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  for (size_t i = 0; ok && i < cpu.size(); ++i) {
    const size_t nb = cpu[i].nbytes();
    ok = nb == 0 || std::fwrite(cpu[i].data_ptr(), 1, nb, f) == nb;
  }
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return IoError("cannot write '{}': {}", tmp, std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    return IoError("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err));
  }
  return Status::Ok();
}

Result<std::shared_ptr<LlamaModel>> LoadModel(const std::string& path, const ModelConfig& config,
                                              torch::Device device, const LoadOptions& options) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  namespace fs = std::filesystem;
  std::error_code ec;
  NamedTensors all;
  if (fs::is_directory(path, ec)) {
    TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(path));
    if (files.size() > 1) TROUPE_RETURN_IF_ERROR(CheckHfShardIndex(path));
    for (const std::string& f : files) {
      TROUPE_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(f));
      for (auto& t : file.tensors) all.push_back(std::move(t));
    }
  } else {
    TROUPE_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(path));
    all = std::move(f.tensors);
  }
  // Every parameter is overwritten when all are required: no random init to throw away.
  auto model = options.require_all
                   ? std::make_shared<LlamaModel>(config, LlamaModel::Uninitialized{}, device)
                   : std::make_shared<LlamaModel>(config, /*seed=*/0, device);
  Status st = model->LoadNamed(all, options);
  if (!st.ok()) return st.WithContext(path);
  return model;
}

Status SaveModel(const std::string& path, const LlamaModel& model,
                 const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");
  return WriteSafetensors(path, model.NamedWeights(), meta);
}

}  // namespace troupe::engine
