#include "troupe/engine/model.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "cpu_kernels.h"
#include "train_kernels.h"
#include "troupe/core/check.h"
#include "troupe/engine/memory.h"

namespace troupe::engine {

c10::ScalarType ToTorchDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

namespace {

std::string ShapeString(at::IntArrayRef s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

// A zeroed tensor; on the CPU from 1 MiB on transparent huge pages (memory.h:
// AllocateOnHugePages), else (smaller, another device, or no aligned memory) at::zeros.
at::Tensor ZerosOnHugePages(at::IntArrayRef shape, const at::TensorOptions& opts) {
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(shape)) *
                       c10::elementSize(opts.dtype().toScalarType());
  void* p = opts.device().is_cpu() && bytes >= kHugePageBytes / 2 ? AllocateOnHugePages(bytes)
                                                                   : nullptr;
  if (p == nullptr) return at::zeros(shape, opts);
  return at::from_blob(p, shape, [](void* q) { std::free(q); }, opts);
}

}  // namespace

// ------------------------------------------------------------------ KvCache

KvCache::KvCache(const ModelConfig& config, int64_t num_slots, int64_t max_len,
                 torch::Device device)
    : num_slots_(num_slots), max_len_(max_len) {
  TROUPE_CHECK_GT(num_slots, 0);
  TROUPE_CHECK_GT(max_len, 0);
  auto opts = at::TensorOptions().dtype(ToTorchDType(config.dtype)).device(device);
  const std::vector<int64_t> shape = {num_slots, config.n_kv_heads, max_len, config.HeadDim()};
  for (int64_t l = 0; l < config.n_layers; ++l) {
    k_.push_back(ZerosOnHugePages(shape, opts));
    v_.push_back(ZerosOnHugePages(shape, opts));
  }
}

void KvCache::CopySlots(const torch::Tensor& src, const torch::Tensor& dst, int64_t len) {
  if (src.numel() == 0 || len <= 0) return;
  for (size_t l = 0; l < k_.size(); ++l) {
    for (torch::Tensor* t : {&k_[l], &v_[l]}) {
      at::Tensor prefix = t->narrow(2, 0, len);
      prefix.index_copy_(0, dst, prefix.index_select(0, src));
    }
  }
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < k_.size(); ++l) total += k_[l].nbytes() + v_[l].nbytes();
  return total;
}

// ------------------------------------------------------------------ LlamaModel

LlamaModel::LlamaModel(const ModelConfig& config, uint64_t seed, torch::Device device)
    : config_(config) {
  Allocate(config);
  InitRandom(seed);
  if (device != torch::Device(torch::kCPU)) to(device);
}

LlamaModel::LlamaModel(const ModelConfig& config, Uninitialized, torch::Device device)
    : config_(config) {
  Allocate(config);
  InitAdapters(0);  // LoadModel fills the base; a fresh adapter is the identity either way
  if (device != torch::Device(torch::kCPU)) to(device);
}

