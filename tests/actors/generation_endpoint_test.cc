// The generation endpoint on a real engine (small random model) over real HTTP,
// and the reference agent server (a real Python process) playing episodes
// through it: training fields, chat rendering and carried ids, every refusal,
// the ledger's verification, and the /run client's failure kinds and limits.
#include <curl/curl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../envs/server_process.h"
#include "troupe/actors/generation_endpoint.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/agent.h"
#include "troupe/envs/episode.h"
#include "troupe/envs/renderer.h"
#include "troupe/envs/tasks.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

uint64_t Seed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("generation_endpoint_test seed: %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

struct Reply {
  long status = 0;
  json body;
};

size_t Append(char* d, size_t s, size_t n, void* u) {
  static_cast<std::string*>(u)->append(d, s * n);
  return s * n;
}

Reply Http(const std::string& url, const std::string* body, const std::string& token) {
  Reply r;
  std::string out;
  CURL* h = curl_easy_init();
  curl_slist* hdr = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) hdr = curl_slist_append(hdr, ("Authorization: Bearer " + token).c_str());
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
  }
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
  curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(hdr);
  curl_easy_cleanup(h);
  r.body = json::parse(out, nullptr, false);
  return r;
}

// A streamed (server-sent events) request: every "data: " payload is handed to `on_event`
// as it arrives (JSON, or the string "[DONE]"); returning false hangs up.
struct Streamed {
  long status = 0;
  std::vector<json> events;
  std::string content_type;
};
struct StreamSink {
  std::string buf;
  Streamed* out;
  std::function<bool(const json&)> on_event;
};
size_t OnStreamBytes(char* d, size_t s, size_t n, void* u) {
  auto* sink = static_cast<StreamSink*>(u);
  sink->buf.append(d, s * n);
  size_t end;
  while ((end = sink->buf.find("\n\n")) != std::string::npos) {
    std::string event = sink->buf.substr(0, end);
    sink->buf.erase(0, end + 2);
    if (event.rfind("data: ", 0) != 0) continue;  // SSE comments
    std::string data = event.substr(6);
    json j = data == "[DONE]" ? json("[DONE]") : json::parse(data, nullptr, false);
    sink->out->events.push_back(j);
    if (sink->on_event && !sink->on_event(j)) return 0;  // hang up
  }
  return s * n;
}
Streamed StreamHttp(const std::string& url, const json& body,
                    std::function<bool(const json&)> on_event = nullptr) {
  Streamed r;
  StreamSink sink{"", &r, std::move(on_event)};
  std::string b = body.dump();
  CURL* h = curl_easy_init();
  curl_slist* hdr = curl_slist_append(nullptr, "Content-Type: application/json");
  hdr = curl_slist_append(hdr, "Authorization: Bearer s3cret");
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 120000L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, b.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(b.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnStreamBytes);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  char* ct = nullptr;
  curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
  if (ct) r.content_type = ct;
  curl_slist_free_all(hdr);
  curl_easy_cleanup(h);
  return r;
}

// A latch with a bounded wait, and whether it is open.
class Latch {
 public:
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait(int64_t ms = 60000) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(ms), [&] { return open_; });
  }
  bool IsOpen() {
    std::lock_guard<std::mutex> l(mu_);
    return open_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Polls `cond` (bounded): the state it waits for is set by other threads with no event to
// wait on from here.
bool Eventually(const std::function<bool()>& cond, int64_t ms = 60000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = engine::CharTokenizer::Create(envs::PrintableAlphabet());
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(tok).value();
    renderer_ = std::make_unique<envs::Renderer>(*tokenizer_, envs::ChatFormat::Compact());
    engine::EngineConfig ec;
    ec.model.vocab_size = tokenizer_->vocab_size();
    ec.model.d_model = 32;
    ec.model.n_layers = 2;
    ec.model.n_heads = 4;
    ec.model.n_kv_heads = 2;
    ec.model.ffn_dim = 64;
    ec.model.max_seq_len = 160;
    ec.num_slots = 32;
    auto model = std::make_shared<engine::LlamaModel>(ec.model, Seed());
    auto e = engine::Engine::Create(ec, model);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    GenerationEndpointOptions o;
    o.model = "policy";
    o.token = "s3cret";
    o.threads = 8;
    o.limits.max_body_bytes = 64 * 1024;
    o.limits.max_n = 4;
    o.stop_ids = {tokenizer_->eos_id()};
    auto ep = GenerationEndpoint::Start(*engine_, *renderer_, ledger_, o,
                                        [this] { return ready_.load(); });
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    endpoint_ = std::move(ep).value();
  }
  void TearDown() override {
    endpoint_.reset();
    engine_.reset();
  }
  Reply Post(const std::string& path, const json& body, const std::string& token = "s3cret") {
    std::string b = body.dump();
    return Http("http://127.0.0.1:" + std::to_string(endpoint_->port()) + path, &b, token);
  }

  std::unique_ptr<engine::CharTokenizer> tokenizer_;
  std::unique_ptr<envs::Renderer> renderer_;
  std::unique_ptr<engine::Engine> engine_;
  envs::GenerationLedger ledger_;
  std::atomic<bool> ready_{true};
  std::unique_ptr<GenerationEndpoint> endpoint_;
};

