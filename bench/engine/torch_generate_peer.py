#!/usr/bin/python3
"""Python peer for the engine benchmark: batched generation in plain PyTorch.

The loop an RL engineer would write in Python: a Llama-style decoder (RMSNorm,
RoPE, grouped-query attention, SwiGLU, tied head) with a torch.cat KV cache,
batched prefill, one decode step for the whole batch, multinomial sampling and
the behaviour log-prob of every sampled token. Same shapes as the C++ engine's
"default job" figure. Ends with one JSON line: {"tokens_per_s": .., "cpu_tokens_per_s": .., ...}: best of
--repeats runs, per wall-clock second and per CPU-second of the main thread (with one
thread and OPENBLAS_NUM_THREADS=1 all the work runs there).

usage: torch_generate_peer.py --layers 2 --d-model 128 --heads 4 --kv-heads 2 --ffn 384
       --vocab 32 --batch 128 --prompt-len 10 --new-tokens 8 --threads 1 --repeats 5
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("layers", 2), ("d-model", 128), ("heads", 4), ("kv-heads", 2),
                          ("ffn", 384), ("vocab", 32), ("batch", 128), ("prompt-len", 10),
                          ("new-tokens", 8), ("threads", 1), ("repeats", 5)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, H, Hkv, hd = a.d_model, a.heads, a.kv_heads, a.d_model // a.heads
    layers = []
    for _ in range(a.layers):
        layers.append(dict(
            n1=torch.ones(d), n2=torch.ones(d),
            q=torch.randn(H * hd, d) * 0.02, k=torch.randn(Hkv * hd, d) * 0.02,
            v=torch.randn(Hkv * hd, d) * 0.02, o=torch.randn(d, H * hd) * 0.02,
            g=torch.randn(a.ffn, d) * 0.02, u=torch.randn(a.ffn, d) * 0.02,
            dn=torch.randn(d, a.ffn) * 0.02))
    emb = torch.randn(a.vocab, d) * 0.02
    norm = torch.ones(d)
    max_len = a.prompt_len + a.new_tokens
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(max_len, dtype=torch.float32)[:, None] * inv
    cos_t, sin_t = ang.cos(), ang.sin()

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(x, start):  # x [B, h, T, hd]
        T = x.shape[2]
        c, s = cos_t[start:start + T], sin_t[start:start + T]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(ids, cache, start):
        B, T = ids.shape
        x = emb[ids]
        for i, L in enumerate(layers):
            y = rms(x, L["n1"])
            q = (y @ L["q"].T).view(B, T, H, hd).transpose(1, 2)
            k = (y @ L["k"].T).view(B, T, Hkv, hd).transpose(1, 2)
            v = (y @ L["v"].T).view(B, T, Hkv, hd).transpose(1, 2)
            q, k = rope(q, start), rope(k, start)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            kk = k.repeat_interleave(H // Hkv, 1)
            vv = v.repeat_interleave(H // Hkv, 1)
            att = F.scaled_dot_product_attention(q, kk, vv, is_causal=T > 1) if hasattr(
                F, "scaled_dot_product_attention") else None
            if att is None:
                sc = q @ kk.transpose(-1, -2) / hd ** 0.5
                if T > 1:
                    sc = sc + torch.full((T, T), float("-inf")).triu(1)
                att = sc.softmax(-1) @ vv
            x = x + att.transpose(1, 2).reshape(B, T, H * hd) @ L["o"].T
            y = rms(x, L["n2"])
            x = x + (F.silu(y @ L["g"].T) * (y @ L["u"].T)) @ L["dn"].T
        return rms(x[:, -1], norm) @ emb.T

    def generate():
        ids = torch.randint(3, a.vocab, (a.batch, a.prompt_len))
        cache = [None] * a.layers
        logits = forward(ids, cache, 0)
        out, lps = [], []
        for step in range(a.new_tokens):
            logp = F.log_softmax(logits.float(), -1)
            tok = torch.multinomial(logp.exp(), 1)
            out.append(tok)
            lps.append(logp.gather(-1, tok))
            if step + 1 < a.new_tokens:
                logits = forward(tok, cache, a.prompt_len + step)
        return torch.cat(out, 1), torch.cat(lps, 1)

    times, cpu = [], []
    with torch.inference_mode():
        generate()  # warm-up
        for _ in range(a.repeats):
            t0, c0 = time.perf_counter(), time.thread_time()
            generate()
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
    best = min(times)  # interference from other processes only ever adds time
    tokens = a.batch * a.new_tokens
    print(json.dumps({"tokens_per_s": tokens / best, "cpu_tokens_per_s": tokens / min(cpu),
                      "seconds": best,
                      "torch": torch.__version__, "threads": a.threads}))


if __name__ == "__main__":
    main()
