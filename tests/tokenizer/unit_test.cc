// HfTokenizer pieces on small synthetic tokenizer.json files: pattern translation, UTF-8
// repair, BPE merge order, added-token options (single_word, lstrip/rstrip, normalized),
// special-token ids, and the errors for what is not supported. CharTokenizer's additions.
// (Parity with the reference on real files: parity_test.cc.)
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "hf/bpe.h"
#include "hf/regex.h"
#include "hf/unicode.h"
#include "troupe/engine/hf_tokenizer.h"

namespace {

using nlohmann::json;
using troupe::engine::CharTokenizer;
using troupe::engine::HfTokenizer;
namespace hf = troupe::engine::hf;

std::string Utf8(char32_t c) {
  std::string s;
  hf::AppendCodePoint(c, &s);
  return s;
}

// The non-empty matches of a tokenizer.json Regex pattern in `text`, joined by '|'.
std::string Matches(const std::string& pattern, const std::string& text) {
  auto translated = hf::TranslatePattern(pattern);
  if (!translated.ok()) return "error: " + translated.status().message();
  auto re = hf::Regex::Compile(*translated, "test");
  if (!re.ok()) return "error: " + re.status().message();
  std::string out;
  auto st = (*re)->ForEach(text, [&](size_t b, size_t e) {
    if (e > b) out += (out.empty() ? "" : "|") + text.substr(b, e - b);
  });
  return st.ok() ? out : "error: " + st.message();
}

TEST(PatternTest, CaseInsensitiveGroupsFoldAsciiOnly) {
  EXPECT_EQ(Matches("(?i:'s|'ll)", "'s 'S 'Ll 'LL"), "'s|'S|'Ll|'LL");
  // Oniguruma (and PCRE2's (?i)) would fold U+017F LONG S and U+212A KELVIN to s/k;
  // tokenizers.js folds ASCII letters only, and so do we.
  EXPECT_EQ(Matches("(?i:'s|k)", "'" + Utf8(0x17F) + " " + Utf8(0x212A) + " K"), "K");
}

TEST(PatternTest, ShorthandsHaveTheReferenceMeaning) {
  // \s is White_Space: NEL (U+0085) yes, ZWNBSP (U+FEFF) no.
  EXPECT_EQ(Matches("\\s+", "a" + Utf8(0x85) + "b" + Utf8(0xFEFF) + "c"), Utf8(0x85));
  EXPECT_EQ(Matches("\\d+", "x" + Utf8(0x663) + "7y"), Utf8(0x663) + "7");  // Unicode Nd
  EXPECT_EQ(Matches("\\w+", "ab_1 " + Utf8(0xB2) + "!"), "ab_1|" + Utf8(0xB2));
  EXPECT_EQ(Matches(".+", "ab\ncd"), "ab|cd");
  EXPECT_EQ(Matches("^a", "a\na"), "a|a");
  EXPECT_EQ(Matches("\\p{Han}+", "日本。語"), "日本|語");  // the Script, not Script_Extensions
  EXPECT_EQ(Matches("[\\s\\d]+", "a 1\t2b"), " 1\t2");
  EXPECT_EQ(Matches("\\x{41}\\u0042\\x43", "ABC"), "ABC");
}

TEST(PatternTest, QuantifiersFollowOniguruma) {
  // x{1,3}+ is a repeated interval (not possessive): all the digits in one match.
  EXPECT_EQ(Matches("\\p{N}{1,3}+", "1234567"), "1234567");
  EXPECT_EQ(Matches("\\p{N}{1,3}", "1234567"), "123|456|7");
  EXPECT_EQ(Matches("a{,2}", "aaa"), "aa|a");
  EXPECT_EQ(Matches("a++b", "aab"), "aab");    // possessive dropped, as in the reference
  EXPECT_EQ(Matches("a{x}", "a{x}"), "a{x}");  // not a quantifier: literal braces
}

TEST(PatternTest, EmptyMatchesAdvanceOneCodePoint) {
  EXPECT_EQ(Matches("x*", "日x"), "x");
  int empty = 0;
  auto re = hf::Regex::Compile("x*", "test");
  ASSERT_TRUE(re.ok());
  ASSERT_TRUE((*re)->ForEach("日本", [&](size_t b, size_t e) { empty += b == e; }).ok());
  EXPECT_EQ(empty, 3);  // before 日, before 本, at the end
}

TEST(PatternTest, UnsupportedConstructsAreRefusedByName) {
  EXPECT_NE(Matches("(?i)abc", "").find("group '(?i)"), std::string::npos);
  EXPECT_NE(Matches("[[:alpha:]]", "").find("POSIX"), std::string::npos);
  EXPECT_NE(Matches("[a-z&&[^x]]", "").find("intersection"), std::string::npos);
  EXPECT_NE(Matches("\\K", "").find("escape \\K"), std::string::npos);
  EXPECT_NE(Matches("(?i:[!-~])", "").find("mixing letters"), std::string::npos);
  EXPECT_NE(Matches("(ab", "").find("unclosed group"), std::string::npos);
  EXPECT_NE(Matches("\\p{NoSuchProperty}", "").find("PCRE2 cannot compile"), std::string::npos);
}

TEST(PatternTest, LongInputsDoNotExhaustTheStack) {
  auto t = hf::TranslatePattern("\\s+(?!\\S)|\\s+|[^\\s\\p{L}\\p{N}]+|\\p{L}+");
  ASSERT_TRUE(t.ok());
  auto re = hf::Regex::Compile(*t, "test");
  ASSERT_TRUE(re.ok());
  std::string text(1 << 20, ' ');
  text += "x";
  size_t matches = 0;
  ASSERT_TRUE((*re)->ForEach(text, [&](size_t, size_t) { ++matches; }).ok());
  EXPECT_EQ(matches, 3u);  // (2^20 - 1) spaces, one space, x
}

TEST(Utf8Test, IllFormedSubpartsBecomeOneReplacementEach) {
  auto fix = [](const std::string& s) {
    std::string out;
    hf::AppendValidUtf8(s, &out);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(fix("a\x80"
                "b"),
            "a" + r + "b");
  EXPECT_EQ(fix("\xC0\xAF"), r + r);          // overlong: two
  EXPECT_EQ(fix("\xE0\x80\xAF"), r + r + r);  // overlong: three
  EXPECT_EQ(fix("\xED\xA0\x80"), r + r + r);  // a surrogate: three
  EXPECT_EQ(fix("\xF0\x9F\x98"
                "x"),
            r + "x");                                 // truncated 4-byte: one
  EXPECT_EQ(fix("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF: four
  EXPECT_EQ(fix("\xE6\x97\xA5\xEF\xBB\xBF"), "\xE6\x97\xA5\xEF\xBB\xBF");
  EXPECT_FALSE(hf::IsValidUtf8("abc\xFF"));
  EXPECT_TRUE(hf::IsValidUtf8("abc日本😀"));
}

// ---- small synthetic tokenizers ----

std::string ByteChars(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) hf::AppendCodePoint(hf::ByteToChar(b), &s);
  return s;
}

// A byte-level BPE over all 256 bytes plus `merges` (pairs of byte strings).
json ByteLevelTokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChars(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(ByteChars(a) + " " + ByteChars(b));
    if (!vocab.contains(ByteChars(a + b))) vocab[ByteChars(a + b)] = next++;
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

json Added(int id, const std::string& content, bool special, bool single_word = false,
           bool lstrip = false, bool rstrip = false, bool normalized = false) {
  return {{"id", id},
          {"content", content},
          {"special", special},
          {"single_word", single_word},
          {"lstrip", lstrip},
          {"rstrip", rstrip},
          {"normalized", normalized}};
}

std::unique_ptr<HfTokenizer> Make(const json& j, const json& config = json()) {
  auto t = HfTokenizer::FromJson(j.dump(), config.is_null() ? "" : config.dump(), "test.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string LoadError(const json& j) {
  auto t = HfTokenizer::FromJson(j.dump(), "", "dir/tokenizer.json");
  return t.ok() ? "loaded" : t.status().message();
}

TEST(BpeTest, LowestRankFirstThenLeftmost) {
  // "aaa" with the single merge (a,a): the leftmost pair merges -> "aa", "a".
  auto tok = Make(ByteLevelTokenizer({{"a", "a"}}));
  ASSERT_TRUE(tok);
  EXPECT_EQ(*tok->Encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  // rank decides before position: (b,c) ranks above (a,b), so "abc" -> "a", "bc".
  auto ranked = Make(ByteLevelTokenizer({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(*ranked->Encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(*ranked->Decode(*ranked->Encode("abc abc")), "abc abc");
}

TEST(BpeTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json j = ByteLevelTokenizer({{"a", "b"}, {"c", "d"}});
  j["model"]["vocab"][ByteChars("abcd")] = 300;  // reachable only as a whole word
  auto plain = Make(j);
  EXPECT_EQ(*plain->Encode("abcd"), (std::vector<int32_t>{256, 257}));
  j["model"]["ignore_merges"] = true;
  auto whole = Make(j);
  EXPECT_EQ(*whole->Encode("abcd"), (std::vector<int32_t>{300}));
}

TEST(AddedTokenTest, SingleWordMatchesOnlyWholeWords) {
  json j = ByteLevelTokenizer({});
  j["added_tokens"].push_back(Added(400, "ing", false, /*single_word=*/true));
  auto tok = Make(j);
  EXPECT_EQ(*tok->Encode("ing"), (std::vector<int32_t>{400}));
  EXPECT_EQ(*tok->Encode("ing x"), (std::vector<int32_t>{400, ' ', 'x'}));
  EXPECT_EQ(*tok->Encode("sing"), (std::vector<int32_t>{'s', 'i', 'n', 'g'}));  // inside a word
  EXPECT_EQ(*tok->Encode("ings"), (std::vector<int32_t>{'i', 'n', 'g', 's'}));
}

TEST(AddedTokenTest, LstripRstripEatNeighbouringWhitespace) {
  json j = ByteLevelTokenizer({});
  j["added_tokens"].push_back(Added(400, "<m>", true, false, /*lstrip=*/true, /*rstrip=*/true));
  j["added_tokens"].push_back(Added(401, "<k>", true));
  auto tok = Make(j);
  EXPECT_EQ(*tok->Encode("a \t<m>  b"), (std::vector<int32_t>{'a', 400, 'b'}));
  EXPECT_EQ(*tok->Encode("a <k> b"), (std::vector<int32_t>{'a', ' ', 401, ' ', 'b'}));
  EXPECT_EQ(*tok->Encode("<k><m><k>"), (std::vector<int32_t>{401, 400, 401}));  // longest, leftmost
  EXPECT_TRUE(tok->IsSpecial(400));
  EXPECT_FALSE(tok->IsSpecial('a'));
  EXPECT_EQ(*tok->Decode({'a', 400, 'b'}, /*skip_special=*/false), "a<m>b");
  EXPECT_EQ(*tok->Decode({'a', 400, 'b'}, /*skip_special=*/true), "ab");
  EXPECT_EQ(tok->TokenToId("<m>"), 400);
  EXPECT_EQ(tok->TokenToId(ByteChars(" ")), ' ');
  EXPECT_EQ(tok->TokenToId("<none>"), -1);
}

TEST(AddedTokenTest, NormalizedTokensMatchAfterTheNormalizer) {
  json j = ByteLevelTokenizer({});
  j["normalizer"] = {{"type", "NFC"}};
  // "e" + COMBINING ACUTE, normalized: matches the NFC text "é" (and its decomposed form).
  j["added_tokens"].push_back(
      Added(400, "e\xCC\x81", false, false, false, false, /*normalized=*/true));
  auto tok = Make(j);
  EXPECT_EQ(*tok->Encode("caf\xC3\xA9"), (std::vector<int32_t>{'c', 'a', 'f', 400}));
  EXPECT_EQ(*tok->Encode("cafe\xCC\x81"), (std::vector<int32_t>{'c', 'a', 'f', 400}));
}

TEST(SpecialIdsTest, ComeFromTheConfigOrTheTemplate) {
  json j = ByteLevelTokenizer({});
  j["added_tokens"].push_back(Added(400, "<s>", true));
  j["added_tokens"].push_back(Added(401, "</s>", true));
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", json::object()}};
  auto bare = Make(j);
  EXPECT_EQ(bare->bos_id(), 400);
  EXPECT_EQ(bare->eos_id(), 401);
  EXPECT_EQ(bare->pad_id(), 401);  // no pad token: EOS pads
  EXPECT_EQ(*bare->EncodeWithSpecialTokens("a"), (std::vector<int32_t>{400, 'a', 401}));
  EXPECT_EQ(*bare->Encode("a", /*add_bos=*/true, /*add_eos=*/true),
            (std::vector<int32_t>{400, 'a', 401}));
  auto configured =
      Make(j, {{"bos_token", nullptr}, {"eos_token", {{"content", "<s>"}}}, {"pad_token", "</s>"}});
  EXPECT_EQ(configured->bos_id(), -1);
  EXPECT_EQ(configured->eos_id(), 400);
  EXPECT_EQ(configured->pad_id(), 401);
  EXPECT_EQ(*configured->Encode("a", /*add_bos=*/true), (std::vector<int32_t>{'a'}));  // no BOS
  EXPECT_NE(LoadError(j).find("loaded"), std::string::npos);
  auto wrong = HfTokenizer::FromJson(j.dump(), json({{"eos_token", "<nope>"}}).dump(), "t.json");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("eos_token: token '<nope>' is not in the vocabulary"),
            std::string::npos)
      << wrong.status().message();
}

TEST(SpecialIdsTest, CleanUpSpacesFollowsTheConfig) {
  json j = ByteLevelTokenizer({});
  auto ids = *Make(j)->Encode("a , b .");
  EXPECT_EQ(*Make(j)->Decode(ids), "a, b.");  // tokenizers.js's default: clean up
  EXPECT_EQ(*Make(j, {{"clean_up_tokenization_spaces", false}})->Decode(ids), "a , b .");
}

TEST(DecodeTest, PartialCharactersBecomeReplacementCharacters) {
  auto tok = Make(ByteLevelTokenizer({}), {{"clean_up_tokenization_spaces", false}});
  auto ids = *tok->Encode("日");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(*tok->Decode({ids[0], ids[1]}), "\xEF\xBF\xBD");
  EXPECT_EQ(*tok->Decode(ids), "日");
  auto bad = tok->Decode({'a', 999999});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token id 999999 at position 1"), std::string::npos);
}

TEST(DecodeTest, InvalidInputIsRepairedLikeTheReference) {
  auto tok = Make(ByteLevelTokenizer({}), {{"clean_up_tokenization_spaces", false}});
  EXPECT_EQ(*tok->Decode(*tok->Encode("a\xFF"
                                      "b")),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(ErrorsTest, UnsupportedComponentsAreRefusedByNameAndFile) {
  auto error_of = [](const std::function<void(json&)>& edit) {
    json j = ByteLevelTokenizer({{"a", "b"}});
    edit(j);
    return LoadError(j);
  };
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  std::string e = error_of([](json& j) { j["model"]["type"] = "WordPiece"; });
  EXPECT_TRUE(has(e, "dir/tokenizer.json model: type 'WordPiece' is not supported")) << e;
  e = error_of([](json& j) { j["normalizer"] = {{"type", "BertNormalizer"}}; });
  EXPECT_TRUE(has(e, "dir/tokenizer.json normalizer: normalizer type 'BertNormalizer'")) << e;
  e = error_of([](json& j) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", json::array({{{"type", "Whitespace"}}})}};
  });
  EXPECT_TRUE(has(e, "pre_tokenizer.pretokenizers[0]: pre-tokenizer type 'Whitespace'")) << e;
  e = error_of([](json& j) {
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", " "}}},
                          {"behavior", "Contiguous"},
                          {"invert", false}};
  });
  EXPECT_TRUE(has(e, "Split behavior 'Contiguous' is not supported")) << e;
  e = error_of([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}}; });
  EXPECT_TRUE(has(e, "Metaspace without split=false")) << e;
  e = error_of([](json& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "ByteLevel"}}, {{"type", "Digits"}}})}};
  });
  EXPECT_TRUE(has(e, "a ByteLevel pre-tokenizer must come last")) << e;
  e = error_of([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; });
  EXPECT_TRUE(has(e, "decoder type 'WordPiece'")) << e;
  e = error_of([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; });
  EXPECT_TRUE(has(e, "post-processor type 'RobertaProcessing'")) << e;
  e = error_of(
      [](json& j) { j["model"]["merges"].push_back(ByteChars("a") + " " + ByteChars("zz")); });
  EXPECT_TRUE(has(e, "merges[1]")) << e;
  e = error_of([](json& j) { j["model"]["dropout"] = 0.1; });
  EXPECT_TRUE(has(e, "dropout 0.1 is not supported")) << e;
  e = error_of([](json& j) { j["truncation"] = {{"max_length", 8}}; });
  EXPECT_TRUE(has(e, "'truncation' is set")) << e;
  e = error_of([](json& j) { j["decoder"]["frobnicate"] = true; });
  EXPECT_TRUE(has(e, "decoder: option 'frobnicate' is not supported")) << e;
  e = error_of([](json& j) { j["added_tokens"].push_back({{"id", 5}}); });
  EXPECT_TRUE(has(e, "added_tokens[0]")) << e;
  EXPECT_TRUE(has(HfTokenizer::FromJson("{not json", "", "x.json").status().message(),
                  "x.json: not a JSON object"));
  auto missing = HfTokenizer::Load("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(has(missing.status().message(), "no tokenizer.json at /nonexistent/model"));
}

TEST(LoadTest, ReadsAFolderOrAFileWithItsConfig) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("troupe-tok-load-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  json j = ByteLevelTokenizer({});
  j["added_tokens"].push_back(Added(400, "<|end|>", true));
  std::ofstream(dir / "tokenizer.json") << j.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json({{"eos_token", "<|end|>"}, {"chat_template", "{{x}}"}}).dump();
  for (const fs::path& p : {dir, dir / "tokenizer.json"}) {
    auto t = HfTokenizer::Load(p.string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->eos_id(), 400);
    EXPECT_EQ((*t)->config()["chat_template"], "{{x}}");
    EXPECT_TRUE((*t)->byte_level());
  }
  std::ofstream(dir / "tokenizer_config.json") << "[1,";
  EXPECT_FALSE(HfTokenizer::Load(dir.string()).ok());
  fs::remove_all(dir);
}

TEST(CharTokenizerTest, TokenToIdAndSpecialTokens) {
  auto tok = CharTokenizer::Create("ab");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->TokenToId("<eos>"), CharTokenizer::kEosId);
  EXPECT_EQ((*tok)->TokenToId("b"), 4);
  EXPECT_EQ((*tok)->TokenToId("c"), -1);
  EXPECT_EQ(*(*tok)->EncodeWithSpecialTokens("ab"), (std::vector<int32_t>{1, 3, 4}));
}

}  // namespace
