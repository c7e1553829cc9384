#include "troupe/actors/generation_endpoint.h"

#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include <httplib.h>

#include "troupe/core/log.h"
#include "troupe/core/text.h"
#include "troupe/core/thread_annotations.h"

namespace troupe::actors {
namespace {

spdlog::logger& Log() {
  return log::Get("rollout");
}

using envs::ApiError;

ApiError MakeError(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Connections waiting to be accepted (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 1024;

// One engine request's results, handed from the engine thread to the HTTP thread.
struct Pending {
  Mutex mu;
  CondVar cv;
  bool done TROUPE_GUARDED_BY(mu) = false;
  std::vector<engine::GenerationResult> results TROUPE_GUARDED_BY(mu);
};

// A streamed request's state, shared by the HTTP thread writing its events and the engine
// thread producing its tokens (and outliving either when the client goes away).
struct Stream {
  Mutex mu;
  CondVar cv;
  std::vector<std::vector<int32_t>> ids TROUPE_GUARDED_BY(mu);  // per sample, as sampled
  bool done TROUPE_GUARDED_BY(mu) = false;
  std::vector<engine::GenerationResult> results TROUPE_GUARDED_BY(mu);
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> complete{false};  // [DONE] was written (HTTP thread)
};

// HTTP-thread state of one stream's choices.
struct StreamCursor {
  size_t seen = 0;     // ids already turned into text
  size_t emitted = 0;  // bytes of text (or content) sent
  std::string sent;    // the text sent
  bool first = true;   // the next chunk is the choice's first (carries the role)
};

// How long a stream waits for tokens before checking its client (an SSE comment line).
constexpr int64_t kStreamPollMs = 100;

}  // namespace

struct GenerationEndpoint::Impl {
  engine::Engine& engine;
  const envs::Renderer& renderer;
  envs::GenerationLedger& ledger;
  GenerationEndpointOptions o;
  std::function<bool()> ready;
  httplib::Server server;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;  // the listening socket (the server owns it)
  std::atomic<uint64_t> next_id{0};
  std::atomic<int64_t> pending{0};
  std::atomic<uint64_t> requests{0}, ok{0}, client_errors{0}, server_errors{0}, tokens{0},
      recorded{0}, streams{0}, streams_cancelled{0};
  // Streamed requests the engine still holds (shared: engine callbacks may outlive this).
  std::shared_ptr<std::atomic<int64_t>> streams_running = std::make_shared<std::atomic<int64_t>>(0);
  Mutex rng_mu;
  std::mt19937_64 call_rng TROUPE_GUARDED_BY(rng_mu){std::random_device{}()};

  Impl(engine::Engine& e, const envs::Renderer& r, envs::GenerationLedger& l,
       GenerationEndpointOptions opts, std::function<bool()> rdy)
      : engine(e), renderer(r), ledger(l), o(std::move(opts)), ready(std::move(rdy)) {}

  void Reply(httplib::Response& res, int status, const std::string& body) {
    res.status = status;
    res.set_content(body, "application/json");
    if (status == 200)
      ok.fetch_add(1);
    else if (status >= 500)
      server_errors.fetch_add(1);
    else
      client_errors.fetch_add(1);
  }
  void Fail(httplib::Response& res, const ApiError& e) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "endpoint: {} {} ({})", e.status,
                        e.message, e.param);
    Reply(res, e.status, e.Json());
  }

  bool Authorized(const httplib::Request& req) const {
    const std::string want = "Bearer " + o.token;
    const std::string got = req.get_header_value("Authorization");
    if (got.size() != want.size()) return false;
    unsigned char diff = 0;  // constant time in the token's length
    for (size_t i = 0; i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ want[i]);
    return diff == 0;
  }

