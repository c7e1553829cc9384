// The job config: one YAML file describes a whole job (configs/*.yaml).
//
// Every key is a field of a typed struct with a one-line doc (`troupe
// config-keys` lists them all, with defaults); LoadJobConfig reads the file,
// applies `--set` overrides, rejects unknown keys and wrong types, and
// validates every section (with the components' own Validate()) before
// anything is spawned. Errors name the file and the key. Torch-free: the
// launcher includes this, and so does troupe-actor.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/broadcast/config.h"
#include "troupe/core/config_binder.h"
#include "troupe/core/status.h"
#include "troupe/engine/engine_config.h"
#include "troupe/engine/model_config.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/agent.h"
#include "troupe/envs/config.h"
#include "troupe/launcher/job_spec.h"
#include "troupe/trainer/config.h"

namespace troupe::launcher {

// The shape of one optimizer update's data.
struct BatchSpec {
  uint32_t prompts_per_update = 16;  // groups (prompts) per optimizer update
  uint32_t samples_per_prompt = 8;   // G: samples per prompt (one group)
  // Groups per RolloutBatch message (must divide prompts_per_update); also the unit of credit
  // grants. Larger: fewer messages, acks and wake-ups per update (each costs tens of us of CPU
  // at both ends), and each grant fills an engine at once; smaller: finer-grained credits and
  // staleness (a message carries its oldest group's version).
  uint32_t groups_per_message = 4;
};

// Rollout actors' own settings (besides their process settings).
struct RolloutSettings {
  uint32_t max_groups_in_flight =
      16;                          // groups generating at once per actor (bounded by credits too)
  uint32_t outbox_messages = 256;  // unacknowledged batches an actor holds before it blocks
  // Granted groups an actor keeps in hand beyond a full engine, so a finished
  // group's slot refills at once rather than after a round trip to a learner
  // that answers between optimizer steps (the learner's lag window still
  // bounds every grant). Default 0: with a reserve a restarted learner's
  // window can stall (e2e KilledLearnerRestartsFromItsCheckpoint) and a slow
  // actor hoards grants (more of its groups go stale); see docs/architecture.md.
  uint32_t credit_reserve = 0;
  uint32_t credit_timeout_ms = 1000;  // re-ask the learner for credits after this silence
  uint32_t drain_timeout_ms = 10000;  // on drain: time to finish and deliver in-flight work
  // Fault injection (tests, demos): the actor with this id holds every
  // finished group for slow_ms_per_group before sending it, as a slow node would.
  std::string slow_actor;
  uint32_t slow_ms_per_group = 0;
};

// Reward actors' own settings.
struct RewardSettings {
  uint32_t outbox_messages = 256;     // scored batches held before the actor stops taking new ones
  uint32_t score_timeout_ms = 30000;  // upper bound for scoring one batch (external services)
};

// Echo actors' own settings (a test fixture).
struct EchoSettings {
  // Fault injection (tests): the echo actor with this id ignores every request
  // to exit, as a role stuck in a collective would; only the runtime's
  // backstop (after the head is lost) ends it.
  std::string stuck_actor;
};

// The tokenizer of the job: the built-in character tokenizer or a Hugging Face one.
struct TokenizerSpec {
  std::string kind = "char";  // char (the built-in tasks' characters) | hf (a tokenizer.json)
  std::string alphabet = "printable";  // kind char: printable (every built-in task's characters) |
                                       // lowercase | a literal string
  // kind hf: a model folder holding tokenizer.json (+ tokenizer_config.json, which names
  // eos/bos/pad), or a tokenizer.json file. Made absolute when the config is read.
  std::string path;
};

// Sampling of rollout actors.
struct SamplingSpec {
  double temperature = 1.0;     // softmax temperature (the learner uses the same one)
  int32_t top_k = 0;            // keep the k most likely tokens (0: off)
  double top_p = 1.0;           // nucleus sampling mass (1: off)
  int32_t max_new_tokens = 16;  // response tokens per sample at most
};

// Generation engine of rollout actors (and the learner's evaluator).
struct EngineSpec {
  int32_t num_slots = 128;        // KV-cache slots = sequences decoded together
  int32_t intra_op_threads = 1;   // torch threads per engine (1: best on 2 shared cores)
  std::string device = "cpu";     // cpu | cuda | cuda:N
  bool fused_cpu_kernels = true;  // fused RoPE + attention decode kernels on CPU
  bool lora_merged = true;        // LoRA: fold adapters into the weights at each update (faster)
};

// Supervised warm start before RL (skipped when resuming from a checkpoint).
struct WarmStartSpec {
  // Weights the policy starts from instead of its seeded init: a .safetensors
  // file, a directory holding model.safetensors (a checkpoint), a checkpoints
  // folder or a run folder (its latest checkpoint). Relative to the working
  // directory. The supervised steps (if any) run on top of them.
  std::string init_from;
  uint32_t steps = 0;        // supervised updates on task demonstrations (0: none)
  uint32_t batch_size = 64;  // demonstrations per update
};

// Held-out evaluation (greedy) run by the learner.
struct EvalSpec {
  uint32_t every_steps = 10;   // evaluate every N RL updates (0: only at the start and end)
  uint32_t prompts = 0;        // held-out prompts per evaluation (0: the task's whole eval split)
  int32_t max_new_tokens = 0;  // 0: sampling.max_new_tokens
};

// Learner checkpoints (in RUN/checkpoints).
struct CheckpointSpec {
  uint32_t every_steps = 50;       // checkpoint every N RL updates (0: only at stop)
  std::string ack = "checkpoint";  // when batches are acknowledged: checkpoint (exactly-once across
                                   // learner restarts) | trained
  // ack = checkpoint: a checkpoint is taken early once this many decided
  // batches wait for their acknowledgement (senders hold unacknowledged
  // messages in a bounded outbox; without this, updates skipped because every
  // group was uniform would fill it and stall the pipeline).
  uint32_t max_unacked_batches = 64;
  // Fault injection (tests): a checkpoint stage ("model", "optimizer", "state",
  // "extra", "renamed", ... see trainer/checkpoint.h) at which the learner
  // stalls — only when the file <run>/fault-stall-checkpoint exists, which it
  // consumes — so a test can kill it in the middle of a checkpoint write.
  // Empty: off.
  std::string fault_stall_stage;
};

// When the job ends (the first condition met).
struct StopSpec {
  uint64_t max_steps = 1000;   // RL optimizer updates
  double target_accuracy = 0;  // held-out accuracy that ends the job (0: never)
  double max_seconds = 0;      // wall seconds of RL (0: no limit)
};

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
  RolloutSettings rollout_settings;  // rollout.* role settings
  RewardSettings reward_settings;    // reward.* role settings
  EchoSettings echo_settings;        // echo.* role settings

