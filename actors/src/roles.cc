// Role dispatch for troupe-actor: loads the job config, builds the shared
// context and runs the role.
#include "roles.h"

#include "role_common.h"
#include "troupe/actors/echo.h"
#include "troupe/launcher/address.h"
#include "troupe/launcher/job_config.h"

namespace troupe::actors {

Status RunLearner(ActorRuntime& runtime, transport::Network& network, JobContext& ctx);
Status RunRollout(ActorRuntime& runtime, transport::Network& network, JobContext& ctx);
Status RunReward(ActorRuntime& runtime, transport::Network& network, JobContext& ctx);

Status PrepareRole(const RoleArgs& args, RoleSetup* setup) {
  if (args.role != "echo" && args.role != "learner" && args.role != "rollout" &&
      args.role != "reward") {
    return InvalidArgument("unknown role '{}' (learner | rollout | reward | echo)", args.role);
  }
  if (args.config.empty()) {
    if (args.role == "echo") return Status::Ok();
    return InvalidArgument("the {} role needs --config (or --run-dir)", args.role);
  }
  TROUPE_ASSIGN_OR_RETURN(launcher::JobConfig job, launcher::LoadResolvedConfig(args.config));
  setup->runtime.heartbeat_interval_ms = job.head.heartbeat_interval_ms;
  setup->runtime.head_grace_ms = job.head.head_grace_ms;
  setup->runtime.register_timeout_ms = job.head.register_timeout_ms;
  if (!args.bind_host.empty())
    setup->bind_host = args.bind_host;
  else if (!job.cluster.advertise_address.empty())
    setup->bind_host = job.cluster.advertise_address;
  // Sockets bind numeric addresses: a host name (e.g. a HostSpec.address) is resolved here.
  auto numeric = launcher::ResolveIpv4Address(setup->bind_host);
  if (!numeric.ok()) return InvalidArgument("bind host: {}", numeric.status().message());
  setup->bind_host = *numeric;
  setup->config = std::make_shared<launcher::JobConfig>(std::move(job));
  return Status::Ok();
}

Status RunRole(const RoleArgs& args, const RoleSetup& setup, ActorRuntime& runtime,
               transport::Network& network) {
  if (args.role == "echo") {
    EchoOptions o;
    o.bind_host = setup.bind_host;
    if (setup.config) {
      auto job = std::static_pointer_cast<launcher::JobConfig>(setup.config);
      o.ignore_exit = job->echo_settings.stuck_actor == runtime.options().actor_id;
    }
    return RunEcho(runtime, network, o);
  }
  auto job = std::static_pointer_cast<launcher::JobConfig>(setup.config);
  TROUPE_ASSIGN_OR_RETURN(auto ctx, MakeJobContext(*job, args.run_dir, setup.bind_host));
  ctx->endpoint_token = args.endpoint_token;
  if (args.role == "learner") return RunLearner(runtime, network, *ctx);
  if (args.role == "rollout") return RunRollout(runtime, network, *ctx);
  return RunReward(runtime, network, *ctx);
}

}  // namespace troupe::actors
