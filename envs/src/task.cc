#include "troupe/envs/task.h"
#include "troupe/envs/tool_call.h"

#include "generated_task.h"
#include "troupe/core/check.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kSystem:
      return "system";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "tool";
  }
  return "unknown";
}

Result<Role> ParseRole(std::string_view name) {
  if (name == "system") return Role::kSystem;
  if (name == "user") return Role::kUser;
  if (name == "assistant") return Role::kAssistant;
  if (name == "tool") return Role::kTool;
  std::string shown(name.substr(0, 40));
  return InvalidArgument("role '{}' is not one of system, user, assistant, tool", shown);
}

const char* SplitName(Split split) {
  return split == Split::kTrain ? "train" : "eval";
}

Result<std::unique_ptr<Environment>> Task::NewEnvironment(const Prompt& prompt) const {
  return InvalidArgument("task '{}' is single-turn; it has no environment", name());
}

Result<std::string> Task::ExpertTurn(const Prompt& prompt, const Conversation& transcript) const {
  return NotFound("task '{}' has no scripted expert", name());
}

std::string ToolInstructions(const std::vector<ToolSpec>& tools) {
  std::string out =
      "Call one tool per turn by writing " + ToolCallSyntax(ToolCallFormat::kTroupe) + ". Tools:\n";
  for (const auto& t : tools) out += fmt::format("- {} {}: {}\n", t.name, t.usage, t.description);
  return out;
}

namespace detail {
const std::vector<TaskKind>& TaskKinds() {
  static const std::vector<TaskKind> kinds = [] {
    std::vector<TaskKind> k;
    AddTextTaskKinds(&k);
    k.push_back({"jsonl", false, &MakeJsonlTask});
    AddMultiTurnTaskKinds(&k);
    return k;
  }();
  return kinds;
}

const TaskKind* FindTaskKind(const std::string& name) {
  for (const auto& k : TaskKinds())
    if (name == k.name) return &k;
  return nullptr;
}
}  // namespace detail

const std::vector<std::string>& BuiltinTaskKinds() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : detail::TaskKinds()) n.emplace_back(k.name);
    return n;
  }();
  return names;
}

bool IsMultiTurnKind(const std::string& kind) {
  const detail::TaskKind* k = detail::FindTaskKind(kind);
  return k != nullptr && k->multi_turn;
}

Result<std::unique_ptr<Task>> MakeTask(const TaskConfig& config) {
  TROUPE_RETURN_IF_ERROR(config.Validate());  // refuses a kind that is not in the table
  const detail::TaskKind* kind = detail::FindTaskKind(config.effective_kind());
  TROUPE_CHECK(kind != nullptr);
  return kind->make(config);
}

Result<std::shared_ptr<const TaskRegistry>> TaskRegistry::Create(
    const std::vector<TaskConfig>& configs) {
  TROUPE_RETURN_IF_ERROR(ValidateTasks(configs));
  auto registry = std::make_shared<TaskRegistry>();
  for (const auto& c : configs) {
    TROUPE_ASSIGN_OR_RETURN(auto task, MakeTask(c));
    TROUPE_RETURN_IF_ERROR(registry->Add(std::move(task)));
  }
  return std::shared_ptr<const TaskRegistry>(std::move(registry));
}

Status TaskRegistry::Add(std::unique_ptr<Task> task) {
  if (!task) return InvalidArgument("TaskRegistry::Add: null task");
  std::string name = task->name();
  if (tasks_.count(name)) return AlreadyExists("task '{}' is already registered", name);
  tasks_.emplace(std::move(name), std::move(task));
  return Status::Ok();
}

const Task* TaskRegistry::Find(std::string_view name) const {
  auto it = tasks_.find(name);
  return it == tasks_.end() ? nullptr : it->second.get();
}

std::vector<std::string> TaskRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, task] : tasks_) out.push_back(name);
  return out;
}

}  // namespace troupe::envs
