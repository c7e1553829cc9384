// Torch-free parts of the engine: ModelConfig, EngineConfig, SamplingParams, CharTokenizer.
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
  ExpectError(with([](ModelConfig& m) { m.architecture = "gpt2"; }), "model.architecture 'gpt2'");
  ExpectError(with([](ModelConfig& m) { m.architecture = "qwen2"; }), "model.attention_bias");
  ExpectError(with([](ModelConfig& m) { m.rope_scaling.type = "yarn"; }),
              "model.rope_scaling.type 'yarn'");
  ExpectError(with([](ModelConfig& m) {
                m.rope_scaling.type = "llama3";
                m.rope_scaling.factor = 0.5;
              }),
              "model.rope_scaling.factor");
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
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->d_model, 896);
  EXPECT_EQ(c->HeadDim(), 64);
  EXPECT_EQ(c->n_kv_heads, 2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->QkNorm());
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_seq_len, 1024);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->dtype, DType::kBFloat16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  ExpectError(ModelConfigFromHfJson("{").status(), "not a JSON object");
  ExpectError(ModelConfigFromHfJson(R"({"vocab_size":10})").status(), "missing model_type");
  ExpectError(ModelConfigFromHfJson(R"({"model_type":"llama","vocab_size":10})").status(),
              "missing required key 'hidden_size'");
  ExpectError(ModelConfigFromHfJson(R"({"model_type":"llama","vocab_size":"10"})").status(),
              "'vocab_size' must be an integer");
  auto with = [&](const std::string& extra) {
    std::string j = qwen;
    j.insert(1, extra + ",");
    return ModelConfigFromHfJson(j).status();
  };
  ExpectError(with(R"("rope_scaling":{"type":"yarn","factor":4})"), "rope_type 'yarn'");
  std::string gelu = std::string(qwen);
  gelu.replace(gelu.find("\"silu\""), 6, "\"gelu\"");
  ExpectError(ModelConfigFromHfJson(gelu).status(), "hidden_act \"gelu\"");
}

// Real configs of the three families, as published.
constexpr const char* kQwen3 = R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,
  "attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151645,"head_dim":128,
  "hidden_act":"silu","hidden_size":1024,"initializer_range":0.02,"intermediate_size":3072,
  "max_position_embeddings":40960,"max_window_layers":28,"model_type":"qwen3",
  "num_attention_heads":16,"num_hidden_layers":28,"num_key_value_heads":8,"rms_norm_eps":1e-06,
  "rope_scaling":null,"rope_theta":1000000,"sliding_window":null,"tie_word_embeddings":true,
  "torch_dtype":"bfloat16","transformers_version":"4.51.0","use_cache":true,
  "use_sliding_window":false,"vocab_size":151936})";
constexpr const char* kLlama32 = R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,
  "attention_dropout":0.0,"bos_token_id":128000,"eos_token_id":128001,"head_dim":64,
  "hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,"intermediate_size":8192,
  "max_position_embeddings":131072,"mlp_bias":false,"model_type":"llama","num_attention_heads":32,
  "num_hidden_layers":16,"num_key_value_heads":8,"pretraining_tp":1,"rms_norm_eps":1e-05,
  "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
  "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,
  "tie_word_embeddings":true,"torch_dtype":"bfloat16","transformers_version":"4.45.0.dev0",
  "use_cache":true,"vocab_size":128256})";

TEST(ModelConfigTest, RealQwen3AndLlama32Configs) {
  auto q = ModelConfigFromHfJson(kQwen3, 512);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->architecture, "qwen3");
  EXPECT_TRUE(q->QkNorm());
  EXPECT_FALSE(q->attention_bias);
  EXPECT_EQ(q->HeadDim(), 128);
  EXPECT_EQ(q->n_heads * q->HeadDim(), 2048);  // != hidden_size
  EXPECT_EQ(q->max_seq_len, 512);
  EXPECT_EQ(q->NumParameters(),
            151936LL * 1024 + 28LL * (1024 * (2048 + 2 * 1024) + 2048 * 1024 + 3 * 1024 * 3072 +
                                      2 * 1024 + 2 * 128) +
                1024);  // Qwen3-0.6B: 596M parameters
  auto l = ModelConfigFromHfJson(kLlama32, 256);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->architecture, "llama");
  EXPECT_EQ(l->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(l->rope_scaling.factor, 32.0);
  EXPECT_EQ(l->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(l->rms_norm_eps, 1e-5);

  // Llama 3.1's scaling: high frequencies kept, low ones divided by the factor, the band
  // between blended (wavelengths against 8192 / 4 = 2048 and 8192 / 1 positions).
  const std::vector<double> inv = l->RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), 32u);
  for (size_t i = 0; i < inv.size(); ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) / 64);
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 2048) {
      EXPECT_DOUBLE_EQ(inv[i], f) << i;
    } else if (wavelen > 8192) {
      EXPECT_DOUBLE_EQ(inv[i], f / 32) << i;
    } else {
      EXPECT_LT(inv[i], f) << i;
      EXPECT_GT(inv[i], f / 32) << i;
    }
  }
  ModelConfig plain = *l;
  plain.rope_scaling = RopeScaling{};
  EXPECT_NE(plain.RopeInverseFrequencies(), inv);
}

