#include "troupe/envs/agent.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/core/config_binder.h"
#include "troupe/core/text.h"
#include "troupe/envs/tool_call.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

struct Sink {
  std::string* out;
  size_t cap;
  bool overflow = false;
};

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  size_t bytes = size * n;
  if (sink->out->size() + bytes > sink->cap) {
    sink->overflow = true;
    return 0;  // aborts the transfer
  }
  sink->out->append(data, bytes);
  return bytes;
}

Status CurlInit() {
  static std::once_flag once;
  static CURLcode rc = CURLE_OK;
  std::call_once(once, [] { rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (rc != CURLE_OK) return Internal("curl_global_init failed: {}", curl_easy_strerror(rc));
  return Status::Ok();
}

// One /run attempt.
struct Attempt {
  AgentRunOutcome out;
  bool retryable = false;
};

// Aborts a transfer once the client is cancelled.
int Progress(void* cancelled, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(cancelled)->load() ? 1 : 0;
}

Attempt PostOnce(const std::string& url, const std::string& body, int64_t timeout_ms,
                 int64_t connect_ms, size_t max_bytes, std::atomic<bool>* cancelled) {
  Attempt a;
  CURL* h = curl_easy_init();
  if (!h) {
    a.out.status = Internal("curl_easy_init failed");
    a.out.kind = "unreachable";
    return a;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  std::string resp;
  Sink sink{&resp, max_bytes};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_PROXY, "");  // never a proxy from the environment
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(1, timeout_ms)));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::max<int64_t>(1, std::min(connect_ms, timeout_ms))));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, Progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, cancelled);
  CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (sink.overflow) {
    a.out.status = InvalidArgument("answer over {} bytes", max_bytes);
    a.out.kind = "malformed";
    return a;
  }
  if (rc != CURLE_OK) {
    std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    a.retryable = true;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      a.out.status = Cancelled("cancelled (the rollout actor is stopping)");
      a.out.kind = "cancelled";
      a.retryable = false;
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
      a.out.status = Timeout("no answer within {} ms ({})", timeout_ms, why);
      a.out.kind = "timeout";
      a.retryable = false;  // an episode that ran out of time is not re-run from scratch
    } else {
      a.out.status = Unavailable("{}", why);
      a.out.kind = "unreachable";
    }
    return a;
  }
  if (code < 200 || code >= 300) {
    a.out.status = Unavailable("HTTP {} ('{}')", code, Printable(resp, 80));
    a.out.kind = "http_status";
    a.retryable = code >= 500 || code == 408 || code == 429;
    return a;
  }
  a.out.body = std::move(resp);
  return a;
}

// Ids, log-probs of a model turn item (all three fields present, same lengths).
Result<AgentTurn> TurnOf(const json& item, const std::string& where, size_t max_tokens) {
  AgentTurn t;
  auto ids = [&](const char* key, std::vector<int32_t>* out) -> Status {
    const json& v = item[key];
    if (!v.is_array()) return InvalidArgument("{}.{} is not a list", where, key);
    if (v.size() > max_tokens)
      return InvalidArgument("{}.{} has {} ids (more than {})", where, key, v.size(), max_tokens);
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 || v[i].get<int64_t>() > INT32_MAX)
        return InvalidArgument("{}.{}[{}] is not a token id", where, key, i);
      out->push_back(static_cast<int32_t>(v[i].get<int64_t>()));
    }
    return Status::Ok();
  };
  TROUPE_RETURN_IF_ERROR(ids("prompt_token_ids", &t.prompt_ids));
  TROUPE_RETURN_IF_ERROR(ids("generation_token_ids", &t.generation_ids));
  const json& lp = item["generation_log_probs"];
  if (!lp.is_array()) return InvalidArgument("{}.generation_log_probs is not a list", where);
  if (lp.size() != t.generation_ids.size())
    return InvalidArgument("{}: {} generation ids but {} log-probs", where, t.generation_ids.size(),
                           lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    if (!lp[i].is_number() || !std::isfinite(lp[i].get<double>()) || lp[i].get<double>() > 0)
      return InvalidArgument("{}.generation_log_probs[{}] is not a log-probability", where, i);
    t.logprobs.push_back(static_cast<float>(lp[i].get<double>()));
  }
  if (t.prompt_ids.empty()) return InvalidArgument("{}: empty prompt_token_ids", where);
  if (t.generation_ids.empty()) return InvalidArgument("{}: empty generation_token_ids", where);
  return t;
}