TEST_F(EndpointTest, CompletionsReturnTheTrainingFields) {
  json req = {{"model", "policy"},
              {"prompt", {1, 40, 41, 42}},
              {"n", 2},
              {"max_tokens", 6},
              {"logprobs", 0},
              {"seed", 7}};
  Reply r = Post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["object"], "text_completion");
  ASSERT_EQ(r.body["choices"].size(), 2u);
  for (const auto& c : r.body["choices"]) {
    EXPECT_EQ(c["prompt_token_ids"], json({1, 40, 41, 42}));
    size_t n = c["generation_token_ids"].size();
    EXPECT_GE(n, 1u);
    EXPECT_LE(n, 6u);
    ASSERT_EQ(c["generation_log_probs"].size(), n);
    for (const auto& lp : c["generation_log_probs"]) EXPECT_LE(lp.get<double>(), 0.0);
    EXPECT_EQ(c["logprobs"]["token_logprobs"], c["generation_log_probs"]);
    EXPECT_EQ(c["policy_version"], 0);
  }
  // The same seed samples the same tokens (the sampler is seeded per request).
  Reply again = Post("/v1/completions", req);
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(again.body["choices"][0]["generation_token_ids"],
            r.body["choices"][0]["generation_token_ids"]);
  Reply models = Http("http://127.0.0.1:" + std::to_string(endpoint_->port()) + "/v1/models",
                      nullptr, "s3cret");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["data"][0]["id"], "policy");
  // A text prompt is encoded with BOS, as the renderer does.
  Reply text =
      Post("/v1/completions", {{"model", "policy"}, {"prompt", "abc="}, {"max_tokens", 2}});
  ASSERT_EQ(text.status, 200) << text.body.dump();
  EXPECT_EQ(text.body["choices"][0]["prompt_token_ids"],
            json(*renderer_->RenderPrompt({{envs::Role::kUser, "abc"}})));
}

TEST_F(EndpointTest, ChatRendersMessagesAndCarriedIdsExtendTheEarlierTurn) {
  envs::Conversation opening = {{envs::Role::kUser, "reverse the word in w.txt"}};
  json msgs = {{{"role", "user"}, {"content", opening[0].content}}};
  Reply first =
      Post("/v1/chat/completions",
           {{"model", "policy"}, {"messages", msgs}, {"max_tokens", 8}, {"logprobs", true}});
  ASSERT_EQ(first.status, 200) << first.body.dump();
  const json& m1 = first.body["choices"][0]["message"];
  EXPECT_EQ(m1["prompt_token_ids"], json(*renderer_->RenderPrompt(opening)));
  EXPECT_EQ(first.body["choices"][0]["logprobs"]["content"].size(),
            m1["generation_token_ids"].size());
  msgs.push_back({{"role", "assistant"},
                  {"content", m1["content"]},
                  {"prompt_token_ids", m1["prompt_token_ids"]},
                  {"generation_token_ids", m1["generation_token_ids"]}});
  msgs.push_back({{"role", "tool"}, {"content", "abc"}});
  Reply second =
      Post("/v1/chat/completions", {{"model", "policy"}, {"messages", msgs}, {"max_tokens", 4}});
  ASSERT_EQ(second.status, 200) << second.body.dump();
  std::vector<int32_t> want = m1["prompt_token_ids"].get<std::vector<int32_t>>();
  for (int32_t id : m1["generation_token_ids"].get<std::vector<int32_t>>()) want.push_back(id);
  auto env = renderer_->RenderToolTurn("abc");
  ASSERT_TRUE(env.ok());
  want.insert(want.end(), env->begin(), env->end());
  EXPECT_EQ(second.body["choices"][0]["message"]["prompt_token_ids"], json(want));
}

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get",
    "description": "reads k", "parameters": {"type": "object"}}}])");

// Decoded visible text of generated ids (what the non-streamed reply's text is).
std::string VisibleText(const engine::Tokenizer& tok, const json& ids) {
  std::vector<int32_t> visible;
  for (int32_t id : ids.get<std::vector<int32_t>>())
    if (!tok.IsSpecial(id)) visible.push_back(id);
  auto text = tok.Decode(visible);
  return text.ok() ? *text : "";
}

