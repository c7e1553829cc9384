// LoRA vs full fine-tune, measured in one run (one JSON line at the end):
//
//   learner   SupervisedStep (forward + backward + AdamW) on 128 sequences of the default
//             task's shape, LoRA (rank 16, every projection) vs the full model: step time
//             (their steps alternate), and peak RSS of a fresh process doing only that (this
//             binary re-executed);
//   broadcast WeightSender -> one WeightReceiver (zmq chain, localhost): time per update and
//             bytes the learner sent per update, adapters (after the base went once via
//             SetBase) vs the full weights; bytes / adapter bytes is the link-byte ratio;
//   engine    the adapters applied unmerged vs merged: greedy generation tokens/s and the
//             cost of one adapter-only UpdateWeights.
//
// Models: the default job's (2 layers, d_model 128) and a larger one (8 layers, d_model 512).
// usage: lora_bench [--steps 6] [--updates 6] [--models default,large]
// Threads: one intra-op thread, as the actors run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"
#include "troupe/trainer/learner.h"
#include "troupe/transport/zmq_network.h"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

engine::ModelConfig Model(const std::string& name, bool lora) {
  engine::ModelConfig m;
  m.vocab_size = 28;
  m.max_seq_len = 32;
  if (name == "default") {
    m.d_model = 128, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 4, m.ffn_dim = 352;
  } else {
    m.d_model = 512, m.n_layers = 8, m.n_heads = 8, m.n_kv_heads = 8, m.ffn_dim = 1408;
  }
  if (lora) {
    m.lora.rank = 16;
    m.lora.alpha = 32;
    m.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                             "down_proj"};
  }
  return m;
}

// 128 reversal-shaped demonstrations: prompt "<bos>abcd=", response "dcba<eos>".
trainer::Demonstrations Demos(uint64_t seed) {
  trainer::Demonstrations d;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 128; ++i) {
    int n = 3 + static_cast<int>(rng() % 4);
    std::vector<int32_t> p = {0}, r;
    for (int k = 0; k < n; ++k) p.push_back(2 + static_cast<int32_t>(rng() % 26));
    p.push_back(27);
    for (int k = n; k >= 1; --k) r.push_back(p[static_cast<size_t>(k)]);
    r.push_back(1);
    d.Add(p, r);
  }
  return d;
}

int64_t PeakRssKb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

std::unique_ptr<trainer::Learner> MakeLearner(const std::string& model, bool lora) {
  auto policy = engine::LlamaModel::Create(Model(model, lora), 1);
  TROUPE_CHECK(policy.ok());
  auto learner = trainer::Learner::Create(trainer::LearnerConfig{}, *policy);
  TROUPE_CHECK_MSG(learner.ok(), "{}", learner.status().ToString());
  return std::move(learner).value();
}

double TimedStep(trainer::Learner& l, const trainer::Demonstrations& demos) {
  auto t0 = Clock::now();
  auto m = l.SupervisedStep(demos);
  TROUPE_CHECK_MSG(m.ok(), "{}", m.status().ToString());
  return Since(t0);
}

// Median step seconds of the full model and of LoRA, their steps alternating (both see the
// same machine load).
std::pair<double, double> LearnerSteps(const std::string& model, int steps) {
  auto full = MakeLearner(model, false), lora = MakeLearner(model, true);
  const trainer::Demonstrations demos = Demos(7);
  TimedStep(*full, demos);
  TimedStep(*lora, demos);
  std::vector<double> tf, tl;
  for (int i = 0; i < steps; ++i) {
    tf.push_back(TimedStep(*full, demos));
    tl.push_back(TimedStep(*lora, demos));
  }
  return {Median(tf), Median(tl)};
}

// One learner alone (the peak-RSS child).
void LearnerOnly(const std::string& model, bool lora, int steps) {
  auto l = MakeLearner(model, lora);
  const trainer::Demonstrations demos = Demos(7);
  for (int i = 0; i <= steps; ++i) TimedStep(*l, demos);
}

