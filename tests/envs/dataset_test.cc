// JSONL datasets: both row forms, clear errors, splits.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "troupe/envs/dataset.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {
namespace {

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe-dataset-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  Result<std::unique_ptr<Task>> Load(const std::string& path, const std::string& scoring = "exact",
                                     int64_t eval_size = 200) {
    TaskConfig c;
    c.name = "data";
    c.kind = "jsonl";
    c.path = path;
    c.scoring = scoring;
    c.eval_size = eval_size;
    return MakeTask(c);
  }
  std::string dir_;
};

TEST_F(DatasetTest, MessagesForm) {
  std::string path = Write(
      "m.jsonl",
      R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}], "id": "q1", "service": "math", "metadata": {"level": 1}})"
      "\n\n"
      R"({"messages": [{"role": "user", "content": "3+3"}], "reference": "6", "id": 7})"
      "\n");
  auto rows = LoadJsonl(path);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  const DatasetRow& r = (*rows)[0];
  EXPECT_EQ(r.line, 1);
  EXPECT_EQ(r.id, "q1");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.messages[1].content, "2+2");
  EXPECT_EQ(r.reference, "4")
      << "a final assistant message is the reference, not part of the prompt";
  EXPECT_EQ(r.service, "math");
  EXPECT_EQ(r.metadata, R"({"level":1})");
  EXPECT_EQ((*rows)[1].line, 3) << "blank lines are skipped but counted";
  EXPECT_EQ((*rows)[1].id, "7");
  EXPECT_EQ((*rows)[1].reference, "6");
}

TEST_F(DatasetTest, InstructionForm) {
  std::string path =
      Write("i.jsonl", R"({"instruction": "Reverse", "input": "abc", "output": "cba"})"
                       "\n"
                       R"({"instruction": "Say hi", "output": "hi"})"
                       "\n");
  auto task = Load(path);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ((*task)->size(Split::kEval), 1u) << "min(eval_size, rows / 2) held out";
  EXPECT_EQ((*task)->size(Split::kTrain), 1u);
  std::set<std::string> users;
  for (Split s : {Split::kTrain, Split::kEval}) {
    Prompt p = (*task)->GetPrompt(s, 0);
    ASSERT_EQ(p.messages.size(), 1u);
    users.insert(p.messages[0].content);
    auto demo = (*task)->Demonstration(p);
    ASSERT_TRUE(demo.ok());
    EXPECT_EQ((*task)->Verify({"", (*demo)[0].content, p.reference, p.metadata}).reward, 1.0);
  }
  EXPECT_EQ(users, (std::set<std::string>{"Reverse\n\nabc", "Say hi"}));
}

// GSM8K's own format: {"question", "answer" ending in "#### N"}; scoring numeric compares
// the final numbers, and the answer is the demonstration.
TEST_F(DatasetTest, Gsm8kQuestionAnswerForm) {
  std::string path = Write(
      "gsm8k.jsonl",
      R"({"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"})"
      "\n"
      R"({"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?", "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"})"
      "\n");
  TaskConfig c;
  c.name = "gsm8k_file";
  c.kind = "jsonl";
  c.path = path;
  c.scoring = "numeric";
  auto task = MakeTask(c);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  for (Split s : {Split::kTrain, Split::kEval}) {
    Prompt p = (*task)->GetPrompt(s, 0);
    ASSERT_EQ(p.messages.size(), 1u);
    EXPECT_EQ(p.messages[0].role, Role::kUser);
    EXPECT_NE(p.reference.find("\n#### "), std::string::npos);
    auto demo = (*task)->Demonstration(p);
    ASSERT_TRUE(demo.ok());
    EXPECT_EQ((*task)->Verify({"", (*demo)[0].content, p.reference, ""}).reward, 1.0);
    const std::string want = p.reference.substr(p.reference.rfind(' ') + 1);
    EXPECT_EQ((*task)->Verify({"", "I think \\boxed{" + want + "}", p.reference, ""}).reward, 1.0);
    EXPECT_EQ((*task)->Verify({"", "#### 11", p.reference, ""}).reward, 0.0);
  }
  auto bad = LoadJsonl(Write("q.jsonl", R"({"question": ""})" "\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"question\" is empty"), std::string::npos);
  auto mixed = LoadJsonl(Write("m.jsonl", R"({"question": "a", "instruction": "b"})" "\n"));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("use one form"), std::string::npos);
}

TEST_F(DatasetTest, AFileWithNoFormIsRejectedNamingTheExpectedFields) {
  std::string path = Write("bad.jsonl", R"({"prompt": "2+2", "completion": "4"})"
                                        "\n");
  auto task = Load(path);
  ASSERT_FALSE(task.ok());
  const std::string& m = task.status().message();
  EXPECT_NE(m.find("bad.jsonl:1"), std::string::npos) << m;
  EXPECT_NE(m.find("\"messages\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"instruction\"/\"input\"/\"output\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"question\"/\"answer\""), std::string::npos) << m;
  EXPECT_NE(m.find("completion, prompt"), std::string::npos) << "names the keys it found: " << m;
}

