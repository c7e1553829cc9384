// Checkpoints: bit-exact resume, crash safety (a child process SIGKILLed in
// every stage of a save leaves the previous checkpoint loadable), pruning and
// clear errors for damaged checkpoints. The test binary re-executes itself as
// the crashing child (--crash-child <root> <stage> <fd>).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "../common/temp_dir.h"
#include "test_util.h"
#include "troupe/core/check.h"
#include "troupe/trainer/learner.h"

namespace fs = std::filesystem;

namespace troupe::trainer {
namespace {

using ::testing::HasSubstr;
using testing::OnPolicyBatch;
using testing::SmallModel;

using test_support::TempDir;

LearnerConfig ResumeConfig() {
  LearnerConfig c;
  c.lr = 3e-3;
  c.warmup_steps = 2;
  c.total_steps = 8;  // the resumed part runs in the cosine phase
  c.max_policy_lag = 100;
  c.kl_coef = 0.05;
  c.entropy_coef = 0.01;
  c.weight_decay = 0.01;
  c.keep_checkpoints = 2;
  return c;
}

std::unique_ptr<Learner> Make(const LearnerConfig& c, uint64_t seed) {
  auto l = Learner::Create(c, SmallModel(seed), c.kl_coef > 0 ? SmallModel(seed + 1) : nullptr);
  TROUPE_CHECK_MSG(l.ok(), "{}", l.status().ToString());
  return std::move(l).value();
}

Demonstrations Demos() {
  Demonstrations d;
  for (int a = 4; a < 8; ++a) d.Add({1, a, 3}, {a + 1, a + 2, 2});
  return d;
}

// Batches with fixed behaviour log-probs from a separate model, all tagged version 0.
std::vector<TrainBatch> FixedBatches(int n) {
  auto gen_model = SmallModel(5);
  std::mt19937 rng(11);
  std::vector<TrainBatch> out;
  for (int i = 0; i < n; ++i) {
    std::vector<testing::SeqSpec> seqs;
    for (int g = 0; g < 3; ++g) {
      std::vector<int32_t> prompt = {1, 4 + static_cast<int32_t>(rng() % 8), 3};
      for (int k = 0; k < 4; ++k) {
        std::vector<int32_t> resp;
        for (int t = 0, len = 1 + static_cast<int>(rng() % 5); t < len; ++t) {
          resp.push_back(static_cast<int32_t>(4 + rng() % 12));
        }
        seqs.push_back({prompt, resp, static_cast<float>(rng() % 3)});
      }
    }
    out.push_back(OnPolicyBatch(*gen_model, "b" + std::to_string(i), 0, 4, seqs));
  }
  return out;
}

StepMetrics TrainOn(Learner& l, const TrainBatch& b) {
  auto a = l.Offer(b);
  TROUPE_CHECK_MSG(a.ok(), "{}", a.status().ToString());
  auto m = l.Step();
  TROUPE_CHECK_MSG(m.ok(), "{}", m.status().ToString());
  return *m;
}

TEST(Checkpoint, ResumeGivesBitExactLosses) {
  TempDir dir;
  const auto batches = FixedBatches(6);
  // Run A never stops; it checkpoints after 3 RL updates.
  auto a = Make(ResumeConfig(), 1);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a->SupervisedStep(Demos()).ok());
  for (int i = 0; i < 3; ++i) TrainOn(*a, batches[i]);
  auto saved = a->SaveCheckpoint(dir.path());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  std::vector<StepMetrics> ma;
  for (int i = 3; i < 6; ++i) ma.push_back(TrainOn(*a, batches[i]));

