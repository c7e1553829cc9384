#include "troupe/envs/workspace.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "troupe/core/log.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// A relative path as the model wrote it, safe to show (printable, bounded).
std::string Shown(std::string_view rel) {
  std::string out;
  for (char c : rel.substr(0, 80)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (rel.size() > 80) out += "...";
  return out;
}

std::string Join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) out += (i ? "/" : "") + parts[i];
  return out;
}

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

Status DirError(int err, const std::string& shown) {
  if (err == ENOENT) return NotFound("directory '{}' does not exist", shown);
  if (err == ELOOP || err == ENOTDIR)
    return InvalidArgument("'{}' is not a directory (symbolic links are not followed)", shown);
  return IoError("cannot open directory '{}': {}", shown, std::strerror(err));
}

// Reads directory entries of `dir_fd` (a duplicate is consumed), at most `cap` names.
std::vector<std::string> ReadNames(int dir_fd, size_t cap, bool* capped) {
  std::vector<std::string> names;
  int dup_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return names;
  DIR* d = ::fdopendir(dup_fd);
  if (!d) {
    ::close(dup_fd);
    return names;
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    if (names.size() >= cap) {
      if (capped) *capped = true;
      break;
    }
    names.emplace_back(n);
  }
  ::closedir(d);
  return names;
}

}  // namespace

Workspace::Workspace(WorkspaceConfig config, std::string path, int dir_fd)
    : config_(std::move(config)), path_(std::move(path)), dir_fd_(dir_fd) {}

Result<std::unique_ptr<Workspace>> Workspace::Create(const WorkspaceConfig& config) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  std::string tmpl = config.root;
  if (tmpl.back() != '/') tmpl += '/';
  tmpl += "troupe-ws-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data()))
    return IoError("cannot create a workspace under '{}' (workspace.root): {}", config.root,
                   std::strerror(errno));
  std::string path(buf.data());
  int fd = ::open(path.c_str(), kDirFlags);
  if (fd < 0) {
    int err = errno;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    return IoError("cannot open workspace '{}': {}", path, std::strerror(err));
  }
  return std::unique_ptr<Workspace>(new Workspace(config, std::move(path), fd));
}

Workspace::~Workspace() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) log::Get("envs").warn("could not remove workspace {}: {}", path_, ec.message());
}

Result<std::vector<std::string>> Workspace::SplitPath(std::string_view rel, bool allow_root) const {
  if (static_cast<int64_t>(rel.size()) > config_.max_path_chars)
    return InvalidArgument("path is {} characters, over the limit of {}", rel.size(),
                           config_.max_path_chars);
  for (char c : rel) {
    if (c == '\0') return InvalidArgument("path '{}' contains a NUL byte", Shown(rel));
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      return InvalidArgument("path '{}' contains a control character", Shown(rel));
  }
  if (!rel.empty() && rel[0] == '/')
    return InvalidArgument(
        "absolute path '{}' is not allowed; use a path relative to the workspace", Shown(rel));
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= rel.size()) {
    size_t j = rel.find('/', i);
    if (j == std::string_view::npos) j = rel.size();
    std::string_view part = rel.substr(i, j - i);
    if (part == "..")
      return InvalidArgument("path '{}' leaves the workspace ('..' is not allowed)", Shown(rel));
    if (part.size() > 255)
      return InvalidArgument("a component of path '{}' is over 255 bytes", Shown(rel));
    if (!part.empty() && part != ".") parts.emplace_back(part);
    i = j + 1;
  }
  if (parts.empty() && !allow_root) {
    if (rel.empty()) return InvalidArgument("path is empty");
    return InvalidArgument("path '{}' names the workspace itself, not a file", Shown(rel));
  }
  if (static_cast<int64_t>(parts.size()) > config_.max_depth)
    return InvalidArgument("path '{}' is {} levels deep, over the limit of {}", Shown(rel),
                           parts.size(), config_.max_depth);
  return parts;
}

Result<int> Workspace::OpenParent(const std::vector<std::string>& parts, bool create,
                                  int64_t* created) const {
  Fd cur(::fcntl(dir_fd_, F_DUPFD_CLOEXEC, 0));
  if (cur.get() < 0)
    return IoError("cannot duplicate the workspace descriptor: {}", std::strerror(errno));
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    int next = ::openat(cur.get(), parts[k].c_str(), kDirFlags);
    if (next < 0 && errno == ENOENT && create) {
      if (::mkdirat(cur.get(), parts[k].c_str(), 0755) != 0 && errno != EEXIST)
        return IoError("cannot create directory '{}': {}", Join(parts, k + 1),
                       std::strerror(errno));
      if (created) ++*created;
      next = ::openat(cur.get(), parts[k].c_str(), kDirFlags);
    }
    if (next < 0) return DirError(errno, Join(parts, k + 1));
    cur = Fd(next);
  }
  return cur.release();
}

