#include "troupe/engine/hf_folder.h"

#include <fcntl.h>
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

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe::engine {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

struct DTypeSize {
  const char* name;
  int64_t itemsize;
};
constexpr DTypeSize kDTypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                 {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

Status ParseEntry(const std::string& src, const std::string& name, const Json& v,
                  SafetensorsEntry* out) {
  out->name = name;
  if (!v.is_object()) return Malformed("{}: entry '{}' is not an object", src, name);
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    return Malformed("{}: tensor '{}' has no string 'dtype'", src, name);
  out->dtype = dt->get<std::string>();
  out->itemsize = SafetensorsItemSize(out->dtype);
  if (out->itemsize == 0)
    return Malformed("{}: tensor '{}' has unknown dtype '{}'", src, name, out->dtype);
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
  const uint64_t nbytes = numel * static_cast<uint64_t>(out->itemsize);
  if (out->end - out->begin != nbytes)
    return Malformed("{}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] span {}",
                     src, name, out->dtype, sh->dump(), nbytes, out->begin, out->end,
                     out->end - out->begin);
  return Status::Ok();
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return NotFound("'{}' does not exist", path);
    return IoError("cannot open '{}': {}", path, std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("cannot read '{}'", path);
  return ss.str();
}

Result<Json> ReadJsonObject(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Malformed("{}: not a JSON object", path);
  return j;
}

// An id or a list of ids (eos_token_id may be either).
Status ReadIds(const Json& j, const char* key, const std::string& src, std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  std::vector<int32_t> ids;
  auto one = [&](const Json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return Malformed("{}: '{}' must be a token id or a list of them, got {}", src, key,
                       it->dump());
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return Status::Ok();
  };
  if (it->is_array()) {
    for (const auto& v : *it) TROUPE_RETURN_IF_ERROR(one(v));
  } else {
    TROUPE_RETURN_IF_ERROR(one(*it));
  }
  *out = std::move(ids);
  return Status::Ok();
}

Status CopyBytes(std::FILE* in, uint64_t offset, uint64_t n, std::FILE* out,
                 const std::string& src, const std::string& dst) {
  if (std::fseek(in, static_cast<long>(offset), SEEK_SET) != 0)
    return IoError("cannot seek in '{}': {}", src, std::strerror(errno));
  std::vector<char> buf(std::min<uint64_t>(n, 8u << 20));
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    if (std::fread(buf.data(), 1, chunk, in) != chunk)
      return IoError("cannot read '{}' (truncated?)", src);
    if (std::fwrite(buf.data(), 1, chunk, out) != chunk)
      return IoError("cannot write '{}': {}", dst, std::strerror(errno));
    n -= chunk;
  }
  return Status::Ok();
}

Status FsyncFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("open {} for fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync {}: {}", path, std::strerror(err));
  return Status::Ok();
}

Status WriteText(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("cannot create '{}': {}", path, std::strerror(errno));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out) return IoError("cannot write '{}': {}", path, std::strerror(errno));
  return Status::Ok();
}

// A tensor to export: where its bytes are.
struct Source {
  size_t file;  // index into the input's weight files
  uint64_t offset;
  SafetensorsEntry entry;
};

