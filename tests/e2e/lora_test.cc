// LoRA end to end (configs/tiny_reverse_lora.yaml): the full warm start, then RL on rank-16
// adapters with a frozen base, through real actor processes.
//
//   learner ══ base + adapters (once) ══▶ rollout-0, rollout-1
//           ══ adapters only (every update) ══▶ ...
//           ══ catch-up: base + adapters ══▶ rollout-2 (scaled up mid-run)
//
// Checks: RL on the adapters reaches 0.93 from the full warm start's ~0.88; every broadcast
// after the first carries only the adapters
// (≤ 1.1 × their bytes); the late joiner is caught up with the base and the adapters in one
// transfer and its batches train; checkpoints hold the PEFT adapter, optimizer state only
// for adapters, and one shared (hard-linked) base; `troupe export --adapter/--merged`
// write folders the reference math agrees with (merged vs base + adapter within 1e-5).
#include <algorithm>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "e2e_util.h"
#include "troupe/engine/hf_folder.h"
#include "troupe/engine/peft.h"
#include "troupe/engine/safetensors.h"
#include "troupe/launcher/control_client.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int RunTroupe(const std::vector<std::string>& args, std::string* out) {
  SpawnOptions o;
  o.argv = {e2e::BuildDir() + "/launcher/troupe"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  const std::string file = (fs::temp_directory_path() / ("lora-e2e-" + std::to_string(::getpid()) + ".out")).string();
  o.output_file = file;
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) return -1;
  auto e = p->Wait(Deadline::InMs(120000));
  auto text = ReadFile(file);
  if (text.ok()) *out = *text;
  fs::remove(file);
  return e.ok() && e->exited ? e->code : -1;
}

