// Multi-turn episodes: the state machine with scripted policies, flags,
// limits, and the token-level transcript with its loss mask.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "troupe/engine/tokenizer.h"
#include "troupe/envs/episode.h"
#include "troupe/envs/tasks.h"
#include "troupe/envs/tool_call.h"
#include "troupe/envs/wordle.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

TaskConfig Config(const std::string& kind) {
  TaskConfig c;
  c.name = kind;
  c.eval_size = 20;
  return c;
}

std::unique_ptr<Task> Make(const TaskConfig& c) {
  auto t = MakeTask(c);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A policy that plays a fixed list of turns, then repeats the last one.
TextPolicy Script(std::vector<std::string> turns) {
  return [turns](const Prompt&, const Conversation& transcript) {
    size_t played = 0;
    for (const auto& m : transcript) played += m.role == Role::kAssistant;
    return turns[std::min(played, turns.size() - 1)];
  };
}

TextPolicy Expert(const Task& task) {
  return [&task](const Prompt& p, const Conversation& t) {
    auto turn = task.ExpertTurn(p, t);
    EXPECT_TRUE(turn.ok()) << turn.status().ToString();
    return turn.ok() ? *turn : std::string();
  };
}

size_t Entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += !e.path().empty();
  return n;
}

TEST(Episode, ExpertSolvesEveryMultiTurnTask) {
  for (const char* kind : {"file_reverse", "file_sort", "wordle"}) {
    SCOPED_TRACE(kind);
    auto task = Make(Config(kind));
    ASSERT_TRUE(task && task->multi_turn());
    for (uint64_t i = 0; i < task->size(Split::kEval); ++i) {
      Prompt p = task->GetPrompt(Split::kEval, i);
      auto ep = PlayEpisode(*task, p, EpisodeConfig{}, Expert(*task));
      ASSERT_TRUE(ep.ok()) << ep.status().ToString();
      EXPECT_EQ((*ep)->end(), EpisodeEnd::kSubmitted) << p.id;
      EXPECT_EQ((*ep)->score().reward, 1.0) << p.id;
      EXPECT_EQ((*ep)->flags().tool_errors, 0);
      // The reward actor re-derives the score from the episode record.
      VerifyResult v = task->Verify({"", "", p.reference, (*ep)->SummaryJson()});
      EXPECT_TRUE(v.ok()) << v.failure;
      EXPECT_EQ(v.reward, 1.0);
      auto demo = task->Demonstration(p);
      ASSERT_TRUE(demo.ok()) << demo.status().ToString();
      EXPECT_EQ(*demo, (*ep)->transcript());
    }
  }
}

TEST(Episode, FlagsAreCountedAndErrorsShownToTheModel) {
  auto task = Make(Config("file_reverse"));
  Prompt p = task->GetPrompt(Split::kTrain, 0);
  std::string want = p.reference;
  auto ep = PlayEpisode(*task, p, EpisodeConfig{},
                        Script({"the answer is 42",                          // missing call
                                "<tool>read {\"path\": </tool>",             // unparsable
                                "<tool>rm {\"path\": \"w.txt\"}</tool>",     // unknown tool
                                "<tool>read {\"path\": \"w.txt\"}</tool>",   // ok
                                "<tool>read { \"path\":\"w.txt\" }</tool>",  // repeated
                                "<tool>read {\"path\": \"../../etc/passwd\"}</tool>",  // tool error
                                "<tool>submit {\"answer\": \"nope\"}</tool>"}));
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  const Episode& e = **ep;
  EXPECT_EQ(e.end(), EpisodeEnd::kSubmitted);
  EXPECT_EQ(e.turns(), 7);
  EXPECT_EQ(e.flags().missing_calls, 1);
  EXPECT_EQ(e.flags().unparsable_calls, 1);
  EXPECT_EQ(e.flags().unknown_tools, 1);
  EXPECT_EQ(e.flags().repeated_calls, 1);
  EXPECT_EQ(e.flags().tool_errors, 1);
  EXPECT_EQ(e.score().reward, 0.0);
  EXPECT_TRUE(e.score().ok());
  const Conversation& t = e.transcript();
  ASSERT_EQ(t.size(), 13u);  // 7 assistant turns, 6 tool turns (none after submit)
  EXPECT_EQ(t[1].content.rfind("error: no tool call found", 0), 0u) << t[1].content;
  EXPECT_EQ(t[3].content.rfind("error: unparsable tool call", 0), 0u) << t[3].content;
  EXPECT_EQ(t[5].content, "error: unknown tool 'rm' (tools: read, write, edit, list, submit)");
  EXPECT_EQ(t[7].content, std::string(want.rbegin(), want.rend()));
  EXPECT_NE(t[11].content.find("leaves the workspace"), std::string::npos) << t[11].content;
  json summary = json::parse(e.SummaryJson());
  EXPECT_EQ(summary["episode"]["end"], "submitted");
  EXPECT_EQ(summary["episode"]["flags"]["unknown_tools"], 1);
  EXPECT_EQ(summary["metadata"]["word"], std::string(want.rbegin(), want.rend()));
}

