#include "troupe/launcher/job_config.h"

#include <sstream>

namespace troupe::launcher {

void Describe(config::Binder& b, JobConfig& c) {
  b.Field("name", &c.name, "job name; run folders are RUNS_DIR/<name>-<time>");
  b.Field("seed", &c.seed, "master seed (prompts, sampling, init); each actor derives its own");
  b.Field("runs_dir", &c.runs_dir, "where run folders are created");
  b.Section("cluster", &c.cluster, "where actors run: local, ssh hosts or a Slurm allocation");
  b.Section("head", &c.head, "heartbeats, liveness and grace periods");
  b.Section("learner", &c.learner, "the learner process (exactly one)");
  b.Section("rollout", &c.rollout, "rollout actors (generate with the policy)");
  b.Section("reward", &c.reward, "reward actors (score rollouts)");
  b.Section("echo", &c.echo, "echo reference actors (tests and demos)");
  if (b.mode() == config::Binder::Mode::kRead) {
    if (c.name.empty() || c.name.find('/') != std::string::npos)
      b.Error("name", "must be non-empty and contain no '/'");
    if (c.learner.count > 1) b.Error("learner.count", "must be 0 or 1 (one learner per job)");
  }
}

static Result<JobConfig> Bind(YAML::Node root, const std::string& source) {
  JobConfig c;
  TROUPE_RETURN_IF_ERROR(config::Read(root, source, &c));
  c.raw = root;
  c.source = source;
  return c;
}

Result<JobConfig> LoadJobConfig(const std::string& path,
                                const std::vector<std::string>& overrides) {
  TROUPE_ASSIGN_OR_RETURN(YAML::Node root, config::LoadYamlFile(path));
  if (!root.IsMap()) return InvalidArgument("{}: the document must be a mapping of sections", path);
  for (const auto& o : overrides) TROUPE_RETURN_IF_ERROR(config::ApplyOverride(&root, o));
  return Bind(root, overrides.empty() ? path : path + " (with --set)");
}

Result<JobConfig> LoadResolvedConfig(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(YAML::Node root, config::LoadYamlFile(path));
  return Bind(root, path);
}

std::string ResolvedConfigYaml(const JobConfig& c) {
  YAML::Node out = YAML::Clone(c.raw);
  YAML::Node typed = config::Write(c);
  for (auto kv : typed) out[kv.first.as<std::string>()] = kv.second;
  YAML::Emitter e;
  e << out;
  return std::string(e.c_str()) + "\n";
}

std::vector<config::KeyDoc> JobConfigKeys() {
  return config::Document(JobConfig{});
}

}  // namespace troupe::launcher