// Peak RSS (kB) of a fresh process that builds the learner and trains `steps` steps.
int64_t ChildPeakRss(const std::string& self, const std::string& model, bool lora, int steps) {
  int fds[2];
  TROUPE_CHECK(::pipe(fds) == 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::execl(self.c_str(), self.c_str(), "--child", model.c_str(), lora ? "lora" : "full",
            std::to_string(steps).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out.empty() ? 0 : std::stoll(out);
}

std::unique_ptr<transport::Network> Net(const std::string& id) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = id;
  auto n = transport::NewZmqNetwork(o);
  TROUPE_CHECK(n.ok());
  return std::move(n).value();
}

struct SyncFigures {
  double full_s = 0, lora_s = 0;
  double full_bytes = 0, lora_bytes = 0;  // learner's sent bytes per update
  double adapter_bytes = 0, base_bytes = 0;
};

// Broadcast per update to one receiver whose sink applies the weights to an engine model.
SyncFigures Sync(const std::string& model, int updates) {
  SyncFigures f;
  auto m = engine::LlamaModel::Create(Model(model, true), 1);
  TROUPE_CHECK(m.ok());
  auto dst = engine::LlamaModel::Create(Model(model, true), 2);
  TROUPE_CHECK(dst.ok());
  for (const auto& [n, t] : (*m)->AdapterWeights()) f.adapter_bytes += t.nbytes();
  for (const auto& [n, t] : (*m)->NamedWeights()) f.base_bytes += t.nbytes();
  for (bool lora : {false, true}) {
    auto net = Net("learner");
    broadcast::BroadcastConfig cfg;
    cfg.backend = broadcast::Backend::kZmq;
    auto sender = broadcast::WeightSender::Create(cfg, *net);
    TROUPE_CHECK(sender.ok());
    auto rnet = Net("rollout-0");
    broadcast::ReceiverConfig rc;
    rc.actor_id = "rollout-0";
    rc.learner_endpoint = (*sender)->endpoint();
    auto receiver = broadcast::WeightReceiver::Create(
        rc, *rnet, [&](const broadcast::ReceivedWeights& w) { return (*dst)->LoadNamed(w.named); });
    TROUPE_CHECK(receiver.ok());
    TROUPE_CHECK((*sender)->WaitForMembers(1, Deadline::InMs(60000)).ok());
    if (lora) TROUPE_CHECK((*sender)->SetBase((*m)->NamedWeights()).ok());
    std::vector<double> t, bytes;
    for (int v = 1; v <= updates + 1; ++v) {
      const uint64_t b0 = (*sender)->stats().bytes_sent;
      auto t0 = Clock::now();
      Status st = (*sender)->Broadcast(
          static_cast<uint64_t>(v), lora ? (*m)->AdapterWeights() : (*m)->StateWeights(),
          Deadline::InMs(60000));
      TROUPE_CHECK_MSG(st.ok(), "{}", st.ToString());
      if (v == 1) continue;  // the first carries the base (LoRA) or warms up (full)
      t.push_back(Since(t0));
      bytes.push_back(static_cast<double>((*sender)->stats().bytes_sent - b0));
    }
    (lora ? f.lora_s : f.full_s) = Median(t);
    (lora ? f.lora_bytes : f.full_bytes) = Median(bytes);
  }
  return f;
}

struct EngineFigures {
  double unmerged_tps = 0, merged_tps = 0, unmerged_update_s = 0, merged_update_s = 0;
};

EngineFigures Generation(const std::string& model, int updates) {
  EngineFigures f;
  auto src = engine::LlamaModel::Create(Model(model, true), 3);
  TROUPE_CHECK(src.ok());
  {
    torch::NoGradGuard g;
    for (auto& [n, t] : (*src)->AdapterWeights()) t.normal_(0, 0.02);
  }
  for (bool merged : {false, true}) {
    engine::EngineConfig ec;
    ec.model = Model(model, true);
    ec.num_slots = 128;
    ec.lora_merged = merged;
    auto e = engine::Engine::Create(ec);
    TROUPE_CHECK_MSG(e.ok(), "{}", e.status().ToString());
    TROUPE_CHECK((*e)->UpdateWeights(1, (*src)->StateWeights(), Deadline::InMs(60000)).ok());
    std::vector<double> upd;
    for (int v = 2; v < 2 + updates; ++v) {
      auto t0 = Clock::now();
      TROUPE_CHECK((*e)->UpdateWeights(v, (*src)->AdapterWeights(), Deadline::InMs(60000)).ok());
      upd.push_back(Since(t0));
    }
    std::vector<engine::GenerateRequest> reqs;
    for (int i = 0; i < 128; ++i) {
      engine::GenerateRequest q;
      q.prompt = {0, 2 + i % 26, 3 + i % 20, 4 + i % 7, 27};
      q.sampling.temperature = 0;
      q.sampling.max_new_tokens = 24;
      reqs.push_back(q);
    }
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      auto out = (*e)->Generate(reqs, Deadline::InMs(120000));
      TROUPE_CHECK(out.ok());
      double tokens = 0;
      for (const auto& g : *out) tokens += static_cast<double>(g.response_ids.size());
      best = std::max(best, tokens / Since(t0));
    }
    (merged ? f.merged_tps : f.unmerged_tps) = best;
    (merged ? f.merged_update_s : f.unmerged_update_s) = Median(upd);
  }
  return f;
}