TEST(Episode, TurnLimitEndsTheEpisode) {
  auto task = Make(Config("file_sort"));
  EpisodeConfig cfg;
  cfg.max_turns = 3;
  auto ep =
      PlayEpisode(*task, task->GetPrompt(Split::kTrain, 1), cfg, Script({"<tool>list</tool>"}));
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ((*ep)->end(), EpisodeEnd::kTurnLimit);
  EXPECT_EQ((*ep)->turns(), 3);
  EXPECT_EQ((*ep)->transcript().size(), 5u);
  EXPECT_EQ((*ep)->flags().repeated_calls, 2);
  EXPECT_EQ((*ep)->score().reward, 0.0) << "no out.txt";
}

TEST(Episode, PartialCreditWithoutSubmitting) {
  TaskConfig c = Config("file_sort");
  c.scoring = "partial";
  auto task = Make(c);
  Prompt p = task->GetPrompt(Split::kTrain, 2);
  std::string almost = p.reference;
  almost[0] = almost[0] == 'z' ? 'a' : 'z';
  EpisodeConfig cfg;
  cfg.max_turns = 2;
  auto ep = PlayEpisode(*task, p, cfg,
                        Script({FormatToolCall("write", {{"path", "out.txt"}, {"content", almost}}),
                                "<tool>list</tool>"}));
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ((*ep)->end(), EpisodeEnd::kTurnLimit);
  double n = static_cast<double>(p.reference.size());
  EXPECT_DOUBLE_EQ((*ep)->score().reward, (n - 1) / n);
}

TEST(Episode, LongAndBinaryToolOutputIsTruncatedAndSanitized) {
  auto task = Make(Config("file_reverse"));
  EpisodeConfig cfg;
  cfg.max_tool_output_chars = 50;
  auto ep = PlayEpisode(
      *task, task->GetPrompt(Split::kTrain, 0), cfg,
      Script(
          {FormatToolCall("write", {{"path", "big.txt"}, {"content", std::string(1000, 'x')}}),
           "<tool>read {\"path\": \"big.txt\"}</tool>",
           FormatToolCall("write", {{"path", "bin"}, {"content", std::string("a\xc3\xbf\x01z")}}),
           "<tool>read {\"path\": \"bin\"}</tool>", "<tool>submit</tool>"}));
  ASSERT_TRUE(ep.ok());
  const Conversation& t = (*ep)->transcript();
  EXPECT_EQ(t[3].content, std::string(50, 'x') + "[truncated 950 chars]");
  EXPECT_EQ(t[7].content, "a???z");
  EXPECT_EQ((*ep)->flags().truncated_outputs, 1);
}

TEST(Episode, WorkspacesAreRemovedWhenEpisodesEnd) {
  char tmpl[] = "/tmp/troupe-episode-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  TaskConfig c = Config("file_reverse");
  c.workspace.root = tmpl;
  auto task = Make(c);
  {
    auto ep = Episode::Start(*task, task->GetPrompt(Split::kTrain, 0), EpisodeConfig{});
    ASSERT_TRUE(ep.ok());
    auto ep2 = Episode::Start(*task, task->GetPrompt(Split::kTrain, 1), EpisodeConfig{});
    ASSERT_TRUE(ep2.ok());
    EXPECT_EQ(Entries(tmpl), 2u) << "one scratch directory per episode";
    (*ep)->Finish(EpisodeEnd::kAborted, "test");
    EXPECT_TRUE((*ep)->done());
    EXPECT_EQ((*ep)->abort_reason(), "test");
    EXPECT_EQ(Entries(tmpl), 1u) << "an ended episode frees its workspace at once";
  }
  EXPECT_EQ(Entries(tmpl), 0u) << "destroying a running episode removes its workspace";
  std::filesystem::remove_all(tmpl);
}