void LlamaModel::Allocate(const ModelConfig& config) {
  Status st = config.Validate();
  TROUPE_CHECK_MSG(st.ok(), "invalid ModelConfig: {}", st.message());
  head_dim_ = config.HeadDim();
  q_size_ = config.n_heads * head_dim_;
  kv_size_ = config.n_kv_heads * head_dim_;
  const int64_t d = config.d_model;
  auto opts = at::TensorOptions().dtype(ToTorchDType(config.dtype));
  embed_ = register_parameter("embed_tokens", at::empty({config.vocab_size, d}, opts));
  for (int64_t i = 0; i < config.n_layers; ++i) {
    Layer layer;
    auto name = [i](const char* what) { return fmt::format("layer{}_{}", i, what); };
    layer.input_norm = register_parameter(name("input_norm"), at::empty({d}, opts));
    layer.qkv_w = register_parameter(name("qkv_w"), at::empty({q_size_ + 2 * kv_size_, d}, opts));
    if (config.attention_bias)
      layer.qkv_b = register_parameter(name("qkv_b"), at::empty({q_size_ + 2 * kv_size_}, opts));
    layer.o_w = register_parameter(name("o_w"), at::empty({d, q_size_}, opts));
    if (config.QkNorm()) {
      layer.q_norm = register_parameter(name("q_norm"), at::empty({head_dim_}, opts));
      layer.k_norm = register_parameter(name("k_norm"), at::empty({head_dim_}, opts));
    }
    layer.post_norm = register_parameter(name("post_norm"), at::empty({d}, opts));
    layer.gate_up_w =
        register_parameter(name("gate_up_w"), at::empty({2 * config.ffn_dim, d}, opts));
    layer.down_w = register_parameter(name("down_w"), at::empty({d, config.ffn_dim}, opts));
    layers_.push_back(layer);
  }
  final_norm_ = register_parameter("final_norm", at::empty({d}, opts));
  if (!config.tie_word_embeddings)
    lm_head_ = register_parameter("lm_head", at::empty({config.vocab_size, d}, opts));
  if (config.lora.enabled()) {
    SetBaseTrainable(false);
    const int64_t r = config.lora.rank;
    for (size_t i = 0; i < layers_.size(); ++i) {
      for (int m = 0; m < kNumLoraModules; ++m) {
        if (!config.lora.Targets(m)) continue;
        auto name = [&](const char* ab) {
          return fmt::format("layer{}_lora_{}_{}", i, LoraModuleName(m), ab);
        };
        const auto [in, out] = config.LoraDims(m);
        layers_[i].lora_a[m] = register_parameter(name("A"), at::empty({r, in}, opts));
        layers_[i].lora_b[m] = register_parameter(name("B"), at::empty({out, r}, opts));
      }
    }
  }

  // RoPE tables (rotate-half layout, as Hugging Face Llama/Qwen), computed in double, with
  // the config's rope_scaling applied to the inverse frequencies.
  const int64_t half = head_dim_ / 2;
  std::vector<float> cos_v(static_cast<size_t>(config.max_seq_len * half));
  std::vector<float> sin_v(cos_v.size());
  const std::vector<double> inv_freqs = config.RopeInverseFrequencies();
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = inv_freqs[static_cast<size_t>(i)];
    for (int64_t p = 0; p < config.max_seq_len; ++p) {
      cos_v[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(p * inv_freq));
      sin_v[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(p * inv_freq));
    }
  }
  rope_cos_ = register_buffer("rope_cos", at::tensor(cos_v).view({config.max_seq_len, half}));
  rope_sin_ = register_buffer("rope_sin", at::tensor(sin_v).view({config.max_seq_len, half}));
}

Result<std::shared_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config, uint64_t seed,
                                                       torch::Device device) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  return std::make_shared<LlamaModel>(config, seed, device);
}

torch::Device LlamaModel::device() const {
  return embed_.device();
}

void LlamaModel::SetBaseTrainable(bool trainable) {
  if (!config_.lora.enabled()) return;
  for (auto& p : named_parameters(/*recurse=*/false)) {
    if (p.key().find("_lora_") == std::string::npos) p.value().requires_grad_(trainable);
  }
}

void LlamaModel::InitAdapters(uint64_t seed) {
  if (!config_.lora.enabled()) return;
  torch::NoGradGuard no_grad;
  // A: kaiming-uniform(a = sqrt(5)) over fan_in = in, i.e. U(-1/sqrt(in), 1/sqrt(in)), as
  // PEFT (torch.nn.Linear's default init); B: zeros, so the adapter starts as the identity.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x4c6f5241ULL);
  for (auto& layer : layers_) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!layer.lora_a[m].defined()) continue;
      const double bound = 1.0 / std::sqrt(static_cast<double>(layer.lora_a[m].size(1)));
      at::Tensor r = at::empty(layer.lora_a[m].sizes(), at::kFloat);
      r.uniform_(-bound, bound, gen);
      layer.lora_a[m].copy_(r);
      layer.lora_b[m].zero_();
    }
  }
  if (merged_) Remerge();
}

void LlamaModel::InitRandom(uint64_t seed, double std) {
  {
    torch::NoGradGuard no_grad;
    for (auto& layer : layers_)  // merged: the live rows are re-drawn as the new base below
      for (auto& b : layer.lora_base) b = at::Tensor();
  }
  const bool was_merged = merged_;
  merged_ = false;
  DrawBase(seed, std);
  if (was_merged) SetMerged(true);
  InitAdapters(seed);
}

void LlamaModel::DrawBase(uint64_t seed, double std) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, t] : NamedWeights()) {
    bool is_norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    if (is_norm) {
      t.fill_(1.0);
    } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      t.zero_();
    } else {
      at::Tensor r = at::empty(t.sizes(), at::kFloat);
      r.normal_(0.0, std, gen);
      t.copy_(r);
    }
  }
}

