// Tasks: prompt sets with a held-out split and a verifier.
//
// A Task yields prompts (opening messages plus the reference answer) for a
// training split and a disjoint evaluation split, scores responses, and
// provides demonstrations for a supervised warm start. Prompt generation is
// deterministic: the same TaskConfig and index give the same prompt on every
// machine, so rollout actors can shard a stream by index without talking to
// each other. Tasks produce text; renderer.h turns messages into token ids.
//
// Multi-turn tasks additionally create one Environment per episode (see
// environment.h and episode.h); their Verify() reads the score the episode
// recorded in the sample's metadata, because the episode's world (a scratch
// workspace, a game) lives in the rollout actor.
//
// Thread safety: every const method of a Task may be called from many threads
// at once (reward actors verify in parallel). Nothing throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/core/status.h"
#include "troupe/envs/environment.h"
#include "troupe/envs/message.h"
#include "troupe/envs/verify.h"

namespace troupe::envs {

enum class Split {
  kTrain,  // the stream rollout actors sample from
  kEval,   // held-out prompts, disjoint from kTrain
};
const char* SplitName(Split split);  // "train", "eval"

// size() of a split that is an endless generated stream.
inline constexpr uint64_t kUnbounded = UINT64_MAX;

struct Prompt {
  std::string id;         // unique within the task: "<task>/<split>/<index>" or the dataset row id
  Conversation messages;  // opening messages (system/user); the policy answers next
  std::string
      reference;        // expected answer, the verifier's input (may be empty for external scoring)
  std::string service;  // external reward service for this sample ("": the client's default)
  std::string metadata;  // JSON object text for verifiers and reward services ("": none)
};

class Task {
 public:
  virtual ~Task() = default;

  // The task's name in the job; samples carry it (SequenceMeta.task).
  virtual const std::string& name() const = 0;
  // Prompts in a split; kUnbounded for generated training streams.
  virtual uint64_t size(Split split) const = 0;
  // The index-th prompt of a split (finite splits wrap around modulo size()).
  // Deterministic in (config, split, index).
  virtual Prompt GetPrompt(Split split, uint64_t index) const = 0;
  // Scores one response. Thread-safe; failures are values (reward 0 + reason).
  virtual VerifyResult Verify(const VerifyInput& input) const = 0;
  // The correct continuation of `prompt`: one assistant message for
  // single-turn tasks; for multi-turn tasks the assistant turns with the real
  // tool turns between them (an expert playing the environment). NotFound when
  // the task has no reference for this prompt.
  virtual Result<Conversation> Demonstration(const Prompt& prompt) const = 0;

  // True for tasks played as multi-turn tool episodes.
  virtual bool multi_turn() const { return false; }
  // A fresh environment for one episode of `prompt` (multi-turn tasks only;
  // others return InvalidArgument). Can fail with kIo (no scratch directory).
  virtual Result<std::unique_ptr<Environment>> NewEnvironment(const Prompt& prompt) const;
  // The next assistant turn of a scripted expert for a multi-turn episode of
  // `prompt`, given the transcript so far (assistant and tool messages). Used
  // for demonstrations and tests; NotFound for tasks without an expert.
  virtual Result<std::string> ExpertTurn(const Prompt& prompt,
                                         const Conversation& transcript) const;
  // False when samples of this task are scored by an external reward service
  // (TaskConfig.scoring = "external"); Verify() then returns a failure.
  virtual bool local_verifier() const { return true; }
};

}  // namespace troupe::envs