  // Run B starts from different random weights and resumes from the checkpoint.
  auto b = Make(ResumeConfig(), 77);
  ASSERT_TRUE(b->LoadCheckpoint(dir.path()).ok());
  EXPECT_EQ(b->version(), 5u);
  EXPECT_EQ(b->step(), 5u);
  for (int i = 3; i < 6; ++i) {
    StepMetrics mb = TrainOn(*b, batches[i]);
    const StepMetrics& ref = ma[static_cast<size_t>(i - 3)];
    EXPECT_EQ(mb.loss, ref.loss) << "update " << i;
    EXPECT_EQ(mb.pg_loss, ref.pg_loss);
    EXPECT_EQ(mb.kl, ref.kl);
    EXPECT_EQ(mb.entropy, ref.entropy);
    EXPECT_EQ(mb.grad_norm, ref.grad_norm);
    EXPECT_EQ(mb.lr, ref.lr);
    EXPECT_EQ(mb.version, ref.version);
  }
  auto wa = a->NamedWeights(), wb = b->NamedWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  }
  LearnerCounters ca = a->counters(), cb = b->counters();
  EXPECT_EQ(ca.trained_batches, cb.trained_batches);
  EXPECT_EQ(ca.updates, cb.updates);
  EXPECT_EQ(ca.supervised_updates, cb.supervised_updates);
  EXPECT_EQ(ca.trained_tokens, cb.trained_tokens);
}

// LoRA: the KL reference shares the policy's frozen base tensors instead of cloning them
// (one copy of the base in the learner), and that changes no result: a learner whose reference
// holds its own copy of the same values trains to bit-identical losses and KL; when the base
// trains again, the reference keeps the base it was snapshotted with.
TEST(Checkpoint, LoraReferenceSharesTheFrozenBaseWithoutChangingResults) {
  const auto batches = FixedBatches(3);
  engine::ModelConfig m = testing::SmallModelConfig();
  m.lora.rank = 4;
  m.lora.alpha = 8;
  m.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  struct Run {
    std::shared_ptr<engine::LlamaModel> reference;
    std::unique_ptr<Learner> learner;
  };
  auto make = [&]() {
    Run r;
    r.reference = std::make_shared<engine::LlamaModel>(m, 2);
    auto l = Learner::Create(ResumeConfig(), std::make_shared<engine::LlamaModel>(m, 1),
                             r.reference);
    TROUPE_CHECK_MSG(l.ok(), "{}", l.status().ToString());
    r.learner = std::move(l).value();
    return r;
  };
  auto shares = [](const Run& r) {
    auto pol = r.learner->policy().NamedWeights(), ref = r.reference->NamedWeights();
    size_t n = 0;
    for (size_t i = 0; i < pol.size(); ++i)
      n += pol[i].second.data_ptr() == ref[i].second.data_ptr() ? 1 : 0;
    return n;
  };
  Run shared = make(), own = make();
  const size_t base_tensors = shared.learner->policy().NamedWeights().size();
  EXPECT_EQ(shares(shared), base_tensors) << "every base tensor is shared, not copied";
  // Training the base (and freezing it again) gives the reference its own copy.
  ASSERT_TRUE(own.learner->SetBaseTrainable(true).ok());
  ASSERT_TRUE(own.learner->SetBaseTrainable(false).ok());
  EXPECT_EQ(shares(own), 0u);
  double last_kl = 0;
  for (const auto& b : batches) {
    StepMetrics a = TrainOn(*shared.learner, b), c = TrainOn(*own.learner, b);
    EXPECT_EQ(a.loss, c.loss);
    EXPECT_EQ(a.kl, c.kl);
    last_kl = a.kl;
  }
  EXPECT_GT(last_kl, 0) << "the adapters moved away from the reference's";
  // The adapters are the reference's own: the policy's trained, the reference's did not.
  auto pa = shared.learner->policy().AdapterWeights(), ra = shared.reference->AdapterWeights();
  EXPECT_FALSE(at::equal(pa[0].second, ra[0].second));
  // A base that trains again never moves the reference's base.
  engine::NamedTensors ref_base;
  for (auto& [n, t] : shared.reference->NamedWeights()) ref_base.emplace_back(n, t.clone());
  ASSERT_TRUE(shared.learner->SetBaseTrainable(true).ok());
  EXPECT_EQ(shares(shared), 0u);
  ASSERT_TRUE(shared.learner->SupervisedStep(Demos()).ok());
  auto after = shared.reference->NamedWeights();
  for (size_t i = 0; i < ref_base.size(); ++i)
    EXPECT_TRUE(at::equal(ref_base[i].second, after[i].second)) << ref_base[i].first;
  EXPECT_FALSE(at::equal(ref_base[1].second, shared.learner->policy().NamedWeights()[1].second))
      << "the policy's base trained";
  // A snapshot after freezing shares the (new) base again.
  ASSERT_TRUE(shared.learner->SetBaseTrainable(false).ok());
  shared.learner->SnapshotReference();
  EXPECT_EQ(shares(shared), base_tensors);
}