// The text an output item shows (message content parts, call, tool output).
std::string ItemText(const json& item) {
  const std::string type = item.value("type", "");
  if (type == "function_call")
    return "[call " + item.value("name", "") + " " +
           (item.contains("arguments") && item["arguments"].is_string()
                ? item["arguments"].get<std::string>()
                : std::string()) +
           "]";
  if (type == "function_call_output") {
    const json& o = item.contains("output") ? item["output"] : json();
    return "[output " + (o.is_string() ? o.get<std::string>() : SafeDump(o)) + "]";
  }
  std::string s;
  if (item.contains("content") && item["content"].is_array())
    for (const auto& p : item["content"])
      if (p.is_object() && p.contains("text") && p["text"].is_string())
        s += p["text"].get<std::string>();
  if (item.contains("content") && item["content"].is_string())
    s = item["content"].get<std::string>();
  return s;
}

bool StartsWith(const std::vector<int32_t>& v, const std::vector<int32_t>& prefix) {
  return v.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

}  // namespace

// ---------------------------------------------------------------- AgentsConfig

const std::string& AgentsConfig::Route(const std::string& agent_ref) const {
  auto it = servers.find(agent_ref);
  if (it != servers.end()) return it->first;
  if (!default_server.empty()) return default_server;
  return servers.begin()->first;
}