NamedTensors LlamaModel::NamedWeights() const {
  NamedTensors out;
  out.reserve(layers_.size() * 14 + 3);
  out.emplace_back("model.embed_tokens.weight", embed_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    out.emplace_back(p + "input_layernorm.weight", l.input_norm);
    out.emplace_back(p + "self_attn.q_proj.weight", l.qkv_w.narrow(0, 0, q_size_));
    out.emplace_back(p + "self_attn.k_proj.weight", l.qkv_w.narrow(0, q_size_, kv_size_));
    out.emplace_back(p + "self_attn.v_proj.weight",
                     l.qkv_w.narrow(0, q_size_ + kv_size_, kv_size_));
    if (l.qkv_b.defined()) {
      out.emplace_back(p + "self_attn.q_proj.bias", l.qkv_b.narrow(0, 0, q_size_));
      out.emplace_back(p + "self_attn.k_proj.bias", l.qkv_b.narrow(0, q_size_, kv_size_));
      out.emplace_back(p + "self_attn.v_proj.bias",
                       l.qkv_b.narrow(0, q_size_ + kv_size_, kv_size_));
    }
    out.emplace_back(p + "self_attn.o_proj.weight", l.o_w);
    if (l.q_norm.defined()) {
      out.emplace_back(p + "self_attn.q_norm.weight", l.q_norm);
      out.emplace_back(p + "self_attn.k_norm.weight", l.k_norm);
    }
    out.emplace_back(p + "post_attention_layernorm.weight", l.post_norm);
    const int64_t f = config_.ffn_dim;
    out.emplace_back(p + "mlp.gate_proj.weight", l.gate_up_w.narrow(0, 0, f));
    out.emplace_back(p + "mlp.up_proj.weight", l.gate_up_w.narrow(0, f, f));
    out.emplace_back(p + "mlp.down_proj.weight", l.down_w);
  }
  out.emplace_back("model.norm.weight", final_norm_);
  if (lm_head_.defined()) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

// ------------------------------------------------------------------ LoRA

torch::Tensor LlamaModel::ModuleWeight(const Layer& l, int module) const {
  const int64_t f = config_.ffn_dim;
  switch (module) {
    case 0:
      return l.qkv_w.narrow(0, 0, q_size_);
    case 1:
      return l.qkv_w.narrow(0, q_size_, kv_size_);
    case 2:
      return l.qkv_w.narrow(0, q_size_ + kv_size_, kv_size_);
    case 3:
      return l.o_w;
    case 4:
      return l.gate_up_w.narrow(0, 0, f);
    case 5:
      return l.gate_up_w.narrow(0, f, f);
    default:
      return l.down_w;
  }
}

torch::Tensor LlamaModel::WithLora(const Layer& l, Fused fused, const torch::Tensor& x,
                                   torch::Tensor y) const {
  if (merged_ || !config_.lora.enabled()) return y;
  static constexpr int kFirst[] = {0, 3, 4, 6}, kCount[] = {3, 1, 2, 1};
  const double p = config_.lora.dropout, scale = config_.lora.scale();
  const bool drop = p > 0 && is_training() && at::GradMode::is_enabled();
  int64_t offset = 0;
  for (int m = kFirst[fused]; m < kFirst[fused] + kCount[fused]; ++m) {
    const int64_t rows = ModuleWeight(l, m).size(0);
    if (l.lora_a[m].defined()) {
      // Into the module's output columns in place: autograd keeps only x and the rank-r
      // intermediate for backward, never an output-sized delta.
      at::Tensor low = at::linear(drop ? at::dropout(x, p, /*train=*/true) : x, l.lora_a[m]);
      y.narrow(-1, offset, rows).add_(at::linear(low, l.lora_b[m]), scale);
    }
    offset += rows;
  }
  return y;
}

NamedTensors LlamaModel::AdapterWeights() const {
  NamedTensors out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!layers_[i].lora_a[m].defined()) continue;
      out.emplace_back(LoraAdapterName(i, m, "lora_A"), layers_[i].lora_a[m]);
      out.emplace_back(LoraAdapterName(i, m, "lora_B"), layers_[i].lora_b[m]);
    }
  }
  return out;
}

NamedTensors LlamaModel::StateWeights() const {
  NamedTensors out = NamedWeights();
  for (auto& t : AdapterWeights()) out.push_back(std::move(t));
  return out;
}

NamedTensors LlamaModel::MergedWeights() const {
  NamedTensors out = NamedWeights();
  if (merged_ || !config_.lora.enabled()) return out;
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> merged;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!l.lora_a[m].defined()) continue;
      at::Tensor w = ModuleWeight(l, m);
      merged[fmt::format("model.layers.{}.{}.{}.weight", i, LoraModuleParent(m),
                         LoraModuleName(m))] =
          w + at::mm(l.lora_b[m], l.lora_a[m]) * config_.lora.scale();
    }
  }
  for (auto& [name, t] : out) {
    auto it = merged.find(name);
    if (it != merged.end()) t = it->second;
  }
  return out;
}

