#include "troupe/engine/model_config.h"

#include <cmath>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "troupe/core/config_binder.h"

namespace troupe::engine {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "float") return DType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return DType::kFloat16;
  return InvalidArgument("unknown dtype '{}' (expected float32, bfloat16 or float16)", name);
}

const char* HfArchitectureClass(std::string_view architecture) {
  if (architecture == "llama") return "LlamaForCausalLM";
  if (architecture == "qwen2") return "Qwen2ForCausalLM";
  if (architecture == "qwen3") return "Qwen3ForCausalLM";
  return "";
}

std::vector<double> ModelConfig::RopeInverseFrequencies() const {
  const int64_t hd = HeadDim(), half = hd / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = 1.0 / std::pow(rope_theta, static_cast<double>(2 * i) / hd);
  if (rope_scaling.type != "llama3") return inv;
  // Llama 3.1's rule (Hugging Face's _compute_llama3_parameters).
  const RopeScaling& s = rope_scaling;
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_wavelen) {
      f = f / s.factor;  // low frequencies: interpolated
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;  // the band between: blended
    }  // high frequencies: unchanged
  }
  return inv;
}

int64_t ModelConfig::NumParameters() const {
  const int64_t hd = HeadDim();
  const int64_t q = n_heads * hd, kv = n_kv_heads * hd;
  int64_t per_layer = d_model * (q + 2 * kv) + q * d_model + 3 * d_model * ffn_dim + 2 * d_model;
  if (attention_bias) per_layer += q + 2 * kv;
  if (QkNorm()) per_layer += 2 * hd;
  int64_t total = vocab_size * d_model + n_layers * per_layer + d_model;
  if (!tie_word_embeddings) total += vocab_size * d_model;
  return total;
}

std::pair<int64_t, int64_t> ModelConfig::LoraDims(int module) const {
  const int64_t q = n_heads * HeadDim(), kv = n_kv_heads * HeadDim();
  switch (module) {
    case 0:
      return {d_model, q};
    case 1:
    case 2:
      return {d_model, kv};
    case 3:
      return {q, d_model};
    case 4:
    case 5:
      return {d_model, ffn_dim};
    default:
      return {ffn_dim, d_model};
  }
}

int64_t ModelConfig::NumAdapterParameters() const {
  if (!lora.enabled()) return 0;
  int64_t per_layer = 0;
  for (int m = 0; m < kNumLoraModules; ++m)
    if (lora.Targets(m)) per_layer += lora.rank * (LoraDims(m).first + LoraDims(m).second);
  return n_layers * per_layer;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ModelConfig::AdapterShapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (!lora.enabled()) return out;
  for (int64_t i = 0; i < n_layers; ++i) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!lora.Targets(m)) continue;
      const auto [in, features] = LoraDims(m);
      const auto layer = static_cast<size_t>(i);
      out.emplace_back(LoraAdapterName(layer, m, "lora_A"), std::vector<int64_t>{lora.rank, in});
      out.emplace_back(LoraAdapterName(layer, m, "lora_B"),
                       std::vector<int64_t>{features, lora.rank});
    }
  }
  return out;
}

