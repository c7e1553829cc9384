// Runs a reference script under Node (or any program) as a real child
// process for parity tests: stdin from a string, stdout captured, stderr to a file, a bounded
// wait (the child is SIGKILLed and reaped when it overruns). Test-only.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace troupe::testing {

struct NodeResult {
  bool ok = false;      // exited 0 within the deadline
  std::string out;      // stdout
  std::string error;    // why not ok (exit status, timeout, stderr excerpt)
  std::string err;      // stderr
};

// The repository root (TROUPE_SOURCE_DIR, set by troupe_add_test).
inline std::string SourceDir() {
  const char* d = std::getenv("TROUPE_SOURCE_DIR");
  return d ? d : ".";
}

inline bool FileExists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// Why the npm reference packages are unusable, or "" when node and
// tests/reference/npm/node_modules are there.
inline std::string NodeReferenceMissing() {
  std::string modules = SourceDir() + "/tests/reference/npm/node_modules";
  if (system("command -v node >/dev/null 2>&1") != 0) return "node is not on PATH";
  if (!FileExists(modules + "/.troupe-lock-sha"))
    return modules + " is not installed (run scripts/install-npm-reference.sh)";
  return "";
}

// Runs argv (argv[0] found on PATH) with `input` on stdin, TZ=UTC and an en-US locale.
inline NodeResult RunProcess(const std::vector<std::string>& argv_in, const std::string& input,
                             int timeout_s = 120) {
  NodeResult r;
  char in_path[] = "/tmp/troupe-node-in-XXXXXX";
  char err_path[] = "/tmp/troupe-node-err-XXXXXX";
  int in_fd = mkstemp(in_path), err_fd = mkstemp(err_path);
  if (in_fd < 0 || err_fd < 0) {
    r.error = "mkstemp failed";
    return r;
  }
  if (write(in_fd, input.data(), input.size()) != static_cast<ssize_t>(input.size())) {
    r.error = "writing the input failed";
    return r;
  }
  lseek(in_fd, 0, SEEK_SET);
  int out_pipe[2];
  if (pipe(out_pipe) != 0) {
    r.error = "pipe failed";
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_fd, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  std::vector<std::string> argv_s = argv_in;
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("TZ=", 0) == 0 || kv.rfind("LANG=", 0) == 0 || kv.rfind("LC_ALL=", 0) == 0) continue;
    env_s.push_back(kv);
  }
  env_s.push_back("TZ=UTC");
  env_s.push_back("LANG=en_US.UTF-8");
  env_s.push_back("LC_ALL=en_US.UTF-8");
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv_s[0].c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  close(in_fd);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_fd);
    r.error = "cannot start " + argv_s[0];
    return r;
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    until - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out_pipe[0], POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n <= 0) continue;
    char buf[65536];
    ssize_t got = read(out_pipe[0], buf, sizeof(buf));
    if (got <= 0) break;
    r.out.append(buf, static_cast<size_t>(got));
  }
  close(out_pipe[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream err_in(err_path);
  std::stringstream err;
  err << err_in.rdbuf();
  close(err_fd);
  unlink(in_path);
  unlink(err_path);
  if (timed_out) {
    r.error = argv_s[0] + " did not finish within " + std::to_string(timeout_s) + " s";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    r.error = argv_s[0] + " failed: " + err.str().substr(0, 2000);
  } else {
    r.ok = true;
  }
  r.err = err.str();
  return r;
}

// Runs `node script args...` (see RunProcess).
inline NodeResult RunNode(const std::string& script, const std::vector<std::string>& args,
                          const std::string& input, int timeout_s = 120) {
  std::vector<std::string> argv = {"node", script};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, input, timeout_s);
}

}  // namespace troupe::testing