void LlamaModel::SetMerged(bool merged) {
  if (!config_.lora.enabled() || merged == merged_) return;
  torch::NoGradGuard no_grad;
  for (auto& l : layers_) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!l.lora_a[m].defined()) continue;
      if (merged) {
        l.lora_base[m] = ModuleWeight(l, m).clone();
      } else {
        ModuleWeight(l, m).copy_(l.lora_base[m]);  // the pure base again
        l.lora_base[m] = at::Tensor();
      }
    }
  }
  merged_ = merged;
  if (merged_) Remerge();
}

void LlamaModel::Remerge() {
  torch::NoGradGuard no_grad;
  const double scale = config_.lora.scale();
  for (auto& l : layers_) {
    for (int m = 0; m < kNumLoraModules; ++m) {
      if (!l.lora_a[m].defined()) continue;
      // W = base + scale * B A, computed into the live rows without a temporary of W's size.
      at::Tensor w = ModuleWeight(l, m);
      w.copy_(l.lora_base[m]);
      w.addmm_(l.lora_b[m], l.lora_a[m], /*beta=*/1.0, /*alpha=*/scale);
    }
  }
}

Status LlamaModel::LoadNamed(const NamedTensors& named, const LoadOptions& options) {
  NamedTensors mine = NamedWeights();
  const size_t num_base = mine.size();
  if (merged_) {
    // Base rows of targeted modules load into the private base copy; Remerge() folds them.
    std::unordered_map<std::string, at::Tensor> copies;
    for (size_t i = 0; i < layers_.size(); ++i)
      for (int m = 0; m < kNumLoraModules; ++m)
        if (layers_[i].lora_base[m].defined())
          copies[fmt::format("model.layers.{}.{}.{}.weight", i, LoraModuleParent(m),
                             LoraModuleName(m))] = layers_[i].lora_base[m];
    for (auto& [name, t] : mine) {
      auto it = copies.find(name);
      if (it != copies.end()) t = it->second;
    }
  }
  for (auto& t : AdapterWeights()) mine.push_back(std::move(t));
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < mine.size(); ++i) index.emplace(mine[i].first, i);
  std::vector<int> seen(mine.size(), 0);
  std::vector<std::pair<size_t, const at::Tensor*>> plan;
  const at::ScalarType want = ToTorchDType(config_.dtype);
  for (const auto& [name, t] : named) {
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    auto it = index.find(name);
    if (it == index.end()) {
      if (name == "lm_head.weight" && config_.tie_word_embeddings)
        return InvalidArgument(
            "tensor 'lm_head.weight' given but the model ties its output head to the embedding "
            "(tie_word_embeddings=true)");
      if (name.find(".lora_A.") != std::string::npos ||
          name.find(".lora_B.") != std::string::npos) {
        if (!config_.lora.enabled())
          return InvalidArgument(
              "tensor '{}' is a LoRA adapter but this model has no LoRA (set lora.rank and "
              "lora.target_modules to the learner's)",
              name);
        return InvalidArgument(
            "adapter tensor '{}' has no place in this model (its LoRA targets {}; the sender's "
            "lora.target_modules or layer count differ)",
            name, fmt::join(config_.lora.target_modules, ","));
      }
      return InvalidArgument("unexpected tensor '{}' (no such parameter in a model with {})", name,
                             config_.ToString());
    }
    if (seen[it->second]++) return InvalidArgument("tensor '{}' given twice", name);
    if (!t.defined()) return InvalidArgument("tensor '{}' is undefined", name);
    const at::Tensor& dst = mine[it->second].second;
    if (!t.sizes().equals(dst.sizes()))
      return InvalidArgument("tensor '{}' has shape {}, the model expects {}", name,
                             ShapeString(t.sizes()), ShapeString(dst.sizes()));
    if (t.scalar_type() != want) {
      if (!options.allow_dtype_cast || !at::isFloatingType(t.scalar_type()))
        return InvalidArgument("tensor '{}' has dtype {}, the model expects {}", name,
                               c10::toString(t.scalar_type()), c10::toString(want));
    }
    if (options.check_finite && at::isFloatingType(t.scalar_type()) && t.numel() > 0 &&
        !t.isfinite().all().item<bool>())
      return InvalidArgument("tensor '{}' holds NaN or Inf values", name);
    plan.emplace_back(it->second, &t);
  }
  bool any_base = false, any_adapter = false;
  for (size_t i = 0; i < mine.size(); ++i) (i < num_base ? any_base : any_adapter) |= seen[i] > 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (seen[i]) continue;
    const bool adapter = i >= num_base;
    if ((!adapter && options.require_all && (any_base || !any_adapter)) ||
        (adapter && (options.require_adapters || (options.require_all && any_adapter))))
      return NotFound("tensor '{}' is missing{}", mine[i].first,
                      adapter && !any_adapter ? " (the update carries no LoRA adapter; this "
                                                "model has lora " + config_.lora.ToString() + ")"
                                              : "");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [i, src] : plan) mine[i].second.copy_(*src);
  if (merged_ && !plan.empty()) Remerge();
  return Status::Ok();
}

