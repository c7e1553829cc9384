// Parity of troupe::jinja with @huggingface/jinja (the implementation
// transformers.js uses), run under Node as a real process, on real chat
// templates from npm packages (tests/reference/jinja_reference.mjs) and
// generated conversations (seed printed; TROUPE_SEED=N replays one).
//
// For every case the two renders must agree: the same text, or both refuse
// (raise_exception, an unsupported construct). On the templates of the models
// Troupe targets (Qwen3, Qwen2.5, Llama 3/3.1/3.2, Llama 2, Mistral) every
// case the reference renders must render identically. On the other published
// templates, identical text is required whenever both render; where only the
// reference renders, the test lists the constructs we refuse.
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/chat_conversations.h"
#include "../common/node_runner.h"
#include "troupe/jinja/template.h"

namespace troupe::jinja {
namespace {

using json = nlohmann::ordered_json;

uint64_t Seed() {
  if (const char* s = std::getenv("TROUPE_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

std::string Script() { return testing::SourceDir() + "/tests/reference/jinja_reference.mjs"; }

// Where two texts first differ, with a little context.
std::string FirstDifference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + ":\n  ours: " + json(a.substr(from, 100)).dump() +
         "\n  ref:  " + json(b.substr(from, 100)).dump();
}

struct Tally {
  int same = 0, both_refuse = 0, only_ref_renders = 0, only_we_render = 0, differ = 0;
  std::set<std::string> our_refusals;
};

const std::set<std::string>& CoreTemplates() {
  static const std::set<std::string> kCore = {
      "qwen3",           "library/llama3.1:8b", "library/llama3.2:3b",
      "library/llama3:8b", "library/qwen2.5:0.5b", "library/llama2:7b",
      "library/mistral:7b-instruct-fp16"};
  return kCore;
}

TEST(JinjaParity, RealTemplatesRenderLikeTheReference) {
  std::string missing = testing::NodeReferenceMissing();
  ASSERT_TRUE(missing.empty()) << missing;
  uint64_t seed = Seed();
  std::cout << "seed " << seed << " (TROUPE_SEED=" << seed << " replays it)\n";

  testing::NodeResult listed = testing::RunNode(Script(), {"templates"}, "");
  ASSERT_TRUE(listed.ok) << listed.error;
  json templates = json::parse(listed.out);
  for (const auto& id : CoreTemplates()) ASSERT_TRUE(templates.contains(id)) << id;

  std::map<std::string, Template> parsed;
  std::map<std::string, std::string> parse_errors;
  for (auto it = templates.begin(); it != templates.end(); ++it) {
    Result<Template> t = Template::Parse(it.value().get<std::string>(), it.key());
    if (t.ok()) {
      parsed.emplace(it.key(), *t);
    } else {
      parse_errors[it.key()] = t.status().message();
    }
  }
  for (const auto& id : CoreTemplates()) ASSERT_EQ(parse_errors.count(id), 0u) << parse_errors[id];

  testing::ChatGenerator gen(seed);
  struct Case {
    std::string id;
    json context;
    int64_t now;
  };
  std::vector<Case> cases;
  for (auto it = templates.begin(); it != templates.end(); ++it) {
    const std::string& id = it.key();
    int n = id == "qwen3" || id == "library/llama3.1:8b" ? 400 : CoreTemplates().count(id) ? 150 : 12;
    for (int i = 0; i < n; ++i) {
      bool tools = gen.Chance(0.6);
      cases.push_back({id, gen.Context(tools, /*may_think=*/true), gen.Now()});
    }
  }
  std::string input;
  for (const Case& c : cases)
    input += json({{"template", c.id}, {"context", c.context}, {"now", c.now}}).dump() + "\n";
  testing::NodeResult rendered = testing::RunNode(Script(), {"render"}, input, 300);
  ASSERT_TRUE(rendered.ok) << rendered.error;
  std::vector<json> answers;
  std::istringstream lines(rendered.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) answers.push_back(json::parse(line));
  ASSERT_EQ(answers.size(), cases.size());

  std::map<std::string, Tally> tally;
  int core_cases = 0, reported = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const json& ref = answers[i];
    Tally& t = tally[c.id];
    bool core = CoreTemplates().count(c.id) > 0;
    core_cases += core;
    bool ref_ok = ref["ok"].get<bool>();
    auto p = parsed.find(c.id);
    RenderOptions opts;
    opts.now_unix_seconds = c.now;
    opts.utc = true;
    Result<std::string> ours =
        p == parsed.end() ? Result<std::string>(InvalidArgument("{}", parse_errors[c.id]))
                          : p->second.Render(c.context, opts);
    if (ours.ok() && ref_ok) {
      const std::string& want = ref["text"].get_ref<const std::string&>();
      if (*ours == want) {
        ++t.same;
      } else {
        ++t.differ;
        if (reported++ < 8)
          ADD_FAILURE() << c.id << " case " << i << " renders differently "
                        << FirstDifference(*ours, want) << "\ncontext: " << c.context.dump();
      }
    } else if (!ours.ok() && !ref_ok) {
      ++t.both_refuse;
    } else if (ref_ok) {
      ++t.only_ref_renders;
      t.our_refusals.insert(ours.status().message().substr(0, 160));
      if (core && reported++ < 8)
        ADD_FAILURE() << c.id << " case " << i << ": the reference renders it, we refuse: "
                      << ours.status().message() << "\ncontext: " << c.context.dump();
    } else {
      ++t.only_we_render;
      t.our_refusals.insert("(reference refuses: " + ref["error"].get<std::string>().substr(0, 120) + ")");
    }
  }

  int total_same = 0, total = 0;
  for (const auto& [id, t] : tally) {
    total_same += t.same + t.both_refuse;
    total += t.same + t.both_refuse + t.only_ref_renders + t.only_we_render + t.differ;
    bool core = CoreTemplates().count(id) > 0;
    if (core || t.only_ref_renders || t.only_we_render || t.differ)
      std::cout << (core ? "core  " : "other ") << id << ": same " << t.same << ", both refuse "
                << t.both_refuse << ", only the reference renders " << t.only_ref_renders
                << ", only we render " << t.only_we_render << ", differ " << t.differ << "\n";
    for (const auto& r : t.our_refusals) std::cout << "    " << r << "\n";
    EXPECT_EQ(t.differ, 0) << id;
    if (core) {
      EXPECT_EQ(t.only_ref_renders, 0) << id;
      EXPECT_EQ(t.only_we_render, 0) << id;
      EXPECT_GT(t.same, 0) << id << ": no case rendered at all";
    }
  }
  for (const auto& [id, why] : parse_errors) std::cout << "parse refused " << id << ": " << why << "\n";
  std::cout << "agree on " << total_same << " of " << total << " cases (" << core_cases
            << " on the core templates) across " << templates.size() << " templates\n";
  EXPECT_GE(core_cases, 500);
}

}  // namespace
}  // namespace troupe::jinja
