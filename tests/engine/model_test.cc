// LlamaModel, KV-cache forward paths, the behaviour log-prob, and safetensors I/O.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "troupe/engine/logprob.h"
#include "troupe/engine/memory.h"
#include "troupe/engine/model.h"
#include "troupe/engine/safetensors.h"

namespace troupe::engine {
namespace {

using testing::TempDir;
using testing::TestSeed;
using testing::TinyConfig;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

at::Tensor RandomIds(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::kLong);
}

TEST(ModelTest, ForwardShapesAndGradients) {
  auto model = std::make_shared<LlamaModel>(TinyConfig(), TestSeed());
  at::Tensor ids = RandomIds(3, 7, 23, TestSeed());
  at::Tensor logits = model->Forward(ids);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 7, 23}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  at::Tensor loss = TokenLogprobs(logits, ids, 1.0).mean();
  loss.backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
  }
}

// ForwardHiddenRows (the learner's path: padding dropped, fused RMSNorm / RoPE + attention /
// SiLU * up kernels, the last layer's tail at the asked rows only) against ForwardHidden of the
// padded batch: the same hidden states and the same gradient of every parameter. The weights
// are random with a large std, and LoRA adapters are non-zero, so that a wrong term shows.
void ExpectRowsPathMatches(ModelConfig c, const char* what) {
  SCOPED_TRACE(what);
  auto model = std::make_shared<LlamaModel>(c, TestSeed(), torch::kCPU);
  {
    torch::NoGradGuard g;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(TestSeed() + 7);
    for (auto& p : model->parameters()) {
      if (p.dim() == 1) {
        p.copy_(1.0 + 0.3 * at::randn(p.sizes(), gen, at::kFloat).to(p.scalar_type()));
      } else {
        p.copy_(0.3 * at::randn(p.sizes(), gen, at::kFloat).to(p.scalar_type()));
      }
    }
  }
  const int64_t B = 5, T = 13;
  at::Tensor ids = RandomIds(B, T, c.vocab_size, TestSeed() + 3);
  const std::vector<int64_t> len = {13, 4, 9, 1, 12};
  at::Tensor lengths = at::tensor(len, at::kLong);
  // Padding holds other tokens than in the reference's batch: the rows path must not read it.
  at::Tensor ids_garbage = ids.clone();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = len[b]; t < T; ++t) ids_garbage[b][t] = (t * 5 + b) % c.vocab_size;
    for (int64_t t = 0; t < len[b]; ++t)
      if ((t + b) % 3 != 0 || t + 1 == len[b]) rows.push_back(b * T + t);  // a subset
  }
  std::swap(rows[0], rows[rows.size() - 1]);  // any order
  at::Tensor rows_t = at::tensor(rows, at::kLong);
  at::Tensor weight =
      at::randn({static_cast<int64_t>(rows.size()), c.d_model},
                at::make_generator<at::CPUGeneratorImpl>(TestSeed() + 5), at::kFloat);

  auto grads_of = [&](const at::Tensor& hidden) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    (hidden.to(at::kFloat) * weight).sum().backward();
    std::vector<at::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : p.grad());
    return g;
  };
  at::Tensor ref = model->ForwardHidden(ids).reshape({B * T, c.d_model}).index_select(0, rows_t);
  const std::vector<at::Tensor> ref_grads = grads_of(ref);
  at::Tensor got = model->ForwardHiddenRows(ids_garbage, lengths, rows_t);
  ASSERT_EQ(got.sizes(), ref.sizes());
  const double tol = c.dtype == DType::kFloat32 ? 2e-5 : 2e-2;
  EXPECT_TRUE(at::allclose(got.to(at::kFloat), ref.to(at::kFloat), tol, tol))
      << "max diff " << (got.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<float>();
  const std::vector<at::Tensor> got_grads = grads_of(got);
  const auto params = model->named_parameters();
  ASSERT_EQ(got_grads.size(), ref_grads.size());
  int64_t checked = 0;
  for (size_t i = 0; i < got_grads.size(); ++i) {
    const std::string& name = params[i].key();
    ASSERT_EQ(got_grads[i].defined(), ref_grads[i].defined()) << name;
    if (!ref_grads[i].defined()) continue;
    const at::Tensor a = got_grads[i].to(at::kFloat), b = ref_grads[i].to(at::kFloat);
    const double scale = std::max(1.0, b.abs().max().item<double>());
    EXPECT_LE((a - b).abs().max().item<double>(), 10 * tol * scale) << name;
    EXPECT_GT(b.abs().sum().item<double>(), 0.0) << name << ": a gradient the test cannot check";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(ModelTest, ForwardHiddenRowsMatchesForwardHiddenInValuesAndGradients) {
  ModelConfig c = TinyConfig();  // GQA (4 query heads on 2 KV heads), untied head
  ExpectRowsPathMatches(c, "gqa, untied");
  c.n_kv_heads = 4;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  ExpectRowsPathMatches(c, "mha, tied, q/k/v biases");
  c = TinyConfig();
  c.n_layers = 1;
  ExpectRowsPathMatches(c, "one layer");
  c = TinyConfig();
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"};
  ExpectRowsPathMatches(c, "lora on every module (base frozen)");
  // The module path stands in where the kernels do not apply: the same contract.
  c = TinyConfig();
  c.architecture = "qwen3";
  ExpectRowsPathMatches(c, "qwen3 q/k norms (module path)");
  c = TinyConfig();
  c.dtype = DType::kBFloat16;
  ExpectRowsPathMatches(c, "bfloat16 (module path)");
}

TEST(ModelTest, ForwardHiddenRowsNamesBadArguments) {
  auto model = std::make_shared<LlamaModel>(TinyConfig(), TestSeed());
  at::Tensor ids = RandomIds(2, 6, 23, TestSeed());
  auto message = [&](const at::Tensor& lengths, const at::Tensor& rows) -> std::string {
    try {
      model->ForwardHiddenRows(ids, lengths, rows);
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  const at::Tensor ok_len = at::tensor(std::vector<int64_t>{6, 3}, at::kLong);
  EXPECT_NE(message(ok_len, at::tensor(std::vector<int64_t>{0, 9}, at::kLong)).find("position 9"),
            std::string::npos);  // row 1's position 3 is padding (length 3)
  EXPECT_NE(message(ok_len, at::tensor(std::vector<int64_t>{12}, at::kLong)).find("position 12"),
            std::string::npos);
  EXPECT_NE(message(at::tensor(std::vector<int64_t>{6, 0}, at::kLong),
                    at::tensor(std::vector<int64_t>{0}, at::kLong))
                .find("length 0 of row 1"),
            std::string::npos);
  EXPECT_NE(message(at::tensor(std::vector<int64_t>{6}, at::kLong),
                    at::tensor(std::vector<int64_t>{0}, at::kLong))
                .find("lengths [2]"),
            std::string::npos);
  EXPECT_EQ(message(ok_len, at::tensor(std::vector<int64_t>{0, 8}, at::kLong)), "");
}

TEST(ModelTest, CausalAndPaddingIndependent) {
  // Right padding never changes the logits of earlier positions.
  auto model = std::make_shared<LlamaModel>(TinyConfig(), TestSeed());
  c10::InferenceMode guard;
  at::Tensor ids = RandomIds(1, 9, 23, TestSeed() + 1);
  at::Tensor full = model->Forward(ids);
  at::Tensor prefix = model->Forward(ids.narrow(1, 0, 5));
  EXPECT_TRUE(at::allclose(full.narrow(1, 0, 5), prefix, 1e-5, 1e-5));
}

TEST(ModelTest, SameSeedSameWeights) {
  LlamaModel a(TinyConfig(), 42), b(TinyConfig(), 42), c(TinyConfig(), 43);
  auto wa = a.NamedWeights(), wb = b.NamedWeights(), wc = c.NamedWeights();
  ASSERT_EQ(wa.size(), wb.size());
  bool any_diff = false;
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
    any_diff |= !at::equal(wa[i].second, wc[i].second);
  }
  EXPECT_TRUE(any_diff);
}

TEST(ModelTest, NamedWeightsUseHuggingFaceNames) {
  ModelConfig c = TinyConfig();
  LlamaModel untied(c);
  auto w = untied.NamedWeights();
  ASSERT_EQ(w.size(), 1 + 2 * 9 + 1 + 1u);
  EXPECT_EQ(w[0].first, "model.embed_tokens.weight");
  EXPECT_EQ(w[1].first, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(w[2].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(w[2].second.sizes(), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(w[3].first, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(w[3].second.sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(w[5].first, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(w[7].first, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(w[7].second.sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(w[9].first, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(w[w.size() - 2].first, "model.norm.weight");
  EXPECT_EQ(w.back().first, "lm_head.weight");
  int64_t numel = 0;
  for (auto& [n, t] : w) {
    EXPECT_TRUE(t.is_contiguous()) << n;
    numel += t.numel();
  }
  EXPECT_EQ(numel, c.NumParameters());

  c.tie_word_embeddings = true;
  c.attention_bias = true;
  LlamaModel tied(c);
  auto wt = tied.NamedWeights();
  EXPECT_EQ(wt.back().first, "model.norm.weight");
  EXPECT_EQ(wt[5].first, "model.layers.0.self_attn.q_proj.bias");
  numel = 0;
  for (auto& [n, t] : wt) numel += t.numel();
  EXPECT_EQ(numel, c.NumParameters());
}

TEST(ModelTest, LoadNamedRejectsMismatchesAndChangesNothing) {
  LlamaModel model(TinyConfig(), 1);
  LlamaModel other(TinyConfig(), 2);
  const at::Tensor before = model.NamedWeights()[0].second.clone();
  auto expect_error = [&](NamedTensors named, const std::string& needle, LoadOptions o = {}) {
    Status st = model.LoadNamed(named, o);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_TRUE(at::equal(model.NamedWeights()[0].second, before));
  };
  NamedTensors good = other.NamedWeights();

  NamedTensors unknown = good;
  unknown.insert(unknown.begin() + 3, {"model.layers.9.mlp.up_proj.weight", at::zeros({48, 32})});
  expect_error(unknown, "unexpected tensor 'model.layers.9.mlp.up_proj.weight'");

  NamedTensors bad_shape = good;
  bad_shape[4].second = at::zeros({16, 31});
  expect_error(bad_shape,
               "tensor 'model.layers.0.self_attn.v_proj.weight' has shape [16, 31], "
               "the model expects [16, 32]");

  NamedTensors bad_dtype = good;
  bad_dtype[1].second = at::ones({32}, at::kInt);
  expect_error(bad_dtype, "has dtype Int, the model expects Float");

  NamedTensors cast = good;
  cast[1].second = cast[1].second.to(at::kBFloat16);
  LoadOptions exact;
  exact.allow_dtype_cast = false;
  expect_error(cast, "has dtype BFloat16", exact);

  NamedTensors missing = good;
  missing.erase(missing.begin() + 6);
  expect_error(missing, "tensor 'model.layers.0.post_attention_layernorm.weight' is missing");

  NamedTensors dup = good;
  dup.push_back(good[2]);
  expect_error(dup, "given twice");

  NamedTensors nan = good;
  nan[0].second = nan[0].second.clone();
  nan[0].second[0][0] = std::nanf("");
  LoadOptions finite;
  finite.check_finite = true;
  expect_error(nan, "NaN or Inf", finite);

  ModelConfig tied_cfg = TinyConfig();
  tied_cfg.tie_word_embeddings = true;
  LlamaModel tied(tied_cfg);
  Status st = tied.LoadNamed(good);
  EXPECT_NE(st.message().find("tie_word_embeddings"), std::string::npos) << st.message();

  // A good load copies every value, including into the fused q/k/v storage.
  ASSERT_TRUE(model.LoadNamed(good).ok());
  c10::InferenceMode guard;
  at::Tensor ids = RandomIds(2, 5, 23, TestSeed());
  EXPECT_TRUE(at::equal(model.Forward(ids), other.Forward(ids)));
  // Partial updates are allowed on request.
  LoadOptions partial;
  partial.require_all = false;
  EXPECT_TRUE(model.LoadNamed({good[3]}, partial).ok());
}

TEST(ModelTest, CheckTokensNamesTheProblem) {
  LlamaModel model(TinyConfig());
  EXPECT_TRUE(model.CheckTokens(at::tensor({1, 2, 3})).ok());
  Status st = model.CheckTokens(at::tensor({1, 2, 3, 4, 23, 0}).view({2, 3}));
  EXPECT_NE(st.message().find("token id 23 at row 1 position 1"), std::string::npos)
      << st.message();
  EXPECT_FALSE(model.CheckTokens(at::zeros({2, 49}, at::kLong)).ok());
  EXPECT_FALSE(model.CheckTokens(at::zeros({2, 3}, at::kFloat)).ok());
  EXPECT_FALSE(model.CheckTokens(at::zeros({1, 2, 3}, at::kLong)).ok());
}

// A CPU cache of 1 MiB or more per tensor sits on 2 MiB-aligned memory (transparent huge
// pages, memory.h), zeroed, with the documented shape; a small one is plain torch memory.
TEST(KvCacheTest, LargeCpuCachesAreOnHugePageAlignedZeroedMemory) {
  ModelConfig c = TinyConfig();
  const int64_t row_bytes = c.n_kv_heads * 32 * c.HeadDim() * 4;  // float32, 32 positions
  const int64_t slots = 2 * ((int64_t{1} << 20) / row_bytes + 1);
  KvCache big(c, slots, 32, torch::kCPU);
  ASSERT_EQ(big.num_layers(), c.n_layers);
  for (int64_t l = 0; l < big.num_layers(); ++l) {
    for (at::Tensor* t : {&big.k(l), &big.v(l)}) {
      EXPECT_EQ(t->sizes(), at::IntArrayRef({slots, c.n_kv_heads, 32, c.HeadDim()}));
      EXPECT_GE(t->nbytes(), size_t{1} << 20);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data_ptr()) % kHugePageBytes, 0u) << "layer " << l;
      EXPECT_EQ(t->abs().max().item<float>(), 0.f);
    }
  }
  EXPECT_EQ(big.bytes(), 2 * c.n_layers * slots * row_bytes);
  KvCache small(c, 2, 32, torch::kCPU);
  EXPECT_EQ(small.k(0).abs().max().item<float>(), 0.f);
}

// Incremental decoding through the cache (both kernels) reproduces Forward's logits.
void CheckCachedMatchesForward(bool fused, DType dtype, double tol) {
  ModelConfig c = TinyConfig();
  c.dtype = dtype;
  auto model = std::make_shared<LlamaModel>(c, TestSeed());
  c10::InferenceMode guard;
  const int64_t S = 4, T = 20;
  at::Tensor ids = RandomIds(S, T, c.vocab_size, TestSeed() + 7);
  at::Tensor full = model->Forward(ids);
  KvCache cache(c, 6, 32, torch::kCPU);
  // Mixed prompt lengths, prefilled into slots 0..3 in one padded batch.
  std::vector<int64_t> lens = {3, 7, 1, 5};
  at::Tensor lengths = at::tensor(lens);
  at::Tensor slots = at::arange(S);
  at::Tensor logits = model->Prefill(ids.narrow(1, 0, 7), lengths, slots, cache);
  for (int64_t s = 0; s < S; ++s)
    EXPECT_TRUE(at::allclose(logits[s], full[s][lens[s] - 1], tol, tol)) << "prefill row " << s;
  // Decode every row up to T-1, each at its own position.
  std::vector<int64_t> pos = lens;
  for (int step = 0; step < 12; ++step) {
    at::Tensor toks = at::empty({S}, at::kLong), p = at::tensor(pos);
    int64_t attn_len = 0;
    for (int64_t s = 0; s < S; ++s) {
      toks[s] = ids[s][pos[s]];
      attn_len = std::max(attn_len, pos[s] + 1);
    }
    at::Tensor out = model->Decode(toks, p, attn_len, cache, fused);
    for (int64_t s = 0; s < S; ++s) {
      EXPECT_TRUE(at::allclose(out[s], full[s][pos[s]], tol, tol))
          << "decode row " << s << " pos " << pos[s] << " max diff "
          << (out[s] - full[s][pos[s]]).abs().max().item<float>();
      ++pos[s];
    }
  }
}

TEST(ModelTest, CachedDecodeMatchesForwardFusedFp32) {
  CheckCachedMatchesForward(true, DType::kFloat32, 1e-4);
}
TEST(ModelTest, CachedDecodeMatchesForwardGenericFp32) {
  CheckCachedMatchesForward(false, DType::kFloat32, 1e-4);
}
TEST(ModelTest, CachedDecodeMatchesForwardFusedBf16) {
  CheckCachedMatchesForward(true, DType::kBFloat16, 0.1);
}

TEST(LogprobTest, DefinitionAndTemperature) {
  at::Tensor logits = at::tensor({1.0f, 2.0f, 3.0f, 0.5f, -1.0f, 0.0f}).view({2, 3});
  at::Tensor targets = at::tensor({2, 0});
  at::Tensor lp = TokenLogprobs(logits, targets, 0.5);
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int j = 0; j < 3; ++j) z += std::exp(logits[r][j].item<double>() / 0.5);
    double want = logits[r][targets[r].item<int64_t>()].item<double>() / 0.5 - std::log(z);
    EXPECT_NEAR(lp[r].item<double>(), want, 1e-6);
  }
  // Greedy (temperature 0) records the temperature-1 log-prob.
  EXPECT_TRUE(
      at::allclose(TokenLogprobs(logits, targets, 0.0), TokenLogprobs(logits, targets, 1.0)));
  // Per-row temperature tensor matches the scalar form exactly.
  at::Tensor per_row = ScaledLogSoftmax(logits, at::full({2, 1}, 0.5f));
  EXPECT_TRUE(at::equal(per_row, ScaledLogSoftmax(logits, 0.5)));
  // Differentiable; bf16 logits are computed in float32.
  at::Tensor x = logits.clone().requires_grad_(true);
  TokenLogprobs(x, targets, 0.7).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_EQ(TokenLogprobs(logits.to(at::kBFloat16), targets, 1.0).scalar_type(), at::kFloat);
}

// ------------------------------------------------------------------ safetensors

TEST(SafetensorsTest, RoundTripAllDtypes) {
  TempDir dir;
  NamedTensors in = {
      {"a.f32", at::randn({3, 4})},
      {"b.bf16", at::randn({5}).to(at::kBFloat16)},
      {"c.f16", at::randn({2, 2}).to(at::kHalf)},
      {"d.f64", at::randn({1}).to(at::kDouble)},
      {"e.i64", at::arange(6).view({2, 3})},
      {"f.i32", at::arange(3).to(at::kInt)},
      {"g.u8", at::arange(5).to(at::kByte)},
      {"h.bool", at::tensor({1, 0, 1}).to(at::kBool)},
      {"i.empty", at::empty({0, 3})},
      {"j.noncontig", at::randn({4, 3}).t()},
  };
  ASSERT_TRUE(WriteSafetensors(dir.file("x.safetensors"), in, {{"step", "7"}}).ok());
  auto out = ReadSafetensors(dir.file("x.safetensors"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->metadata.at("step"), "7");
  ASSERT_EQ(out->tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out->tensors[i].first, in[i].first);
    EXPECT_EQ(out->tensors[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_TRUE(at::equal(out->tensors[i].second, in[i].second)) << in[i].first;
  }
  // Views over a private mapping: writable without touching the file.
  out->tensors[0].second.fill_(3.0);
  auto again = ReadSafetensors(dir.file("x.safetensors"));
  EXPECT_TRUE(at::equal(again->tensors[0].second, in[0].second));
  // The in-memory parser agrees.
  std::string bytes = ReadFile(dir.file("x.safetensors"));
  auto mem = ParseSafetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(mem.ok());
  EXPECT_TRUE(at::equal(mem->tensors[1].second, in[1].second));
}

// Builds a file image from a header string and a data section.
std::string Image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

Status ParseBytes(const std::string& b) {
  return ParseSafetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size()).status();
}

TEST(SafetensorsTest, RejectsMalformedFilesWithClearErrors) {
  auto expect = [](const std::string& bytes, const std::string& needle) {
    Status st = ParseBytes(bytes);
    EXPECT_EQ(st.code(), Code::kMalformed) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  const std::string ok_hdr = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_TRUE(ParseBytes(Image(ok_hdr, 8)).ok());
  expect("abc", "too short");
  expect(Image(ok_hdr, 8).substr(0, 20), "exceeds the");         // truncated header
  expect(Image(ok_hdr, 4), "run past the 4-byte data section");  // truncated data
  expect(Image("{\"w\": [1,", 0), "not valid JSON");
  expect(Image("[1,2]", 0), "not a JSON object");
  expect(Image(R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
         "unknown dtype 'F8_E4M3'");
  expect(Image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
         "needs 12 bytes but data_offsets [0, 8] span 8");
  expect(Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               12),
         "overlap");
  expect(Image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "holes");
  expect(Image(ok_hdr, 12), "4 trailing bytes");
  expect(Image(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "bad dimension");
  expect(Image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before begin");
  expect(Image(R"({"w":{"dtype":"F32","shape":[2]}})", 8), "data_offsets");
  expect(Image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
               8),
         "names 'w' twice");
  expect(Image(R"({"__metadata__":{"k":1}})", 0), "not a string");
  std::string huge(8, '\xff');
  expect(huge + "{}", "exceeds the limit");
  EXPECT_EQ(ReadSafetensors("/nonexistent/x.safetensors").status().code(), Code::kNotFound);
}

TEST(SafetensorsTest, TruncationAtEveryOffsetIsAnError) {
  TempDir dir;
  LlamaModel model(TinyConfig(), 3);
  ASSERT_TRUE(SaveModel(dir.file("m.safetensors"), model).ok());
  std::string bytes = ReadFile(dir.file("m.safetensors"));
  for (size_t cut = 0; cut < bytes.size(); cut += std::max<size_t>(1, bytes.size() / 97)) {
    Status st = ParseBytes(bytes.substr(0, cut));
    EXPECT_FALSE(st.ok()) << "cut at " << cut;
  }
}

TEST(SafetensorsTest, SaveLoadModelRoundTripAndConfigMismatch) {
  TempDir dir;
  ModelConfig c = TinyConfig();
  LlamaModel model(c, TestSeed());
  ASSERT_TRUE(SaveModel(dir.file("m.safetensors"), model, {{"version", "3"}}).ok());
  auto loaded = LoadModel(dir.file("m.safetensors"), c);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  c10::InferenceMode guard;
  at::Tensor ids = RandomIds(2, 6, c.vocab_size, TestSeed());
  EXPECT_TRUE(at::equal((*loaded)->Forward(ids), model.Forward(ids)));
  auto file = ReadSafetensors(dir.file("m.safetensors"));
  EXPECT_EQ(file->metadata.at("format"), "pt");
  EXPECT_EQ(file->metadata.at("version"), "3");

  // A directory with model.safetensors loads too; a bf16 config casts on load.
  std::filesystem::copy_file(dir.file("m.safetensors"), dir.file("model.safetensors"));
  ModelConfig bf = c;
  bf.dtype = DType::kBFloat16;
  auto bf_model = LoadModel(dir.path(), bf);
  ASSERT_TRUE(bf_model.ok()) << bf_model.status().ToString();
  EXPECT_EQ((*bf_model)->NamedWeights()[0].second.scalar_type(), at::kBFloat16);

  ModelConfig wrong = c;
  wrong.ffn_dim = 64;
  auto st = LoadModel(dir.file("m.safetensors"), wrong).status();
  EXPECT_NE(st.message().find("model.layers.0.mlp.gate_proj.weight' has shape [48, 32], the "
                              "model expects [64, 32]"),
            std::string::npos)
      << st.message();
  wrong = c;
  wrong.n_layers = 1;
  st = LoadModel(dir.file("m.safetensors"), wrong).status();
  EXPECT_NE(st.message().find("unexpected tensor 'model.layers.1."), std::string::npos)
      << st.message();
  wrong = c;
  wrong.n_layers = 3;
  st = LoadModel(dir.file("m.safetensors"), wrong).status();
  EXPECT_NE(st.message().find("'model.layers.2.input_layernorm.weight' is missing"),
            std::string::npos)
      << st.message();
}

TEST(SafetensorsTest, ShardedCheckpointDirectory) {
  TempDir dir;
  LlamaModel model(TinyConfig(), TestSeed());
  NamedTensors all = model.NamedWeights();
  NamedTensors a(all.begin(), all.begin() + 7), b(all.begin() + 7, all.end());
  ASSERT_TRUE(WriteSafetensors(dir.file("model-00001-of-00002.safetensors"), a).ok());
  ASSERT_TRUE(WriteSafetensors(dir.file("model-00002-of-00002.safetensors"), b).ok());
  nlohmann::json index;
  for (auto& [n, t] : a) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (auto& [n, t] : b) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  WriteFile(dir.file("model.safetensors.index.json"), index.dump());
  auto loaded = LoadModel(dir.path(), TinyConfig());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  c10::InferenceMode guard;
  at::Tensor ids = RandomIds(1, 4, 23, TestSeed());
  EXPECT_TRUE(at::equal((*loaded)->Forward(ids), model.Forward(ids)));
}

// A checkpoint written by an independent Python writer (stdlib only) loads with the exact
// values it dumped, and the model's logits match the script's own reference forward pass.
void CheckPythonCheckpoint(bool qwen2) {
  const char* src = std::getenv("TROUPE_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest (TROUPE_SOURCE_DIR)";
  TempDir dir;
  std::string cmd = fmt::format("python3 {}/tests/engine/write_safetensors.py {} --seed {}{}", src,
                                dir.path(), TestSeed() % 100000, qwen2 ? " --qwen2" : "");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto cfg = ModelConfigFromHfJson(ReadFile(dir.file("config.json")));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->attention_bias, qwen2);
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_EQ(cfg->n_kv_heads, 2);

  auto file = ReadSafetensors(dir.file("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata.at("writer"), "write_safetensors.py");
  auto values = nlohmann::json::parse(ReadFile(dir.file("values.json")));
  ASSERT_EQ(file->tensors.size(), values.size());
  for (const auto& [name, t] : file->tensors) {
    const auto& v = values.at(name);
    EXPECT_EQ(*SafetensorsDType(t.scalar_type()), v.at("dtype").get<std::string>()) << name;
    EXPECT_EQ(t.sizes().vec(), v.at("shape").get<std::vector<int64_t>>()) << name;
    at::Tensor want = at::tensor(v.at("values").get<std::vector<double>>()).view(t.sizes());
    EXPECT_TRUE(at::equal(t.to(at::kDouble), want)) << name;
  }

  auto model = LoadModel(dir.path(), *cfg);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto ref = nlohmann::json::parse(ReadFile(dir.file("reference.json")));
  at::Tensor ids = at::tensor(ref.at("tokens").get<std::vector<int64_t>>()).unsqueeze(0);
  std::vector<double> flat;
  for (const auto& row : ref.at("logits"))
    for (double x : row) flat.push_back(x);
  at::Tensor want = at::tensor(flat).view({ids.size(1), cfg->vocab_size}).to(at::kFloat);
  c10::InferenceMode guard;
  at::Tensor got = (*model)->Forward(ids)[0];
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-4))
      << "max diff " << (got - want).abs().max().item<float>();
}

TEST(SafetensorsTest, IndependentPythonWriterLlama) {
  CheckPythonCheckpoint(false);
}
TEST(SafetensorsTest, IndependentPythonWriterQwen2) {
  CheckPythonCheckpoint(true);
}

}  // namespace
}  // namespace troupe::engine
