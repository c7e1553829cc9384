// `troupe tokenize DIR` as a user runs it: a real process reading stdin, on the real Qwen3
// and Llama 3.1 folders; its ids and text must be the library's (which parity_test.cc
// holds to the reference). Errors name the line and exit 1.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference_util.h"
#include "troupe/engine/hf_tokenizer.h"

namespace fs = std::filesystem;
using troupe::engine::HfTokenizer;

namespace {

struct CliRun {
  int code;
  std::string out, err;
};

// Runs `troupe tokenize ARGS` with `input` on stdin (bounded by timeout(1)).
CliRun Tokenize(const std::string& args, const std::string& input) {
  const char* build = std::getenv("TROUPE_BUILD_DIR");
  fs::path troupe = fs::path(build ? build : "build") / "launcher" / "troupe";
  fs::path dir = fs::temp_directory_path() / ("troupe-tokenize-cli-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.txt", std::ios::binary) << input;
  std::string cmd = "timeout 120 '" + troupe.string() + "' tokenize " + args + " < '" +
                    (dir / "in.txt").string() + "' > '" + (dir / "out.txt").string() + "' 2> '" +
                    (dir / "err.txt").string() + "'";
  int status = std::system(cmd.c_str());
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, troupe::testing::Slurp(dir / "out.txt"),
           troupe::testing::Slurp(dir / "err.txt")};
  fs::remove_all(dir);
  return r;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = s.find('\n'); at != std::string::npos; at = s.find('\n', start)) {
    out.push_back(s.substr(start, at - start));
    start = at + 1;
  }
  return out;
}

TEST(TokenizeCliTest, EncodesAndDecodesLikeTheLibrary) {
  const std::vector<std::string> texts = {"Hello world!", "<|im_start|>user\\nhi<|im_end|>",
                                          "日本語のテキスト 12345", "  spaces\tand tabs  ", ""};
  for (const char* package : {"tokenizer-qwen3", "tokenizer-llama3_1"}) {
    fs::path models = troupe::testing::LenmlModels(package);
    auto tok = HfTokenizer::Load(models.string());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString() << " (run scripts/install-npm-reference.sh)";
    std::string input;
    for (const auto& t : texts) input += t + "\n";
    CliRun enc = Tokenize("'" + models.string() + "'", input);
    ASSERT_EQ(enc.code, 0) << enc.err;
    std::vector<std::string> lines = Lines(enc.out);
    ASSERT_EQ(lines.size(), texts.size()) << enc.out;
    std::string ids_input;
    for (size_t i = 0; i < texts.size(); ++i) {
      // Plain lines are text as written: "\\n" stays a backslash and an n.
      EXPECT_EQ(nlohmann::json::parse(lines[i]).get<std::vector<int32_t>>(),
                *(*tok)->EncodeWithSpecialTokens(texts[i]))
          << package << ": " << texts[i];
      ids_input += lines[i] + "\n";
    }
    CliRun dec = Tokenize("--decode --skip-special '" + models.string() + "'", ids_input);
    ASSERT_EQ(dec.code, 0) << dec.err;
    std::vector<std::string> back = Lines(dec.out);
    ASSERT_EQ(back.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      auto ids = nlohmann::json::parse(lines[i]).get<std::vector<int32_t>>();
      EXPECT_EQ(back[i], *(*tok)->Decode(ids, /*skip_special=*/true));
    }
    // --json carries newlines; --no-special leaves out BOS.
    CliRun js = Tokenize("--json --no-special '" + models.string() + "'", "\"a\\nb<|im_end|>\"\n");
    ASSERT_EQ(js.code, 0) << js.err;
    EXPECT_EQ(nlohmann::json::parse(Lines(js.out).at(0)).get<std::vector<int32_t>>(),
              *(*tok)->Encode("a\nb<|im_end|>"));
  }
}

TEST(TokenizeCliTest, ErrorsNameTheProblem) {
  CliRun missing = Tokenize("/nonexistent/folder", "x\n");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("no tokenizer.json at /nonexistent/folder"), std::string::npos)
      << missing.err;
  std::string models = troupe::testing::LenmlModels("tokenizer-qwen3").string();
  CliRun bad = Tokenize("--decode '" + models + "'", "[1,2]\n[1,\"x\"]\n");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("stdin line 2: not a JSON list of token ids"), std::string::npos)
      << bad.err;
  CliRun range = Tokenize("--decode '" + models + "'", "[99999999]\n");
  EXPECT_EQ(range.code, 1);
  EXPECT_NE(range.err.find("token id 99999999 at position 0"), std::string::npos) << range.err;
  CliRun usage = Tokenize("", "");
  EXPECT_EQ(usage.code, 2);  // CLI usage error
}

}  // namespace
