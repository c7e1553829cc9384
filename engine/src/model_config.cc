#include "troupe/engine/model_config.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

int64_t ModelConfig::NumParameters() const {
  const int64_t hd = HeadDim();
  const int64_t q = n_heads * hd, kv = n_kv_heads * hd;
  int64_t per_layer = d_model * (q + 2 * kv) + q * d_model + 3 * d_model * ffn_dim + 2 * d_model;
  if (attention_bias) per_layer += q + 2 * kv;
  int64_t total = vocab_size * d_model + n_layers * per_layer + d_model;
  if (!tie_word_embeddings) total += vocab_size * d_model;
  return total;
}

Status ModelConfig::Validate() const {
  auto positive = [](const char* field, int64_t v, int64_t limit) -> Status {
    if (v <= 0 || v > limit)
      return InvalidArgument("model.{} = {} must be in [1, {}]", field, v, limit);
    return Status::Ok();
  };
  TROUPE_RETURN_IF_ERROR(positive("vocab_size", vocab_size, int64_t{1} << 24));
  TROUPE_RETURN_IF_ERROR(positive("d_model", d_model, 65536));
  TROUPE_RETURN_IF_ERROR(positive("n_layers", n_layers, 1024));
  TROUPE_RETURN_IF_ERROR(positive("n_heads", n_heads, 1024));
  TROUPE_RETURN_IF_ERROR(positive("n_kv_heads", n_kv_heads, 1024));
  TROUPE_RETURN_IF_ERROR(positive("ffn_dim", ffn_dim, 1 << 20));
  TROUPE_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len, 1 << 20));
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
  return Status::Ok();
}

std::string ModelConfig::ToString() const {
  return fmt::format(
      "layers={} d_model={} heads={}/{} head_dim={} ffn={} vocab={} max_seq_len={} "
      "rope_theta={} eps={} tied={} attn_bias={} dtype={} params={}",
      n_layers, d_model, n_heads, n_kv_heads, HeadDim(), ffn_dim, vocab_size, max_seq_len,
      rope_theta, rms_norm_eps, tie_word_embeddings, attention_bias, DTypeName(dtype),
      NumParameters());
}

namespace {

using Json = nlohmann::json;

Status ReadInt(const Json& j, const char* key, bool required, int64_t* out) {
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

Status ReadDouble(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number())
    return InvalidArgument("config.json: '{}' must be a number, got {}", key, it->dump());
  *out = it->get<double>();
  return Status::Ok();
}

Status ReadBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean())
    return InvalidArgument("config.json: '{}' must be true or false, got {}", key, it->dump());
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfigFromHfJson(std::string_view json_text, int64_t max_seq_len_cap) {
  Json j = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Malformed("config.json is not a JSON object");
  ModelConfig c;
  auto type_it = j.find("model_type");
  c.attention_bias = type_it != j.end() && type_it->is_string() && *type_it == "qwen2";
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "vocab_size", true, &c.vocab_size));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "hidden_size", true, &c.d_model));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", true, &c.n_layers));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", true, &c.n_heads));
  c.n_kv_heads = c.n_heads;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", false, &c.n_kv_heads));
  c.head_dim = 0;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "head_dim", false, &c.head_dim));
  if (c.head_dim > 0 && c.n_heads > 0 && c.head_dim * c.n_heads == c.d_model) c.head_dim = 0;
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "intermediate_size", true, &c.ffn_dim));
  TROUPE_RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", true, &c.max_seq_len));
  if (max_seq_len_cap > 0 && c.max_seq_len > max_seq_len_cap) c.max_seq_len = max_seq_len_cap;
  TROUPE_RETURN_IF_ERROR(ReadDouble(j, "rope_theta", &c.rope_theta));
  TROUPE_RETURN_IF_ERROR(ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  c.tie_word_embeddings = false;  // Hugging Face's PretrainedConfig default
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "attention_bias", &c.attention_bias));
  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && !scaling->is_null())
    return InvalidArgument("config.json: rope_scaling {} is not supported", scaling->dump());
  bool mlp_bias = false;
  TROUPE_RETURN_IF_ERROR(ReadBool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return InvalidArgument("config.json: mlp_bias=true is not supported");
  auto act = j.find("hidden_act");
  if (act != j.end() && act->is_string() && act->get<std::string>() != "silu")
    return InvalidArgument("config.json: hidden_act '{}' is not supported (only silu)",
                           act->get<std::string>());
  auto dt = j.find("torch_dtype");
  if (dt != j.end() && dt->is_string()) {
    TROUPE_ASSIGN_OR_RETURN(c.dtype, ParseDType(dt->get<std::string>()));
  }
  TROUPE_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace troupe::engine
