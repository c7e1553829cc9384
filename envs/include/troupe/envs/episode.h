// Multi-turn tool episodes: a state machine independent of how generation is
// scheduled.
//
//   rollout actor                      TokenEpisode                 Environment
//   ─────────────                      ────────────                 ───────────
//   ids = prompt_tokens()  ──engine──▶ OnAssistantTokens(turn) ──▶ parse call, Call()
//        ◀── env_tokens (mask 0) ─────  Step{done=false}        ◀── tool output
//   append, generate next turn ...
//        ◀── Step{done=true} ─────────  Score() once at the end
//
// An episode alternates assistant turns and tool turns until the model submits
// (a tool result with submitted=true), max_turns assistant turns were played,
// or the response would pass max_response_tokens. The first "<tool>" call of
// each assistant turn is executed (in the renderer's format: tool_call.h); everything the model
// sees back is a tool message: the tool's output, or "error: <message>" for a
// turn without a call, a malformed call, an unknown tool or a failing tool.
// Tool output is cut to max_tool_output_chars with a "[truncated N chars]"
// marker and, when ascii_tool_output is set, reduced to printable ASCII.
//
// Flags counted per episode (EpisodeFlags): missing, unparsable, unknown-tool,
// repeated identical calls, tool errors, truncated outputs. The final record
// (SummaryJson) goes into SequenceMeta.extra; a multi-turn task's Verify()
// reads the score from it on the reward actor.
//
// Episode works on text; TokenEpisode adds token ids, behaviour log-probs and
// the loss mask (1 = tokens the model sampled, 0 = environment tokens). Many
// episodes run concurrently on one engine: each is independent and is driven
// by one thread at a time; nothing here blocks beyond a tool call's small local
// file I/O, and nothing throws (an exception escaping a custom Environment is
// turned into an error result).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/envs/config.h"
#include "troupe/envs/renderer.h"
#include "troupe/envs/task.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {

enum class EpisodeEnd {
  kRunning,     // not finished
  kSubmitted,   // the model submitted (wire: FinishReason.submitted)
  kTurnLimit,   // max_turns assistant turns played (wire: turnLimit)
  kTokenLimit,  // the response reached max_response_tokens (wire: length)
  kAborted,     // the driver gave up (engine rejected the request; wire: rejected)
};
const char* EpisodeEndName(EpisodeEnd end);  // "running", "submitted", "turn_limit", ...

struct EpisodeFlags {
  int64_t missing_calls = 0;      // assistant turns without any <tool> call
  int64_t unparsable_calls = 0;   // malformed calls (bad name, bad JSON, no </tool>)
  int64_t unknown_tools = 0;      // calls naming a tool the environment lacks
  int64_t repeated_calls = 0;     // calls identical (name + arguments) to an earlier one
  int64_t tool_errors = 0;        // calls the tool rejected (bad arguments, missing file, ...)
  int64_t truncated_outputs = 0;  // tool outputs cut to max_tool_output_chars

  // (name, value) pairs for metrics, e.g. {"unparsable_calls", 1}.
  std::vector<std::pair<std::string, double>> AsStats() const;
  EpisodeFlags& operator+=(const EpisodeFlags& o);
};

// Text-level episode.
class Episode {
 public:
  // Creates the task's environment for `prompt`. Fails for single-turn tasks or
  // when the environment cannot be set up (e.g. no scratch directory).
  static Result<std::unique_ptr<Episode>> Start(const Task& task, Prompt prompt,
                                                const EpisodeConfig& config,
                                                ToolCallFormat format = ToolCallFormat::kTroupe);

  // Processes one assistant turn. Returns the tool message the model sees next,
  // or nullopt when the episode has ended (then score() is set).
  std::optional<std::string> OnAssistantTurn(std::string_view text);
  // Ends a running episode from outside (token limit, engine failure) and
  // scores it. No-op when already ended.
  void Finish(EpisodeEnd end, std::string reason = "");

  bool done() const { return end_ != EpisodeEnd::kRunning; }
  EpisodeEnd end() const { return end_; }
  int64_t turns() const { return turns_; }
  const EpisodeFlags& flags() const { return flags_; }
  // The episode's score; valid once done().
  const VerifyResult& score() const { return score_; }
  const Prompt& prompt() const { return prompt_; }
  const Task& task() const { return task_; }
  const EpisodeConfig& config() const { return config_; }
  // Assistant and tool messages so far.
  const Conversation& transcript() const { return transcript_; }
  // Why the driver aborted (kAborted), else "".
  const std::string& abort_reason() const { return abort_reason_; }
  // {"episode": {"score", "end", "turns", "flags", "components", "failure"},
  //  "metadata": <prompt metadata object or null>} for SequenceMeta.extra.
  std::string SummaryJson() const;