TEST_F(EndpointTest, StructuredToolCallsRenderAsTheRendererWritesThemAndRepliesParse) {
  json msgs = json::parse(R"([{"role": "user", "content": "abc"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get", "arguments": "{\"k\": \"x\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "out"}])");
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Reply r = Post("/v1/chat/completions", {{"model", "policy"},
                                            {"messages", msgs},
                                            {"tools", kTools},
                                            {"max_tokens", 12},
                                            {"seed", seed}});
    ASSERT_EQ(r.status, 200) << r.body.dump();
    // The tools are rendered as tool instructions; the structured call in Troupe's syntax.
    auto opening = renderer_->RenderPrompt({{envs::Role::kUser, "abc"}},
                                           nlohmann::ordered_json::parse(kTools.dump()));
    ASSERT_TRUE(opening.ok()) << opening.status().ToString();
    EXPECT_NE(*opening, *renderer_->RenderPrompt({{envs::Role::kUser, "abc"}}));
    auto calls = envs::ReadToolCalls(msgs[1]["tool_calls"]);
    ASSERT_TRUE(calls.ok());
    auto written = envs::AppendToolCalls("", *calls, envs::ToolCallFormat::kTroupe);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    auto reply = renderer_->RenderAssistantTurn(*written);
    auto env = renderer_->RenderToolTurn("out");
    ASSERT_TRUE(reply.ok() && env.ok());
    std::vector<int32_t> want = *opening;
    want.insert(want.end(), reply->begin(), reply->end());
    want.insert(want.end(), env->begin(), env->end());
    const json& choice = r.body["choices"][0];
    const json& m = choice["message"];
    EXPECT_EQ(m["prompt_token_ids"], json(want));
    // The reply is shaped by what its text parses to.
    const std::string text = VisibleText(*tokenizer_, m["generation_token_ids"]);
    envs::ParsedTurn turn = envs::ParseToolCall(text);
    if (turn.kind == envs::ParsedTurn::Kind::kCall) {
      EXPECT_EQ(choice["finish_reason"], "tool_calls");
      EXPECT_EQ(m["tool_calls"][0]["function"]["name"], turn.call.name);
    } else {
      EXPECT_EQ(m["content"], text);
      EXPECT_FALSE(m.contains("tool_calls"));
      EXPECT_NE(choice["finish_reason"], "tool_calls");
    }
  }
  // Refusals: a forced call (no constrained decoding), a tool name Troupe's syntax cannot
  // write, tools on the completions route.
  json required = {{"model", "policy"}, {"messages", {msgs[0]}}, {"tools", kTools}};
  required["tool_choice"] = "required";
  Reply r = Post("/v1/chat/completions", required);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tool_choice");
  required["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get"}}}};
  r = Post("/v1/chat/completions", required);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tool_choice");
  json bad_name = {{"model", "policy"}, {"messages", {msgs[0]}}, {"tools", kTools}};
  bad_name["tools"][0]["function"]["name"] = "Get-Weather";
  r = Post("/v1/chat/completions", bad_name);
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_EQ(r.body["error"]["param"], "tools");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("Get-Weather"), std::string::npos);
  json bad_call = {{"model", "policy"}, {"messages", msgs}};
  bad_call["messages"][1]["tool_calls"][0]["function"]["name"] = "Get-Weather";
  r = Post("/v1/chat/completions", bad_call);
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find(
                "messages[1]: tool_calls[0]: tool name 'Get-Weather' cannot be written"),
            std::string::npos)
      << r.body.dump();
  r = Post("/v1/completions",
           {{"model", "policy"}, {"prompt", {1, 40}}, {"tools", kTools}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 400);
  // tool_choice none: the tools are still rendered, the reply is not parsed.
  json none = {{"model", "policy"},
               {"messages", {msgs[0]}},
               {"tools", kTools},
               {"tool_choice", "none"},
               {"max_tokens", 4}};
  r = Post("/v1/chat/completions", none);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
}

