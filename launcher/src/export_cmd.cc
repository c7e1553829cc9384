#include "export_cmd.h"

#include <cctype>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "troupe/core/log.h"
#include "troupe/engine/hf_folder.h"
#include "troupe/launcher/job_config.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/trainer/checkpoint.h"

namespace troupe::launcher {
namespace fs = std::filesystem;

Result<uint64_t> ParseByteSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 15)
    return InvalidArgument("size '{}' must be a number of bytes, optionally with KB/MB/GB or "
                           "KiB/MiB/GiB", text);
  const uint64_t n = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  uint64_t mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  if (unit == "KB") mult = 1000ull;
  if (unit == "MB") mult = 1000ull * 1000;
  if (unit == "GB") mult = 1000ull * 1000 * 1000;
  if (unit == "KIB") mult = 1ull << 10;
  if (unit == "MIB") mult = 1ull << 20;
  if (unit == "GIB") mult = 1ull << 30;
  if (mult == 0) return InvalidArgument("size '{}': unknown unit '{}'", text, text.substr(i));
  if (n == 0) return InvalidArgument("size '{}' must be > 0", text);
  return n * mult;
}

CLI::App* AddExportCommand(CLI::App& app, ExportArgs* a) {
  auto* cmd = app.add_subcommand(
      "export",
      "write a run's checkpoint as a Hugging Face model folder (config, safetensors shards + "
      "index, generation config, tokenizer files)");
  cmd->add_option("run", a->run, "[RUN] (default: the latest run)");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint step (default: the latest)");
  cmd->add_option("--to", a->to, "folder to write (must not exist or be empty)")->required();
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "largest shard, e.g. 5GB (the default, as Hugging Face), 500MB, 64MiB")
      ->capture_default_str();
  auto* adapter = cmd->add_flag("--adapter", a->adapter,
                                "LoRA checkpoints: write the PEFT adapter alone (adapter_config.json "
                                "+ adapter_model.safetensors)");
  cmd->add_flag("--merged", a->merged,
                "LoRA checkpoints: write the base with the adapter folded in (W + alpha/r * B A)")
      ->excludes(adapter);
  return cmd;
}

namespace {

// The checkpoint directory of step `step` (ckpt-<step>, or its newest -k sibling).
Result<std::string> CheckpointOfStep(const std::string& root, int64_t step) {
  const std::string base = fmt::format("ckpt-{:012d}", step);
  std::string best;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name != base && name.rfind(base + "-", 0) != 0) continue;
    if (!fs::exists(e.path() / "state.json", ec)) continue;
    if (best.empty() || name > best) best = name;
  }
  if (best.empty()) {
    std::vector<std::string> have;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path().filename().string().rfind("ckpt-", 0) == 0)
        have.push_back(e.path().filename().string());
    std::sort(have.begin(), have.end());
    return NotFound("{} has no checkpoint of step {} (it has: {})", root, step,
                    have.empty() ? "none" : fmt::format("{}", fmt::join(have, ", ")));
  }
  return (fs::path(root) / best).string();
}

}  // namespace

// `--adapter`: the checkpoint's PEFT folder, copied into `to` (which must not exist or be
// empty) through a sibling temporary folder renamed into place.
template <typename Fail>
int ExportAdapter(const fs::path& adapter, const std::string& to, const Fail& fail) {
  std::error_code ec;
  if (fs::exists(to, ec) && !fs::is_empty(to, ec)) return fail(to + " exists and is not empty", 2);
  auto text = ReadFile((adapter / "adapter_config.json").string());
  if (!text.ok()) return fail(text.status().message(), 1);
  auto config = engine::ParseAdapterConfig(*text, (adapter / "adapter_config.json").string());
  if (!config.ok()) return fail(config.status().message(), 2);
  const fs::path tmp = fs::path(fs::absolute(to, ec).lexically_normal().string() + ".tmp");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  for (const char* name : {"adapter_config.json", "adapter_model.safetensors"})
    if (!ec) fs::copy_file(adapter / name, tmp / name, ec);
  if (!ec) {
    fs::remove(to, ec);
    ec.clear();
    fs::rename(tmp, to, ec);
  }
  if (ec) {
    fs::remove_all(tmp, ec);
    return fail(fmt::format("cannot write {}: {}", to, ec.message()), 1);
  }
  std::cout << fmt::format("exported the LoRA adapter ({}) of {} to {}\n", config->lora.ToString(),
                           adapter.parent_path().filename().string(), to);
  return 0;
}

