// Multi-turn episodes on the real generation engine with a tiny random model:
// many episodes run concurrently, the loss mask is checked token by token, the
// recorded log-probs match a full forward pass, and a long episode never holds
// up short ones.
#include <random>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "../common/test_seed.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/episode_driver.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {
namespace {

uint64_t Seed() {
  return test_support::TestSeed("episode_driver_test");
}

class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = engine::CharTokenizer::Create(PrintableAlphabet());
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(tok).value();
    renderer_ = std::make_unique<Renderer>(*tokenizer_, ChatFormat::Compact());
    engine::EngineConfig ec;
    ec.model.vocab_size = tokenizer_->vocab_size();
    ec.model.d_model = 32;
    ec.model.n_layers = 2;
    ec.model.n_heads = 4;
    ec.model.n_kv_heads = 2;
    ec.model.ffn_dim = 64;
    ec.model.max_seq_len = 192;
    ec.num_slots = 32;
    model_ = std::make_shared<engine::LlamaModel>(ec.model, Seed());
    auto e = engine::Engine::Create(ec, model_);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    TaskConfig tc;
    tc.name = "file_reverse";
    tc.eval_size = 10;
    auto task = MakeTask(tc);
    ASSERT_TRUE(task.ok());
    task_ = std::move(task).value();
    config_.episode.max_turns = 4;
    config_.episode.max_turn_tokens = 24;
    config_.episode.max_response_tokens = 150;
    config_.episode.max_tool_output_chars = 40;
    config_.sampling.temperature = 1.0;
  }
  void TearDown() override { engine_.reset(); }

  std::vector<int32_t> Encode(const std::string& text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok()) << ids.status().ToString();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  // Checks one finished episode token by token against its own transcript
  // and the model: model segments (mask 1) decode to the assistant turns and
  // carry the log-probs of a full forward pass; environment segments (mask 0)
  // are exactly the rendered tool turns with log-prob 0.
  void CheckEpisode(const EpisodeOutcome& o) {
    ASSERT_TRUE(o.status.ok()) << o.status.ToString();
    ASSERT_TRUE(o.episode);
    const TokenEpisode& ep = *o.episode;
    ASSERT_TRUE(ep.done());
    const auto& ids = ep.response_tokens();
    const auto& mask = ep.loss_mask();
    const auto& lps = ep.logprobs();
    ASSERT_EQ(ids.size(), mask.size());
    ASSERT_EQ(ids.size(), lps.size());
    ASSERT_EQ(o.token_versions.size(), ids.size());
    size_t pos = 0;
    const Conversation& t = ep.episode().transcript();
    for (size_t m = 0; m < t.size(); ++m) {
      if (t[m].role == Role::kAssistant) {
        size_t begin = pos;
        while (pos < ids.size() && mask[pos] == 1) ++pos;
        std::vector<int32_t> seg(ids.begin() + begin, ids.begin() + pos);
        auto text = tokenizer_->Decode(seg, /*skip_special=*/true);
        ASSERT_TRUE(text.ok());
        EXPECT_EQ(*text, t[m].content) << "assistant turn " << m;
        for (size_t j = begin; j < pos; ++j) EXPECT_LE(lps[j], 0.f);
        for (size_t j = begin; j + 1 < pos; ++j)
          EXPECT_NE(ids[j], tokenizer_->eos_id()) << "EOS ends a turn";
      } else {
        std::vector<int32_t> want = Encode(renderer_->ToolTurnText(t[m].content));
        ASSERT_LE(pos + want.size(), ids.size());
        for (size_t j = 0; j < want.size(); ++j, ++pos) {
          EXPECT_EQ(ids[pos], want[j]) << "tool turn " << m << " token " << j;
          EXPECT_EQ(mask[pos], 0) << "environment token at " << pos;
          EXPECT_EQ(lps[pos], 0.f);
          EXPECT_EQ(o.token_versions[pos], 0u);
        }
      }
    }
    EXPECT_EQ(pos, ids.size()) << "every response token is accounted for";
    // Behaviour log-probs = log_softmax of one forward pass over the whole sequence.
    c10::InferenceMode guard;
    std::vector<int64_t> seq(ep.prompt_tokens().begin(), ep.prompt_tokens().end());
    seq.insert(seq.end(), ids.begin(), ids.end());
    at::Tensor all = at::tensor(seq).unsqueeze(0);
    at::Tensor logits = model_->Forward(all)[0];
    auto p = static_cast<int64_t>(ep.prompt_tokens().size());
    auto r = static_cast<int64_t>(ids.size());
    at::Tensor want = engine::TokenLogprobs(logits.narrow(0, p - 1, r), all[0].narrow(0, p, r),
                                            config_.sampling.temperature);
    for (int64_t j = 0; j < r; ++j) {
      if (mask[static_cast<size_t>(j)]) {
        EXPECT_NEAR(lps[static_cast<size_t>(j)], want[j].item<float>(), 1e-4) << "position " << j;
      }
    }
  }

  std::unique_ptr<engine::CharTokenizer> tokenizer_;
  std::unique_ptr<Renderer> renderer_;
  std::shared_ptr<engine::LlamaModel> model_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Task> task_;
  EpisodeDriverConfig config_;
};