// Streaming on a second endpoint of the same engine that stops only at max_tokens (no EOS
// stop), so every reply is long enough to stream.
class StreamTest : public EndpointTest {
 protected:
  void SetUp() override {
    EndpointTest::SetUp();
    if (HasFatalFailure()) return;
    GenerationEndpointOptions o;
    o.model = "policy";
    o.token = "s3cret";
    o.threads = 4;
    auto ep = GenerationEndpoint::Start(*engine_, *renderer_, ledger_, o, nullptr);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    streaming_ = std::move(ep).value();
  }
  void TearDown() override {
    streaming_.reset();
    EndpointTest::TearDown();
  }
  std::string Url(const std::string& path) {
    return "http://127.0.0.1:" + std::to_string(streaming_->port()) + path;
  }
  // Holds the engine thread (a one-token request whose callback waits on `release`) once
  // the streamed request `start` submits has sampled exactly its first token: a request A
  // holds the engine while the stream is queued, B is queued behind it and finishes in the
  // step that samples the stream's first token.
  // *late is set when `release` was not opened within its bound (the engine then goes on).
  void HoldAfterFirstToken(const std::function<void()>& start, Latch* held, Latch* release,
                           std::atomic<bool>* late) {
    engine::GenerateRequest one;
    one.prompt = {1, 2};
    one.sampling.max_new_tokens = 1;
    Latch in_a, release_a;
    ASSERT_TRUE(engine_
                    ->Submit(one,
                             [&](std::vector<engine::GenerationResult>) {
                               in_a.Open();
                               release_a.Wait();
                             })
                    .ok());
    ASSERT_TRUE(in_a.Wait());
    const uint64_t before = engine_->stats().requests;
    start();
    ASSERT_TRUE(Eventually([&] { return engine_->stats().requests > before; }));
    ASSERT_TRUE(engine_
                    ->Submit(one,
                             [held, release, late](std::vector<engine::GenerationResult>) {
                               held->Open();
                               if (!release->Wait()) late->store(true);
                             })
                    .ok());
    release_a.Open();
    ASSERT_TRUE(held->Wait());
  }
  std::unique_ptr<GenerationEndpoint> streaming_;
};

TEST_F(StreamTest, DeltasConcatenateToThePlainReplyAndArriveWhileGenerating) {
  const uint64_t seed = Seed() % 1000;
  for (bool chat : {true, false}) {
    json req = {{"model", "policy"}, {"max_tokens", 10}, {"seed", seed}, {"n", 2}};
    if (chat)
      req["messages"] = {{{"role", "user"}, {"content", "abc"}}};
    else
      req["prompt"] = {1, 40, 41, 42};
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const std::string body = req.dump();
    Reply plain = Http(Url(path), &body, "s3cret");
    ASSERT_EQ(plain.status, 200) << plain.body.dump();
    json sreq = req;
    sreq["stream"] = true;
    sreq["stream_options"] = {{"include_usage", true}};
    // Every choice's first chunk leaves while the engine is held after the first token: the
    // client releases the engine when it has one from each, so they must come before the rest
    // is sampled (releasing on the very first chunk raced: the server may have read the
    // tokens of choice 0 before the engine wrote those of choice 1, and choice 1 then
    // legitimately came whole in its final chunk).
    Latch held, release;
    std::atomic<bool> late{false};
    Streamed st;
    std::thread client;
    std::vector<bool> opened(2, false);
    HoldAfterFirstToken(
        [&] {
          client = std::thread([&] {
            st = StreamHttp(Url(path), sreq, [&](const json& e) {
              if (e.is_object() && e.contains("choices"))
                for (const json& c : e["choices"]) {
                  const size_t i = c.value("index", size_t{9});
                  if (i < opened.size()) opened[i] = true;
                }
              if (opened[0] && opened[1]) release.Open();
              return true;
            });
          });
        },
        &held, &release, &late);
    client.join();
    ASSERT_EQ(st.status, 200);
    EXPECT_NE(st.content_type.find("text/event-stream"), std::string::npos);
    EXPECT_FALSE(late) << "a choice's first chunk did not arrive while the engine was held "
                          "after the first token";
    ASSERT_GE(st.events.size(), 4u);  // >= one delta per choice, two finals, usage, [DONE]
    EXPECT_EQ(st.events.back(), "[DONE]");
    std::vector<std::string> text(2);
    std::vector<int> chunks(2, 0);
    std::vector<json> finals(2);
    json usage;
    for (size_t k = 0; k + 1 < st.events.size(); ++k) {
      const json& e = st.events[k];
      ASSERT_TRUE(e.is_object()) << e.dump();
      EXPECT_EQ(e["object"], chat ? "chat.completion.chunk" : "text_completion");
      if (e["choices"].empty()) {
        usage = e["usage"];
        continue;
      }
      const json& c = e["choices"][0];
      const size_t i = c["index"].get<size_t>();
      ASSERT_LT(i, 2u);
      EXPECT_TRUE(finals[i].is_null()) << "a chunk after the final one of choice " << i;
      const json piece = chat ? c.at("delta").value("content", json()) : c.value("text", json());
      if (piece.is_string()) text[i] += piece.get<std::string>();
      if (chat && chunks[i] == 0) {
        EXPECT_EQ(c.at("delta").value("role", ""), "assistant");
      }
      ++chunks[i];
      if (!c["finish_reason"].is_null()) finals[i] = c;
    }
    int64_t completion_tokens = 0;
    for (size_t i = 0; i < 2; ++i) {
      const json& want = plain.body["choices"][i];
      ASSERT_FALSE(finals[i].is_null());
      EXPECT_GT(chunks[i], 1) << "choice " << i << " came in one chunk";
      EXPECT_EQ(text[i], chat ? want["message"]["content"] : want["text"]);
      EXPECT_EQ(finals[i]["finish_reason"], want["finish_reason"]);
      for (const char* f :
           {"prompt_token_ids", "generation_token_ids", "generation_log_probs", "policy_version"})
        EXPECT_EQ(finals[i][f], want[f]) << f;
      completion_tokens += static_cast<int64_t>(want["generation_token_ids"].size());
    }
    EXPECT_EQ(usage["completion_tokens"], completion_tokens);
  }
  EXPECT_EQ(streaming_->stats().streams, 2u);
  EXPECT_EQ(streaming_->stats().streams_cancelled, 0u);
}

