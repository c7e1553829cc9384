#!/usr/bin/python3
"""The Python peer for Troupe's default job: a plain single-process PyTorch GRPO loop.

Same task (reverse a lowercase string of 3-6 letters, character tokenizer,
exact-match reward, 200 held-out prompts), same model size (Llama-style, 2
layers, d_model 128, 4 heads), same batch shape (16 prompts x 8 samples), a
supervised warm start, then on-policy GRPO. It is the obvious alternative an
RL engineer would write, with a KV cache for generation. It prints the
held-out accuracy curve and ends with one JSON line:
{"warm_acc":..,"t90_s":..,"t95_s":..,"t100_s":..,"gen_tok_s":..,"train_tok_s":..}
(times measured from the end of the warm start).

It runs at its best on the same 2 cores Troupe uses: --threads 2 intra-op
threads (default) with OMP_WAIT_POLICY=PASSIVE, AdamW betas (0.9, 0.99), PPO
clip 0.2/0.28, gradient clip 1.0, token-level mean over the tokens of groups
whose rewards differ (uniform groups carry no gradient and are skipped, an
update with none is skipped), one on-policy update per batch. The recipe's
remaining knobs (lr, negative-advantage scale, skipping) were picked by the
sweep bench/reference/sweep_grpo_reverse.py (results in README).

Usage: /usr/bin/python3 bench/reference/grpo_reverse.py [--seed N] [--max-seconds S] [--threads T]
Needs Debian's python3-torch (scripts/install-deps.sh installs it).
"""
import argparse, json, math, os, random, string, time
# libgomp reads its wait policy when torch starts its thread pool: set it before importing torch
# (spinning OpenMP threads would steal the core the other loop half needs).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, BOS, EOS, SEP = 0, 1, 2, 3
LETTERS = string.ascii_lowercase
VOCAB = 4 + len(LETTERS)
def enc(s): return [4 + LETTERS.index(c) for c in s]
def dec(ids): return "".join(LETTERS[i - 4] for i in ids if i >= 4)

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__(); self.w = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w

def rope(x, pos, theta=10000.0):
    # x: [B,H,T,D], pos: [T] or [B,T]
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [...,T,D/2]
    if ang.dim() == 2: ang = ang[None, None]
    else: ang = ang[:, None]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

