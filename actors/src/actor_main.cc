// troupe-actor: the one generic actor host binary. `--role` picks the role.
//
//   troupe-actor --role rollout --id rollout-1 --head tcp://10.0.0.1:41000
//                --run-dir runs/job-20261130-101500 [--config FILE] [--secrets-stdin]
//
// It registers with the head, runs the role, heartbeats, exits cleanly on
// SIGTERM (and by itself when the head is silent past its grace period).
// Exit codes: 0 done/stopped, 1 role error, 2 bad arguments or config,
// 3 head lost.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "roles.h"
#include "troupe/actors/echo.h"
#include "troupe/actors/runtime.h"
#include "troupe/core/exit_codes.h"
#include "troupe/core/log.h"
#include "troupe/engine/memory.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/transport/allocator.h"
#include "troupe/transport/zmq_network.h"

using namespace troupe;

namespace {

std::atomic<actors::ActorRuntime*> g_runtime{nullptr};
std::atomic<bool> g_signalled{false};

// A thread that owns SIGTERM/SIGINT (blocked everywhere else) and turns them
// into a clean exit request.
void SignalThread(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) == 0) {
    if (sig == SIGUSR2) return;  // our own wake-up at exit
    g_signalled = true;
    if (auto* rt = g_runtime.load()) rt->RequestExit(actors::ExitReason::kSignal);
  }
}

// What the launcher hands an actor on stdin.
struct ActorSecrets {
  transport::CurveOptions curve;
  std::string endpoint_token;  // the job's bearer token for generation endpoints ("" = none)
};

