#!/usr/bin/env python3
"""A plain PyTorch loop with the duty cycle of a learner-bound rollout: bursts of matmuls over a
fixed working set, idle --gap-ms between bursts. No Troupe code: the peer of job_bench.py's
duty_cycle part, which tells how much of the engine's cost after an idle gap is this machine's
(caches and cores gone cold while idle) rather than the engine's or the actor system's.

  /usr/bin/python3 bench/actors/idle_burst.py --gap-ms 50 [--seconds 6] [--working-set-mb 10]
      [--passes 4] [--threads 1]

Ends with one JSON line: bursts, the median and mean CPU-seconds per burst (this thread's), wall
seconds.
"""
import argparse, json, time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gap-ms", type=float, default=0)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--working-set-mb", type=float, default=10,
                    help="weights the bursts read, in MB (the engine's wave touches its weights, KV cache "
                    "and activations: ~10 MB for the default job)")
    ap.add_argument("--passes", type=int, default=4, help="passes over the working set per burst")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows, cols = 128, 352  # a decode batch against one FFN projection of the default model
    mats = [torch.randn(rows, cols) for _ in range(max(1, int(a.working_set_mb * 1e6 / (rows * cols * 4))))]
    x = torch.randn(128, rows)
    out = torch.empty(128, cols)
    for m in mats:  # first touch before timing
        torch.mm(x, m, out=out)
    per_burst = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.seconds:
        c0 = time.thread_time()
        for _ in range(a.passes):
            for m in mats:
                torch.mm(x, m, out=out)
        per_burst.append(time.thread_time() - c0)
        if a.gap_ms > 0:
            time.sleep(a.gap_ms / 1000)
    per_burst.sort()
    # The median: a rare burst many times slower than the rest (seen once a run or so on this
    # shared VM, at any gap) would otherwise decide a mean.
    print(json.dumps({"bench": "idle_burst", "gap_ms": a.gap_ms, "bursts": len(per_burst), "matrices": len(mats),
                      "cpu_s_per_burst": per_burst[len(per_burst) // 2],
                      "cpu_s_per_burst_mean": sum(per_burst) / len(per_burst), "wall_s": time.monotonic() - t0}))


if __name__ == "__main__":
    main()