// LoRA: only adapters train (and AdamW holds only their state); a checkpoint holds the PEFT
// adapter and hard-links the frozen base of the previous one; resuming is bit-exact.
TEST(Checkpoint, LoraTrainsAdaptersOnlyAndResumesBitExactly) {
  TempDir dir;
  const auto batches = FixedBatches(5);
  auto lora_model = [](uint64_t seed) {
    engine::ModelConfig m = testing::SmallModelConfig();
    m.lora.rank = 4;
    m.lora.alpha = 8;
    m.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
    return std::make_shared<engine::LlamaModel>(m, seed);
  };
  auto make = [&](uint64_t seed) {
    auto l = Learner::Create(ResumeConfig(), lora_model(seed), lora_model(seed + 1));
    TROUPE_CHECK_MSG(l.ok(), "{}", l.status().ToString());
    return std::move(l).value();
  };
  auto a = make(1);
  EXPECT_FALSE(a->base_trainable());
  // The full warm start trains the base too, then it is frozen again.
  ASSERT_TRUE(a->SetBaseTrainable(true).ok());
  ASSERT_TRUE(a->SupervisedStep(Demos()).ok());
  ASSERT_TRUE(a->SetBaseTrainable(false).ok());
  a->SnapshotReference();
  engine::NamedTensors base_before;
  for (auto& [n, t] : a->NamedWeights()) base_before.emplace_back(n, t.clone());
  for (int i = 0; i < 2; ++i) TrainOn(*a, batches[i]);
  for (size_t i = 0; i < base_before.size(); ++i)
    EXPECT_TRUE(at::equal(base_before[i].second, a->NamedWeights()[i].second))
        << base_before[i].first << " changed while frozen";
  auto first = a->SaveCheckpoint(dir.path());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  TrainOn(*a, batches[2]);
  auto saved = a->SaveCheckpoint(dir.path());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_TRUE(fs::exists(fs::path(*saved) / "adapter" / "adapter_config.json"));
  EXPECT_TRUE(fs::equivalent(fs::path(*first) / "model.safetensors",
                             fs::path(*saved) / "model.safetensors"))
      << "the frozen base is written once";
  EXPECT_EQ(a->BroadcastWeights().size(), a->policy().AdapterWeights().size());
  std::vector<StepMetrics> ma;
  for (int i = 3; i < 5; ++i) ma.push_back(TrainOn(*a, batches[i]));
  auto b = make(77);
  Status st = b->LoadCheckpoint(*saved);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int i = 3; i < 5; ++i) {
    StepMetrics mb = TrainOn(*b, batches[i]);
    EXPECT_EQ(mb.loss, ma[static_cast<size_t>(i - 3)].loss) << "update " << i;
    EXPECT_EQ(mb.kl, ma[static_cast<size_t>(i - 3)].kl) << "update " << i;
  }
  auto wa = a->StateWeights(), wb = b->StateWeights();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  // A learner whose adapters have another rank refuses the checkpoint (nothing changes).
  engine::ModelConfig r8 = testing::SmallModelConfig();
  r8.lora.rank = 8;
  r8.lora.alpha = 8;
  r8.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  auto other = Learner::Create(ResumeConfig(), std::make_shared<engine::LlamaModel>(r8, 3),
                               std::make_shared<engine::LlamaModel>(r8, 4));
  ASSERT_TRUE(other.ok());
  st = (*other)->LoadCheckpoint(*saved);
  EXPECT_FALSE(st.ok()) << "a rank-4 checkpoint loaded into a rank-8 learner";
}

