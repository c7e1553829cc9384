#!/usr/bin/python3
"""Independent PyTorch reference for Hugging Face Llama 3 / Qwen2 / Qwen3 checkpoints.

Written for Troupe's parity tests from the published model definitions (the Llama 3,
Qwen2 and Qwen3 papers/model cards and the math of Hugging Face's modeling files), not
from Troupe's code and not copied from transformers. Everything here is plain PyTorch plus
the standard library: its own safetensors reader and writer, its own forward pass in
float64.

  make   OUT --preset NAME [--layers L] [--vocab V] [--dtype bf16|fp32] [--shard-mb M]
              [--untied] [--seed S] [--tokens T]
         writes a Hugging Face folder with random weights and that preset's real
         configuration (config.json, generation_config.json, model.safetensors or shards
         with model.safetensors.index.json), plus OUT/reference/{tokens.json,logits.bin}:
         the reference logits (float32, [T, vocab]) of a fixed token sequence.
  check  DIR --against REF_DIR [--logits FILE]
         loads DIR (e.g. an export) and REF_DIR with its own reader: every tensor must be
         bit-identical (same dtype, shape and bytes) and the config must describe the
         same model; with --logits (float32 [T, vocab], tokens from REF_DIR/reference),
         those logits must match this script's forward of DIR within 1e-4.
  logits DIR --tokens JSON_LIST --out FILE [--adapter ADAPTER_DIR]
         the reference logits of DIR for the given tokens (with a PEFT LoRA adapter applied
         unmerged, from its adapter_config.json and adapter_model.safetensors).
  make-adapter OUT --base DIR [--r R] [--alpha A] [--targets q_proj,...] [--seed S]
         writes a PEFT LoRA adapter folder for DIR with random A and B.
  load   DIR  loads every tensor of DIR into float32 torch tensors (the benchmark's peer)
         and prints the seconds it took.

Presets (sizes of the published checkpoints; layers are cut down with --layers):
  qwen3-0.6b    Qwen3ForCausalLM: hidden 1024, 16 heads / 8 KV heads, head_dim 128 (!= 1024/16),
                per-head q/k RMSNorm, ffn 3072, vocab 151936, theta 1e6, eps 1e-6, tied
  llama3.2-1b   LlamaForCausalLM: hidden 2048, 32 / 8 heads, head_dim 64, ffn 8192, vocab
                128256, theta 5e5, eps 1e-5, rope_scaling llama3 (factor 32, low 1, high 4,
                original 8192), tied
  qwen2.5-0.5b  Qwen2ForCausalLM: hidden 896, 14 / 2 heads, head_dim 64, q/k/v biases, ffn
                4864, vocab 151936, theta 1e6, eps 1e-6, tied (--untied: a separate lm_head
                as in Qwen2.5-7B)
"""
import argparse
import json
import math
import mmap
import os
import struct
import sys

import torch

PRESETS = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936,
        "generation": {"bos_token_id": 151643, "do_sample": True,
                       "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                       "temperature": 0.6, "top_k": 20, "top_p": 0.95},
    },
    "llama3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
        "generation": {"bos_token_id": 128000, "do_sample": True,
                       "eos_token_id": [128001, 128008, 128009], "temperature": 0.6,
                       "top_p": 0.9},
    },
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 21, "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
        "generation": {"bos_token_id": 151643, "do_sample": True,
                       "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                       "repetition_penalty": 1.1, "temperature": 0.7, "top_k": 20,
                       "top_p": 0.8},
    },
}

# ------------------------------------------------------------------ safetensors

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
          "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    """{name: (dtype_name, shape, uint8 tensor of its bytes)} and the metadata of one file.
    The bytes are views over a private mapping of the file (nothing is read up front)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        size = os.fstat(f.fileno()).st_size
        blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    data = torch.frombuffer(blob, dtype=torch.uint8) if size > 8 + n else torch.empty(0, dtype=torch.uint8)
    data = data[8 + n:] if size > 8 + n else data
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], list(e["shape"]), data[b:end])
    return out, meta


