// Torch-free parts of the engine: ModelConfig, EngineConfig, SamplingParams, CharTokenizer.
#include <gtest/gtest.h>

#include "troupe/engine/engine_config.h"
#include "troupe/engine/model_config.h"
#include "troupe/engine/tokenizer.h"

namespace troupe::engine {
namespace {

void ExpectError(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(ModelConfigTest, DefaultsAreValidAndErrorsNameTheField) {
  ModelConfig c;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
  EXPECT_EQ(c.HeadDim(), 32);
  auto with = [](auto mutate) {
    ModelConfig m;
    mutate(m);
    return m.Validate();
  };
  ExpectError(with([](ModelConfig& m) { m.vocab_size = 0; }), "model.vocab_size = 0");
  ExpectError(with([](ModelConfig& m) { m.d_model = 130; }),
              "model.d_model = 130 must be divisible");
  ExpectError(with([](ModelConfig& m) { m.n_kv_heads = 3; }),
              "model.n_heads = 4 must be divisible by model.n_kv_heads = 3");
  ExpectError(with([](ModelConfig& m) { m.head_dim = 7; }), "must be even");
  ExpectError(with([](ModelConfig& m) { m.rope_theta = 0.5; }), "model.rope_theta");
  ExpectError(with([](ModelConfig& m) { m.rms_norm_eps = 0; }), "model.rms_norm_eps");
  ExpectError(with([](ModelConfig& m) { m.max_seq_len = -1; }), "model.max_seq_len = -1");
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  ExpectError(ParseDType("int8").status(), "unknown dtype 'int8'");
}

TEST(ModelConfigTest, FromHuggingFaceJson) {
  const char* qwen = R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":896,
    "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,
    "intermediate_size":4864,"max_position_embeddings":32768,"rope_theta":1000000.0,
    "rms_norm_eps":1e-06,"tie_word_embeddings":true,"torch_dtype":"bfloat16","hidden_act":"silu"})";
  auto c = ModelConfigFromHfJson(qwen, 1024);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->d_model, 896);
  EXPECT_EQ(c->HeadDim(), 64);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_seq_len, 1024);
  EXPECT_EQ(c->dtype, DType::kBFloat16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  ExpectError(ModelConfigFromHfJson("{").status(), "not a JSON object");
  ExpectError(ModelConfigFromHfJson(R"({"vocab_size":10})").status(),
              "missing required key 'hidden_size'");
  ExpectError(ModelConfigFromHfJson(R"({"vocab_size":"10"})").status(),
              "'vocab_size' must be an integer");
  std::string scaled = std::string(qwen);
  scaled.insert(1, R"("rope_scaling":{"type":"yarn"},)");
  ExpectError(ModelConfigFromHfJson(scaled).status(), "rope_scaling");
  std::string gelu = std::string(qwen);
  gelu.replace(gelu.find("\"silu\""), 6, "\"gelu\"");
  ExpectError(ModelConfigFromHfJson(gelu).status(), "hidden_act 'gelu'");
}

TEST(EngineConfigTest, Validation) {
  EngineConfig e;
  ASSERT_TRUE(e.Validate().ok()) << e.Validate().message();
  EXPECT_EQ(e.CacheLen(), 128);
  e.max_seq_len = 200;
  ExpectError(e.Validate(), "engine.max_seq_len = 200");
  e = EngineConfig();
  e.num_slots = 0;
  ExpectError(e.Validate(), "engine.num_slots = 0");
  e = EngineConfig();
  e.device = "tpu";
  ExpectError(e.Validate(), "engine.device = 'tpu'");
  e = EngineConfig();
  e.model.n_layers = 0;
  ExpectError(e.Validate(), "model.n_layers = 0");

  SamplingParams s;
  ASSERT_TRUE(s.Validate().ok());
  s.temperature = -1;
  ExpectError(s.Validate(), "sampling.temperature = -1");
  s = SamplingParams();
  s.top_p = 0;
  ExpectError(s.Validate(), "sampling.top_p = 0");
  s = SamplingParams();
  s.max_new_tokens = 0;
  ExpectError(s.Validate(), "sampling.max_new_tokens = 0");
  s = SamplingParams();
  s.num_samples = 0;
  ExpectError(s.Validate(), "sampling.num_samples = 0");
  s = SamplingParams();
  s.top_k = -2;
  ExpectError(s.Validate(), "sampling.top_k = -2");
}

TEST(CharTokenizerTest, EncodeDecodeAndSpecials) {
  auto tok = CharTokenizer::Create("abc xyz");
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 10);
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  auto ids = t.Encode("cab z", true, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 5, 3, 4, 6, 9, 2}));
  EXPECT_EQ(*t.Decode(*ids), "cab z");
  EXPECT_EQ(*t.Decode(*ids, false), "<bos>cab z<eos>");
  EXPECT_EQ(*t.IdToPiece(0), "<pad>");
  EXPECT_EQ(*t.IdToPiece(7), "x");
  EXPECT_TRUE(t.IsSpecial(2));
  EXPECT_FALSE(t.IsSpecial(3));
  ExpectError(t.Encode("abq").status(),
              "character 'q' at byte offset 2 is not in the tokenizer alphabet");
  ExpectError(t.Encode("a\n").status(), "\\x0a at byte offset 1");
  ExpectError(t.Decode({3, 10}).status(),
              "token id 10 at position 1 is outside the vocabulary [0, 10)");
  ExpectError(t.Decode({-1}).status(), "token id -1");
  ExpectError(t.IdToPiece(99).status(), "token id 99");
  ExpectError(CharTokenizer::Create("").status(), "empty");
  ExpectError(CharTokenizer::Create("abca").status(), "repeats byte 'a' (at offset 3)");
}

}  // namespace
}  // namespace troupe::engine