TEST(Checkpoint, KeepsNewestAndLatestPointsAtIt) {
  TempDir dir;
  auto l = Make(ResumeConfig(), 1);
  std::string last;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(l->SupervisedStep(Demos()).ok());
    auto p = l->SaveCheckpoint(dir.path());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    last = *p;
  }
  int dirs = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) dirs += e.is_directory();
  EXPECT_EQ(dirs, 2);  // keep_checkpoints
  EXPECT_EQ(ResolveCheckpoint(dir.path()).value(), last);
  EXPECT_TRUE(fs::exists(fs::path(last) / "model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(last) / "reference.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(last) / "optimizer.pt"));
  // Saving twice at one step gives two distinct checkpoints.
  auto again = l->SaveCheckpoint(dir.path());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, last);
  EXPECT_EQ(ResolveCheckpoint(dir.path()).value(), *again);
  // The weights file (warm_start.init_from, standalone_rollout --weights)
  // from the file itself, the checkpoint, the checkpoints root or the run
  // folder above it; anything else is NotFound naming the path.
  const std::string file = (fs::path(*again) / "model.safetensors").string();
  EXPECT_EQ(ResolveWeightsFile(file).value(), file);
  EXPECT_EQ(ResolveWeightsFile(*again).value(), file);
  EXPECT_EQ(ResolveWeightsFile(dir.path()).value(), file);
  TempDir run;
  fs::create_directory_symlink(dir.path(), fs::path(run.path()) / "checkpoints");
  EXPECT_EQ(fs::canonical(ResolveWeightsFile(run.path()).value()), fs::canonical(file));
  auto missing = ResolveWeightsFile(run.path() + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  TempDir empty;
  EXPECT_EQ(ResolveWeightsFile(empty.path()).status().code(), Code::kNotFound);
}

TEST(Checkpoint, DamagedOrMismatchedCheckpointsAreClearErrors) {
  TempDir dir;
  auto src = Make(ResumeConfig(), 1);
  ASSERT_TRUE(src->SupervisedStep(Demos()).ok());
  auto path = src->SaveCheckpoint(dir.path());
  ASSERT_TRUE(path.ok());

  auto l = Make(ResumeConfig(), 2);
  const auto before = l->NamedWeights()[0].second.clone();
  EXPECT_EQ(l->LoadCheckpoint(dir.path() + "/nope").code(), Code::kNotFound);

  // Truncated weights.
  TempDir broken;
  fs::copy(*path, broken.path(), fs::copy_options::recursive);
  fs::resize_file(fs::path(broken.path()) / "model.safetensors", 100);
  Status st = l->LoadCheckpoint(broken.path());
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("model.safetensors"));
  // Junk state.
  std::ofstream(fs::path(broken.path()) / "state.json") << "{not json";
  st = l->LoadCheckpoint(broken.path());
  EXPECT_EQ(st.code(), Code::kMalformed);
  EXPECT_THAT(st.message(), HasSubstr("state.json"));
  // Corrupt optimizer archive.
  TempDir broken2;
  fs::copy(*path, broken2.path(), fs::copy_options::recursive);
  std::ofstream(fs::path(broken2.path()) / "optimizer.pt", std::ios::trunc) << "garbage";
  st = l->LoadCheckpoint(broken2.path());
  EXPECT_EQ(st.code(), Code::kMalformed);
  EXPECT_THAT(st.message(), HasSubstr("optimizer.pt"));
  // A checkpoint of a differently shaped model.
  engine::ModelConfig other = testing::SmallModelConfig();
  other.d_model = 48;
  other.ffn_dim = 96;
  LearnerConfig c = ResumeConfig();
  auto big = Learner::Create(c, std::make_shared<engine::LlamaModel>(other, 1),
                             std::make_shared<engine::LlamaModel>(other, 2));
  ASSERT_TRUE(big.ok());
  TempDir other_dir;
  ASSERT_TRUE((*big)->SaveCheckpoint(other_dir.path()).ok());
  st = l->LoadCheckpoint(other_dir.path());
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("shape"));
  // Nothing of the failed loads stuck.
  EXPECT_TRUE(at::equal(before, l->NamedWeights()[0].second));
  EXPECT_EQ(l->version(), 0u);
  // A busy learner refuses to load.
  ASSERT_TRUE(l->Offer(FixedBatches(1)[0]).ok());
  EXPECT_THAT(l->LoadCheckpoint(dir.path()).message(), HasSubstr("idle"));
}

