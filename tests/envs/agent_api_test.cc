// The agent path's pure pieces: the OpenAI request decoder (every refusal, and
// a fuzz pass over mutated and random bodies), the response encoder's training
// fields, the NeMo Gym /run answer parser (masks, env tokens, rewritten
// history), the generation ledger's checks and the agents config.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "troupe/envs/agent.h"
#include "troupe/envs/openai_api.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

std::optional<ApiError> Decode(const std::string& body, bool chat, CompletionRequest* out) {
  return DecodeCompletionRequest(body, chat, ApiLimits{}, out);
}

TEST(OpenAiDecode, CompletionWithTextAndTokenIdPrompts) {
  CompletionRequest r;
  ASSERT_FALSE(Decode(R"({"model":"m","prompt":"abc","n":3,"temperature":0.5,"top_p":0.9,
                          "max_tokens":7,"stop":["\n","=="],"logprobs":1,"seed":42})",
                      false, &r));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.n, 3);
  EXPECT_DOUBLE_EQ(r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "=="}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.seed, 42u);
  ASSERT_FALSE(Decode(R"({"model":"m","prompt":[[1,5,9]]})", false, &r));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(r.max_tokens, ApiLimits{}.default_max_tokens);
}

TEST(OpenAiDecode, ChatMessagesWithCarriedTokenIds) {
  CompletionRequest r;
  ASSERT_FALSE(Decode(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":"yo","prompt_token_ids":[1,2],"generation_token_ids":[3]},
      {"role":"tool","content":"out"}],"max_completion_tokens":5})",
                      true, &r));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].message.role, Role::kSystem);
  EXPECT_EQ(r.messages[1].message.content, "hi there");
  EXPECT_EQ(r.messages[2].prompt_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.messages[2].generation_token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.messages[3].message.role, Role::kTool);
  EXPECT_EQ(r.max_tokens, 5);
}

struct Refusal {
  const char* body;
  bool chat;
  int status;
  const char* param;
};