Status AgentsConfig::Validate() const {
  for (const auto& [name, url] : servers) {
    if (name.empty() || name.size() > 64)
      return InvalidArgument("agent_servers: a server name must have 1-64 characters");
    for (char c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
        return InvalidArgument("agent_servers.{}: names are [A-Za-z0-9_-]", Printable(name, 64));
    if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
      return InvalidArgument("agent_servers.{}: url '{}' must start with http:// or https://", name,
                             Printable(url, 80));
  }
  if (!default_server.empty() && !servers.count(default_server))
    return InvalidArgument("agents.default_server '{}' is not in agent_servers",
                           Printable(default_server, 64));
  if (run_timeout_ms <= 0) return InvalidArgument("agents.run_timeout_ms must be positive");
  if (call_timeout_ms < run_timeout_ms)
    return InvalidArgument("agents.call_timeout_ms ({}) must be >= run_timeout_ms ({})",
                           call_timeout_ms, run_timeout_ms);
  if (connect_timeout_ms <= 0) return InvalidArgument("agents.connect_timeout_ms must be positive");
  if (max_attempts < 1 || max_attempts > 10)
    return InvalidArgument("agents.max_attempts must be in [1, 10], not {}", max_attempts);
  if (max_concurrency < 1 || max_concurrency > 1024)
    return InvalidArgument("agents.max_concurrency must be in [1, 1024], not {}", max_concurrency);
  if (max_response_bytes < 1024)
    return InvalidArgument("agents.max_response_bytes must be at least 1024");
  if (endpoint_max_n < 1 || endpoint_max_n > 256)
    return InvalidArgument("agents.endpoint_max_n must be in [1, 256]");
  if (endpoint_threads < 0 || endpoint_threads > 1024)
    return InvalidArgument(
        "agents.endpoint_threads must be in [0, 1024] (0 = one per /run "
        "worker plus 8), not {}",
        endpoint_threads);
  if (endpoint_timeout_ms <= 0)
    return InvalidArgument("agents.endpoint_timeout_ms must be positive");
  return Status::Ok();
}

int64_t AgentsConfig::RunWorkers() const {
  return std::min<int64_t>(128, max_concurrency * static_cast<int64_t>(servers.size()));
}

int64_t AgentsConfig::EndpointThreads() const {
  return endpoint_threads > 0 ? endpoint_threads : RunWorkers() + 8;
}

// ---------------------------------------------------------------- parsing

Result<AgentEpisode> ParseAgentResponse(std::string_view body, size_t max_tokens) {
  json doc = json::parse(body.begin(), body.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return InvalidArgument("answer is not a JSON object ('{}')", Printable(body, 40));
  if (doc.contains("error") && !doc["error"].is_null()) {
    const json& e = doc["error"];
    std::string msg = e.is_string() ? e.get<std::string>()
                      : e.is_object() && e.contains("message") && e["message"].is_string()
                          ? e["message"].get<std::string>()
                          : SafeDump(e);
    return Cancelled("agent reported an error: {}", Printable(msg, 200));
  }
  auto reward = doc.find("reward");
  if (reward == doc.end() || !reward->is_number() || !std::isfinite(reward->get<double>()))
    return InvalidArgument("answer has no finite numeric \"reward\"");
  const json* output = nullptr;
  if (doc.contains("response") && doc["response"].is_object() && doc["response"].contains("output"))
    output = &doc["response"]["output"];
  if (!output || !output->is_array())
    return InvalidArgument("answer has no \"response\".\"output\" list");
  if (output->empty()) return Cancelled("agent returned an empty output");
  AgentEpisode ep;
  ep.reward = reward->get<double>();
  for (size_t i = 0; i < output->size(); ++i) {
    const json& item = (*output)[i];
    std::string where = fmt::format("output[{}]", i);
    if (!item.is_object()) return InvalidArgument("{} is not an object", where);
    std::string text = ItemText(item);
    if (!text.empty()) ep.transcript += (ep.transcript.empty() ? "" : "\n") + text;
    if (!item.contains("generation_token_ids")) continue;  // tool output, reasoning, ...
    TROUPE_ASSIGN_OR_RETURN(AgentTurn t, TurnOf(item, where, max_tokens));
    const int32_t turn = static_cast<int32_t>(ep.turns.size());
    if (ep.turns.empty()) {
      ep.prompt = t.prompt_ids;
    } else {
      // The context so far: first prompt + every response token.
      std::vector<int32_t> context = ep.prompt;
      context.insert(context.end(), ep.response.begin(), ep.response.end());
      if (!StartsWith(t.prompt_ids, context))
        return ProtocolError(
            "{} (model turn {}): its prompt_token_ids do not extend the previous turn's prompt + "
            "generation ({} ids vs {}): history was rewritten or re-tokenized",
            where, turn, t.prompt_ids.size(), context.size());
      for (size_t k = context.size(); k < t.prompt_ids.size(); ++k) {
        ep.response.push_back(t.prompt_ids[k]);
        ep.logprobs.push_back(0.0f);
        ep.mask.push_back(0);
        ep.turn_of.push_back(-1);
      }
    }
    for (size_t k = 0; k < t.generation_ids.size(); ++k) {
      ep.response.push_back(t.generation_ids[k]);
      ep.logprobs.push_back(t.logprobs[k]);
      ep.mask.push_back(1);
      ep.turn_of.push_back(turn);
    }
    if (ep.prompt.size() + ep.response.size() > max_tokens)
      return InvalidArgument("{}: the episode has {} tokens, more than {}", where,
                             ep.prompt.size() + ep.response.size(), max_tokens);
    ep.turns.push_back(std::move(t));
  }
  if (ep.turns.empty())
    return Cancelled("agent output has {} items but no model turn with token ids", output->size());
  return ep;
}

std::string MakeRunBody(const Conversation& input, const std::string& prompt_id,
                        const std::string& task, const std::string& reference,
                        const std::string& metadata, const std::string& base_url,
                        const std::string& api_key, const std::string& model,
                        const std::string& episode_id, double temperature, double top_p,
                        int32_t max_output_tokens) {
  json meta = metadata.empty() ? json::object() : json::parse(metadata, nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) meta = json::object();
  json msgs = json::array();
  for (const Message& m : input)
    msgs.push_back({{"role", RoleName(m.role)}, {"content", m.content}});
  json out = meta;  // the task row's own fields at top level (NeMo Gym rows)
  out["responses_create_params"] = {{"input", std::move(msgs)},
                                    {"model", model},
                                    {"temperature", temperature},
                                    {"top_p", top_p},
                                    {"max_output_tokens", max_output_tokens}};
  out["task"] = {{"id", prompt_id}, {"name", task}, {"reference", reference}, {"metadata", meta}};
  out["base_url"] = base_url;
  out["api_key"] = api_key;
  out["model"] = model;
  out["episode_id"] = episode_id;
  return SafeDump(out);
}

std::string AgentRefOf(const std::string& metadata) {
  if (metadata.empty()) return "";
  json meta = json::parse(metadata, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("agent_ref")) return "";
  const json& r = meta["agent_ref"];
  if (r.is_string()) return r.get<std::string>();
  if (r.is_object() && r.contains("name") && r["name"].is_string())
    return r["name"].get<std::string>();
  return "";
}

// ---------------------------------------------------------------- client

struct AgentClient::Impl {
  std::atomic<bool> cancelled{false};
  struct Server {
    std::string url;  // {base}/run
    Mutex mu;
    CondVar cv;
    int64_t in_flight TROUPE_GUARDED_BY(mu) = 0;
    AgentServerStats stats TROUPE_GUARDED_BY(mu);
  };
  std::map<std::string, std::unique_ptr<Server>> servers;
};

Result<std::unique_ptr<AgentClient>> AgentClient::Create(const AgentsConfig& config) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  if (!config.enabled()) return InvalidArgument("no agent_servers configured");
  TROUPE_RETURN_IF_ERROR(CurlInit());
  return std::unique_ptr<AgentClient>(new AgentClient(config));
}

AgentClient::AgentClient(const AgentsConfig& config)
    : config_(config), impl_(std::make_unique<Impl>()) {
  for (const auto& [name, url] : config_.servers) {
    auto s = std::make_unique<Impl::Server>();
    std::string base = url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    s->url = base + "/run";
    impl_->servers[name] = std::move(s);
  }
}

AgentClient::~AgentClient() = default;

AgentRunOutcome AgentClient::Run(const AgentRunRequest& request, Deadline deadline) {
  auto it = impl_->servers.find(request.server);
  if (it == impl_->servers.end()) {
    AgentRunOutcome o;
    o.status = NotFound("no agent server '{}'", Printable(request.server, 64));
    o.kind = "unreachable";
    return o;
  }
  Impl::Server& s = *it->second;
  const auto start = Clock::now();
  const auto until =
      std::min(deadline.at(), start + std::chrono::milliseconds(config_.call_timeout_ms));
  {
    MutexLock l(s.mu);
    ++s.stats.episodes;
    bool got = s.cv.wait_until(l, until, [&]() TROUPE_REQUIRES(s.mu) {
      return s.in_flight < config_.max_concurrency || impl_->cancelled.load();
    });
    if (got && impl_->cancelled.load()) {
      AgentRunOutcome o;
      o.status = Cancelled("cancelled (the rollout actor is stopping)");
      o.kind = "cancelled";
      return o;
    }
    if (!got) {
      ++s.stats.timeouts;
      AgentRunOutcome o;
      o.status = Timeout("no free slot of agent server '{}' ({} calls in flight) in time",
                         request.server, config_.max_concurrency);
      o.kind = "timeout";
      return o;
    }
    ++s.in_flight;
    s.stats.max_in_flight = std::max<uint64_t>(s.stats.max_in_flight, s.in_flight);
  }
  AgentRunOutcome out;
  for (int64_t attempt = 0; attempt < config_.max_attempts; ++attempt) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) {
      out.status =
          Timeout("agent server '{}': out of time after {} attempts", request.server, attempt);
      out.kind = "timeout";
      break;
    }
    Attempt a = PostOnce(s.url, request.body, std::min<int64_t>(left, config_.run_timeout_ms),
                         config_.connect_timeout_ms,
                         static_cast<size_t>(config_.max_response_bytes), &impl_->cancelled);
    {
      MutexLock l(s.mu);
      ++s.stats.attempts;
      if (attempt > 0) ++s.stats.retries;
      if (a.out.kind == "unreachable") ++s.stats.unreachable;
      if (a.out.kind == "timeout") ++s.stats.timeouts;
      if (a.out.kind == "http_status") ++s.stats.http_status;
    }
    out = std::move(a.out);
    if (out.status.ok() || !a.retryable) break;
    // Exponential backoff between attempts (bounded by the time left).
    auto pause = std::chrono::milliseconds(100LL << std::min<int64_t>(attempt, 5));
    if (Clock::now() + pause >= until) break;
    std::this_thread::sleep_for(pause);
  }
  if (!out.status.ok())
    out.status =
        out.status.WithContext(fmt::format("agent server '{}' ({})", request.server, s.url));
  {
    MutexLock l(s.mu);
    --s.in_flight;
  }
  s.cv.notify_one();
  return out;
}

