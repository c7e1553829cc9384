#include "troupe/engine/safetensors.h"

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
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

struct DTypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t itemsize;
};
constexpr DTypeInfo kDTypes[] = {
    {"F64", at::kDouble, 8},    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8},  {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},     {"I8", at::kChar, 1},   {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

const DTypeInfo* FindDType(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

// Entry of the header before tensors are built.
struct Entry {
  std::string name;
  const DTypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Status ParseEntry(const std::string& src, const std::string& name, const Json& v, Entry* out) {
  out->name = name;
  if (!v.is_object()) return Malformed("{}: entry '{}' is not an object", src, name);
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    return Malformed("{}: tensor '{}' has no string 'dtype'", src, name);
  out->dtype = FindDType(dt->get<std::string>());
  if (out->dtype == nullptr)
    return Malformed("{}: tensor '{}' has unknown dtype '{}'", src, name, dt->get<std::string>());
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array())
    return Malformed("{}: tensor '{}' has no 'shape' array", src, name);
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())
      return Malformed("{}: tensor '{}' has a bad dimension {} in its shape", src, name, d.dump());
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim))
      return Malformed("{}: tensor '{}' shape {} overflows", src, name, sh->dump());
    numel *= dim;
    out->shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return Malformed("{}: tensor '{}' needs 'data_offsets' [begin, end] of non-negative integers",
                     src, name);
  out->begin = (*off)[0].get<uint64_t>();
  out->end = (*off)[1].get<uint64_t>();
  if (out->end < out->begin)
    return Malformed("{}: tensor '{}' has data_offsets [{}, {}] with end before begin", src, name,
                     out->begin, out->end);
  const uint64_t nbytes = numel * static_cast<uint64_t>(out->dtype->itemsize);
  if (out->end - out->begin != nbytes)
    return Malformed("{}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}",
                     src, name, out->dtype->name, sh->dump(), nbytes, out->begin, out->end,
                     out->end - out->begin);
  return Status::Ok();
}

// Validates the file image [base, base+size) and builds tensors viewing it; `owner`
// keeps the bytes alive for as long as any tensor does.
Result<SafetensorsFile> ParseImage(const std::string& src, std::shared_ptr<void> owner,
                                   const uint8_t* base, size_t size) {
  if (size < 8)
    return Malformed("{}: {} bytes is too short for the 8-byte header length", src, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian
  if (n > kMaxHeaderBytes)
    return Malformed("{}: header length {} exceeds the limit of {} bytes", src, n, kMaxHeaderBytes);
  if (n > size - 8)
    return Malformed(
        "{}: header length {} exceeds the {} bytes after the length field "
        "(truncated file?)",
        src, n, size - 8);
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  std::set<std::string> top_keys;
  std::string duplicate;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!top_keys.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(hdr, hdr + n, cb);
  } catch (const Json::exception& e) {
    return Malformed("{}: header is not valid JSON: {}", src, e.what());
  }
  if (!duplicate.empty()) return Malformed("{}: header names '{}' twice", src, duplicate);
  if (!j.is_object()) return Malformed("{}: header is not a JSON object", src);

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Malformed("{}: __metadata__ is not an object", src);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Malformed("{}: __metadata__ value of '{}' is not a string", src, m.key());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    Entry e;
    TROUPE_RETURN_IF_ERROR(ParseEntry(src, it.key(), *it, &e));
    entries.push_back(std::move(e));
  }
  const uint64_t data_size = size - 8 - n;
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_size)
      return Malformed(
          "{}: tensor '{}' data_offsets [{}, {}] run past the {}-byte data section "
          "(truncated file?)",
          src, e.name, e.begin, e.end, data_size);
    if (e.begin < cursor)
      return Malformed("{}: tensor '{}' data_offsets [{}, {}] overlap tensor '{}' ending at {}",
                       src, e.name, e.begin, e.end, prev ? prev->name : "?", cursor);
    if (e.begin > cursor)
      return Malformed(
          "{}: {} unindexed bytes before tensor '{}' at offset {} (holes are not "
          "allowed)",
          src, e.begin - cursor, e.name, cursor);
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size)
    return Malformed("{}: {} trailing bytes after the last tensor (data section {} bytes)", src,
                     data_size - cursor, data_size);

  const uint8_t* data = base + 8 + n;
  for (const Entry& e : entries) {
    auto opts = at::TensorOptions().dtype(e.dtype->type);
    void* ptr = const_cast<uint8_t*>(data + e.begin);
    at::Tensor t;
    if (e.end == e.begin) {
      t = at::empty(e.shape, opts);
    } else if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(e.dtype->itemsize) != 0) {
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

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open '{}': {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors", ec)) {
      TROUPE_ASSIGN_OR_RETURN(SafetensorsFile f,
                              ReadSafetensors((dir / "model.safetensors").string()));
      all = std::move(f.tensors);
    } else if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      const std::string index_path = (dir / "model.safetensors.index.json").string();
      TROUPE_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
      Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
          !j["weight_map"].is_object())
        return Malformed("{}: not a JSON object with a 'weight_map' object", index_path);
      std::vector<std::string> shards;
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string())
          return Malformed("{}: weight_map entry '{}' is not a file name", index_path, name);
        std::string s = file.get<std::string>();
        if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
          return Malformed("{}: shard name '{}' must be a plain file name", index_path, s);
        if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
      }
      for (const std::string& s : shards) {
        TROUPE_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors((dir / s).string()));
        for (auto& t : f.tensors) all.push_back(std::move(t));
      }
    } else {
      return NotFound(
          "directory '{}' holds neither model.safetensors nor "
          "model.safetensors.index.json",
          path);
    }
  } else {
    TROUPE_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(path));
    all = std::move(f.tensors);
  }
  auto model = std::make_shared<LlamaModel>(config, /*seed=*/0, device);
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
