#!/usr/bin/env python3
"""Independent safetensors writer (standard library only) for the engine tests.

Writes a small random Llama/Qwen2-style checkpoint the way Hugging Face lays it
out -- model.safetensors with HF parameter names, plus config.json -- and dumps
every tensor's values (as the float each stored element represents) to
values.json, so the C++ reader can be checked against a writer that shares no
code with it.

It also runs a from-scratch reference forward pass (double precision, written
from the Hugging Face Llama/Qwen2 definitions: RMSNorm, rotate-half RoPE,
repeat_kv grouped-query attention, SwiGLU) over a fixed token sequence and
dumps the logits to reference.json, which checks the C++ model's math, not just
the file format.

usage: write_safetensors.py OUT_DIR [--seed N] [--qwen2]
Tensors use mixed dtypes on purpose: matrices F32, norms BF16, biases F16.
"""
import math
import json
import os
import random
import struct
import sys


def bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bits."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def encode(dtype, values):
    """Returns (bytes, the float value each element stores)."""
    if dtype == "F32":
        data = struct.pack("<%df" % len(values), *values)
        return data, list(struct.unpack("<%df" % len(values), data))
    if dtype == "F16":
        data = struct.pack("<%de" % len(values), *values)
        return data, list(struct.unpack("<%de" % len(values), data))
    if dtype == "BF16":
        bits = [bf16_bits(v) for v in values]
        return struct.pack("<%dH" % len(bits), *bits), [bf16_value(b) for b in bits]
    raise ValueError(dtype)