  // The context ids of a request: a completions prompt, or the chat messages rendered
  // (replies that carry their ids keep them).
  std::optional<ApiError> ContextIds(const envs::CompletionRequest& r, std::vector<int32_t>* ids);
  // Visible text of generated ids: each piece decoded (a stop string cuts the reply after the
  // token completing it: *keep is then the ids kept and *stopped is set), or without stop
  // strings the whole reply decoded at once (byte-level pieces may split characters).
  std::string GenerationText(const envs::CompletionRequest& r, const std::vector<int32_t>& ids,
                             size_t* keep, bool* stopped, std::vector<std::string>* pieces) const;
  // One engine result as the response's choice (stop strings applied, tool call parsed);
  // *versions gets the kept tokens' versions. An error for a rejected or aborted result.
  std::optional<ApiError> BuildChoice(const envs::CompletionRequest& r,
                                      const engine::GenerationResult& gr, envs::CompletionChoice* c,
                                      std::vector<uint64_t>* versions);
  // Records a choice for the request's group ("" = none); an error when the group closed.
  std::optional<ApiError> RecordChoice(const std::string& group, const envs::CompletionChoice& c,
                                       std::vector<uint64_t> versions);
  std::string NewCallId();
  void Serve(const httplib::Request& req, httplib::Response& res, bool chat);
  void ServeStream(const httplib::Request& req, httplib::Response& res, envs::CompletionRequest r,
                   engine::GenerateRequest g, std::string group, uint64_t serial);
  Status Start();
};

std::string GenerationEndpoint::Impl::NewCallId() {
  MutexLock l(rng_mu);
  return fmt::format("call_{:016x}{:08x}", call_rng(), static_cast<uint32_t>(call_rng()));
}

std::string GenerationEndpoint::Impl::GenerationText(const envs::CompletionRequest& r,
                                                     const std::vector<int32_t>& ids, size_t* keep,
                                                     bool* stopped,
                                                     std::vector<std::string>* pieces) const {
  const auto& tok = renderer.tokenizer();
  std::string text;
  *keep = ids.size();
  *stopped = false;
  for (size_t k = 0; k < ids.size(); ++k) {
    int32_t id = ids[k];
    auto piece = tok.IsSpecial(id) ? Result<std::string>(std::string()) : tok.Decode({id});
    text += piece.ok() ? *piece : "";
    if (pieces) pieces->push_back(tok.IdToPiece(id).ok() ? *tok.IdToPiece(id) : "");
    size_t cut = std::string::npos;
    for (const auto& st : r.stop) cut = std::min(cut, text.find(st));
    if (cut != std::string::npos) {
      text.resize(cut);
      *keep = k + 1;
      *stopped = true;
      return text;
    }
  }
  if (r.stop.empty()) {
    std::vector<int32_t> visible;
    for (int32_t id : ids)
      if (!tok.IsSpecial(id)) visible.push_back(id);
    auto all = tok.Decode(visible);
    if (all.ok()) text = *all;
  }
  return text;
}

std::optional<ApiError> GenerationEndpoint::Impl::BuildChoice(const envs::CompletionRequest& r,
                                                              const engine::GenerationResult& gr,
                                                              envs::CompletionChoice* c,
                                                              std::vector<uint64_t>* versions) {
  if (gr.finish_reason == engine::FinishReason::kRejected)
    return MakeError(422, "invalid_request_error",
                     "the engine refused the request: " + gr.reject_reason, "rejected");
  if (gr.finish_reason == engine::FinishReason::kAborted)
    return MakeError(503, "server_error", "generation aborted: " + gr.reject_reason, "aborted");
  c->prompt_ids = gr.prompt_ids;
  c->generation_ids = gr.response_ids;
  c->logprobs = gr.logprobs;
  c->policy_version = gr.policy_version;
  c->finish_reason = gr.finish_reason == engine::FinishReason::kStop ? "stop" : "length";
  *versions = gr.token_versions;
  size_t keep = 0;
  bool stopped = false;
  c->text =
      GenerationText(r, c->generation_ids, &keep, &stopped, r.logprobs ? &c->tokens : nullptr);
  if (stopped) c->finish_reason = "stop";
  c->generation_ids.resize(keep);
  c->logprobs.resize(keep);
  versions->resize(keep);
  if (r.logprobs) c->tokens.resize(keep);
  if (r.ParsesToolCalls()) envs::ShapeToolCall(c, renderer.tool_call_format(), NewCallId());
  tokens.fetch_add(c->generation_ids.size());
  return std::nullopt;
}

std::optional<ApiError> GenerationEndpoint::Impl::RecordChoice(const std::string& group,
                                                               const envs::CompletionChoice& c,
                                                               std::vector<uint64_t> versions) {
  if (group.empty()) return std::nullopt;
  envs::GenerationLedger::Generation rec{c.prompt_ids, c.generation_ids, c.logprobs,
                                         std::move(versions), c.policy_version};
  if (!ledger.Record(group, std::move(rec)))
    return MakeError(404, "invalid_request_error",
                     "group '" + group + "' closed while generating (or is full)", "group_closed");
  recorded.fetch_add(1);
  return std::nullopt;
}

std::optional<ApiError> GenerationEndpoint::Impl::ContextIds(const envs::CompletionRequest& r,
                                                             std::vector<int32_t>* ids) {
  auto unrenderable = [](const std::string& what, const Status& s) {
    return MakeError(422, "invalid_request_error", what + ": " + s.message(), "unrenderable");
  };
  if (!r.chat) {
    if (r.prompt_is_ids) {
      *ids = r.prompt_ids;
      for (int32_t id : *ids)
        if (id >= renderer.tokenizer().vocab_size())
          return envs::BadRequest("prompt", fmt::format("token id {} is outside the vocabulary "
                                                        "({} ids)",
                                                        id, renderer.tokenizer().vocab_size()));
      return std::nullopt;
    }
    auto enc = renderer.tokenizer().Encode(r.prompt, renderer.format().add_bos);
    if (!enc.ok()) return unrenderable("prompt", enc.status());
    *ids = std::move(enc).value();
    return std::nullopt;
  }
  size_t first = 0;
  while (first < r.messages.size() && r.messages[first].message.role != envs::Role::kAssistant)
    ++first;
  envs::Conversation opening;
  for (size_t i = 0; i < first; ++i) {
    if (r.messages[i].message.role == envs::Role::kTool)
      return MakeError(422, "invalid_request_error",
                       fmt::format("messages[{}]: a tool message before any assistant reply", i),
                       "unrenderable");
    opening.push_back(r.messages[i].message);
  }
  if (opening.empty())
    return MakeError(422, "invalid_request_error",
                     "messages: no system or user message opens the "
                     "conversation",
                     "unrenderable");
  auto p = renderer.RenderPrompt(opening, r.tools);
  if (!p.ok()) {
    ApiError e = unrenderable(r.tools.is_null() ? "messages" : "messages with tools", p.status());
    if (!r.tools.is_null()) e.param = "tools";
    return e;
  }
  *ids = std::move(p).value();
  for (size_t i = first; i < r.messages.size(); ++i) {
    const envs::ApiMessage& m = r.messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (m.message.role == envs::Role::kAssistant) {
      if (i + 1 == r.messages.size())
        return MakeError(422, "invalid_request_error",
                         where +
                             ": the conversation ends with an assistant message (continuing "
                             "a reply is not supported)",
                         "unrenderable");
      if (!m.generation_token_ids.empty()) {
        // The ids the endpoint gave for this reply replace its re-rendering.
        *ids = m.prompt_token_ids;
        ids->insert(ids->end(), m.generation_token_ids.begin(), m.generation_token_ids.end());
        continue;
      }
      auto text =
          envs::AppendToolCalls(m.message.content, m.tool_calls, renderer.tool_call_format());
      if (!text.ok()) return unrenderable(where, text.status());
      auto a = renderer.RenderAssistantTurn(*text);
      if (!a.ok()) return unrenderable(where, a.status());
      ids->insert(ids->end(), a->begin(), a->end());
    } else if (m.message.role == envs::Role::kTool) {
      auto t = renderer.RenderToolTurn(m.message.content);
      if (!t.ok()) return unrenderable(where, t.status());
      ids->insert(ids->end(), t->begin(), t->end());
    } else {
      return MakeError(422, "invalid_request_error",
                       where + ": only assistant and tool messages may follow the first reply",
                       "unrenderable");
    }
  }
  if (r.messages.back().message.role == envs::Role::kTool && !renderer.tool_turn_error().empty())
    return MakeError(422, "invalid_request_error", renderer.tool_turn_error(), "unrenderable");
  return std::nullopt;
}

void GenerationEndpoint::Impl::Serve(const httplib::Request& req, httplib::Response& res,
                                     bool chat) {
  requests.fetch_add(1);
  if (!Authorized(req))
    return Fail(res, MakeError(401, "authentication_error",
                               "missing or wrong bearer token (Authorization: Bearer ...)",
                               "invalid_api_key"));
  const std::string group = req.matches.size() > 1 ? req.matches[1].str() : "";
  if (!group.empty() && !ledger.IsOpen(group))
    return Fail(res, MakeError(404, "invalid_request_error",
                               fmt::format("group '{}' is not open (finished or unknown)",
                                           Printable(group, 64)),
                               "group_closed"));
  envs::CompletionRequest r;
  if (auto e = envs::DecodeCompletionRequest(req.body, chat, o.limits, &r)) return Fail(res, *e);
  if (r.model != o.model) {
    auto e = MakeError(404, "invalid_request_error",
                       fmt::format("the model '{}' does not exist; this endpoint serves '{}'",
                                   Printable(r.model, 64), o.model),
                       "model_not_found");
    e.param = "model";
    return Fail(res, e);
  }
  if (!ready())
    return Fail(res, MakeError(503, "server_error", "the policy has no weights yet; retry shortly",
                               "not_ready"));
  std::vector<int32_t> ids;
  if (auto e = ContextIds(r, &ids)) return Fail(res, *e);
  const size_t max_ctx = static_cast<size_t>(engine.config().model.max_seq_len);
  if (ids.size() >= max_ctx) {
    auto e = MakeError(413, "invalid_request_error",
                       fmt::format("the prompt has {} tokens; the model's context is {} (at "
                                   "least one generated token must fit)",
                                   ids.size(), max_ctx),
                       "context_length_exceeded");
    e.param = chat ? "messages" : "prompt";
    return Fail(res, e);
  }
  engine::GenerateRequest g;
  g.prompt = ids;
  g.sampling.temperature = r.temperature;
  g.sampling.top_p = r.top_p;
  g.sampling.top_k = o.top_k;
  g.sampling.max_new_tokens = r.max_tokens;
  g.sampling.stop_token_ids = o.stop_ids;
  g.sampling.num_samples = r.n;
  const uint64_t serial = next_id.fetch_add(1);
  g.sampling.seed = r.seed ? *r.seed : o.seed ^ (serial * 0x9e3779b97f4a7c15ULL);
  if (pending.fetch_add(1) >= o.max_pending) {
    pending.fetch_sub(1);
    return Fail(res, MakeError(503, "server_error",
                               fmt::format("{} requests are waiting for the engine; retry later",
                                           o.max_pending),
                               "overloaded"));
  }
  if (r.stream) return ServeStream(req, res, std::move(r), std::move(g), group, serial);
  auto p = std::make_shared<Pending>();
  Status s = engine.Submit(std::move(g), [p](std::vector<engine::GenerationResult> out) {
    {
      MutexLock l(p->mu);
      p->results = std::move(out);
      p->done = true;
    }
    p->cv.notify_all();
  });
  std::vector<engine::GenerationResult> results;
  bool done = false;
  if (s.ok()) {
    MutexLock l(p->mu);
    done = p->cv.wait_until(l, Clock::now() + std::chrono::milliseconds(o.timeout_ms),
                            [&]() TROUPE_REQUIRES(p->mu) { return p->done; });
    if (done) results = std::move(p->results);
  }
  pending.fetch_sub(1);
  if (!s.ok())
    return Fail(res, MakeError(503, "server_error", "the engine is stopping: " + s.message(),
                               "unavailable"));
  if (!done)
    return Fail(res, MakeError(503, "server_error",
                               fmt::format("no result within {} ms", o.timeout_ms), "timeout"));
  std::vector<envs::CompletionChoice> choices;
  for (auto& gr : results) {
    envs::CompletionChoice c;
    std::vector<uint64_t> versions;
    if (auto e = BuildChoice(r, gr, &c, &versions)) return Fail(res, *e);
    if (auto e = RecordChoice(group, c, std::move(versions))) return Fail(res, *e);
    choices.push_back(std::move(c));
  }
  const std::string id = fmt::format("{}-{:x}", chat ? "chatcmpl" : "cmpl", serial);
  Reply(res, 200, envs::EncodeCompletionResponse(r, id, UnixSeconds(), o.model, choices));
}

// Streams one request as server-sent events. The engine reports each sampled token
// (GenerateRequest::on_token); the HTTP thread turns the tokens so far into text, sends what
// can no longer change (StreamableLength), and when the engine result arrives sends each
// choice's final chunk from the same BuildChoice as a plain response (so the ledger records
// exactly what a non-streamed request records), then usage and [DONE]. A client that goes
// away (a failed write) cancels the engine request: its slots are freed at the next step and
// nothing is recorded (the client never saw the generation).
void GenerationEndpoint::Impl::ServeStream(const httplib::Request&, httplib::Response& res,
                                           envs::CompletionRequest r, engine::GenerateRequest g,
                                           std::string group, uint64_t serial) {
  auto st = std::make_shared<Stream>();
  const size_t n = static_cast<size_t>(std::max(1, r.n));
  {
    MutexLock l(st->mu);
    st->ids.resize(n);
  }
  g.cancel = st->cancel;
  g.on_token = [st](int32_t sample, int32_t tok, float) {
    {
      MutexLock l(st->mu);
      if (static_cast<size_t>(sample) < st->ids.size())
        st->ids[static_cast<size_t>(sample)].push_back(tok);
    }
    st->cv.notify_all();
  };
  streams_running->fetch_add(1);
  Status s = engine.Submit(
      std::move(g), [st, running = streams_running](std::vector<engine::GenerationResult> out) {
        {
          MutexLock l(st->mu);
          st->results = std::move(out);
          st->done = true;
        }
        st->cv.notify_all();
        running->fetch_sub(1);
      });
  if (!s.ok()) {
    streams_running->fetch_sub(1);
    pending.fetch_sub(1);
    return Fail(res, MakeError(503, "server_error", "the engine is stopping: " + s.message(),
                               "unavailable"));
  }
  streams.fetch_add(1);
  ok.fetch_add(1);  // the status line is 200 from here on; errors come as events
  auto req = std::make_shared<envs::CompletionRequest>(std::move(r));
  auto cursors = std::make_shared<std::vector<StreamCursor>>(n);
  const std::string id = fmt::format("{}-{:x}", req->chat ? "chatcmpl" : "cmpl", serial);
  const int64_t created = UnixSeconds();
  const auto until = Clock::now() + std::chrono::milliseconds(o.timeout_ms);
  const bool tools = req->ParsesToolCalls();
  std::vector<std::string_view> markers;
  if (tools) markers = envs::ToolCallMarkers(renderer.tool_call_format());
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto release = [this, released] {
    if (!released->exchange(true)) pending.fetch_sub(1);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, req, cursors, id, created, until, tools, markers, group, release](
          size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& event) {
          if (sink.write(event.data(), event.size())) return true;
          st->cancel->store(true);  // the client went away: free the engine's slots
          return false;
        };
        auto finish = [&](const std::string& last) {
          bool sent = (last.empty() || send(last)) && send(envs::SseDone());
          if (sent) st->complete = true;
          release();
          if (sent) sink.done();
          return sent;
        };
        std::vector<std::vector<int32_t>> ids;
        std::vector<engine::GenerationResult> results;
        bool done = false, fresh = false;
        {
          MutexLock l(st->mu);
          auto has_news = [&]() TROUPE_REQUIRES(st->mu) {
            if (st->done) return true;
            for (size_t i = 0; i < st->ids.size(); ++i)
              if (st->ids[i].size() > (*cursors)[i].seen) return true;
            return false;
          };
          fresh = st->cv.wait_until(
              l, std::min(until, Clock::now() + std::chrono::milliseconds(kStreamPollMs)),
              has_news);
          done = st->done;
          if (done)
            results = std::move(st->results);
          else if (fresh)
            ids = st->ids;
        }
        if (!fresh) {
          if (Clock::now() >= until) {
            st->cancel->store(true);
            ApiError e = MakeError(503, "server_error",
                                   fmt::format("no result within {} ms", o.timeout_ms), "timeout");
            server_errors.fetch_add(1);
            return finish(envs::SseEvent(e.Json()));
          }
          return send(": waiting\n\n");  // an SSE comment: finds a client that went away
        }
        if (!done) {
          for (size_t i = 0; i < ids.size(); ++i) {
            StreamCursor& cur = (*cursors)[i];
            if (ids[i].size() <= cur.seen) continue;
            cur.seen = ids[i].size();
            size_t keep = 0;
            bool stopped = false;
            std::string text = GenerationText(*req, ids[i], &keep, &stopped, nullptr);
            // Trailing whitespace waits for what follows: tokenizers that clean up spaces
            // (" ." -> ".") change it, and with tools it is cut before a call.
            size_t upto =
                envs::StreamableLength(text, stopped ? std::vector<std::string>{} : req->stop,
                                       markers, /*trim_space=*/true);
            // A choice's first chunk goes out with its first token (the role, and any text).
            const std::string delta =
                upto > cur.emitted ? text.substr(cur.emitted, upto - cur.emitted) : std::string();
            if (delta.empty() && !cur.first) continue;
            if (!send(envs::SseEvent(
                    envs::EncodeStreamDelta(*req, id, created, o.model, i, delta, cur.first))))
              return false;
            cur.sent += delta;
            cur.emitted += delta.size();
            cur.first = false;
          }
          return true;
        }
        // The engine is done: every choice's final chunk, then usage and [DONE].
        std::vector<envs::CompletionChoice> choices;
        for (size_t i = 0; i < results.size(); ++i) {
          envs::CompletionChoice c;
          std::vector<uint64_t> versions;
          if (auto e = BuildChoice(*req, results[i], &c, &versions)) {
            server_errors.fetch_add(e->status >= 500 ? 1 : 0);
            client_errors.fetch_add(e->status >= 500 ? 0 : 1);
            return finish(envs::SseEvent(e->Json()));
          }
          if (auto e = RecordChoice(group, c, std::move(versions))) {
            client_errors.fetch_add(1);
            return finish(envs::SseEvent(e->Json()));
          }
          StreamCursor& cur = (*cursors)[i];
          const std::string& content = req->chat ? c.MessageContent() : c.text;
          std::string_view rest;
          if (content.compare(0, cur.sent.size(), cur.sent) == 0)
            rest = std::string_view(content).substr(cur.emitted);
          else
            TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                                "endpoint: a stream's sent text is not a prefix of its reply "
                                "(the tokenizer re-decoded it); the deltas differ from content");
          if (!send(envs::SseEvent(
                  envs::EncodeStreamFinal(*req, id, created, o.model, i, c, rest, cur.first))))
            return false;
          cur.first = false;
          choices.push_back(std::move(c));
        }
        if (req->include_usage &&
            !send(envs::SseEvent(envs::EncodeStreamUsage(*req, id, created, o.model, choices))))
          return false;
        return finish("");
      },
      [this, st, release](bool success) {
        // A client that closes right after [DONE] may fail the chunked encoding's last write:
        // that stream was complete, not cancelled.
        if (!success && !st->complete) {
          st->cancel->store(true);  // no-op once the engine finished
          streams_cancelled.fetch_add(1);
        }
        release();
      });
}