void AgentClient::Cancel() {
  impl_->cancelled = true;
  for (auto& [name, s] : impl_->servers) s->cv.notify_all();
}

void AgentClient::RecordEpisode(const std::string& server, const std::string& failure_kind,
                                size_t turns, double latency_ms) {
  auto it = impl_->servers.find(server);
  if (it == impl_->servers.end()) return;
  Impl::Server& s = *it->second;
  MutexLock l(s.mu);
  if (failure_kind.empty()) {
    ++s.stats.ok;
    s.stats.turns += turns;
    s.stats.latency_ms_total += latency_ms;
    return;
  }
  ++s.stats.failed;
  if (failure_kind == "malformed") ++s.stats.malformed;
  if (failure_kind == "agent_error") ++s.stats.agent_error;
  if (failure_kind == "mismatch") ++s.stats.mismatch;
}

std::map<std::string, AgentServerStats> AgentClient::Stats() const {
  std::map<std::string, AgentServerStats> out;
  for (const auto& [name, s] : impl_->servers) {
    MutexLock l(s->mu);
    out[name] = s->stats;
  }
  return out;
}

std::vector<std::pair<std::string, double>> AgentClient::StatsForMetrics() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, st] : Stats()) {
    const std::string p = "agent." + name + ".";
    auto add = [&](const char* k, double v) { out.emplace_back(p + k, v); };
    add("episodes", static_cast<double>(st.episodes));
    add("ok", static_cast<double>(st.ok));
    add("failed", static_cast<double>(st.failed));
    add("attempts", static_cast<double>(st.attempts));
    add("retries", static_cast<double>(st.retries));
    add("unreachable", static_cast<double>(st.unreachable));
    add("timeouts", static_cast<double>(st.timeouts));
    add("http_status", static_cast<double>(st.http_status));
    add("malformed", static_cast<double>(st.malformed));
    add("agent_error", static_cast<double>(st.agent_error));
    add("mismatch", static_cast<double>(st.mismatch));
    add("turns", static_cast<double>(st.turns));
    add("max_in_flight", static_cast<double>(st.max_in_flight));
    add("latency_ms_mean", st.ok ? st.latency_ms_total / static_cast<double>(st.ok) : 0.0);
  }
  return out;
}