def reference_forward(w, cfg, tokens, qwen2):
    """Logits [T][V] of a Llama/Qwen2 decoder over `tokens` (positions 0..T-1)."""
    d, H, Hkv, hd = cfg["d"], cfg["heads"], cfg["kv_heads"], cfg["d"] // cfg["heads"]
    eps, theta, half, group = 1e-6, 10000.0, hd // 2, H // Hkv

    def mat(name):
        rows, cols = w[name]["shape"]
        v = w[name]["values"]
        return [v[r * cols:(r + 1) * cols] for r in range(rows)]

    def linear(x, name, bias=None):
        out = [sum(a * b for a, b in zip(row, x)) for row in mat(name)]
        if bias is not None:
            out = [o + b for o, b in zip(out, w[bias]["values"])]
        return out

    def rmsnorm(x, name):
        inv = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        return [g * v * inv for g, v in zip(w[name]["values"], x)]

    def rope(vec, pos):
        out = list(vec)
        for i in range(half):
            ang = pos * (1.0 / theta ** (2 * i / hd))
            c, s = math.cos(ang), math.sin(ang)
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    xs = [list(mat("model.embed_tokens.weight")[t]) for t in tokens]
    for layer in range(cfg["layers"]):
        p = "model.layers.%d." % layer
        qs, ks, vs = [], [], []
        for pos, x in enumerate(xs):
            h = rmsnorm(x, p + "input_layernorm.weight")
            b = (lambda n: p + "self_attn.%s_proj.bias" % n) if qwen2 else (lambda n: None)
            q = linear(h, p + "self_attn.q_proj.weight", b("q"))
            k = linear(h, p + "self_attn.k_proj.weight", b("k"))
            v = linear(h, p + "self_attn.v_proj.weight", b("v"))
            qs.append([rope(q[i * hd:(i + 1) * hd], pos) for i in range(H)])
            ks.append([rope(k[i * hd:(i + 1) * hd], pos) for i in range(Hkv)])
            vs.append([v[i * hd:(i + 1) * hd] for i in range(Hkv)])
        new_xs = []
        for t, x in enumerate(xs):
            attn = []
            for h in range(H):
                kvh = h // group  # repeat_kv: KV head j serves query heads j*G .. j*G+G-1
                scores = [sum(a * b for a, b in zip(qs[t][h], ks[u][kvh])) / math.sqrt(hd)
                          for u in range(t + 1)]
                m = max(scores)
                e = [math.exp(s - m) for s in scores]
                z = sum(e)
                attn += [sum(e[u] / z * vs[u][kvh][i] for u in range(t + 1)) for i in range(hd)]
            x = [a + b for a, b in zip(x, linear(attn, p + "self_attn.o_proj.weight"))]
            h = rmsnorm(x, p + "post_attention_layernorm.weight")
            g = linear(h, p + "mlp.gate_proj.weight")
            u = linear(h, p + "mlp.up_proj.weight")
            act = [gi / (1.0 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
            new_xs.append([a + b for a, b in zip(x, linear(act, p + "mlp.down_proj.weight"))])
        xs = new_xs
    return [linear(rmsnorm(x, "model.norm.weight"), "lm_head.weight") for x in xs]


def main():
    out_dir = sys.argv[1]
    seed = 7
    qwen2 = "--qwen2" in sys.argv
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
    rng = random.Random(seed)
    cfg = dict(vocab=19, d=16, layers=2, heads=4, kv_heads=2, ffn=24, max_pos=64)
    hd = cfg["d"] // cfg["heads"]
    q, kv = cfg["heads"] * hd, cfg["kv_heads"] * hd

    tensors = []  # (name, dtype, shape)
    tensors.append(("model.embed_tokens.weight", "F32", [cfg["vocab"], cfg["d"]]))
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        tensors.append((p + "input_layernorm.weight", "BF16", [cfg["d"]]))
        tensors.append((p + "self_attn.q_proj.weight", "F32", [q, cfg["d"]]))
        tensors.append((p + "self_attn.k_proj.weight", "F32", [kv, cfg["d"]]))
        tensors.append((p + "self_attn.v_proj.weight", "F32", [kv, cfg["d"]]))
        if qwen2:
            tensors.append((p + "self_attn.q_proj.bias", "F16", [q]))
            tensors.append((p + "self_attn.k_proj.bias", "F16", [kv]))
            tensors.append((p + "self_attn.v_proj.bias", "F16", [kv]))
        tensors.append((p + "self_attn.o_proj.weight", "F32", [cfg["d"], q]))
        tensors.append((p + "post_attention_layernorm.weight", "BF16", [cfg["d"]]))
        tensors.append((p + "mlp.gate_proj.weight", "F32", [cfg["ffn"], cfg["d"]]))
        tensors.append((p + "mlp.up_proj.weight", "F32", [cfg["ffn"], cfg["d"]]))
        tensors.append((p + "mlp.down_proj.weight", "F32", [cfg["d"], cfg["ffn"]]))
    tensors.append(("model.norm.weight", "BF16", [cfg["d"]]))
    tensors.append(("lm_head.weight", "F32", [cfg["vocab"], cfg["d"]]))  # untied

    header, blobs, dumped, offset = {}, [], {}, 0
    # Store in reverse name order so file order differs from the model's order.
    for name, dtype, shape in sorted(tensors, key=lambda t: t[0], reverse=True):
        n = 1
        for s in shape:
            n *= s
        if name.endswith("norm.weight"):
            values = [1.0 + rng.uniform(-0.2, 0.2) for _ in range(n)]
        else:
            values = [rng.gauss(0.0, 0.3) for _ in range(n)]
        data, stored = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        dumped[name] = {"dtype": dtype, "shape": shape, "values": stored}
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "writer": "write_safetensors.py"}
    hjson = json.dumps(header).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    with open(os.path.join(out_dir, "values.json"), "w") as f:
        json.dump(dumped, f)
    tokens = [1, 5, 3, 7, 2, 11, 18, 0]
    logits = reference_forward(dumped, cfg, tokens, qwen2)
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump({"tokens": tokens, "logits": logits}, f)
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "vocab_size": cfg["vocab"],
        "hidden_size": cfg["d"],
        "num_hidden_layers": cfg["layers"],
        "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"],
        "intermediate_size": cfg["ffn"],
        "max_position_embeddings": cfg["max_pos"],
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


if __name__ == "__main__":
    main()
