#include "troupe/launcher/run_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace troupe::launcher {

std::string RunDir::name() const {
  return fs::path(path).filename().string();
}

static std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

Result<RunDir> CreateRunDir(const std::string& runs_root, const std::string& job_name) {
  std::error_code ec;
  fs::create_directories(runs_root, ec);
  if (ec) return IoError("cannot create runs folder '{}': {}", runs_root, ec.message());
  std::string base = job_name + "-" + Timestamp();
  fs::path dir = fs::absolute(fs::path(runs_root) / base, ec);
  if (ec) return IoError("cannot name a run folder under '{}': {}", runs_root, ec.message());
  for (int i = 2; fs::exists(dir, ec); ++i)
    dir = fs::absolute(fs::path(runs_root) / (base + "-" + std::to_string(i)), ec);
  for (const char* sub : {"", "logs", "checkpoints", "secrets"}) {
    fs::create_directories(dir / sub, ec);
    if (ec) return IoError("cannot create '{}': {}", (dir / sub).string(), ec.message());
  }
  ::chmod((dir / "secrets").c_str(), 0700);
  // runs/latest -> <base>, replaced atomically.
  fs::path latest = fs::path(runs_root) / "latest";
  fs::path tmp = fs::path(runs_root) / (".latest." + std::to_string(::getpid()));
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, latest, ec);
  if (ec) return IoError("cannot update '{}': {}", latest.string(), ec.message());
  return RunDir{dir.string()};
}

Result<RunDir> ResolveRunDir(const std::string& runs_root, const std::string& run) {
  std::error_code ec;
  if (run.empty()) {
    fs::path latest = fs::path(runs_root) / "latest";
    if (!fs::exists(latest, ec)) {
      return NotFound("no runs yet: '{}' does not exist (start one with `troupe run CONFIG`)",
                      latest.string());
    }
    fs::path target = fs::canonical(latest, ec);
    if (ec)
      return NotFound("'{}' points at a run folder that is gone: {}", latest.string(),
                      ec.message());
    return RunDir{target.string()};
  }
  if (fs::is_directory(run, ec)) return RunDir{fs::canonical(run, ec).string()};
  fs::path under = fs::path(runs_root) / run;
  if (fs::is_directory(under, ec)) return RunDir{fs::canonical(under, ec).string()};
  return NotFound("unknown run '{}' (not a folder, and not in '{}')", run, runs_root);
}

Status WriteFileAtomic(const std::string& path, const std::string& content, int mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return IoError("cannot write '{}': {}", tmp, std::strerror(errno));
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return IoError("cannot write '{}': {}", tmp, std::strerror(e));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return IoError("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(e));
  }
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read '{}': {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace troupe::launcher