Status LlamaModel::CheckTokens(const torch::Tensor& ids) const {
  if (!ids.defined()) return InvalidArgument("token ids are undefined");
  if (ids.dim() < 1 || ids.dim() > 2)
    return InvalidArgument("token ids must be 1-D or 2-D, got shape {}", ShapeString(ids.sizes()));
  if (at::isFloatingType(ids.scalar_type()) || ids.scalar_type() == at::kBool)
    return InvalidArgument("token ids must be integers, got {}", c10::toString(ids.scalar_type()));
  const int64_t len = ids.size(ids.dim() - 1);
  if (len < 1 || len > config_.max_seq_len)
    return InvalidArgument("sequence length {} outside [1, max_seq_len={}]", len,
                           config_.max_seq_len);
  at::Tensor flat = ids.reshape({-1}).to(at::kCPU, at::kLong);
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (p[i] < 0 || p[i] >= config_.vocab_size) {
      if (ids.dim() == 2)
        return InvalidArgument("token id {} at row {} position {} outside the vocabulary [0, {})",
                               p[i], i / len, i % len, config_.vocab_size);
      return InvalidArgument("token id {} at position {} outside the vocabulary [0, {})", p[i], i,
                             config_.vocab_size);
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ building blocks

torch::Tensor LlamaModel::RmsNorm(const torch::Tensor& x, const torch::Tensor& w) const {
  // As Hugging Face: normalise in float32, cast back, then scale.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_norm_eps);
  return normed.to(x.scalar_type()) * w;
}

torch::Tensor LlamaModel::Rope(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) const {
  // cos/sin broadcast against x[..., :half]; rotate-half convention.
  const int64_t half = head_dim_ / 2;
  // split, not two narrows: under autograd each narrow's backward fills a zero tensor of the
  // whole input and the two are summed; split's backward concatenates (the same gradient).
  const std::vector<at::Tensor> halves = x.to(at::kFloat).split(half, -1);
  const at::Tensor &x1 = halves[0], &x2 = halves[1];
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
}

torch::Tensor LlamaModel::Mlp(const Layer& layer, const torch::Tensor& x, bool fused) const {
  at::Tensor gu = WithLora(layer, kGateUp, x, at::linear(x, layer.gate_up_w));
  if (fused) {
    const at::Tensor act = cpu::SiluMulTrain(gu);
    return WithLora(layer, kDown, act, at::linear(act, layer.down_w));
  }
  const int64_t f = config_.ffn_dim;
  const std::vector<at::Tensor> gate_up = gu.split(f, -1);  // split: see Rope
  at::Tensor act = at::silu(gate_up[0]) * gate_up[1];
  return WithLora(layer, kDown, act, at::linear(act, layer.down_w));
}

torch::Tensor LlamaModel::Head(const torch::Tensor& x) const {
  return at::linear(x, lm_head_.defined() ? lm_head_ : embed_).to(at::kFloat);
}

namespace {

// Attention of q [B, T, H, hd] over k, v [B, S, Hkv, hd] with an additive float mask
// broadcastable to [B, Hkv, G, T, S]; returns [B, T, H * hd].
at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& mask, int64_t n_kv_heads) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), hd = q.size(3);
  const int64_t S = k.size(1), G = H / n_kv_heads;
  at::Tensor qh = q.view({B, T, n_kv_heads, G, hd})
                      .permute({0, 2, 3, 1, 4})
                      .reshape({B, n_kv_heads, G * T, hd});
  at::Tensor kh = k.permute({0, 2, 1, 3});
  at::Tensor vh = v.permute({0, 2, 1, 3});
  at::Tensor scores = at::matmul(qh, kh.transpose(-1, -2)).to(at::kFloat) *
                      (1.0 / std::sqrt(static_cast<double>(hd)));
  scores = scores.view({B, n_kv_heads, G, T, S});
  if (mask.defined()) scores = scores + mask;
  at::Tensor p = at::softmax(scores, -1).to(q.scalar_type()).view({B, n_kv_heads, G * T, S});
  return at::matmul(p, vh)
      .view({B, n_kv_heads, G, T, hd})
      .permute({0, 3, 1, 2, 4})
      .reshape({B, T, H * hd});
}

}  // namespace