TEST(Episode, SingleTurnTasksHaveNoEpisodes) {
  auto task = Make(Config("reverse"));
  auto ep = Episode::Start(*task, task->GetPrompt(Split::kTrain, 0), EpisodeConfig{});
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("single-turn"), std::string::npos);
}

TEST(Episode, RecordParsingFailsClearly) {
  EXPECT_FALSE(VerifyFromEpisodeRecord("t", "").ok());
  EXPECT_FALSE(VerifyFromEpisodeRecord("t", "{\"episode\": 3}").ok());
  EXPECT_FALSE(VerifyFromEpisodeRecord("t", "{\"episode\": {\"score\": \"1\"}}").ok());
  VerifyResult f = VerifyFromEpisodeRecord("t", R"({"episode": {"score": 0, "failure": "boom"}})");
  EXPECT_NE(f.failure.find("boom"), std::string::npos);
  VerifyResult ok =
      VerifyFromEpisodeRecord("t", R"({"episode": {"score": 0.5, "components": {"a": 1}}})");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.reward, 0.5);
  ASSERT_EQ(ok.components.size(), 1u);
}

TEST(Wordle, FeedbackHandlesRepeatedLetters) {
  EXPECT_EQ(WordleFeedback("book", "oboe"), "YYG.");
  EXPECT_EQ(WordleFeedback("hello", "lllll"), "..GG.");
  EXPECT_EQ(WordleFeedback("abcd", "dcba"), "YYYY");
  EXPECT_EQ(WordleFeedback("abcd", "abcd"), "GGGG");
  EXPECT_EQ(WordleFeedback("aabb", "bbba"), "Y.GY");
  for (int len : {4, 5}) {
    const auto& words = WordleWords(len);
    EXPECT_GT(words.size(), 300u);
    EXPECT_TRUE(std::is_sorted(words.begin(), words.end()));
    EXPECT_EQ(std::adjacent_find(words.begin(), words.end()), words.end());
  }
}

TEST(Wordle, GameRejectsBadGuessesAndEndsWhenSolved) {
  TaskConfig c = Config("wordle");
  c.scoring = "partial";
  auto task = Make(c);
  Prompt p = task->GetPrompt(Split::kTrain, 5);
  const std::string& secret = p.reference;
  std::string wrong = secret;
  wrong[0] = secret[0] == 'q' ? 'x' : 'q';
  auto ep = PlayEpisode(
      *task, p, EpisodeConfig{},
      Script({"<tool>guess {\"word\": \"ab\"}</tool>", "<tool>guess {\"word\": 1234}</tool>",
              "<tool>guess {\"word\": \"ABCD\"}</tool>", FormatToolCall("guess", {{"word", wrong}}),
              FormatToolCall("guess", {{"word", secret}})}));
  ASSERT_TRUE(ep.ok());
  const Conversation& t = (*ep)->transcript();
  EXPECT_EQ(t[1].content, "error: a guess is 4 lowercase letters a-z");
  EXPECT_EQ(t[7].content, wrong + " " + WordleFeedback(secret, wrong));
  EXPECT_EQ((*ep)->end(), EpisodeEnd::kSubmitted);
  EXPECT_EQ((*ep)->flags().tool_errors, 3);
  EXPECT_EQ((*ep)->score().reward, 1.0);
  // Unsolved: partial credit for the best guess.
  EpisodeConfig two;
  two.max_turns = 1;
  auto miss = PlayEpisode(*task, p, two, Script({FormatToolCall("guess", {{"word", wrong}})}));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ((*miss)->end(), EpisodeEnd::kTurnLimit);
  EXPECT_DOUBLE_EQ((*miss)->score().reward, 0.5 * 3 / 4);
}

// ---------------------------------------------------------------- tokens

class TokenEpisodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = engine::CharTokenizer::Create(PrintableAlphabet());
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(tok).value();
    renderer_ = std::make_unique<Renderer>(*tokenizer_, ChatFormat::Compact());
    task_ = Make(Config("file_reverse"));
  }
  std::vector<int32_t> Encode(const std::string& text, bool eos) {
    auto ids = tokenizer_->Encode(text, false, eos);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
  std::unique_ptr<engine::CharTokenizer> tokenizer_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Task> task_;
};