Status GenerationEndpoint::Impl::Start() {
  if (o.token.empty()) return InvalidArgument("the generation endpoint needs a bearer token");
  const size_t threads = static_cast<size_t>(std::max(1, o.threads));
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_keep_alive_max_count(1);  // see launcher/src/dashboard.cc: keep-alive polls cost CPU
  server.set_read_timeout(30, 0);
  server.set_write_timeout(30, 0);
  server.set_payload_max_length(o.limits.max_body_bytes);
  const std::string api = R"((?:/g/([A-Za-z0-9_.-]{1,128}))?/v1/)";
  server.Post(api + "completions",
              [this](const httplib::Request& q, httplib::Response& s) { Serve(q, s, false); });
  server.Post(api + "chat/completions",
              [this](const httplib::Request& q, httplib::Response& s) { Serve(q, s, true); });
  server.Get(api + "models", [this](const httplib::Request& q, httplib::Response& s) {
    requests.fetch_add(1);
    if (!Authorized(q))
      return Fail(s, MakeError(401, "authentication_error", "missing or wrong bearer token",
                               "invalid_api_key"));
    Reply(s, 200, envs::EncodeModelList(o.model, UnixSeconds()));
  });
  // Anything else (unknown path, a body over the limit, ...) gets an OpenAI error body.
  server.set_error_handler([this](const httplib::Request& q, httplib::Response& s) {
    if (!s.body.empty()) return;  // answered by Reply (already counted)
    (s.status >= 500 ? server_errors : client_errors).fetch_add(1);
    ApiError e =
        MakeError(s.status, "invalid_request_error",
                  fmt::format("{} {}: HTTP {}", q.method, Printable(q.path, 80), s.status));
    if (s.status == 404) e.message = fmt::format("no route {} {}", q.method, Printable(q.path, 80));
    if (s.status == 413)
      e.message = fmt::format("request body over {} bytes", o.limits.max_body_bytes);
    s.set_content(e.Json(), "application/json");
  });
  // Debian's cpp-httplib (a shared library) listens with a backlog of 5: a burst of agent
  // sessions' connections (one per model call, no keep-alive) overflows it, and every SYN the
  // kernel drops costs that call a 1 s retransmission (seen with 128 sessions: p99 1.5-2.9 s,
  // TcpExtListenOverflows rising). The listening socket gets a backlog of its own once bound.
  server.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;  // the last socket tried is the one that bound
  });
  port = o.port == 0 ? server.bind_to_any_port(o.host)
                     : (server.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port <= 0)
    return Unavailable("cannot serve the generation endpoint on {}:{}: {}", o.host, o.port,
                       std::strerror(errno));
  if (listen_fd < 0 || ::listen(listen_fd, kListenBacklog) != 0)
    return Internal("cannot set the generation endpoint's listen backlog: {}",
                    std::strerror(errno));
  thread = std::thread([this] { server.listen_after_bind(); });
  // stop() is a no-op until the loop runs (cpp-httplib 0.11 has no readiness callback).
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server.is_running()) return Internal("the generation endpoint's HTTP server did not start");
  return Status::Ok();
}

