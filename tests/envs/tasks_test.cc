// Built-in tasks: determinism, disjoint splits, prompt formats, verifiers,
// demonstrations and config errors.
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/envs/sampler.h"
#include "troupe/envs/tasks.h"
#include "troupe/envs/verify.h"

namespace troupe::envs {
namespace {

TaskConfig Config(const std::string& kind) {
  TaskConfig c;
  c.name = kind;
  if (kind == "wordle") c.eval_size = 50;
  if (kind == "gsm8k") c.scoring = "numeric";
  return c;
}

std::unique_ptr<Task> Make(const TaskConfig& c) {
  auto t = MakeTask(c);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

const Message& UserOf(const Prompt& p) {
  return p.messages.back();
}

TEST(Tasks, DefaultReverseTaskMatchesTheDefaultJob) {
  auto task = Make(Config("reverse"));
  ASSERT_TRUE(task);
  EXPECT_EQ(task->size(Split::kEval), 200u);
  EXPECT_EQ(task->size(Split::kTrain), kUnbounded);
  std::regex word("[a-z]{3,6}");
  for (uint64_t i = 0; i < 500; ++i) {
    Prompt p = task->GetPrompt(Split::kTrain, i);
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].role, Role::kUser);
    const std::string& w = p.messages[0].content;
    EXPECT_TRUE(std::regex_match(w, word)) << w;
    EXPECT_EQ(p.reference, std::string(w.rbegin(), w.rend()));
    EXPECT_EQ(p.id, "reverse/train/" + std::to_string(i));
  }
}

TEST(Tasks, GenerationIsDeterministicAndSeeded) {
  for (const char* kind :
       {"reverse", "sort", "add", "word_problem", "gsm8k", "file_reverse", "file_sort", "wordle"}) {
    SCOPED_TRACE(kind);
    auto a = Make(Config(kind)), b = Make(Config(kind));
    TaskConfig other = Config(kind);
    other.seed = 99;
    auto c = Make(other);
    ASSERT_TRUE(a && b && c);
    int differ = 0;
    for (uint64_t i = 0; i < 50; ++i) {
      Prompt pa = a->GetPrompt(Split::kTrain, i), pb = b->GetPrompt(Split::kTrain, i);
      EXPECT_EQ(UserOf(pa).content, UserOf(pb).content);
      EXPECT_EQ(pa.reference, pb.reference);
      EXPECT_EQ(pa.metadata, pb.metadata);
      differ += c->GetPrompt(Split::kTrain, i).reference != pa.reference;
    }
    EXPECT_GT(differ, 10) << "another seed must give other prompts";
  }
}

// The problem identity of a prompt: the user text, plus the reference for
// tasks whose user text is the same for every prompt (multi-turn ones).
std::string Key(const Prompt& p) {
  return UserOf(p).content + "|" + p.metadata + "|" + p.reference;
}

TEST(Tasks, TrainAndEvalSplitsAreDisjoint) {
  for (const char* kind :
       {"reverse", "sort", "add", "word_problem", "gsm8k", "file_reverse", "file_sort", "wordle"}) {
    SCOPED_TRACE(kind);
    TaskConfig c = Config(kind);
    if (std::string(kind) == "reverse") c.max_len = 3;  // 17576 words: collisions would show
    auto task = Make(c);
    ASSERT_TRUE(task);
    std::set<std::string> eval;
    for (uint64_t i = 0; i < task->size(Split::kEval); ++i)
      eval.insert(Key(task->GetPrompt(Split::kEval, i)));
    EXPECT_EQ(eval.size(), task->size(Split::kEval)) << "eval prompts are distinct";
    for (uint64_t i = 0; i < 5000; ++i) {
      Prompt p = task->GetPrompt(Split::kTrain, i);
      ASSERT_EQ(eval.count(Key(p)), 0u)
          << "train prompt " << i << " is in the eval split: " << Key(p);
    }
  }
}

TEST(Tasks, CompactAndVerbosePromptFormats) {
  TaskConfig c = Config("add");
  auto add = Make(c);
  std::regex sum("([0-9]+)\\+([0-9]+)");
  for (uint64_t i = 0; i < 200; ++i) {
    Prompt p = add->GetPrompt(Split::kTrain, i);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(UserOf(p).content, m, sum)) << UserOf(p).content;
    EXPECT_EQ(std::stoll(p.reference), std::stoll(m[1]) + std::stoll(m[2]));
    EXPECT_LE(m[1].length(), 3);
  }
  c.prompt_style = "verbose";
  auto verbose = Make(c);
  EXPECT_EQ(verbose->GetPrompt(Split::kTrain, 0).messages[0].content.rfind("What is ", 0), 0u);
  auto sort = Make(Config("sort"));
  Prompt sp = sort->GetPrompt(Split::kTrain, 3);
  ASSERT_EQ(UserOf(sp).content.rfind("sort ", 0), 0u);
  std::string letters = UserOf(sp).content.substr(5);
  std::sort(letters.begin(), letters.end());
  EXPECT_EQ(sp.reference, letters);
}

