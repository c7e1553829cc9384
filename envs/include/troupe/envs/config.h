// Typed configuration of everything in envs/: tasks, workspaces, episodes and
// external reward services.
//
// Torch-free and dependency-light on purpose: the launcher maps YAML onto these
// structs and calls Validate() before it spawns anything; the rollout and
// reward actors pass them down explicitly. Validate() is the one place each
// struct is checked; its errors name the field, the value and the limit.
// Plain value types.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::config {
class Binder;
}

namespace troupe::envs {

// Per-episode scratch directory of the file tools (read, write, edit, list, submit).
struct WorkspaceConfig {
  // Directory under which each episode gets its own fresh temp dir. Default
  // "/dev/shm" (tmpfs): creating, filling and removing a workspace there took
  // ~0.15 ms vs ~4 ms on the ext4 /tmp of the dev machine under load. Use
  // "/tmp" where /dev/shm is missing or small (e.g. Docker's 64 MiB default).
  std::string root = "/dev/shm";
  // Largest file the tools write or read whole (bytes). Default 64 KiB.
  int64_t max_file_bytes = 64 * 1024;
  // Bytes all files of one workspace may hold together. Default 1 MiB.
  int64_t max_total_bytes = 1024 * 1024;
  // Files and directories one workspace may hold. Default 64.
  int64_t max_files = 64;
  // Longest relative path a tool accepts (characters). Default 200.
  int64_t max_path_chars = 200;
  // Deepest directory nesting a path may have. Default 8.
  int64_t max_depth = 8;
  // Entries `list` shows before cutting with a marker. Default 100.
  int64_t max_list_entries = 100;

  Status Validate() const;
};

// One task of the job (see tasks.h for the built-in kinds and their prompts).
struct TaskConfig {
  // Name samples carry (SequenceMeta.task) and verifiers are looked up by. Default "reverse".
  std::string name = "reverse";
  // Built-in kind: reverse | sort | add | word_problem | jsonl | file_reverse |
  // file_sort | wordle. Empty: same as `name`.
  std::string kind;
  // Seed of prompt generation and of the held-out split. Default 1.
  uint64_t seed = 1;
  // Held-out prompts (generated tasks: exactly this many, all distinct; jsonl
  // without "split" fields: this many rows, at most half the file). Default 200.
  int64_t eval_size = 200;
  // exact (0/1), partial (per-task partial credit in [0,1], see docs/envs.md),
  // or external (scored by a reward service; no local verifier). Default exact.
  std::string scoring = "exact";
  // compact (short prompts for character-level models, e.g. "abc" rendered as
  // "<bos>abc=") or verbose (an English instruction). Default compact.
  std::string prompt_style = "compact";
  // Letters per word for reverse, sort, file_reverse, file_sort. Default 3..6.
  int64_t min_len = 3;
  int64_t max_len = 6;
  // How word lengths are drawn: 0 (default) every length in min_len..max_len
  // equally often; p > 0: P(len) proportional to len^-p, mostly short words
  // with a long tail of long ones (long-tailed response lengths).
  double length_power = 0;
  // Digits per operand for add. Default 1..3.
  int64_t min_digits = 1;
  int64_t max_digits = 3;
  // Largest number appearing in word problems (>= 2). Default 20.
  int64_t max_number = 20;
  // Secret word length for wordle: 4 or 5. Default 4 (easier for tiny models).
  int64_t word_length = 4;
  // JSONL file for kind jsonl (see dataset.h for the accepted fields).
  std::string path;
  // Reward service for this task's samples when a row does not name one
  // ("": the reward client's default service).
  std::string service;
  // Multi-turn tasks: open with a system message listing the tools and the
  // call format. Costs prompt tokens; useful for pretrained models. Default false.
  bool tool_instructions = false;
  // Scratch directory limits for file_reverse / file_sort.
  WorkspaceConfig workspace;
  // Relative frequency of this task in the training mix (PromptStream); 0 =
  // evaluation only. Default 1.
  double weight = 1.0;

  // The effective kind (`kind`, or `name` when empty).
  const std::string& effective_kind() const { return kind.empty() ? name : kind; }
  Status Validate() const;
};

// How prompts and replies are rendered (renderer.h, chat_template.h).
struct ChatConfig {
  // "auto" (default): the model folder's chat template when it has one (a
  // Hugging Face tokenizer with tokenizer_config.json's chat_template), else
  // the compact format; "template": the chat template, an error when there is
  // none; "compact" or "tagged": that fixed format (character tokenizers).
  std::string format = "auto";
  // Template variables, Hugging Face's chat_template_kwargs: name -> JSON text,
  // e.g. {"enable_thinking": "false"}. Default none.
  std::vector<std::pair<std::string, std::string>> variables;

