// safetensors I/O: the checkpoint format of Hugging Face models.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}), then the data section; offsets are
// relative to it. Readers here validate everything before touching data:
// header length vs file size, JSON syntax, known dtype, shape * itemsize ==
// end - begin, offsets inside the data section, no overlaps and no holes (as the
// format requires), duplicate names. Every error names the file and the
// problem.
//
// Memory: ReadSafetensors maps the file (private, copy-on-write mmap) and returns
// tensors that are views over the mapping; the mapping lives as long as any of
// them (pages are read lazily, nothing is copied). Writing goes to `path.tmp`
// and is renamed into place, so a crash never leaves a half-written file.
//
// dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL. Loading a model
// casts floating tensors to the config dtype (see LoadOptions::allow_dtype_cast;
// e.g. a BF16 checkpoint loads into a float32 model exactly). Pure functions,
// thread-safe; all calls block on file I/O only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "troupe/core/status.h"
#include "troupe/engine/model.h"

namespace troupe::engine {

struct SafetensorsFile {
  // Tensors in file order (by data offset). CPU tensors; views over the mapped file
  // (or over a copy of the bytes for ParseSafetensors). Writable without touching the file.
  NamedTensors tensors;
  // The "__metadata__" string map (empty when absent).
  std::map<std::string, std::string> metadata;
};

// The safetensors dtype string of a torch dtype ("F32", "BF16", ...); error for others.
Result<std::string> SafetensorsDType(c10::ScalarType dtype);

// Reads and validates a file; tensors are views over a private mapping.
Result<SafetensorsFile> ReadSafetensors(const std::string& path);
// Parses an in-memory file image (tests, fuzzing, bytes received over the network).
// The bytes are copied once into an aligned buffer the tensors view.
Result<SafetensorsFile> ParseSafetensors(const uint8_t* data, size_t size);

// Writes tensors (any device, any supported dtype; non-contiguous ones are made contiguous)
// in the given order, 8-byte-aligned header. Fails on duplicate or empty names, undefined
// tensors, unsupported dtypes, or I/O errors (naming the path).
Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Builds a model for `config` and loads `path` into it (LoadNamed rules: names, shapes and
// dtypes must match; floating tensors are cast to config.dtype). `path` may be a
// .safetensors file or a directory holding model.safetensors or a sharded checkpoint
// (model.safetensors.index.json + shards).
Result<std::shared_ptr<LlamaModel>> LoadModel(const std::string& path, const ModelConfig& config,
                                              torch::Device device = torch::kCPU,
                                              const LoadOptions& options = {});
// Saves the model's NamedWeights() (Hugging Face names, model dtype) with metadata
// {"format": "pt"} plus `metadata`.
Status SaveModel(const std::string& path, const LlamaModel& model,
                 const std::map<std::string, std::string>& metadata = {});

}  // namespace troupe::engine