int RunExport(const std::string& runs_dir, const ExportArgs& a) {
  log::Options quiet;
  quiet.level = spdlog::level::warn;
  log::Init("troupe", quiet);
  auto fail = [](const std::string& msg, int code) {
    std::cerr << "troupe: export: " << msg << "\n";
    return code;
  };
  auto shard = ParseByteSize(a.max_shard_size);
  if (!shard.ok()) return fail("--max-shard-size " + shard.status().message(), 2);
  auto run = ResolveRunDir(runs_dir, a.run);
  if (!run.ok()) return fail(run.status().message(), 2);
  auto ckpt = a.checkpoint >= 0 ? CheckpointOfStep(run->checkpoints(), a.checkpoint)
                                : trainer::ResolveCheckpoint(run->checkpoints());
  if (!ckpt.ok()) return fail(ckpt.status().message(), 2);
  const fs::path dir(*ckpt);
  std::error_code ec;
  const fs::path adapter = dir / "adapter";
  const bool lora = fs::exists(adapter / "adapter_config.json", ec);
  if ((a.adapter || a.merged) && !lora)
    return fail(fmt::format("{} holds no LoRA adapter (the job trained the full model): drop "
                            "--{}", *ckpt, a.adapter ? "adapter" : "merged"),
                2);
  if (lora && !a.adapter && !a.merged)
    return fail(*ckpt + " holds a LoRA adapter: pass --adapter (the PEFT adapter alone) or "
                        "--merged (the base with the adapter folded in)",
                2);
  if (a.adapter) return ExportAdapter(adapter, a.to, fail);
  engine::HfExportInput in;
  in.weight_files = {(dir / "model.safetensors").string()};
  if (!fs::exists(in.weight_files[0], ec))
    return fail(*ckpt + " has no model.safetensors", 2);
  std::string merged_file;
  if (a.merged) {
    // The merged weights go to a temporary file beside the target, then through the export.
    merged_file = fs::absolute(fs::path(a.to)).lexically_normal().string() + ".merged.tmp";
    Status st = engine::MergeAdapterIntoSafetensors(in.weight_files[0], adapter.string(),
                                                    merged_file);
    if (!st.ok()) {
      fs::remove(merged_file, ec);
      return fail(st.message(), st.code() == Code::kIo ? 1 : 2);
    }
    in.weight_files = {merged_file};
  }
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code e;
      if (!path.empty()) fs::remove(path, e);
    }
  } cleanup{merged_file};
  if (fs::exists(dir / "config.json", ec)) {
    // A checkpoint written by this version: it carries its Hugging Face files.
    for (const char* name : {"config.json", "generation_config.json"}) {
      if (!fs::exists(dir / name, ec)) continue;
      auto text = ReadFile((dir / name).string());
      if (!text.ok()) return fail(text.status().message(), 1);
      in.files.emplace_back(name, std::move(*text));
    }
    for (const std::string& p : engine::HfTokenizerFiles(dir.string())) in.copy_files.push_back(p);
  } else {
    // An older checkpoint: the run's resolved config describes the model and tokenizer.
    auto job = LoadResolvedConfig(run->config());
    if (!job.ok()) return fail(job.status().message(), 2);
    auto tok = MakeTokenizer(job->tokenizer);
    if (!tok.ok()) return fail(tok.status().message(), 2);
    auto files = HfCompanionFiles(*job, **tok);
    if (!files.ok()) return fail(files.status().message(), 2);
    in.files = std::move(*files);
  }
  engine::HfExportOptions opts;
  opts.max_shard_bytes = *shard;
  Status st = engine::WriteHfFolder(in, a.to, opts);
  if (!st.ok()) return fail(st.message(), st.code() == Code::kIo ? 1 : 2);
  // Read back what was written, as a user's loader would.
  auto folder = engine::ReadHfModelFolder(a.to);
  if (!folder.ok()) return fail("the exported folder does not read back: " + folder.status().message(), 1);
  Status index = engine::CheckHfShardIndex(a.to);
  if (!index.ok()) return fail("the exported folder does not read back: " + index.message(), 1);
  size_t tensors = 0;
  uint64_t bytes = 0;
  for (const auto& f : folder->weight_files) {
    auto h = engine::ReadSafetensorsHeader(f);
    if (!h.ok()) return fail(h.status().message(), 1);
    tensors += h->entries.size();
    bytes += h->data_size;
  }
  const bool has_tokenizer = fs::exists(fs::path(a.to) / "tokenizer.json", ec);
  std::cout << fmt::format("exported {} to {}: {} ({}), {} tensors in {} file{}, {:.1f} MB{}\n",
                           fs::path(*ckpt).filename().string(), folder->dir,
                           engine::HfArchitectureClass(folder->config.architecture),
                           folder->config.ToString(), tensors, folder->weight_files.size(),
                           folder->weight_files.size() == 1 ? "" : "s", bytes / 1e6,
                           has_tokenizer ? ", tokenizer files copied" : ", no tokenizer (char)");
  return 0;
}

}  // namespace troupe::launcher