TEST(OpenAiDecode, EveryRefusalNamesItsFieldAndStatus) {
  const std::vector<Refusal> cases = {
      {"{not json", false, 400, ""},
      {"[1,2]", false, 400, ""},
      {R"({"prompt":"a"})", false, 400, "model"},
      {R"({"model":7,"prompt":"a"})", false, 400, "model"},
      {R"({"model":"m"})", false, 400, "prompt"},
      {R"({"model":"m","prompt":""})", false, 400, "prompt"},
      {R"({"model":"m","prompt":[]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":[1,-2]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":[1,2.5]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":["a","b"]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":"a","n":0})", false, 400, "n"},
      {R"({"model":"m","prompt":"a","n":17})", false, 400, "n"},
      {R"({"model":"m","prompt":"a","n":"2"})", false, 400, "n"},
      {R"({"model":"m","prompt":"a","temperature":-1})", false, 400, "temperature"},
      {R"({"model":"m","prompt":"a","temperature":"hot"})", false, 400, "temperature"},
      {R"({"model":"m","prompt":"a","top_p":0})", false, 400, "top_p"},
      {R"({"model":"m","prompt":"a","top_p":1.5})", false, 400, "top_p"},
      {R"({"model":"m","prompt":"a","max_tokens":0})", false, 400, "max_tokens"},
      {R"({"model":"m","prompt":"a","max_tokens":100000})", false, 400, "max_tokens"},
      {R"({"model":"m","prompt":"a","stop":[1]})", false, 400, "stop"},
      {R"({"model":"m","prompt":"a","stop":["a","b","c","d","e"]})", false, 400, "stop"},
      {R"({"model":"m","prompt":"a","logprobs":"yes"})", false, 400, "logprobs"},
      {R"({"model":"m","prompt":"a","seed":1.5})", false, 400, "seed"},
      {R"({"model":"m","prompt":"a","stream":"yes"})", false, 400, "stream"},
      {R"({"model":"m","prompt":"a","stream_options":{"include_usage":true}})", false, 400,
       "stream_options"},
      {R"({"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":1}})", false,
       400, "stream_options.include_usage"},
      {R"({"model":"m","prompt":"a","tools":[]})", false, 400, "tools"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],"tools":{}})", true, 400,
       "tools"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"code"}]})",
       true, 400, "tools[0]"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":3}]})", true,
       400, "tools[0]"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],
           "tools":[{"type":"function","function":{"name":""}}]})",
       true, 400, "tools[0].function.name"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],
           "tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]})",
       true, 400, "tools[0].function.parameters"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":"required"})", true,
       400, "tool_choice"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],
           "tool_choice":{"type":"function","function":{"name":"f"}}})",
       true, 400, "tool_choice"},
      {R"({"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":"sometimes"})",
       true, 400, "tool_choice"},
      {R"({"model":"m","messages":[{"role":"user","content":"q","tool_calls":[
           {"function":{"name":"f"}}]}]})",
       true, 400, "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"tool","content":"q","tool_call_id":3}]})", true, 400,
       "messages[0].tool_call_id"},
      {R"({"model":"m"})", true, 400, "messages"},
      {R"({"model":"m","messages":[]})", true, 400, "messages"},
      {R"({"model":"m","messages":[3]})", true, 400, "messages[0]"},
      {R"({"model":"m","messages":[{"content":"x"}]})", true, 400, "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", true, 400,
       "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, 400,
       "messages[0].content[0]"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":3,"text":"x"}]}]})", true,
       400, "messages[0].content[0]"},
      {R"({"model":"m","messages":[{"role":"assistant","content":null,
           "tool_calls":[{"id":"c"}]}]})",
       true, 400, "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"assistant","content":null,
           "tool_calls":[{"id":"c","type":"function","function":{"name":"f",
           "arguments":"{not json"}}]}]})",
       true, 400, "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"assistant","content":null,
           "tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]})",
       true, 400, "messages[0].tool_calls"},
      {R"({"model":"m","messages":[{"role":"assistant","content":"x",
           "prompt_token_ids":[1]}]})",
       true, 400, "messages[0]"},
  };
  for (const auto& c : cases) {
    CompletionRequest r;
    auto e = Decode(c.body, c.chat, &r);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, c.status) << c.body << ": " << e->message;
    EXPECT_EQ(e->param, c.param) << c.body << ": " << e->message;
    EXPECT_FALSE(e->message.empty());
    json body = json::parse(e->Json());
    EXPECT_EQ(body["error"]["message"], e->message);
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(body["error"].contains("param") && body["error"].contains("code"));
  }
}

TEST(OpenAiDecode, OversizedBodiesAndPromptsAre413) {
  ApiLimits small;
  small.max_body_bytes = 64;
  small.max_prompt_tokens = 3;
  CompletionRequest r;
  auto e = DecodeCompletionRequest(std::string(65, ' '), false, small, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 413);
  e = DecodeCompletionRequest(R"({"model":"m","prompt":[1,2,3,4]})", false, small, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 413);
  EXPECT_EQ(e->code, "context_length_exceeded");
}

