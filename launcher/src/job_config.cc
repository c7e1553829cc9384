#include "troupe/launcher/job_config.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "troupe/engine/hf_folder.h"
#include "troupe/engine/hf_tokenizer.h"
#include "troupe/envs/renderer.h"
#include "troupe/launcher/run_dir.h"

namespace troupe {
namespace {

using config::Binder;

// Runs a component's Validate() and files its message under `key`.
void Check(Binder& b, const char* key, const Status& s) {
  if (b.mode() == Binder::Mode::kRead && !s.ok()) b.Error(key, s.message());
}

}  // namespace

namespace launcher {

void Describe(Binder& b, BatchSpec& c) {
  b.Field("prompts_per_update", &c.prompts_per_update, "groups (prompts) per optimizer update");
  b.Field("samples_per_prompt", &c.samples_per_prompt, "samples per prompt (G, the group size)");
  b.Field("groups_per_message", &c.groups_per_message,
          "groups per rollout message and per credit grant (divides prompts_per_update); "
          "larger: fewer messages and wake-ups per update, coarser credits and staleness");
}
void Describe(Binder& b, TokenizerSpec& c) {
  b.Field("kind", &c.kind,
          "char (built-in character tokenizer) | hf (a Hugging Face tokenizer.json)");
  b.Field("alphabet", &c.alphabet,
          "kind char: printable (all built-in tasks) | lowercase (a-z and '=') | a literal string");
  b.Field("path", &c.path,
          "kind hf: model folder with tokenizer.json (+ tokenizer_config.json) or a tokenizer.json "
          "file; relative to the config file's folder (to the current directory with --set)");
}
void Describe(Binder& b, SamplingSpec& c) {
  b.Field("temperature", &c.temperature, "softmax temperature (the learner uses the same)");
  b.Field("top_k", &c.top_k, "keep the k most likely tokens (0: off)");
  b.Field("top_p", &c.top_p, "nucleus mass (1: off)");
  b.Field("max_new_tokens", &c.max_new_tokens, "response tokens per sample at most");
}
void Describe(Binder& b, EngineSpec& c) {
  b.Field("num_slots", &c.num_slots, "KV-cache slots (sequences decoded together)");
  b.Field("intra_op_threads", &c.intra_op_threads, "torch threads per engine");
  b.Field("device", &c.device, "cpu | cuda | cuda:N");
  b.Field("fused_cpu_kernels", &c.fused_cpu_kernels, "fused CPU decode kernels");
  b.Field("lora_merged", &c.lora_merged,
          "LoRA: merge adapters into the weights at each update (default; false: apply them "
          "unmerged at every step)");
}
void Describe(Binder& b, WarmStartSpec& c) {
  b.Field("init_from", &c.init_from,
          "start from these weights: .safetensors file, checkpoint dir, checkpoints or run folder "
          "(its latest checkpoint); empty: seeded init");
  b.Field("steps", &c.steps, "supervised updates on demonstrations before RL (0: none)");
  b.Field("batch_size", &c.batch_size, "demonstrations per update");
}
void Describe(Binder& b, EvalSpec& c) {
  b.Field("every_steps", &c.every_steps,
          "greedy held-out evaluation every N RL updates (0: start and end only)");
  b.Field("prompts", &c.prompts, "held-out prompts per evaluation (0: the whole eval split)");
  b.Field("max_new_tokens", &c.max_new_tokens, "0: sampling.max_new_tokens");
}
void Describe(Binder& b, CheckpointSpec& c) {
  b.Field("every_steps", &c.every_steps, "checkpoint every N RL updates (0: only at stop)");
  b.Field("ack", &c.ack,
          "acknowledge batches at: checkpoint (exactly-once across learner restarts) | trained");
  b.Field("max_unacked_batches", &c.max_unacked_batches,
          "ack = checkpoint: checkpoint early once this many decided batches await their ack "
          "(bounds the senders' outboxes)");
  b.Field("fault_stall_stage", &c.fault_stall_stage,
          "fault injection: checkpoint stage (model, optimizer, state, extra, renamed, ...) where "
          "the learner stalls when <run>/fault-stall-checkpoint exists (empty: off)");
}
void Describe(Binder& b, StopSpec& c) {
  b.Field("max_steps", &c.max_steps,
          "RL updates (skipped ones, where every group had uniform rewards, included)");
  b.Field("target_accuracy", &c.target_accuracy, "held-out accuracy that ends the job (0: never)");
  b.Field("max_seconds", &c.max_seconds, "wall seconds of RL (0: no limit)");
}
void Describe(Binder& b, RolloutSettings& c) {
  b.Field("max_groups_in_flight", &c.max_groups_in_flight, "groups generating at once per actor");
  b.Field("outbox_messages", &c.outbox_messages,
          "unacknowledged batches held before generation blocks");
  b.Field("credit_reserve", &c.credit_reserve,
          "granted groups held beyond max_groups_in_flight, to refill finished slots at once");
  b.Field("credit_timeout_ms", &c.credit_timeout_ms,
          "re-ask the learner for credits after this silence");
  b.Field("drain_timeout_ms", &c.drain_timeout_ms,
          "on drain: time to finish and deliver in-flight work");
  b.Field("slow_actor", &c.slow_actor,
          "fault injection: this rollout actor holds each finished group slow_ms_per_group");
  b.Field("slow_ms_per_group", &c.slow_ms_per_group,
          "fault injection: delay per group of slow_actor (ms)");
}
void Describe(Binder& b, RewardSettings& c) {
  b.Field("outbox_messages", &c.outbox_messages,
          "scored batches held before the actor stops taking new ones");
  b.Field("score_timeout_ms", &c.score_timeout_ms, "upper bound for scoring one batch");
}
void Describe(Binder& b, EchoSettings& c) {
  b.Field("stuck_actor", &c.stuck_actor,
          "fault injection: this echo actor ignores requests to exit (tests the runtime's "
          "backstop)");
}

// A role section: process settings and role settings side by side.
template <typename Settings>
struct RoleSection {
  RoleProcess* process;
  Settings* settings;
};
struct NoSettings {};
void Describe(Binder&, NoSettings&) {}
template <typename Settings>
void Describe(Binder& b, RoleSection<Settings>& c) {
  Describe(b, *c.process);
  Describe(b, *c.settings);
}

std::string TokenizerAlphabet(const TokenizerSpec& spec) {
  if (spec.alphabet == "printable") return envs::PrintableAlphabet();
  if (spec.alphabet == "lowercase") return "=abcdefghijklmnopqrstuvwxyz";
  return spec.alphabet;
}

Result<std::unique_ptr<engine::Tokenizer>> MakeTokenizer(const TokenizerSpec& spec) {
  if (spec.kind == "hf") {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok,
                            engine::HfTokenizer::Load(spec.path));
    return tok;
  }
  if (spec.kind != "char")
    return InvalidArgument("tokenizer.kind must be char or hf, got '{}'", spec.kind);
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tok,
                          engine::CharTokenizer::Create(TokenizerAlphabet(spec)));
  return tok;
}