// Writes one shard holding `tensors` (in order).
Status WriteShard(const std::string& path, const std::vector<const Source*>& tensors,
                  const std::vector<std::string>& files, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Source* s : tensors) {
    const uint64_t n = s->entry.end - s->entry.begin;
    header[s->entry.name] = {{"dtype", s->entry.dtype},
                             {"shape", s->entry.shape},
                             {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return IoError("cannot create '{}': {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  Status st = Status::Ok();
  if (std::fwrite(len, 1, 8, out) != 8 || std::fwrite(h.data(), 1, h.size(), out) != h.size())
    st = IoError("cannot write '{}': {}", path, std::strerror(errno));
  std::FILE* in = nullptr;
  size_t open_file = SIZE_MAX;
  for (const Source* s : tensors) {
    if (!st.ok()) break;
    if (s->file != open_file) {
      if (in) std::fclose(in);
      in = std::fopen(files[s->file].c_str(), "rb");
      open_file = s->file;
      if (in == nullptr) {
        st = IoError("cannot open '{}': {}", files[s->file], std::strerror(errno));
        break;
      }
    }
    st = CopyBytes(in, s->offset + s->entry.begin, s->entry.end - s->entry.begin, out,
                   files[s->file], path);
  }
  if (in) std::fclose(in);
  if (std::fclose(out) != 0 && st.ok()) st = IoError("cannot write '{}': {}", path, std::strerror(errno));
  return st;
}

}  // namespace

int64_t SafetensorsItemSize(std::string_view dtype) {
  for (const auto& d : kDTypes)
    if (dtype == d.name) return d.itemsize;
  return 0;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(const std::string& src, const uint8_t* base,
                                                 size_t available, uint64_t size) {
  if (size < 8 || available < 8)
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
  if (available < 8 + n) return Malformed("{}: header of {} bytes not available", src, n);
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

  SafetensorsHeader out;
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
    SafetensorsEntry e;
    TROUPE_RETURN_IF_ERROR(ParseEntry(src, it.key(), *it, &e));
    out.entries.push_back(std::move(e));
  }
  out.data_offset = 8 + n;
  out.data_size = size - 8 - n;
  auto& entries = out.entries;
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    if (e.end > out.data_size)
      return Malformed(
          "{}: tensor '{}' data_offsets [{}, {}] run past the {}-byte data section "
          "(truncated file?)",
          src, e.name, e.begin, e.end, out.data_size);
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
  if (cursor != out.data_size)
    return Malformed("{}: {} trailing bytes after the last tensor (data section {} bytes)", src,
                     out.data_size - cursor, out.data_size);
  return out;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return NotFound("safetensors file '{}' does not exist", path);
    return IoError("cannot open '{}': {}", path, std::strerror(errno));
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return IoError("cannot stat '{}': {}", path, ec.message());
  uint8_t len[8] = {0};
  in.read(reinterpret_cast<char*>(len), 8);
  if (size < 8 || !in)
    return Malformed("{}: {} bytes is too short for the 8-byte header length", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kMaxHeaderBytes || n > size - 8) return ParseSafetensorsHeader(path, len, 8, size);
  std::vector<uint8_t> buf(8 + n);
  std::memcpy(buf.data(), len, 8);
  in.read(reinterpret_cast<char*>(buf.data() + 8), static_cast<std::streamsize>(n));
  if (!in) return IoError("cannot read the header of '{}'", path);
  return ParseSafetensorsHeader(path, buf.data(), buf.size(), size);
}

Result<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (fs::exists(d / "model.safetensors", ec)) return std::vector<std::string>{(d / "model.safetensors").string()};
  const std::string index_path = (d / "model.safetensors.index.json").string();
  if (!fs::exists(index_path, ec))
    return NotFound("directory '{}' holds neither model.safetensors nor model.safetensors.index.json",
                    dir);
  TROUPE_ASSIGN_OR_RETURN(Json j, ReadJsonObject(index_path));
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    return Malformed("{}: not a JSON object with a 'weight_map' object", index_path);
  std::vector<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      return Malformed("{}: weight_map entry '{}' is not a file name", index_path, name);
    std::string s = file.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
      return Malformed("{}: shard name '{}' must be a plain file name", index_path, s);
    const std::string p = (d / s).string();
    if (std::find(shards.begin(), shards.end(), p) != shards.end()) continue;
    if (!fs::is_regular_file(p, ec))
      return NotFound("{}: shard '{}' (for tensor '{}') does not exist", index_path, s, name);
    shards.push_back(p);
  }
  if (shards.empty()) return Malformed("{}: weight_map is empty", index_path);
  return shards;
}