TEST_F(StreamTest, AClientThatHangsUpCancelsItsRequestAndTheGroupKeepsItsLedger) {
  ledger_.Open("grp");
  json req = {{"model", "policy"}, {"prompt", {1, 40, 41}}, {"max_tokens", 120}, {"stream", true}};
  Latch held, release;
  std::atomic<bool> late{false};
  Streamed st;
  std::thread client;
  HoldAfterFirstToken(
      [&] {
        client = std::thread([&] {
          st = StreamHttp(Url("/g/grp/v1/completions"), req, [](const json&) { return false; });
        });
      },
      &held, &release, &late);
  client.join();  // hung up on the first chunk, while the engine is held
  ASSERT_EQ(st.events.size(), 1u);
  // The endpoint notices (its next write fails) and cancels; the engine frees the slot.
  EXPECT_TRUE(Eventually([&] { return streaming_->stats().streams_cancelled == 1; }));
  release.Open();
  EXPECT_FALSE(late);
  EXPECT_TRUE(Eventually([&] { return streaming_->stats().streams_running == 0; }));
  // Far fewer than 120 tokens were sampled: the request was cancelled, not run out.
  EXPECT_LT(engine_->stats().generated_tokens, 20u);
  EXPECT_EQ(streaming_->stats().recorded, 0u);  // the client never saw it
  // The endpoint keeps serving the group: a streamed reply is recorded like a plain one, and
  // the agent's episode built from it verifies.
  req["max_tokens"] = 5;
  Streamed again = StreamHttp(Url("/g/grp/v1/completions"), req);
  ASSERT_EQ(again.status, 200);
  ASSERT_GE(again.events.size(), 2u);
  EXPECT_EQ(again.events.back(), "[DONE]");
  const json& fin = again.events[again.events.size() - 2]["choices"][0];
  EXPECT_EQ(fin["generation_token_ids"].size(), 5u);
  EXPECT_EQ(streaming_->stats().recorded, 1u);
  envs::AgentEpisode ep;
  envs::AgentTurn turn;
  turn.prompt_ids = fin["prompt_token_ids"].get<std::vector<int32_t>>();
  turn.generation_ids = fin["generation_token_ids"].get<std::vector<int32_t>>();
  turn.logprobs = fin["generation_log_probs"].get<std::vector<float>>();
  ep.turns.push_back(turn);
  std::vector<uint64_t> versions;
  uint64_t oldest = 0;
  Status verified = ledger_.Verify("grp", ep, &versions, &oldest);
  EXPECT_TRUE(verified.ok()) << verified.ToString();
  EXPECT_EQ(Post("/v1/completions", {{"model", "policy"}, {"prompt", {1, 40}}, {"n", 4}}).status,
            200);
  ledger_.Close("grp");
}