// GSM8K format: the answer works the problem out line by line ("a op b = c", each result
// right) and ends with "#### N", N the answer to the question.
TEST(Tasks, Gsm8kProblemsAreGsm8kFormattedAndRight) {
  TaskConfig c = Config("gsm8k");
  c.max_number = 12;
  auto task = Make(c);
  ASSERT_TRUE(task);
  std::regex line("(\\d+) ([-+*/]) (\\d+) = (\\d+)");
  std::regex number("\\d+");
  std::set<std::string> openings;
  for (uint64_t i = 0; i < 600; ++i) {
    Prompt p = task->GetPrompt(Split::kTrain, i);
    const std::string& q = UserOf(p).content;
    const size_t mark = p.reference.rfind("\n#### ");
    ASSERT_NE(mark, std::string::npos) << p.reference;
    const long long final_answer = std::stoll(p.reference.substr(mark + 6));
    std::stringstream work(p.reference.substr(0, mark));
    std::string l;
    long long last = -1;
    int lines = 0;
    while (std::getline(work, l)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(l, m, line)) << l;
      long long a = std::stoll(m[1]), b = std::stoll(m[3]), r = std::stoll(m[4]);
      char op = m[2].str()[0];
      long long want = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
      if (op == '/') {
        EXPECT_EQ(a % b, 0) << l;
      }
      EXPECT_EQ(r, want) << l;
      EXPECT_GE(r, 0) << l;
      last = r;
      ++lines;
    }
    EXPECT_GE(lines, 1);
    EXPECT_LE(lines, 2);
    EXPECT_EQ(last, final_answer) << p.reference;
    // Every operand of the first line appears in the question; operands are bounded.
    for (auto it = std::sregex_iterator(q.begin(), q.end(), number); it != std::sregex_iterator(); ++it)
      EXPECT_LE(std::stoll(it->str()), 12 * 12) << q;
    openings.insert(q.substr(q.find(' ') + 1, 8));
    // The demonstration is the answer and scores 1; a wrong final number scores 0.
    auto demo = task->Demonstration(p);
    ASSERT_TRUE(demo.ok());
    EXPECT_EQ(demo->at(0).content, p.reference);
    EXPECT_EQ(task->Verify({"", p.reference, p.reference, ""}).reward, 1.0);
    EXPECT_EQ(task->Verify({"", "so the answer is \\boxed{" + std::to_string(final_answer) + "}",
                            p.reference, ""})
                  .reward,
              1.0);
    EXPECT_EQ(task->Verify({"", "#### " + std::to_string(final_answer + 1), p.reference, ""}).reward,
              0.0);
    EXPECT_EQ(task->Verify({"", std::to_string(final_answer), p.reference, ""}).reward, 0.0)
        << "a bare number without a marker is not an answer";
  }
  EXPECT_GE(openings.size(), 5u) << "several problem templates";
  TaskConfig exact = Config("gsm8k");
  exact.scoring = "exact";
  EXPECT_NE(MakeTask(exact).status().message().find("set scoring: numeric"), std::string::npos);
}

TEST(Verify, FinalNumericAnswer) {
  auto f = [](const char* s) { return FinalNumericAnswer(s).value_or("<none>"); };
  EXPECT_EQ(f("3 + 5 = 8\n#### 8"), "8");
  EXPECT_EQ(f("#### 1,234"), "1234");
  EXPECT_EQ(f("#### $72.50."), "72.5");
  EXPECT_EQ(f("#### 8.0"), "8");
  EXPECT_EQ(f("#### -0"), "0");
  EXPECT_EQ(f("#### 007"), "7");
  EXPECT_EQ(f("#### 0"), "0");
  EXPECT_EQ(f("#### -3\nmore text"), "-3");
  EXPECT_EQ(f("#### 4\n#### 5"), "5") << "the last marker counts";
  EXPECT_EQ(f("The answer is \\boxed{42}."), "42");
  EXPECT_EQ(f("\\boxed{\\$1{,}000}"), "<none>") << "braces inside are kept, then not a number";
  EXPECT_EQ(f("\\boxed{\\$ 1,000}"), "1000");
  EXPECT_EQ(f("#### 9 \\boxed{3}"), "3") << "\\boxed{} wins over ####";
  EXPECT_EQ(f("\\boxed{12"), "<none>");
  EXPECT_EQ(f("#### 8 apples"), "<none>");
  EXPECT_EQ(f("#### "), "<none>");
  EXPECT_EQ(f("#### 1.2.3"), "<none>");
  EXPECT_EQ(f("#### 5."), "5");
  EXPECT_EQ(f("8"), "<none>");
  EXPECT_EQ(f(""), "<none>");
  EXPECT_EQ(NumericAnswerMatch("#### 8", "8"), 1.0);
  EXPECT_EQ(NumericAnswerMatch("x\n#### 8", "y\n#### 8.00"), 1.0);
  EXPECT_EQ(NumericAnswerMatch("#### 8", "apples"), 0.0) << "a reference without a number";
  EXPECT_EQ(NumericAnswerMatch("", "#### 8"), 0.0);
}