// Mutations of valid bodies and random bytes: never a crash or an exception, and
// every refusal is a well-formed OpenAI error body.
TEST(OpenAiDecode, FuzzedBodiesNeverCrash) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> valid = {
      R"({"model":"m","prompt":"abc","n":2,"stop":["x"],"logprobs":true,"seed":3})",
      R"({"model":"m","prompt":[1,2,3],"max_tokens":4,"temperature":0})",
      R"({"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant",
          "content":"a","prompt_token_ids":[1],"generation_token_ids":[2]},
          {"role":"tool","content":"t"}]})",
      R"({"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant",
          "content":null,"tool_calls":[{"id":"call_1","type":"function","function":{
          "name":"get","arguments":"{\"k\": [1, 2]}"}}]},{"role":"tool","tool_call_id":
          "call_1","content":"t"}],"tools":[{"type":"function","function":{"name":"get",
          "description":"d","parameters":{"type":"object"}}}],"tool_choice":"auto",
          "stream":true,"stream_options":{"include_usage":true}})"};
  const std::string alphabet = "{}[]\":,0123456789.-eE truefalsnul\\\x01\xff";
  int accepted = 0, refused = 0;
  for (int it = 0; it < 20000; ++it) {
    std::string body;
    if (it % 5 == 0) {
      size_t n = rng() % 64;
      for (size_t i = 0; i < n; ++i) body.push_back(static_cast<char>(rng() & 0xff));
    } else {
      body = valid[rng() % valid.size()];
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < edits && !body.empty(); ++k) {
        size_t pos = rng() % body.size();
        switch (rng() % 3) {
          case 0:
            body[pos] = alphabet[rng() % alphabet.size()];
            break;
          case 1:
            body.erase(pos, 1 + rng() % 4);
            break;
          default:
            body.insert(pos, 1, alphabet[rng() % alphabet.size()]);
        }
      }
    }
    for (bool chat : {false, true}) {
      CompletionRequest r;
      std::optional<ApiError> e;
      ASSERT_NO_THROW(e = Decode(body, chat, &r)) << body;
      if (!e) {
        ++accepted;
        EXPECT_GE(r.n, 1);
        EXPECT_GE(r.max_tokens, 1);
        EXPECT_TRUE(chat ? !r.messages.empty() : (r.prompt_is_ids || !r.prompt.empty()));
        continue;
      }
      ++refused;
      EXPECT_TRUE(e->status == 400 || e->status == 413 || e->status == 422) << e->status;
      json j = json::parse(e->Json(), nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << e->Json();
      EXPECT_TRUE(j["error"]["message"].is_string());
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

TEST(OpenAiDecode, ToolsToolCallsAndStreamFields) {
  CompletionRequest r;
  auto e = Decode(R"({"model":"m","messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
       "function":{"name":"get","arguments":"{\"k\": 1}"}},{"function":{"name":"put",
       "arguments":{"v":"x"}}}]},{"role":"tool","tool_call_id":"call_1","content":"t"}],
      "tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object"}}}],
      "stream":true,"stream_options":{"include_usage":true}})",
                  true, &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[1].message.content, "");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get");
  EXPECT_EQ(r.messages[1].tool_calls[0].args, json({{"k", 1}}));
  EXPECT_EQ(r.messages[1].tool_calls[1].args, json({{"v", "x"}}));
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ParsesToolCalls());
  EXPECT_EQ(r.tools[0]["function"]["name"], "get");
  // tool_choice "none" turns parsing off; no tools: nothing to parse.
  ASSERT_FALSE(Decode(R"({"model":"m","messages":[{"role":"user","content":"q"}],
      "tools":[{"type":"function","function":{"name":"get"}}],"tool_choice":"none"})",
                      true, &r));
  EXPECT_FALSE(r.ParsesToolCalls());
  EXPECT_FALSE(r.stream);
  ASSERT_FALSE(Decode(R"({"model":"m","messages":[{"role":"user","content":"q"}]})", true, &r));
  EXPECT_FALSE(r.ParsesToolCalls());
  // The calls are written after the text as the chat-template command writes them.
  auto calls = ReadToolCalls(json::parse(R"([{"function":{"name":"get","arguments":{"k":1}}},
                                             {"name":"put"}])"));
  ASSERT_TRUE(calls.ok()) << calls.status().ToString();
  EXPECT_EQ(AppendToolCalls("I will.", *calls, ToolCallFormat::kTroupe).value(),
            "I will.\n<tool>get {\"k\":1}</tool>\n<tool>put</tool>");
  EXPECT_EQ(AppendToolCalls("", {(*calls)[0]}, ToolCallFormat::kHermes).value(),
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"k\": 1}}\n</tool_call>");
  // A name the syntax cannot write back is refused, naming the call.
  auto odd = ReadToolCalls(json::parse(R"([{"name":"get"},{"name":"a\"b"}])"));
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  for (ToolCallFormat f : {ToolCallFormat::kTroupe, ToolCallFormat::kHermes}) {
    auto refused = AppendToolCalls("", *odd, f);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("tool_calls[1]: tool name 'a\"b' cannot be written"),
              std::string::npos)
        << refused.status().message();
  }
}