// ---------------------------------------------------------------- ledger

void GenerationLedger::Open(const std::string& group) {
  MutexLock l(mu_);
  groups_[group];
}

void GenerationLedger::Close(const std::string& group) {
  MutexLock l(mu_);
  groups_.erase(group);
}

bool GenerationLedger::IsOpen(const std::string& group) const {
  MutexLock l(mu_);
  return groups_.count(group) > 0;
}

size_t GenerationLedger::open_groups() const {
  MutexLock l(mu_);
  return groups_.size();
}

bool GenerationLedger::Record(const std::string& group, Generation g) {
  MutexLock l(mu_);
  auto it = groups_.find(group);
  if (it == groups_.end() || it->second.size() >= kMaxPerGroup) return false;
  it->second.push_back(std::move(g));
  return true;
}

Status GenerationLedger::Verify(const std::string& group, const AgentEpisode& episode,
                                std::vector<uint64_t>* token_versions,
                                uint64_t* oldest_version) const {
  MutexLock l(mu_);
  auto it = groups_.find(group);
  if (it == groups_.end()) return ProtocolError("group {} is not open", group);
  const auto& gens = it->second;
  std::vector<const Generation*> match(episode.turns.size(), nullptr);
  *oldest_version = UINT64_MAX;
  for (size_t t = 0; t < episode.turns.size(); ++t) {
    const AgentTurn& turn = episode.turns[t];
    const Generation* same_ids = nullptr;
    for (const Generation& g : gens) {
      if (g.prompt_ids != turn.prompt_ids || g.generation_ids != turn.generation_ids) continue;
      same_ids = &g;
      bool lp_equal = g.logprobs.size() == turn.logprobs.size();
      for (size_t k = 0; lp_equal && k < g.logprobs.size(); ++k)
        lp_equal = std::fabs(g.logprobs[k] - turn.logprobs[k]) <= 1e-5f;
      if (lp_equal) {
        match[t] = &g;
        break;
      }
    }
    if (!match[t]) {
      if (same_ids)
        return ProtocolError(
            "model turn {}: generation_log_probs differ from the ones the "
            "endpoint sampled with",
            t);
      return ProtocolError(
          "model turn {}: the endpoint generated no such reply in this "
          "group ({} prompt ids, {} generation ids; {} generations "
          "recorded)",
          t, turn.prompt_ids.size(), turn.generation_ids.size(), gens.size());
    }
    *oldest_version = std::min(*oldest_version, match[t]->policy_version);
  }
  token_versions->assign(episode.response.size(), 0);
  std::vector<size_t> pos(episode.turns.size(), 0);
  for (size_t k = 0; k < episode.response.size(); ++k) {
    int32_t t = episode.turn_of[k];
    if (t < 0) continue;
    const Generation& g = *match[static_cast<size_t>(t)];
    size_t p = pos[static_cast<size_t>(t)]++;
    (*token_versions)[k] = p < g.token_versions.size() ? g.token_versions[p] : g.policy_version;
  }
  return Status::Ok();
}