TEST(Tasks, WordProblemAnswersAreRight) {
  auto task = Make(Config("word_problem"));
  std::regex plus("\\w+ has (\\d+) \\w+ and buys (\\d+) more\\. how many \\w+ now\\?");
  std::regex minus("\\w+ has (\\d+) \\w+ and gives away (\\d+)\\. how many are left\\?");
  std::regex times("\\w+ buys (\\d+) bags of (\\d+) \\w+\\. how many \\w+\\?");
  std::regex share("\\w+ shares (\\d+) \\w+ among (\\d+) friends\\. how many does each get\\?");
  int seen[4] = {};
  for (uint64_t i = 0; i < 400; ++i) {
    Prompt p = task->GetPrompt(Split::kTrain, i);
    const std::string& t = UserOf(p).content;
    std::smatch m;
    long long want = -1;
    if (std::regex_match(t, m, plus)) {
      want = std::stoll(m[1]) + std::stoll(m[2]);
      ++seen[0];
    } else if (std::regex_match(t, m, minus)) {
      want = std::stoll(m[1]) - std::stoll(m[2]);
      ++seen[1];
    } else if (std::regex_match(t, m, times)) {
      want = std::stoll(m[1]) * std::stoll(m[2]);
      ++seen[2];
    } else if (std::regex_match(t, m, share)) {
      ASSERT_EQ(std::stoll(m[1]) % std::stoll(m[2]), 0) << t;
      want = std::stoll(m[1]) / std::stoll(m[2]);
      ++seen[3];
    }
    ASSERT_GE(want, 0) << "unexpected problem text: " << t;
    EXPECT_EQ(p.reference, std::to_string(want)) << t;
  }
  for (int k = 0; k < 4; ++k) EXPECT_GT(seen[k], 0) << "template " << k << " never drawn";
}

TEST(Tasks, EveryRenderedCharacterIsPrintableAscii) {
  for (const char* style : {"compact", "verbose"}) {
    for (const char* kind :
         {"reverse", "sort", "add", "word_problem", "file_reverse", "file_sort", "wordle"}) {
      TaskConfig c = Config(kind);
      c.prompt_style = style;
      c.tool_instructions = true;
      auto task = Make(c);
      for (uint64_t i = 0; i < 50; ++i) {
        Prompt p = task->GetPrompt(Split::kTrain, i);
        std::string all = p.reference;
        for (const auto& m : p.messages) all += m.content;
        for (char ch : all) {
          auto u = static_cast<unsigned char>(ch);
          ASSERT_TRUE(u == '\n' || (u >= 0x20 && u < 0x7f)) << kind << " renders byte " << int(u);
        }
      }
    }
  }
}