TEST(OpenAiEncode, ParsedToolCallsShapeTheChoice) {
  CompletionRequest chat;
  chat.chat = true;
  CompletionChoice c;
  c.text = "Let me look.\n<tool>get {\"k\": [1, 2]}</tool>";
  c.generation_ids = {5, 6};
  c.logprobs = {-1.f, -2.f};
  c.finish_reason = "stop";
  ShapeToolCall(&c, ToolCallFormat::kTroupe, "call_ab12");
  EXPECT_EQ(c.finish_reason, "tool_calls");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.content, std::optional<std::string>("Let me look."));
  json j = json::parse(EncodeCompletionResponse(chat, "x", 1, "m", {c}));
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["content"], "Let me look.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_ab12");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"k", {1, 2}}}));
  EXPECT_EQ(msg["generation_token_ids"], json({5, 6}));  // the ids still cover the whole text
  // Only the call: content null. Hermes calls parse in the Hermes format.
  CompletionChoice h;
  h.text = "<tool_call>\n{\"name\": \"put\", \"arguments\": {}}\n</tool_call>";
  h.finish_reason = "stop";
  ShapeToolCall(&h, ToolCallFormat::kHermes, "call_1");
  ASSERT_EQ(h.tool_calls.size(), 1u);
  EXPECT_FALSE(h.content);
  j = json::parse(EncodeCompletionResponse(chat, "x", 1, "m", {h}));
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  // A malformed call and plain text stay content with their finish reason.
  for (std::string text : {"<tool>Bad-Name {}</tool>", "<tool>get {\"k\": </tool>", "no call"}) {
    CompletionChoice m;
    m.text = text;
    m.finish_reason = "length";
    ShapeToolCall(&m, ToolCallFormat::kTroupe, "call_2");
    EXPECT_TRUE(m.tool_calls.empty()) << text;
    EXPECT_EQ(m.finish_reason, "length");
    j = json::parse(EncodeCompletionResponse(chat, "x", 1, "m", {m}));
    EXPECT_EQ(j["choices"][0]["message"]["content"], text);
    EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  }
}

