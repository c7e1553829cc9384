// MergeAdapterIntoSafetensors (hf_folder.h): W + (alpha / r) * B A without torch, for
// `troupe export --merged` (the launcher links no torch). Written by hand: the only math is
// one rank-r product per targeted matrix, in float32 like torch's CPU merge; the bytes go
// through the validated safetensors header of hf_folder.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "troupe/engine/hf_folder.h"
#include "troupe/engine/lora.h"

namespace troupe::engine {

namespace {

float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even, as torch
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Tensor `e` of a file image as float32.
Result<std::vector<float>> AsFloats(const std::string& file, const std::string& image,
                                    uint64_t data_offset, const SafetensorsEntry& e) {
  const char* p = image.data() + data_offset + e.begin;
  const size_t n = (e.end - e.begin) / static_cast<size_t>(e.itemsize);
  std::vector<float> out(n);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else if (e.dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = Bf16ToFloat(v);
    }
  } else {
    return InvalidArgument("{}: tensor '{}' has dtype {}; merging supports F32 and BF16", file,
                           e.name, e.dtype);
  }
  return out;
}

}  // namespace

Status MergeAdapterIntoSafetensors(const std::string& base_file, const std::string& adapter_dir,
                                   const std::string& out_file) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(adapter_dir) / "adapter_config.json").string();
  const std::string adapter_file = (fs::path(adapter_dir) / "adapter_model.safetensors").string();
  TROUPE_ASSIGN_OR_RETURN(std::string config_text, ReadAll(config_path));
  TROUPE_ASSIGN_OR_RETURN(AdapterConfig config, ParseAdapterConfig(config_text, config_path));
  const float scale = static_cast<float>(config.lora.scale());
  TROUPE_ASSIGN_OR_RETURN(SafetensorsHeader bh, ReadSafetensorsHeader(base_file));
  TROUPE_ASSIGN_OR_RETURN(SafetensorsHeader ah, ReadSafetensorsHeader(adapter_file));
  TROUPE_ASSIGN_OR_RETURN(std::string base, ReadAll(base_file));
  TROUPE_ASSIGN_OR_RETURN(std::string adapter, ReadAll(adapter_file));
  std::map<std::string, const SafetensorsEntry*> weights, factors;
  for (const auto& e : bh.entries) weights[e.name] = &e;
  for (const auto& e : ah.entries) factors[e.name] = &e;
  for (const auto& [name, a_entry] : factors) {
    const size_t at = name.find(".lora_A.weight");
    if (at == std::string::npos) {
      if (name.find(".lora_B.weight") == std::string::npos)
        return InvalidArgument("{}: tensor '{}' is not a LoRA factor", adapter_file, name);
      continue;
    }
    const std::string stem = name.substr(0, at);  // base_model.model.<module path>
    const std::string prefix = "base_model.model.";
    if (stem.rfind(prefix, 0) != 0)
      return InvalidArgument("{}: tensor '{}' does not start with '{}'", adapter_file, name, prefix);
    const std::string weight = stem.substr(prefix.size()) + ".weight";
    auto b_it = factors.find(stem + ".lora_B.weight");
    if (b_it == factors.end())
      return InvalidArgument("{}: '{}' has no lora_B", adapter_file, name);
    auto w_it = weights.find(weight);
    if (w_it == weights.end())
      return InvalidArgument("{}: the adapter's '{}' adapts '{}', which {} does not have",
                             adapter_file, name, weight, base_file);
    const SafetensorsEntry &ae = *a_entry, &be = *b_it->second, &we = *w_it->second;
    if (we.shape.size() != 2 || ae.shape.size() != 2 || be.shape.size() != 2 ||
        ae.shape[0] != config.lora.rank || be.shape[1] != config.lora.rank ||
        ae.shape[1] != we.shape[1] || be.shape[0] != we.shape[0])
      return InvalidArgument("{}: '{}' [{}] and its lora_B [{}] do not fit '{}' [{}] at r={}",
                             adapter_file, name, fmt::join(ae.shape, ", "),
                             fmt::join(be.shape, ", "), weight, fmt::join(we.shape, ", "),
                             config.lora.rank);
    TROUPE_ASSIGN_OR_RETURN(std::vector<float> A, AsFloats(adapter_file, adapter, ah.data_offset, ae));
    TROUPE_ASSIGN_OR_RETURN(std::vector<float> B, AsFloats(adapter_file, adapter, ah.data_offset, be));
    TROUPE_ASSIGN_OR_RETURN(std::vector<float> W, AsFloats(base_file, base, bh.data_offset, we));
    const int64_t out = we.shape[0], in = we.shape[1], r = config.lora.rank;
    for (int64_t o = 0; o < out; ++o) {
      float* row = W.data() + o * in;
      for (int64_t k = 0; k < r; ++k) {
        const float b = B[static_cast<size_t>(o * r + k)] * scale;
        const float* a = A.data() + k * in;
        for (int64_t i = 0; i < in; ++i) row[i] += b * a[i];
      }
    }
    char* dst = base.data() + bh.data_offset + we.begin;
    if (we.dtype == "F32") {
      std::memcpy(dst, W.data(), W.size() * 4);
    } else {
      for (size_t i = 0; i < W.size(); ++i) {
        uint16_t v = FloatToBf16(W[i]);
        std::memcpy(dst + 2 * i, &v, 2);
      }
    }
  }
  std::ofstream o(out_file, std::ios::binary | std::ios::trunc);
  o.write(base.data(), static_cast<std::streamsize>(base.size()));
  if (!o.flush()) return IoError("cannot write {}", out_file);
  return Status::Ok();
}

}  // namespace troupe::engine
