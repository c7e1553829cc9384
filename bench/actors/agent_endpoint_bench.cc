// Agent-server path benchmark: what playing episodes from outside costs, against
// the built-in path on the same engine in the same run.
//
//  1. Throughput: N file_reverse episodes through the generation endpoint,
//     played by the reference agent server (tests/envs/agent_server.py, a real
//     Python process; N concurrent /run sessions, each model turn an HTTP call
//     into the engine's continuous batching), vs the same N episodes (same
//     prompts, same limits, the same environment messages) run by EpisodeDriver
//     on the same engine. Figure: sampled tokens/s, ratio endpoint / driver
//     (target >= 0.8). Both paths re-prefill the whole context every turn, so
//     the engine does the same work per episode only when the episodes are the
//     same: each path reports its turns, environment tokens and prefilled tokens
//     per sampled token, and the limits are chosen so that every episode plays
//     until it submits or reaches max_turns (the token limit, which the agent
//     server cannot apply exactly without the tokenizer, never binds; the
//     driver's token_limit count shows it).
//     Also per CPU second (this process and the agent server's): on shared cores
//     the wall-clock figures swing with other load, the CPU cost does not.
//  2. Latency: a short completion (4 tokens) to the endpoint while the N
//     sessions run (one extra agent round, not counted in the throughput: the
//     probe's own generations would load the engine in one path only); p50 and
//     p99 over the requests made meanwhile.
//
// Usage: agent_endpoint_bench [--episodes 16,32,64,128] [--rounds 3]
// Ends with one JSON line (one entry per session count).
#include <curl/curl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_process.h"
#include "troupe/actors/generation_endpoint.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/agent.h"
#include "troupe/envs/episode_driver.h"
#include "troupe/envs/tasks.h"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t Discard(char*, size_t s, size_t n, void*) {
  return s * n;
}