Status ModelConfig::Validate() const {
  auto positive = [](const char* field, int64_t v, int64_t limit) -> Status {
    if (v <= 0 || v > limit)
      return InvalidArgument("model.{} = {} must be in [1, {}]", field, v, limit);
    return Status::Ok();
  };
  if (*HfArchitectureClass(architecture) == '\0')
    return InvalidArgument("model.architecture '{}' is not one of llama, qwen2, qwen3",
                           architecture.substr(0, 40));
  TROUPE_RETURN_IF_ERROR(positive("vocab_size", vocab_size, int64_t{1} << 24));
  TROUPE_RETURN_IF_ERROR(positive("d_model", d_model, 65536));
  TROUPE_RETURN_IF_ERROR(positive("n_layers", n_layers, 1024));
  TROUPE_RETURN_IF_ERROR(positive("n_heads", n_heads, 1024));
  TROUPE_RETURN_IF_ERROR(positive("n_kv_heads", n_kv_heads, 1024));
  TROUPE_RETURN_IF_ERROR(positive("ffn_dim", ffn_dim, 1 << 20));
  TROUPE_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len, 1 << 20));
  if (max_position_embeddings < 0 || max_position_embeddings > (int64_t{1} << 24))
    return InvalidArgument("model.max_position_embeddings = {} must be 0 (max_seq_len) or in [1, {}]",
                           max_position_embeddings, int64_t{1} << 24);
  if (head_dim < 0 || head_dim > 4096)
    return InvalidArgument("model.head_dim = {} must be 0 (derived) or in [1, 4096]", head_dim);
  if (head_dim == 0 && d_model % n_heads != 0)
    return InvalidArgument("model.d_model = {} must be divisible by model.n_heads = {}", d_model,
                           n_heads);
  if (HeadDim() % 2 != 0)
    return InvalidArgument("model head_dim = {} must be even (rotary embeddings rotate pairs)",
                           HeadDim());
  if (n_heads % n_kv_heads != 0)
    return InvalidArgument("model.n_heads = {} must be divisible by model.n_kv_heads = {}", n_heads,
                           n_kv_heads);
  if (!std::isfinite(rope_theta) || rope_theta <= 1.0)
    return InvalidArgument("model.rope_theta = {} must be finite and > 1", rope_theta);
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps <= 0.0 || rms_norm_eps >= 1.0)
    return InvalidArgument("model.rms_norm_eps = {} must be in (0, 1)", rms_norm_eps);
  if (architecture == "qwen2" && !attention_bias)
    return InvalidArgument(
        "model.attention_bias must be true for architecture qwen2 (Qwen2 always has q/k/v "
        "biases)");
  const RopeScaling& s = rope_scaling;
  if (s.type != "none" && s.type != "llama3")
    return InvalidArgument("model.rope_scaling.type '{}' is not one of none, llama3",
                           s.type.substr(0, 40));
  if (s.type == "llama3") {
    if (!std::isfinite(s.factor) || s.factor < 1.0)
      return InvalidArgument("model.rope_scaling.factor = {} must be finite and >= 1", s.factor);
    if (!std::isfinite(s.low_freq_factor) || s.low_freq_factor <= 0.0)
      return InvalidArgument("model.rope_scaling.low_freq_factor = {} must be > 0",
                             s.low_freq_factor);
    if (!std::isfinite(s.high_freq_factor) || s.high_freq_factor <= s.low_freq_factor)
      return InvalidArgument(
          "model.rope_scaling.high_freq_factor = {} must be > low_freq_factor = {}",
          s.high_freq_factor, s.low_freq_factor);
    if (s.original_max_position_embeddings < 1)
      return InvalidArgument("model.rope_scaling.original_max_position_embeddings = {} must be >= 1",
                             s.original_max_position_embeddings);
  }
  return lora.Validate();
}

std::string ModelConfig::ToString() const {
  std::string rope = rope_scaling.enabled()
                         ? fmt::format(" rope_scaling={}(factor={})", rope_scaling.type,
                                       rope_scaling.factor)
                         : "";
  return fmt::format(
      "arch={} layers={} d_model={} heads={}/{} head_dim={} ffn={} vocab={} max_seq_len={} "
      "rope_theta={}{} eps={} tied={} attn_bias={} qk_norm={} dtype={} params={}{}",
      architecture, n_layers, d_model, n_heads, n_kv_heads, HeadDim(), ffn_dim, vocab_size,
      max_seq_len, rope_theta, rope, rms_norm_eps, tie_word_embeddings, attention_bias, QkNorm(),
      DTypeName(dtype), NumParameters(),
      lora.enabled() ? " lora=" + lora.ToString() : std::string());
}

namespace {

using Json = nlohmann::json;

Status ReadInt(const Json& j, const std::string& key, bool required, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument("config.json: missing required key '{}'", key);
    return Status::Ok();
  }
  if (!it->is_number_integer())
    return InvalidArgument("config.json: '{}' must be an integer, got {}", key, it->dump());
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadDouble(const Json& j, const std::string& key, bool required, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument("config.json: missing required key '{}'", key);
    return Status::Ok();
  }
  if (!it->is_number())
    return InvalidArgument("config.json: '{}' must be a number, got {}", key, it->dump());
  *out = it->get<double>();
  return Status::Ok();
}

