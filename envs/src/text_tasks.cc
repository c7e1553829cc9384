// Single-turn built-in tasks of graded difficulty: reverse < sort < add < word_problem < gsm8k.
#include <algorithm>
#include <array>
#include <cmath>

#include "generated_task.h"

namespace troupe::envs::detail {
namespace {

// Reverse a lowercase word: "abc" -> "cba".
class ReverseTask final : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;

 protected:
  GeneratedSample Generate(Rng& rng) const override {
    std::string w = RandomWord(rng, config());
    std::string rev(w.rbegin(), w.rend());
    std::string user = compact() ? w : "Reverse the string: " + w;
    return {w, std::move(user), std::move(rev), ""};
  }
  double SpaceSize() const override { return WordSpace(config()); }
};

// Sort the letters of a word: "sort dcab" -> "abcd".
class SortTask final : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;

 protected:
  GeneratedSample Generate(Rng& rng) const override {
    std::string w = RandomWord(rng, config());
    std::string sorted = w;
    std::sort(sorted.begin(), sorted.end());
    std::string user = compact() ? "sort " + w : "Sort the letters of " + w + " alphabetically.";
    return {w, std::move(user), std::move(sorted), ""};
  }
  double SpaceSize() const override { return WordSpace(config()); }
};

int64_t Pow10(int64_t d) {
  int64_t p = 1;
  for (int64_t i = 0; i < d; ++i) p *= 10;
  return p;
}

// Multi-digit addition: "12+345" -> "357".
class AddTask final : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;

 protected:
  int64_t Operand(Rng& rng) const {
    int64_t d = rng.Uniform(config().min_digits, config().max_digits);
    int64_t lo = d == 1 ? 0 : Pow10(d - 1);
    return rng.Uniform(lo, Pow10(d) - 1);
  }
  GeneratedSample Generate(Rng& rng) const override {
    int64_t a = Operand(rng), b = Operand(rng);
    std::string key = fmt::format("{}+{}", a, b);
    std::string user = compact() ? key : fmt::format("What is {} + {}?", a, b);
    return {key, std::move(user), std::to_string(a + b), ""};
  }
  double SpaceSize() const override {
    int64_t lo = config().min_digits == 1 ? 0 : Pow10(config().min_digits - 1);
    double n = static_cast<double>(Pow10(config().max_digits) - lo);
    return n * n;
  }
  double PartialCredit(std::string_view response, std::string_view reference) const override {
    return RightAlignedCredit(response, reference);
  }
};

// Simple arithmetic word problems with one operation each.
class WordProblemTask final : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;

 protected:
  static constexpr std::array<const char*, 8> kNames = {"ann", "bob", "cal", "dee",
                                                        "eli", "fay", "gus", "ivy"};
  static constexpr std::array<const char*, 8> kItems = {"apples", "pens",  "books",  "eggs",
                                                        "cards",  "coins", "shells", "stamps"};
  int64_t SmallMax() const {
    return std::max<int64_t>(2, std::min<int64_t>(config().max_number, 9));
  }

  GeneratedSample Generate(Rng& rng) const override {
    const char* who = kNames[static_cast<size_t>(rng.Uniform(0, kNames.size() - 1))];
    const char* item = kItems[static_cast<size_t>(rng.Uniform(0, kItems.size() - 1))];
    int64_t max = config().max_number;
    int64_t kind = rng.Uniform(0, 3);
    std::string text;
    int64_t answer = 0;
    if (kind == 0) {
      int64_t a = rng.Uniform(1, max), b = rng.Uniform(1, max);
      text = fmt::format("{} has {} {} and buys {} more. how many {} now?", who, a, item, b, item);
      answer = a + b;
    } else if (kind == 1) {
      int64_t a = rng.Uniform(1, max), b = rng.Uniform(1, a);
      text = fmt::format("{} has {} {} and gives away {}. how many are left?", who, a, item, b);
      answer = a - b;
    } else if (kind == 2) {
      int64_t a = rng.Uniform(2, SmallMax()), b = rng.Uniform(2, SmallMax());
      text = fmt::format("{} buys {} bags of {} {}. how many {}?", who, a, b, item, item);
      answer = a * b;
    } else {
      int64_t q = rng.Uniform(2, SmallMax()), b = rng.Uniform(2, SmallMax());
      text = fmt::format("{} shares {} {} among {} friends. how many does each get?", who, q * b,
                         item, b);
      answer = q;
    }
    return {text, text, std::to_string(answer), ""};
  }
  double SpaceSize() const override {
    double m = static_cast<double>(config().max_number);
    double s = static_cast<double>(SmallMax() - 1);
    return static_cast<double>(kNames.size() * kItems.size()) *
           (m * m + m * (m + 1) / 2 + 2 * s * s);
  }
  double PartialCredit(std::string_view response, std::string_view reference) const override {
    return RightAlignedCredit(response, reference);
  }
};