TEST_F(EndpointTest, RefusalsAreOpenAiErrorsAndTheEndpointKeepsServing) {
  const json ok = {{"model", "policy"}, {"prompt", {1, 40}}, {"max_tokens", 2}};
  struct Case {
    std::string path;
    std::string body;
    std::string token;
    long status;
    std::string code;
  };
  json too_long = ok;
  too_long["prompt"] = std::vector<int>(160, 40);
  json big_n = ok;
  big_n["n"] = 5;
  json other_model = ok;
  other_model["model"] = "gpt-4";
  json oov = ok;
  oov["prompt"] = {1, 100000};
  const std::vector<Case> cases = {
      {"/v1/completions", ok.dump(), "", 401, "invalid_api_key"},
      {"/v1/completions", ok.dump(), "wrong!", 401, "invalid_api_key"},
      {"/v1/completions", "{oops", "s3cret", 400, ""},
      {"/v1/completions", other_model.dump(), "s3cret", 404, "model_not_found"},
      {"/v1/completions", big_n.dump(), "s3cret", 400, ""},
      {"/v1/completions", too_long.dump(), "s3cret", 413, "context_length_exceeded"},
      {"/v1/completions", oov.dump(), "s3cret", 400, ""},
      {"/v1/completions", std::string(70 * 1024, ' '), "s3cret", 413, ""},
      {"/v1/chat/completions",
       json({{"model", "policy"}, {"messages", {{{"role", "tool"}, {"content", "x"}}}}}).dump(),
       "s3cret", 422, "unrenderable"},
      {"/v1/chat/completions",
       json({{"model", "policy"}, {"messages", {{{"role", "user"}, {"content", "\x01"}}}}}).dump(),
       "s3cret", 422, "unrenderable"},
      {"/g/closed/v1/completions", ok.dump(), "s3cret", 404, "group_closed"},
      {"/v1/nope", ok.dump(), "s3cret", 404, ""},
  };
  const std::string base = "http://127.0.0.1:" + std::to_string(endpoint_->port());
  for (const auto& c : cases) {
    Reply r = Http(base + c.path, &c.body, c.token);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body.substr(0, 80) << " -> "
                                  << r.body.dump();
    ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << c.path << r.body.dump();
    EXPECT_TRUE(r.body["error"]["message"].is_string());
    if (!c.code.empty()) {
      EXPECT_EQ(r.body["error"]["code"], c.code) << r.body.dump();
    }
  }
  ready_ = false;
  Reply not_ready = Post("/v1/completions", ok);
  EXPECT_EQ(not_ready.status, 503);
  EXPECT_EQ(not_ready.body["error"]["code"], "not_ready");
  ready_ = true;
  EXPECT_EQ(Post("/v1/completions", ok).status, 200);  // still serving
  auto st = endpoint_->stats();
  EXPECT_EQ(st.client_errors, cases.size());
  EXPECT_EQ(st.server_errors, 1u);
}

// ------------------------------------------------------------ the agent path

// Bursts of sessions' connections queue in the kernel instead of being dropped (a dropped
// SYN costs the caller a 1 s retransmission): the listening socket's backlog, as `ss` reports
// it (Send-Q of a LISTEN socket), is far above cpp-httplib's 5.
TEST_F(EndpointTest, ListensWithABacklogForBurstsOfSessions) {
  const std::string cmd = "ss -Hltn 'sport = :" + std::to_string(endpoint_->port()) + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  // "LISTEN 0 1024 127.0.0.1:PORT 0.0.0.0:*"
  std::istringstream line(out);
  std::string state;
  long recv_q = -1, send_q = -1;
  line >> state >> recv_q >> send_q;
  ASSERT_EQ(state, "LISTEN") << out;
  EXPECT_GE(send_q, 128) << out;
}

class AgentPathTest : public EndpointTest {
 protected:
  void SetUp() override {
    EndpointTest::SetUp();
    ASSERT_TRUE(server_.ok()) << "agent_server.py did not start";
    envs::TaskConfig tc;
    tc.name = "file_reverse";
    tc.eval_size = 10;
    auto task = envs::MakeTask(tc);
    ASSERT_TRUE(task.ok());
    task_ = std::move(task).value();
  }
  std::string Url(const std::string& path = "") const { return server_.Url(path); }
  std::unique_ptr<envs::AgentClient> Client(const std::string& url, int64_t concurrency = 8,
                                            int64_t attempts = 2) {
    envs::AgentsConfig c;
    c.servers = {{"ref", url}};
    c.max_concurrency = concurrency;
    c.max_attempts = attempts;
    c.run_timeout_ms = 60000;
    c.call_timeout_ms = 120000;
    auto cl = envs::AgentClient::Create(c);
    EXPECT_TRUE(cl.ok()) << cl.status().ToString();
    return cl.ok() ? std::move(cl).value() : nullptr;
  }
  std::string Body(const std::string& group, uint64_t index) {
    envs::Prompt p = task_->GetPrompt(envs::Split::kTrain, index);
    return envs::MakeRunBody(p.messages, p.id, "file_reverse", p.reference, p.metadata,
                             endpoint_->BaseUrl(group), "s3cret", "policy", group + "/0", 1.0, 1.0,
                             24);
  }
  // Opens `group` in the ledger, plays task prompt `index` through `client`'s agent server and
  // checks the episode parses and verifies against the ledger (all turns at version 0); the
  // answer's body is left in `*body`.
  std::optional<envs::AgentEpisode> PlayAndVerify(envs::AgentClient& client,
                                                  const std::string& group, uint64_t index,
                                                  std::string* body) {
    ledger_.Open(group);
    auto out = client.Run({"ref", Body(group, index)}, Deadline::InMs(120000));
    EXPECT_TRUE(out.status.ok()) << out.status.ToString();
    if (!out.status.ok()) return std::nullopt;
    auto ep = envs::ParseAgentResponse(out.body, 160);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString() << "\n" << out.body.substr(0, 400);
    if (!ep.ok()) return std::nullopt;
    std::vector<uint64_t> versions;
    uint64_t oldest = 99;
    Status v = ledger_.Verify(group, *ep, &versions, &oldest);
    EXPECT_TRUE(v.ok()) << v.ToString();
    EXPECT_EQ(oldest, 0u);
    *body = std::move(out.body);
    return std::move(ep).value();
  }