TEST(LoraEndToEnd, AdaptersTrainTravelAloneAndExport) {
  e2e::Job job("tiny_reverse_lora.yaml",
               // A fixed 150 updates (no early stop): the late joiner must have time to join.
               e2e::Short(150, {"eval.every_steps=10"}),
               e2e::TestDir("lora"));
  // Scale up once RL runs: the third rollout actor joins late.
  ASSERT_TRUE(job.WaitStatus(
      [](const ControlResult& st) {
        return st.progress.count("step") && st.progress.at("step") >= 10;
      },
      300000))
      << job.Output();
  auto run = job.run();
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(SendControl(*run, "scale", Deadline::InMs(5000), "rollout", 3).ok());
  auto e = job.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();

  // It learns.
  auto warm = job.Metrics("warm_start");
  ASSERT_EQ(warm.size(), 1u);
  double best = 0;
  for (auto& ev : job.Metrics("eval")) best = std::max(best, ev.value("eval_accuracy", 0.0));
  const double warm_accuracy = warm[0].value("eval_accuracy", 0.0);
  EXPECT_GE(best, 0.93) << "LoRA RL did not reach 0.93 in 150 updates; warm start " << warm_accuracy;
  EXPECT_GT(best, warm_accuracy + 0.03) << "RL on the adapters must improve on the warm start";
  e2e::ExpectAccountingHolds(job);

  // Every broadcast after the first carries only the adapters.
  engine::ModelConfig m;
  m.vocab_size = 28;
  m.d_model = 128;
  m.n_heads = m.n_kv_heads = 4;
  m.ffn_dim = 352;
  m.lora.rank = 16;
  m.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"};
  const double adapter_bytes = 4.0 * static_cast<double>(m.NumAdapterParameters());
  const double rl_start = warm[0].value("policy_version", 1e9);  // its broadcast carries the base
  int adapter_only = 0;
  for (auto& t : job.Metrics("train")) {
    const double v = t.value("broadcast_version", 0.0), bytes = t.value("broadcast_bytes", 0.0);
    if (v <= rl_start || bytes == 0) continue;
    ++adapter_only;
    EXPECT_LE(bytes, 1.1 * adapter_bytes) << t.dump();
    EXPECT_GE(bytes, adapter_bytes) << t.dump();
  }
  EXPECT_GT(adapter_only, 100);

  // The late joiner got the base and the adapters in one catch-up, and trained.
  std::ifstream log(run->log_file("learner-0"));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  std::smatch match;
  ASSERT_TRUE(std::regex_search(text, match, std::regex("caught rollout-2 up to version \\d+ \\(([0-9.]+) MB")))
      << "no catch-up of rollout-2 in the learner's log";
  EXPECT_GT(std::stod(match[1]) * 1e6, 4.0 * static_cast<double>(m.NumParameters()) * 0.9)
      << "the catch-up must carry the base";
  bool joiner_delivered = false;
  for (auto& f : job.Finals("rollout-2"))
    joiner_delivered |= f.value("resolved", 0.0) > f.value("rejected_by_reward", 0.0);
  EXPECT_TRUE(joiner_delivered) << "the late joiner's batches were never accepted\n"
                                << job.Output();

  // Checkpoints: the PEFT adapter, and one base shared by hard links.
  std::vector<fs::path> ckpts;
  for (auto& d : fs::directory_iterator(run->checkpoints()))
    if (d.path().filename().string().rfind("ckpt-", 0) == 0) ckpts.push_back(d.path());
  std::sort(ckpts.begin(), ckpts.end());
  ASSERT_GE(ckpts.size(), 2u);
  const fs::path last = ckpts.back(), prev = ckpts[ckpts.size() - 2];
  ASSERT_TRUE(fs::exists(last / "adapter" / "adapter_config.json"));
  struct stat a {}, b {};
  ASSERT_EQ(::stat((last / "model.safetensors").c_str(), &a), 0);
  ASSERT_EQ(::stat((prev / "model.safetensors").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino) << "the frozen base is written once and hard-linked";
  EXPECT_LT(fs::file_size(last / "optimizer.pt"), 3 * adapter_bytes + 200000)
      << "AdamW holds two moments of the adapters only";

  // Export: the adapter alone, and merged; merged == base + adapter.
  std::string out;
  const std::string adapter_dir = (fs::path(job.runs()) / "export-adapter").string();
  const std::string merged_dir = (fs::path(job.runs()) / "export-merged").string();
  ASSERT_EQ(RunTroupe({"--runs-dir", job.runs(), "export", "--to", adapter_dir + "-x"}, &out), 2)
      << out;
  EXPECT_NE(out.find("--adapter"), std::string::npos) << out;
  ASSERT_EQ(RunTroupe({"--runs-dir", job.runs(), "export", "--adapter", "--to", adapter_dir}, &out), 0)
      << out;
  ASSERT_EQ(RunTroupe({"--runs-dir", job.runs(), "export", "--merged", "--to", merged_dir}, &out), 0)
      << out;
  auto folder = engine::ReadHfModelFolder(merged_dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  engine::ModelConfig plain = folder->config;
  auto merged = engine::LoadModel(merged_dir, plain);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  engine::ModelConfig with = plain;
  with.lora = m.lora;
  with.lora.alpha = 32;
  auto lora = engine::LoadModel((last / "model.safetensors").string(), with);
  ASSERT_TRUE(lora.ok()) << lora.status().ToString();
  ASSERT_TRUE(engine::LoadAdapter(adapter_dir, **lora).ok());
  c10::InferenceMode guard;
  at::Tensor ids = at::arange(1, 20).view({1, 19}) % plain.vocab_size;
  at::Tensor base_logits = (*lora)->Forward(ids);
  // W + s*B*A rounded to float32 vs W x + s*B(A x): the difference is rounding, which grows
  // with the logits' size, so the bound is 1e-5 relative to the largest logit (at least 1e-5).
  const float scale = std::max(1.0f, base_logits.abs().max().item<float>());
  EXPECT_LE((base_logits - (*merged)->Forward(ids)).abs().max().item<float>(), 1e-5 * scale)
      << "largest logit " << scale;
  auto base_only = engine::LoadModel((last / "model.safetensors").string(), plain);
  ASSERT_TRUE(base_only.ok());
  EXPECT_GT((base_logits - (*base_only)->Forward(ids)).abs().max().item<float>(), 1e-4)
      << "the trained adapter must matter";
}

}  // namespace
}  // namespace troupe::launcher