// One short completion; its latency in ms (or -1 on failure).
double ShortCompletion(CURL* h, const std::string& url, const std::string& body) {
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  auto t0 = Clock::now();
  CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  return rc == CURLE_OK && code == 200 ? 1000.0 * Seconds(t0) : -1.0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// CPU seconds (user + system) this process has used, all threads.
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds of another process (utime + stime from /proc/PID/stat); 0 if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::atof(field.c_str());
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// One path's best round: what it sampled and what the engine did meanwhile.
struct PathRun {
  double seconds = 1e30;
  int64_t sampled = 0;         // model tokens (mask 1) of the finished episodes
  int64_t env = 0;             // environment tokens (mask 0)
  int64_t turns = 0;           // model turns
  int64_t episodes = 0;        // episodes that produced a training sequence
  int64_t failed = 0;          // agent path: episodes refused (transport, parse, ledger)
  int64_t token_limit = 0;     // driver: episodes ended by max_response_tokens
  engine::EngineStats engine;  // the engine's counters over the round (deltas)
  double cpu_seconds = 0;      // CPU used meanwhile: this process, plus the agent server's

  double rate() const { return static_cast<double>(sampled) / seconds; }
  json Json() const {
    const double n = static_cast<double>(std::max<int64_t>(sampled, 1));
    return {
        {"tokens_per_s", rate()},
        {"seconds", seconds},
        {"sampled_tokens", sampled},
        {"turns_per_episode", static_cast<double>(turns) / std::max<int64_t>(episodes, 1)},
        {"env_tokens_per_sampled", static_cast<double>(env) / n},
        {"prefill_tokens_per_sampled", static_cast<double>(engine.prefill_tokens) / n},
        {"mean_decode_batch", static_cast<double>(engine.generated_tokens) /
                                  std::max<double>(1.0, static_cast<double>(engine.decode_steps))},
        {"engine_busy", engine.step_wall_seconds / seconds},
        {"tokens_per_cpu_s", static_cast<double>(sampled) / std::max(cpu_seconds, 1e-9)},
        {"failed", failed},
        {"token_limit", token_limit}};
  }
};

engine::EngineStats Delta(const engine::EngineStats& a, const engine::EngineStats& b) {
  engine::EngineStats d;
  d.generated_tokens = b.generated_tokens - a.generated_tokens;
  d.prefill_tokens = b.prefill_tokens - a.prefill_tokens;
  d.prefill_steps = b.prefill_steps - a.prefill_steps;
  d.decode_steps = b.decode_steps - a.decode_steps;
  d.step_wall_seconds = b.step_wall_seconds - a.step_wall_seconds;
  d.step_cpu_seconds = b.step_cpu_seconds - a.step_cpu_seconds;
  return d;
}

// Keeps the faster of two rounds.
void KeepBest(const PathRun& r, PathRun* best) {
  if (best->sampled == 0 || r.rate() > best->rate()) *best = r;
}

std::vector<int> ParseCounts(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (int n = std::atoi(item.c_str()); n > 0) out.push_back(n);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts = {16, 32, 64, 128};
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--episodes") counts = ParseCounts(argv[i + 1]);
    if (a == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  if (counts.empty()) {
    std::fprintf(stderr, "--episodes: a comma-separated list of positive counts\n");
    return 2;
  }
  const int most = *std::max_element(counts.begin(), counts.end());
  log::Init("agent-bench", log::Options{spdlog::level::warn});
  curl_global_init(CURL_GLOBAL_DEFAULT);

  // Limits: 4 turns of at most 32 tokens; the response budget and the context hold
  // 4 full turns and 3 environment messages (the longest, "no tool call found ...",
  // is 108 characters: 4 x 32 + 3 x 110 = 458), so neither path ends an episode on the
  // token limit.
  const int max_turns = 4, turn_tokens = 32, response_tokens = 480;
  auto tok = engine::CharTokenizer::Create(envs::PrintableAlphabet());
  envs::Renderer renderer(**tok, envs::ChatFormat::Compact());
  engine::EngineConfig ec;
  ec.model.vocab_size = (*tok)->vocab_size();
  ec.model.max_seq_len = 640;  // default widths: d_model 128, 2 layers
  ec.num_slots = most;
  auto eng = engine::Engine::Create(ec);
  if (!eng.ok()) {
    std::fprintf(stderr, "engine: %s\n", eng.status().ToString().c_str());
    return 1;
  }
  envs::TaskConfig tc;
  tc.name = "file_reverse";
  tc.eval_size = 20;
  auto task = envs::MakeTask(tc);

  // ---- the built-in path
  envs::EpisodeDriverConfig dc;
  dc.episode.max_turns = max_turns;
  dc.episode.max_turn_tokens = turn_tokens;
  dc.episode.max_response_tokens = response_tokens;
  envs::EpisodeDriver driver(**eng, renderer, dc);
  std::vector<envs::EpisodeRequest> all;
  for (int i = 0; i < most; ++i)
    all.push_back({task->get(),
                   (*task)->GetPrompt(envs::Split::kTrain, static_cast<uint64_t>(i)),
                   static_cast<uint64_t>(i),
                   static_cast<uint64_t>(i),
                   {}});

  // ---- the agent path: the endpoint sized as a job sizes it for `most` sessions
  envs::testing::ServerProcess agent({"python3", TROUPE_AGENT_SERVER, "--max-turns",
                                      std::to_string(max_turns), "--max-response-tokens",
                                      std::to_string(response_tokens)});
  if (!agent.ok()) {
    std::fprintf(stderr, "agent_server.py did not start\n");
    return 1;
  }
  envs::AgentsConfig ac;
  ac.servers = {{"ref", agent.Url("")}};
  ac.max_concurrency = most;
  envs::GenerationLedger ledger;
  actors::GenerationEndpointOptions eo;
  eo.model = "policy";
  eo.token = "bench";
  eo.threads = static_cast<int>(ac.EndpointThreads());
  eo.stop_ids = {(*tok)->eos_id()};
  auto ep = actors::GenerationEndpoint::Start(**eng, renderer, ledger, eo, nullptr);
  if (!ep.ok()) {
    std::fprintf(stderr, "endpoint: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  auto client = envs::AgentClient::Create(ac);
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    return 1;
  }

  auto run_driver = [&](int n) {
    std::vector<envs::EpisodeRequest> reqs(all.begin(), all.begin() + n);
    PathRun r;
    const auto st0 = (*eng)->stats();
    const double cpu0 = SelfCpuSeconds();
    const auto t0 = Clock::now();
    auto outs = driver.Run(std::move(reqs), Deadline::InMs(600000));
    r.seconds = Seconds(t0);
    r.cpu_seconds = SelfCpuSeconds() - cpu0;
    r.engine = Delta(st0, (*eng)->stats());
    for (const auto& o : outs) {
      if (!o.episode) continue;
      ++r.episodes;
      r.turns += o.episode->episode().turns();
      r.token_limit += o.episode->episode().end() == envs::EpisodeEnd::kTokenLimit;
      for (uint8_t m : o.episode->loss_mask()) (m ? r.sampled : r.env) += 1;
    }
    return r;
  };
  auto run_agents = [&](int n, const std::string& tag) {
    std::vector<std::thread> ts;
    std::atomic<int64_t> sampled{0}, env{0}, turns{0}, episodes{0}, fails{0};
    const auto st0 = (*eng)->stats();
    const double cpu0 = SelfCpuSeconds() + ProcessCpuSeconds(agent.pid());
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      ts.emplace_back([&, i] {
        const std::string group = fmt::format("{}-{}", tag, i);
        ledger.Open(group);
        const auto& p = all[static_cast<size_t>(i)].prompt;
        std::string body = envs::MakeRunBody(p.messages, p.id, "file_reverse", p.reference,
                                             p.metadata, (*ep)->BaseUrl(group), "bench", "policy",
                                             group, 1.0, 1.0, turn_tokens);
        auto out = (*client)->Run({"ref", body}, Deadline::InMs(600000));
        auto parsed = out.status.ok() ? envs::ParseAgentResponse(out.body, ec.model.max_seq_len)
                                      : Result<envs::AgentEpisode>(out.status);
        std::vector<uint64_t> v;
        uint64_t oldest = 0;
        if (parsed.ok() && ledger.Verify(group, *parsed, &v, &oldest).ok()) {
          ++episodes;
          turns += static_cast<int64_t>(parsed->turns.size());
          for (uint8_t m : parsed->mask) (m ? sampled : env) += 1;
        } else {
          ++fails;
        }
        ledger.Close(group);
      });
    }
    for (auto& t : ts) t.join();
    PathRun r;
    r.seconds = Seconds(t0);
    r.cpu_seconds = SelfCpuSeconds() + ProcessCpuSeconds(agent.pid()) - cpu0;
    r.engine = Delta(st0, (*eng)->stats());
    r.sampled = sampled.load();
    r.env = env.load();
    r.turns = turns.load();
    r.episodes = episodes.load();
    r.failed = fails.load();
    return r;
  };

  driver.Run({all[0]}, Deadline::InMs(600000));  // warm-up
  const std::string probe_url = (*ep)->BaseUrl() + "/completions";
  const std::string probe_body = json({{"model", "policy"},
                                       {"prompt", {1, 40, 41, 42, 43}},
                                       {"max_tokens", 4},
                                       {"temperature", 1.0}})
                                     .dump();
  json sessions = json::array(), ratios = json::object(), cpu_ratios = json::object();
  double worst = 1e30;
  int64_t failed = 0;
  for (int n : counts) {
    // Best of `rounds` alternating rounds of each (the machine is shared).
    PathRun drv, agt;
    for (int round = 0; round < rounds; ++round) {
      KeepBest(run_driver(n), &drv);
      PathRun a = run_agents(n, fmt::format("n{}r{}", n, round));
      failed += a.failed;
      KeepBest(a, &agt);
    }
    // Latency under load: one more agent round with the probe running.
    std::vector<double> latencies;
    std::atomic<bool> done{false};
    std::thread probe([&] {
      CURL* h = curl_easy_init();
      curl_slist* hdr = curl_slist_append(nullptr, "Content-Type: application/json");
      hdr = curl_slist_append(hdr, "Authorization: Bearer bench");
      curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
      curl_easy_setopt(h, CURLOPT_PROXY, "");
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
      curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, Discard);
      while (!done.load()) {
        double ms = ShortCompletion(h, probe_url, probe_body);
        if (ms >= 0 && !done.load()) latencies.push_back(ms);
      }
      curl_slist_free_all(hdr);
      curl_easy_cleanup(h);
    });
    failed += run_agents(n, fmt::format("n{}probe", n)).failed;
    done = true;
    probe.join();
    const double ratio = agt.rate() / drv.rate();
    const double cpu_ratio = (static_cast<double>(agt.sampled) / agt.cpu_seconds) /
                             (static_cast<double>(drv.sampled) / drv.cpu_seconds);
    worst = std::min(worst, ratio);
    std::printf(
        "%4d sessions: EpisodeDriver %6.0f tok/s (%.2f s, %.2f turns, %.1f prefill/sampled); "
        "agent server via endpoint %6.0f tok/s (%.2f s, %.2f turns, %.1f prefill/sampled, "
        "%lld failed); ratio %.2f (per CPU second %.2f); short completion under load p50 "
        "%.1f ms, p99 %.1f ms\n",
        n, drv.rate(), drv.seconds,
        static_cast<double>(drv.turns) / std::max<int64_t>(1, drv.episodes),
        static_cast<double>(drv.engine.prefill_tokens) / std::max<int64_t>(1, drv.sampled),
        agt.rate(), agt.seconds,
        static_cast<double>(agt.turns) / std::max<int64_t>(1, agt.episodes),
        static_cast<double>(agt.engine.prefill_tokens) / std::max<int64_t>(1, agt.sampled),
        static_cast<long long>(agt.failed), ratio, cpu_ratio, Percentile(latencies, 0.5),
        Percentile(latencies, 0.99));
    std::fflush(stdout);
    ratios[std::to_string(n)] = ratio;
    cpu_ratios[std::to_string(n)] = cpu_ratio;
    sessions.push_back({{"episodes", n},
                        {"ratio", ratio},
                        {"cpu_ratio", cpu_ratio},
                        {"driver", drv.Json()},
                        {"endpoint", agt.Json()},
                        {"latency_ms_p50", Percentile(latencies, 0.5)},
                        {"latency_ms_p99", Percentile(latencies, 0.99)},
                        {"latency_requests", latencies.size()}});
  }
  json out = {{"bench", "agent_endpoint"},
              {"rounds", rounds},
              {"endpoint_threads", eo.threads},
              {"target", 0.8},
              {"min_ratio", worst},
              {"ratio_by_sessions", ratios},
              {"cpu_ratio_by_sessions", cpu_ratios},
              {"failed_episodes", failed},
              {"sessions", sessions}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
