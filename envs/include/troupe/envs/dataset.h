// Prompt datasets from JSONL files (task kind "jsonl").
//
// One JSON object per line; blank lines are skipped. A row has EITHER
//   "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]
//     (a final assistant message is the reference answer / demonstration and
//      is not part of the prompt), OR
//   "instruction": "...", optional "input": "...", optional "output": "..."
//     (the user message is instruction, plus "\n\n" + input when input is
//      non-empty; output is the reference), OR
//   "question": "...", "answer": "... #### N" (GSM8K's format: the question is the user
//     message, the answer the reference and the demonstration; scoring: numeric compares
//     final numbers).
// Optional fields on either form: "id" (string or integer), "reference" or
// "answer" (overrides the reference), "service" (external reward service
// name), "metadata" (an object passed to verifiers and services), "split"
// ("train", or "eval"/"test"/"validation").
// A row with neither form, both forms, or a field of the wrong type is
// rejected with an error naming the file, the line and the expected fields;
// one bad row rejects the whole file.
//
// Splits: when any row has "split", rows marked eval/test/validation form the
// eval split and the others the training split. Otherwise min(eval_size,
// rows / 2) rows chosen by the task seed are held out. The training split is
// visited in one fixed seeded order that repeats every epoch.
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/envs/message.h"
#include "troupe/envs/task.h"

namespace troupe::envs {

struct DatasetRow {
  int64_t line = 0;            // 1-based line number in the file
  std::string id;              // "id" field, or "" (the task then uses "<task>/<line>")
  Conversation messages;       // the prompt (never ends with an assistant message)
  std::string reference;       // expected answer ("" when the row has none)
  std::string service;         // "service" field ("" = the task's default)
  std::string metadata;        // "metadata" object as compact JSON ("" = none)
  std::optional<Split> split;  // "split" field, if present
};

// Largest line LoadJsonl accepts (bytes).
inline constexpr size_t kMaxJsonlLineBytes = 16 << 20;

// Parses one line (`line_no` and `source` only label errors). Blank lines are
// the caller's business.
Result<DatasetRow> ParseJsonlRow(std::string_view text, int64_t line_no, std::string_view source);

// Reads a whole file. NotFound / kIo for file problems, InvalidArgument or
// Malformed (naming file:line) for bad rows, InvalidArgument for a file
// without rows.
Result<std::vector<DatasetRow>> LoadJsonl(const std::string& path);

}  // namespace troupe::envs