TEST_F(TokenEpisodeTest, LossMaskIsOneExactlyOnModelTokens) {
  Prompt p = task_->GetPrompt(Split::kTrain, 3);
  std::string word(p.reference.rbegin(), p.reference.rend());
  auto ep = TokenEpisode::Start(*task_, p, EpisodeConfig{}, *renderer_);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  TokenEpisode& e = **ep;
  std::vector<int32_t> want_prompt = Encode("reverse the word in w.txt=", false);
  want_prompt.insert(want_prompt.begin(), tokenizer_->bos_id());
  EXPECT_EQ(e.prompt_tokens(), want_prompt);

  std::vector<std::string> turns = {"<tool>read {\"path\": \"w.txt\"}</tool>", "<tool>oops",
                                    FormatToolCall("submit", {{"answer", p.reference}})};
  std::vector<int32_t> want_tokens;
  std::vector<uint8_t> want_mask;
  std::vector<float> want_logprobs;
  float lp = -0.01f;
  for (size_t k = 0; k < turns.size(); ++k) {
    std::vector<int32_t> ids = Encode(turns[k], /*eos=*/true);
    std::vector<float> lps;
    for (size_t j = 0; j < ids.size(); ++j) lps.push_back(lp -= 0.01f);
    ASSERT_LE(static_cast<int64_t>(ids.size()), e.next_turn_budget());
    auto step = e.OnAssistantTokens(ids, lps);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    want_tokens.insert(want_tokens.end(), ids.begin(), ids.end());
    want_mask.insert(want_mask.end(), ids.size(), 1);
    want_logprobs.insert(want_logprobs.end(), lps.begin(), lps.end());
    if (k + 1 == turns.size()) {
      EXPECT_TRUE(step->done);
      break;
    }
    ASSERT_FALSE(step->done);
    std::string env_text =
        k == 0 ? "\n" + word + "="
               : "\nerror: unparsable tool call: call to 'oops' is missing </tool>=";
    EXPECT_EQ(step->env_tokens, Encode(env_text, false)) << "turn " << k;
    want_tokens.insert(want_tokens.end(), step->env_tokens.begin(), step->env_tokens.end());
    want_mask.insert(want_mask.end(), step->env_tokens.size(), 0);
    want_logprobs.insert(want_logprobs.end(), step->env_tokens.size(), 0.0f);
  }
  ASSERT_EQ(e.response_tokens().size(), want_tokens.size());
  for (size_t i = 0; i < want_tokens.size(); ++i) {
    EXPECT_EQ(e.response_tokens()[i], want_tokens[i]) << "position " << i;
    EXPECT_EQ(e.loss_mask()[i], want_mask[i]) << "position " << i;
    EXPECT_EQ(e.logprobs()[i], want_logprobs[i]) << "position " << i;
  }
  EXPECT_TRUE(e.done());
  EXPECT_EQ(e.episode().end(), EpisodeEnd::kSubmitted);
  EXPECT_EQ(e.episode().score().reward, 1.0);
  EXPECT_EQ(e.episode().flags().unparsable_calls, 1);
  EXPECT_EQ(e.next_turn_budget(), 0);
  EXPECT_EQ(e.response_text(),
            turns[0] + "\n" + word + "=" + turns[1] +
                "\nerror: unparsable tool call: call to 'oops' is missing </tool>=" + turns[2]);
}

TEST_F(TokenEpisodeTest, DemonstrationRendersToTheSameTokensAsAnEpisode) {
  for (uint64_t i = 0; i < 10; ++i) {
    Prompt p = task_->GetPrompt(Split::kEval, i);
    auto demo = task_->Demonstration(p);
    ASSERT_TRUE(demo.ok());
    auto seq = renderer_->RenderConversation(p.messages, *demo);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    auto ep = TokenEpisode::Start(*task_, p, EpisodeConfig{}, *renderer_);
    ASSERT_TRUE(ep.ok());
    for (const auto& m : *demo) {
      if (m.role != Role::kAssistant) continue;
      std::vector<int32_t> ids = Encode(m.content, true);
      ASSERT_TRUE((*ep)->OnAssistantTokens(ids, std::vector<float>(ids.size(), -1.0f)).ok());
    }
    EXPECT_TRUE((*ep)->done());
    EXPECT_EQ(seq->prompt_tokens, (*ep)->prompt_tokens());
    EXPECT_EQ(seq->response_tokens, (*ep)->response_tokens());
    EXPECT_EQ(seq->loss_mask, (*ep)->loss_mask());
  }
}

