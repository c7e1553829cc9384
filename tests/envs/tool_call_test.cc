// The tool-call parser and the typed argument readers.
#include <gtest/gtest.h>

#include "troupe/envs/environment.h"
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

namespace troupe::envs {
namespace {

using json = nlohmann::json;

TEST(ToolCallFormats, HermesCallsParseAndFormatAsQwenWritesThem) {
  const auto kH = ToolCallFormat::kHermes;
  EXPECT_EQ(FormatToolCall("read", {{"path", "w.txt"}, {"n", 1.5}}, kH),
            "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"n\": 1.5, \"path\": \"w.txt\"}}\n</tool_call>");
  ParsedTurn t = ParseToolCall("thinking...\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>", kH);
  ASSERT_EQ(t.kind, ParsedTurn::Kind::kCall) << t.error;
  EXPECT_EQ(t.call.name, "read");
  EXPECT_EQ(t.call.args, (json{{"path", "a"}}));
  EXPECT_EQ(t.begin, 12u);
  // Arguments as JSON text (Qwen's template writes a string through), "parameters", none.
  t = ParseToolCall("<tool_call>{\"name\": \"read\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}</tool_call>", kH);
  ASSERT_EQ(t.kind, ParsedTurn::Kind::kCall) << t.error;
  EXPECT_EQ(t.call.args, (json{{"path", "b"}}));
  t = ParseToolCall("<tool_call>{\"name\": \"submit\"}</tool_call>", kH);
  ASSERT_EQ(t.kind, ParsedTurn::Kind::kCall) << t.error;
  EXPECT_TRUE(t.call.args.empty());
  EXPECT_EQ(ParseToolCall("no call here", kH).kind, ParsedTurn::Kind::kNoCall);
  EXPECT_EQ(ParseToolCall("<tool>read</tool>", kH).kind, ParsedTurn::Kind::kNoCall);

  struct Bad {
    std::string text, want;
  };
  for (const Bad& b : std::vector<Bad>{
           {"<tool_call>{\"name\": \"read\"}", "missing </tool_call>"},
           {"<tool_call>read</tool_call>", "expected a JSON object after <tool_call>"},
           {"</tool_call>", "incomplete tool_call tag"},
           {"<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\" string"},
           {"<tool_call>{\"name\": 7}</tool_call>", "no \"name\" string"},
           {"<tool_call>{\"name\": \"\"}</tool_call>", "1-64 printable ASCII"},
           {"<tool_call>{\"name\": \"a b\"}</tool_call>", "1-64 printable ASCII"},
           // Templates write names unescaped: these could not be written back (fuzz seed 1391582614).
           {"<tool_call>{\"name\": \"9\\\";FtJ\"}</tool_call>", "no quote or backslash"},
           {"<tool_call>{\"name\": \"a\\\\b\"}</tool_call>", "no quote or backslash"},
           {"<tool_call>{\"name\": \"r\", \"arguments\": [1]}</tool_call>", "must be a JSON object, got array"},
           {"<tool_call>{\"name\": \"r\", \"arguments\": \"{oops\"}</tool_call>", "a string that is not a JSON object"},
           {"<tool_call>{\"name\": \"r\", \"args\": {}}</tool_call>", "unexpected key \"args\""},
           {"<tool_call>{\"name\": \"r\", \"arguments\": {}, \"parameters\": {}}</tool_call>", "both arguments and parameters"},
           {"<tool_call>{\"name\": \"r\", \"arguments\": {\"a\": \"unterminated}}</tool_call>", "end inside a string"},
           {"<tool_call>" + std::string(40, '[') + "</tool_call>", "expected a JSON object"},
           {"<tool_call>{" + std::string(40, '[') + "</tool_call>", "deeper than 32 levels"},
       }) {
    ParsedTurn p = ParseToolCall(b.text, kH);
    EXPECT_EQ(p.kind, ParsedTurn::Kind::kMalformed) << b.text;
    EXPECT_NE(p.error.find(b.want), std::string::npos) << b.text << " -> " << p.error;
  }
}

TEST(ToolCallFormats, Llama3JsonCallsAreTheWholeReply) {
  const auto kL = ToolCallFormat::kLlama3Json;
  EXPECT_EQ(FormatToolCall("guess", {{"word", "crane"}}, kL),
            "{\"name\": \"guess\", \"parameters\": {\"word\": \"crane\"}}");
  for (const char* text : {"{\"name\": \"guess\", \"parameters\": {\"word\": \"crane\"}}",
                           "  <|python_tag|>{\"name\": \"guess\", \"arguments\": {\"word\": \"crane\"}}\n"}) {
    ParsedTurn t = ParseToolCall(text, kL);
    ASSERT_EQ(t.kind, ParsedTurn::Kind::kCall) << text << " " << t.error;
    EXPECT_EQ(t.call.canonical, "guess {\"word\":\"crane\"}");
  }
  EXPECT_EQ(ParseToolCall("The answer is 4.", kL).kind, ParsedTurn::Kind::kNoCall);
  ParsedTurn t = ParseToolCall("Sure: {\"name\": \"guess\", \"parameters\": {}}", kL);
  EXPECT_EQ(t.kind, ParsedTurn::Kind::kMalformed);
  EXPECT_NE(t.error.find("must be the whole reply"), std::string::npos) << t.error;
  t = ParseToolCall("{\"name\": \"guess\", \"parameters\": {}} and more", kL);
  EXPECT_NE(t.error.find("text after the call to 'guess'"), std::string::npos) << t.error;
  t = ParseToolCall("{\"name\": \"guess\", \"parameters\": 3}", kL);
  EXPECT_NE(t.error.find("must be a JSON object, got number"), std::string::npos) << t.error;
}

TEST(ToolCallFormats, TroupeSyntaxIsRewrittenIntoTheTemplatesFormat) {
  std::string instructions = ToolInstructions({{"read", "{\"path\": string}", "reads a file"}}) +
                             "Submit with <tool>submit {\"answer\": \"...\"}</tool> when done. <tool>x";
  std::string hermes = RewriteToolCalls(instructions, ToolCallFormat::kHermes);
  EXPECT_NE(hermes.find("writing " + ToolCallSyntax(ToolCallFormat::kHermes) + ". Tools:"), std::string::npos)
      << hermes;
  EXPECT_NE(hermes.find("<tool_call>\n{\"name\": \"submit\", \"arguments\": {\"answer\": \"...\"}}\n</tool_call> when done."),
            std::string::npos)
      << hermes;
  EXPECT_NE(hermes.find("<tool>x"), std::string::npos) << "text that is no call stays";
  EXPECT_EQ(RewriteToolCalls(instructions, ToolCallFormat::kTroupe), instructions);
  EXPECT_EQ(RewriteToolCalls("<tool>read {\"path\": \"a\"}</tool>", ToolCallFormat::kLlama3Json),
            "{\"name\": \"read\", \"parameters\": {\"path\": \"a\"}}");
  Result<ToolCallFormat> f = ParseToolCallFormat("hermes");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, ToolCallFormat::kHermes);
  EXPECT_FALSE(ParseToolCallFormat("xml").ok());
}

}  // namespace
}  // namespace troupe::envs
