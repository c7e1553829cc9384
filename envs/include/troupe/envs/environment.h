// Multi-turn environments: the per-episode world a policy acts on with tools.
//
// An Environment is created by a multi-turn Task for one prompt (one episode)
// and owned by that episode's Episode (episode.h). The Episode parses the
// policy's tool calls and hands each one to Call(); the Environment runs it and
// returns what the model sees next. When the episode ends (submitted, turn or
// token limit) the Episode asks Score() once.
//
// Contract for implementers: Call() and Score() never throw, whatever the
// arguments or the state of the world (junk JSON values, huge numbers, files
// changed behind the environment's back); every problem becomes an error
// result the model reads. An Environment is used by one thread at a time
// (the episode's driver); different environments are independent.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "troupe/envs/verify.h"

namespace troupe::envs {

// One tool an environment offers.
struct ToolSpec {
  std::string name;         // what the model writes after <tool> ("read")
  std::string usage;        // argument object, e.g. {"path": string}
  std::string description;  // one line for tool instructions
};

// The outcome of one tool call, shown to the model as a tool turn.
struct ToolResult {
  bool ok = true;          // false: the call failed; `output` is the error message
  std::string output;      // text the model sees (before truncation by the episode)
  bool submitted = false;  // the call ended the episode (submit, a solved game)

  static ToolResult Ok(std::string output) { return ToolResult{true, std::move(output), false}; }
  static ToolResult Error(std::string message) {
    return ToolResult{false, std::move(message), false};
  }
  static ToolResult Submit(std::string output) { return ToolResult{true, std::move(output), true}; }
};

class Environment {
 public:
  virtual ~Environment() = default;
  // The tools this environment accepts (fixed for its lifetime).
  virtual const std::vector<ToolSpec>& tools() const = 0;
  // Runs one call. `name` is one of tools() (the episode rejects unknown names
  // before calling); `args` is a JSON object. Never throws; never blocks for
  // long (file tools touch only a small, size-capped directory).
  virtual ToolResult Call(const std::string& name, const nlohmann::json& args) = 0;
  // Scores the episode; called once when it ends, submitted or not. Never
  // throws; the reward is finite and in [0, 1].
  virtual VerifyResult Score() = 0;
};

// Renders tool specs as instructions (one line per tool plus the call format),
// for tasks configured to open with a system message.
std::string ToolInstructions(const std::vector<ToolSpec>& tools);

}  // namespace troupe::envs
