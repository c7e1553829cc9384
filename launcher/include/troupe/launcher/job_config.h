// The job config: one YAML file describes a whole job (configs/*.yaml).
//
// Every key is a field of a typed struct with a one-line doc (`troupe
// config-keys` lists them all); LoadJobConfig reads the file, applies `--set`
// overrides, rejects unknown keys and wrong types, and validates every
// section before anything is spawned. Errors name the file and the key.
// Torch-free: the launcher includes this, and so does troupe-actor.
#pragma once

#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/launcher/config_binder.h"
#include "troupe/launcher/job_spec.h"

namespace troupe::launcher {

struct JobConfig {
  std::string name = "job";  // job name: run folders are runs/<name>-<time>
  uint64_t seed = 0;         // master seed (prompts, sampling, init); each actor derives its own
  std::string runs_dir =
      "runs";              // where run folders are created (relative to the working directory)
  ClusterSpec cluster;     // where actors run
  HeadSpec head;           // liveness rules
  RoleProcess learner{1};  // the learner process (count must be 1)
  RoleProcess rollout{2};  // rollout actors
  RoleProcess reward{1};   // reward actors
  RoleProcess echo{0};     // echo reference actors (tests and demos)

  // Sections validated by the roles' own structs (see job_config.cc).
  YAML::Node raw;      // the resolved document (after --set)
  std::string source;  // the file it came from
};
void Describe(config::Binder& b, JobConfig& c);

// Reads `path`, applies `overrides` ("key.path=value"), binds and validates.
Result<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides);
// Re-reads a resolved config written by WriteResolvedConfig (run folder).
Result<JobConfig> LoadResolvedConfig(const std::string& path);
// The resolved config as YAML text (every key, defaults included).
std::string ResolvedConfigYaml(const JobConfig& c);
// Every documented key of the job config.
std::vector<config::KeyDoc> JobConfigKeys();

}  // namespace troupe::launcher
