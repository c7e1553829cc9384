// troupe::jinja on its own: what it renders, what it refuses and how the
// refusal reads (template name, line, construct), its limits, and that no
// input crashes it. Parity with the reference is parity_test.cc.
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "troupe/jinja/template.h"

namespace troupe::jinja {
namespace {

using json = nlohmann::ordered_json;

std::string Render(const std::string& src, const json& ctx = json::object(),
                   const RenderOptions& opts = {}) {
  Result<Template> t = Template::Parse(src, "t");
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  Result<std::string> r = t->Render(ctx, opts);
  return r.ok() ? *r : "RENDER ERROR: " + r.status().message();
}

Status RenderStatus(const std::string& src, const json& ctx = json::object(),
                    const RenderOptions& opts = {}) {
  Result<Template> t = Template::Parse(src, "chat_template");
  if (!t.ok()) return t.status();
  Result<std::string> r = t->Render(ctx, opts);
  return r.ok() ? Status::Ok() : r.status();
}

TEST(Jinja, RendersTheChatTemplateBasics) {
  json ctx = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                        {{"role", "assistant"}, {"content", "yo"}}})},
              {"add_generation_prompt", true}};
  EXPECT_EQ(Render("{%- for m in messages %}<{{ m.role }}>{{ m['content'] }}\n{%- endfor %}"
                   "{%- if add_generation_prompt %}<assistant>{% endif %}",
                   ctx),
            "<user>hi<assistant>yo<assistant>");
}

TEST(Jinja, WhitespaceControlFollowsHuggingFaceSettings) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(Render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(Render("a  {{- 'x' -}}  b"), "axb");
  EXPECT_EQ(Render("a {#- c -#} b"), "ab");
  EXPECT_EQ(Render("x\n"), "x");  // one trailing newline is dropped
  EXPECT_EQ(Render("{{ 'x' }}\nnext"), "x\nnext");  // not after {{ }}
}

TEST(Jinja, ValuesPrintAsTheReferencePrintsThem) {
  EXPECT_EQ(Render("{{ 1.0 }} {{ [1.0] }} {{ 1.5 }} {{ 10 / 4 }} {{ 1 ~ 1.0 }}"), "1.0 [1] 1.5 2.5 11");
  EXPECT_EQ(Render("{{ x }}", {{"x", 1e21}}), "1e+21");
  EXPECT_EQ(Render("{{ x }}", {{"x", 1e-7}}), "1e-7");
  EXPECT_EQ(Render("{{ x }}", {{"x", 123456789012.0}}), "123456789012");
  EXPECT_EQ(Render("{{ x | tojson }}", {{"x", {{"b", 1}, {"a", json::array({true, nullptr})}}}}),
            "{\"b\": 1, \"a\": [true, null]}");
  EXPECT_EQ(Render("{{ x | tojson(indent=2) }}", {{"x", {{"a", json::array({1})}}}}),
            "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(Render("{{ 'é\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}"),
            "\"é\\n\" \"\\u00e9\"");
  // JavaScript orders array-index keys first.
  EXPECT_EQ(Render("{{ x | tojson }}", {{"x", json::parse(R"({"b": 1, "2": 2, "a": 3, "1": 4})")}}),
            "{\"1\": 4, \"2\": 2, \"b\": 1, \"a\": 3}");
}

TEST(Jinja, StringsHaveJavaScriptSemantics) {
  EXPECT_EQ(Render("{{ s | length }}", {{"s", "a😀"}}), "3");  // UTF-16 units
  EXPECT_EQ(Render("{{ s[1:] }}", {{"s", "😀ab"}}), "ab");      // slices by code point
  EXPECT_EQ(Render("{{ s | upper }}", {{"s", "straße"}}), "STRASSE");
  EXPECT_EQ(Render("[{{ s.strip('x') }}]", {{"s", "\u00a0 x \n"}}), "[x]");  // the argument is ignored
  EXPECT_EQ(Render("{{ s.split() }}", {{"s", " a  b\u3000c "}}), "[\"a\", \"b\", \"c\"]");
  EXPECT_EQ(Render("{{ s[0] }}", {{"s", "😀"}}).rfind("RENDER ERROR", 0), 0u);  // half a pair: refused
}

TEST(Jinja, StatementsAndScopes) {
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [5] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% macro f(a, b=2) %}{{ a + b }}{% endmacro %}{{ f(1) }}{{ f(1, b=5) }}"), "36");
  EXPECT_EQ(Render("{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }},{% endfor %}"), "2,12,");
  EXPECT_EQ(Render("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}{{ x }}{% endfor %}"), "1123");
  // A break drops what its iteration printed before it (as the reference does).
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}"),
            "1");
  EXPECT_EQ(Render("{% filter upper %}a{{ 'b' }}{% endfilter %}"), "AB");
}