Status ReadBool(const Json& j, const std::string& key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean())
    return InvalidArgument("config.json: '{}' must be true or false, got {}", key, it->dump());
  *out = it->get<bool>();
  return Status::Ok();
}

// `where` is "rope_scaling" or "rope_parameters". Reads the type and the llama3 fields;
// rope_parameters may also carry rope_theta.
Status ReadRopeScaling(const Json& r, const std::string& where, ModelConfig* c) {
  if (r.is_null()) return Status::Ok();
  if (!r.is_object())
    return InvalidArgument("config.json: '{}' must be an object or null, got {}", where, r.dump());
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto it = r.find(key);
    if (it == r.end()) continue;
    if (!it->is_string())
      return InvalidArgument("config.json: '{}.{}' must be a string, got {}", where, key,
                             it->dump());
    if (!type.empty() && type != it->get<std::string>())
      return InvalidArgument("config.json: '{}' names two types '{}' and '{}'", where, type,
                             it->get<std::string>());
    type = it->get<std::string>();
  }
  if (type.empty()) type = "default";
  if (type != "default" && type != "llama3")
    return InvalidArgument(
        "config.json: {}.rope_type '{}' is not supported (only default and llama3)", where, type);
  std::set<std::string> allowed = {"rope_type", "type", "rope_theta"};
  if (type == "llama3") {
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings"});
    c->rope_scaling.type = "llama3";
    const Json& obj = r;
    auto num = [&](const char* key, double* out) -> Status {
      return ReadDouble(obj, key, true, out).WithContext(where);
    };
    TROUPE_RETURN_IF_ERROR(num("factor", &c->rope_scaling.factor));
    TROUPE_RETURN_IF_ERROR(num("low_freq_factor", &c->rope_scaling.low_freq_factor));
    TROUPE_RETURN_IF_ERROR(num("high_freq_factor", &c->rope_scaling.high_freq_factor));
    TROUPE_RETURN_IF_ERROR(ReadInt(obj, "original_max_position_embeddings", true,
                                   &c->rope_scaling.original_max_position_embeddings)
                               .WithContext(where));
  }
  if (r.contains("rope_theta")) {
    TROUPE_RETURN_IF_ERROR(ReadDouble(r, "rope_theta", true, &c->rope_theta).WithContext(where));
  }
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!allowed.count(it.key()))
      return InvalidArgument("config.json: '{}.{}' is not supported for rope_type {}", where,
                             it.key(), type);
  return Status::Ok();
}