TEST_F(DriverTest, ManyEpisodesConcurrentlyWithExactMasks) {
  ASSERT_TRUE(config_.Validate().ok());
  EpisodeDriver driver(*engine_, *renderer_, config_);
  std::vector<EpisodeRequest> reqs;
  for (uint64_t g = 0; g < 3; ++g)
    for (uint64_t s = 0; s < 8; ++s)  // GRPO-style groups: 8 episodes per prompt
      reqs.push_back(
          {task_.get(), task_->GetPrompt(Split::kTrain, g), Seed() + g * 8 + s, g * 100 + s, {}});
  auto before = engine_->stats();
  std::vector<EpisodeOutcome> out = driver.Run(reqs, Deadline::InMs(240000));
  auto after = engine_->stats();
  ASSERT_EQ(out.size(), 24u);
  std::set<std::vector<int32_t>> distinct;
  for (size_t i = 0; i < out.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[i].tag, reqs[i].tag);
    CheckEpisode(out[i]);
    EXPECT_NE(out[i].episode->episode().end(), EpisodeEnd::kAborted)
        << out[i].episode->episode().abort_reason();
    distinct.insert(out[i].episode->response_tokens());
  }
  EXPECT_GT(distinct.size(), 20u) << "seeds differ per episode";
  EpisodeDriverStats st = driver.Stats();
  EXPECT_EQ(st.episodes, 24u);
  EXPECT_EQ(st.submitted + st.turn_limit + st.token_limit, 24u);
  EXPECT_GE(st.turns, 24u);
  // Continuous batching: decode steps advanced several episodes at once.
  uint64_t tokens = after.generated_tokens - before.generated_tokens;
  uint64_t steps = after.decode_steps - before.decode_steps;
  EXPECT_GT(tokens, steps) << "tokens " << tokens << " in " << steps << " decode steps";
}

TEST_F(DriverTest, ALongEpisodeDoesNotHoldUpShortOnes) {
  EpisodeDriver driver(*engine_, *renderer_, config_);
  EpisodeConfig shortcfg = config_.episode;
  shortcfg.max_turns = 1;
  shortcfg.max_turn_tokens = 4;
  EpisodeConfig longcfg = config_.episode;
  longcfg.max_turns = 12;
  longcfg.max_turn_tokens = 8;
  longcfg.max_response_tokens = 160;
  std::vector<EpisodeRequest> reqs;
  reqs.push_back({task_.get(), task_->GetPrompt(Split::kTrain, 0), Seed(), 0, longcfg});
  for (uint64_t s = 1; s <= 12; ++s)
    reqs.push_back({task_.get(), task_->GetPrompt(Split::kTrain, s), Seed() + s, s, shortcfg});
  std::vector<size_t> order;
  auto out = driver.Run(reqs, Deadline::InMs(240000), [&](size_t i, const EpisodeOutcome& o) {
    order.push_back(i);
    EXPECT_TRUE(o.episode && o.episode->done());
  });
  ASSERT_EQ(order.size(), 13u);
  const Episode& long_ep = out[0].episode->episode();
  if (long_ep.turns() >= 3) {
    EXPECT_EQ(order.back(), 0u) << "the 12 one-turn episodes were handed back first";
  }
  for (const auto& o : out) CheckEpisode(o);
}