// Rewrites state.json of checkpoint `dir`: `edit` changes its JSON.
void EditState(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path p = fs::path(dir) / "state.json";
  std::ifstream in(p);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  edit(j);
  std::ofstream(p, std::ios::trunc) << j.dump(2);
}

// optimizer.pt is torch's own archive (1.13 keys the state by hex addresses, 2.2+ parses
// decimal ones): a checkpoint written by another torch major.minor is refused, naming both.
TEST(Checkpoint, CheckpointOfAnotherTorchVersionIsRefused) {
  TempDir dir;
  auto src = Make(ResumeConfig(), 1);
  ASSERT_TRUE(src->SupervisedStep(Demos()).ok());
  auto path = src->SaveCheckpoint(dir.path());
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::string stamped;
  EditState(*path, [&](nlohmann::json& j) { stamped = j.at("torch_version"); });
  EXPECT_EQ(stamped, TORCH_VERSION);

  const std::string other = fmt::format("{}.{}.0", TORCH_VERSION_MAJOR + 1, TORCH_VERSION_MINOR);
  auto l = Make(ResumeConfig(), 2);
  const auto before = l->NamedWeights()[0].second.clone();
  EditState(*path, [&](nlohmann::json& j) { j["torch_version"] = other; });
  Status st = l->LoadCheckpoint(*path);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("written by torch " + other));
  EXPECT_THAT(st.message(), HasSubstr(std::string("this build uses torch ") + TORCH_VERSION));
  EXPECT_THAT(st.message(), HasSubstr("state.json"));
  EXPECT_TRUE(at::equal(before, l->NamedWeights()[0].second));  // nothing changed
  EXPECT_EQ(l->version(), 0u);

  // Another minor of the same major is another format too (2.1 -> 2.2 changed the keys).
  const std::string minor = fmt::format("{}.{}.0", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR + 1);
  EditState(*path, [&](nlohmann::json& j) { j["torch_version"] = minor; });
  EXPECT_THAT(l->LoadCheckpoint(*path).message(), HasSubstr("written by torch " + minor));

  // A junk stamp is a malformed file, not a version.
  EditState(*path, [&](nlohmann::json& j) { j["torch_version"] = 113; });
  st = l->LoadCheckpoint(*path);
  EXPECT_EQ(st.code(), Code::kMalformed) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("torch_version"));

  // A patch release reads its minor's archives (local suffixes such as +cu124 are ignored).
  const std::string patch = fmt::format("{}.{}.99+cu999", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR);
  EditState(*path, [&](nlohmann::json& j) { j["torch_version"] = patch; });
  st = l->LoadCheckpoint(*path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(l->version(), src->version());

  // Checkpoints from before the stamp were all written by Debian's 1.13.
  EditState(*path, [&](nlohmann::json& j) { j.erase("torch_version"); });
  auto fresh = Make(ResumeConfig(), 3);
  st = fresh->LoadCheckpoint(*path);
  if (TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13) {
    EXPECT_TRUE(st.ok()) << st.ToString();
  } else {
    EXPECT_THAT(st.message(), HasSubstr("written by torch 1.13"));
  }
}