TEST_F(TokenEpisodeTest, TokenLimitEndsBeforeEnvironmentTokensOverflow) {
  EpisodeConfig cfg;
  cfg.max_response_tokens = 40;
  cfg.max_turn_tokens = 30;
  auto ep = TokenEpisode::Start(*task_, task_->GetPrompt(Split::kTrain, 0), cfg, *renderer_);
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ((*ep)->next_turn_budget(), 30);
  std::vector<int32_t> ids = Encode("<tool>list</tool>", true);  // 18 tokens
  auto s1 = (*ep)->OnAssistantTokens(ids, std::vector<float>(ids.size(), 0.f));
  ASSERT_TRUE(s1.ok());
  ASSERT_FALSE(s1->done);  // "\nw.txt 3=" (9 tokens) fits: 27 used
  EXPECT_EQ((*ep)->next_turn_budget(), 13);
  ids = Encode("<tool>lis", false);
  auto s2 = (*ep)->OnAssistantTokens(ids, std::vector<float>(ids.size(), 0.f));
  ASSERT_TRUE(s2.ok());
  EXPECT_TRUE(s2->done) << "the error message does not fit in what is left";
  EXPECT_EQ((*ep)->episode().end(), EpisodeEnd::kTokenLimit);
  EXPECT_EQ((*ep)->episode().transcript().back().role, Role::kAssistant)
      << "a tool turn the model never saw is not in the transcript";
  EXPECT_LE((*ep)->response_tokens().size(), 40u);
  EXPECT_EQ((*ep)->response_tokens().size(), (*ep)->loss_mask().size());
}

TEST_F(TokenEpisodeTest, DriverBugsAbortTheEpisodeWithAnError) {
  auto ep =
      TokenEpisode::Start(*task_, task_->GetPrompt(Split::kTrain, 0), EpisodeConfig{}, *renderer_);
  ASSERT_TRUE(ep.ok());
  auto bad = (*ep)->OnAssistantTokens({5, 6}, {0.f});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("2 tokens but 1 log-probs"), std::string::npos);
  EXPECT_EQ((*ep)->episode().end(), EpisodeEnd::kAborted);
  auto ep2 =
      TokenEpisode::Start(*task_, task_->GetPrompt(Split::kTrain, 0), EpisodeConfig{}, *renderer_);
  auto oob = (*ep2)->OnAssistantTokens({100000}, {0.f});
  ASSERT_FALSE(oob.ok());
  EXPECT_NE(oob.status().message().find("outside the vocabulary"), std::string::npos);
  EXPECT_NE((*ep2)->episode().SummaryJson().find("aborted"), std::string::npos);
}

TEST_F(TokenEpisodeTest, PromptsThatCannotBeEncodedAreRejected) {
  auto tiny = engine::CharTokenizer::Create("abc=");
  ASSERT_TRUE(tiny.ok());
  Renderer r(**tiny, ChatFormat::Compact());
  auto ep = TokenEpisode::Start(*task_, task_->GetPrompt(Split::kTrain, 0), EpisodeConfig{}, r);
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("not in the tokenizer alphabet"), std::string::npos);
  // The default single-turn prompt: "<bos>abc=" and "cba<eos>".
  auto full = engine::CharTokenizer::Create(PrintableAlphabet());
  Renderer compact(**full, ChatFormat::Compact());
  auto seq = compact.RenderConversation({{Role::kUser, "abc"}}, {{Role::kAssistant, "cba"}});
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*(*full)->Decode(seq->prompt_tokens, false), "<bos>abc=");
  EXPECT_EQ(*(*full)->Decode(seq->response_tokens, false), "cba<eos>");
  EXPECT_EQ(seq->loss_mask, std::vector<uint8_t>(4, 1));
  Renderer tagged(**full, ChatFormat::Tagged());
  EXPECT_EQ(tagged.PromptText({{Role::kSystem, "s"}, {Role::kUser, "u"}}),
            "<|system|>\ns\n<|user|>\nu\n<|assistant|>\n");
}

}  // namespace
}  // namespace troupe::envs