TEST(ModelConfigTest, RefusesWhatItDoesNotImplementByName) {
  auto with = [](std::string json, const std::string& key, const std::string& value) {
    // Replaces (or adds) one top-level key of the Qwen3 config.
    auto j = nlohmann::json::parse(json);
    if (value.empty())
      j.erase(key);
    else
      j[key] = nlohmann::json::parse(value);
    return ModelConfigFromHfJson(j.dump()).status();
  };
  ExpectError(with(kQwen3, "quantization_config", R"({"quant_method":"gptq"})"),
              "key 'quantization_config' is not supported");
  ExpectError(with(kQwen3, "partial_rotary_factor", "0.5"), "key 'partial_rotary_factor'");
  ExpectError(with(kQwen3, "model_type", R"("mistral")"), "model_type 'mistral'");
  ExpectError(with(kQwen3, "architectures", R"(["LlamaForCausalLM"])"),
              "does not match model_type 'qwen3'");
  ExpectError(with(kQwen3, "use_sliding_window", "true"), "use_sliding_window=true");
  ExpectError(with(kQwen3, "attention_dropout", "0.1"), "attention_dropout = 0.1");
  ExpectError(with(kQwen3, "layer_types", R"(["full_attention","sliding_attention"])"),
              "layer_types[1]");
  ExpectError(with(kLlama32, "mlp_bias", "true"), "mlp_bias=true");
  ExpectError(with(kLlama32, "rope_scaling", R"({"rope_type":"linear","factor":2})"),
              "rope_type 'linear'");
  ExpectError(with(kLlama32, "rope_scaling",
                   R"({"rope_type":"llama3","factor":32,"low_freq_factor":1,
                       "high_freq_factor":4,"original_max_position_embeddings":8192,"beta":2})"),
              "rope_scaling.beta");
  ExpectError(with(kLlama32, "rope_scaling", R"({"rope_type":"llama3","factor":32})"),
              "missing required key 'low_freq_factor'");
  ExpectError(with(kLlama32, "rope_scaling",
                   R"({"rope_type":"llama3","factor":32,"low_freq_factor":4,
                       "high_freq_factor":1,"original_max_position_embeddings":8192})"),
              "high_freq_factor");
  ExpectError(with(kLlama32, "torch_dtype", R"("float8")"), "unknown dtype 'float8'");
  auto qwen2 = nlohmann::json::parse(kQwen3);
  qwen2["model_type"] = "qwen2";
  qwen2["architectures"] = {"Qwen2ForCausalLM"};
  ExpectError(ModelConfigFromHfJson(qwen2.dump()).status(),
              "attention_bias=false with model_type qwen2");
  // Informational keys are accepted; transformers >= 4.5x's rope_parameters too.
  auto newer = nlohmann::json::parse(kLlama32);
  newer["rope_parameters"] = newer["rope_scaling"];
  newer["rope_parameters"]["rope_theta"] = 500000.0;
  newer.erase("rope_scaling");
  newer.erase("rope_theta");
  newer["dtype"] = newer["torch_dtype"];
  newer.erase("torch_dtype");
  auto n = ModelConfigFromHfJson(newer.dump());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(n->rope_theta, 500000.0);
}

TEST(ModelConfigTest, WritesAConfigThatReadsBackAsTheSameModel) {
  for (const char* src : {kQwen3, kLlama32}) {
    auto c = ModelConfigFromHfJson(src, 300);
    ASSERT_TRUE(c.ok());
    auto text = ModelConfigToHfJson(*c, src, DType::kFloat32);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    auto j = nlohmann::json::parse(*text);
    EXPECT_EQ(j["torch_dtype"], "float32");
    EXPECT_EQ(j["max_position_embeddings"], c->max_position_embeddings);  // not the 300 cap
    EXPECT_EQ(j["transformers_version"], nlohmann::json::parse(src)["transformers_version"]);
    auto back = ModelConfigFromHfJson(*text, 300);
    ASSERT_TRUE(back.ok());
    ModelConfig want = *c;
    want.dtype = DType::kFloat32;
    EXPECT_EQ(back->ToString(), want.ToString());
  }
  // Without a base: a fresh Qwen3-architecture model names its EOS.
  ModelConfig m;
  m.architecture = "qwen3";
  m.head_dim = 16;
  auto text = ModelConfigToHfJson(m, "", DType::kFloat32, -1, {151645});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j["eos_token_id"], 151645);
  EXPECT_FALSE(j.contains("bos_token_id"));
  ModelConfig bad;
  bad.architecture = "qwen2";
  ExpectError(ModelConfigToHfJson(bad, "", DType::kFloat32).status(), "attention_bias");
  ExpectError(ModelConfigToHfJson(m, "[1]", DType::kFloat32).status(), "not a JSON object");
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
