#!/usr/bin/python3
"""Finds the Python peer's best recipe for the default task (issue 20): a small grid over
learning rate, negative-advantage scale and uniform-group skipping, each point run with
--seeds seeds at --threads threads; the score is the median wall time from the end of the
warm start to --target held-out exact match (a run that misses it counts as its budget).
Prints one line per point and ends with one JSON line: every point, and the best one, whose
flags job_bench.py passes to the peer.

Usage: bench/reference/sweep_grpo_reverse.py [--lrs 2e-4,3e-4,1e-3] [--neg-scales 1,0.1]
       [--skip 1,0] [--seeds 0,1] [--max-seconds 240] [--threads 2]
"""
import argparse, itertools, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def floats(s):
    return [float(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lrs", default="2e-4,3e-4,1e-3")
    ap.add_argument("--neg-scales", default="1,0.1")
    ap.add_argument("--skip", default="1,0")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    points = []
    for lr, neg, skip in itertools.product(floats(a.lrs), floats(a.neg_scales), [int(x) for x in a.skip.split(",")]):
        runs = []
        for seed in [int(x) for x in a.seeds.split(",")]:
            cmd = ["/usr/bin/python3", os.path.join(HERE, "grpo_reverse.py"), "--seed", str(seed), "--lr", str(lr),
                   "--neg-scale", str(neg), "--skip-uniform", str(skip), "--warmup", str(a.warmup),
                   "--target", str(a.target), "--max-seconds", str(a.max_seconds), "--threads", str(a.threads)]
            out = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                 timeout=a.max_seconds + 300)
            if out.returncode != 0:
                raise SystemExit(f"peer failed ({out.returncode}): {' '.join(cmd)}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            key = "t%d_s" % round(a.target * 100)
            runs.append({"seed": seed, "t_s": r.get(key), "steps": r["steps"], "best_acc": r["best_acc"]})
        ts = sorted(x["t_s"] if x["t_s"] is not None else a.max_seconds for x in runs)
        score = ts[len(ts) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])
        p = {"lr": lr, "neg_scale": neg, "skip_uniform": skip, "median_t_s": score,
             "reached": sum(1 for x in runs if x["t_s"] is not None), "runs": runs}
        points.append(p)
        sys.stderr.write(f"lr {lr:g}  neg {neg:g}  skip {skip}: median {score:.1f} s to {a.target:g} "
                         f"({p['reached']}/{len(runs)} reached) {[x['t_s'] for x in runs]}\n")
    best = min(points, key=lambda p: (p["median_t_s"], -p["reached"]))
    print(json.dumps({"bench": "grpo_reverse_sweep", "target": a.target, "threads": a.threads,
                      "max_seconds": a.max_seconds, "best": {k: best[k] for k in ("lr", "neg_scale", "skip_uniform",
                                                                                 "median_t_s")},
                      "points": points}))


if __name__ == "__main__":
    main()