torch::Tensor LlamaModel::RunLayers(torch::Tensor x, KvCache* cache, const torch::Tensor& slots) {
  const int64_t B = x.size(0), T = x.size(1), half = head_dim_ / 2;
  const int64_t H = config_.n_heads, Hkv = config_.n_kv_heads;
  at::Tensor cos = rope_cos_.narrow(0, 0, T).view({1, T, 1, half});
  at::Tensor sin = rope_sin_.narrow(0, 0, T).view({1, T, 1, half});
  at::Tensor mask;
  if (T > 1)
    mask = at::full({T, T}, -std::numeric_limits<float>::infinity(),
                    at::TensorOptions().dtype(at::kFloat).device(x.device()))
               .triu(1);
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& layer = layers_[li];
    at::Tensor h = RmsNorm(x, layer.input_norm);
    at::Tensor qkv = WithLora(layer, kQkv, h, at::linear(h, layer.qkv_w, layer.qkv_b));
    // split, not three narrows: see Rope (the learner trains through this path).
    const std::vector<at::Tensor> qkv_parts =
        at::split_with_sizes(qkv, {q_size_, kv_size_, kv_size_}, -1);
    at::Tensor q = qkv_parts[0].view({B, T, H, head_dim_});
    at::Tensor k = qkv_parts[1].view({B, T, Hkv, head_dim_});
    if (layer.q_norm.defined()) {
      q = RmsNorm(q, layer.q_norm);
      k = RmsNorm(k, layer.k_norm);
    }
    q = Rope(q, cos, sin);
    k = Rope(k, cos, sin);
    at::Tensor v = qkv_parts[2].view({B, T, Hkv, head_dim_});
    if (cache != nullptr) {
      cache->k(static_cast<int64_t>(li))
          .narrow(2, 0, T)
          .index_copy_(0, slots, k.permute({0, 2, 1, 3}));
      cache->v(static_cast<int64_t>(li))
          .narrow(2, 0, T)
          .index_copy_(0, slots, v.permute({0, 2, 1, 3}));
    }
    at::Tensor attn = Attend(q, k, v, mask, Hkv);
    x = x + WithLora(layer, kO, attn, at::linear(attn, layer.o_w));
    x = x + Mlp(layer, RmsNorm(x, layer.post_norm));
  }
  return x;
}

// ------------------------------------------------------------------ forward paths

torch::Tensor LlamaModel::ForwardHidden(const torch::Tensor& ids_in) {
  TORCH_CHECK(ids_in.dim() == 2, "Forward expects ids [B, T], got ", ids_in.sizes());
  const int64_t T = ids_in.size(1);
  TORCH_CHECK(T >= 1 && T <= config_.max_seq_len, "sequence length ", T,
              " outside [1, max_seq_len=", config_.max_seq_len, "]");
  at::Tensor ids = ids_in.to(embed_.device(), at::kLong);
  at::Tensor x = at::embedding(embed_, ids);
  x = RunLayers(x, nullptr, at::Tensor());
  return RmsNorm(x, final_norm_);
}

bool LlamaModel::FusedTrainingPath() const {
  return device().is_cpu() && config_.dtype == DType::kFloat32 && !config_.QkNorm();
}