// Keys whose value must be the one that changes nothing.
Status CheckNeutralKeys(const Json& j) {
  auto act = j.find("hidden_act");
  if (act != j.end() && !(act->is_string() && act->get<std::string>() == "silu"))
    return InvalidArgument("config.json: hidden_act {} is not supported (only \"silu\")",
                           act->dump());
  bool flag = false;
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "mlp_bias", &flag));
  if (flag) return InvalidArgument("config.json: mlp_bias=true is not supported");
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", &flag));
  if (flag)
    return InvalidArgument("config.json: use_sliding_window=true is not supported (full attention only)");
  double dropout = 0;
  TROUPE_RETURN_IF_ERROR(ReadDouble(j, "attention_dropout", false, &dropout));
  if (dropout != 0.0)
    return InvalidArgument("config.json: attention_dropout = {} is not supported (Troupe has no dropout)",
                           dropout);
  auto lt = j.find("layer_types");
  if (lt != j.end() && !lt->is_null()) {
    if (!lt->is_array())
      return InvalidArgument("config.json: 'layer_types' must be a list, got {}", lt->dump());
    for (size_t i = 0; i < lt->size(); ++i)
      if ((*lt)[i] != "full_attention")
        return InvalidArgument(
            "config.json: layer_types[{}] = {} is not supported (only full_attention)", i,
            (*lt)[i].dump());
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, int64_t max_seq_len_cap) {
  Json j = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Malformed("config.json is not a JSON object");
  static const std::set<std::string> kRead = {
      "model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
      "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps",
      "tie_word_embeddings", "attention_bias", "torch_dtype", "dtype",
      // checked to hold neutral values
      "hidden_act", "mlp_bias", "attention_dropout", "use_sliding_window", "layer_types",
      // informational: no effect on the forward pass
      "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "use_cache",
      "initializer_range", "pretraining_tp", "max_window_layers", "sliding_window",
      "_name_or_path"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!kRead.count(it.key()))
      return InvalidArgument(
          "config.json: key '{}' is not supported (Troupe implements Llama 3, Qwen2/2.5 and "
          "Qwen3 decoders; a key it does not know could change the model)",
          it.key());

  ModelConfig c;
  auto type_it = j.find("model_type");
  if (type_it == j.end() || !type_it->is_string())
    return InvalidArgument("config.json: missing model_type (expected llama, qwen2 or qwen3)");
  c.architecture = type_it->get<std::string>();
  if (*HfArchitectureClass(c.architecture) == '\0')
    return InvalidArgument(
        "config.json: model_type '{}' is not supported (llama, qwen2 and qwen3 are)",
        c.architecture);
  auto arch = j.find("architectures");
  if (arch != j.end() && !arch->is_null()) {
    const std::string want = HfArchitectureClass(c.architecture);
    if (!arch->is_array() || arch->size() != 1 || (*arch)[0] != want)
      return InvalidArgument("config.json: architectures {} does not match model_type '{}' ({})",
                             arch->dump(), c.architecture, want);
  }
  TROUPE_RETURN_IF_ERROR(CheckNeutralKeys(j));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c.vocab_size));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c.d_model));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c.n_layers));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c.n_heads));
  c.n_kv_heads = c.n_heads;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.n_kv_heads));
  // Qwen3Config's head_dim defaults to 128; Llama/Qwen2 derive hidden_size / heads.
  c.head_dim = c.architecture == "qwen3" ? 128 : 0;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim));
  if (c.head_dim > 0 && c.n_heads > 0 && c.head_dim * c.n_heads == c.d_model) c.head_dim = 0;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, &c.ffn_dim));
  c.max_position_embeddings = c.architecture == "llama" ? 2048 : 32768;  // the HF defaults
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", false, &c.max_position_embeddings));
  if (c.max_position_embeddings < 1)
    return InvalidArgument("config.json: max_position_embeddings = {} must be >= 1",
                           c.max_position_embeddings);
  c.max_seq_len = c.max_position_embeddings;
  if (max_seq_len_cap > 0 && c.max_seq_len > max_seq_len_cap) c.max_seq_len = max_seq_len_cap;
  TROUPE_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", false, &c.rope_theta));
  c.rms_norm_eps = 1e-6;  // LlamaConfig, Qwen2Config and Qwen3Config default
  TROUPE_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", false, &c.rms_norm_eps));
  c.tie_word_embeddings = false;  // Hugging Face's PretrainedConfig default
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  if (c.architecture == "qwen2") {
    // Qwen2 has q/k/v biases whatever the config says; a config saying otherwise is ambiguous.
    bool bias = true;
    TROUPE_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &bias));
    if (!bias)
      return InvalidArgument(
          "config.json: attention_bias=false with model_type qwen2 (Qwen2 always has q/k/v "
          "biases)");
    c.attention_bias = true;
  } else {
    c.attention_bias = false;
    TROUPE_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &c.attention_bias));
  }
  if (j.contains("rope_scaling") && j.contains("rope_parameters") && !j["rope_scaling"].is_null() &&
      !j["rope_parameters"].is_null())
    return InvalidArgument("config.json: give rope_scaling or rope_parameters, not both");
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (j.contains(key)) TROUPE_RETURN_IF_ERROR(ReadRopeScaling(j[key], key, &c));
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto dt = j.find(key);
    if (dt == j.end() || dt->is_null()) continue;
    if (!dt->is_string())
      return InvalidArgument("config.json: '{}' must be a string, got {}", key, dt->dump());
    auto parsed = ParseDType(dt->get<std::string>());
    if (!parsed.ok()) return parsed.status().WithContext(std::string("config.json: ") + key);
    c.dtype = *parsed;
  }
  Status st = c.Validate();
  if (!st.ok()) return st.WithContext("config.json");
  return c;
}