TEST(Jinja, StrftimeNowUsesThePinnedClock) {
  RenderOptions o;
  o.now_unix_seconds = 1721952000;  // 2024-07-26 00:00 UTC
  o.utc = true;
  EXPECT_EQ(Render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%B %m %H:%M %%') }}", {}, o),
            "26 Jul 2024|July 07 00:00 %");
  Status s = RenderStatus("{{ strftime_now('%A') }}", {}, o);
  EXPECT_NE(s.message().find("%A is not supported"), std::string::npos) << s.message();
}

TEST(Jinja, ErrorsNameTheTemplateTheLineAndTheConstruct) {
  struct Case {
    std::string src, want;
  };
  const std::vector<Case> cases = {
      {"a\nb\n{% include 'x.j2' %}", "template 'chat_template' line 3: unsupported statement 'include'"},
      {"{% extends 'base' %}", "line 1: unsupported statement 'extends'"},
      {"\n{% call foo() %}x{% endcall %}", "line 2: unsupported statement 'call'"},
      {"x\n{{ y | frobnicate }}", "line 2: Cannot apply filter \"frobnicate\" to type: UndefinedValue"},
      {"{{ 'a' | frobnicate }}", "line 1: Unknown StringValue filter: frobnicate"},
      {"{{ x is divisibleby(3) }}", "line 1: test 'divisibleby' with arguments is not supported"},
      {"{{ 1 is prime }}", "line 1: Unknown test: prime"},
      {"\n\n{% if x %}never closed", "line 3: 'if' opened on line 3 is never closed with {% endif %}"},
      {"{{ 'open }}", "line 1: unexpected end of input inside a tag"},
      {"{{ x[ }}", "line 1: expected an expression but found '}}'"},
      {"{{ f(*args) }}", "argument unpacking (*x) is not supported"},
      {"{{ raise_exception('Conversation roles must alternate') }}",
       "line 1: raise_exception: Conversation roles must alternate"},
      {"{% break %}", "line 1: 'break' outside a for loop"},
      {"{{ 'a' < 1 }}", "Unknown operator \"<\" between StringValue and IntegerValue"},
      {"{{ foo() }}", "Cannot call something that is not a function 'foo': got UndefinedValue"},
      {"{{ 'x' ☃ }}", "line 1: unexpected character '☃' inside a tag"},
  };
  for (const auto& c : cases) {
    Status s = RenderStatus(c.src);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.src;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << c.src << "\n got: " << s.message();
  }
}

TEST(Jinja, BadContextIsRefusedByName) {
  Status s = RenderStatus("{{ x }}", {{"x", std::string("bad\xff utf8")}});
  EXPECT_NE(s.message().find("context variable 'x': input text is not valid UTF-8"),
            std::string::npos)
      << s.message();
  s = RenderStatus("{{ x }}", {{"range", 1}});
  EXPECT_NE(s.message().find("'range' would replace a global"), std::string::npos) << s.message();
  Result<std::string> r = Template::Parse("x")->Render(json::array());
  EXPECT_FALSE(r.ok());
  json deep = json::array();
  for (int i = 0; i < 300; ++i) deep = json::array({deep});
  s = RenderStatus("{{ x }}", {{"x", deep}});
  EXPECT_NE(s.message().find("nests deeper"), std::string::npos) << s.message();
}