// Reads the JSON the launcher writes on stdin: CURVE keys, the job's endpoint
// token and, for actors on remote hosts, the job's resolved config. A host that
// does not share the run folder gets the config written to `config_path` (only
// if it is missing there).
Result<ActorSecrets> ReadSecrets(const std::string& config_path) {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  ActorSecrets out;
  if (text.empty()) return out;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("secrets on stdin are not a JSON object");
  if (j.contains("config_yaml") && j["config_yaml"].is_string() && !config_path.empty() &&
      ::access(config_path.c_str(), F_OK) != 0) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(config_path).parent_path(), ec);
    TROUPE_RETURN_IF_ERROR(
        launcher::WriteFileAtomic(config_path, j["config_yaml"].get<std::string>(), 0600)
            .WithContext("writing the job config received on stdin"));
  }
  if (j.contains("endpoint_token")) {
    const auto& t = j["endpoint_token"];
    if (!t.is_string() || t.get<std::string>().empty() || t.get<std::string>().size() > 256)
      return InvalidArgument(
          "secrets on stdin: 'endpoint_token' must be a non-empty string of "
          "at most 256 characters");
    out.endpoint_token = t.get<std::string>();
  }
  if (!j.value("curve", false)) return out;
  transport::CurveOptions& c = out.curve;
  c.enabled = true;
  c.server.public_key = j.value("server_public", "");
  c.server.secret_key = j.value("server_secret", "");
  c.client.public_key = j.value("client_public", "");
  c.client.secret_key = j.value("client_secret", "");
  if (j.contains("allowed_clients"))
    c.allowed_client_public_keys = j["allowed_clients"].get<std::vector<std::string>>();
  TROUPE_RETURN_IF_ERROR(c.Validate());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed memory in the process: tensors and large messages then reuse
  // warm pages instead of faulting in fresh ones (several times faster here).
  engine::ConfigureAllocatorForTensors();
  transport::ApplyAllocatorPolicy();
  // Block the stop signals before any thread exists; one thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread sig_thread(SignalThread, set);
  auto stop_sig_thread = [&] {
    // Aimed at the waiting thread: other threads (some started by libraries
    // before main) may not block SIGUSR2.
    pthread_kill(sig_thread.native_handle(), SIGUSR2);
    sig_thread.join();
  };

  actors::RoleArgs args;
  std::string log_level = "info";
  uint32_t restarts = 0;
  bool secrets_stdin = false;
  CLI::App app{"troupe-actor: runs one Troupe actor (started by `troupe run`)"};
  app.add_option("--role", args.role, "learner | rollout | reward | echo")->required();
  app.add_option("--id", args.id, "actor id, unique in the job")->required();
  app.add_option("--head", args.head, "the head's control endpoint")->required();
  app.add_option("--run-dir", args.run_dir, "the job's run folder");
  app.add_option("--config", args.config, "job config (default: RUN_DIR/config.yaml)");
  app.add_option("--restarts", restarts, "restarts of this actor id so far");
  app.add_option("--bind-host", args.bind_host, "address this actor binds and advertises");
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error");
  app.add_flag("--secrets-stdin", secrets_stdin,
               "read the job's secrets (JSON: CURVE keys, endpoint token) from stdin");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    stop_sig_thread();
    return rc == 0 ? 0 : 2;
  }
  if (args.config.empty() && !args.run_dir.empty()) args.config = args.run_dir + "/config.yaml";

  log::Options lo;
  if (!log::ParseLevel(log_level, &lo.level)) {
    std::cerr << "troupe-actor: unknown --log-level '" << log_level << "'\n";
    stop_sig_thread();
    return 2;
  }
  lo.color = false;
  log::Init(args.id, lo);
  // Every line reaches the head (logs/<id>.log); stderr (logs/<id>.out) keeps
  // warnings, errors and whatever a crash prints, so nothing is written twice.
  log::SetStderrLevel(spdlog::level::warn);
  auto& logger = log::Get("actors");

  transport::ZmqNetworkOptions no;
  no.identity.actor_id = args.id;
  if (secrets_stdin) {
    auto secrets = ReadSecrets(args.config);
    if (!secrets.ok()) {
      logger.error("{}", secrets.status().ToString());
      stop_sig_thread();
      return 2;
    }
    no.curve = secrets->curve;
    args.endpoint_token = secrets->endpoint_token;
  }
  int rc = 0;
  {
    auto net = transport::NewZmqNetwork(no);
    if (!net.ok()) {
      logger.error("cannot create the network: {}", net.status().ToString());
      stop_sig_thread();
      return 1;
    }
    actors::RoleSetup setup;
    Status prep = actors::PrepareRole(args, &setup);
    if (!prep.ok()) {
      logger.error("{}", prep.ToString());
      stop_sig_thread();
      return 2;
    }
    actors::RuntimeOptions ro = setup.runtime;
    ro.actor_id = args.id;
    ro.role = args.role;
    ro.head_endpoint = args.head;
    ro.restarts = restarts;
    auto rt = actors::ActorRuntime::Create(ro, net->get());
    if (!rt.ok()) {
      logger.error("{}", rt.status().ToString());
      stop_sig_thread();
      return 1;
    }
    g_runtime = rt->get();
    if (g_signalled) (*rt)->RequestExit(actors::ExitReason::kSignal);
    Status s = actors::RunRole(args, setup, **rt, **net);
    if ((*rt)->exit_reason() == actors::ExitReason::kHeadLost) {
      rc = kExitHeadLost;  // whatever the role made of it (e.g. registration cut short)
      if (!s.ok()) logger.warn("{} ended after losing the head: {}", args.role, s.ToString());
    } else if (!s.ok() && s.code() == Code::kIo) {
      // The run folder cannot be written (full, read-only): a restart would
      // fail the same way, after redoing work. Say so and let the head stop.
      logger.error("{} failed with a fatal error: {}", args.role, s.ToString());
      rc = kExitFatal;
    } else if (!s.ok()) {
      logger.error("{} failed: {}", args.role, s.ToString());
      rc = kExitError;
    }
    (*rt)->Flush(Deadline::InMs(2000));
    g_runtime = nullptr;
  }
  log::Flush();
  stop_sig_thread();
  return rc;
}