  envs::testing::ServerProcess server_{
      {"python3", TROUPE_AGENT_SERVER, "--max-turns", "3", "--max-response-tokens", "100"}};
  std::unique_ptr<envs::Task> task_;
};

TEST_F(AgentPathTest, ReferenceAgentEpisodesParseMaskAndVerify) {
  auto client = Client(Url());
  ASSERT_TRUE(client);
  // The model is random: whether a reply earns a tool turn is chance (about a third of
  // episodes have one), so play on until one has, within a bound that makes none left in
  // 48 a bug (0.66^48 ~ 2e-9), not luck. Every episode played is checked.
  int multi_turn = 0;
  uint64_t played = 0;
  for (uint64_t i = 0; i < 48 && (i < 6 || multi_turn == 0); ++i, ++played) {
    const std::string group = "g" + std::to_string(i);
    std::string body;
    auto ep = PlayAndVerify(*client, group, i, &body);
    ASSERT_TRUE(ep);
    // Token by token against the transcript: each mask-0 run is the rendering of the tool
    // output the agent reported, each mask-1 run one reply's generation ids.
    json answer = json::parse(body);
    std::vector<std::vector<int32_t>> env_runs, model_runs;
    // Tool outputs after the last model turn (the episode ended) are in no turn's prompt.
    json items = answer["response"]["output"];
    while (!items.empty() && !items.back().contains("generation_token_ids"))
      items.erase(items.size() - 1);
    for (const auto& item : items) {
      if (item["type"] == "function_call_output") {
        auto ids = renderer_->RenderToolTurn(item["output"].get<std::string>());
        ASSERT_TRUE(ids.ok());
        env_runs.push_back(*ids);
      } else if (item.contains("generation_token_ids")) {
        model_runs.push_back(item["generation_token_ids"].get<std::vector<int32_t>>());
      }
    }
    std::vector<std::vector<int32_t>> got_env, got_model;
    for (size_t k = 0; k < ep->response.size(); ++k) {
      auto& runs = ep->mask[k] ? got_model : got_env;
      bool fresh = k == 0 || ep->mask[k] != ep->mask[k - 1] ||
                   (ep->mask[k] && ep->turn_of[k] != ep->turn_of[k - 1]);
      if (fresh) runs.emplace_back();
      runs.back().push_back(ep->response[k]);
    }
    EXPECT_EQ(got_model, model_runs);
    EXPECT_EQ(got_env, env_runs);
    // The agent answers each reply as the built-in environment does (the benchmark compares
    // the two paths on the same episodes): the same replies given to envs::Episode get the
    // same tool messages, word for word.
    envs::EpisodeConfig limits;
    limits.max_turns = 3;
    auto builtin = envs::Episode::Start(*task_, task_->GetPrompt(envs::Split::kTrain, i), limits);
    ASSERT_TRUE(builtin.ok()) << builtin.status().ToString();
    std::optional<std::string> shown;
    for (const auto& item : answer["response"]["output"]) {
      if (item["type"] == "function_call_output") {
        ASSERT_TRUE(shown.has_value()) << "the built-in episode ended before this output";
        EXPECT_EQ(item["output"].get<std::string>(), *shown);
        shown.reset();
      } else if (item.contains("generation_token_ids")) {
        auto text = tokenizer_->Decode(item["generation_token_ids"].get<std::vector<int32_t>>(),
                                       /*skip_special=*/true);
        ASSERT_TRUE(text.ok());
        shown = (*builtin)->OnAssistantTurn(*text);
      }
    }
    multi_turn += ep->turns.size() > 1;
    ledger_.Close(group);
  }
  EXPECT_GT(multi_turn, 0) << "no episode had a second turn";
  auto st = client->Stats().at("ref");
  EXPECT_EQ(st.attempts, played);
}

