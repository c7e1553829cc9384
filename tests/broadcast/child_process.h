// A child process for multi-process tests: this test binary re-executed with
// arguments, its stdin and stdout on pipes. Lines are read with deadlines;
// the child dies with its parent (PR_SET_PDEATHSIG) and the destructor kills
// and reaps it, so no test leaves a process behind.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::testing {

class ChildProcess {
 public:
  // Starts `argv[0]` = path with the given arguments; `prefix` (e.g. {"ip", "netns", "exec",
  // "ns1"}) runs it through a launcher.
  static Result<std::unique_ptr<ChildProcess>> Start(const std::string& path,
                                                     const std::vector<std::string>& args,
                                                     const std::vector<std::string>& prefix = {}) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
      return IoError("pipe: {}", std::strerror(errno));
    std::vector<std::string> all = prefix;
    all.push_back(path);
    all.insert(all.end(), args.begin(), args.end());
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return IoError("fork: {}", std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(111);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      ::_exit(112);
    }
    ::close(in[0]);
    ::close(out[1]);
    auto c = std::unique_ptr<ChildProcess>(new ChildProcess(pid, in[1], out[0]));
    return c;
  }

  ~ChildProcess() {
    Kill(SIGKILL);
    Reap();
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
  }

  pid_t pid() const { return pid_; }

  // Next line of the child's stdout (without '\n'); Timeout at the deadline, Unavailable at
  // EOF (the child exited).
  Result<std::string> ReadLine(Deadline deadline) {
    while (true) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (eof_) return Unavailable("child {} closed its stdout", pid_);
      pollfd p{out_, POLLIN, 0};
      int ms = static_cast<int>(std::min<int64_t>(
          deadline.remaining_ms_or_minus1() < 0 ? 1000 : deadline.remaining_ms_or_minus1(), 1000));
      if (deadline.expired()) return Timeout("no line from child {} before the deadline", pid_);
      int r = ::poll(&p, 1, std::max(ms, 1));
      if (r <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(out_, tmp, sizeof(tmp));
      if (n <= 0) {
        eof_ = true;
      } else {
        buf_.append(tmp, static_cast<size_t>(n));
      }
    }
  }

  // Reads lines until one starts with `prefix`; returns it. Lines before it go to `skipped`.
  Result<std::string> WaitFor(const std::string& prefix, Deadline deadline,
                              std::vector<std::string>* skipped = nullptr) {
    while (true) {
      TROUPE_ASSIGN_OR_RETURN(std::string line, ReadLine(deadline));
      lines_.push_back(line);
      if (line.rfind(prefix, 0) == 0) return line;
      if (skipped) skipped->push_back(line);
    }
  }

  // Every line read so far.
  const std::vector<std::string>& lines() const { return lines_; }

  Status Send(const std::string& line) {
    std::string l = line + "\n";
    if (::write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
      return IoError("write to child {}: {}", pid_, std::strerror(errno));
    return Status::Ok();
  }

  void CloseStdin() {
    if (in_ >= 0) ::close(in_);
    in_ = -1;
  }

  void Kill(int sig) {
    if (!reaped_) ::kill(pid_, sig);
  }

  // Closes stdin and waits for the child to exit (SIGKILL at the deadline). Returns the
  // exit status as waitpid reports it.
  int Finish(Deadline deadline) {
    CloseStdin();
    while (!eof_ && !deadline.expired()) {
      auto line = ReadLine(deadline);
      if (line.ok()) lines_.push_back(*line);
    }
    if (!eof_) Kill(SIGKILL);
    return Reap();
  }

 private:
  ChildProcess(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out) {}
  int Reap() {
    if (reaped_) return status_;
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status_;
  }

  pid_t pid_;
  int in_;
  int out_;
  std::string buf_;
  bool eof_ = false;
  bool reaped_ = false;
  int status_ = 0;
  std::vector<std::string> lines_;
};

}  // namespace troupe::testing
