// The tool-call parser and the typed argument readers.
#include <gtest/gtest.h>

#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;
using Kind = ParsedTurn::Kind;

TEST(ToolCall, ParsesCallsWithAndWithoutArguments) {
  ParsedTurn t = ParseToolCall(R"(<tool>read {"path": "w.txt"}</tool>)");
  ASSERT_EQ(t.kind, Kind::kCall) << t.error;
  EXPECT_EQ(t.call.name, "read");
  EXPECT_EQ(t.call.args, json({{"path", "w.txt"}}));
  t = ParseToolCall("thinking first... <tool> list </tool> trailing text ignored");
  ASSERT_EQ(t.kind, Kind::kCall) << t.error;
  EXPECT_EQ(t.call.name, "list");
  EXPECT_TRUE(t.call.args.empty());
  // "</tool>" inside an argument string does not end the call.
  t = ParseToolCall(R"(<tool>write {"path": "a", "content": "x</tool>y"}</tool>)");
  ASSERT_EQ(t.kind, Kind::kCall) << t.error;
  EXPECT_EQ(t.call.args["content"], "x</tool>y");
  // Only the first call counts.
  t = ParseToolCall(R"(<tool>read {"path":"a"}</tool><tool>submit</tool>)");
  EXPECT_EQ(t.call.name, "read");
}

TEST(ToolCall, CanonicalFormIgnoresKeyOrderAndSpacing) {
  ParsedTurn a = ParseToolCall(R"(<tool>edit {"path":"a","old":"x","new":"y"}</tool>)");
  ParsedTurn b = ParseToolCall(R"(<tool>edit   { "new" : "y", "old":"x" ,"path":"a" } </tool>)");
  ASSERT_EQ(a.kind, Kind::kCall);
  ASSERT_EQ(b.kind, Kind::kCall);
  EXPECT_EQ(a.call.canonical, b.call.canonical);
  EXPECT_NE(a.call.canonical, ParseToolCall(R"(<tool>edit {"path":"b"}</tool>)").call.canonical);
}

TEST(ToolCall, NoCallAndMalformedCalls) {
  EXPECT_EQ(ParseToolCall("just an answer").kind, Kind::kNoCall);
  EXPECT_EQ(ParseToolCall("").kind, Kind::kNoCall);
  struct Case {
    std::string text;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"<tool>read {\"path\": \"a\"}", "missing </tool>"},
      {"<tool></tool>", "missing tool name"},
      {"<tool>Read</tool>", "bad tool name"},
      {"<tool>9lives</tool>", "must start with a letter"},
      {"<tool>read-file</tool>", "bad character '-'"},
      {"<tool>" + std::string(40, 'a') + "</tool>", "longer than 32"},
      {"<tool>read {\"path\": }</tool>", "not a valid JSON object"},
      {"<tool>read {\"path\": \"a</tool>", "inside a string"},
      {"<tool>read {\"path\": \"a\"</tool>", "missing '}'"},
      {"<tool>read [1,2]</tool>", "expected {json arguments}"},
      {"<tool>read {\"a\":1} junk</tool>", "found 'junk"},
      {"<tool>read " + std::string(40, '{') + std::string(40, '}') + "</tool>", "deeper than 32"},
      {"<tool>write {\"c\": \"" + std::string(70000, 'x') + "\"}</tool>", "longer than 65536"},
      {"<tool", "incomplete tool tag"},
      {"text </tool>", "incomplete tool tag"},
      {std::string("<tool>read {\"path\": \"a\0b\"}</tool>", 31), "not a valid JSON object"},
  };
  for (const auto& c : cases) {
    ParsedTurn t = ParseToolCall(c.text);
    EXPECT_EQ(t.kind, Kind::kMalformed) << c.text.substr(0, 60);
    EXPECT_NE(t.error.find(c.needle), std::string::npos)
        << c.text.substr(0, 60) << " -> " << t.error;
  }
}

TEST(ToolCall, FormatRoundTrips) {
  json args = {{"answer", "c\"b\na"}};
  std::string text = FormatToolCall("submit", args);
  ParsedTurn t = ParseToolCall(text);
  ASSERT_EQ(t.kind, Kind::kCall);
  EXPECT_EQ(t.call.name, "submit");
  EXPECT_EQ(t.call.args, args);
  EXPECT_EQ(FormatToolCall("list"), "<tool>list</tool>");
  // Invalid UTF-8 never throws when dumping.
  EXPECT_NO_THROW(SafeDump(json(std::string("\xff\xfe"))));
}

TEST(ToolArgs, TypesRangesAndUnknownKeys) {
  json args =
      json::parse(R"({"path": "a", "n": 5, "big": 1e300, "neg": -3, "huge": 18446744073709551615,
                             "f": 2.5, "s": "12", "b": true, "nul": null})");
  EXPECT_TRUE(CheckArgKeys(args, {"path", "n", "big", "neg", "huge", "f", "s", "b", "nul"}).ok());
  Status unknown = CheckArgKeys(args, {"path"});
  EXPECT_NE(unknown.message().find("unexpected argument"), std::string::npos);
  EXPECT_EQ(*StringArg(args, "path", 10), "a");
  EXPECT_NE(StringArg(args, "n", 10).status().message().find("must be a string, got number"),
            std::string::npos);
  EXPECT_NE(StringArg(args, "missing", 10).status().message().find("missing argument \"missing\""),
            std::string::npos);
  EXPECT_NE(StringArg(json{{"p", std::string(11, 'x')}}, "p", 10)
                .status()
                .message()
                .find("over the limit"),
            std::string::npos);
  EXPECT_FALSE(OptStringArg(args, "nul", 10)->has_value());
  EXPECT_EQ(**OptIntArg(args, "n", 0, 10), 5);
  EXPECT_FALSE(OptIntArg(args, "absent", 0, 10)->has_value());
  for (const char* bad : {"big", "neg", "huge", "f", "s", "b"}) {
    auto r = OptIntArg(args, bad, 0, 1000);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(CheckArgKeys(json::array(), {}).ok());
}

}  // namespace
}  // namespace troupe::envs