int Main(int argc, char** argv) {
  at::set_num_threads(1);
  log::Options lo;
  lo.level = spdlog::level::warn;
  log::Init("bench", lo);
  if (argc == 5 && std::string(argv[1]) == "--child") {
    LearnerOnly(argv[2], std::string(argv[3]) == "lora", std::stoi(argv[4]));
    std::printf("%lld\n", static_cast<long long>(PeakRssKb()));
    return 0;
  }
  int steps = 6, updates = 6;
  std::vector<std::string> models = {"default", "large"};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--steps") steps = std::stoi(v);
    else if (a == "--updates") updates = std::stoi(v);
    else if (a == "--models") {
      models.clear();
      for (size_t p = 0, q; p <= v.size(); p = q + 1) {
        q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        models.push_back(v.substr(p, q - p));
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  const std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : argv[0];
  nlohmann::json j;
  j["bench"] = "lora";
  for (const std::string& m : models) {
    nlohmann::json r;
    const engine::ModelConfig c = Model(m, true);
    r["params"] = c.NumParameters();
    r["adapter_params"] = c.NumAdapterParameters();
    const auto [full, lora] = LearnerSteps(m, steps);
    r["step_s_full"] = full;
    r["step_s_lora"] = lora;
    r["step_lora_over_full"] = lora / full;
    const int64_t rss_full = ChildPeakRss(self, m, false, steps);
    const int64_t rss_lora = ChildPeakRss(self, m, true, steps);
    r["peak_rss_mb_full"] = rss_full / 1024.0;
    r["peak_rss_mb_lora"] = rss_lora / 1024.0;
    r["peak_rss_lora_over_full"] = static_cast<double>(rss_lora) / static_cast<double>(rss_full);
    const SyncFigures s = Sync(m, updates);
    r["broadcast_s_full"] = s.full_s;
    r["broadcast_s_lora"] = s.lora_s;
    r["broadcast_lora_over_full"] = s.lora_s / s.full_s;
    r["sent_bytes_lora"] = s.lora_bytes;
    r["adapter_bytes"] = s.adapter_bytes;
    r["sent_over_adapter_bytes"] = s.lora_bytes / s.adapter_bytes;
    r["sent_bytes_full"] = s.full_bytes;
    const EngineFigures g = Generation(m, updates);
    r["gen_tok_s_unmerged"] = g.unmerged_tps;
    r["gen_tok_s_merged"] = g.merged_tps;
    r["gen_merged_over_unmerged"] = g.merged_tps / g.unmerged_tps;
    r["update_s_unmerged"] = g.unmerged_update_s;
    r["update_s_merged"] = g.merged_update_s;
    std::printf(
        "%-8s params %lld, adapters %lld | learner step full %.4f s, LoRA %.4f s (%.2fx); peak "
        "RSS %.0f / %.0f MB | broadcast full %.4f s, LoRA %.4f s (%.3fx), sent %.0f B = %.3fx "
        "adapter | gen unmerged %.0f tok/s, merged %.0f tok/s (%.2fx), update %.4f / %.4f s\n",
        m.c_str(), static_cast<long long>(c.NumParameters()),
        static_cast<long long>(c.NumAdapterParameters()), full, lora, lora / full,
        rss_full / 1024.0, rss_lora / 1024.0, s.full_s, s.lora_s, s.lora_s / s.full_s,
        s.lora_bytes, s.lora_bytes / s.adapter_bytes, g.unmerged_tps, g.merged_tps,
        g.merged_tps / g.unmerged_tps, g.unmerged_update_s, g.merged_update_s);
    std::fflush(stdout);
    j["models"][m] = r;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace troupe

int main(int argc, char** argv) {
  return troupe::Main(argc, argv);
}
