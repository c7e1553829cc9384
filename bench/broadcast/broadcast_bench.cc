// Weight-broadcast benchmark: the time for WeightSender::Broadcast to put 10,
// 100 and 400 MB of weights (~200 float32 tensors) into K = 1, 2, 4 receiver
// processes and have every one acknowledge it, for each runnable backend, with
// one memcpy of the same bytes measured in the same run as the limit.
//
//   backends  gloo_chain, gloo_broadcast (ProcessGroupGloo::broadcast per bucket),
//             zmq_chain, zmq_star (the learner sends K copies), shm_view (the sink
//             gets views over the shared segment and keeps nothing: the cost of the
//             broadcast itself), shm_copy (the sink copies the views into tensors it
//             owns, as Engine::UpdateWeights copies into its parameters), nccl (GPU
//             machines only: learner on GPU 0, receiver i on GPU i+1;
//             scripts/gpu/build-and-check.sh)
//   targets   shm: time <= 2x memcpy whatever K is (same host);
//             chain paths across hosts: time(K=4) <= 1.5x time(K=1) at 100 MB. For
//             those, run bench/broadcast/netns-bench.sh: it starts this binary with
//             --netns in network namespaces whose links are rate-limited with tc and
//             reports the bytes that really left the learner's interface per
//             broadcast, in payloads ("link copies").
//
// usage: broadcast_bench [--sizes 10,100,400] [--receivers 1,2,4] [--repeats 3]
//                        [--backends gloo_chain,...] [--netns --learner-host A
//                         --receiver-hosts B,C,.. --receiver-netns n1,n2,.. --link-iface IF]
//                        [--chunk-kb 1024] [--bucket-mb 32] [--warmups 2] [--hwm 16] [--curve]
//                        [--lora default,large]
//   --curve  every process's network uses CURVE (as a multi-node job does): the zmq paths
//            and every control message are encrypted and authenticated
//   --lora   instead of --sizes: real model layouts (lora_bench's models: default = the
//            default job's 2 layers d_model 128, large = 8 layers d_model 512; LoRA rank 16 on
//            every projection). Per model two rows: "<model>_full" broadcasts base +
//            adapters every update (a full fine-tune's traffic), "<model>_lora" sets the
//            frozen base once (WeightSender::SetBase; its first broadcast is a warm-up) and
//            times adapter-only updates; link copies are then bytes per adapter payload.
// Receivers are this binary re-executed with --receiver. Ends with one JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "child_process.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/core/log.h"
#include "troupe/engine/model.h"
#include "troupe/transport/allocator.h"
#include "troupe/transport/curve.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::broadcast {
namespace {

using troupe::testing::ChildProcess;

// "CURVE <server public> <server secret> <client public> <client secret>" (a receiver reads it
// on stdin, as an actor gets its keys), and the options it stands for.
std::string CurveLine(const transport::CurveOptions& c) {
  return fmt::format("CURVE {} {} {} {}", c.server.public_key, c.server.secret_key,
                     c.client.public_key, c.client.secret_key);
}

transport::CurveOptions ParseCurveLine(const std::string& line) {
  std::istringstream in(line);
  std::string tag;
  transport::CurveOptions c;
  in >> tag >> c.server.public_key >> c.server.secret_key >> c.client.public_key >>
      c.client.secret_key;
  c.enabled = tag == "CURVE";
  if (c.enabled) c.allowed_client_public_keys = {c.client.public_key};
  return c;
}

// Every process has one network, as an actor does (CURVE on every socket with --curve).
std::unique_ptr<transport::Network> MakeNetwork(const std::string& actor,
                                                const transport::CurveOptions& curve) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  o.curve = curve;
  auto net = transport::NewZmqNetwork(o);
  if (!net.ok()) {
    std::fprintf(stderr, "network: %s\n", net.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(net).value();
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Options {
  std::vector<int> sizes_mb{10, 100, 400};
  std::vector<int> receivers{1, 2, 4};
  int repeats = 3;
  std::vector<std::string> backends{"gloo_chain", "gloo_broadcast", "zmq_chain",
                                    "zmq_star",   "shm_view",       "shm_copy"};
  bool netns = false;
  std::string learner_host = "127.0.0.1";
  std::vector<std::string> receiver_hosts;
  std::vector<std::string> receiver_netns;
  std::string link_iface;
  uint64_t chunk_bytes = BroadcastConfig().chunk_bytes;
  uint64_t bucket_bytes = BroadcastConfig().bucket_bytes;
  int warmups = 2;  // untimed rounds first: every buffer (both shm slots) touched once
  int hwm = BroadcastConfig().zmq_hwm_chunks;
  bool curve = false;  // CURVE on every socket of every process (the multi-node setting)
  std::vector<std::string> lora_models;  // --lora: model layouts instead of --sizes
};

// ----------------------------------------------------------------- receiver process

int RunReceiver(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto eq = s.find('=');
    if (eq != std::string::npos) a[s.substr(0, eq)] = s.substr(eq + 1);
  }
  log::Options lo;
  lo.level = spdlog::level::warn;
  log::Init(a["id"], lo);
  transport::CurveOptions curve;
  if (a["curve"] == "stdin") {
    std::string line;
    std::getline(std::cin, line);
    curve = ParseCurveLine(line);
  }
  auto net = MakeNetwork(a["id"], curve);
  ReceiverConfig rc;
  rc.learner_endpoint = a["endpoint"];
  rc.data_endpoint = "tcp://" + a["host"] + ":0";
  rc.gloo_hostname = a["host"];
  rc.learner_timeout_ms = 120000;
  const bool copy = a["mode"] == "copy";
  if (!a["hwm"].empty()) rc.zmq_hwm_chunks = std::stoi(a["hwm"]);
  if (!a["device"].empty()) rc.nccl_device = std::stoi(a["device"]);
  std::map<std::string, at::Tensor> params;  // "engine parameters" for copy mode
  auto sink = [&](const ReceivedWeights& w) {
    if (!copy) return Status::Ok();
    for (const auto& [name, t] : w.named) {
      auto it = params.find(name);
      if (it == params.end() || !it->second.sizes().equals(t.sizes()))
        it = params.insert_or_assign(name, at::empty_like(t)).first;
      it->second.copy_(t);
    }
    return Status::Ok();
  };
  auto r = WeightReceiver::Create(rc, *net, sink);
  if (!r.ok()) {
    std::printf("ERROR %s\n", r.status().ToString().c_str());
    return 2;
  }
  std::printf("READY %s\n", (*r)->data_endpoint().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// ----------------------------------------------------------------- learner side

NamedTensors MakeWeights(int mb) {
  const int64_t total = static_cast<int64_t>(mb) * 1000 * 1000 / 4;  // float32 elements
  const int n = 200;
  NamedTensors w;
  for (int i = 0; i < n; ++i) {
    int64_t numel = total / n + (i < total % n ? 1 : 0);
    w.emplace_back(fmt::format("model.layers.{}.weight", i), at::rand({numel}));
  }
  return w;
}

// What one row broadcasts: `update` every time, after `base` went once (SetBase) if any.
struct WeightSet {
  std::string name;  // "100" (MB) or "large_lora"
  int mb = 0;        // --sizes rows
  NamedTensors base, update;
  size_t bytes = 0;  // of `update`
};

size_t Bytes(const NamedTensors& n) {
  size_t b = 0;
  for (const auto& [name, t] : n) b += t.nbytes();
  return b;
}

// lora_bench's models (bench/trainer/lora_bench.cc), LoRA rank 16 on every projection.
engine::ModelConfig LoraModel(const std::string& name) {
  engine::ModelConfig m;
  m.vocab_size = 28;
  m.max_seq_len = 32;
  if (name == "default") {
    m.d_model = 128, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 4, m.ffn_dim = 352;
  } else if (name == "large") {
    m.d_model = 512, m.n_layers = 8, m.n_heads = 8, m.n_kv_heads = 8, m.ffn_dim = 1408;
  } else {
    std::fprintf(stderr, "unknown --lora model %s (default, large)\n", name.c_str());
    std::exit(2);
  }
  m.lora.rank = 16;
  m.lora.alpha = 32;
  m.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"};
  return m;
}

// --sizes: one set per size. --lora: every model's full set, then its LoRA set (full sets
// first: a sender keeps the base it was given).
std::vector<WeightSet> MakeSets(const Options& o) {
  std::vector<WeightSet> out;
  if (o.lora_models.empty()) {
    for (int mb : o.sizes_mb) out.push_back({std::to_string(mb), mb, {}, MakeWeights(mb)});
  } else {
    std::vector<WeightSet> lora;
    for (const std::string& name : o.lora_models) {
      engine::LlamaModel model(LoraModel(name), 1);
      out.push_back({name + "_full", 0, {}, model.StateWeights()});
      lora.push_back({name + "_lora", 0, model.NamedWeights(), model.AdapterWeights()});
    }
    out.insert(out.end(), lora.begin(), lora.end());
  }
  for (auto& w : out) w.bytes = Bytes(w.update);
  return out;
}

// One memcpy of the payload between two buffers the process already touched: the limit.
// Measured (best of 3) right before every row, so it sees the same machine load.
struct MemcpyLimit {
  explicit MemcpyLimit(size_t n) : bytes(n), src(bytes, 1), dst(bytes, 2) {}
  double Seconds3() {
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      best = std::min(best, Seconds(t0, Clock::now()));
      src[static_cast<size_t>(i) % bytes] = static_cast<uint8_t>(i);
    }
    return best;
  }
  size_t bytes;
  std::vector<uint8_t> src, dst;
};

uint64_t LinkTxBytes(const std::string& iface) {
  if (iface.empty()) return 0;
  std::ifstream in("/sys/class/net/" + iface + "/statistics/tx_bytes");
  uint64_t v = 0;
  in >> v;
  return v;
}

struct Spec {
  Backend backend;
  GlooAlgorithm gloo = GlooAlgorithm::kChain;
  ZmqTopology zmq = ZmqTopology::kChain;
  bool copy = false;
};

Spec ParseSpec(const std::string& name) {
  if (name == "gloo_chain") return {Backend::kGloo, GlooAlgorithm::kChain};
  if (name == "gloo_broadcast") return {Backend::kGloo, GlooAlgorithm::kBroadcast};
  if (name == "zmq_chain") return {Backend::kZmq, {}, ZmqTopology::kChain};
  if (name == "zmq_star") return {Backend::kZmq, {}, ZmqTopology::kStar};
  if (name == "shm_view") return {Backend::kShm};
  if (name == "shm_copy") return {Backend::kShm, {}, {}, true};
  if (name == "nccl") return {Backend::kNccl};
  std::fprintf(stderr, "unknown backend %s\n", name.c_str());
  std::exit(2);
}

struct Row {
  std::string backend;
  std::string weights;  // WeightSet::name
  size_t bytes = 0;     // payload per update
  int mb = 0;
  int k = 0;
  double median = 0;
  double best = 0;
  double copies = 0;  // bytes that left the learner's interface / payload (netns only)
  double pack = 0;    // median packing time (part of median)
  double memcpy = 0;  // one memcpy of the payload, measured right before
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunLearner(const Options& o, const std::string& self) {
  log::Options lo;
  lo.level = spdlog::level::warn;
  log::Init("bench", lo);
  std::vector<WeightSet> sets = MakeSets(o);
  std::map<std::string, std::unique_ptr<MemcpyLimit>> limits;
  for (const WeightSet& w : sets) {
    limits[w.name] = std::make_unique<MemcpyLimit>(w.bytes);
    double s = limits[w.name]->Seconds3();
    std::printf("memcpy %-12s %9zu B: %.5f s (%.2f GB/s)\n", w.name.c_str(), w.bytes, s,
                w.bytes / 1e9 / s);
  }
  transport::CurveOptions curve;
  if (o.curve) {
    auto server = transport::GenerateCurveKeyPair();
    auto client = transport::GenerateCurveKeyPair();
    if (!server.ok() || !client.ok()) {
      std::fprintf(stderr, "curve keys: %s\n", server.status().ToString().c_str());
      return 1;
    }
    curve.enabled = true;
    curve.server = *server;
    curve.client = *client;
    curve.allowed_client_public_keys = {client->public_key};
  }
  auto net = MakeNetwork("learner", curve);
  std::vector<Row> rows;
  for (const std::string& name : o.backends) {
    Spec spec = ParseSpec(name);
    if (o.netns && spec.backend == Backend::kShm) continue;  // shm is same-host only
    for (int k : o.receivers) {
      BroadcastConfig cfg;
      cfg.backend = spec.backend;
      cfg.gloo_algorithm = spec.gloo;
      cfg.zmq_topology = spec.zmq;
      cfg.control_endpoint = "tcp://" + o.learner_host + ":0";
      cfg.store_host = o.learner_host;
      cfg.gloo_hostname = o.learner_host;
      cfg.timeout_ms = 60000;
      cfg.chunk_bytes = o.chunk_bytes;
      cfg.zmq_hwm_chunks = o.hwm;
      cfg.bucket_bytes = o.bucket_bytes;
      cfg.member_timeout_ms = 120000;
      cfg.shm_prefix = fmt::format("/troupe-bench-{}", ::getpid());
      auto sender = WeightSender::Create(cfg, *net);
      if (!sender.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), sender.status().ToString().c_str());
        return 1;
      }
      std::vector<std::unique_ptr<ChildProcess>> children;
      for (int i = 0; i < k; ++i) {
        std::string host =
            o.receiver_hosts.empty() ? "127.0.0.1" : o.receiver_hosts[i % o.receiver_hosts.size()];
        std::vector<std::string> prefix;
        if (!o.receiver_netns.empty())
          prefix = {"ip", "netns", "exec", o.receiver_netns[i % o.receiver_netns.size()]};
        auto c = ChildProcess::Start(
            self,
            {"--receiver", fmt::format("id=rollout-{}", i), "endpoint=" + (*sender)->endpoint(),
             "host=" + host, spec.copy ? "mode=copy" : "mode=view", fmt::format("hwm={}", o.hwm),
             fmt::format("device={}", i + 1),  // nccl: one GPU per rank, learner on GPU 0
             o.curve ? "curve=stdin" : "curve=off"},
            prefix);
        if (!c.ok()) {
          std::fprintf(stderr, "spawn: %s\n", c.status().ToString().c_str());
          return 1;
        }
        if (o.curve) (*c)->Send(CurveLine(curve)).IgnoreError();
        children.push_back(std::move(c).value());
      }
      for (auto& c : children) {
        auto ready = c->WaitFor("READY", Deadline::InMs(120000));
        if (!ready.ok()) {
          std::fprintf(stderr, "receiver: %s\n", ready.status().ToString().c_str());
          return 1;
        }
      }
      Status st = (*sender)->WaitForMembers(k, Deadline::InMs(120000));
      if (!st.ok()) {
        std::fprintf(stderr, "%s K=%d: %s\n", name.c_str(), k, st.ToString().c_str());
        return 1;
      }
      uint64_t version = 0;
      for (const WeightSet& w : sets) {
        const int mb = w.mb;
        std::vector<double> times, copies, packs;
        const double memcpy_s = limits[w.name]->Seconds3();
        if (!w.base.empty() && !(st = (*sender)->SetBase(w.base)).ok()) {
          std::fprintf(stderr, "SetBase: %s\n", st.ToString().c_str());
          return 1;
        }
        for (int r = -o.warmups; r < o.repeats; ++r) {  // r < 0: warm-up
          uint64_t tx0 = LinkTxBytes(o.link_iface);
          auto t0 = Clock::now();
          st = (*sender)->Broadcast(++version, w.update, Deadline::InMs(600000));
          double secs = Seconds(t0, Clock::now());
          uint64_t tx1 = LinkTxBytes(o.link_iface);
          if (!st.ok()) {
            std::fprintf(stderr, "%s K=%d %s: %s\n", name.c_str(), k, w.name.c_str(),
                         st.ToString().c_str());
            return 1;
          }
          if (r < 0) continue;
          times.push_back(secs);
          packs.push_back((*sender)->last_report().pack_seconds);
          copies.push_back(static_cast<double>(tx1 - tx0) / static_cast<double>(w.bytes));
        }
        Row row{name,
                w.name,
                w.bytes,
                mb,
                k,
                Median(times),
                *std::min_element(times.begin(), times.end()),
                Median(copies),
                Median(packs),
                memcpy_s};
        rows.push_back(row);
        std::printf(
            "%-15s %-12s K=%d  median %.4f s (pack %.4f)  best %.4f s  %.2f GB/s  %5.2fx "
            "memcpy%s\n",
            name.c_str(), w.name.c_str(), k, row.median, row.pack, row.best,
            w.bytes / 1e9 / row.median,
            row.median / row.memcpy,
            o.link_iface.empty() ? "" : fmt::format("  link copies {:.2f}", row.copies).c_str());
        std::fflush(stdout);
      }
      for (auto& c : children) c->Finish(Deadline::InMs(30000));
    }
  }
  // Ratios.
  auto find = [&](const std::string& b, int mb, int k) -> const Row* {
    for (const Row& r : rows)
      if (r.backend == b && r.mb == mb && r.k == k) return &r;
    return nullptr;
  };
  nlohmann::json j;
  j["bench"] = "broadcast";
  j["mode"] = o.netns ? "netns" : "host";
  j["curve"] = o.curve;
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json x{{"backend", r.backend},
                     {"weights", r.weights},
                     {"bytes", r.bytes},
                     {"mb", r.mb},
                     {"k", r.k},
                     {"median_s", r.median},
                     {"best_s", r.best},
                     {"pack_s", r.pack},
                     {"memcpy_s", r.memcpy},
                     {"vs_memcpy", r.median / r.memcpy}};
    if (!o.link_iface.empty()) x["link_copies"] = r.copies;
    results.push_back(x);
  }
  j["results"] = results;
  std::printf("\nscaling time(K=4)/time(K=1) (target <= 1.5 across hosts at 100 MB):\n");
  for (const std::string& b : o.backends)
    for (int mb : o.sizes_mb) {
      const Row* k1 = find(b, mb, 1);
      const Row* k4 = find(b, mb, 4);
      if (!k1 || !k4) continue;
      double ratio = k4->median / k1->median;
      j["ratios"][fmt::format("{}_{}MB_K4_over_K1", b, mb)] = ratio;
      std::printf("  %-15s %4d MB: %.2f\n", b.c_str(), mb, ratio);
    }
  // LoRA: adapter-only update time over the full fine-tune's, per backend, model and K.
  if (!o.lora_models.empty()) std::printf("LoRA update vs full update:\n");
  for (const Row& r : rows) {
    const std::string suffix = "_lora";
    if (r.weights.size() <= suffix.size() ||
        r.weights.compare(r.weights.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string model = r.weights.substr(0, r.weights.size() - suffix.size());
    const Row* full = nullptr;
    for (const Row& f : rows)
      if (f.backend == r.backend && f.k == r.k && f.weights == model + "_full") full = &f;
    if (!full) continue;
    j["ratios"][fmt::format("{}_{}_K{}_lora_over_full", r.backend, model, r.k)] =
        r.median / full->median;
    std::printf("  %-15s %-8s K=%d: LoRA %.4f s / full %.4f s = %.3f (payload %zu / %zu B)\n",
                r.backend.c_str(), model.c_str(), r.k, r.median, full->median,
                r.median / full->median, r.bytes, full->bytes);
  }
  if (!o.netns) {
    std::printf("shm vs one memcpy (target <= 2 whatever K):\n");
    for (const char* b : {"shm_view", "shm_copy"})
      for (int mb : o.sizes_mb)
        for (int k : o.receivers)
          if (const Row* r = find(b, mb, k)) {
            double ratio = r->median / r->memcpy;
            j["ratios"][fmt::format("{}_{}MB_K{}_over_memcpy", b, mb, k)] = ratio;
            std::printf("  %-9s %4d MB K=%d: %.2f\n", b, mb, k, ratio);
          }
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  for (const auto& x : Split(s)) out.push_back(std::stoi(x));
  return out;
}

}  // namespace
}  // namespace troupe::broadcast

int main(int argc, char** argv) {
  using namespace troupe::broadcast;
  // Like the actor host: ZeroMQ's large frames reuse warm heap memory instead of fresh pages.
  troupe::transport::ApplyAllocatorPolicy();
  if (argc > 1 && std::string(argv[1]) == "--receiver") return RunReceiver(argc, argv);
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sizes")
      o.sizes_mb = Ints(next());
    else if (a == "--receivers")
      o.receivers = Ints(next());
    else if (a == "--repeats")
      o.repeats = std::stoi(next());
    else if (a == "--backends")
      o.backends = Split(next());
    else if (a == "--netns")
      o.netns = true;
    else if (a == "--learner-host")
      o.learner_host = next();
    else if (a == "--receiver-hosts")
      o.receiver_hosts = Split(next());
    else if (a == "--receiver-netns")
      o.receiver_netns = Split(next());
    else if (a == "--link-iface")
      o.link_iface = next();
    else if (a == "--chunk-kb")
      o.chunk_bytes = std::stoull(next()) << 10;
    else if (a == "--bucket-mb")
      o.bucket_bytes = std::stoull(next()) << 20;
    else if (a == "--warmups")
      o.warmups = std::stoi(next());
    else if (a == "--hwm")
      o.hwm = std::stoi(next());
    else if (a == "--curve")
      o.curve = true;
    else if (a == "--lora")
      o.lora_models = Split(next());
    else {
      std::fprintf(stderr, "unknown argument %s (see the file comment)\n", a.c_str());
      return 2;
    }
  }
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : argv[0];
  return RunLearner(o, self);
}