torch::Tensor LlamaModel::ForwardHiddenRows(const torch::Tensor& ids_in,
                                            const torch::Tensor& lengths_in,
                                            const torch::Tensor& rows_in) {
  TORCH_CHECK(ids_in.dim() == 2, "ForwardHiddenRows expects ids [B, T], got ", ids_in.sizes());
  const int64_t B = ids_in.size(0), T = ids_in.size(1), d = config_.d_model;
  TORCH_CHECK(T >= 1 && T <= config_.max_seq_len, "sequence length ", T,
              " outside [1, max_seq_len=", config_.max_seq_len, "]");
  TORCH_CHECK(rows_in.dim() == 1, "ForwardHiddenRows expects rows [M], got ", rows_in.sizes());
  if (!FusedTrainingPath()) {  // on the device, no host-side checks (index_select checks)
    const at::Tensor hidden = ForwardHidden(ids_in);
    return hidden.reshape({B * T, d}).index_select(0, rows_in.to(hidden.device(), at::kLong));
  }
  const at::Tensor rows = rows_in.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> len(static_cast<size_t>(B), T);
  if (lengths_in.defined()) {
    TORCH_CHECK(lengths_in.dim() == 1 && lengths_in.size(0) == B,
                "ForwardHiddenRows expects lengths [", B, "], got ", lengths_in.sizes());
    const at::Tensor l = lengths_in.to(at::kCPU, at::kLong).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      len[static_cast<size_t>(b)] = l.data_ptr<int64_t>()[b];
      TORCH_CHECK(len[static_cast<size_t>(b)] >= 1 && len[static_cast<size_t>(b)] <= T,
                  "ForwardHiddenRows: length ", len[static_cast<size_t>(b)], " of row ", b,
                  " outside [1, ", T, "]");
    }
  }
  const int64_t M = rows.numel();
  const int64_t* rp = rows.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) {
    const int64_t b = rp[m] / T, t = rp[m] % T;
    TORCH_CHECK(rp[m] >= 0 && b < B && t < len[static_cast<size_t>(b)], "ForwardHiddenRows: row ",
                m, " asks for position ", rp[m], ", not a token of ids [", B, ", ", T,
                "] within its row's length");
  }
  // Pack: the tokens of row b are rows offsets[b] .. offsets[b+1]-1, at positions 0...
  at::Tensor offsets = at::empty({B + 1}, at::kLong);
  int64_t* op = offsets.data_ptr<int64_t>();
  op[0] = 0;
  for (int64_t b = 0; b < B; ++b) op[b + 1] = op[b] + len[static_cast<size_t>(b)];
  const int64_t N = op[B];
  at::Tensor keep = at::empty({N}, at::kLong), pick = at::empty({M}, at::kLong);
  int64_t* kp = keep.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < len[static_cast<size_t>(b)]; ++t) kp[op[b] + t] = b * T + t;
  for (int64_t m = 0; m < M; ++m) pick.data_ptr<int64_t>()[m] = op[rp[m] / T] + rp[m] % T;
  const at::Tensor ids = ids_in.to(at::kLong).reshape({B * T}).index_select(0, keep);
  at::Tensor x = at::embedding(embed_, ids);
  const double eps = config_.rms_norm_eps;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& layer = layers_[li];
    const at::Tensor h = cpu::RmsNormTrain(x, layer.input_norm, eps);
    const at::Tensor qkv = WithLora(layer, kQkv, h, at::linear(h, layer.qkv_w, layer.qkv_b));
    at::Tensor attn = cpu::PackedCausalAttentionTrain(
        qkv, offsets, rope_cos_, rope_sin_, config_.n_heads, config_.n_kv_heads, head_dim_);
    if (li + 1 == layers_.size()) {
      // Past the last attention nothing mixes positions: the rest runs at `rows` only.
      attn = attn.index_select(0, pick);
      x = x.index_select(0, pick);
    }
    x = x + WithLora(layer, kO, attn, at::linear(attn, layer.o_w));
    x = x + Mlp(layer, cpu::RmsNormTrain(x, layer.post_norm, eps), /*fused=*/true);
  }
  if (layers_.empty()) x = x.index_select(0, pick);
  return cpu::RmsNormTrain(x, final_norm_, eps);
}

torch::Tensor LlamaModel::HeadLogits(const torch::Tensor& hidden) const {
  return Head(hidden);
}

torch::Tensor LlamaModel::Forward(const torch::Tensor& ids_in) {
  return Head(ForwardHidden(ids_in));
}

torch::Tensor LlamaModel::Prefill(const torch::Tensor& ids, const torch::Tensor& lengths,
                                  const torch::Tensor& slots, KvCache& cache) {
  TORCH_CHECK(ids.dim() == 2, "Prefill expects ids [P, T], got ", ids.sizes());
  const int64_t P = ids.size(0), T = ids.size(1);
  TORCH_CHECK(T >= 1 && T <= cache.max_len() && T <= config_.max_seq_len, "prefill length ", T,
              " exceeds the cache length ", cache.max_len());
  TORCH_CHECK(lengths.numel() == P && slots.numel() == P);
  at::Tensor x = at::embedding(embed_, ids);
  x = RunLayers(x, &cache, slots);
  at::Tensor rows = at::arange(P, lengths.options()) * T + (lengths - 1);
  at::Tensor last = x.reshape({P * T, config_.d_model}).index_select(0, rows);
  return Head(RmsNorm(last, final_norm_));
}

torch::Tensor LlamaModel::Step(const torch::Tensor& tokens, const torch::Tensor& slots,
                               const torch::Tensor& positions, const torch::Tensor& logit_rows,
                               KvCache& cache, const torch::Tensor& copies) {
  const int64_t n = tokens.numel();
  TORCH_CHECK(n >= 1 && slots.numel() == n && positions.numel() == n, "Step: ", n, " tokens, ",
              slots.numel(), " slots, ", positions.numel(), " positions");
  TORCH_CHECK(embed_.device().is_cpu(), "Step runs on the CPU; use Prefill/Decode on ",
              embed_.device());
  const int64_t H = config_.n_heads, Hkv = config_.n_kv_heads;
  const double eps = config_.rms_norm_eps;
  at::Tensor x = embed_.index_select(0, tokens);
  at::Tensor attn = at::empty({n, q_size_}, x.options());
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& layer = layers_[li];
    at::Tensor h = cpu::RmsNormRows(x, layer.input_norm, eps);
    at::Tensor qkv = layer.qkv_b.defined() ? at::addmm(layer.qkv_b, h, layer.qkv_w.t())
                                           : at::mm(h, layer.qkv_w.t());
    qkv = WithLora(layer, kQkv, h, qkv).contiguous();
    cpu::PackedAttention(qkv, slots, positions, rope_cos_, rope_sin_,
                         cache.k(static_cast<int64_t>(li)), cache.v(static_cast<int64_t>(li)), H,
                         Hkv, head_dim_, attn, layer.q_norm, layer.k_norm, eps, copies);
    x = at::addmm(x, attn, layer.o_w.t());
    x = WithLora(layer, kO, attn, x);  // x + W attn + scale * B A attn
    h = cpu::RmsNormRows(x, layer.post_norm, eps);
    at::Tensor act =
        cpu::SiluMulRows(WithLora(layer, kGateUp, h, at::mm(h, layer.gate_up_w.t())).contiguous());
    x = WithLora(layer, kDown, act, at::addmm(x, act, layer.down_w.t()));
  }
  x = x.index_select(0, logit_rows);
  return Head(cpu::RmsNormRows(x, final_norm_, eps));
}

