// Agent-server path benchmark: what playing episodes from outside costs, against
// the built-in path on the same engine in the same run.
//
//  1. Throughput: N file_reverse episodes through the generation endpoint,
//     played by the reference agent server (tests/envs/agent_server.py, a real
//     Python process; N concurrent /run sessions, each model turn an HTTP call
//     into the engine's continuous batching), vs the same N episodes (same
//     prompts, same limits) run by EpisodeDriver on the same engine. Figure:
//     sampled tokens/s, ratio endpoint / driver (target >= 0.8).
//  2. Latency: a short completion (4 tokens) to the endpoint while the N
//     sessions run; p50 and p99 over the requests made meanwhile.
//
// Usage: agent_endpoint_bench [--episodes 64] [--rounds 3]
// Ends with one JSON line.
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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

}  // namespace

int main(int argc, char** argv) {
  int episodes = 64, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--episodes") episodes = std::atoi(argv[i + 1]);
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  log::Init("agent-bench", log::Options{spdlog::level::warn});
  curl_global_init(CURL_GLOBAL_DEFAULT);

  auto tok = engine::CharTokenizer::Create(envs::PrintableAlphabet());
  envs::Renderer renderer(**tok, envs::ChatFormat::Compact());
  engine::EngineConfig ec;
  ec.model.vocab_size = (*tok)->vocab_size();
  ec.model.max_seq_len = 256;  // default widths: d_model 128, 2 layers
  ec.num_slots = std::max(episodes, 1);
  auto eng = engine::Engine::Create(ec);
  if (!eng.ok()) {
    std::fprintf(stderr, "engine: %s\n", eng.status().ToString().c_str());
    return 1;
  }
  envs::TaskConfig tc;
  tc.name = "file_reverse";
  tc.eval_size = 20;
  auto task = envs::MakeTask(tc);
  const int max_turns = 4, turn_tokens = 32, response_tokens = 200;

  // ---- the built-in path
  envs::EpisodeDriverConfig dc;
  dc.episode.max_turns = max_turns;
  dc.episode.max_turn_tokens = turn_tokens;
  dc.episode.max_response_tokens = response_tokens;
  envs::EpisodeDriver driver(**eng, renderer, dc);
  std::vector<envs::EpisodeRequest> reqs;
  for (int i = 0; i < episodes; ++i)
    reqs.push_back({task->get(),
                    (*task)->GetPrompt(envs::Split::kTrain, static_cast<uint64_t>(i)),
                    static_cast<uint64_t>(i),
                    static_cast<uint64_t>(i),
                    {}});

  // ---- the agent path
  envs::GenerationLedger ledger;
  actors::GenerationEndpointOptions eo;
  eo.model = "policy";
  eo.token = "bench";
  eo.threads = std::max(8, episodes + 4);
  eo.stop_ids = {(*tok)->eos_id()};
  auto ep = actors::GenerationEndpoint::Start(**eng, renderer, ledger, eo, nullptr);
  if (!ep.ok()) {
    std::fprintf(stderr, "endpoint: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  envs::testing::ServerProcess agent({"python3", TROUPE_AGENT_SERVER, "--max-turns",
                                      std::to_string(max_turns), "--max-response-tokens",
                                      std::to_string(response_tokens)});
  if (!agent.ok()) {
    std::fprintf(stderr, "agent_server.py did not start\n");
    return 1;
  }
  envs::AgentsConfig ac;
  ac.servers = {{"ref", agent.Url("")}};
  ac.max_concurrency = episodes;
  auto client = envs::AgentClient::Create(ac);
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto run_agents = [&](int round, int64_t* tokens, int64_t* failed) {
    std::vector<std::thread> ts;
    std::atomic<int64_t> tok_sum{0}, fails{0};
    for (int i = 0; i < episodes; ++i) {
      ts.emplace_back([&, i] {
        const std::string group = fmt::format("b{}-{}", round, i);
        ledger.Open(group);
        const auto& p = reqs[static_cast<size_t>(i)].prompt;
        std::string body = envs::MakeRunBody(p.messages, p.id, "file_reverse", p.reference,
                                             p.metadata, (*ep)->BaseUrl(group), "bench", "policy",
                                             group, 1.0, 1.0, turn_tokens);
        auto out = (*client)->Run({"ref", body}, Deadline::InMs(600000));
        auto parsed = out.status.ok() ? envs::ParseAgentResponse(out.body, 256)
                                      : Result<envs::AgentEpisode>(out.status);
        if (parsed.ok()) {
          std::vector<uint64_t> v;
          uint64_t oldest = 0;
          if (ledger.Verify(group, *parsed, &v, &oldest).ok()) {
            int64_t n = 0;
            for (uint8_t m : parsed->mask) n += m;
            tok_sum += n;
          } else {
            ++fails;
          }
        } else {
          ++fails;
        }
        ledger.Close(group);
      });
    }
    for (auto& t : ts) t.join();
    *tokens = tok_sum.load();
    *failed = fails.load();
  };

  driver.Run({reqs[0]}, Deadline::InMs(600000));  // warm-up
  // Best of `rounds` alternating rounds of each (the machine is shared); the
  // latency probe runs during every agent round.
  double drv_s = 1e30, agt_s = 1e30;
  int64_t drv_tokens = 0, agt_tokens = 0, agt_failed = 0;
  std::vector<double> latencies;
  const std::string probe_url = (*ep)->BaseUrl() + "/completions";
  const std::string probe_body = json({{"model", "policy"},
                                       {"prompt", {1, 40, 41, 42, 43}},
                                       {"max_tokens", 4},
                                       {"temperature", 1.0}})
                                     .dump();
  for (int round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    auto outs = driver.Run(reqs, Deadline::InMs(600000));
    double s = Seconds(t0);
    int64_t n = 0;
    for (const auto& o : outs)
      if (o.episode)
        for (uint8_t m : o.episode->loss_mask()) n += m;
    if (n / s > drv_tokens / std::max(drv_s, 1e-9) || round == 0) {
      drv_s = s;
      drv_tokens = n;
    }
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
    t0 = Clock::now();
    int64_t tokens = 0, failed = 0;
    run_agents(round, &tokens, &failed);
    s = Seconds(t0);
    done = true;
    probe.join();
    agt_failed += failed;
    if (tokens / s > agt_tokens / std::max(agt_s, 1e-9) || round == 0) {
      agt_s = s;
      agt_tokens = tokens;
    }
  }
  const double drv_rate = drv_tokens / drv_s, agt_rate = agt_tokens / agt_s;
  std::printf(
      "episodes: %d; EpisodeDriver %.0f tok/s (%.2f s); agent server via endpoint %.0f "
      "tok/s (%.2f s, %lld failed)\n",
      episodes, drv_rate, drv_s, agt_rate, agt_s, static_cast<long long>(agt_failed));
  std::printf("short completion under load: p50 %.1f ms, p99 %.1f ms (%zu requests)\n",
              Percentile(latencies, 0.5), Percentile(latencies, 0.99), latencies.size());
  json out = {{"bench", "agent_endpoint"},
              {"episodes", episodes},
              {"driver_tokens_per_s", drv_rate},
              {"endpoint_tokens_per_s", agt_rate},
              {"ratio", agt_rate / drv_rate},
              {"target", 0.8},
              {"failed_episodes", agt_failed},
              {"latency_ms_p50", Percentile(latencies, 0.5)},
              {"latency_ms_p99", Percentile(latencies, 0.99)},
              {"latency_requests", latencies.size()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