TEST(OpenAiStream, ChunksAndTheStreamablePrefix) {
  CompletionRequest chat;
  chat.chat = true;
  json d = json::parse(EncodeStreamDelta(chat, "c", 1, "m", 1, "he", true));
  EXPECT_EQ(d["object"], "chat.completion.chunk");
  EXPECT_EQ(d["choices"][0]["index"], 1);
  EXPECT_EQ(d["choices"][0]["delta"], json({{"role", "assistant"}, {"content", "he"}}));
  EXPECT_TRUE(d["choices"][0]["finish_reason"].is_null());
  CompletionChoice c;
  c.text = "hi <tool>get</tool>";
  c.prompt_ids = {1};
  c.generation_ids = {4, 5};
  c.logprobs = {-1.f, -0.5f};
  c.policy_version = 3;
  c.finish_reason = "stop";
  ShapeToolCall(&c, ToolCallFormat::kTroupe, "call_9");
  json f = json::parse(EncodeStreamFinal(chat, "c", 1, "m", 0, c, "", false));
  EXPECT_EQ(f["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_FALSE(f["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(f["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(f["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get");
  EXPECT_EQ(f["choices"][0]["generation_token_ids"], json({4, 5}));
  EXPECT_EQ(f["choices"][0]["policy_version"], 3);
  CompletionRequest plain;
  json u = json::parse(EncodeStreamUsage(plain, "c", 1, "m", {c, c}));
  EXPECT_EQ(u["object"], "text_completion");
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 4);
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
  // What may be sent: not a tail that may become a stop string or a marker, not past a
  // marker, not half a UTF-8 character, and (with tools) not trailing whitespace.
  const auto troupe = ToolCallMarkers(ToolCallFormat::kTroupe);
  EXPECT_EQ(StreamableLength("hello", {}, {}, false), 5u);
  EXPECT_EQ(StreamableLength("hello wor", {"world"}, {}, false), 6u);
  EXPECT_EQ(StreamableLength("hello <to", {}, troupe, false), 6u);
  EXPECT_EQ(StreamableLength("hello <to", {}, troupe, true), 5u);
  EXPECT_EQ(StreamableLength("hi <tool>get", {}, troupe, true), 2u);
  EXPECT_EQ(StreamableLength("a\xc3", {}, {}, false), 1u);
  EXPECT_EQ(StreamableLength("a\xc3\xa9", {}, {}, false), 3u);
  EXPECT_EQ(StreamableLength("a\xe2\x82", {}, {}, false), 1u);
  EXPECT_EQ(StreamableLength("<", {}, troupe, false), 0u);
  EXPECT_EQ(
      StreamableLength("x {\"name\"", {}, ToolCallMarkers(ToolCallFormat::kLlama3Json), false), 2u);
}

TEST(OpenAiEncode, ResponsesCarryTheTrainingFields) {
  CompletionRequest chat;
  chat.chat = true;
  chat.logprobs = true;
  CompletionChoice c;
  c.text = "hi";
  c.prompt_ids = {1, 2};
  c.generation_ids = {7, 8, 3};
  c.logprobs = {-0.5f, -1.25f, -0.125f};
  c.tokens = {"h", "i", "</s>"};
  c.finish_reason = "stop";
  c.policy_version = 4;
  json j = json::parse(EncodeCompletionResponse(chat, "chatcmpl-1", 5, "m", {c}));
  EXPECT_EQ(j["object"], "chat.completion");
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "hi");
  EXPECT_EQ(msg["prompt_token_ids"], json({1, 2}));
  EXPECT_EQ(msg["generation_token_ids"], json({7, 8, 3}));
  EXPECT_EQ(msg["generation_log_probs"], json({-0.5, -1.25, -0.125}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][1]["logprob"], -1.25);
  EXPECT_EQ(j["policy_version"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  CompletionRequest plain;
  j = json::parse(EncodeCompletionResponse(plain, "cmpl-1", 5, "m", {c}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "hi");
  EXPECT_EQ(j["choices"][0]["generation_token_ids"], json({7, 8, 3}));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

// ------------------------------------------------------------------ /run answers

json Turn(std::vector<int> prompt, std::vector<int> gen, std::vector<double> lp,
          const char* type = "function_call") {
  return {{"type", type},
          {"prompt_token_ids", prompt},
          {"generation_token_ids", gen},
          {"generation_log_probs", lp}};
}

TEST(AgentResponse, EnvironmentTokensBetweenTurnsAreMaskedOut) {
  json out = {{"reward", 0.75},
              {"response",
               {{"output",
                 {Turn({1, 2, 3}, {10, 11}, {-0.1, -0.2}),
                  {{"type", "function_call_output"}, {"call_id", "c"}, {"output", "ok"}},
                  Turn({1, 2, 3, 10, 11, 20, 21, 22}, {12}, {-0.3}, "message")}}}}};
  auto ep = ParseAgentResponse(out.dump(), 1000);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  EXPECT_DOUBLE_EQ(ep->reward, 0.75);
  EXPECT_EQ(ep->prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ep->response, (std::vector<int32_t>{10, 11, 20, 21, 22, 12}));
  EXPECT_EQ(ep->mask, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(ep->turn_of, (std::vector<int32_t>{0, 0, -1, -1, -1, 1}));
  ASSERT_EQ(ep->logprobs.size(), 6u);
  EXPECT_FLOAT_EQ(ep->logprobs[1], -0.2f);
  EXPECT_FLOAT_EQ(ep->logprobs[2], 0.0f);
  EXPECT_FLOAT_EQ(ep->logprobs[5], -0.3f);
  EXPECT_EQ(ep->turns.size(), 2u);
}

TEST(AgentResponse, FailuresAreValuesOfTheirKind) {
  auto code = [](const json& j) { return ParseAgentResponse(j.dump(), 1000).status().code(); };
  // The agent's own failures (reward 0, agent_error).
  EXPECT_EQ(code({{"error", "tool crashed"}, {"reward", 0}}), Code::kCancelled);
  EXPECT_EQ(code({{"response", {{"output", json::array()}}}, {"reward", 0}}), Code::kCancelled);
  EXPECT_EQ(code({{"response", {{"output", {{{"type", "function_call_output"}}}}}}, {"reward", 0}}),
            Code::kCancelled);
  // Rewritten history: the second prompt drops a token of the first turn.
  json rewritten = {
      {"reward", 1},
      {"response", {{"output", {Turn({1, 2}, {3, 4}, {-1, -1}), Turn({1, 2, 4, 9}, {5}, {-1})}}}}};
  auto s = ParseAgentResponse(rewritten.dump(), 1000).status();
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.message().find("rewritten"), std::string::npos) << s.ToString();
  // Malformed answers.
  EXPECT_EQ(ParseAgentResponse("not json", 1000).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(code({{"response", {{"output", {Turn({1}, {2}, {-1})}}}}}), Code::kInvalidArgument);
  EXPECT_EQ(code({{"reward", 1}, {"response", {{"output", {Turn({1}, {2, 3}, {-1})}}}}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({{"reward", 1}, {"response", {{"output", {Turn({1}, {2}, {0.5})}}}}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({{"reward", 1}, {"response", {{"output", {Turn({1}, {-2}, {-1})}}}}}),
            Code::kInvalidArgument);
  EXPECT_EQ(code({{"reward", 1}, {"response", {{"output", {Turn({}, {2}, {-1})}}}}}),
            Code::kInvalidArgument);
  EXPECT_EQ(ParseAgentResponse(
                json({{"reward", 1}, {"response", {{"output", {Turn({1, 2}, {3, 4}, {-1, -1})}}}}})
                    .dump(),
                3)
                .status()
                .code(),
            Code::kInvalidArgument);  // longer than the model's context
}

TEST(GenerationLedger, VerifiesTurnsAgainstWhatWasGenerated) {
  GenerationLedger ledger;
  ledger.Open("g");
  EXPECT_FALSE(ledger.Record("other", {}));
  ASSERT_TRUE(ledger.Record("g", {{1, 2, 3}, {10, 11}, {-0.1f, -0.2f}, {5, 6}, 5}));
  ASSERT_TRUE(ledger.Record("g", {{1, 2, 3, 10, 11, 20}, {12}, {-0.3f}, {7}, 7}));
  json ok = {
      {"reward", 1},
      {"response",
       {{"output",
         {Turn({1, 2, 3}, {10, 11}, {-0.1, -0.2}), Turn({1, 2, 3, 10, 11, 20}, {12}, {-0.3})}}}}};
  auto ep = ParseAgentResponse(ok.dump(), 100);
  ASSERT_TRUE(ep.ok());
  std::vector<uint64_t> versions;
  uint64_t oldest = 0;
  ASSERT_TRUE(ledger.Verify("g", *ep, &versions, &oldest).ok());
  EXPECT_EQ(oldest, 5u);
  EXPECT_EQ(versions, (std::vector<uint64_t>{5, 6, 0, 7}));
  // A log-prob the sampler did not use.
  json lp = ok;
  lp["response"]["output"][1]["generation_log_probs"][0] = -0.9;
  ep = ParseAgentResponse(lp.dump(), 100);
  ASSERT_TRUE(ep.ok());
  auto s = ledger.Verify("g", *ep, &versions, &oldest);
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.message().find("log_probs differ"), std::string::npos) << s.ToString();
  // Tokens the endpoint never generated (re-tokenized reply).
  json ids = ok;
  ids["response"]["output"][0]["generation_token_ids"] = {10, 13};
  ids["response"]["output"][1]["prompt_token_ids"] = {1, 2, 3, 10, 13, 20};
  ep = ParseAgentResponse(ids.dump(), 100);
  ASSERT_TRUE(ep.ok());
  s = ledger.Verify("g", *ep, &versions, &oldest);
  EXPECT_NE(s.message().find("no such reply"), std::string::npos) << s.ToString();
  // After the group closes nothing verifies or records.
  ledger.Close("g");
  EXPECT_FALSE(ledger.IsOpen("g"));
  EXPECT_FALSE(ledger.Record("g", {}));
  EXPECT_FALSE(ledger.Verify("g", *ParseAgentResponse(ok.dump(), 100), &versions, &oldest).ok());
}

TEST(AgentsConfig, ValidatesAndRoutesByAgentRef) {
  AgentsConfig c;
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_FALSE(c.enabled());
  c.servers = {{"math", "http://127.0.0.1:1"}, {"code", "http://127.0.0.1:2"}};
  ASSERT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.Route("math"), "math");
  EXPECT_EQ(c.Route(""), "code");  // the first by name
  EXPECT_EQ(c.Route("nope"), "code");
  c.default_server = "math";
  EXPECT_EQ(c.Route("nope"), "math");
  EXPECT_EQ(AgentRefOf(R"({"agent_ref": {"type": "responses_api_agents", "name": "code"}})"),
            "code");
  EXPECT_EQ(AgentRefOf(R"({"agent_ref": "math"})"), "math");
  EXPECT_EQ(AgentRefOf("{bad"), "");
  c.default_server = "missing";
  EXPECT_NE(c.Validate().message().find("default_server"), std::string::npos);
  c.default_server = "";
  c.servers["bad name"] = "http://x";
  EXPECT_FALSE(c.Validate().ok());
  c.servers.erase("bad name");
  c.servers["ftp"] = "ftp://x";
  EXPECT_NE(c.Validate().message().find("http://"), std::string::npos);
  c.servers.erase("ftp");
  c.max_concurrency = 0;
  EXPECT_NE(c.Validate().message().find("max_concurrency"), std::string::npos);
}

// The endpoint gets a thread per /run worker (each session makes one model call at a time)
// unless endpoint_threads says otherwise: fewer would queue sessions' calls behind each other.
TEST(AgentsConfig, EndpointThreadsFollowTheRunWorkersUnlessSet) {
  AgentsConfig c;
  c.servers = {{"a", "http://127.0.0.1:1"}, {"b", "http://127.0.0.1:2"}};
  c.max_concurrency = 40;
  ASSERT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.RunWorkers(), 80);
  EXPECT_EQ(c.EndpointThreads(), 88);
  c.max_concurrency = 100;
  EXPECT_EQ(c.RunWorkers(), 128);  // the rollout actor's cap
  EXPECT_EQ(c.EndpointThreads(), 136);
  c.endpoint_threads = 12;
  EXPECT_EQ(c.EndpointThreads(), 12);
  c.endpoint_threads = -1;
  EXPECT_NE(c.Validate().message().find("endpoint_threads"), std::string::npos);
  c.endpoint_threads = 1025;
  EXPECT_NE(c.Validate().message().find("endpoint_threads"), std::string::npos);
}

TEST(AgentRunBody, CarriesTheTaskRowEndpointAndToken) {
  json b = json::parse(MakeRunBody({{Role::kUser, "reverse"}}, "t/train/1", "file_reverse", "cba",
                                   R"({"word": "abc"})", "http://h:1/g/x/v1", "tok", "job", "x/0",
                                   0.7, 1.0, 48));
  EXPECT_EQ(b["word"], "abc");  // task row fields at top level (NeMo Gym rows)
  EXPECT_EQ(b["responses_create_params"]["input"][0]["content"], "reverse");
  EXPECT_EQ(b["responses_create_params"]["max_output_tokens"], 48);
  EXPECT_EQ(b["base_url"], "http://h:1/g/x/v1");
  EXPECT_EQ(b["api_key"], "tok");
  EXPECT_EQ(b["task"]["reference"], "cba");
  EXPECT_EQ(b["episode_id"], "x/0");
}

}  // namespace
}  // namespace troupe::envs
