#include "troupe/envs/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "generated_task.h"
#include "rng.h"
#include "troupe/core/check.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

const char* TypeName(const json& v) {
  return v.type_name();
}

std::string KeysOf(const json& obj) {
  std::string out;
  size_t n = 0;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (n++ == 12) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + it.key().substr(0, 40);
  }
  return out.empty() ? "(none)" : out;
}

// Reads an optional string field; InvalidArgument when present with another type.
Status OptString(const json& row, const char* key, std::string* out, const std::string& where) {
  auto it = row.find(key);
  if (it == row.end() || it->is_null()) return Status::Ok();
  if (!it->is_string())
    return InvalidArgument("{}: field \"{}\" must be a string, got {}", where, key, TypeName(*it));
  *out = it->get<std::string>();
  return Status::Ok();
}

Status ParseMessages(const json& list, const std::string& where, DatasetRow* row) {
  if (!list.is_array() || list.empty())
    return InvalidArgument(
        "{}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} "
        "objects, got {}",
        where, list.is_array() ? "an empty list" : TypeName(list));
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    if (!m.is_object())
      return InvalidArgument("{}: messages[{}] must be an object, got {}", where, i, TypeName(m));
    auto role = m.find("role");
    auto content = m.find("content");
    if (role == m.end() || !role->is_string())
      return InvalidArgument("{}: messages[{}] needs a string \"role\"", where, i);
    if (content == m.end() || !content->is_string())
      return InvalidArgument("{}: messages[{}] needs a string \"content\"", where, i);
    Result<Role> r = ParseRole(role->get<std::string>());
    if (!r.ok()) return r.status().WithContext(fmt::format("{}: messages[{}]", where, i));
    row->messages.push_back(Message{*r, content->get<std::string>()});
  }
  if (row->messages.back().role == Role::kAssistant) {
    row->reference = std::move(row->messages.back().content);
    row->messages.pop_back();
  }
  if (row->messages.empty())
    return InvalidArgument(
        "{}: \"messages\" holds only an assistant answer; a prompt needs at "
        "least one system or user message before it",
        where);
  return Status::Ok();
}

Status ParseInstruction(const json& obj, const std::string& where, DatasetRow* row) {
  std::string instruction, input;
  TROUPE_RETURN_IF_ERROR(OptString(obj, "instruction", &instruction, where));
  TROUPE_RETURN_IF_ERROR(OptString(obj, "input", &input, where));
  TROUPE_RETURN_IF_ERROR(OptString(obj, "output", &row->reference, where));
  if (instruction.empty())
    return InvalidArgument(
        "{}: \"instruction\" is empty or missing; it is required when "
        "\"input\"/\"output\" are used",
        where);
  std::string user = instruction;
  if (!input.empty()) user += "\n\n" + input;
  row->messages.push_back(Message{Role::kUser, std::move(user)});
  return Status::Ok();
}

}  // namespace

Result<DatasetRow> ParseJsonlRow(std::string_view text, int64_t line_no, std::string_view source) {
  std::string where = fmt::format("{}:{}", source, line_no);
  json obj = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return Malformed("{}: not valid JSON", where);
  if (!obj.is_object())
    return InvalidArgument("{}: each line must be a JSON object, got {}", where, TypeName(obj));
  DatasetRow row;
  row.line = line_no;
  bool has_messages = obj.contains("messages");
  bool has_instruction =
      obj.contains("instruction") || obj.contains("input") || obj.contains("output");
  bool has_question = obj.contains("question");  // GSM8K: {"question", "answer"}
  if (static_cast<int>(has_messages) + has_instruction + has_question > 1)
    return InvalidArgument(
        "{}: row mixes \"messages\", \"instruction\"/\"input\"/\"output\" and "
        "\"question\"; use one form",
        where);
  if (!has_messages && !has_instruction && !has_question)
    return InvalidArgument(
        "{}: expected \"messages\" (a list of {{\"role\", \"content\"}}), "
        "\"instruction\"/\"input\"/\"output\" fields or GSM8K's \"question\"/\"answer\"; "
        "found keys: {}",
        where, KeysOf(obj));
  if (has_question) {
    std::string question;
    TROUPE_RETURN_IF_ERROR(OptString(obj, "question", &question, where));
    if (question.empty()) return InvalidArgument("{}: \"question\" is empty", where);
    row.messages.push_back(Message{Role::kUser, std::move(question)});
  } else {
    TROUPE_RETURN_IF_ERROR(has_messages ? ParseMessages(obj["messages"], where, &row)
                                        : ParseInstruction(obj, where, &row));
  }
  std::string override_ref;
  TROUPE_RETURN_IF_ERROR(OptString(obj, "answer", &override_ref, where));
  TROUPE_RETURN_IF_ERROR(OptString(obj, "reference", &override_ref, where));
  if (!override_ref.empty()) row.reference = std::move(override_ref);
  TROUPE_RETURN_IF_ERROR(OptString(obj, "service", &row.service, where));
  if (auto id = obj.find("id"); id != obj.end() && !id->is_null()) {
    if (id->is_string()) {
      row.id = id->get<std::string>();
    } else if (id->is_number_integer()) {
      row.id = id->dump();
    } else {
      return InvalidArgument("{}: field \"id\" must be a string or an integer, got {}", where,
                             TypeName(*id));
    }
  }
  if (auto meta = obj.find("metadata"); meta != obj.end() && !meta->is_null()) {
    if (!meta->is_object())
      return InvalidArgument("{}: field \"metadata\" must be an object, got {}", where,
                             TypeName(*meta));
    row.metadata = meta->dump();
  }
  std::string split;
  TROUPE_RETURN_IF_ERROR(OptString(obj, "split", &split, where));
  if (split == "train") {
    row.split = Split::kTrain;
  } else if (split == "eval" || split == "test" || split == "validation") {
    row.split = Split::kEval;
  } else if (!split.empty()) {
    return InvalidArgument("{}: field \"split\" is '{}'; expected train, eval, test or validation",
                           where, split.substr(0, 40));
  }
  return row;
}

