// Role dispatch while only the echo role exists (replaced by roles.cc).
#include "roles.h"
#include "troupe/actors/echo.h"

namespace troupe::actors {

Status PrepareRole(const RoleArgs& args, RoleSetup* setup) {
  if (args.role != "echo") return InvalidArgument("unknown role '{}'", args.role);
  return Status::Ok();
}

Status RunRole(const RoleArgs& args, const RoleSetup& setup, ActorRuntime& runtime,
               transport::Network& network) {
  EchoOptions o;
  o.bind_host = setup.bind_host;
  return RunEcho(runtime, network, o);
}

}  // namespace troupe::actors