TEST(Jinja, LimitsStopRunawayTemplates) {
  RenderOptions o;
  o.max_steps = 100000;
  Status s = RenderStatus("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          {}, o);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.message();
  EXPECT_NE(s.message().find("evaluation steps"), std::string::npos) << s.message();
  o = RenderOptions{};
  o.max_output_bytes = 1000;
  s = RenderStatus("{% for i in range(2000) %}ab{% endfor %}", {}, o);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.message();
  s = RenderStatus("{% set ns = namespace(s='ab') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}"
                   "{% endfor %}",
                   {}, o);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.message();
  s = RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.message();
  EXPECT_NE(s.message().find("calls nest deeper than 100"), std::string::npos) << s.message();
  std::string deep(5000, '(');
  s = RenderStatus("{{ " + deep + " }}");
  EXPECT_NE(s.message().find("nests deeper than"), std::string::npos) << s.message();
}

TEST(Jinja, ConcurrentRendersOfOneTemplateAgree) {
  Result<Template> t = Template::Parse(
      "{% for m in messages %}{{ m.content | upper }}{{ m | tojson(sort_keys=true) }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  json ctx = {{"messages", json::array()}};
  for (int i = 0; i < 50; ++i) ctx["messages"].push_back({{"content", "ünï " + std::to_string(i)}, {"b", i}});
  std::string want = *t->Render(ctx);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) ok[k] += *t->Render(ctx) == want;
    });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], 50);
}

// Mutated real-looking templates and random bytes: always a value, never a crash.
TEST(Jinja, NoInputCrashes) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("TROUPE_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::cout << "seed " << seed << "\n";
  std::mt19937_64 rng(seed);
  const std::string base =
      "{%- if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% set ns = namespace(i=0) %}"
      "{% for m in messages[::-1] if m.role != 'x' %}{% set ns.i = loop.index0 %}"
      "{{- '<|' ~ m.role ~ '|>' + m.content.split('</think>')[-1].strip() }}{% if m.tool_calls %}"
      "{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endif %}"
      "{%- else %}{{ raise_exception('no messages') }}{% endfor %}{{ ns.i is number }}";
  const std::string alphabet = "{}%#-|.()[]:,'\"=~+*/<>!abcdefgimnorstx \n\\0123456789";
  json ctx = {{"messages", json::array({{{"role", "user"}, {"content", "a</think>b"}},
                                        {{"role", "assistant"}, {"content", "c"},
                                         {"tool_calls", json::array({{{"function", {{"arguments", {{"k", 1}}}}}}})}}})},
              {"tools", json::array({{{"name", "t"}}})}};
  RenderOptions o;
  o.max_steps = 200000;
  o.max_output_bytes = 1 << 20;
  int parsed = 0, rendered = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string src = base;
    int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % (src.size() + 1);
      switch (rng() % 3) {
        case 0: src.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 1: if (at < src.size()) src.erase(at, 1 + rng() % 4); break;
        default: if (at < src.size()) src[at] = static_cast<char>(rng() % 256); break;
      }
    }
    Result<Template> t = Template::Parse(src, "fuzz");
    if (!t.ok()) {
      EXPECT_FALSE(t.status().message().empty());
      continue;
    }
    ++parsed;
    Result<std::string> r = t->Render(ctx, o);
    rendered += r.ok();
  }
  std::cout << parsed << " of 3000 mutants parsed, " << rendered << " rendered\n";
  EXPECT_GT(parsed, 100);
}

}  // namespace
}  // namespace troupe::jinja