Result<std::vector<DatasetRow>> LoadJsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    if (err == ENOENT) return NotFound("dataset file '{}' does not exist", path);
    return IoError("cannot open dataset file '{}': {}", path, std::strerror(err));
  }
  std::vector<DatasetRow> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.size() > kMaxJsonlLineBytes)
      return InvalidArgument("{}:{}: line is {} bytes, over the {} byte limit", path, line_no,
                             line.size(), kMaxJsonlLineBytes);
    if (TrimAscii(line).empty()) continue;
    TROUPE_ASSIGN_OR_RETURN(DatasetRow row, ParseJsonlRow(line, line_no, path));
    rows.push_back(std::move(row));
  }
  if (in.bad()) return IoError("error reading dataset file '{}'", path);
  if (rows.empty()) return InvalidArgument("dataset file '{}' has no rows", path);
  return rows;
}

namespace detail {
namespace {

class JsonlTask final : public Task {
 public:
  explicit JsonlTask(TaskConfig config) : config_(std::move(config)) {}

  Status Init() {
    TROUPE_ASSIGN_OR_RETURN(rows_, LoadJsonl(config_.path));
    std::set<std::string> ids;
    for (const auto& r : rows_) {
      if (!r.id.empty() && !ids.insert(r.id).second)
        return InvalidArgument("{}:{}: id '{}' appears twice", config_.path, r.line, r.id);
      if (config_.scoring != "external" && r.reference.empty())
        return InvalidArgument(
            "{}:{}: row has no reference (\"output\", \"answer\", \"reference\" or a final "
            "assistant message) but task '{}' is scored locally (scoring: {})",
            config_.path, r.line, config_.name, config_.scoring);
    }
    bool any_split = std::any_of(rows_.begin(), rows_.end(), [](const auto& r) { return r.split; });
    std::vector<size_t> order(rows_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // Seeded Fisher-Yates: a fixed order shared by every actor.
    Rng rng(Mix({config_.seed, 0x6a736f6eULL}));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Uniform(0, i - 1)]);
    if (any_split) {
      for (size_t i : order) (rows_[i].split == Split::kEval ? eval_ : train_).push_back(i);
    } else {
      size_t n_eval = std::min<size_t>(static_cast<size_t>(config_.eval_size), rows_.size() / 2);
      eval_.assign(order.begin(), order.begin() + n_eval);
      std::sort(eval_.begin(), eval_.end());
      train_.assign(order.begin() + n_eval, order.end());
    }
    if (train_.empty())
      return InvalidArgument("{}: no rows left for the training split ({} rows, {} held out)",
                             config_.path, rows_.size(), eval_.size());
    return Status::Ok();
  }

  const std::string& name() const override { return config_.name; }
  uint64_t size(Split split) const override {
    return split == Split::kEval ? eval_.size() : train_.size();
  }
  Prompt GetPrompt(Split split, uint64_t index) const override {
    const auto& idx = split == Split::kEval ? eval_ : train_;
    TROUPE_CHECK_MSG(!idx.empty(), "task '{}' has no {} rows", config_.name, SplitName(split));
    const DatasetRow& r = rows_[idx[index % idx.size()]];
    Prompt p;
    p.id = r.id.empty() ? fmt::format("{}/{}", config_.name, r.line) : r.id;
    p.messages = r.messages;
    p.reference = r.reference;
    p.service = r.service.empty() ? config_.service : r.service;
    p.metadata = r.metadata;
    return p;
  }
  VerifyResult Verify(const VerifyInput& input) const override {
    if (config_.scoring == "external")
      return VerifyResult::Failure(config_.name,
                                   "task is scored by an external service (scoring: external)");
    VerifyResult r;
    r.scorer = config_.name;
    if (config_.scoring == "numeric") {
      r.reward = NumericAnswerMatch(input.response, input.reference);
      r.components.emplace_back("numeric", r.reward);
      return r;
    }
    double exact = ExactMatch(input.response, input.reference);
    r.reward =
        config_.scoring == "partial" ? EditDistanceCredit(input.response, input.reference) : exact;
    r.components.emplace_back("exact", exact);
    return r;
  }
  Result<Conversation> Demonstration(const Prompt& prompt) const override {
    if (prompt.reference.empty())
      return NotFound("prompt '{}' of task '{}' has no reference answer", prompt.id, config_.name);
    return Conversation{Message{Role::kAssistant, prompt.reference}};
  }
  bool local_verifier() const override { return config_.scoring != "external"; }

 private:
  TaskConfig config_;
  std::vector<DatasetRow> rows_;
  std::vector<size_t> train_, eval_;
};

}  // namespace

Result<std::unique_ptr<Task>> MakeJsonlTask(const TaskConfig& config) {
  auto task = std::make_unique<JsonlTask>(config);
  TROUPE_RETURN_IF_ERROR(task->Init());
  return std::unique_ptr<Task>(std::move(task));
}

}  // namespace detail
}  // namespace troupe::envs
