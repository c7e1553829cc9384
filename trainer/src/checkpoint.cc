#include "troupe/trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace troupe::trainer {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kTmpPrefix = ".tmp-";
constexpr std::string_view kLatest = "latest";

Status FsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return IoError("open {} for fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync {}: {}", path, std::strerror(err));
  return Status::Ok();
}

// Parses "ckpt-<step>[-<k>]" into (step, k); false for other names.
bool ParseName(const std::string& name, uint64_t* step, uint64_t* k) {
  if (name.rfind(kPrefix, 0) != 0) return false;
  std::string rest = name.substr(kPrefix.size());
  *k = 0;
  size_t dash = rest.find('-');
  std::string step_s = rest.substr(0, dash);
  if (step_s.empty() || step_s.find_first_not_of("0123456789") != std::string::npos) return false;
  *step = std::stoull(step_s);
  if (dash != std::string::npos) {
    std::string k_s = rest.substr(dash + 1);
    if (k_s.empty() || k_s.find_first_not_of("0123456789") != std::string::npos) return false;
    *k = std::stoull(k_s);
  }
  return true;
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IoError("cannot create {}: {}", tmp, std::strerror(errno));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) return IoError("cannot write {}: {}", tmp, std::strerror(errno));
  }
  TROUPE_RETURN_IF_ERROR(FsyncPath(tmp, false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return IoError("rename {} -> {}: {}", tmp, path, std::strerror(errno));
  }
  fs::path parent = fs::path(path).parent_path();
  return FsyncPath(parent.empty() ? "." : parent.string(), true);
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open {}: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("cannot read {}", path);
  return ss.str();
}

CheckpointWriter::CheckpointWriter(std::string root, std::string tmp_dir, std::string name)
    : root_(std::move(root)), tmp_dir_(std::move(tmp_dir)), name_(std::move(name)) {}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& o) noexcept
    : root_(std::move(o.root_)),
      tmp_dir_(std::move(o.tmp_dir_)),
      name_(std::move(o.name_)),
      committed_(o.committed_) {
  o.committed_ = true;  // the moved-from writer owns nothing
  o.tmp_dir_.clear();
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_ || tmp_dir_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
}

Result<CheckpointWriter> CheckpointWriter::Begin(const std::string& root, uint64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return IoError("cannot create checkpoint root {}: {}", root, ec.message());
  // Leftovers of saves that were killed mid-way.
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0) {
      std::error_code rm_ec;
      fs::remove_all(entry.path(), rm_ec);
    }
  }
  if (ec) return IoError("cannot list checkpoint root {}: {}", root, ec.message());
  std::string name = fmt::format("{}{:012d}", kPrefix, step);
  for (int k = 1; fs::exists(fs::path(root) / name); ++k) {
    name = fmt::format("{}{:012d}-{}", kPrefix, step, k);
  }
  const std::string tmp =
      (fs::path(root) / fmt::format("{}{}-{}", kTmpPrefix, name, ::getpid())).string();
  fs::create_directory(tmp, ec);
  if (ec) return IoError("cannot create {}: {}", tmp, ec.message());
  return CheckpointWriter(root, tmp, name);
}

std::string CheckpointWriter::File(std::string_view name) const {
  return (fs::path(tmp_dir_) / std::string(name)).string();
}

Result<std::string> CheckpointWriter::Commit(int32_t keep, const CheckpointHooks& hooks) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tmp_dir_, ec)) {
    if (entry.is_regular_file()) TROUPE_RETURN_IF_ERROR(FsyncPath(entry.path().string(), false));
  }
  if (ec) return IoError("cannot list {}: {}", tmp_dir_, ec.message());
  TROUPE_RETURN_IF_ERROR(FsyncPath(tmp_dir_, true));
  hooks.Stage("synced");
  const std::string final_dir = (fs::path(root_) / name_).string();
  if (std::rename(tmp_dir_.c_str(), final_dir.c_str()) != 0) {
    return IoError("rename {} -> {}: {}", tmp_dir_, final_dir, std::strerror(errno));
  }
  committed_ = true;
  TROUPE_RETURN_IF_ERROR(FsyncPath(root_, true));
  hooks.Stage("renamed");
  TROUPE_RETURN_IF_ERROR(WriteFileAtomic((fs::path(root_) / kLatest).string(), name_ + "\n"));
  hooks.Stage("latest");

  // Prune: keep the newest `keep` complete checkpoints (by step, then suffix).
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, fs::path>> all;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    uint64_t s = 0, k = 0;
    if (entry.is_directory() && ParseName(entry.path().filename().string(), &s, &k)) {
      all.push_back({{s, k}, entry.path()});
    }
  }
  std::sort(all.begin(), all.end());
  const size_t n_keep = static_cast<size_t>(std::max(keep, 1));
  for (size_t i = 0; i + n_keep < all.size(); ++i) {
    if (all[i].second.filename() == name_) continue;
    std::error_code rm_ec;
    fs::remove_all(all[i].second, rm_ec);
  }
  return final_dir;
}

Result<std::string> ResolveCheckpoint(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::exists(p / "state.json", ec)) return p.string();
  if (!fs::exists(p / kLatest, ec)) {
    return NotFound(
        "no checkpoint at {}: neither a checkpoint directory (state.json) nor a root "
        "with a `latest` pointer",
        path);
  }
  TROUPE_ASSIGN_OR_RETURN(std::string name, ReadFile((p / kLatest).string()));
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) {
    name.pop_back();
  }
  uint64_t s = 0, k = 0;
  if (!ParseName(name, &s, &k)) {
    return Malformed("{}/latest holds '{}', not a checkpoint name (ckpt-<step>)", path, name);
  }
  const fs::path dir = p / name;
  if (!fs::exists(dir / "state.json", ec)) {
    return Malformed("{}/latest names {} but {} has no state.json", path, name, dir.string());
  }
  return dir.string();
}

Result<std::string> ResolveWeightsFile(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) return NotFound("'{}' does not exist", path);
  if (!fs::is_directory(p, ec)) return p.string();
  for (const fs::path& root : {p, p / "checkpoints"}) {
    if (fs::exists(root / "model.safetensors", ec)) return (root / "model.safetensors").string();
    auto ckpt = ResolveCheckpoint(root.string());
    if (ckpt.ok() && fs::exists(fs::path(*ckpt) / "model.safetensors", ec))
      return (fs::path(*ckpt) / "model.safetensors").string();
  }
  return NotFound("'{}' holds no model.safetensors, and no checkpoints/latest naming one", path);
}

}  // namespace troupe::trainer
