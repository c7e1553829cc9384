// Role dispatch for troupe-actor (private to actors/).
#pragma once

#include <string>

#include "troupe/actors/runtime.h"
#include "troupe/core/status.h"
#include "troupe/transport/socket.h"

namespace troupe::actors {

struct RoleArgs {
  std::string role, id, head, run_dir, config;
  std::string bind_host;  // address to bind and advertise (empty: from the config, else 127.0.0.1)
  // The job's bearer token for generation endpoints, issued by the launcher and read from
  // stdin (--secrets-stdin), never from the command line. "" when the job has none.
  std::string endpoint_token;
};

// What the role needs before the runtime starts (parsed config, timings).
struct RoleSetup {
  RuntimeOptions runtime;  // heartbeat/grace timings from the job config
  std::string bind_host = "127.0.0.1";
  std::shared_ptr<void> config;  // the role's parsed config (opaque here)
};

// Loads and validates the config for `args.role`. Errors name key and file.
Status PrepareRole(const RoleArgs& args, RoleSetup* setup);
// Runs the role until it finishes or the runtime says to exit.
Status RunRole(const RoleArgs& args, const RoleSetup& setup, ActorRuntime& runtime,
               transport::Network& network);

}  // namespace troupe::actors