TEST_F(DatasetTest, BadRowsNameFileLineAndField) {
  struct Case {
    std::string line;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"messages": [], "instruction": "x"})", "use one form"},
      {R"({"messages": []})", "non-empty list"},
      {R"({"messages": "hi"})", "non-empty list"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "robot"},
      {R"({"messages": [{"role": "user"}]})", "\"content\""},
      {R"({"messages": [{"role": "assistant", "content": "x"}]})", "only an assistant"},
      {R"({"instruction": 5, "output": "x"})", "\"instruction\" must be a string"},
      {R"({"input": "x", "output": "y"})", "\"instruction\" is empty"},
      {R"({"instruction": "x", "output": "y", "metadata": [1]})", "\"metadata\" must be an object"},
      {R"({"instruction": "x", "output": "y", "id": 1.5})", "\"id\" must be"},
      {R"({"instruction": "x", "output": "y", "split": "dev"})", "split"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path =
        Write("case" + std::to_string(i) + ".jsonl", R"({"instruction": "ok", "output": "fine"})"
                                                     "\n" +
                                                         cases[i].line + "\n");
    auto rows = LoadJsonl(path);
    ASSERT_FALSE(rows.ok()) << cases[i].line;
    const std::string& m = rows.status().message();
    EXPECT_NE(m.find(":2:"), std::string::npos) << "names line 2: " << m;
    EXPECT_NE(m.find(cases[i].needle), std::string::npos) << m;
  }
}

TEST_F(DatasetTest, FileLevelErrors) {
  auto missing = LoadJsonl(dir_ + "/nope.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  auto empty = LoadJsonl(Write("empty.jsonl", "\n  \n"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no rows"), std::string::npos);
  // Locally scored rows need a reference; externally scored ones do not.
  std::string no_ref = Write("noref.jsonl", R"({"instruction": "a"})"
                                            "\n"
                                            R"({"instruction": "b"})"
                                            "\n");
  auto local = Load(no_ref);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("no reference"), std::string::npos);
  EXPECT_TRUE(Load(no_ref, "external").ok());
  std::string dup = Write("dup.jsonl", R"({"instruction": "a", "output": "1", "id": "x"})"
                                       "\n"
                                       R"({"instruction": "b", "output": "2", "id": "x"})"
                                       "\n");
  auto d = Load(dup);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("id 'x' appears twice"), std::string::npos);
}

TEST_F(DatasetTest, SplitFieldsAndSeededHoldOut) {
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += R"({"instruction": "q)" + std::to_string(i) + R"(", "output": "a", "split": ")" +
            (i < 3 ? "eval" : "train") + "\"}\n";
  auto task = Load(Write("split.jsonl", text));
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ((*task)->size(Split::kEval), 3u);
  EXPECT_EQ((*task)->size(Split::kTrain), 7u);
  std::set<std::string> eval;
  for (uint64_t i = 0; i < 3; ++i)
    eval.insert((*task)->GetPrompt(Split::kEval, i).messages[0].content);
  EXPECT_EQ(eval, (std::set<std::string>{"q0", "q1", "q2"}));
  for (uint64_t i = 0; i < 14; ++i)
    EXPECT_EQ(eval.count((*task)->GetPrompt(Split::kTrain, i).messages[0].content), 0u);

  // Without split fields: eval_size rows held out by seed, disjoint and stable.
  text.clear();
  for (int i = 0; i < 40; ++i)
    text += R"({"instruction": "r)" + std::to_string(i) +
            R"(", "output": "a"})"
            "\n";
  std::string path = Write("plain.jsonl", text);
  auto a = Load(path, "exact", 5), b = Load(path, "exact", 5);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->size(Split::kEval), 5u);
  EXPECT_EQ((*a)->size(Split::kTrain), 35u);
  std::set<std::string> held, trained;
  for (uint64_t i = 0; i < 5; ++i) {
    held.insert((*a)->GetPrompt(Split::kEval, i).messages[0].content);
    EXPECT_EQ((*a)->GetPrompt(Split::kEval, i).id, (*b)->GetPrompt(Split::kEval, i).id);
  }
  for (uint64_t i = 0; i < 35; ++i)
    trained.insert((*a)->GetPrompt(Split::kTrain, i).messages[0].content);
  EXPECT_EQ(held.size(), 5u);
  EXPECT_EQ(trained.size(), 35u) << "an epoch visits every training row once";
  for (const auto& h : held) EXPECT_EQ(trained.count(h), 0u);
}

}  // namespace
}  // namespace troupe::envs