 private:
  friend class TokenEpisode;  // retracts a tool turn that did not fit the token budget
  Episode(const Task& task, Prompt prompt, const EpisodeConfig& config,
          std::unique_ptr<Environment> env, ToolCallFormat format);
  ToolResult RunCall(std::string_view text);
  std::string FormatOutput(const ToolResult& result);
  void End(EpisodeEnd end);

  const Task& task_;
  Prompt prompt_;
  EpisodeConfig config_;
  std::unique_ptr<Environment> env_;
  ToolCallFormat format_;
  EpisodeEnd end_ = EpisodeEnd::kRunning;
  int64_t turns_ = 0;
  EpisodeFlags flags_;
  VerifyResult score_;
  Conversation transcript_;
  std::set<size_t> seen_calls_;  // hashes of canonical calls
  std::string abort_reason_;
};

// Token-level episode for a rollout actor: keeps the response ids, the
// behaviour log-probs (0 for environment tokens) and the loss mask aligned.
class TokenEpisode {
 public:
  struct Step {
    bool done = false;
    std::vector<int32_t> env_tokens;  // to append after the turn (mask 0), when !done
  };

  // Renders the prompt (fails when it cannot be encoded) and starts the episode.
  static Result<std::unique_ptr<TokenEpisode>> Start(const Task& task, Prompt prompt,
                                                     const EpisodeConfig& config,
                                                     const Renderer& renderer);

  // Ids to generate from: the prompt for the first turn. Later turns continue
  // the same sequence (prompt + response so far).
  const std::vector<int32_t>& prompt_tokens() const { return prompt_tokens_; }
  // Largest number of new tokens the next assistant turn may generate
  // (min(max_turn_tokens, what is left of max_response_tokens)); 0 when done.
  int64_t next_turn_budget() const;
  // Feeds one assistant turn: the ids the engine sampled (ending with EOS when
  // it stopped on EOS) and their log-probs (same length). Returns the
  // environment ids to append and continue from, or done. Mismatched lengths
  // or ids outside the vocabulary are a driver bug (InvalidArgument; the
  // episode is aborted).
  Result<Step> OnAssistantTokens(const std::vector<int32_t>& tokens,
                                 const std::vector<float>& logprobs);
  // Ends the episode (engine rejected the request, stop requested).
  void Abort(std::string reason) { episode_->Finish(EpisodeEnd::kAborted, std::move(reason)); }
  // Ends the episode with another reason (e.g. kTokenLimit when the engine's
  // context is full). No-op when already ended.
  void Finish(EpisodeEnd end, std::string reason = "") { episode_->Finish(end, std::move(reason)); }

  bool done() const { return episode_->done(); }
  const Episode& episode() const { return *episode_; }
  const std::vector<int32_t>& response_tokens() const { return response_tokens_; }
  const std::vector<float>& logprobs() const { return logprobs_; }
  const std::vector<uint8_t>& loss_mask() const { return loss_mask_; }
  // Rendered prompt text and response text (assistant text, tool turns).
  std::string prompt_text() const;
  const std::string& response_text() const { return response_text_; }

 private:
  TokenEpisode(const Renderer& renderer, std::unique_ptr<Episode> episode,
               std::vector<int32_t> prompt_tokens);
  int64_t used() const { return static_cast<int64_t>(response_tokens_.size()); }

  const Renderer& renderer_;
  std::unique_ptr<Episode> episode_;
  std::vector<int32_t> prompt_tokens_;
  std::vector<int32_t> response_tokens_;
  std::vector<float> logprobs_;
  std::vector<uint8_t> loss_mask_;
  std::string response_text_;
};

// A policy that writes the next assistant turn from the prompt and transcript.
using TextPolicy = std::function<std::string(const Prompt&, const Conversation&)>;

// Plays a whole episode with a text policy (a scripted expert, a test policy)
// and returns the finished episode. Stops after max_turns turns at the latest.
Result<std::unique_ptr<Episode>> PlayEpisode(const Task& task, const Prompt& prompt,
                                             const EpisodeConfig& config, const TextPolicy& policy);

// Reads the score a finished episode recorded (SummaryJson) from a sample's
// metadata; what multi-turn tasks' Verify() returns.
VerifyResult VerifyFromEpisodeRecord(const std::string& scorer, std::string_view metadata);

}  // namespace troupe::envs