// GSM8K-format math word problems: a question, and an answer whose lines work the problem
// out and end with GSM8K's "#### N" (the reference and the warm-start demonstration; scoring
// numeric compares final numbers only). One- and two-step problems over + - * /, operands up
// to max_number; division always comes out even.
class Gsm8kTask final : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;

 protected:
  static constexpr std::array<const char*, 10> kNames = {"Ann",  "Ben", "Carla", "Dev",  "Emma",
                                                         "Finn", "Gia", "Hugo",  "Iris", "Jack"};
  static constexpr std::array<const char*, 10> kItems = {
      "apples", "pencils", "books", "eggs", "cards", "coins", "shells", "stamps", "cookies", "marbles"};
  static constexpr int64_t kTemplates = 6;
  int64_t SmallMax() const {
    return std::max<int64_t>(2, std::min<int64_t>(config().max_number, 9));
  }

  GeneratedSample Generate(Rng& rng) const override {
    auto pick = [&](const auto& list) { return list[static_cast<size_t>(rng.Uniform(0, list.size() - 1))]; };
    const std::string a_name = pick(kNames);
    std::string b_name = pick(kNames);
    while (b_name == a_name) b_name = pick(kNames);
    const std::string item = pick(kItems);
    const int64_t max = config().max_number;
    std::string q, work;
    int64_t answer = 0;
    switch (rng.Uniform(0, kTemplates - 1)) {
      case 0: {
        int64_t a = rng.Uniform(1, max), b = rng.Uniform(1, max);
        answer = a + b;
        q = fmt::format("{0} has {1} {3}. {0} buys {2} more {3}. How many {3} does {0} have now?",
                        a_name, a, b, item);
        work = fmt::format("{} + {} = {}", a, b, answer);
        break;
      }
      case 1: {
        int64_t a = rng.Uniform(2, max), b = rng.Uniform(1, a - 1);
        answer = a - b;
        q = fmt::format("{0} has {2} {4} and gives {3} of them to {1}. How many {4} does {0} have left?",
                        a_name, b_name, a, b, item);
        work = fmt::format("{} - {} = {}", a, b, answer);
        break;
      }
      case 2: {
        int64_t a = rng.Uniform(2, SmallMax()), b = rng.Uniform(2, SmallMax());
        answer = a * b;
        q = fmt::format("{0} buys {1} boxes of {3}. Each box holds {2} {3}. How many {3} does {0} buy?",
                        a_name, a, b, item);
        work = fmt::format("{} * {} = {}", a, b, answer);
        break;
      }
      case 3: {
        int64_t per = rng.Uniform(2, SmallMax()), n = rng.Uniform(2, SmallMax());
        answer = per;
        q = fmt::format("{0} shares {1} {3} equally among {2} friends. How many {3} does each friend get?",
                        a_name, per * n, n, item);
        work = fmt::format("{} / {} = {}", per * n, n, per);
        break;
      }
      case 4: {
        int64_t a = rng.Uniform(1, max), b = rng.Uniform(1, max), c = rng.Uniform(1, a + b - 1);
        answer = a + b - c;
        q = fmt::format("{0} has {2} {5}. {0} buys {3} more and then gives {4} to {1}. How many {5} "
                        "does {0} have now?",
                        a_name, b_name, a, b, c, item);
        work = fmt::format("{} + {} = {}\n{} - {} = {}", a, b, a + b, a + b, c, answer);
        break;
      }
      default: {
        int64_t a = rng.Uniform(1, max), b = rng.Uniform(1, max);
        answer = a + (a + b);
        q = fmt::format("{0} has {2} {4}. {1} has {3} more {4} than {0}. How many {4} do they have "
                        "together?",
                        a_name, b_name, a, b, item);
        work = fmt::format("{} + {} = {}\n{} + {} = {}", a, b, a + b, a, a + b, answer);
        break;
      }
    }
    return {q, q, fmt::format("{}\n#### {}", work, answer), ""};
  }
  double SpaceSize() const override {
    const double m = static_cast<double>(config().max_number);
    return static_cast<double>(kNames.size() * (kNames.size() - 1) * kItems.size()) * m * m;
  }
};

}  // namespace

void AddTextTaskKinds(std::vector<TaskKind>* kinds) {
  kinds->push_back({"reverse", false, &BuildTask<ReverseTask>});
  kinds->push_back({"sort", false, &BuildTask<SortTask>});
  kinds->push_back({"add", false, &BuildTask<AddTask>});
  kinds->push_back({"word_problem", false, &BuildTask<WordProblemTask>});
  kinds->push_back({"gsm8k", false, &BuildTask<Gsm8kTask>});
}

}  // namespace troupe::envs::detail