def to_tensor(entry):
    dtype, shape, raw = entry
    if raw.numel() == 0:
        return torch.empty(shape, dtype=DTYPES[dtype])
    return raw.view(DTYPES[dtype]).reshape(shape)


def same_entry(a, b):
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, t in tensors:
        t = t.contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def load_folder(folder):
    """(config dict, {name: entry}) of a Hugging Face folder, sharded or not."""
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(folder, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = []
        for shard in index["weight_map"].values():
            if os.path.join(folder, shard) not in files:
                files.append(os.path.join(folder, shard))
    tensors = {}
    for path in files:
        t, _ = read_safetensors(path)
        for name in t:
            assert name not in tensors, "tensor %s twice" % name
        tensors.update(t)
        if len(files) > 1:
            for name in t:
                assert index["weight_map"][name] == os.path.basename(path), name
    return config, tensors

# ------------------------------------------------------------------ the model


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def inverse_frequencies(c):
    """RoPE inv_freq, with Llama 3.1's frequency-dependent scaling when configured."""
    hd = head_dim(c)
    theta = float(c.get("rope_theta", 10000.0))
    inv = [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]
    s = c.get("rope_scaling")
    if not s or s.get("rope_type", s.get("type")) in (None, "default"):
        return torch.tensor(inv, dtype=torch.float64)
    assert s.get("rope_type", s.get("type")) == "llama3"
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:        # high frequency: kept
            out.append(f)
        elif wavelen > old / low:       # low frequency: stretched by `factor`
            out.append(f / factor)
        else:                           # in between: linear blend in 1/wavelength
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rms_norm(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, cos, sin):
    """Rotate-half RoPE: pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(config, tensors, tokens, adapter=None):
    """float64 logits [T, vocab] of one sequence at positions 0..T-1. `adapter`: a PEFT LoRA
    adapter (read_adapter) applied unmerged, as PEFT's LoRA Linear layer does:
    y = x W^T + (lora_alpha / r) * (x A^T) B^T, on the modules in its target_modules."""
    c = config

    def lin(h, p, parent, module):
        y = h @ w(p + "%s.%s.weight" % (parent, module)).T
        if adapter is not None and module in adapter["target_modules"]:
            key = "base_model.model." + p + "%s.%s." % (parent, module)
            a = to_tensor(adapter["tensors"][key + "lora_A.weight"]).to(torch.float64)
            b = to_tensor(adapter["tensors"][key + "lora_B.weight"]).to(torch.float64)
            y = y + ((h @ a.T) @ b.T) * adapter["scale"]
        return y

    kind = c["model_type"]
    w = lambda name: to_tensor(tensors[name]).to(torch.float64)
    raw = lambda name: to_tensor(tensors[name])
    eps = float(c.get("rms_norm_eps", 1e-6))
    H, Hkv, hd = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), head_dim(c)
    T = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long)
    x = raw("model.embed_tokens.weight")[ids].to(torch.float64)
    pos = torch.arange(T, dtype=torch.float64)
    angles = pos[:, None] * inverse_frequencies(c)[None, :]         # [T, hd/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]   # broadcast over heads
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    biased = kind == "qwen2" or c.get("attention_bias", False)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        h = rms_norm(x, w(p + "input_layernorm.weight"), eps)
        proj = {}
        for name in ("q", "k", "v"):
            y = lin(h, p, "self_attn", name + "_proj")
            if biased:
                y = y + w(p + "self_attn.%s_proj.bias" % name)
            proj[name] = y
        q = proj["q"].view(T, H, hd)
        k = proj["k"].view(T, Hkv, hd)
        v = proj["v"].view(T, Hkv, hd)
        if kind == "qwen3":   # per-head RMSNorm of queries and keys, before RoPE
            q = rms_norm(q, w(p + "self_attn.q_norm.weight"), eps)
            k = rms_norm(k, w(p + "self_attn.k_norm.weight"), eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = H // Hkv
        out = torch.empty(T, H, hd, dtype=torch.float64)
        for head in range(H):
            kv = head // group       # query head h reads KV head h // (H / Hkv)
            scores = q[:, head, :] @ k[:, kv, :].T / math.sqrt(hd) + causal
            out[:, head, :] = torch.softmax(scores, dim=-1) @ v[:, kv, :]
        x = x + lin(out.reshape(T, H * hd), p, "self_attn", "o_proj")
        h = rms_norm(x, w(p + "post_attention_layernorm.weight"), eps)
        gate = lin(h, p, "mlp", "gate_proj")
        up = lin(h, p, "mlp", "up_proj")
        x = x + lin(gate * torch.sigmoid(gate) * up, p, "mlp", "down_proj")
    x = rms_norm(x, w("model.norm.weight"), eps)
    head = raw("model.embed_tokens.weight" if c.get("tie_word_embeddings", False) else "lm_head.weight")
    rows = 16384   # the output head in slices: never a float64 copy of a 151k-row matrix
    return torch.cat([x @ head[r:r + rows].to(torch.float64).T for r in range(0, head.shape[0], rows)], dim=1)

# ------------------------------------------------------------------ commands


def random_tensors(c, seed, dtype):
    """HF-named random weights: matrices N(0, 0.02), norms 1 + N(0, 0.1), biases N(0, 0.1).
    Norm weights and biases are not left at their usual init (ones, zeros) so that a
    forward pass ignoring them would be caught."""
    g = torch.Generator().manual_seed(seed)
    d, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    out = []

    def mat(name, rows, cols):
        out.append((name, (torch.randn(rows, cols, generator=g) * 0.02).to(dtype)))

    def vec(name, n, base, scale):
        out.append((name, (base + torch.randn(n, generator=g) * scale).to(dtype)))

    mat("model.embed_tokens.weight", V, d)
    biased = c["model_type"] == "qwen2" or c.get("attention_bias", False)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        vec(p + "input_layernorm.weight", d, 1.0, 0.1)
        mat(p + "self_attn.q_proj.weight", H * hd, d)
        mat(p + "self_attn.k_proj.weight", Hkv * hd, d)
        mat(p + "self_attn.v_proj.weight", Hkv * hd, d)
        if biased:
            vec(p + "self_attn.q_proj.bias", H * hd, 0.0, 0.1)
            vec(p + "self_attn.k_proj.bias", Hkv * hd, 0.0, 0.1)
            vec(p + "self_attn.v_proj.bias", Hkv * hd, 0.0, 0.1)
        mat(p + "self_attn.o_proj.weight", d, H * hd)
        if c["model_type"] == "qwen3":
            vec(p + "self_attn.q_norm.weight", hd, 1.0, 0.1)
            vec(p + "self_attn.k_norm.weight", hd, 1.0, 0.1)
        vec(p + "post_attention_layernorm.weight", d, 1.0, 0.1)
        mat(p + "mlp.gate_proj.weight", F, d)
        mat(p + "mlp.up_proj.weight", F, d)
        mat(p + "mlp.down_proj.weight", d, F)
    vec("model.norm.weight", d, 1.0, 0.1)
    if not c["tie_word_embeddings"]:
        mat("lm_head.weight", V, d)
    return out


def write_logits(path, logits):
    with open(path, "wb") as f:
        f.write(logits.to(torch.float32).contiguous().numpy().tobytes())


def cmd_make(a):
    preset = dict(PRESETS[a.preset])
    generation = preset.pop("generation")
    c = preset
    if a.layers:
        c["num_hidden_layers"] = a.layers
        if "max_window_layers" in c:
            c["max_window_layers"] = a.layers
    if a.vocab:
        c["vocab_size"] = a.vocab
        generation = {k: v for k, v in generation.items() if not k.endswith("token_id")}
        generation["eos_token_id"] = [a.vocab - 1, a.vocab - 2]
        generation["bos_token_id"] = 0
        c["bos_token_id"], c["eos_token_id"] = 0, a.vocab - 1
    if a.untied:
        c["tie_word_embeddings"] = False
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    c["torch_dtype"] = {"bf16": "bfloat16", "fp32": "float32"}[a.dtype]
    tensors = random_tensors(c, a.seed, dtype)
    os.makedirs(os.path.join(a.out, "reference"), exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2, sort_keys=True)
    meta = {"format": "pt", "writer": "hf_reference.py"}
    limit = a.shard_mb * (1 << 20) if a.shard_mb else None
    if limit is None:
        write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, meta)
    else:
        shards, cur, size = [], [], 0
        for name, t in tensors:
            n = t.numel() * t.element_size()
            if cur and size + n > limit:
                shards.append(cur)
                cur, size = [], 0
            cur.append((name, t))
            size += n
        shards.append(cur)
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
            write_safetensors(os.path.join(a.out, fname), shard, meta)
            for name, t in shard:
                weight_map[name] = fname
                total += t.numel() * t.element_size()
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if a.no_reference:
        print("hf_reference: wrote %s (%s, %d tensors, %d shards, no reference logits)" % (
            a.out, a.preset, len(tensors), 1 if limit is None else len(shards)))
        return
    g = torch.Generator().manual_seed(a.seed + 1)
    tokens = torch.randint(0, c["vocab_size"], (a.tokens,), generator=g).tolist()
    config, loaded = load_folder(a.out)
    logits = forward(config, loaded, tokens)
    with open(os.path.join(a.out, "reference", "tokens.json"), "w") as f:
        json.dump({"tokens": tokens, "vocab_size": c["vocab_size"]}, f)
    write_logits(os.path.join(a.out, "reference", "logits.bin"), logits)
    print("hf_reference: wrote %s (%s, %d tensors, %d shards)" % (
        a.out, a.preset, len(tensors), 1 if limit is None else len(shards)))


def same_model(a, b):
    """The keys that decide the forward pass agree."""
    keys = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "rope_theta",
            "rms_norm_eps", "tie_word_embeddings"]
    for k in keys:
        if a.get(k) != b.get(k) and not (isinstance(a.get(k), (int, float)) and
                                         float(a.get(k)) == float(b.get(k))):
            return "config %s: %r vs %r" % (k, a.get(k), b.get(k))
    if head_dim(a) != head_dim(b):
        return "head_dim %d vs %d" % (head_dim(a), head_dim(b))
    if not torch.equal(inverse_frequencies(a), inverse_frequencies(b)):
        return "rope frequencies differ (rope_scaling %r vs %r)" % (
            a.get("rope_scaling"), b.get("rope_scaling"))
    return None


def cmd_check(a):
    config, tensors = load_folder(a.dir)
    ref_config, ref_tensors = load_folder(a.against)
    problem = same_model(config, ref_config)
    if problem:
        sys.exit("hf_reference check: " + problem)
    if sorted(tensors) != sorted(ref_tensors):
        sys.exit("hf_reference check: tensor names differ: %s" %
                 sorted(set(tensors) ^ set(ref_tensors))[:5])
    for name in tensors:
        if not same_entry(tensors[name], ref_tensors[name]):
            sys.exit("hf_reference check: tensor %s differs (dtype/shape/bytes)" % name)
    msg = "%d tensors bit-identical" % len(tensors)
    if a.logits:
        with open(os.path.join(a.against, "reference", "tokens.json")) as f:
            tokens = json.load(f)["tokens"]
        with open(a.logits, "rb") as f:
            got = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
        want = forward(config, tensors, tokens).to(torch.float32)
        got = got.reshape(want.shape)
        diff = (got - want).abs().max().item()
        if not diff <= 1e-4:
            sys.exit("hf_reference check: logits differ by %g (limit 1e-4)" % diff)
        msg += ", logits within %.2e" % diff
    print("hf_reference check: " + msg)


def cmd_load(a):
    import time
    t0 = time.perf_counter()
    _, tensors = load_folder(a.dir)
    loaded = {name: to_tensor(e).to(torch.float32) for name, e in tensors.items()}
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "tensors": len(loaded),
                      "parameters": sum(t.numel() for t in loaded.values())}))


def cmd_logits(a):
    config, tensors = load_folder(a.dir)
    adapter = read_adapter(a.adapter) if a.adapter else None
    write_logits(a.out, forward(config, tensors, json.loads(a.tokens), adapter))


# ------------------------------------------------------------------ PEFT LoRA adapters
# Written from PEFT's published format (adapter_config.json keys, tensor names
# base_model.model.<module path>.lora_A.weight / lora_B.weight) and the LoRA paper's math.

LORA_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def read_adapter(folder):
    with open(os.path.join(folder, "adapter_config.json")) as f:
        c = json.load(f)
    assert c["peft_type"] == "LORA", c["peft_type"]
    for key, default in (("use_rslora", False), ("use_dora", False), ("fan_in_fan_out", False),
                         ("bias", "none")):
        assert c.get(key, default) == default, "%s = %r" % (key, c[key])
    tensors, _ = read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    return {"target_modules": set(c["target_modules"]), "scale": c["lora_alpha"] / c["r"],
            "r": c["r"], "tensors": tensors}


def cmd_make_adapter(a):
    """A PEFT adapter for DIR with random A and B (B non-zero, unlike a fresh adapter, so
    that a forward ignoring it is caught)."""
    config, _ = load_folder(a.base)
    c = config
    hd = head_dim(c)
    q, kv = c["num_attention_heads"] * hd, c.get("num_key_value_heads", c["num_attention_heads"]) * hd
    d, f = c["hidden_size"], c["intermediate_size"]
    dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
    targets = a.targets.split(",")
    g = torch.Generator().manual_seed(a.seed)
    out = []
    for layer in range(c["num_hidden_layers"]):
        for m in LORA_MODULES:
            if m not in targets:
                continue
            fan_in, fan_out = dims[m]
            key = "base_model.model.model.layers.%d.%s.%s." % (layer, LORA_MODULES[m], m)
            bound = 1.0 / math.sqrt(fan_in)
            out.append((key + "lora_A.weight", (torch.rand(a.r, fan_in, generator=g) * 2 - 1) * bound))
            out.append((key + "lora_B.weight", torch.randn(fan_out, a.r, generator=g) * 0.05))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "adapter_model.safetensors"), out, {"format": "pt"})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.r, "lora_alpha": a.alpha,
           "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
           "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
           "base_model_name_or_path": os.path.abspath(a.base), "modules_to_save": None,
           "init_lora_weights": True, "inference_mode": True}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--preset", required=True, choices=sorted(PRESETS))
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--vocab", type=int, default=0)
    m.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    m.add_argument("--shard-mb", type=int, default=0)
    m.add_argument("--untied", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--tokens", type=int, default=24)
    m.add_argument("--no-reference", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--against", required=True)
    c.add_argument("--logits")
    l = sub.add_parser("logits")
    l.add_argument("dir")
    l.add_argument("--tokens", required=True)
    l.add_argument("--out", required=True)
    l.add_argument("--adapter", default="")
    ld = sub.add_parser("load")
    ld.add_argument("dir")
    ma = sub.add_parser("make-adapter")
    ma.add_argument("out")
    ma.add_argument("--base", required=True)
    ma.add_argument("--r", type=int, default=8)
    ma.add_argument("--alpha", type=float, default=16)
    ma.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ma.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    {"make": cmd_make, "check": cmd_check, "logits": cmd_logits, "load": cmd_load,
     "make-adapter": cmd_make_adapter}[a.cmd](a)


if __name__ == "__main__":
    main()