Result<std::unique_ptr<GenerationEndpoint>> GenerationEndpoint::Start(
    engine::Engine& engine, const envs::Renderer& renderer, envs::GenerationLedger& ledger,
    GenerationEndpointOptions options, std::function<bool()> ready) {
  auto impl = std::make_unique<Impl>(
      engine, renderer, ledger, std::move(options), ready ? std::move(ready) : [] { return true; });
  Status s = impl->Start();
  if (!s.ok()) {
    if (impl->thread.joinable()) {
      impl->server.stop();
      impl->thread.join();
    }
    return s;
  }
  Log().info("generation endpoint at http://{}:{}/v1 (model '{}')", impl->o.host, impl->port,
             impl->o.model);
  return std::unique_ptr<GenerationEndpoint>(new GenerationEndpoint(std::move(impl)));
}

GenerationEndpoint::GenerationEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GenerationEndpoint::~GenerationEndpoint() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int GenerationEndpoint::port() const {
  return impl_->port;
}

std::string GenerationEndpoint::BaseUrl(const std::string& group) const {
  std::string base = fmt::format("http://{}:{}", impl_->o.host, impl_->port);
  return group.empty() ? base + "/v1" : base + "/g/" + group + "/v1";
}

GenerationEndpointStats GenerationEndpoint::stats() const {
  GenerationEndpointStats s;
  s.requests = impl_->requests.load();
  s.ok = impl_->ok.load();
  s.client_errors = impl_->client_errors.load();
  s.server_errors = impl_->server_errors.load();
  s.generated_tokens = impl_->tokens.load();
  s.recorded = impl_->recorded.load();
  s.streams = impl_->streams.load();
  s.streams_cancelled = impl_->streams_cancelled.load();
  s.streams_running = static_cast<uint64_t>(std::max<int64_t>(0, impl_->streams_running->load()));
  return s;
}

std::vector<std::pair<std::string, double>> GenerationEndpoint::StatsForMetrics() const {
  auto s = stats();
  return {{"endpoint.requests", static_cast<double>(s.requests)},
          {"endpoint.ok", static_cast<double>(s.ok)},
          {"endpoint.client_errors", static_cast<double>(s.client_errors)},
          {"endpoint.server_errors", static_cast<double>(s.server_errors)},
          {"endpoint.generated_tokens", static_cast<double>(s.generated_tokens)},
          {"endpoint.recorded", static_cast<double>(s.recorded)},
          {"endpoint.streams", static_cast<double>(s.streams)},
          {"endpoint.streams_cancelled", static_cast<double>(s.streams_cancelled)},
          {"endpoint.open_groups", static_cast<double>(impl_->ledger.open_groups())}};
}

}  // namespace troupe::actors
