// Seeded generator of chat-template contexts for parity tests: system, user,
// assistant (plain, reasoning_content, <think> in content), tool calls
// (arguments as objects or JSON strings), tool results, tool definitions,
// add_generation_prompt and template variables (enable_thinking,
// date_string, ...). Text mixes ASCII, accents, CJK, emoji, whitespace runs
// and characters that matter to JSON and to templates. Test-only.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

class ChatGenerator {
 public:
  using json = nlohmann::ordered_json;
  explicit ChatGenerator(uint64_t seed) : rng_(seed) {}

  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[static_cast<size_t>(Int(0, int(v.size()) - 1))]; }

  std::string Word() {
    static const std::vector<std::string> kWords = {
        "the", "model", "reverse", "string", "token", "policy", "weather", "Paris", "42", "3.14",
        "héllo", "naïve", "café", "日本語", "中文字符", "한국어", "Привет", "Ελληνικά", "مرحبا",
        "😀", "🚀🔥", "ß", "İstanbul", "ﬁ", "e\u0301", "\"quoted\"", "back\\slash", "{braces}",
        "{{ x }}", "{% if %}", "<tag>", "a/b", "it's", "tab\tsep", "nbsp\u00a0here", "—", "…",
        "line\u2028sep", "$HOME", "%d", "NaN", "null", "true", "[1, 2]", "0x1F", "-7", "1e5",
        "ctl\x01\x7f", "𝔘𝔫𝔦", "ǅ", "ΣΑΣ", "ﬀ"};
    return Pick(kWords);
  }

  std::string Sentence(int min_words = 1, int max_words = 12) {
    std::string s;
    int n = Int(min_words, max_words);
    for (int i = 0; i < n; ++i) {
      if (i) s += Chance(0.1) ? Pick<std::string>({"\n", "  ", "\n\n", ", ", ". "}) : " ";
      s += Word();
    }
    static const std::vector<std::string> kPads = {
        " ", "\n", "\n\n", "\t", " \n", "\r\n", "\u00a0", "\u3000", "\u2028", "\ufeff",
        "\v", "\f", "\x1c", "\u200b"};
    if (Chance(0.2)) s = Pick(kPads) + s;
    if (Chance(0.2)) s += Pick(kPads);
    return s;
  }

  json ArgValue(int depth = 0) {
    switch (Int(0, depth > 1 ? 4 : 6)) {
      case 0: return Sentence(1, 4);
      case 1: return Int(-1000, 100000);
      case 2: return Pick<double>({0.5, -2.25, 1e-7, 3.0, 1e21, 123.456, 0.1});
      case 3: return Chance(0.5);
      case 4: return nullptr;
      case 5: {
        json a = json::array();
        for (int i = Int(0, 3); i > 0; --i) a.push_back(ArgValue(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (int i = Int(0, 3); i > 0; --i) o[Pick<std::string>({"x", "unit", "días", "b", "10", "2"})] = ArgValue(depth + 1);
        return o;
      }
    }
  }

  std::string ToolName() {
    return Pick<std::string>({"get_weather", "search", "read_file", "submit", "calc", "lookup_city"});
  }

  json Tool() {
    json props = json::object();
    json required = json::array();
    for (int i = Int(1, 3); i > 0; --i) {
      std::string p = Pick<std::string>({"location", "query", "path", "unit", "limit", "answer"});
      props[p] = {{"type", Pick<std::string>({"string", "integer", "number", "boolean"})},
                  {"description", Sentence(1, 6)}};
      if (Chance(0.3)) props[p]["enum"] = json::array({"a", "b", Word()});
      if (Chance(0.6)) required.push_back(p);
    }
    json fn = {{"name", ToolName()}, {"description", Sentence(2, 10)},
               {"parameters", {{"type", "object"}, {"properties", props}, {"required", required}}}};
    if (Chance(0.2)) return fn;  // bare function schema, as some callers pass
    return {{"type", "function"}, {"function", fn}};
  }

  json ToolCall() {
    json args = json::object();
    for (int i = Int(0, 3); i > 0; --i) args[Pick<std::string>({"location", "query", "path", "n", "answer", "ünï"})] = ArgValue();
    json fn = {{"name", ToolName()}};
    fn["arguments"] = Chance(0.25) ? json(args.dump()) : args;
    json call = json::object();
    if (Chance(0.5)) call["id"] = "call_" + std::to_string(Int(0, 99999));
    call["type"] = "function";
    call["function"] = fn;
    return call;
  }

  json Assistant(bool may_think) {
    json m = {{"role", "assistant"}};
    std::string content = Sentence(0, 15);
    if (may_think && Chance(0.25)) {
      m["reasoning_content"] = Sentence(1, 10);
    } else if (may_think && Chance(0.2)) {
      content = Pick<std::string>({"<think>\n", "<think>", ""}) + Sentence(1, 8) +
                Pick<std::string>({"\n</think>\n\n", "</think>", "</think>\n"}) + content;
    }
    m["content"] = content;
    return m;
  }

  // A conversation with tools and tool calls (`tools` may be empty).
  json Conversation(bool with_tools, bool may_think) {
    json msgs = json::array();
    if (!with_tools && Chance(0.3)) {  // strictly alternating user/assistant, as many templates demand
      int turns = Int(1, 4);
      for (int t = 0; t < turns; ++t) {
        msgs.push_back({{"role", "user"}, {"content", Sentence(1, 20)}});
        if (t + 1 < turns || Chance(0.5)) msgs.push_back({{"role", "assistant"}, {"content", Sentence(1, 20)}});
      }
      return msgs;
    }
    if (Chance(0.6)) msgs.push_back({{"role", "system"}, {"content", Sentence(1, 20)}});
    int turns = Int(1, 4);
    for (int t = 0; t < turns; ++t) {
      msgs.push_back({{"role", "user"}, {"content", Sentence(1, 20)}});
      if (t + 1 == turns && Chance(0.5)) break;  // ends on the user: a prompt
      if (with_tools && Chance(0.5)) {
        json call_msg = Assistant(may_think);
        if (Chance(0.3)) call_msg["content"] = "";
        int n = Chance(0.75) ? 1 : 2;
        call_msg["tool_calls"] = json::array();
        for (int i = 0; i < n; ++i) call_msg["tool_calls"].push_back(ToolCall());
        msgs.push_back(call_msg);
        for (int i = 0; i < n; ++i) {
          json tool = {{"role", "tool"}, {"content", Chance(0.3) ? json::object({{"result", ArgValue()}}).dump() : Sentence(1, 10)}};
          if (Chance(0.4)) tool["tool_call_id"] = "call_" + std::to_string(Int(0, 99999));
          if (Chance(0.3)) tool["name"] = ToolName();
          msgs.push_back(tool);
        }
      }
      msgs.push_back(Assistant(may_think));
    }
    return msgs;
  }

  // A full context for a template: messages, tools, flags, special tokens.
  json Context(bool with_tools, bool may_think) {
    json c = json::object();
    c["messages"] = Conversation(with_tools, may_think);
    if (with_tools && Chance(0.6)) {
      json tools = json::array();
      for (int i = Int(1, 3); i > 0; --i) tools.push_back(Tool());
      c["tools"] = tools;
    }
    c["add_generation_prompt"] = Chance(0.5);
    int thinking = Int(0, 2);
    if (thinking == 1) c["enable_thinking"] = true;
    if (thinking == 2) c["enable_thinking"] = false;
    if (Chance(0.5)) c["date_string"] = Pick<std::string>({"26 Jul 2024", "01 Jan 2025", "31 Dec 1999"});
    if (Chance(0.1)) c["tools_in_user_message"] = false;
    c["bos_token"] = Pick<std::string>({"<|begin_of_text|>", "<s>", ""});
    c["eos_token"] = Pick<std::string>({"<|eot_id|>", "</s>", "<|im_end|>"});
    return c;
  }

  // A pinned clock for strftime_now (2020-2030).
  int64_t Now() { return 1577836800 + static_cast<int64_t>(Int(0, 315360000)); }

 private:
  std::mt19937_64 rng_;
};

}  // namespace troupe::testing
