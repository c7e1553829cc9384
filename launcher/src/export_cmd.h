// `troupe export RUN [--checkpoint N] --to DIR`: a run's checkpoint as a Hugging Face model
// folder (config.json, model.safetensors or shards with model.safetensors.index.json,
// generation_config.json, the tokenizer files) that transformers, Troupe's `model.from`
// and the parity reference load with bit-identical weights. Torch-free: tensors are copied
// byte for byte through troupe::hf_folder.
//
// LoRA checkpoints (an `adapter/` PEFT folder beside the frozen base): `--adapter` writes
// the PEFT adapter alone (adapter_config.json + adapter_model.safetensors, for PEFT or
// vLLM's --lora-modules on top of the base), `--merged` the base with the adapter folded
// in (W + alpha/r * B A) as a plain model folder. One of the two is required.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "troupe/core/status.h"

namespace troupe::launcher {

struct ExportArgs {
  std::string run;                     // run folder or name ("" = runs/latest)
  int64_t checkpoint = -1;             // checkpoint step (-1: the latest)
  std::string to;                      // the folder to write (must not exist or be empty)
  std::string max_shard_size = "5GB";  // shard limit: bytes, or with KB/MB/GB (10^3) or KiB/MiB/GiB
  bool adapter = false;                // LoRA: the PEFT adapter alone
  bool merged = false;                 // LoRA: base + adapter folded into one model
};

// Registers the subcommand on `app`; parsed values land in *args.
CLI::App* AddExportCommand(CLI::App& app, ExportArgs* args);
// Runs it; returns the exit code (2 for a bad RUN, checkpoint or argument, 1 for I/O errors),
// after one line naming the problem on stderr, or the summary on stdout.
int RunExport(const std::string& runs_dir, const ExportArgs& args);

// "5GB" -> 5e9, "512MiB" -> 2^29, "1000" -> 1000; error naming the text otherwise.
Result<uint64_t> ParseByteSize(const std::string& text);

}  // namespace troupe::launcher