  Status Validate() const;
};

// Limits of one multi-turn episode (episode.h).
struct EpisodeConfig {
  // Assistant turns before the episode ends with turnLimit. Default 8.
  int64_t max_turns = 8;
  // Response tokens (model + environment, after the prompt) before the episode
  // ends with a token limit. Default 512.
  int64_t max_response_tokens = 512;
  // New tokens one assistant turn may generate (capped by what is left of
  // max_response_tokens). Default 128.
  int64_t max_turn_tokens = 128;
  // Characters of one tool output shown to the model; longer outputs are cut
  // and end with a "[truncated N chars]" marker. Default 400.
  int64_t max_tool_output_chars = 400;
  // Replace bytes outside printable ASCII (and \n, \t) in tool output with '?',
  // so character-level tokenizers can encode every environment token. Default true.
  bool ascii_tool_output = true;

  Status Validate() const;
};

// One external reward/verifier service: POST <url> with a JSON sample,
// answer {"reward": x}.
struct RewardServiceConfig {
  // Name samples route by (SequenceMeta.service). Required, unique.
  std::string name;
  // Full endpoint URL, e.g. "http://127.0.0.1:8000/verify". http:// or https://.
  std::string url;
  // Limit of one HTTP attempt (connect + send + answer), ms. Default 2000.
  int64_t timeout_ms = 2000;
  // Attempts per sample, first one included (>= 1). Default 3.
  int64_t max_attempts = 3;
  // Backoff before the 2nd attempt, ms; doubles per attempt, +-50% jitter. Default 50.
  int64_t backoff_ms = 50;
  // Largest backoff, ms. Default 1000.
  int64_t max_backoff_ms = 1000;
  // Circuit breaker: after this many samples in a row failed for a reason of
  // the service's (unreachable, connection, timeout, 5xx/408/429), samples
  // fail at once without a request for breaker_cooldown_ms; then one probe
  // request decides (success closes it, failure opens it again). 0: off.
  // Default 5.
  int64_t breaker_failures = 5;
  // How long an open breaker fails samples fast before probing, ms. Default 5000.
  int64_t breaker_cooldown_ms = 5000;
  // What a sample whose reward could not be computed (the service failed)
  // becomes: "zero" — reward 0 with the reason, trained on like any failure
  // (the default, as NeMo Gym does); "drop" — left out of training and
  // counted (accounting term dropped_unscored), so an outage does not teach
  // the policy that every answer is wrong.
  std::string on_failure = "zero";

  Status Validate() const;
};

// The reward actor's HTTP client (reward_client.h).
struct RewardClientConfig {
  // Services by name. May be empty when every task is scored locally.
  std::vector<RewardServiceConfig> services;
  // Service for samples that name none ("": such samples fail with a reason). Must be in
  // `services`.
  std::string default_service;
  // Limit for one sample, all attempts and backoffs included, ms. Default 5000.
  int64_t call_timeout_ms = 5000;
  // Limit for establishing a TCP connection, ms (capped by the attempt's limit). Default 1000.
  int64_t connect_timeout_ms = 1000;
  // Requests one VerifyBatch call runs in parallel. Default 16.
  int64_t max_concurrency = 16;
  // Largest response body accepted; longer ones are malformed. Default 64 KiB.
  int64_t max_response_bytes = 64 * 1024;

  Status Validate() const;
};

// The built-in task kinds TaskConfig.kind accepts (from the one kind table, task.cc).
const std::vector<std::string>& BuiltinTaskKinds();
// True for the kinds played as multi-turn tool episodes (the table marks them).
bool IsMultiTurnKind(const std::string& kind);

// Validates every task and that names are unique.
Status ValidateTasks(const std::vector<TaskConfig>& tasks);
// Validates the reward client and that every task with scoring "external" can
// be routed: its `service` is configured, or it names none and there is a
// default_service.
Status ValidateRewardRouting(const std::vector<TaskConfig>& tasks,
                             const RewardClientConfig& client);

// The YAML keys of these structs, each documented once (troupe/core/config_binder.h; the
// launcher binds job files with them, `troupe config-keys` lists them).
void Describe(config::Binder& b, TaskConfig& c);
void Describe(config::Binder& b, WorkspaceConfig& c);
void Describe(config::Binder& b, EpisodeConfig& c);
void Describe(config::Binder& b, RewardServiceConfig& c);
void Describe(config::Binder& b, RewardClientConfig& c);
void Describe(config::Binder& b, ChatConfig& c);

}  // namespace troupe::envs