Result<std::string> Workspace::ReadFile(std::string_view rel) const {
  TROUPE_ASSIGN_OR_RETURN(auto parts, SplitPath(rel, false));
  std::string shown = Join(parts, parts.size());
  TROUPE_ASSIGN_OR_RETURN(int parent_fd, OpenParent(parts, false, nullptr));
  Fd parent(parent_fd);
  Fd fd(
      ::openat(parent.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ENOENT) return NotFound("file '{}' does not exist", shown);
    if (err == ELOOP)
      return InvalidArgument("'{}' is a symbolic link; links are not followed", shown);
    return IoError("cannot open '{}': {}", shown, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return IoError("cannot stat '{}': {}", shown, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return InvalidArgument("'{}' is a directory; use list", shown);
  if (!S_ISREG(st.st_mode)) return InvalidArgument("'{}' is not a regular file", shown);
  if (st.st_size > config_.max_file_bytes)
    return ResourceExhausted("file '{}' is {} bytes, over the read limit of {}", shown,
                             static_cast<int64_t>(st.st_size), config_.max_file_bytes);
  std::string out;
  out.resize(static_cast<size_t>(config_.max_file_bytes) + 1);
  size_t have = 0;
  while (have < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + have, out.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read '{}': {}", shown, std::strerror(errno));
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (static_cast<int64_t>(have) > config_.max_file_bytes)
    return ResourceExhausted("file '{}' is over the read limit of {} bytes", shown,
                             config_.max_file_bytes);
  out.resize(have);
  return out;
}

Status Workspace::WriteFile(std::string_view rel, std::string_view content) {
  TROUPE_ASSIGN_OR_RETURN(auto parts, SplitPath(rel, false));
  std::string shown = Join(parts, parts.size());
  if (static_cast<int64_t>(content.size()) > config_.max_file_bytes)
    return ResourceExhausted("content is {} bytes, over the per-file limit of {}", content.size(),
                             config_.max_file_bytes);
  Usage usage = ComputeUsage();
  // How many parent directories exist already (the rest will be created).
  int64_t existing_dirs = 0;
  {
    Fd cur(::fcntl(dir_fd_, F_DUPFD_CLOEXEC, 0));
    for (size_t k = 0; k + 1 < parts.size() && cur.get() >= 0; ++k) {
      int next = ::openat(cur.get(), parts[k].c_str(), kDirFlags);
      if (next < 0) {
        if (errno != ENOENT) return DirError(errno, Join(parts, k + 1));
        break;
      }
      cur = Fd(next);
      ++existing_dirs;
    }
  }
  int64_t new_dirs = static_cast<int64_t>(parts.size()) - 1 - existing_dirs;
  int64_t old_bytes = 0;
  bool exists = false;
  if (new_dirs == 0) {
    TROUPE_ASSIGN_OR_RETURN(int pfd, OpenParent(parts, false, nullptr));
    Fd parent(pfd);
    struct stat st {};
    if (::fstatat(parent.get(), parts.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISREG(st.st_mode))
        return InvalidArgument(
            "'{}' exists and is not a regular file (directories and links are "
            "not overwritten)",
            shown);
      exists = true;
      old_bytes = st.st_size;
    }
  }
  if (usage.files + new_dirs + (exists ? 0 : 1) > config_.max_files)
    return ResourceExhausted(
        "workspace holds {} files and directories; writing '{}' would pass the "
        "limit of {}",
        usage.files, shown, config_.max_files);
  if (usage.bytes - old_bytes + static_cast<int64_t>(content.size()) > config_.max_total_bytes)
    return ResourceExhausted(
        "workspace holds {} bytes; writing {} bytes to '{}' would pass the limit "
        "of {}",
        usage.bytes, content.size(), shown, config_.max_total_bytes);
  TROUPE_ASSIGN_OR_RETURN(int pfd, OpenParent(parts, true, nullptr));
  Fd parent(pfd);
  Fd fd(::openat(parent.get(), parts.back().c_str(),
                 O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ELOOP)
      return InvalidArgument("'{}' is a symbolic link; links are not followed", shown);
    if (err == EISDIR) return InvalidArgument("'{}' is a directory", shown);
    return IoError("cannot open '{}' for writing: {}", shown, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return InvalidArgument("'{}' is not a regular file", shown);
  if (::ftruncate(fd.get(), 0) != 0)
    return IoError("cannot truncate '{}': {}", shown, std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError("cannot write '{}': {}", shown, std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status Workspace::EditFile(std::string_view rel, std::string_view old_text,
                           std::string_view new_text) {
  if (old_text.empty())
    return InvalidArgument("argument \"old\" is empty; give the exact text to replace");
  TROUPE_ASSIGN_OR_RETURN(std::string content, ReadFile(rel));
  size_t first = content.find(old_text);
  if (first == std::string::npos)
    return NotFound("text to replace was not found in '{}'", Shown(rel));
  size_t count = 0;
  for (size_t p = first; p != std::string::npos; p = content.find(old_text, p + old_text.size()))
    ++count;
  if (count > 1)
    return InvalidArgument("text to replace occurs {} times in '{}'; give a longer, unique \"old\"",
                           count, Shown(rel));
  content.replace(first, old_text.size(), new_text);
  return WriteFile(rel, content);
}

Result<std::vector<Workspace::Entry>> Workspace::List(std::string_view rel, bool* truncated) const {
  TROUPE_ASSIGN_OR_RETURN(auto parts, SplitPath(rel, true));
  std::string shown = parts.empty() ? "." : Join(parts, parts.size());
  Fd dir(::fcntl(dir_fd_, F_DUPFD_CLOEXEC, 0));
  for (size_t k = 0; k < parts.size(); ++k) {
    int next = ::openat(dir.get(), parts[k].c_str(), kDirFlags);
    if (next < 0) return DirError(errno, Join(parts, k + 1));
    dir = Fd(next);
  }
  bool capped = false;
  std::vector<std::string> names = ReadNames(dir.get(), 100000, &capped);
  std::sort(names.begin(), names.end());
  size_t keep = std::min(names.size(), static_cast<size_t>(config_.max_list_entries));
  if (truncated) *truncated = capped || keep < names.size();
  std::vector<Entry> out;
  for (size_t i = 0; i < keep; ++i) {
    Entry e;
    e.name = names[i];
    struct stat st {};
    if (::fstatat(dir.get(), names[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      e.type = Entry::Type::kFile;
      e.bytes = st.st_size;
    } else if (S_ISDIR(st.st_mode)) {
      e.type = Entry::Type::kDir;
    } else if (S_ISLNK(st.st_mode)) {
      e.type = Entry::Type::kLink;
    } else {
      e.type = Entry::Type::kOther;
    }
    out.push_back(std::move(e));
  }
  return out;
}

Workspace::Usage Workspace::ComputeUsage() const {
  Usage u;
  const int64_t cap = 4 * config_.max_files;
  std::vector<std::pair<Fd, int64_t>> stack;
  stack.emplace_back(Fd(::fcntl(dir_fd_, F_DUPFD_CLOEXEC, 0)), 0);
  while (!stack.empty()) {
    Fd dir = std::move(stack.back().first);
    int64_t depth = stack.back().second;
    stack.pop_back();
    if (dir.get() < 0) continue;
    bool capped = false;
    for (const auto& name : ReadNames(dir.get(), static_cast<size_t>(cap), &capped)) {
      if (++u.files > cap) return u;
      struct stat st {};
      if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISREG(st.st_mode)) u.bytes += st.st_size;
      if (S_ISDIR(st.st_mode) && depth < config_.max_depth + 1)
        stack.emplace_back(Fd(::openat(dir.get(), name.c_str(), kDirFlags)), depth + 1);
    }
    if (capped) u.files = std::max(u.files, cap + 1);
  }
  return u;
}

// ---------------------------------------------------------------- tools

namespace {

using json = nlohmann::json;

class WorkspaceEnvironment final : public Environment {
 public:
  WorkspaceEnvironment(std::unique_ptr<Workspace> ws, WorkspaceScorer scorer)
      : ws_(std::move(ws)), scorer_(std::move(scorer)) {}

  const std::vector<ToolSpec>& tools() const override { return WorkspaceToolSpecs(); }

  ToolResult Call(const std::string& name, const json& args) override {
    Result<std::string> out = Dispatch(name, args);
    if (!out.ok()) return ToolResult::Error(out.status().message());
    if (name == "submit") return ToolResult::Submit(std::move(*out));
    return ToolResult::Ok(std::move(*out));
  }

  VerifyResult Score() override { return scorer_(*ws_, answer_, submitted_); }

 private:
  size_t PathLimit() const { return static_cast<size_t>(ws_->config().max_path_chars) + 1; }
  size_t FileLimit() const { return static_cast<size_t>(ws_->config().max_file_bytes); }

  Result<std::string> Dispatch(const std::string& name, const json& args) {
    if (name == "read") return Read(args);
    if (name == "write") {
      TROUPE_RETURN_IF_ERROR(CheckArgKeys(args, {"path", "content"}));
      TROUPE_ASSIGN_OR_RETURN(std::string path, StringArg(args, "path", PathLimit()));
      TROUPE_ASSIGN_OR_RETURN(std::string content, StringArg(args, "content", FileLimit()));
      TROUPE_RETURN_IF_ERROR(ws_->WriteFile(path, content));
      return fmt::format("wrote {} bytes", content.size());
    }
    if (name == "edit") {
      TROUPE_RETURN_IF_ERROR(CheckArgKeys(args, {"path", "old", "new"}));
      TROUPE_ASSIGN_OR_RETURN(std::string path, StringArg(args, "path", PathLimit()));
      TROUPE_ASSIGN_OR_RETURN(std::string old_text, StringArg(args, "old", FileLimit()));
      TROUPE_ASSIGN_OR_RETURN(std::string new_text, StringArg(args, "new", FileLimit()));
      TROUPE_RETURN_IF_ERROR(ws_->EditFile(path, old_text, new_text));
      return std::string("edited");
    }
    if (name == "list") return List(args);
    if (name == "submit") {
      TROUPE_RETURN_IF_ERROR(CheckArgKeys(args, {"answer"}));
      TROUPE_ASSIGN_OR_RETURN(std::optional<std::string> answer,
                              OptStringArg(args, "answer", 4096));
      answer_ = std::move(answer);
      submitted_ = true;
      return std::string("submitted");
    }
    return InvalidArgument("unknown tool '{}'", name);
  }

  Result<std::string> Read(const json& args) {
    TROUPE_RETURN_IF_ERROR(CheckArgKeys(args, {"path", "offset", "limit"}));
    TROUPE_ASSIGN_OR_RETURN(std::string path, StringArg(args, "path", PathLimit()));
    int64_t max = ws_->config().max_file_bytes;
    TROUPE_ASSIGN_OR_RETURN(std::optional<int64_t> offset, OptIntArg(args, "offset", 0, max));
    TROUPE_ASSIGN_OR_RETURN(std::optional<int64_t> limit, OptIntArg(args, "limit", 1, max));
    TROUPE_ASSIGN_OR_RETURN(std::string content, ws_->ReadFile(path));
    size_t off = static_cast<size_t>(offset.value_or(0));
    if (off > content.size())
      return InvalidArgument("offset {} is past the end of the file ({} bytes)", off,
                             content.size());
    return content.substr(off, limit ? static_cast<size_t>(*limit) : std::string::npos);
  }

  Result<std::string> List(const json& args) {
    TROUPE_RETURN_IF_ERROR(CheckArgKeys(args, {"path"}));
    TROUPE_ASSIGN_OR_RETURN(std::optional<std::string> path,
                            OptStringArg(args, "path", PathLimit()));
    bool truncated = false;
    TROUPE_ASSIGN_OR_RETURN(auto entries, ws_->List(path.value_or("."), &truncated));
    std::string out;
    for (const auto& e : entries) {
      switch (e.type) {
        case Workspace::Entry::Type::kFile:
          out += fmt::format("{} {}\n", e.name, e.bytes);
          break;
        case Workspace::Entry::Type::kDir:
          out += e.name + "/\n";
          break;
        case Workspace::Entry::Type::kLink:
          out += e.name + "@ (link, not followed)\n";
          break;
        case Workspace::Entry::Type::kOther:
          out += e.name + " (special file)\n";
          break;
      }
    }
    if (truncated) out += "[more entries not shown]\n";
    if (out.empty()) out = "(empty)";
    if (out.back() == '\n') out.pop_back();
    return out;
  }

  std::unique_ptr<Workspace> ws_;
  WorkspaceScorer scorer_;
  std::optional<std::string> answer_;
  bool submitted_ = false;
};

}  // namespace

const std::vector<ToolSpec>& WorkspaceToolSpecs() {
  static const std::vector<ToolSpec> specs = {
      {"read", R"({"path": str, "offset"?: int, "limit"?: int})", "show a file (or a slice of it)"},
      {"write", R"({"path": str, "content": str})", "create or replace a file"},
      {"edit", R"({"path": str, "old": str, "new": str})", "replace one exact occurrence of old"},
      {"list", R"({"path"?: str})", "list a directory"},
      {"submit", R"({"answer"?: str})", "finish the episode"},
  };
  return specs;
}

Result<std::unique_ptr<Environment>> NewWorkspaceEnvironment(
    const WorkspaceConfig& config, const std::map<std::string, std::string>& initial_files,
    WorkspaceScorer scorer) {
  if (!scorer) return InvalidArgument("NewWorkspaceEnvironment: no scorer");
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Workspace> ws, Workspace::Create(config));
  for (const auto& [path, content] : initial_files) {
    Status s = ws->WriteFile(path, content);
    if (!s.ok()) return s.WithContext(fmt::format("initial file '{}'", Shown(path)));
  }
  return std::unique_ptr<Environment>(
      std::make_unique<WorkspaceEnvironment>(std::move(ws), std::move(scorer)));
}

}  // namespace troupe::envs
