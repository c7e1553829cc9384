// Admission to the weight broadcast with LoRA: a rollout engine that cannot apply the
// learner's adapters is refused when it registers (group formation), never at a transfer.
//
//   learner WeightSender{adapters = AdapterLayoutOf(learner model)}
//     ◀── Register{adapters = AdapterLayoutOf(engine model)} ── WeightReceiver ──▶ Engine
//   mismatch: refused (the reason names the receiver, both layouts); the group goes on
//
// Real ZeroMQ sockets (one network per actor, tcp on 127.0.0.1 port 0), real engines as
// sinks, the layouts the learner and rollout roles declare (role_common.h).
#include <gtest/gtest.h>

#include <random>

#include "role_common.h"
#include "troupe/broadcast/receiver.h"
#include "troupe/broadcast/sender.h"
#include "troupe/engine/engine.h"
#include "troupe/engine/model.h"
#include "troupe/transport/zmq_network.h"
#include "../common/eventually.h"
#include "../engine/test_util.h"

namespace troupe::actors {
namespace {

using broadcast::AdapterLayout;

uint64_t Seed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("actors_weights_admission_test seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// The engine tests' small model with the given adapters.
engine::ModelConfig Tiny(int64_t rank, double alpha = 0,
                         std::vector<std::string> targets = {"q_proj", "v_proj"}) {
  engine::ModelConfig c = engine::testing::TinyConfig();
  c.lora.rank = rank;
  c.lora.alpha = alpha;
  c.lora.target_modules = std::move(targets);
  return c;
}

std::unique_ptr<transport::Network> Net(const std::string& actor) {
  transport::ZmqNetworkOptions o;
  o.identity.actor_id = actor;
  auto n = transport::NewZmqNetwork(o);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return std::move(n).value();
}

broadcast::BroadcastConfig SenderConfig(const engine::ModelConfig& model) {
  broadcast::BroadcastConfig c;
  c.backend = broadcast::Backend::kZmq;
  c.timeout_ms = 5000;
  c.heartbeat_ms = 100;
  c.member_timeout_ms = 8000;
  c.adapters = AdapterLayoutOf(model);
  return c;
}

// A rollout actor's weight path: its network, a real engine, and the receiver feeding it.
struct Rollout {
  std::unique_ptr<transport::Network> net;  // outlives the receiver
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<broadcast::WeightReceiver> receiver;

  static std::unique_ptr<Rollout> Make(const std::string& id, const engine::ModelConfig& model,
                                       const std::string& learner) {
    auto r = std::make_unique<Rollout>();
    r->net = Net(id);
    engine::EngineConfig ec;
    ec.model = model;
    ec.num_slots = 2;
    ec.init_seed = Seed();
    auto e = engine::Engine::Create(ec);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    r->engine = std::move(e).value();
    broadcast::ReceiverConfig rc;
    rc.actor_id = id;
    rc.learner_endpoint = learner;
    rc.heartbeat_ms = 100;
    rc.learner_timeout_ms = 8000;
    rc.adapters = AdapterLayoutOf(model);
    auto* eng = r->engine.get();
    auto rec = broadcast::WeightReceiver::Create(
        rc, *r->net, [eng](const broadcast::ReceivedWeights& w) {
          return eng->UpdateWeights(w.version, w.named, Deadline::InMs(10000));
        });
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    r->receiver = std::move(rec).value();
    return r;
  }
};

// The refusal a receiver reports (bounded: WaitForVersion returns it as soon as it arrives).
std::string RefusalOf(Rollout& r) {
  Status st = r.receiver->WaitForVersion(1, Deadline::InMs(20000));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(r.receiver->refusal().message(), st.message());
  return st.message();
}

// A LoRA learner (r=16 on q_proj,v_proj): a full-weights engine and an r=8 engine are refused
// at registration, by name; the matching engine joins and applies base + adapters, then
// adapters only; the refused ones never receive a byte.
TEST(WeightsAdmissionTest, LoraLearnerRefusesFullWeightsAndRankMismatchAtRegistration) {
  const engine::ModelConfig learner_model = Tiny(16);
  auto net = Net("learner");
  auto sender = broadcast::WeightSender::Create(SenderConfig(learner_model), *net);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  broadcast::WeightSender& s = **sender;
  auto good = Rollout::Make("rollout-0", learner_model, s.endpoint());
  auto full = Rollout::Make("rollout-1", Tiny(0), s.endpoint());
  auto r8 = Rollout::Make("rollout-2", Tiny(8), s.endpoint());

  EXPECT_EQ(RefusalOf(*full),
            "refused by learner learner: rollout-1: learner trains LoRA r=16 alpha=16 on "
            "q_proj,v_proj; engine has no lora config");
  EXPECT_EQ(RefusalOf(*r8),
            "refused by learner learner: rollout-2: learner trains LoRA r=16 alpha=16 on "
            "q_proj,v_proj; engine has LoRA r=8 alpha=8 on q_proj,v_proj (rank differs)");
  ASSERT_TRUE(s.WaitForMembers(1, Deadline::InMs(20000)).ok());
  ASSERT_TRUE(testing::Eventually([&] { return s.stats().receivers_refused >= 2; }));
  EXPECT_NE(s.stats().last_refusal.find("learner trains LoRA r=16"), std::string::npos);

  // The group is the matching engine alone: base + adapters once, then adapters.
  engine::LlamaModel policy(learner_model, Seed() + 1);
  ASSERT_TRUE(s.SetBase(policy.NamedWeights()).ok());
  for (uint64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE(s.Broadcast(v, policy.AdapterWeights(), Deadline::InMs(30000)).ok()) << v;
    EXPECT_EQ(s.last_report().members, std::vector<std::string>{"rollout-0"});
  }
  EXPECT_EQ(good->engine->version(), 2u);
  EXPECT_TRUE(good->receiver->refusal().ok());
  for (Rollout* r : {full.get(), r8.get()}) {
    EXPECT_EQ(r->receiver->stats().delivered, 0u);
    EXPECT_EQ(r->receiver->stats().bytes_received, 0u);
    EXPECT_EQ(r->receiver->stats().refusals, 1u) << "refused once, not re-registering in a loop";
    EXPECT_EQ(r->engine->version(), 0u);
  }
  for (const auto& m : s.Members()) EXPECT_EQ(m.id, "rollout-0");
}

// A full-weights learner refuses a LoRA engine (it would refuse every update without
// adapters) and admits a full-weights one.
TEST(WeightsAdmissionTest, FullWeightsLearnerRefusesLoraEngine) {
  const engine::ModelConfig learner_model = Tiny(0);
  auto net = Net("learner");
  auto sender = broadcast::WeightSender::Create(SenderConfig(learner_model), *net);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  broadcast::WeightSender& s = **sender;
  auto lora = Rollout::Make("rollout-0", Tiny(8, 16, {"q_proj", "k_proj"}), s.endpoint());
  auto plain = Rollout::Make("rollout-1", learner_model, s.endpoint());
  EXPECT_EQ(RefusalOf(*lora),
            "refused by learner learner: rollout-0: learner trains full weights (no lora config); "
            "engine has LoRA r=8 alpha=16 on q_proj,k_proj (it refuses every update without "
            "adapters)");
  ASSERT_TRUE(s.WaitForMembers(1, Deadline::InMs(20000)).ok());
  engine::LlamaModel policy(learner_model, Seed() + 2);
  ASSERT_TRUE(s.Broadcast(1, policy.NamedWeights(), Deadline::InMs(30000)).ok());
  EXPECT_EQ(s.last_report().members, std::vector<std::string>{"rollout-1"});
  EXPECT_EQ(plain->engine->version(), 1u);
  EXPECT_EQ(lora->engine->version(), 0u);
}

// The comparison itself: alpha, targets and shapes (another base model) are mismatches; an
// undeclared side is not checked here.
TEST(AdapterLayoutTest, NamesEveryKindOfMismatch) {
  const AdapterLayout learner = AdapterLayoutOf(Tiny(8, 16));
  auto check = [&](const engine::ModelConfig& m) {
    return broadcast::CheckAdapterLayouts(learner, AdapterLayoutOf(m), "rollout-3");
  };
  EXPECT_TRUE(check(Tiny(8, 16)).ok());
  EXPECT_NE(check(Tiny(8, 8)).message().find("(alpha differs)"), std::string::npos);
  EXPECT_NE(check(Tiny(8, 16, {"q_proj"})).message().find("(target modules differ)"),
            std::string::npos);
  engine::ModelConfig wider = Tiny(8, 16);
  wider.d_model = 64;
  EXPECT_EQ(check(wider).message(),
            "rollout-3: learner trains LoRA r=8 alpha=16 on q_proj,v_proj; engine has LoRA r=8 "
            "alpha=16 on q_proj,v_proj (tensor "
            "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': learner [8, 32], "
            "engine [8, 64])");
  engine::ModelConfig deeper = Tiny(8, 16);
  deeper.n_layers = 3;
  EXPECT_NE(check(deeper).message().find("the learner sends no tensor"), std::string::npos);
  AdapterLayout silent;  // not declared: admitted here, checked by the first transfer
  EXPECT_TRUE(broadcast::CheckAdapterLayouts(learner, silent, "rollout-3").ok());
  EXPECT_TRUE(broadcast::CheckAdapterLayouts(silent, learner, "rollout-3").ok());
  // The declared shapes are the model's own tensors.
  engine::LlamaModel model(Tiny(8, 16), Seed());
  auto named = model.AdapterWeights();
  ASSERT_EQ(named.size(), learner.tensors.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].first, learner.tensors[i].name);
    EXPECT_EQ(named[i].second.sizes().vec(), learner.tensors[i].shape);
  }
}

}  // namespace
}  // namespace troupe::actors
