// Built-in tasks and the registry actors look tasks up in.
//
// Kinds (TaskConfig.kind) and what the policy sees. "compact" prompts are
// short for character-level models; the renderer's compact format adds "<bos>"
// before and "=" after the user text, and the response ends with <eos>:
//
//   kind          compact user text              reference   partial credit
//   reverse       "abc"                          "cba"       positional (left-aligned)
//   sort          "sort dcab"                    "abcd"      positional
//   add           "12+345"                       "357"       right-aligned digits
//   word_problem  "ann has 3 pens and buys 4     "7"         right-aligned digits
//                  more. how many pens now?"
//   jsonl         from the file (dataset.h)      from file   edit distance
//   file_reverse  "reverse the word in w.txt"    "cba"       multi-turn, see below
//   file_sort     "sort in.txt into out.txt"     "abcd"      multi-turn
//   wordle        "guess the 4-letter word"      the secret  multi-turn
//
// Verbose prompts phrase the same problem as an English instruction. Letters
// are lowercase a-z; every character a built-in task renders is printable
// ASCII. Generated tasks hold out exactly `eval_size` distinct problems for
// the eval split and never generate them in the training stream (a rejected
// draw is redrawn), so the splits are disjoint by construction.
//
// Multi-turn kinds are played as tool episodes (episode.h): file_reverse and
// file_sort over a per-episode scratch workspace (tools read, write, edit,
// list, submit), wordle with a `guess` tool and per-letter feedback. Their
// scores are documented in docs/envs.md.
//
// Thread safety: tasks and a built TaskRegistry are immutable; share them
// freely between threads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/envs/config.h"
#include "troupe/envs/task.h"

namespace troupe::envs {

// Creates a task from its config (validated here). Errors name the field, or
// for jsonl the file and line.
Result<std::unique_ptr<Task>> MakeTask(const TaskConfig& config);

// Tasks by name. Built once, then read-only (and thus thread-safe).
class TaskRegistry {
 public:
  TaskRegistry() = default;
  // Builds every task of the job; the first error is returned.
  static Result<std::shared_ptr<const TaskRegistry>> Create(const std::vector<TaskConfig>& configs);

  // Adds a task (for custom tasks); AlreadyExists on a duplicate name. Not
  // thread-safe: call before sharing the registry.
  Status Add(std::unique_ptr<Task> task);
  // The task with this name, or nullptr.
  const Task* Find(std::string_view name) const;
  std::vector<std::string> names() const;
  size_t size() const { return tasks_.size(); }

 private:
  std::map<std::string, std::unique_ptr<Task>, std::less<>> tasks_;
};

}  // namespace troupe::envs