  // The policy. vocab_size starts at 0 (the tokenizer's size) so a config that
  // does not name it is valid with any alphabet.
  engine::ModelConfig model = [] {
    engine::ModelConfig m;
    m.vocab_size = 0;
    return m;
  }();
  // model.from: a Hugging Face model folder (config.json, weights, tokenizer files) the job
  // starts from. Its config.json fixes the architecture (model.* keys may only repeat its
  // values; max_seq_len and dtype stay the job's), its weights are the initial policy
  // unless warm_start.init_from names others, and the tokenizer and chat template come
  // from it unless tokenizer.path names another folder. Made absolute when read.
  std::string model_from;
  TokenizerSpec tokenizer;
  envs::ChatConfig chat;                     // how prompts render (the model's chat template, ...)
  std::vector<envs::TaskConfig> tasks;       // `task:` (one) or `tasks:` (several)
  envs::EpisodeConfig episode;               // multi-turn limits
  envs::RewardClientConfig reward_services;  // external reward services
  envs::AgentsConfig agents;                 // agent_servers + agents.*: episodes from outside
  BatchSpec batch;
  SamplingSpec sampling;
  EngineSpec engine;
  trainer::LearnerConfig trainer;
  WarmStartSpec warm_start;
  EvalSpec eval;
  broadcast::BroadcastConfig broadcast;
  CheckpointSpec checkpoint;
  StopSpec stop;
  DashboardSpec dashboard;           // the head's dashboard and Prometheus endpoint
  TensorboardSpec tensorboard;       // RUN/tb/ event files
  RolloutSampleSpec rollout_samples;  // RUN/rollouts.jsonl

  YAML::Node raw;      // the resolved document (after --set)
  std::string source;  // the file it came from

  // The roles this job runs (count > 0 or scalable), e.g. for the head.
  bool has_learner() const { return learner.count > 0; }
};
void Describe(config::Binder& b, JobConfig& c);

// Reads `path`, applies `overrides` ("key.path=value"), binds and validates.
Result<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides);
// Re-reads a resolved config written to a run folder.
Result<JobConfig> LoadResolvedConfig(const std::string& path);
// The resolved config as YAML text (every key, defaults included).
std::string ResolvedConfigYaml(const JobConfig& c);
// Every documented key of the job config.
std::vector<config::KeyDoc> JobConfigKeys();
// The alphabet string a TokenizerSpec names ("printable" -> every printable ASCII char, ...).
std::string TokenizerAlphabet(const TokenizerSpec& spec);
// Builds the tokenizer a (validated) TokenizerSpec names: CharTokenizer or HfTokenizer.
Result<std::unique_ptr<engine::Tokenizer>> MakeTokenizer(const TokenizerSpec& spec);
// The folder of an hf tokenizer (tokenizer.path, or the folder of a tokenizer.json file),
// which holds tokenizer_config.json and its chat template; "" for kind char.
std::string TokenizerFolder(const TokenizerSpec& spec);
// Ids that end a reply: the tokenizer's EOS plus, with model.from, the folder's
// generation_config.json eos_token_id list (in that order, without repeats).
Result<std::vector<int32_t>> StopTokenIds(const JobConfig& job, const engine::Tokenizer& tokenizer);
// The files that turn a folder holding the policy's model.safetensors (model dtype, Hugging
// Face names) into a complete Hugging Face folder, as (name, contents): config.json (the
// job's model written over model.from's config.json, so its informational keys survive),
// generation_config.json (model.from's, else the tokenizer's BOS and EOS), and the files of
// an hf tokenizer (tokenizer.json, tokenizer_config.json, ...). Learner checkpoints carry
// them; `troupe export` copies them.
Result<std::vector<std::pair<std::string, std::string>>> HfCompanionFiles(
    const JobConfig& job, const engine::Tokenizer& tokenizer);

}  // namespace troupe::launcher
