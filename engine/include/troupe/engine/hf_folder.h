// Hugging Face model folders without torch: the safetensors header, config.json,
// generation_config.json, shard indexes, and writing a complete folder.
//
//   DIR/config.json                       architecture and sizes (ModelConfigFromHfJson)
//   DIR/generation_config.json            EOS ids (one or several), BOS
//   DIR/model.safetensors                 or shards model-0000K-of-0000N.safetensors
//   DIR/model.safetensors.index.json      {"metadata": {"total_size"}, "weight_map": {name: shard}}
//   DIR/tokenizer.json, tokenizer_config.json, ...   copied as they are
//
// The launcher links this (config validation, `troupe export`) and must not link torch,
// so tensors here are (dtype, shape, byte range) entries, never torch tensors; the torch
// reader in safetensors.h builds its tensors from the same validated header. Exporting
// copies every tensor's bytes verbatim, so an exported folder holds bit-identical weights.
// Pure functions on files; thread-safe; every call blocks on file I/O only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/engine/model_config.h"

namespace troupe::engine {

// ---------------------------------------------------------------- safetensors header

// One tensor of a safetensors file: dtype name ("F32", "BF16", ...), its item size, shape
// and byte range relative to the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  int64_t itemsize = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;      // sorted by data offset
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                   // 8 + header length: where the data section starts
  uint64_t data_size = 0;                     // bytes of the data section
};

// Item size of a safetensors dtype name (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL); 0 if unknown.
int64_t SafetensorsItemSize(std::string_view dtype);

// Validates the header of a file of `file_size` bytes whose first `available` bytes are at
// `bytes` (at least 8 + the header length): header length vs file size and a 100 MiB cap,
// JSON syntax, duplicate names, known dtypes, shape x itemsize == end - begin, offsets
// inside the data section, no overlaps, no holes, no trailing bytes. `src` names the file
// in errors.
Result<SafetensorsHeader> ParseSafetensorsHeader(const std::string& src, const uint8_t* bytes,
                                                 size_t available, uint64_t file_size);
// Reads and validates only the header of a file.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// ---------------------------------------------------------------- reading a folder

// The weight files of a model folder: DIR/model.safetensors, or the shards
// DIR/model.safetensors.index.json names (plain file names that exist, each once, in
// first-mention order). NotFound when the folder has neither.
Result<std::vector<std::string>> HfWeightFiles(const std::string& dir);

// Checks a sharded folder's index against its shards: every tensor of every shard is in
// weight_map under that shard, and every weight_map entry is in its shard. Ok for an
// unsharded folder.
Status CheckHfShardIndex(const std::string& dir);

struct HfModelFolder {
  std::string dir;
  ModelConfig config;                  // from config.json (max_seq_len capped as asked)
  std::string config_json;             // config.json as read
  std::string generation_config_json;  // generation_config.json as read ("" when absent)
  // Ids that end a generation: generation_config.json's eos_token_id (an id or a list),
  // else config.json's; empty when neither names one.
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;              // the same for bos_token_id (-1: none)
  std::vector<std::string> weight_files;  // absolute paths; empty when the folder has none
};

// Reads DIR/config.json (required) and DIR/generation_config.json (optional) and lists the
// weight files. Errors name the file and the key.
Result<HfModelFolder> ReadHfModelFolder(const std::string& dir, int64_t max_seq_len_cap = 0);

// Files of a tokenizer folder an exported model folder carries (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, added_tokens.json, vocab.json,
// merges.txt, tokenizer.model, chat_template.jinja), those that exist, as paths. `path`
// may be the folder or its tokenizer.json.
std::vector<std::string> HfTokenizerFiles(const std::string& path);

// A generation_config.json: `base_json` ("" for none) with bos_token_id/eos_token_id set
// when it has none.
Result<std::string> GenerationConfigJson(std::string_view base_json, int32_t bos_id,
                                         const std::vector<int32_t>& eos_ids);

// ---------------------------------------------------------------- writing a folder

struct HfExportInput {
  // Safetensors files holding the model's tensors under Hugging Face names.
  std::vector<std::string> weight_files;
  // Small files written as given (name, contents): config.json (required),
  // generation_config.json, tokenizer files, ...
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> copy_files;  // copied into the folder under their file names
};

struct HfExportOptions {
  // Largest shard (tensor bytes); a larger model is split into model-0000K-of-0000N files with
  // an index, a model that fits is one model.safetensors. Default 5 GB (Hugging Face's
  // save_pretrained default). A tensor larger than this gets a shard of its own.
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // __metadata__ of every shard. Default {"format": "pt"} (what transformers expects).
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

// Writes a complete folder at `dir`, which must not exist or be empty. Everything goes
// into a sibling temporary folder first, which is renamed into place at the end: a killed
// export never leaves a half folder. Tensor bytes are copied verbatim, in source order.
Status WriteHfFolder(const HfExportInput& input, const std::string& dir,
                     const HfExportOptions& options = {});

// ---------------------------------------------------------------- LoRA

// Folds a PEFT adapter (DIR/adapter_config.json + DIR/adapter_model.safetensors) into a copy
// of the safetensors file `base_file` written to `out_file`: every targeted weight becomes
// W + (alpha / r) * B A (float32 arithmetic, stored back in W's dtype: F32 or BF16; others
// are refused by name). The tensors of the adapter must all find their weight, with shapes
// [r, in] and [out, r] matching it. Torch-free (`troupe export --merged`).
Status MergeAdapterIntoSafetensors(const std::string& base_file, const std::string& adapter_dir,
                                   const std::string& out_file);

}  // namespace troupe::engine