// ---------------------------------------------------------------- crash safety

// The child: one complete checkpoint (version 1), then a second save (version
// 2) that stops at `stage`, reports on `fd` and waits to be killed.
int CrashChild(const std::string& root, const std::string& stage, int fd) {
  at::set_num_threads(1);
  auto l = Make(ResumeConfig(), 1);
  if (!l->SupervisedStep(Demos()).ok() || !l->SaveCheckpoint(root, {}, {{"sidecar", "1"}}).ok())
    return 2;
  if (!l->SupervisedStep(Demos()).ok()) return 2;
  CheckpointHooks hooks;
  hooks.on_stage = [&](std::string_view s) {
    if (s != stage) return;
    if (::write(fd, "K", 1) != 1) std::_Exit(4);
    for (;;) ::pause();  // the parent SIGKILLs us here
  };
  auto r = l->SaveCheckpoint(root, hooks, {{"sidecar", "2"}});
  return r.ok() ? 3 : 5;  // reaching here means the stage never came
}

// Kills the child at exit if the test bails out early.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

class CrashDuringSave : public ::testing::TestWithParam<const char*> {};

TEST_P(CrashDuringSave, PreviousCheckpointStaysLoadable) {
  const std::string stage = GetParam();
  TempDir dir;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ChildGuard child;
  child.pid = ::fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) {
    ::close(fds[0]);
    const std::string fd = std::to_string(fds[1]);
    ::execl("/proc/self/exe", "trainer_checkpoint_test", "--crash-child", dir.path().c_str(),
            stage.c_str(), fd.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 90000), 1) << "child did not reach stage " << stage;
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1) << "child exited before stage " << stage;
  ::close(fds[0]);
  ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  ASSERT_TRUE(WIFSIGNALED(status));

  // `latest` names a complete checkpoint: the first one, or the second once
  // the pointer moved.
  at::set_num_threads(1);
  auto l = Make(ResumeConfig(), 9);
  Status st = l->LoadCheckpoint(dir.path());
  ASSERT_TRUE(st.ok()) << stage << ": " << st.ToString();
  const uint64_t expected_version = stage == std::string("latest") ? 2 : 1;
  EXPECT_EQ(l->version(), expected_version) << stage;
  // Extra files travel with their checkpoint: never a newer one's with an older model.
  auto resolved = ResolveCheckpoint(dir.path());
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  auto sidecar = ReadFile(*resolved + "/sidecar");
  ASSERT_TRUE(sidecar.ok()) << sidecar.status().ToString();
  EXPECT_EQ(*sidecar, std::to_string(expected_version)) << stage;
  // Same weights as a process that made the same updates.
  auto twin = Make(ResumeConfig(), 1);
  for (uint64_t i = 0; i < expected_version; ++i) ASSERT_TRUE(twin->SupervisedStep(Demos()).ok());
  auto wl = l->NamedWeights(), wt = twin->NamedWeights();
  for (size_t i = 0; i < wl.size(); ++i) {
    EXPECT_TRUE(at::equal(wl[i].second, wt[i].second)) << stage << " " << wl[i].first;
  }
  // The next save clears the debris of the killed one.
  ASSERT_TRUE(l->SaveCheckpoint(dir.path()).ok());
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, CrashDuringSave,
                         ::testing::Values("model", "reference", "optimizer", "rng", "state",
                                           "extra", "synced", "renamed", "latest"));

}  // namespace
}  // namespace troupe::trainer

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--crash-child") {
    return troupe::trainer::CrashChild(argv[2], argv[3], std::atoi(argv[4]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