Status CheckHfShardIndex(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / "model.safetensors", ec)) return Status::Ok();
  const std::string index_path = (d / "model.safetensors.index.json").string();
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> shards, HfWeightFiles(dir));
  TROUPE_ASSIGN_OR_RETURN(Json j, ReadJsonObject(index_path));
  const Json& map = j["weight_map"];
  size_t seen = 0;
  for (const std::string& shard : shards) {
    TROUPE_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(shard));
    const std::string file = fs::path(shard).filename().string();
    for (const auto& e : h.entries) {
      auto it = map.find(e.name);
      if (it == map.end())
        return Malformed("{}: tensor '{}' of {} is missing from weight_map", index_path, e.name,
                         file);
      if (*it != file)
        return Malformed("{}: weight_map puts '{}' in {} but it is in {}", index_path, e.name,
                         it->get<std::string>(), file);
      ++seen;
    }
  }
  if (seen != map.size()) {
    for (const auto& [name, file] : map.items()) {
      bool found = false;
      for (const std::string& shard : shards) {
        if (fs::path(shard).filename() != file.get<std::string>()) continue;
        auto h = ReadSafetensorsHeader(shard);
        if (!h.ok()) return h.status();
        for (const auto& e : h->entries) found = found || e.name == name;
      }
      if (!found)
        return Malformed("{}: weight_map names '{}' in {}, which does not hold it", index_path,
                         name, file.get<std::string>());
    }
  }
  return Status::Ok();
}

Result<HfModelFolder> ReadHfModelFolder(const std::string& dir, int64_t max_seq_len_cap) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("model folder '{}' does not exist", dir);
  HfModelFolder f;
  f.dir = fs::absolute(dir, ec).lexically_normal().string();
  if (!f.dir.empty() && f.dir.size() > 1 && f.dir.back() == '/') f.dir.pop_back();
  const std::string config_path = (fs::path(f.dir) / "config.json").string();
  TROUPE_ASSIGN_OR_RETURN(f.config_json, ReadText(config_path));
  auto config = ModelConfigFromHfJson(f.config_json, max_seq_len_cap);
  if (!config.ok()) return config.status().WithContext(config_path);
  f.config = *config;
  Json cj = Json::parse(f.config_json, nullptr, false);
  std::vector<int32_t> bos;
  TROUPE_RETURN_IF_ERROR(ReadIds(cj, "eos_token_id", config_path, &f.eos_token_ids));
  TROUPE_RETURN_IF_ERROR(ReadIds(cj, "bos_token_id", config_path, &bos));
  const std::string gen_path = (fs::path(f.dir) / "generation_config.json").string();
  if (fs::exists(gen_path, ec)) {
    TROUPE_ASSIGN_OR_RETURN(f.generation_config_json, ReadText(gen_path));
    Json g = Json::parse(f.generation_config_json, nullptr, false);
    if (g.is_discarded() || !g.is_object()) return Malformed("{}: not a JSON object", gen_path);
    TROUPE_RETURN_IF_ERROR(ReadIds(g, "eos_token_id", gen_path, &f.eos_token_ids));
    TROUPE_RETURN_IF_ERROR(ReadIds(g, "bos_token_id", gen_path, &bos));
  }
  if (bos.size() > 1) return Malformed("{}: bos_token_id must be one id", f.dir);
  if (!bos.empty()) f.bos_token_id = bos[0];
  for (int32_t id : f.eos_token_ids)
    if (id >= f.config.vocab_size)
      return Malformed("{}: eos_token_id {} is outside the vocabulary of {} ids", f.dir, id,
                       f.config.vocab_size);
  auto weights = HfWeightFiles(f.dir);
  if (weights.ok()) {
    f.weight_files = std::move(*weights);
  } else if (weights.status().code() != Code::kNotFound ||
             fs::exists(fs::path(f.dir) / "model.safetensors.index.json", ec)) {
    return weights.status();
  }
  return f;
}

std::vector<std::string> HfTokenizerFiles(const std::string& path) {
  std::error_code ec;
  fs::path dir(path);
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();
  std::vector<std::string> out;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                           "chat_template.jinja"}) {
    if (fs::is_regular_file(dir / name, ec)) out.push_back((dir / name).string());
  }
  return out;
}