void Describe(config::Binder& b, AgentsConfig& c) {
  b.Field("default_server", &c.default_server,
          "agent server for prompts whose agent_ref names none or an unknown one (\"\" = the "
          "first by name)");
  b.Field("run_timeout_ms", &c.run_timeout_ms, "limit of one /run attempt (a whole episode)");
  b.Field("call_timeout_ms", &c.call_timeout_ms, "limit per episode, retries included");
  b.Field("connect_timeout_ms", &c.connect_timeout_ms, "TCP connect limit of /run calls");
  b.Field("max_attempts", &c.max_attempts,
          "attempts per episode (unreachable, reset, 5xx, 408/429 are retried)");
  b.Field("max_concurrency", &c.max_concurrency, "/run calls in flight per agent server");
  b.Field("max_response_bytes", &c.max_response_bytes, "largest /run answer accepted");
  b.Field("endpoint_max_n", &c.endpoint_max_n, "largest n the generation endpoint accepts");
  b.Field("endpoint_threads", &c.endpoint_threads,
          "HTTP threads of the generation endpoint (0 = one per /run worker plus 8)");
  b.Field("endpoint_timeout_ms", &c.endpoint_timeout_ms,
          "a model call waits this long for the engine at most (then 503)");
}

}  // namespace troupe::envs
