#include "generated_task.h"

#include <array>
#include <cmath>

#include "troupe/core/check.h"

namespace troupe::envs::detail {
namespace {
constexpr uint64_t kTrainTag = 0x747261696eULL;  // "train"
constexpr uint64_t kEvalTag = 0x6576616cULL;     // "eval"
// Redraws of a training problem that collided with the eval split. Init()
// guarantees eval_size <= space / 2, so hitting this is astronomically unlikely.
constexpr uint64_t kMaxTrainAttempts = 100000;
}  // namespace

std::string RandomWord(Rng& rng, const TaskConfig& c) {
  int64_t len = c.min_len;
  if (c.length_power == 0) {
    len = rng.Uniform(c.min_len, c.max_len);  // the prompt sets of earlier versions, unchanged
  } else {
    std::array<double, 129> weight{};  // max_len <= 128 (TaskConfig::Validate)
    double total = 0;
    for (int64_t l = c.min_len; l <= c.max_len; ++l)
      total += weight[static_cast<size_t>(l)] = std::pow(static_cast<double>(l), -c.length_power);
    double u = rng.UniformReal() * total;
    for (len = c.min_len; len < c.max_len; ++len) {
      u -= weight[static_cast<size_t>(len)];
      if (u < 0) break;
    }
  }
  std::string w(static_cast<size_t>(len), 'a');
  for (auto& ch : w) ch = static_cast<char>('a' + rng.Uniform(0, 25));
  return w;
}

double WordSpace(const TaskConfig& c) {
  double total = 0;
  for (int64_t l = c.min_len; l <= c.max_len; ++l) total += std::pow(26.0, static_cast<double>(l));
  return total;
}

Status GeneratedTask::Init() {
  TROUPE_RETURN_IF_ERROR(config_.Validate());
  double space = SpaceSize();
  auto want = static_cast<uint64_t>(config_.eval_size);
  if (static_cast<double>(want) > space / 2) {
    return InvalidArgument(
        "task '{}': eval_size = {} is more than half of the {} distinct problems this config can "
        "generate; lower eval_size or widen the problem space",
        config_.name, want, static_cast<uint64_t>(space));
  }
  uint64_t max_draws = want * 1000 + 10000;
  for (uint64_t j = 0; eval_.size() < want; ++j) {
    if (j >= max_draws) {
      return InvalidArgument(
          "task '{}': found only {} distinct held-out problems in {} draws (eval_size = {}); "
          "lower eval_size or widen the problem space",
          config_.name, eval_.size(), max_draws, want);
    }
    Rng rng(Mix({config_.seed, kEvalTag, j}));
    GeneratedSample s = Generate(rng);
    if (eval_keys_.insert(s.key).second) eval_.push_back(std::move(s));
  }
  return Status::Ok();
}

uint64_t GeneratedTask::size(Split split) const {
  return split == Split::kEval ? eval_.size() : kUnbounded;
}

GeneratedSample GeneratedTask::TrainSample(uint64_t index) const {
  for (uint64_t attempt = 0; attempt < kMaxTrainAttempts; ++attempt) {
    Rng rng(Mix({config_.seed, kTrainTag, index, attempt}));
    GeneratedSample s = Generate(rng);
    if (!eval_keys_.count(s.key)) return s;
  }
  TROUPE_CHECK_MSG(false, "task '{}': {} redraws of training prompt {} all hit the eval split",
                   config_.name, kMaxTrainAttempts, index);
  return {};
}

Conversation GeneratedTask::OpeningMessages(const GeneratedSample& sample) const {
  return {Message{Role::kUser, sample.user}};
}

Prompt GeneratedTask::GetPrompt(Split split, uint64_t index) const {
  GeneratedSample s;
  if (split == Split::kEval) {
    TROUPE_CHECK_MSG(!eval_.empty(), "task '{}' has no eval split (eval_size = 0)", config_.name);
    index %= eval_.size();
    s = eval_[index];
  } else {
    s = TrainSample(index);
  }
  Prompt p;
  p.id = fmt::format("{}/{}/{}", config_.name, SplitName(split), index);
  p.messages = OpeningMessages(s);
  p.reference = std::move(s.reference);
  p.service = config_.service;
  p.metadata = std::move(s.metadata);
  return p;
}

VerifyResult GeneratedTask::Verify(const VerifyInput& input) const {
  if (config_.scoring == "external") {
    return VerifyResult::Failure(config_.name,
                                 "task is scored by an external service (scoring: external)");
  }
  VerifyResult r;
  r.scorer = config_.name;
  if (config_.scoring == "numeric") {
    r.reward = NumericAnswerMatch(input.response, input.reference);
    r.components.emplace_back("numeric", r.reward);
    return r;
  }
  double exact = ExactMatch(input.response, input.reference);
  if (config_.scoring == "partial" && exact < 1.0) {
    r.reward = PartialCredit(input.response, input.reference);
    r.components.emplace_back("partial", r.reward);
  } else {
    r.reward = exact;
  }
  r.components.emplace_back("exact", exact);
  return r;
}

Result<Conversation> GeneratedTask::Demonstration(const Prompt& prompt) const {
  return Conversation{Message{Role::kAssistant, prompt.reference}};
}

}  // namespace troupe::envs::detail
