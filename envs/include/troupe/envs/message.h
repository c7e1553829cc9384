// Chat messages: the text a task, an environment and the policy exchange.
//
// A conversation is a list of messages with one of four roles. Tasks produce
// the opening messages (system/user), the policy writes assistant turns, and
// multi-turn environments answer with tool turns. Rendering messages to token
// ids (with loss masks) lives in renderer.h. Plain value types; no shared
// state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::envs {

enum class Role {
  kSystem,     // instructions that frame the task
  kUser,       // the task's question
  kAssistant,  // the policy's own text (the only role the learner trains on)
  kTool,       // an environment's answer to a tool call (loss mask 0)
};

// "system", "user", "assistant", "tool".
const char* RoleName(Role role);
// Parses the names above; anything else is InvalidArgument naming the value.
Result<Role> ParseRole(std::string_view name);

struct Message {
  Role role = Role::kUser;
  std::string content;

  bool operator==(const Message& o) const { return role == o.role && content == o.content; }
};

using Conversation = std::vector<Message>;

}  // namespace troupe::envs
