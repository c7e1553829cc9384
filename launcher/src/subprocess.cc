#include "troupe/launcher/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

extern char** environ;

namespace troupe::launcher {

std::string ExitInfo::ToString() const {
  if (exited) return "exit " + std::to_string(code);
  if (signal)
    return std::string("killed by ") + (sigabbrev_np(signal)
                                            ? "SIG" + std::string(sigabbrev_np(signal))
                                            : std::to_string(signal));
  return "running";
}

Result<Subprocess> Subprocess::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return InvalidArgument("spawn: empty argv");
  std::string prog = FindExecutable(o.argv[0]);
  if (prog.empty()) return NotFound("spawn: program '{}' not found", o.argv[0]);

  // Prepare everything that allocates before fork (the child only calls async-signal-safe
  // functions).
  std::vector<std::string> env_strings;
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : o.env) merged[k] = v;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.argv;
  args[0] = prog;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out_fd = -1;
  if (!o.output_file.empty()) {
    out_fd = ::open(o.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0)
      return IoError("spawn: cannot open '{}': {}", o.output_file, std::strerror(errno));
  }
  int in_pipe[2] = {-1, -1};
  if (!o.stdin_data.empty() && ::pipe2(in_pipe, O_CLOEXEC) != 0) {
    if (out_fd >= 0) ::close(out_fd);
    return IoError("spawn: pipe: {}", std::strerror(errno));
  }
  // Error reporting from the child: a CLOEXEC pipe that carries errno if exec fails.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return IoError("spawn: pipe: {}", std::strerror(errno));

  pid_t pid = ::fork();
  if (pid < 0) return IoError("spawn: fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    // Default signal dispositions and an empty mask for the new program.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGTERM, SIGINT, SIGPIPE, SIGCHLD, SIGHUP}) ::signal(s, SIG_DFL);
    if (in_pipe[0] >= 0) {
      ::dup2(in_pipe[0], 0);
    } else {
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
    }
    if (out_fd >= 0) {
      ::dup2(out_fd, 1);
      ::dup2(out_fd, 2);
    }
    if (!o.working_dir.empty() && ::chdir(o.working_dir.c_str()) != 0) {
      int e = errno;
      (void)!::write(err_pipe[1], &e, sizeof(e));
      ::_exit(127);
    }
    ::execve(argv[0], argv.data(), envp.data());
    int e = errno;
    (void)!::write(err_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }
  // Parent: also set the group here to avoid a race with an early Signal().
  ::setpgid(pid, pid);
  ::close(err_pipe[1]);
  if (out_fd >= 0) ::close(out_fd);
  if (in_pipe[0] >= 0) {
    ::close(in_pipe[0]);
    const char* p = o.stdin_data.data();
    size_t left = o.stdin_data.size();
    while (left > 0) {
      ssize_t n = ::write(in_pipe[1], p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::close(in_pipe[1]);
  }
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  Subprocess sp;
  sp.pid_ = pid;
  sp.term_grace_ms_ = o.term_grace_ms;
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    sp.pid_ = -1;
    return IoError("spawn: exec '{}' failed: {}", prog, std::strerror(child_errno));
  }
  return sp;
}

Subprocess::Subprocess(Subprocess&& other) noexcept {
  *this = std::move(other);
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_) Stop();
    pid_ = other.pid_;
    term_grace_ms_ = other.term_grace_ms_;
    exit_ = other.exit_;
    other.pid_ = -1;
    other.exit_.reset();
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_) Stop();
}

void Subprocess::Reap(int status) {
  ExitInfo info;
  if (WIFEXITED(status)) {
    info.exited = true;
    info.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    info.signal = WTERMSIG(status);
  }
  exit_ = info;
}

bool Subprocess::running() {
  return pid_ > 0 && !Poll().has_value();
}

std::optional<ExitInfo> Subprocess::Poll() {
  if (exit_) return exit_;
  if (pid_ <= 0) return std::nullopt;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) Reap(status);
  return exit_;
}

Result<ExitInfo> Subprocess::Wait(Deadline deadline) {
  // Poll with a short backoff: waitpid has no timeout and SIGCHLD handlers are
  // process-global, which a library must not own.
  int sleep_us = 200;
  while (true) {
    if (auto e = Poll()) return *e;
    if (pid_ <= 0) return Internal("wait: no child");
    if (deadline.expired()) return Timeout("process {} still running at the deadline", pid_);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 20000);
  }
}

Status Subprocess::Signal(int sig) {
  if (pid_ <= 0 || exit_) return Unavailable("process already exited");
  if (::kill(-pid_, sig) != 0 && ::kill(pid_, sig) != 0) {
    return Unavailable("kill({}, {}): {}", pid_, sig, std::strerror(errno));
  }
  return Status::Ok();
}

ExitInfo Subprocess::Stop() {
  if (pid_ <= 0) return exit_.value_or(ExitInfo{});
  if (auto e = Poll()) {
    ::kill(-pid_, SIGKILL);  // stragglers in the group
    return *e;
  }
  ::kill(-pid_, SIGTERM);
  auto r = Wait(Deadline::InMs(term_grace_ms_));
  ::kill(-pid_, SIGKILL);  // the group, including anything the child left behind
  if (r.ok()) return *r;
  auto r2 = Wait(Deadline::InMs(10000));
  return r2.ok() ? *r2 : ExitInfo{};
}

void Subprocess::Release() {
  pid_ = -1;
  exit_.reset();
}

std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string cand = p.substr(start, end - start) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace troupe::launcher
