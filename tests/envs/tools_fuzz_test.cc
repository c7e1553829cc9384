// Fuzzing the tool layer: thousands of random turns and calls with junk
// arguments (wrong types, huge numbers, traversal, NUL bytes, unknown tools,
// deep nesting) against real workspaces with planted symlinks and FIFOs. Every
// call must produce an error or a result the model sees, never a crash; files
// outside the workspace never change; quotas hold; scores stay finite.
//
// The seed is printed; rerun with TROUPE_FUZZ_SEED=<seed> to reproduce.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "troupe/envs/episode.h"
#include "troupe/envs/tasks.h"
#include "troupe/envs/tool_call.h"
#include "troupe/envs/workspace.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

uint64_t Seed() {
  const char* env = std::getenv("TROUPE_FUZZ_SEED");
  uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("tools_fuzz_test seed: %llu (TROUPE_FUZZ_SEED=%llu to reproduce)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  size_t Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::string Bytes(size_t max) {
    std::string s(Below(max + 1), '\0');
    for (char& c : s) c = static_cast<char>(Below(256));
    return s;
  }
  std::string Path() {
    static const std::vector<std::string> paths = {"w.txt",
                                                   "in.txt",
                                                   "out.txt",
                                                   "a.txt",
                                                   "d/e.txt",
                                                   "d",
                                                   ".",
                                                   "",
                                                   "./a.txt",
                                                   "../secret.txt",
                                                   "../../etc/passwd",
                                                   "/etc/passwd",
                                                   "a/../../x",
                                                   std::string("a\0b", 3),
                                                   "a\nb",
                                                   "link",
                                                   "linkdir/x",
                                                   "linkdir",
                                                   "fifo",
                                                   std::string(300, 'p'),
                                                   "a/b/c/d/e/f/g/h/i/j",
                                                   "\xff\xfe",
                                                   "d/e/f/g.txt",
                                                   "..",
                                                   "...",
                                                   "a//b"};
    return Chance(0.1) ? Bytes(20) : paths[Below(paths.size())];
  }
  json Value(int depth = 0) {
    switch (Below(depth > 3 ? 7 : 9)) {
      case 0:
        return Path();
      case 1:
        return std::string(Below(3) == 0 ? 70000 : Below(50), 'x');
      case 2: {
        static const std::vector<json> nums = {0,         -1,        1,     7,
                                               1e308,     -1e308,    3.5,   18446744073709551615ULL,
                                               INT64_MIN, INT64_MAX, 65536, 1e19};
        return nums[Below(nums.size())];
      }
      case 3:
        return Chance(0.5);
      case 4:
        return nullptr;
      case 5:
        return std::string("\0\0", 2);
      case 6:
        return "abcd";
      case 7: {
        json a = json::array();
        for (size_t i = Below(4); i > 0; --i) a.push_back(Value(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (size_t i = Below(4); i > 0; --i) o[Key()] = Value(depth + 1);
        return o;
      }
    }
  }
  std::string Key() {
    static const std::vector<std::string> keys = {
        "path", "content", "old", "new", "offset", "limit", "answer", "word", "junk", "", "PATH"};
    return keys[Below(keys.size())];
  }
  std::string Name() {
    static const std::vector<std::string> names = {"read",  "write", "edit", "list", "submit",
                                                   "guess", "rm",    "exec", "Read", "../x"};
    return names[Below(names.size())];
  }
  // Plausible arguments for a tool (so success paths and quotas get exercised too).
  json Plausible(const std::string& name) {
    static const std::vector<std::string> files = {"a.txt",   "d/e.txt", "d/f/g.txt",
                                                   "out.txt", "w.txt",   "x"};
    std::string path = files[Below(files.size())];
    std::string content(Below(3) == 0 ? Below(30000) : Below(20),
                        static_cast<char>('a' + Below(26)));
    if (name == "write") return {{"path", path}, {"content", content}};
    if (name == "edit") return {{"path", path}, {"old", content.substr(0, 1)}, {"new", content}};
    if (name == "read") return {{"path", path}, {"offset", Below(4)}, {"limit", 1 + Below(8)}};
    if (name == "list") return {{"path", Chance(0.5) ? "." : "d"}};
    if (name == "guess") return {{"word", "abcd"}};
    return json::object();
  }
  json Args(const std::string& name = "") {
    if (!name.empty() && Chance(0.35)) return Plausible(name);
    json o = json::object();
    for (size_t i = Below(5); i > 0; --i) o[Key()] = Value();
    return o;
  }
  // One assistant turn: mostly well-formed calls with junk arguments.
  std::string Turn(ToolCallFormat format = ToolCallFormat::kTroupe) {
    if (format != ToolCallFormat::kTroupe) return JsonTurn(format);
    size_t k = Below(10);
    if (k == 0) return Bytes(200);
    if (k == 1) return "<tool>" + Name() + " " + Bytes(60) + (Chance(0.5) ? "</tool>" : "");
    if (k == 2) return "<tool>" + Name() + " " + std::string(Below(100), '{') + "</tool>";
    std::string text = Chance(0.2) ? Bytes(20) : "";
    std::string name = Name();
    return text + FormatToolCall(name, Args(name)) + (Chance(0.2) ? Bytes(20) : "");
  }
  // A turn in the Hermes or Llama 3 JSON format: junk arguments, broken JSON,
  // wrong keys and types, missing tags, truncations and random bytes.
  std::string JsonTurn(ToolCallFormat format) {
    bool hermes = format == ToolCallFormat::kHermes;
    std::string open = hermes ? "<tool_call>\n" : (Chance(0.2) ? "<|python_tag|>" : "");
    std::string close = hermes ? "\n</tool_call>" : "";
    std::string name = Name();
    switch (Below(12)) {
      case 0: return Bytes(200);
      case 1: return open + Bytes(80) + close;
      case 2: return open + std::string(Below(100), '{') + close;
      case 3: return open + "{\"name\": \"" + name + "\", \"arguments\": " + Bytes(40) + "}" + close;
      case 4: return open + SafeDump(json{{"name", name}, {"arguments", Value()}}) + close;  // wrong type
      case 5: return open + SafeDump(json{{"name", Value()}, {"arguments", Args(name)}}) + close;
      case 6:
        return open + SafeDump(json{{"name", name}, {"arguments", SafeDump(Args(name)) + (Chance(0.5) ? "}" : "")}}) + close;
      case 7: return open + SafeDump(json{{"name", name}, {Key(), Args(name)}}) + close;
      case 8: {  // truncated anywhere
        std::string t = FormatToolCall(name, Args(name), format);
        return t.substr(0, Below(t.size() + 1));
      }
      default: {
        std::string lead = Chance(0.2) ? Bytes(20) : "";
        std::string tail = Chance(0.2) ? Bytes(20) : "";
        return lead + FormatToolCall(name, Args(name), format) + tail;
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

class ToolsFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe-fuzz-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    episodes_ = root_ + "/episodes";
    fs::create_directory(episodes_);
    std::ofstream(root_ + "/secret.txt") << "canary";
  }
  void TearDown() override {
    CheckOutside();
    EXPECT_TRUE(fs::is_empty(episodes_)) << "every workspace is removed";
    fs::remove_all(root_);
  }
  void CheckOutside() {
    std::ifstream in(root_ + "/secret.txt");
    std::string content((std::istreambuf_iterator<char>(in)), {});
    ASSERT_EQ(content, "canary");
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(root_)) entries += !e.path().empty();
    ASSERT_EQ(entries, 2u) << "nothing was created next to the workspaces";
  }
  std::string root_, episodes_;
};

TEST_F(ToolsFuzz, RandomTurnsThroughEpisodes) {
  Gen gen(Seed());
  EpisodeConfig cfg;
  cfg.max_turns = 40;
  cfg.max_tool_output_chars = 200;
  int64_t calls = 0;
  for (ToolCallFormat format :
       {ToolCallFormat::kTroupe, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json})
  for (const char* kind : {"file_reverse", "file_sort", "wordle"}) {
    TaskConfig c;
    c.name = kind;
    c.eval_size = 10;
    c.scoring = "partial";
    c.workspace.root = episodes_;
    c.workspace.max_files = 16;
    c.workspace.max_total_bytes = 100000;
    auto task = MakeTask(c);
    ASSERT_TRUE(task.ok()) << task.status().ToString();
    for (int e = 0; e < 30; ++e) {
      auto ep = Episode::Start(**task, (*task)->GetPrompt(Split::kTrain, e), cfg, format);
      ASSERT_TRUE(ep.ok()) << ep.status().ToString();
      while (!(*ep)->done()) {
        std::string turn = gen.Turn(format);
        std::optional<std::string> out = (*ep)->OnAssistantTurn(turn);
        ++calls;
        if (out) {
          ASSERT_LE(out->size(), 200u + 40u) << "output is truncated";
          for (char ch : *out) {
            auto u = static_cast<unsigned char>(ch);
            ASSERT_TRUE(u == '\n' || u == '\t' || (u >= 0x20 && u < 0x7f)) << "byte " << int(u);
          }
        }
      }
      const Episode& done = **ep;
      ASSERT_TRUE(std::isfinite(done.score().reward));
      ASSERT_GE(done.score().reward, 0.0);
      ASSERT_LE(done.score().reward, 1.0);
      ASSERT_TRUE(done.score().ok()) << done.score().failure;
      const EpisodeFlags& f = done.flags();
      ASSERT_LE(f.missing_calls + f.unparsable_calls + f.unknown_tools + f.tool_errors,
                done.turns());
      ASSERT_TRUE(json::accept(done.SummaryJson()));
      ASSERT_TRUE((*task)->Verify({"", "", "", done.SummaryJson()}).ok());
    }
    CheckOutside();
  }
  std::printf("%lld random turns through episodes\n", static_cast<long long>(calls));
  EXPECT_GT(calls, 1000);
}

TEST_F(ToolsFuzz, RandomCallsAgainstPlantedLinksAndSpecialFiles) {
  Gen gen(Seed() + 1);
  WorkspaceConfig wc;
  wc.root = episodes_;
  wc.max_files = 12;
  wc.max_total_bytes = 200000;
  wc.max_file_bytes = 100000;
  int64_t calls = 0, errors = 0;
  for (int e = 0; e < 20; ++e) {
    int scored = 0;
    auto env = NewWorkspaceEnvironment(
        wc, {{"w.txt", "abc"}},
        [&scored](const Workspace& ws, const std::optional<std::string>&, bool) {
          // A scorer that looks at whatever the workspace holds.
          ++scored;
          VerifyResult r;
          Result<std::string> out = ws.ReadFile("out.txt");
          auto listing = ws.List(".");
          r.reward = out.ok() && listing.ok() ? 0.5 : 0.0;
          return r;
        });
    ASSERT_TRUE(env.ok()) << env.status().ToString();
    // Plant hostile entries inside the (only) workspace directory.
    fs::path ws = fs::directory_iterator(episodes_)->path();
    fs::create_symlink(root_ + "/secret.txt", ws / "link");
    fs::create_directory_symlink(root_, ws / "linkdir");
    fs::create_symlink(root_ + "/secret.txt", ws / "out.txt");
    ASSERT_EQ(mkfifo((ws / "fifo").c_str(), 0600), 0);
    for (int k = 0; k < 150; ++k) {
      std::string name = gen.Name();
      json args = gen.Chance(0.1) ? json(gen.Value()) : gen.Args(name);
      if (!args.is_object()) args = json::object({{"path", args}});
      ToolResult r = (*env)->Call(name, args);
      ++calls;
      errors += !r.ok;
      if (!r.ok) {
        ASSERT_FALSE(r.output.empty()) << "errors carry a message";
      }
      if (k % 25 == 0) CheckOutside();
    }
    VerifyResult score = (*env)->Score();
    ASSERT_EQ(scored, 1);
    ASSERT_TRUE(std::isfinite(score.reward));
    // Quotas held whatever the calls did (links and the fifo count as entries).
    int64_t files = 0;
    for (auto it = fs::recursive_directory_iterator(ws); it != fs::recursive_directory_iterator();
         ++it) {
      ++files;
      std::error_code ec;
      if (it->is_regular_file(ec) && !it->is_symlink(ec)) {
        ASSERT_LE(static_cast<int64_t>(it->file_size()), wc.max_file_bytes);
      }
    }
    ASSERT_LE(files, wc.max_files);
    env->reset();
    ASSERT_FALSE(fs::exists(ws));
  }
  std::printf("%lld random tool calls, %lld rejected\n", static_cast<long long>(calls),
              static_cast<long long>(errors));
  EXPECT_GE(calls, 3000);
  EXPECT_GT(errors, calls / 4) << "junk arguments mostly fail";
  EXPECT_LT(errors, calls) << "some calls succeed";
}

TEST(ToolCallFuzz, ParserSurvivesRandomText) {
  Gen gen(Seed() + 2);
  int64_t calls = 0, malformed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = gen.Chance(0.5) ? gen.Turn() : gen.Bytes(300);
    ParsedTurn t = ParseToolCall(text);
    if (t.kind == ParsedTurn::Kind::kCall) {
      ++calls;
      ASSERT_TRUE(t.call.args.is_object());
      ASSERT_FALSE(t.call.name.empty());
      ASSERT_LE(t.call.name.size(), kMaxToolNameChars);
      ASSERT_EQ(ParseToolCall(FormatToolCall(t.call.name, t.call.args)).call.canonical,
                t.call.canonical);
    } else if (t.kind == ParsedTurn::Kind::kMalformed) {
      ++malformed;
      ASSERT_FALSE(t.error.empty());
    }
  }
  EXPECT_GT(calls, 1000);
  EXPECT_GT(malformed, 1000);
}

TEST(ToolCallFuzz, RealFormatsSurviveJunk) {
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    Gen gen(Seed() + 3 + static_cast<uint64_t>(format));
    int64_t calls = 0, malformed = 0, none = 0;
    for (int i = 0; i < 20000; ++i) {
      std::string text = gen.JsonTurn(format);
      ParsedTurn t = ParseToolCall(text, format);
      if (t.kind == ParsedTurn::Kind::kCall) {
        ++calls;
        ASSERT_TRUE(t.call.args.is_object());
        ASSERT_FALSE(t.call.name.empty());
        ASSERT_LE(t.end, text.size());
        ASSERT_LT(t.call.canonical.size(), kMaxToolArgsBytes + 100);
        // Formatting is stable: what we write parses back to a call that is written the same
        // way (numbers go through the templates' JavaScript printing, so integers past 2^53
        // round once, as in Hugging Face's renderer).
        std::string written = FormatToolCall(t.call.name, t.call.args, format);
        ParsedTurn again = ParseToolCall(written, format);
        ASSERT_EQ(again.kind, ParsedTurn::Kind::kCall) << text;
        ASSERT_EQ(again.call.name, t.call.name) << text;
        ASSERT_EQ(FormatToolCall(again.call.name, again.call.args, format), written) << text;
      } else if (t.kind == ParsedTurn::Kind::kMalformed) {
        ++malformed;
        ASSERT_FALSE(t.error.empty());
        ASSERT_LT(t.error.size(), 400u) << "errors stay short enough to show the model";
      } else {
        ++none;
      }
    }
    std::printf("%s: %lld calls, %lld malformed, %lld without a call\n", ToolCallFormatName(format),
                static_cast<long long>(calls), static_cast<long long>(malformed),
                static_cast<long long>(none));
    EXPECT_GT(calls, 2000);
    EXPECT_GT(malformed, 3000);
  }
}

}  // namespace
}  // namespace troupe::envs
