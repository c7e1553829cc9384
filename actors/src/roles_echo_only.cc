// Role dispatch while only the echo role exists (replaced by roles.cc).
#include "roles.h"
#include "troupe/actors/echo.h"
#include "troupe/launcher/job_config.h"

namespace troupe::actors {

Status PrepareRole(const RoleArgs& args, RoleSetup* setup) {
  if (args.role != "echo") return InvalidArgument("unknown role '{}'", args.role);
  if (!args.config.empty()) {
    TROUPE_ASSIGN_OR_RETURN(launcher::JobConfig job, launcher::LoadResolvedConfig(args.config));
    setup->runtime.heartbeat_interval_ms = job.head.heartbeat_interval_ms;
    setup->runtime.head_grace_ms = job.head.head_grace_ms;
    setup->runtime.register_timeout_ms = job.head.register_timeout_ms;
    if (!job.cluster.advertise_address.empty()) setup->bind_host = job.cluster.advertise_address;
  }
  return Status::Ok();
}

Status RunRole(const RoleArgs& args, const RoleSetup& setup, ActorRuntime& runtime,
               transport::Network& network) {
  EchoOptions o;
  o.bind_host = setup.bind_host;
  return RunEcho(runtime, network, o);
}

}  // namespace troupe::actors