TEST(Verifiers, ExactAndPartialCredit) {
  EXPECT_EQ(ExactMatch(" cba\n", "cba"), 1.0);
  EXPECT_EQ(ExactMatch("cbb", "cba"), 0.0);
  EXPECT_DOUBLE_EQ(PositionalCredit("cbx", "cba"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(PositionalCredit("cb", "cba"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(PositionalCredit("cbaa", "cba"), 3.0 / 4);
  EXPECT_EQ(PositionalCredit("", "cba"), 0.0);
  EXPECT_DOUBLE_EQ(RightAlignedCredit("347", "357"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(RightAlignedCredit("57", "357"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(EditDistanceCredit("kitten", "sitting"), 1.0 - 3.0 / 7);
  EXPECT_EQ(EditDistanceCredit("same", "same"), 1.0);
  std::string big(100000, 'a');
  double v = EditDistanceCredit(big, big + "b");  // cut to kMaxEditChars: stays cheap
  EXPECT_TRUE(v >= 0.0 && v <= 1.0);
}

TEST(Verifiers, TasksScoreExactOrPartial) {
  TaskConfig c = Config("reverse");
  auto exact = Make(c);
  c.scoring = "partial";
  auto partial = Make(c);
  VerifyInput in{"abc=", "cbx", "cba", ""};
  EXPECT_EQ(exact->Verify(in).reward, 0.0);
  EXPECT_DOUBLE_EQ(partial->Verify(in).reward, 2.0 / 3);
  in.response = "cba";
  EXPECT_EQ(partial->Verify(in).reward, 1.0);
  EXPECT_TRUE(partial->Verify(in).ok());
  c = Config("add");
  c.scoring = "partial";
  auto add = Make(c);
  EXPECT_DOUBLE_EQ(add->Verify({"", "347", "357", ""}).reward, 2.0 / 3);
  c.scoring = "external";
  auto ext = Make(c);
  EXPECT_FALSE(ext->local_verifier());
  VerifyResult r = ext->Verify({"", "357", "357", ""});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.reward, 0.0);
}

TEST(Tasks, SingleTurnDemonstrationsScoreOne) {
  for (const char* kind : {"reverse", "sort", "add", "word_problem"}) {
    auto task = Make(Config(kind));
    for (uint64_t i = 0; i < 20; ++i) {
      Prompt p = task->GetPrompt(Split::kEval, i);
      auto demo = task->Demonstration(p);
      ASSERT_TRUE(demo.ok());
      ASSERT_EQ(demo->size(), 1u);
      EXPECT_EQ((*demo)[0].role, Role::kAssistant);
      EXPECT_EQ(task->Verify({"", (*demo)[0].content, p.reference, p.metadata}).reward, 1.0);
    }
    EXPECT_FALSE(task->multi_turn());
    EXPECT_FALSE(task->NewEnvironment(task->GetPrompt(Split::kTrain, 0)).ok());
  }
}

TEST(TaskConfig, ErrorsNameTheProblem) {
  auto expect_error = [](TaskConfig c, const std::string& needle) {
    Status s = c.Validate();
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  TaskConfig c = Config("reverse");
  c.kind = "palindrome";
  expect_error(c, "palindrome");
  c = Config("reverse");
  c.min_len = 5;
  c.max_len = 2;
  expect_error(c, "min_len = 5");
  c = Config("reverse");
  c.max_len = 129;
  expect_error(c, "max_len = 129");
  c = Config("reverse");
  c.length_power = -1;
  expect_error(c, "length_power = -1");
  c = Config("reverse");
  c.scoring = "fuzzy";
  expect_error(c, "fuzzy");
  c = Config("reverse");
  c.service = "math";
  expect_error(c, "service 'math'");
  c = Config("wordle");
  c.word_length = 7;
  expect_error(c, "word_length = 7");
  c = Config("wordle");
  c.scoring = "external";
  expect_error(c, "multi-turn");
  c = Config("reverse");
  c.name = "bad name";
  expect_error(c, "bad name");
  c = Config("jsonl");
  expect_error(c, "path");
  c = Config("file_sort");
  c.workspace.root = "relative/dir";
  expect_error(c, "workspace.root");
  EXPECT_FALSE(ValidateTasks({Config("reverse"), Config("reverse")}).ok());
}

TEST(TaskConfig, EvalSizeBeyondTheProblemSpaceIsRejected) {
  TaskConfig c = Config("reverse");
  c.min_len = c.max_len = 1;  // 26 words
  c.eval_size = 20;
  auto t = MakeTask(c);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("eval_size = 20"), std::string::npos)
      << t.status().ToString();
  c.eval_size = 13;
  auto ok = MakeTask(c);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  std::set<std::string> train;
  for (uint64_t i = 0; i < 400; ++i) train.insert((*ok)->GetPrompt(Split::kTrain, i).reference);
  EXPECT_EQ(train.size(), 13u) << "the 13 words not held out";
  c = Config("wordle");
  c.eval_size = 200;  // more than half of the 4-letter list: caught by Validate already
  EXPECT_NE(c.Validate().message().find("use eval_size <= 181"), std::string::npos)
      << c.Validate().message();
  EXPECT_FALSE(MakeTask(c).ok());
}

// length_power p draws word lengths with P(len) ~ len^-p: the counts of 20000 training
// prompts follow it (each length within 5 standard deviations of its expectation), the
// longest length still occurs, and p = 0 keeps every length equally likely.
TEST(GeneratedTask, LengthPowerDrawsALongTail) {
  for (double p : {0.0, 2.0}) {
    TaskConfig c = Config("reverse");
    c.min_len = 3;
    c.max_len = 64;
    c.length_power = p;
    auto t = MakeTask(c);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    constexpr int kDraws = 20000;
    std::vector<int> count(65, 0);
    for (uint64_t i = 0; i < kDraws; ++i) ++count[(*t)->GetPrompt(Split::kTrain, i).reference.size()];
    double total = 0;
    for (int l = 3; l <= 64; ++l) total += std::pow(l, -p);
    for (int l = 3; l <= 64; ++l) {
      double q = std::pow(l, -p) / total, want = kDraws * q;
      EXPECT_NEAR(count[l], want, 5 * std::sqrt(want * (1 - q)) + 1) << "length " << l << ", p " << p;
    }
    EXPECT_GT(count[64], 0) << "p " << p;
    if (p > 0) {
      EXPECT_GT(count[3], 10 * count[12]) << "short words dominate";
    }
  }
}

TEST(TaskRegistry, BuildsAndFindsTasks) {
  auto reg = TaskRegistry::Create({Config("reverse"), Config("add")});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ((*reg)->size(), 2u);
  ASSERT_NE((*reg)->Find("add"), nullptr);
  EXPECT_EQ((*reg)->Find("add")->name(), "add");
  EXPECT_EQ((*reg)->Find("nope"), nullptr);
  TaskConfig named = Config("reverse");
  named.name = "rev_long";
  named.kind = "reverse";
  named.min_len = 8;
  named.max_len = 10;
  auto reg2 = TaskRegistry::Create({named});
  ASSERT_TRUE(reg2.ok());
  EXPECT_GE((*reg2)->Find("rev_long")->GetPrompt(Split::kTrain, 0).reference.size(), 8u);
}

TEST(PromptStream, ShardsPartitionOneStream) {
  auto reg = TaskRegistry::Create({Config("reverse")});
  ASSERT_TRUE(reg.ok());
  std::set<std::string> seen;
  for (uint32_t shard = 0; shard < 3; ++shard) {
    auto s = PromptStream::Create(*reg, {{"reverse", 1.0}}, 7, shard, 3);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int k = 0; k < 10; ++k) EXPECT_TRUE(seen.insert(s->Next().prompt.id).second);
  }
  for (int g = 0; g < 30; ++g) EXPECT_EQ(seen.count("reverse/train/" + std::to_string(g)), 1u);
  EXPECT_FALSE(PromptStream::Create(*reg, {{"reverse", 1.0}}, 7, 3, 3).ok());
  EXPECT_FALSE(PromptStream::Create(*reg, {{"nope", 1.0}}, 7, 0, 1).ok());
  EXPECT_FALSE(PromptStream::Create(*reg, {{"reverse", 0.0}}, 7, 0, 1).ok());
}

TEST(PromptStream, MixesByWeightAndResumes) {
  TaskConfig add = Config("add");
  add.weight = 3;
  TaskConfig evalonly = Config("sort");
  evalonly.weight = 0;
  std::vector<TaskConfig> configs = {Config("reverse"), add, evalonly};
  auto reg = TaskRegistry::Create(configs);
  ASSERT_TRUE(reg.ok());
  auto s = PromptStream::Create(*reg, configs, 11, 0, 1);
  ASSERT_TRUE(s.ok());
  std::map<std::string, int> count;
  std::vector<std::string> ids;
  for (int k = 0; k < 4000; ++k) {
    TaskPrompt tp = s->Next();
    ++count[tp.task->name()];
    ids.push_back(tp.prompt.id);
  }
  EXPECT_EQ(count["sort"], 0) << "weight 0: evaluation only";
  double add_share = count["add"] / 4000.0;
  EXPECT_GT(add_share, 0.70);  // 3 / (3 + 1) = 0.75; fixed seed, so this is deterministic
  EXPECT_LT(add_share, 0.80);
  // Resume from a checkpointed position.
  auto again = PromptStream::Create(*reg, configs, 11, 0, 1);
  again->Seek(1234);
  EXPECT_EQ(again->position(), 1234u);
  for (int k = 1234; k < 1300; ++k) EXPECT_EQ(again->Next().prompt.id, ids[static_cast<size_t>(k)]);
  // Eval prompts: every task's held-out split, including eval-only tasks.
  auto eval = EvalPrompts(**reg);
  EXPECT_EQ(eval.size(), 600u);
  EXPECT_EQ(eval.front().task->name(), "add");
  std::vector<TaskConfig> none = {evalonly};
  EXPECT_FALSE(ValidateTasks(none).ok()) << "some task must have a positive weight";
}

}  // namespace
}  // namespace troupe::envs