Result<std::string> ModelConfigToHfJson(const ModelConfig& c, std::string_view base_json,
                                        DType stored_dtype, int32_t bos_id,
                                        const std::vector<int32_t>& eos_ids) {
  TROUPE_RETURN_IF_ERROR(c.Validate());
  Json j = Json::object();
  if (!base_json.empty()) {
    j = Json::parse(base_json.begin(), base_json.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return Malformed("the base config.json is not a JSON object");
  }
  j.erase("rope_parameters");
  j.erase("dtype");
  j["model_type"] = c.architecture;
  j["architectures"] = {HfArchitectureClass(c.architecture)};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.d_model;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.HeadDim();
  j["intermediate_size"] = c.ffn_dim;
  j["max_position_embeddings"] = c.DeclaredPositions();
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings",
                          c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = DTypeName(stored_dtype);
  if (c.architecture == "llama") j["mlp_bias"] = false;
  if (c.architecture != "llama") j["use_sliding_window"] = false;
  if (!j.contains("bos_token_id") && bos_id >= 0) j["bos_token_id"] = bos_id;
  if (!j.contains("eos_token_id") && !eos_ids.empty()) {
    if (eos_ids.size() == 1)
      j["eos_token_id"] = eos_ids[0];
    else
      j["eos_token_id"] = eos_ids;
  }
  if (!j.contains("use_cache")) j["use_cache"] = true;
  // The result must read back as the same model.
  const std::string text = j.dump(2) + "\n";
  auto back = ModelConfigFromHfJson(text);
  if (!back.ok()) return back.status().WithContext("config.json written for export");
  return text;
}

// Describe(): the YAML keys of the config structs, one documented line each
// (troupe/core/config_binder.h).
using config::Binder;
using config::EnumField;

void Describe(Binder& b, RopeScaling& c) {
  b.Field("type", &c.type, "none | llama3 (Llama 3.1+ frequency-dependent RoPE scaling)");
  b.Field("factor", &c.factor, "llama3: context extension factor (Llama 3.2: 32, 3.1: 8)");
  b.Field("low_freq_factor", &c.low_freq_factor, "llama3: low-frequency wavelength threshold");
  b.Field("high_freq_factor", &c.high_freq_factor, "llama3: high-frequency wavelength threshold");
  b.Field("original_max_position_embeddings", &c.original_max_position_embeddings,
          "llama3: pre-training context length");
}
void Describe(Binder& b, ModelConfig& c) {
  b.Field("architecture", &c.architecture,
          "llama | qwen2 (q/k/v biases) | qwen3 (per-head q/k RMSNorm): the Hugging Face "
          "model_type");
  b.Field("vocab_size", &c.vocab_size,
          "token ids covered by embedding and head (0: the tokenizer's size)");
  b.Field("d_model", &c.d_model, "residual stream width (hidden_size)");
  b.Field("n_layers", &c.n_layers, "decoder layers");
  b.Field("n_heads", &c.n_heads, "query heads");
  b.Field("n_kv_heads", &c.n_kv_heads,
          "key/value heads (grouped-query attention; divides n_heads)");
  b.Field("head_dim", &c.head_dim, "per-head width (0: d_model / n_heads)");
  b.Field("ffn_dim", &c.ffn_dim, "SwiGLU hidden width (intermediate_size)");
  b.Field("max_seq_len", &c.max_seq_len,
          "longest prompt + response the model serves (RoPE table, KV cache)");
  b.Field("max_position_embeddings", &c.max_position_embeddings,
          "positions the checkpoint declares, written on export (0: max_seq_len)");
  b.Field("rope_theta", &c.rope_theta, "RoPE base frequency");
  b.Section("rope_scaling", &c.rope_scaling, "RoPE frequency scaling (Hugging Face rope_scaling)");
  b.Field("rms_norm_eps", &c.rms_norm_eps, "RMSNorm epsilon");
  b.Field("tie_word_embeddings", &c.tie_word_embeddings, "output head shares the embedding matrix");
  b.Field("attention_bias", &c.attention_bias, "q/k/v projections carry biases (Qwen2 style)");
  EnumField<DType>(
      b, "dtype", &c.dtype, "parameter and KV-cache dtype: float32 | bfloat16 | float16",
      [](DType d) { return std::string(DTypeName(d)); }, ParseDType);
}

}  // namespace troupe::engine