std::string TokenizerFolder(const TokenizerSpec& spec) {
  if (spec.kind != "hf" || spec.path.empty()) return "";
  std::error_code ec;
  if (std::filesystem::is_directory(spec.path, ec)) return spec.path;
  return std::filesystem::path(spec.path).parent_path().string();
}

Result<std::vector<int32_t>> StopTokenIds(const JobConfig& job,
                                          const engine::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  if (!job.model_from.empty()) {
    TROUPE_ASSIGN_OR_RETURN(engine::HfModelFolder folder,
                            engine::ReadHfModelFolder(job.model_from));
    for (int32_t id : folder.eos_token_ids)
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  if (ids.empty()) return InvalidArgument("the job's tokenizer names no end-of-sequence token");
  return ids;
}

Result<std::vector<std::pair<std::string, std::string>>> HfCompanionFiles(
    const JobConfig& job, const engine::Tokenizer& tokenizer) {
  std::string base_config, base_generation;
  if (!job.model_from.empty()) {
    TROUPE_ASSIGN_OR_RETURN(engine::HfModelFolder folder,
                            engine::ReadHfModelFolder(job.model_from));
    base_config = folder.config_json;
    base_generation = folder.generation_config_json;
  }
  TROUPE_ASSIGN_OR_RETURN(std::vector<int32_t> eos, StopTokenIds(job, tokenizer));
  const int32_t bos = tokenizer.bos_id();
  std::vector<std::pair<std::string, std::string>> files;
  TROUPE_ASSIGN_OR_RETURN(std::string config, engine::ModelConfigToHfJson(
                                                  job.model, base_config, job.model.dtype, bos,
                                                  {tokenizer.eos_id() >= 0 ? tokenizer.eos_id() : eos[0]}));
  files.emplace_back("config.json", std::move(config));
  TROUPE_ASSIGN_OR_RETURN(std::string generation,
                          engine::GenerationConfigJson(base_generation, bos, eos));
  files.emplace_back("generation_config.json", std::move(generation));
  const std::string folder = TokenizerFolder(job.tokenizer);
  if (!folder.empty()) {
    for (const std::string& path : engine::HfTokenizerFiles(folder)) {
      TROUPE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
      files.emplace_back(std::filesystem::path(path).filename().string(), std::move(text));
    }
  }
  return files;
}

namespace {

// Keys of the model section a config gave explicitly (model.from checks them).
struct ModelSection {
  engine::ModelConfig* model;
  std::string* from;
  std::set<std::string> given;
};
constexpr const char* kModelKeys[] = {
    "architecture", "vocab_size", "d_model",      "n_layers",     "n_heads",
    "n_kv_heads",   "head_dim",   "ffn_dim",      "max_seq_len",  "max_position_embeddings",
    "rope_theta",   "rope_scaling", "rms_norm_eps", "tie_word_embeddings", "attention_bias",
    "dtype"};
void Describe(Binder& b, ModelSection& c) {
  b.Field("from", c.from,
          "Hugging Face model folder to start from: architecture (config.json), initial weights, "
          "tokenizer and chat template; the other model.* keys may only repeat its values "
          "(max_seq_len and dtype stay the job's); relative to the config file's folder (to the "
          "current directory with --set)");
  if (b.mode() == Binder::Mode::kRead)
    for (const char* key : kModelKeys)
      if (b.Has(key)) c.given.insert(key);
  engine::Describe(b, *c.model);
}

// The broadcast section, and whether it named a backend. Without one, a job whose actors all
// run on this machine on CPU broadcasts through shared memory (one copy for every rollout
// actor, no gloo threads polling in each of them); a job across nodes with CURVE on through
// zmq (the backend CURVE encrypts); any other through gloo.
struct BroadcastSection {
  broadcast::BroadcastConfig* config;
  bool backend_given = false;
};
void Describe(Binder& b, BroadcastSection& c) {
  if (b.mode() == Binder::Mode::kRead) c.backend_given = b.Has("backend");
  broadcast::Describe(b, *c.config);
}

// model.from: the folder's config.json becomes the model; keys the config repeats must agree.
void ApplyModelFrom(Binder& b, const ModelSection& section, JobConfig& c) {
  std::error_code ec;
  auto absolute = std::filesystem::absolute(c.model_from, ec);
  if (!ec) c.model_from = absolute.lexically_normal().string();
  while (c.model_from.size() > 1 && c.model_from.back() == '/') c.model_from.pop_back();
  auto folder = engine::ReadHfModelFolder(c.model_from);
  if (!folder.ok()) {
    b.Error("model.from", folder.status().message());
    return;
  }
  if (folder->weight_files.empty())
    b.Error("model.from", c.model_from +
                              " has no weights (model.safetensors or model.safetensors.index.json); "
                              "to train a fresh model of this architecture give its sizes under "
                              "model.* instead");
  engine::ModelConfig m = folder->config;
  m.max_position_embeddings = folder->config.DeclaredPositions();
  m.max_seq_len = c.model.max_seq_len;  // the job's serving length (KV cache), default 128
  m.dtype = c.model.dtype;              // the job's compute dtype; weights are cast on load
  if (m.max_seq_len > m.max_position_embeddings)
    b.Error("model.max_seq_len", std::to_string(m.max_seq_len) + " exceeds the " +
                                     std::to_string(m.max_position_embeddings) +
                                     " positions of " + c.model_from + "/config.json");
  // Every other key given must repeat the folder's value (the resolved config does).
  engine::ModelConfig given = c.model;
  given.max_seq_len = m.max_seq_len;
  given.dtype = m.dtype;
  auto differs = [&](const char* key, bool same, const std::string& mine, const std::string& theirs) {
    if (section.given.count(key) && !same)
      b.Error(std::string("model.") + key,
              mine + " differs from " + c.model_from + "/config.json (" + theirs +
                  "); with model.from leave it out");
  };
  auto num = [](auto v) { return fmt::format("{}", v); };
  differs("architecture", given.architecture == m.architecture, given.architecture, m.architecture);
  differs("vocab_size", given.vocab_size == m.vocab_size, num(given.vocab_size), num(m.vocab_size));
  differs("d_model", given.d_model == m.d_model, num(given.d_model), num(m.d_model));
  differs("n_layers", given.n_layers == m.n_layers, num(given.n_layers), num(m.n_layers));
  differs("n_heads", given.n_heads == m.n_heads, num(given.n_heads), num(m.n_heads));
  differs("n_kv_heads", given.n_kv_heads == m.n_kv_heads, num(given.n_kv_heads), num(m.n_kv_heads));
  differs("head_dim", given.HeadDim() == m.HeadDim(), num(given.HeadDim()), num(m.HeadDim()));
  differs("ffn_dim", given.ffn_dim == m.ffn_dim, num(given.ffn_dim), num(m.ffn_dim));
  differs("max_position_embeddings", given.DeclaredPositions() == m.DeclaredPositions(),
          num(given.DeclaredPositions()), num(m.DeclaredPositions()));
  differs("rope_theta", given.rope_theta == m.rope_theta, num(given.rope_theta), num(m.rope_theta));
  const auto& gs = given.rope_scaling;
  const auto& ms = m.rope_scaling;
  differs("rope_scaling",
          gs.type == ms.type && (!ms.enabled() || (gs.factor == ms.factor &&
                                                   gs.low_freq_factor == ms.low_freq_factor &&
                                                   gs.high_freq_factor == ms.high_freq_factor &&
                                                   gs.original_max_position_embeddings ==
                                                       ms.original_max_position_embeddings)),
          gs.type, ms.type);
  differs("rms_norm_eps", given.rms_norm_eps == m.rms_norm_eps, num(given.rms_norm_eps),
          num(m.rms_norm_eps));
  differs("tie_word_embeddings", given.tie_word_embeddings == m.tie_word_embeddings,
          num(given.tie_word_embeddings), num(m.tie_word_embeddings));
  differs("attention_bias", given.attention_bias == m.attention_bias, num(given.attention_bias),
          num(m.attention_bias));
  m.lora = c.model.lora;  // the job's, not the folder's
  c.model = m;
  // The folder's tokenizer unless another one is named.
  if (c.tokenizer.path.empty()) {
    c.tokenizer.kind = "hf";
    c.tokenizer.path = c.model_from;
  }
}

// Checks the tokenizer section and returns the tokenizer (null when invalid). An hf
// tokenizer is loaded here, so a bad file stops `troupe run` before anything spawns.
std::unique_ptr<engine::Tokenizer> CheckTokenizer(Binder& b, TokenizerSpec& t) {
  if (t.kind == "char") {
    if (!t.path.empty()) b.Error("tokenizer.path", "is only for kind hf (kind is char)");
    std::string alphabet = TokenizerAlphabet(t);
    if (alphabet.empty()) {
      b.Error("tokenizer.alphabet", "is empty");
      return nullptr;
    }
    auto tok = MakeTokenizer(t);
    if (!tok.ok()) {
      b.Error("tokenizer.alphabet", tok.status().message());
      return nullptr;
    }
    return std::move(*tok);
  }
  if (t.kind != "hf") {
    b.Error("tokenizer.kind", "must be char or hf, got '" + t.kind + "'");
    return nullptr;
  }
  if (t.path.empty()) {
    b.Error("tokenizer.path", "kind hf needs a model folder or a tokenizer.json");
    return nullptr;
  }
  std::error_code ec;
  auto absolute = std::filesystem::absolute(t.path, ec);
  if (!ec) t.path = absolute.lexically_normal().string();
  auto tok = engine::HfTokenizer::Load(t.path);
  if (!tok.ok()) {
    b.Error("tokenizer.path", tok.status().message());
    return nullptr;
  }
  if ((*tok)->eos_id() < 0)
    b.Error("tokenizer.path",
            (*tok)->origin() + " names no eos_token (tokenizer_config.json): generation needs one");
  return std::move(*tok);
}

}  // namespace

void Describe(Binder& b, JobConfig& c) {
  b.Field("name", &c.name, "job name; run folders are RUNS_DIR/<name>-<time>");
  b.Field("seed", &c.seed, "master seed (prompts, sampling, init); each actor derives its own");
  b.Field("runs_dir", &c.runs_dir, "where run folders are created");
  b.Section("cluster", &c.cluster, "where actors run: local, ssh hosts or a Slurm allocation");
  b.Section("head", &c.head, "heartbeats, liveness and grace periods");
  NoSettings none;
  RoleSection<NoSettings> learner{&c.learner, &none};
  RoleSection<RolloutSettings> rollout{&c.rollout, &c.rollout_settings};
  RoleSection<RewardSettings> reward{&c.reward, &c.reward_settings};
  RoleSection<EchoSettings> echo{&c.echo, &c.echo_settings};
  b.Section("learner", &learner, "the learner process (exactly one)");
  b.Section("rollout", &rollout, "rollout actors: generate groups with the policy");
  b.Section("reward", &reward, "reward actors: score rollouts");
  b.Section("echo", &echo, "echo reference actors (tests and demos)");
  ModelSection model{&c.model, &c.model_from, {}};
  b.Section("model", &model, "the policy model (Llama 3 / Qwen2 / Qwen3 decoder)");
  b.Section("lora", &c.model.lora,
            "LoRA adapters: the base is frozen, only adapters train and travel (Hugging Face "
            "PEFT names and files)");
  b.Section("tokenizer", &c.tokenizer, "the job's tokenizer (character or Hugging Face)");
  b.Section("chat", &c.chat, "how prompts and replies are rendered (chat template or fixed format)");
  // `task:` (one task) or `tasks:` (a list).
  if (b.mode() == Binder::Mode::kRead) {
    if (b.Has("task") && b.Has("tasks")) b.Error("task", "give either `task` or `tasks`, not both");
    if (b.Has("task")) {
      envs::TaskConfig one;
      b.Section("task", &one, "the task (one)");
      c.tasks = {one};
    } else {
      b.Known("task");
    }
    b.List("tasks", &c.tasks, "the tasks (several)");
    if (c.tasks.empty()) c.tasks.push_back(envs::TaskConfig{});
  } else if (b.mode() == Binder::Mode::kDoc) {
    envs::TaskConfig one;
    b.Section("task", &one, "the task (or `tasks:` with a list of them)");
  } else {
    b.List("tasks", &c.tasks, "the tasks");
  }
  b.Section("episode", &c.episode, "multi-turn episode limits");
  b.Section("reward_services", &c.reward_services, "external HTTP reward services");
  b.Field("agent_servers", &c.agents.servers,
          "agent servers {name: url}: every group's episodes are played by POST {url}/run "
          "through the rollout actors' generation endpoint (docs/envs.md)");
  b.Section("agents", &c.agents, "limits of the agent-server path and its endpoint");
  b.Section("batch", &c.batch, "shape of one optimizer update's data");
  b.Section("sampling", &c.sampling, "how rollout actors sample");
  b.Section("engine", &c.engine, "generation engine of rollout actors and the evaluator");
  b.Section("trainer", &c.trainer, "the learner's algorithm (GRPO/PPO family)");
  b.Section("warm_start", &c.warm_start, "supervised warm start before RL");
  b.Section("eval", &c.eval, "periodic greedy evaluation on held-out prompts");
  BroadcastSection broadcast{&c.broadcast};
  b.Section("broadcast", &broadcast,
            "weight broadcast from the learner to rollout actors (backend, unless set: shm when "
            "every actor runs on this machine (cluster.backend local) on CPU, zmq across nodes "
            "with CURVE, else gloo)");
  b.Section("checkpoint", &c.checkpoint, "learner checkpoints");
  b.Section("stop", &c.stop, "when the job ends");
  b.Section("dashboard", &c.dashboard, "the head's web dashboard and Prometheus /metrics");
  b.Section("tensorboard", &c.tensorboard, "TensorBoard event files in RUN/tb/");
  b.Section("rollout_samples", &c.rollout_samples,
            "a sample of every update's sequences in RUN/rollouts.jsonl");
  if (b.mode() != Binder::Mode::kRead) return;

  // ---- cross-section validation (each component's own rules first)
  // The name becomes a folder name (<name>-<time>, plus a suffix): keep it
  // short and free of characters shells and file systems treat specially.
  if (c.name.empty() || c.name.size() > 100 || c.name[0] == '.' || c.name[0] == '-' ||
      c.name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
          std::string::npos)
    b.Error("name",
            "must be 1-100 characters of letters, digits, '.', '_' and '-', not starting with '.' "
            "or '-'");
  if (c.learner.count > 1) b.Error("learner.count", "must be 0 or 1 (one learner per job)");
  if (c.learner.count == 0 && c.echo.count == 0)
    b.Error("learner.count", "must be 1: a job needs its learner (0 only for echo test jobs)");
  if (c.learner.count == 1 && c.rollout.count == 0)
    b.Error("rollout.count", "a job with a learner needs at least one rollout actor");
  if (c.learner.count == 1 && c.reward.count == 0)
    b.Error("reward.count", "a job with a learner needs at least one reward actor");
  if (!c.model_from.empty()) ApplyModelFrom(b, model, c);
  if (!broadcast.backend_given) {
    if (c.cluster.backend == "local" && c.engine.device == "cpu")
      c.broadcast.backend = broadcast::Backend::kShm;
    else if (c.cluster.backend != "local" && CurveEnabled(c.cluster))
      c.broadcast.backend = broadcast::Backend::kZmq;  // the one CURVE covers across nodes
  }
  std::unique_ptr<engine::Tokenizer> tokenizer = CheckTokenizer(b, c.tokenizer);
  const int64_t vocab = tokenizer ? tokenizer->vocab_size() : 0;
  if (c.model.vocab_size == 0) c.model.vocab_size = vocab;
  Check(b, "chat", c.chat.Validate());
  if (tokenizer && c.chat.Validate().ok()) {
    auto renderer = envs::MakeRenderer(*tokenizer, TokenizerFolder(c.tokenizer), c.chat);
    if (!renderer.ok()) b.Error("chat", renderer.status().message());
  }
  if (c.model.vocab_size < vocab) {
    b.Error("model.vocab_size", "is " + std::to_string(c.model.vocab_size) +
                                    " but the tokenizer has " + std::to_string(vocab) + " ids");
  }
  Check(b, "model", c.model.Validate());
  Check(b, "tasks", envs::ValidateTasks(c.tasks));
  Check(b, "reward_services", envs::ValidateRewardRouting(c.tasks, c.reward_services));
  Check(b, "episode", c.episode.Validate());
  Check(b, "agents", c.agents.Validate());
  const auto& bs = c.batch;
  if (bs.prompts_per_update == 0) b.Error("batch.prompts_per_update", "must be > 0");
  if (bs.samples_per_prompt == 0) b.Error("batch.samples_per_prompt", "must be > 0");
  if (bs.groups_per_message == 0 ||
      (bs.prompts_per_update % std::max<uint32_t>(1, bs.groups_per_message)) != 0) {
    b.Error("batch.groups_per_message", "must divide prompts_per_update (" +
                                            std::to_string(bs.prompts_per_update) + "), got " +
                                            std::to_string(bs.groups_per_message));
  }
  engine::SamplingParams sp;
  sp.temperature = c.sampling.temperature;
  sp.top_k = c.sampling.top_k;
  sp.top_p = c.sampling.top_p;
  sp.max_new_tokens = c.sampling.max_new_tokens;
  sp.num_samples = static_cast<int32_t>(bs.samples_per_prompt);
  Check(b, "sampling", sp.Validate());
  if (c.sampling.temperature <= 0)
    b.Error("sampling.temperature", "must be > 0 for RL (0 is greedy: no exploration)");
  engine::EngineConfig ec;
  ec.model = c.model;
  ec.num_slots = c.engine.num_slots;
  ec.intra_op_threads = c.engine.intra_op_threads;
  ec.device = c.engine.device;
  Check(b, "engine", ec.Validate());
  if (c.engine.num_slots < static_cast<int32_t>(bs.samples_per_prompt)) {
    b.Error("engine.num_slots",
            "must hold at least one group (" + std::to_string(bs.samples_per_prompt) + " samples)");
  }
  // The learner trains at the sampling temperature and consumes whole updates.
  c.trainer.temperature = c.sampling.temperature;
  c.trainer.batches_per_update =
      static_cast<int32_t>(bs.prompts_per_update / std::max<uint32_t>(1, bs.groups_per_message));
  Check(b, "trainer", c.trainer.Validate());
  Check(b, "broadcast", c.broadcast.Validate());
  // CURVE protects every ZeroMQ socket (the zmq and shm weight paths included); gloo's and
  // NCCL's own connections it cannot: across nodes, only by explicit consent.
  if (CurveEnabled(c.cluster) && c.cluster.backend != "local") {
    const auto& bc = c.broadcast;
    auto refuse = [&](const char* backend, const char* key) {
      b.Error("broadcast.backend",
              std::string(backend) +
                  " moves the weights between nodes over connections that nothing "
                  "authenticates or encrypts, while CURVE protects every other socket of this "
                  "job: use backend zmq (CURVE-encrypted), or set broadcast." +
                  key +
                  ": true to accept that a host that reaches them can read or inject weights");
    };
    if (bc.backend == broadcast::Backend::kGloo && !bc.allow_unauthenticated_gloo)
      refuse("gloo", "allow_unauthenticated_gloo");
    if (bc.backend == broadcast::Backend::kNccl && !bc.allow_unauthenticated_nccl)
      refuse("nccl", "allow_unauthenticated_nccl");
  }
  if (c.checkpoint.ack != "checkpoint" && c.checkpoint.ack != "trained") {
    b.Error("checkpoint.ack", "must be checkpoint or trained, got '" + c.checkpoint.ack + "'");
  }
  if (c.checkpoint.max_unacked_batches == 0 || c.checkpoint.max_unacked_batches > 200)
    b.Error("checkpoint.max_unacked_batches",
            "must be in [1, 200] (senders hold at most 256 unacknowledged messages)");
  if (c.stop.target_accuracy < 0 || c.stop.target_accuracy > 1)
    b.Error("stop.target_accuracy", "must be in [0, 1]");
  if (c.stop.max_seconds < 0) b.Error("stop.max_seconds", "must be >= 0");
  if (c.stop.max_steps == 0) b.Error("stop.max_steps", "must be > 0");
  if (c.rollout_settings.max_groups_in_flight < bs.groups_per_message) {
    b.Error("rollout.max_groups_in_flight", "must be at least batch.groups_per_message (" +
                                                std::to_string(bs.groups_per_message) + ")");
  }
  if (c.rollout_settings.outbox_messages == 0) b.Error("rollout.outbox_messages", "must be > 0");
}

static Result<JobConfig> Bind(YAML::Node root, const std::string& source) {
  JobConfig c;
  TROUPE_RETURN_IF_ERROR(config::Read(root, source, &c));
  c.raw = root;
  c.source = source;
  return c;
}

namespace {

// Relative model and tokenizer folders a config file names are relative to the file's own
// folder, so a shipped config works from any directory; --set values (applied after this)
// stay relative to the current directory.
void AnchorPathsAtConfigFile(YAML::Node& root, const std::string& config_path) {
  std::error_code ec;
  const std::filesystem::path base = std::filesystem::absolute(config_path, ec).parent_path();
  if (ec) return;
  const YAML::Node& view = root;
  for (const auto& [section, key] : {std::pair<const char*, const char*>{"tokenizer", "path"},
                                     std::pair<const char*, const char*>{"model", "from"}}) {
    if (!view[section] || !view[section].IsMap() || !view[section][key] ||
        !view[section][key].IsScalar())
      continue;
    const std::string value = view[section][key].Scalar();
    if (value.empty() || std::filesystem::path(value).is_absolute()) continue;
    root[section][key] = (base / value).lexically_normal().string();
  }
}

}  // namespace

Result<JobConfig> LoadJobConfig(const std::string& path,
                                const std::vector<std::string>& overrides) {
  TROUPE_ASSIGN_OR_RETURN(YAML::Node root, config::LoadYamlFile(path));
  if (!root.IsMap()) return InvalidArgument("{}: the document must be a mapping of sections", path);
  AnchorPathsAtConfigFile(root, path);
  for (const auto& o : overrides) TROUPE_RETURN_IF_ERROR(config::ApplyOverride(&root, o));
  return Bind(root, overrides.empty() ? path : path + " (with --set)");
}

Result<JobConfig> LoadResolvedConfig(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(YAML::Node root, config::LoadYamlFile(path));
  return Bind(root, path);
}

std::string ResolvedConfigYaml(const JobConfig& c) {
  YAML::Node typed = config::Write(c);
  YAML::Emitter e;
  e << typed;
  return "# Resolved job config (every key, defaults included); written by `troupe run`.\n" +
         std::string(e.c_str()) + "\n";
}

std::vector<config::KeyDoc> JobConfigKeys() {
  return config::Document(JobConfig{});
}

}  // namespace launcher
}  // namespace troupe