class Block(nn.Module):
    def __init__(self, d, h, ffn):
        super().__init__()
        self.h = h; self.hd = d // h
        self.n1 = RMSNorm(d); self.n2 = RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False); self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False); self.o = nn.Linear(d, d, bias=False)
        self.g = nn.Linear(d, ffn, bias=False); self.u = nn.Linear(d, ffn, bias=False)
        self.dn = nn.Linear(ffn, d, bias=False)
    def forward(self, x, pos, cache=None, mask=None):
        B, T, _ = x.shape
        y = self.n1(x)
        q = self.q(y).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(B, T, self.h, self.hd).transpose(1, 2)
        v = self.v(y).view(B, T, self.h, self.hd).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], 2); v = torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask) if hasattr(F, "scaled_dot_product_attention") else None
        if a is None:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            if mask is not None: s = s.masked_fill(~mask, float("-inf"))
            a = s.softmax(-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        y = self.n2(x)
        return x + self.dn(F.silu(self.g(y)) * self.u(y))

class Model(nn.Module):
    def __init__(self, d=128, layers=2, heads=4, ffn=352):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList([Block(d, heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(d)
        for n, p in self.named_parameters():  # Llama-style init: N(0, 0.02), norms at 1
            if p.dim() == 2: nn.init.normal_(p, std=0.02)
    def forward(self, ids, pos=None, caches=None, mask=None):
        B, T = ids.shape
        if pos is None: pos = torch.arange(T)
        if mask is None and caches is None:
            mask = torch.ones(T, T, dtype=torch.bool).tril()
        x = self.emb(ids)
        for i, b in enumerate(self.blocks):
            x = b(x, pos, None if caches is None else caches[i], mask)
        return self.norm(x) @ self.emb.weight.T

def make_prompts(rng, n, exclude=None):
    out, seen = [], set(exclude or ())
    while len(out) < n:
        s = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
        if s in seen: continue
        seen.add(s); out.append(s)
    return out

def prompt_ids(s): return [BOS] + enc(s) + [SEP]

@torch.no_grad()
def generate(model, prompts, max_new=8, temperature=1.0, greedy=False, gen=None):
    """Left-aligned prompts of equal length per call are not guaranteed; we left-pad."""
    model.eval()
    B = len(prompts)
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P), PAD, dtype=torch.long)
    valid = torch.zeros(B, P, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p); valid[i, P - len(p):] = True
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    caches = [dict() for _ in model.blocks]
    eye = torch.eye(P, dtype=torch.bool)[None]
    mask = ((torch.ones(P, P, dtype=torch.bool).tril()[None] & valid[:, None, :]) | eye)[:, None]  # pad rows see themselves (no NaN)
    logits = model(ids, pos, caches, mask)[:, -1]
    out = torch.full((B, max_new), PAD, dtype=torch.long)
    logps = torch.zeros(B, max_new)
    done = torch.zeros(B, dtype=torch.bool)
    cur_pos = pos[:, -1]
    key_valid = valid
    for t in range(max_new):
        if greedy:
            tok = logits.argmax(-1)
            lp = torch.zeros(B)
        else:
            lsm = torch.log_softmax(logits / temperature, -1)
            tok = torch.multinomial(lsm.exp(), 1, generator=gen).squeeze(1)
            lp = lsm.gather(1, tok[:, None]).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        out[:, t] = tok; logps[:, t] = torch.where(done, torch.zeros_like(lp), lp)
        done = done | (tok == EOS)
        if bool(done.all()): break
        cur_pos = cur_pos + 1
        key_valid = torch.cat([key_valid, torch.ones(B, 1, dtype=torch.bool)], 1)
        logits = model(tok[:, None], cur_pos[:, None], caches, key_valid[:, None, None, :])[:, -1]
    model.train()
    return out, logps

def response_lists(out):
    res = []
    for row in out.tolist():
        r = []
        for t in row:
            if t == PAD: break
            r.append(t)
            if t == EOS: break
        res.append(r)
    return res

def evaluate(model, prompts):
    out, _ = generate(model, [prompt_ids(p) for p in prompts], greedy=True)
    rs = response_lists(out)
    return sum(1 for p, r in zip(prompts, rs) if r == enc(p[::-1]) + [EOS]) / len(prompts)

def pack(prompts_ids, responses):
    """Right-padded [B,T] with targets and loss mask over response tokens."""
    seqs = [p + r for p, r in zip(prompts_ids, responses)]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), PAD, dtype=torch.long)
    mask = torch.zeros(len(seqs), T - 1)
    for i, (p, r) in enumerate(zip(prompts_ids, responses)):
        s = p + r
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p) - 1 : len(s) - 1] = 1.0
    return ids, mask

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-steps", type=int, default=100)
    ap.add_argument("--warm-batch", type=int, default=64)
    ap.add_argument("--warm-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many updates (0: no limit)")
    ap.add_argument("--target", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--adv", choices=["grpo", "dr_grpo"], default="grpo")
    ap.add_argument("--neg-scale", type=float, default=1.0, help="multiplies negative advantages")
    ap.add_argument("--warmup", type=int, default=0, help="linear lr warmup updates")
    ap.add_argument("--beta2", type=float, default=0.99, help="AdamW beta2 of the RL updates")
    ap.add_argument("--clip-low", type=float, default=0.2)
    ap.add_argument("--clip-high", type=float, default=0.28)
    ap.add_argument("--skip-uniform", type=int, choices=[0, 1], default=1,
                    help="1: tokens of uniform-reward groups leave the token mean (and an update with "
                         "no informative group is skipped)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (Troupe's job uses 2 cores)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed); rng = random.Random(a.seed)
    held = make_prompts(random.Random(12345), 200)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=a.warm_lr, weight_decay=0.0)
    # Warm start: supervised on correct demonstrations.
    for step in range(a.warm_steps):
        ps = make_prompts(rng, a.warm_batch, exclude=held)
        ids, mask = pack([prompt_ids(p) for p in ps], [enc(p[::-1]) + [EOS] for p in ps])
        logits = model(ids)[:, :-1]
        loss = (F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none") * mask.reshape(-1)).sum() / mask.sum()
        opt.zero_grad(); loss.backward(); opt.step()
    warm = evaluate(model, held)
    print(f"warm start: {a.warm_steps} steps, held-out exact match {warm:.3f}", flush=True)
    # RL starts with fresh AdamW moments, as the C++ learner does by default.
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, a.beta2), weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    t0 = time.time(); gen_t = train_t = 0.0; gen_tok = train_tok = 0
    marks = {}
    step = 0
    skipped = 0
    best = warm
    steps_at = {}
    while time.time() - t0 < a.max_seconds and (a.max_steps <= 0 or step < a.max_steps):
        ps = make_prompts(rng, a.prompts, exclude=held)
        pids = [prompt_ids(p) for p in ps for _ in range(a.samples)]
        tg = time.time()
        out, blp = generate(model, pids, temperature=a.temperature, gen=gen)
        gen_t += time.time() - tg
        rs = response_lists(out)
        gen_tok += sum(len(r) for r in rs)
        rewards = torch.tensor([1.0 if r == enc(ps[i // a.samples][::-1]) + [EOS] else 0.0 for i, r in enumerate(rs)])
        rg = rewards.view(a.prompts, a.samples)
        adv = rg - rg.mean(1, keepdim=True)
        if a.adv == "grpo":
            adv = adv / (rg.std(1, keepdim=True) + 1e-6)
        adv = adv.view(-1)
        adv = torch.where(adv < 0, adv * a.neg_scale, adv)
        informative = (rg.max(1).values != rg.min(1).values).repeat_interleave(a.samples)
        keep = informative if a.skip_uniform else torch.ones_like(informative)
        if not bool(keep.any()):
            skipped += 1  # no learning signal: no optimizer step (the learner does the same)
            continue
        for g in opt.param_groups: g["lr"] = a.lr * min(1.0, (step + 1) / a.warmup) if a.warmup > 0 else a.lr
        tt = time.time()
        rows = keep.nonzero().squeeze(1).tolist()
        ids, mask = pack([pids[i] for i in rows], [rs[i] for i in rows])
        adv = adv[rows]
        logits = model(ids)[:, :-1]
        logp = torch.log_softmax(logits / a.temperature, -1).gather(2, ids[:, 1:, None]).squeeze(2)
        # On-policy PPO-clip objective (ratio == 1 at the first and only update), token-level mean.
        ratio = torch.exp(logp - logp.detach())
        obj = torch.min(ratio * adv[:, None], ratio.clamp(1 - a.clip_low, 1 + a.clip_high) * adv[:, None])
        loss = -(obj * mask).sum() / mask.sum()
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        train_t += time.time() - tt
        train_tok += int(sum(len(pids[i]) + len(rs[i]) for i in rows))
        step += 1
        if step % a.eval_every == 0:
            acc = evaluate(model, held); best = max(best, acc)
            el = time.time() - t0
            print(f"step {step:4d}  t={el:6.1f}s  reward {rewards.mean():.3f}  held-out {acc:.3f}", flush=True)
            for thr in (0.9, 0.95, 1.0):
                if acc >= thr and thr not in marks: marks[thr] = el; steps_at[thr] = step
            if acc >= a.target: break
    res = {"warm_acc": warm, "best_acc": best, "steps": step, "skipped_updates": skipped,
           "threads": a.threads, "lr": a.lr, "neg_scale": a.neg_scale, "skip_uniform": a.skip_uniform,
           "t90_s": marks.get(0.9), "t95_s": marks.get(0.95), "t100_s": marks.get(1.0),
           "u90": steps_at.get(0.9), "u95": steps_at.get(0.95), "u100": steps_at.get(1.0),
           "gen_tok_s": gen_tok / max(gen_t, 1e-9), "train_tok_s": train_tok / max(train_t, 1e-9)}
    print(json.dumps(res))

if __name__ == "__main__":
    main()
