#include "troupe/launcher/dashboard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <httplib.h>

#include "prometheus.h"
#include "run_view.h"
#include "troupe/core/log.h"
#include "troupe/core/text.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/launcher/spawner.h"
#include "web_assets.h"

namespace troupe::launcher {

namespace fs = std::filesystem;

namespace {

spdlog::logger& Log() {
  return log::Get("launcher");
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Equal strings in time independent of where they differ.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

std::string CookieToken(const std::string& cookies) {
  const std::string key = "troupe_token=";
  size_t at = 0;
  while ((at = cookies.find(key, at)) != std::string::npos) {
    if (at == 0 || cookies[at - 1] == ' ' || cookies[at - 1] == ';') {
      size_t end = cookies.find(';', at);
      return cookies.substr(at + key.size(),
                            end == std::string::npos ? std::string::npos : end - at - key.size());
    }
    at += key.size();
  }
  return "";
}

// Parses an optional number query parameter; false (and an error text) when malformed.
template <typename T>
bool QueryNumber(const httplib::Request& req, const char* name, std::optional<T>* out,
                 std::string* err) {
  if (!req.has_param(name)) return true;
  const std::string v = req.get_param_value(name);
  if (v.empty()) return true;
  try {
    size_t used = 0;
    if constexpr (std::is_floating_point_v<T>)
      *out = static_cast<T>(std::stod(v, &used));
    else
      *out = static_cast<T>(std::stoll(v, &used));
    if (used != v.size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    *err = std::string("query parameter '") + name + "' is not a number: '" + v + "'";
    return false;
  }
  return true;
}

void Error(httplib::Response& res, int code, const std::string& msg) {
  res.status = code;
  nlohmann::json j;
  j["error"] = msg;
  res.set_content(j.dump(), "application/json");
}

}  // namespace

Result<std::string> NewDashboardToken() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open /dev/urandom: {}", std::strerror(errno));
  unsigned char b[16];
  ssize_t n = ::read(fd, b, sizeof(b));
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof(b))) return IoError("cannot read /dev/urandom");
  std::string out;
  for (unsigned char c : b) out += fmt::format("{:02x}", c);
  return out;
}

bool IsLoopbackAddress(const std::string& a) {
  return a == "localhost" || a == "::1" || a == "[::1]" || a.rfind("127.", 0) == 0;
}

Status ParseDashboardBind(const std::string& text, std::string* bind, uint32_t* port) {
  if (text.empty()) return InvalidArgument("--dashboard-bind: empty (e.g. 0.0.0.0:8265)");
  std::string host = text, port_text;
  if (text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return InvalidArgument("--dashboard-bind '{}': no ']'", text);
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':')
        return InvalidArgument("--dashboard-bind '{}': expected ':PORT' after ']'", text);
      port_text = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    host = text.substr(0, text.find(':'));
    port_text = text.substr(text.find(':') + 1);
  }
  if (!port_text.empty() || text.back() == ':') {
    char* end = nullptr;
    const long p = std::strtol(port_text.c_str(), &end, 10);
    if (port_text.empty() || *end != '\0' || p < 0 || p > 65535)
      return InvalidArgument("--dashboard-bind '{}': the port must be 0-65535", text);
    *port = static_cast<uint32_t>(p);
  }
  if (!host.empty()) {
    if (host.find_first_of(" /\\\"'") != std::string::npos)
      return InvalidArgument("--dashboard-bind '{}': not an address", text);
    *bind = host;
  }
  return Status::Ok();
}

class Dashboard::Impl {
 public:
  Impl(RunDir run, DashboardOptions o)
      : run_(std::move(run)),
        o_(std::move(o)),
        metrics_(run_.metrics()),
        rollouts_(run_.path + "/rollouts.jsonl") {}
  ~Impl() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Start();
  int port() const { return port_; }
  std::string url() const {
    std::string host = o_.bind;
    if (host == "0.0.0.0" || host == "::") host = HostName();
    if (host.find(':') != std::string::npos && host[0] != '[') host = "[" + host + "]";
    return fmt::format("http://{}:{}/{}", host, port_,
                       o_.token.empty() ? "" : "?token=" + o_.token);
  }
  void Publish(nlohmann::json status) {
    MutexLock l(mu_);
    live_ = std::move(status);
    has_live_ = true;
  }