Result<std::string> GenerationConfigJson(std::string_view base_json, int32_t bos_id,
                                         const std::vector<int32_t>& eos_ids) {
  Json j = Json::object();
  if (!base_json.empty()) {
    j = Json::parse(base_json.begin(), base_json.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Malformed("the base generation_config.json is not a JSON object");
  }
  if (!j.contains("bos_token_id") && bos_id >= 0) j["bos_token_id"] = bos_id;
  if (!j.contains("eos_token_id") && !eos_ids.empty()) {
    if (eos_ids.size() == 1)
      j["eos_token_id"] = eos_ids[0];
    else
      j["eos_token_id"] = eos_ids;
  }
  return j.dump(2) + "\n";
}

Status WriteHfFolder(const HfExportInput& input, const std::string& dir,
                     const HfExportOptions& options) {
  std::error_code ec;
  if (input.weight_files.empty()) return InvalidArgument("export: no weight files given");
  if (options.max_shard_bytes == 0) return InvalidArgument("export: max_shard_bytes must be > 0");
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    return AlreadyExists("export: '{}' exists and is not an empty folder", dir);
  // 1. Every source tensor, validated; names unique across files.
  std::vector<Source> sources;
  std::set<std::string> names;
  for (size_t i = 0; i < input.weight_files.size(); ++i) {
    TROUPE_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(input.weight_files[i]));
    for (auto& e : h.entries) {
      if (!names.insert(e.name).second)
        return Malformed("export: tensor '{}' appears twice (again in {})", e.name,
                         input.weight_files[i]);
      sources.push_back({i, h.data_offset, std::move(e)});
    }
  }
  // 2. Shards: consecutive tensors up to max_shard_bytes each.
  std::vector<std::vector<const Source*>> shards;
  uint64_t in_shard = 0, total = 0;
  for (const Source& s : sources) {
    const uint64_t n = s.entry.end - s.entry.begin;
    if (shards.empty() || (in_shard > 0 && in_shard + n > options.max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += n;
    total += n;
  }
  // 3. Write into a temporary sibling, then rename.
  const fs::path final_dir = fs::absolute(dir, ec).lexically_normal();
  const fs::path parent = final_dir.parent_path();
  fs::create_directories(parent, ec);
  if (ec) return IoError("export: cannot create '{}': {}", parent.string(), ec.message());
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", final_dir.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) return IoError("export: cannot create '{}': {}", tmp.string(), ec.message());
  auto fail = [&](Status st) {
    std::error_code rm;
    fs::remove_all(tmp, rm);
    return st;
  };
  std::vector<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name =
        shards.size() == 1 ? "model.safetensors"
                           : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    const std::string path = (tmp / name).string();
    Status st = WriteShard(path, shards[k], input.weight_files, options.metadata);
    if (!st.ok()) return fail(st);
    for (const Source* s : shards[k]) weight_map[s->entry.name] = name;
    written.push_back(path);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    const std::string path = (tmp / "model.safetensors.index.json").string();
    Status st = WriteText(path, index.dump(2) + "\n");
    if (!st.ok()) return fail(st);
    written.push_back(path);
  }
  auto text = [&](const char* name, const std::string& contents) -> Status {
    const std::string path = (tmp / name).string();
    TROUPE_RETURN_IF_ERROR(WriteText(path, contents));
    written.push_back(path);
    return Status::Ok();
  };
  bool has_config = false;
  for (const auto& [name, contents] : input.files) {
    if (name.empty() || name.find('/') != std::string::npos || fs::exists(tmp / name, ec))
      return fail(InvalidArgument("export: bad or repeated file name '{}'", name));
    has_config = has_config || name == "config.json";
    if (Status st = text(name.c_str(), contents); !st.ok()) return fail(st);
  }
  if (!has_config) return fail(InvalidArgument("export: no config.json given"));
  for (const std::string& src : input.copy_files) {
    const fs::path to = tmp / fs::path(src).filename();
    if (fs::exists(to, ec))
      return fail(InvalidArgument("export: '{}' would overwrite {}", src, to.filename().string()));
    fs::copy_file(src, to, ec);
    if (ec) return fail(IoError("export: cannot copy '{}': {}", src, ec.message()));
    written.push_back(to.string());
  }
  for (const std::string& p : written)
    if (Status st = FsyncFile(p); !st.ok()) return fail(st);
  if (fs::exists(final_dir, ec)) fs::remove(final_dir, ec);  // empty (checked above)
  fs::rename(tmp, final_dir, ec);
  if (ec) return fail(IoError("export: cannot rename '{}' to '{}': {}", tmp.string(),
                              final_dir.string(), ec.message()));
  return Status::Ok();
}

}  // namespace troupe::engine
