#!/usr/bin/python3
"""Python peer for the learner benchmark: one GRPO training step in plain PyTorch.

What an RL engineer writes in Python for the default job's learner: a
Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied
head), a right-padded batch, log_softmax + gather for the token log-probs, the
clipped on-policy objective with a token-mean over the loss mask, backward,
gradient clipping and AdamW. Same model and batch shapes as
bench/trainer/learner_bench.cc. Ends with one JSON line:
{"tokens_per_s": .., "step_s": .., "tokens_per_step": ..}

usage: torch_train_peer.py --layers 2 --d-model 128 --heads 4 --kv-heads 2 --ffn 384
       --vocab 32 --sequences 128 --prompt-min 8 --prompt-max 11 --response-min 2
       --response-max 8 --threads 1 --steps 20
"""
import argparse
import json
import math
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Decoder(nn.Module):
    def __init__(self, vocab, d, layers, heads, kv_heads, ffn, max_len=128):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.embed = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            m = nn.Module()
            m.n1 = nn.Parameter(torch.ones(d))
            m.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
            m.o = nn.Linear(heads * self.hd, d, bias=False)
            m.n2 = nn.Parameter(torch.ones(d))
            m.gate_up = nn.Linear(d, 2 * ffn, bias=False)
            m.down = nn.Linear(ffn, d, bias=False)
            self.layers.append(m)
        self.norm = nn.Parameter(torch.ones(d))
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.arange(max_len).float()[:, None] * inv[None]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(self, x, T):
        c, s = self.cos[:T], self.sin[:T]
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    def forward(self, ids):
        B, T = ids.shape
        x = self.embed[ids]
        for m in self.layers:
            y = self.rms(x, m.n1)
            q, k, v = m.qkv(y).split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
            q = self.rope(q.view(B, T, self.h, self.hd).transpose(1, 2), T)
            k = self.rope(k.view(B, T, self.kv, self.hd).transpose(1, 2), T)
            v = v.view(B, T, self.kv, self.hd).transpose(1, 2)
            rep = self.h // self.kv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            a = att.softmax(-1) @ v
            x = x + m.o(a.transpose(1, 2).reshape(B, T, -1))
            g, u = m.gate_up(self.rms(x, m.n2)).chunk(2, -1)
            x = x + m.down(F.silu(g) * u)
        return self.rms(x, self.norm) @ self.embed.T


def main():
    ap = argparse.ArgumentParser()
    for name, default in [("layers", 2), ("d-model", 128), ("heads", 4), ("kv-heads", 2),
                          ("ffn", 384), ("vocab", 32), ("sequences", 128), ("group", 8),
                          ("prompt-min", 8), ("prompt-max", 11), ("response-min", 2),
                          ("response-max", 8), ("threads", 1), ("steps", 20), ("warmup", 3)]:
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Decoder(a.vocab, a.d_model, a.layers, a.heads, a.kv_heads, a.ffn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def batch():
        seqs, mask_rows, n_tokens = [], [], 0
        for _ in range(a.sequences):
            p = rng.randint(a.prompt_min, a.prompt_max)
            r = rng.randint(a.response_min, a.response_max)
            seqs.append([rng.randrange(4, a.vocab) for _ in range(p + r)])
            mask_rows.append((p, r))
            n_tokens += p + r
        T = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), T, dtype=torch.long)
        mask = torch.zeros(len(seqs), T - 1)
        for i, (s, (p, r)) in enumerate(zip(seqs, mask_rows)):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, p - 1: p + r - 1] = 1.0
        rewards = torch.tensor([float(i % 2) for i in range(a.sequences)]).view(-1, a.group)
        adv = ((rewards - rewards.mean(1, keepdim=True)) /
               (rewards.std(1, keepdim=True) + 1e-6)).view(-1)
        return ids, mask, adv, n_tokens

    batches = [batch() for _ in range(4)]

    def step(b):
        ids, mask, adv, _ = b
        logits = model(ids[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None]).squeeze(2)
        ratio = torch.exp(logp - logp.detach())
        obj = torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.28) * adv[:, None])
        loss = -(obj * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for i in range(a.warmup):
        step(batches[i % len(batches)])
    tokens = 0
    t0 = time.perf_counter()
    for i in range(a.steps):
        b = batches[i % len(batches)]
        step(b)
        tokens += b[3]
    dt = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": tokens / dt, "step_s": dt / a.steps,
                      "tokens_per_step": tokens / a.steps}))


if __name__ == "__main__":
    main()