 private:
  void Routes();
  bool Allowed(const httplib::Request& req, httplib::Response& res);
  nlohmann::json CurrentStatus();
  void OnJob(const httplib::Request& req, httplib::Response& res);
  void OnSeries(const httplib::Request& req, httplib::Response& res);
  void OnLogs(const httplib::Request& req, httplib::Response& res);
  void OnRollouts(const httplib::Request& req, httplib::Response& res);
  void OnMetrics(const httplib::Request& req, httplib::Response& res);

  RunDir run_;
  DashboardOptions o_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  MetricsStore metrics_;
  RolloutIndex rollouts_;
  Mutex mu_;
  bool has_live_ TROUPE_GUARDED_BY(mu_) = false;
  nlohmann::json live_ TROUPE_GUARDED_BY(mu_);
  // RUN/status.json, re-read when it changes (a finished run, or a live one seen from outside).
  nlohmann::json file_status_ TROUPE_GUARDED_BY(mu_);
  int64_t file_mtime_ns_ TROUPE_GUARDED_BY(mu_) = -1;
};

Status Dashboard::Impl::Start() {
  if (o_.token.empty() && !IsLoopbackAddress(o_.bind))
    return InvalidArgument("the dashboard on '{}' (not loopback) needs a token", o_.bind);
  const size_t threads = std::max<uint32_t>(1, o_.threads);
  server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // No keep-alive: cpp-httplib 0.11 waits for a kept-alive connection's next
  // request by polling it every ~10 ms, which cost the head 2-3 % of a core
  // per open browser tab. The page makes 2-3 requests a second; a loopback
  // connect each is cheaper.
  server_.set_keep_alive_max_count(1);  // one request per connection
  server_.set_read_timeout(5, 0);
  server_.set_write_timeout(5, 0);
  Routes();
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return Allowed(req, res) ? httplib::Server::HandlerResponse::Unhandled
                             : httplib::Server::HandlerResponse::Handled;
  });
  if (o_.port == 0) {
    port_ = server_.bind_to_any_port(o_.bind);
  } else {
    port_ =
        server_.bind_to_port(o_.bind, static_cast<int>(o_.port)) ? static_cast<int>(o_.port) : -1;
  }
  if (port_ <= 0)
    return Unavailable("cannot serve the dashboard on {}:{}: {}", o_.bind, o_.port,
                       std::strerror(errno));
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  // stop() is a no-op until the loop runs: wait for it, so the destructor can always end it.
  // (cpp-httplib 0.11 has no readiness callback; the loop starts within microseconds.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server_.is_running()) return Internal("the dashboard's HTTP server did not start");
  Log().info("dashboard of {} at {}", run_.name(), url());
  return Status::Ok();
}

bool Dashboard::Impl::Allowed(const httplib::Request& req, httplib::Response& res) {
  if (IsLoopbackAddress(o_.bind)) {
    // A page of another site that resolves its own name to 127.0.0.1 must
    // not read the job (DNS rebinding): only local names are served.
    std::string host = req.get_header_value("Host");
    if (!host.empty() && host[0] == '[') {
      host = host.substr(0, host.find(']') + 1);
    } else {
      host = host.substr(0, host.rfind(':'));
    }
    if (!host.empty() && !IsLoopbackAddress(host)) {
      Error(res, 403, "the dashboard answers only requests for localhost, not '" + host + "'");
      return false;
    }
  }
  if (o_.token.empty()) return true;
  std::string got = req.has_param("token") ? req.get_param_value("token") : "";
  const std::string auth = req.get_header_value("Authorization");
  if (got.empty() && auth.rfind("Bearer ", 0) == 0) got = auth.substr(7);
  if (got.empty()) got = CookieToken(req.get_header_value("Cookie"));
  if (!SameSecret(got, o_.token)) {
    Error(res, 401,
          got.empty() ? "this dashboard needs its token (the URL `troupe run` printed, or "
                        "RUN/secrets/dashboard.json)"
                      : "wrong dashboard token");
    return false;
  }
  if (req.has_param("token")) {
    // The page's own requests then carry the cookie instead of the token in URLs.
    res.set_header("Set-Cookie",
                   "troupe_token=" + o_.token + "; Path=/; HttpOnly; SameSite=Strict");
  }
  return true;
}