torch::Tensor LlamaModel::Decode(const torch::Tensor& tokens, const torch::Tensor& positions,
                                 int64_t attn_len, KvCache& cache, bool fused_cpu) {
  const int64_t n = tokens.numel();
  TORCH_CHECK(n >= 1 && n <= cache.num_slots() && positions.numel() == n, "decode of ", n,
              " rows with a cache of ", cache.num_slots(), " slots");
  TORCH_CHECK(attn_len >= 1 && attn_len <= cache.max_len());
  const int64_t H = config_.n_heads, Hkv = config_.n_kv_heads, half = head_dim_ / 2;
  at::Tensor x = embed_.index_select(0, tokens);
  if (fused_cpu && x.device().is_cpu()) {
    at::Tensor rows = at::arange(n, positions.options());
    return Step(tokens, rows, positions.contiguous(), rows, cache);
  }
  // Generic path (any device): plain torch ops.
  const int64_t G = H / Hkv;
  at::Tensor cos = rope_cos_.index_select(0, positions).view({n, 1, half});
  at::Tensor sin = rope_sin_.index_select(0, positions).view({n, 1, half});
  at::Tensor future =
      at::arange(attn_len, positions.options()).unsqueeze(0).gt(positions.unsqueeze(1));
  at::Tensor mask =
      at::zeros({n, attn_len}, at::TensorOptions().dtype(at::kFloat).device(x.device()))
          .masked_fill_(future, -std::numeric_limits<float>::infinity())
          .view({n, 1, 1, attn_len});
  at::Tensor rows = at::arange(n, positions.options());
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& layer = layers_[li];
    at::Tensor hn = RmsNorm(x, layer.input_norm);
    at::Tensor qkv = WithLora(layer, kQkv, hn, at::linear(hn, layer.qkv_w, layer.qkv_b));
    at::Tensor q = qkv.narrow(1, 0, q_size_).view({n, H, head_dim_});
    at::Tensor k = qkv.narrow(1, q_size_, kv_size_).view({n, Hkv, head_dim_});
    if (layer.q_norm.defined()) {
      q = RmsNorm(q, layer.q_norm);
      k = RmsNorm(k, layer.k_norm);
    }
    q = Rope(q, cos, sin);
    k = Rope(k, cos, sin);
    at::Tensor v = qkv.narrow(1, q_size_ + kv_size_, kv_size_).view({n, Hkv, head_dim_});
    at::Tensor kc = cache.k(static_cast<int64_t>(li)), vc = cache.v(static_cast<int64_t>(li));
    // [S, Hkv, L, hd] viewed as [S, L, Hkv, hd]: (slot, position) indexes one [Hkv, hd] row.
    kc.permute({0, 2, 1, 3}).index_put_({rows, positions}, k);
    vc.permute({0, 2, 1, 3}).index_put_({rows, positions}, v);
    at::Tensor K = kc.narrow(0, 0, n).narrow(2, 0, attn_len);
    at::Tensor V = vc.narrow(0, 0, n).narrow(2, 0, attn_len);
    at::Tensor scores =
        at::matmul(q.view({n, Hkv, G, head_dim_}), K.transpose(-1, -2)).to(at::kFloat) * scale;
    at::Tensor p = at::softmax(scores + mask, -1).to(x.scalar_type());
    at::Tensor attn = at::matmul(p, V).reshape({n, q_size_});
    x = x + WithLora(layer, kO, attn, at::linear(attn, layer.o_w));
    x = x + Mlp(layer, RmsNorm(x, layer.post_norm));
  }
  return Head(RmsNorm(x, final_norm_));
}

}  // namespace troupe::engine