TEST_F(DriverTest, StartFailuresAndDeadlinesAreReported) {
  EpisodeDriver driver(*engine_, *renderer_, config_);
  TaskConfig single;
  single.name = "reverse";
  auto reverse = MakeTask(single);
  ASSERT_TRUE(reverse.ok());
  std::vector<EpisodeRequest> reqs = {
      {task_.get(), task_->GetPrompt(Split::kTrain, 0), 1, 1, {}},
      {reverse->get(), (*reverse)->GetPrompt(Split::kTrain, 0), 2, 2, {}},
      {nullptr, Prompt{}, 3, 3, {}}};
  auto out = driver.Run(reqs, Deadline::InMs(240000));
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_NE(out[1].status.message().find("single-turn"), std::string::npos)
      << out[1].status.ToString();
  EXPECT_FALSE(out[2].status.ok());
  EXPECT_EQ(driver.Stats().start_failures, 2u);
  // An expired deadline aborts what is still running; late engine results are discarded.
  std::vector<EpisodeRequest> more;
  for (uint64_t s = 0; s < 6; ++s)
    more.push_back({task_.get(), task_->GetPrompt(Split::kTrain, s), s, s, {}});
  auto late = driver.Run(more, Deadline::Now());
  for (const auto& o : late) {
    ASSERT_TRUE(o.episode);
    EXPECT_TRUE(o.episode->done());
    EXPECT_EQ(o.episode->episode().end(), EpisodeEnd::kAborted);
    EXPECT_EQ(o.episode->episode().abort_reason(), "deadline passed");
  }
}

TEST_F(DriverTest, CancelEndsARunningRunAndEveryLaterOne) {
  EpisodeDriver driver(*engine_, *renderer_, config_);
  std::vector<EpisodeRequest> reqs;
  for (uint64_t s = 0; s < 6; ++s)
    reqs.push_back({task_.get(), task_->GetPrompt(Split::kTrain, s), Seed() + s, s, {}});
  const uint64_t before = engine_->stats().requests;
  std::vector<EpisodeOutcome> out;
  std::thread runner([&] { out = driver.Run(reqs, Deadline::InMs(240000)); });
  // Cancel once the Run has handed turns to the engine (bounded poll of another thread's state).
  auto until = Deadline::InMs(60000);
  while (engine_->stats().requests == before && !until.expired()) std::this_thread::yield();
  driver.Cancel();
  runner.join();
  ASSERT_EQ(out.size(), reqs.size());
  for (const auto& o : out) {
    ASSERT_TRUE(o.episode);
    EXPECT_TRUE(o.episode->done());
    if (o.episode->episode().end() == EpisodeEnd::kAborted) {
      EXPECT_EQ(o.episode->episode().abort_reason(), "cancelled");
    }
  }
  // Sticky: a later Run aborts at once and gives the engine no work.
  const uint64_t after = engine_->stats().requests;
  auto again = driver.Run(reqs, Deadline::InMs(240000));
  for (const auto& o : again) {
    ASSERT_TRUE(o.episode);
    EXPECT_EQ(o.episode->episode().end(), EpisodeEnd::kAborted);
    EXPECT_EQ(o.episode->episode().abort_reason(), "cancelled");
  }
  EXPECT_EQ(engine_->stats().requests, after);
  // TearDown destroys the engine while cancelled turns may still be decoding:
  // their late results go to the abandoned inbox.
}

}  // namespace
}  // namespace troupe::envs
