// Subprocess: a child process in its own process group, owned by this object.
//
// Spawn() forks and execs `argv` with setpgid(0,0) so the child and everything
// it starts can be signalled as one group; stdout/stderr go to a file (or are
// inherited). The destructor sends SIGTERM to the group, waits up to the
// configured grace and then SIGKILLs it, and reaps the child: no orphan
// outlives its owner. Not thread-safe: one owner thread at a time.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::launcher {

struct SpawnOptions {
  std::vector<std::string> argv;           // argv[0] is the program (path or name on PATH)
  std::map<std::string, std::string> env;  // added to (overriding) the parent's environment
  std::string output_file;                 // stdout+stderr appended here; empty = inherit
  std::string working_dir;                 // chdir before exec; empty = inherit
  std::string stdin_data;  // written to the child's stdin, then closed (secrets); empty = /dev/null
  int term_grace_ms = 3000;  // SIGTERM -> SIGKILL delay used by the destructor and Stop()
};

// How a child ended.
struct ExitInfo {
  bool exited = false;           // exited normally (code valid)
  int code = 0;                  // exit code
  int signal = 0;                // terminating signal, 0 if none
  std::string ToString() const;  // "exit 0", "killed by SIGKILL", ...
};

class Subprocess {
 public:
  static Result<Subprocess> Spawn(const SpawnOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running();
  // Non-blocking: the exit info if the child has ended (reaps it).
  std::optional<ExitInfo> Poll();
  // Blocks until the child ends or the deadline passes (then Timeout).
  Result<ExitInfo> Wait(Deadline deadline);
  // Sends `sig` to the whole process group.
  Status Signal(int sig);
  // SIGTERM to the group, wait up to grace, SIGKILL, reap. Idempotent.
  ExitInfo Stop();
  // Forgets the child without killing it (e.g. a detached head). Rarely right.
  void Release();

 private:
  Subprocess() = default;
  void Reap(int status);

  pid_t pid_ = -1;
  int term_grace_ms_ = 3000;
  std::optional<ExitInfo> exit_;
};

// Finds `name` on PATH (or returns it if it contains a '/'); empty if absent.
std::string FindExecutable(const std::string& name);
// The directory of the running executable (/proc/self/exe).
std::string SelfDir();

}  // namespace troupe::launcher