// The reference agent with --stream: every model call is a server-sent event stream, the
// agent rebuilds each reply from the deltas and the last chunk, and its episodes parse and
// verify against the ledger exactly like non-streamed ones.
TEST_F(AgentPathTest, StreamingAgentEpisodesVerifyAgainstTheLedger) {
  envs::testing::ServerProcess streaming{{"python3", TROUPE_AGENT_SERVER, "--max-turns", "3",
                                          "--max-response-tokens", "100", "--stream"}};
  ASSERT_TRUE(streaming.ok()) << "agent_server.py --stream did not start";
  auto client = Client(streaming.Url(""));
  ASSERT_TRUE(client);
  size_t turns = 0;
  for (uint64_t i = 0; i < 3; ++i) {
    const std::string group = "s" + std::to_string(i);
    std::string body;
    auto ep = PlayAndVerify(*client, group, i, &body);
    ASSERT_TRUE(ep);
    turns += ep->turns.size();
    ledger_.Close(group);
  }
  auto st = endpoint_->stats();
  EXPECT_EQ(st.streams, turns) << "every model call streamed";
  EXPECT_EQ(st.recorded, turns);
  EXPECT_EQ(st.streams_cancelled, 0u);
}

TEST_F(AgentPathTest, FaultsBecomeFailuresOfTheirKind) {
  ledger_.Open("f");
  // A perturbed log-prob parses but does not verify.
  auto lp = Client(Url("/fault/logprobs"))->Run({"ref", Body("f", 1)}, Deadline::InMs(60000));
  ASSERT_TRUE(lp.status.ok()) << lp.status.ToString();
  auto ep = envs::ParseAgentResponse(lp.body, 160);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  std::vector<uint64_t> versions;
  uint64_t oldest = 0;
  EXPECT_NE(ledger_.Verify("f", *ep, &versions, &oldest).message().find("log_probs differ"),
            std::string::npos);
  // The agent's own error and an empty output.
  for (const char* path : {"/fault/error", "/fault/empty"}) {
    auto out = Client(Url(path))->Run({"ref", Body("f", 2)}, Deadline::InMs(60000));
    ASSERT_TRUE(out.status.ok());
    EXPECT_EQ(envs::ParseAgentResponse(out.body, 160).status().code(), Code::kCancelled) << path;
  }
  // 5xx is retried, then fails as http_status.
  auto c500 = Client(Url("/fault/status/500"), 8, 3);
  auto s500 = c500->Run({"ref", Body("f", 3)}, Deadline::InMs(60000));
  EXPECT_EQ(s500.kind, "http_status");
  EXPECT_EQ(c500->Stats().at("ref").attempts, 3u);
  EXPECT_EQ(c500->Stats().at("ref").retries, 2u);
  // 400 is not retried.
  auto c400 = Client(Url("/fault/status/400"), 8, 3);
  EXPECT_EQ(c400->Run({"ref", Body("f", 3)}, Deadline::InMs(60000)).kind, "http_status");
  EXPECT_EQ(c400->Stats().at("ref").attempts, 1u);
  // Nobody listening (the server killed): unreachable, with the reason naming the server.
  const std::string dead = Url();
  ASSERT_EQ(server_.Stop(SIGKILL, 10000), 128 + SIGKILL);
  auto gone = Client(dead)->Run({"ref", Body("f", 4)}, Deadline::InMs(60000));
  EXPECT_EQ(gone.kind, "unreachable") << gone.status.ToString();
  EXPECT_NE(gone.status.ToString().find("agent server 'ref'"), std::string::npos);
}

TEST_F(AgentPathTest, ConcurrencyPerServerIsLimitedAndDeadlinesHold) {
  auto client = Client(Url("/fault/slow/0.3"), 2, 1);
  ledger_.Open("c");
  std::vector<std::thread> ts;
  for (int i = 0; i < 6; ++i)
    ts.emplace_back([&, i] {
      client->Run({"ref", Body("c", static_cast<uint64_t>(i))}, Deadline::InMs(120000));
    });
  for (auto& t : ts) t.join();
  json stats = json::parse(server_.Get("/stats"));
  EXPECT_LE(stats["max_inflight"].get<int>(), 2) << stats.dump();
  EXPECT_EQ(client->Stats().at("ref").max_in_flight, 2u);
  // A deadline shorter than the agent's episode: timeout, not a hang.
  auto slow = Client(Url("/fault/slow/30"), 2, 1);
  auto t = slow->Run({"ref", Body("c", 9)}, Deadline::InMs(500));
  EXPECT_EQ(t.kind, "timeout") << t.status.ToString();
}

}  // namespace
}  // namespace troupe::actors
