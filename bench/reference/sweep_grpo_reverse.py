#!/usr/bin/python3
"""Finds the Python peer's best recipe for the default task (issue 20): a small grid over
learning rate, negative-advantage scale and uniform-group skipping, each point run with
--seeds seeds at --threads threads. The score (--score) is the median number of updates from
the end of the warm start to --target held-out exact match (default: on a shared machine it
does not move with the load, and the loop is synchronous, so its wall time follows it), or the
median wall time; a run that misses the target counts as its budget (--max-steps /
--max-seconds).
Prints one line per point and ends with one JSON line: every point, and the best one, whose
flags job_bench.py passes to the peer.

Usage: bench/reference/sweep_grpo_reverse.py [--lrs 2e-4,3e-4,1e-3] [--neg-scales 1,0.1]
       [--skip 1,0] [--seeds 0,1] [--max-steps 1500] [--max-seconds 900] [--threads 2]
       [--score steps|time]
"""
import argparse, itertools, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def floats(s):
    return [float(x) for x in s.split(",") if x]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lrs", default="2e-4,3e-4,1e-3")
    ap.add_argument("--neg-scales", default="1,0.1")
    ap.add_argument("--skip", default="1,0")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--max-steps", type=int, default=1500)
    ap.add_argument("--score", choices=["steps", "time"], default="steps")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    points = []
    for lr, neg, skip in itertools.product(floats(a.lrs), floats(a.neg_scales), [int(x) for x in a.skip.split(",")]):
        runs = []
        for seed in [int(x) for x in a.seeds.split(",")]:
            cmd = ["/usr/bin/python3", os.path.join(HERE, "grpo_reverse.py"), "--seed", str(seed), "--lr", str(lr),
                   "--neg-scale", str(neg), "--skip-uniform", str(skip), "--warmup", str(a.warmup),
                   "--target", str(a.target), "--max-seconds", str(a.max_seconds), "--max-steps", str(a.max_steps),
                   "--threads", str(a.threads)]
            out = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                 timeout=a.max_seconds + 300)
            if out.returncode != 0:
                raise SystemExit(f"peer failed ({out.returncode}): {' '.join(cmd)}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            pct = round(a.target * 100)
            runs.append({"seed": seed, "t_s": r.get("t%d_s" % pct), "updates": r.get("u%d" % pct),
                         "steps": r["steps"], "best_acc": r["best_acc"]})
        t_med = median([x["t_s"] if x["t_s"] is not None else a.max_seconds for x in runs])
        u_med = median([x["updates"] if x["updates"] is not None else a.max_steps for x in runs])
        p = {"lr": lr, "neg_scale": neg, "skip_uniform": skip, "median_t_s": t_med, "median_updates": u_med,
             "median_best_acc": median([x["best_acc"] for x in runs]),
             "reached": sum(1 for x in runs if x["t_s"] is not None), "runs": runs}
        points.append(p)
        sys.stderr.write(f"lr {lr:g}  neg {neg:g}  skip {skip}: median {u_med:.0f} updates, {t_med:.1f} s to "
                         f"{a.target:g} ({p['reached']}/{len(runs)} reached) {[x['updates'] for x in runs]}, "
                         f"best accuracy {p['median_best_acc']:.3f}\n")
    key = "median_updates" if a.score == "steps" else "median_t_s"
    # Ties (e.g. no point reached the target within the budget) go to the best accuracy reached.
    best = min(points, key=lambda p: (p[key], -p["reached"], -p["median_best_acc"]))
    print(json.dumps({"bench": "grpo_reverse_sweep", "target": a.target, "threads": a.threads, "score": a.score,
                      "max_seconds": a.max_seconds, "max_steps": a.max_steps,
                      "best": {k: best[k] for k in ("lr", "neg_scale", "skip_uniform", "median_updates",
                                                    "median_t_s", "median_best_acc")},
                      "points": points}))


if __name__ == "__main__":
    main()