nlohmann::json Dashboard::Impl::CurrentStatus() {
  MutexLock l(mu_);
  if (has_live_) return live_;
  struct stat st {};
  const std::string path = run_.path + "/status.json";
  if (::stat(path.c_str(), &st) == 0) {
    const int64_t m = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (m != file_mtime_ns_) {
      auto text = ReadFile(path);
      auto j = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
      if (j.is_object()) {
        file_status_ = std::move(j);
        file_mtime_ns_ = m;
      }
    }
  }
  if (!file_status_.is_object()) {
    // A run folder from before status.json, or a head that never wrote one.
    file_status_ = {{"job", run_.name()},
                    {"run", run_.path},
                    {"state", "unknown"},
                    {"actors", nlohmann::json::array()}};
  }
  return file_status_;
}

void Dashboard::Impl::Routes() {
  for (size_t i = 0; i < kWebAssetCount; ++i) {
    const WebAsset& a = kWebAssets[i];
    auto serve = [&a](const httplib::Request&, httplib::Response& res) {
      if (a.missing) {
        res.status = 503;
        res.set_content(reinterpret_cast<const char*>(a.data), a.size, "text/plain");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
    };
    server_.Get(a.path, serve);
    if (std::strcmp(a.path, "/index.html") == 0) server_.Get("/", serve);
  }
  server_.Get("/api/job", [this](const auto& q, auto& r) { OnJob(q, r); });
  server_.Get("/api/actors", [this](const auto&, auto& r) {
    nlohmann::json s = CurrentStatus();
    bool live;
    {
      MutexLock l(mu_);
      live = has_live_;
    }
    // Heartbeat ages: now while live; a finished run's as they were at its last status.
    const int64_t at = live ? NowNs() : s.value("time_ns", NowNs());
    nlohmann::json out = {{"time_ns", at}, {"actors", s.value("actors", nlohmann::json::array())}};
    r.set_content(out.dump(), "application/json");
  });
  server_.Get("/api/series", [this](const auto& q, auto& r) { OnSeries(q, r); });
  server_.Get("/api/logs", [this](const auto& q, auto& r) { OnLogs(q, r); });
  server_.Get("/api/rollouts", [this](const auto& q, auto& r) { OnRollouts(q, r); });
  server_.Get("/metrics", [this](const auto& q, auto& r) { OnMetrics(q, r); });
}

void Dashboard::Impl::OnJob(const httplib::Request&, httplib::Response& res) {
  nlohmann::json s = CurrentStatus();
  s.erase("actors");
  s["live"] = [&] {
    MutexLock l(mu_);
    return has_live_;
  }();
  for (const char* kind : {"summary", "job_summary", "warm_start"}) {
    auto last = metrics_.Last(kind);
    s[kind] = last ? *last : nlohmann::json();
  }
  res.set_content(s.dump(), "application/json");
}

void Dashboard::Impl::OnSeries(const httplib::Request& req, httplib::Response& res) {
  std::optional<int64_t> from, max;
  std::string err;
  if (!QueryNumber(req, "from", &from, &err) || !QueryNumber(req, "max", &max, &err))
    return Error(res, 400, err);
  size_t next = 0, total = 0;
  const size_t limit = static_cast<size_t>(std::clamp<int64_t>(max.value_or(5000), 1, 20000));
  std::string records = metrics_.RecordsFrom(
      static_cast<size_t>(std::max<int64_t>(0, from.value_or(0))), limit, &next, &total);
  res.set_content(fmt::format("{{\"next\":{},\"total\":{},\"records\":{}}}", next, total, records),
                  "application/json");
}

void Dashboard::Impl::OnLogs(const httplib::Request& req, httplib::Response& res) {
  if (!req.has_param("actor")) {
    // The actors that have logs, with their sizes.
    nlohmann::json list = nlohmann::json::array();
    std::error_code ec;
    for (auto& e : fs::directory_iterator(run_.logs(), ec)) {
      if (e.path().extension() != ".log") continue;
      std::error_code ec2;
      list.push_back({{"actor", e.path().stem().string()}, {"size", fs::file_size(e.path(), ec2)}});
    }
    std::sort(list.begin(), list.end(),
              [](const auto& a, const auto& b) { return a["actor"] < b["actor"]; });
    res.set_content(nlohmann::json{{"logs", list}}.dump(), "application/json");
    return;
  }
  const std::string actor = req.get_param_value("actor");
  if (!SafeFileName(actor)) return Error(res, 400, "bad actor name '" + actor + "'");
  std::optional<int64_t> offset, max;
  std::string err;
  if (!QueryNumber(req, "offset", &offset, &err) || !QueryNumber(req, "max", &max, &err))
    return Error(res, 400, err);
  auto chunk =
      ReadLogChunk(run_.log_file(actor), offset.value_or(-1),
                   static_cast<size_t>(std::clamp<int64_t>(max.value_or(65536), 1, 1 << 20)));
  if (!chunk.ok()) return Error(res, 404, "no log for actor '" + actor + "'");
  nlohmann::json j = {{"actor", actor},
                      {"offset", chunk->offset},
                      {"next", chunk->next},
                      {"size", chunk->size},
                      {"text", std::move(chunk->text)}};
  // Log lines are the actors' own bytes: invalid UTF-8 is replaced, never a failed answer.
  res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void Dashboard::Impl::OnRollouts(const httplib::Request& req, httplib::Response& res) {
  RolloutQuery q;
  std::optional<int64_t> limit;
  std::string err;
  if (!QueryNumber(req, "step_min", &q.step_min, &err) ||
      !QueryNumber(req, "step_max", &q.step_max, &err) ||
      !QueryNumber(req, "reward_min", &q.reward_min, &err) ||
      !QueryNumber(req, "reward_max", &q.reward_max, &err) ||
      !QueryNumber(req, "before", &q.before, &err) || !QueryNumber(req, "limit", &limit, &err))
    return Error(res, 400, err);
  q.limit = static_cast<size_t>(std::clamp<int64_t>(limit.value_or(50), 1, 500));
  if (req.has_param("task")) q.task = req.get_param_value("task");
  if (req.has_param("text")) q.text = req.get_param_value("text");
  auto page = rollouts_.Query(q);
  if (!page.ok()) return Error(res, 500, page.status().message());
  std::string lines = "[";
  for (const auto& [index, line] : page->lines) {
    if (lines.size() > 1) lines += ',';
    lines += fmt::format("{{\"index\":{},\"record\":{}}}", index, line);
  }
  lines += ']';
  nlohmann::json head = {{"total", page->total},
                         {"matched", page->matched},
                         {"tasks", page->tasks},
                         {"step_min", page->step_min},
                         {"step_max", page->step_max}};
  std::string out = head.dump();
  out.pop_back();  // '}'
  out += ",\"rollouts\":" + lines + "}";
  res.set_content(out, "application/json");
}

void Dashboard::Impl::OnMetrics(const httplib::Request&, httplib::Response& res) {
  res.set_content(
      RenderPrometheus(CurrentStatus(), metrics_.Last("train"), metrics_.Last("eval"), NowNs()),
      "text/plain; version=0.0.4; charset=utf-8");
}

// ------------------------------------------------------------------ facade

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dashboard::~Dashboard() = default;

Result<std::unique_ptr<Dashboard>> Dashboard::Start(const RunDir& run, DashboardOptions options) {
  auto impl = std::make_unique<Impl>(run, std::move(options));
  TROUPE_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
}

int Dashboard::port() const {
  return impl_->port();
}
std::string Dashboard::url() const {
  return impl_->url();
}
void Dashboard::Publish(nlohmann::json status) {
  impl_->Publish(std::move(status));
}

}  // namespace troupe::launcher
