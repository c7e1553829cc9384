// troupe-reward-server: Troupe's task verifiers as an external HTTP reward service.
//
//   troupe-reward-server [--host 127.0.0.1] [--port 0] [--threads 8]
//                        [--task KIND[:NAME[:SCORING]]]... [--default-task NAME]
//                        [--jsonl NAME=PATH]...
//
// POST /verify with the RewardClient's JSON sample
//   {"task", "prompt", "response", "reference", "metadata"}
// answers {"reward": x, "components": {...}} using the named task's verifier
// (or --default-task when "task" is empty or unknown to the server is an
// error). A request it cannot score gets HTTP 400/422 with {"error": "..."}.
// GET /health answers {"ok": true}. Prints "PORT <n>" once listening (port 0
// picks a free one), stops cleanly on SIGTERM/SIGINT.
//
// Verification is pure (response vs reference/metadata), so the server needs
// only the task kinds, not the prompts: e.g. --task reverse --task add::partial.
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "troupe/core/log.h"
#include "troupe/envs/tasks.h"
#include "troupe/envs/tool_call.h"

namespace {

using json = nlohmann::json;
using troupe::envs::TaskConfig;

int Usage(const char* why) {
  std::fprintf(
      stderr,
      "troupe-reward-server: %s\n"
      "usage: troupe-reward-server [--host H] [--port P] [--threads N]\n"
      "       [--task KIND[:NAME[:SCORING]]]... [--jsonl NAME=PATH]... [--default-task NAME]\n",
      why);
  return 2;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    size_t j = s.find(sep, i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", default_task;
  int port = 0;
  int threads = 8;
  std::vector<TaskConfig> tasks;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    if (a == "--host") {
      host = value();
    } else if (a == "--port") {
      port = std::atoi(value().c_str());
    } else if (a == "--threads") {
      threads = std::atoi(value().c_str());
    } else if (a == "--default-task") {
      default_task = value();
    } else if (a == "--task") {
      auto parts = Split(value(), ':');
      TaskConfig c;
      c.kind = parts[0];
      c.name = parts.size() > 1 && !parts[1].empty() ? parts[1] : parts[0];
      if (parts.size() > 2 && !parts[2].empty()) c.scoring = parts[2];
      if (c.kind == "wordle") c.eval_size = 0;
      tasks.push_back(c);
    } else if (a == "--jsonl") {
      std::string v = value();
      size_t eq = v.find('=');
      if (eq == std::string::npos) return Usage("--jsonl needs NAME=PATH");
      TaskConfig c;
      c.name = v.substr(0, eq);
      c.kind = "jsonl";
      c.path = v.substr(eq + 1);
      tasks.push_back(c);
    } else if (a == "--help" || a == "-h") {
      return Usage("serves Troupe task verifiers over HTTP");
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
  }
  if (port < 0 || port > 65535) return Usage("--port must be in [0, 65535]");
  if (threads < 1 || threads > 256) return Usage("--threads must be in [1, 256]");
  if (tasks.empty()) {
    TaskConfig c;  // the default job's task
    tasks.push_back(c);
  }
  troupe::log::Init("reward-server");
  auto registry = troupe::envs::TaskRegistry::Create(tasks);
  if (!registry.ok()) return Usage(registry.status().ToString().c_str());
  if (!default_task.empty() && !(*registry)->Find(default_task))
    return Usage(("--default-task " + default_task + " is not one of the tasks").c_str());
  std::shared_ptr<const troupe::envs::TaskRegistry> reg = *registry;

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  httplib::Server server;
  server.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  server.set_payload_max_length(16 << 20);
  // One request per connection: httplib serves a connection on one pool thread
  // for as long as it stays open, so kept-alive connections from a client with
  // more parallel requests than --threads would starve the rest.
  server.set_keep_alive_max_count(1);
  // Remember the listening socket (created by bind below) to raise its accept
  // backlog: the library listens with a backlog of 5, and a burst of parallel
  // connections beyond it waits for a 1 s SYN retransmit.
  std::atomic<int> listen_fd{-1};
  server.set_socket_options([&listen_fd](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    int expected = -1;
    listen_fd.compare_exchange_strong(expected, sock);
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"ok\": true}", "application/json");
  });
  server.Post("/verify", [reg, default_task](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&res](int status, const std::string& why) {
      res.status = status;
      res.set_content(troupe::envs::SafeDump(json{{"error", why}}), "application/json");
    };
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return fail(400, "request body is not a JSON object");
    auto str = [&body](const char* key) {
      auto it = body.find(key);
      return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    std::string name = str("task");
    if (name.empty()) name = default_task;
    const troupe::envs::Task* task = reg->Find(name);
    if (!task) return fail(422, "unknown task '" + name.substr(0, 64) + "'");
    std::string prompt = str("prompt"), response = str("response"), reference = str("reference");
    std::string metadata;
    if (auto m = body.find("metadata"); m != body.end() && m->is_object() && !m->empty())
      metadata = troupe::envs::SafeDump(*m);
    troupe::envs::VerifyResult r = task->Verify({prompt, response, reference, metadata});
    if (!r.ok()) return fail(422, r.failure);
    json comps = json::object();
    for (const auto& [k, v] : r.components) comps[k] = v;
    res.set_content(troupe::envs::SafeDump(json{{"reward", r.reward}, {"components", comps}}),
                    "application/json");
  });

  int bound =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    std::fprintf(stderr, "troupe-reward-server: cannot listen on %s:%d\n", host.c_str(), port);
    return 1;
  }
  if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
    std::fprintf(stderr, "troupe-reward-server: could not raise the listen backlog\n");
  std::printf("PORT %d\n", bound);
  std::fflush(stdout);
  troupe::log::Get("envs").info("reward server on {}:{} with {} task(s)", host, bound, reg->size());

  // The stopper waits for SIGTERM/SIGINT, then stops the server. stop() is a
  // no-op until listen_after_bind() is running, so it repeats until listen
  // has returned (a signal may arrive before listening starts).
  std::mutex mu;
  std::condition_variable cv;
  bool listen_returned = false;
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::unique_lock<std::mutex> lock(mu);
    while (!listen_returned) {
      server.stop();
      cv.wait_for(lock, std::chrono::milliseconds(10));
    }
  });
  bool ok = server.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(mu);
    listen_returned = true;
  }
  cv.notify_all();
  kill(getpid(),
       SIGTERM);  // wakes the stopper if no signal came (stays blocked, discarded at exit)
  stopper.join();
  troupe::log::Flush();
  return ok ? 0 : 1;
}
