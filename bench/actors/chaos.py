#!/usr/bin/env python3
"""Chaos schedules: how many seeded fault schedules the default job survives exactly.

Runs the suite's chaos test (tests/e2e/chaos_test.cc: SIGKILL of every role,
the learner twice and once in the middle of a checkpoint write, the reward
actor while it holds scored batches, SIGSTOP/SIGCONT of a rollout actor, in a
seeded order) once per seed, and tabulates each schedule with its outcome
(every check of the test: job completes, learner resumed, accounting exact with
every term, no batch decided twice, no orphan process).

Not part of CI (one schedule is, in the suite). Usage:
  bench/actors/chaos.py [--build build] [--seeds 1,2,3 | --runs N] [--keep-failed]
Prints a markdown table (docs/operations.md holds the last one) and ends with
one JSON line: {"schedules": N, "held": k, "failed_seeds": [...], ...}.
"""
import argparse, json, os, random, re, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_one(build, seed, timeout):
    # One thread per actor process: not a peer setting (chaos.py has no peer, README says why),
    # several actors share the 2 cores and OpenMP's spin-waiting would starve them.
    env = dict(os.environ, TROUPE_CHAOS_SEED=str(seed), TROUPE_BUILD_DIR=build,
               TROUPE_SOURCE_DIR=ROOT, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    binary = os.path.join(build, "tests", "e2e", "e2e_chaos_test")
    t0 = time.time()
    try:
        out = subprocess.run([binary, "--gtest_color=no"], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout)
        text, rc = out.stdout, out.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
    wall = time.time() - t0
    faults = re.findall(r"\[chaos\] at update (\d+): (.+)", text)
    stage = re.search(r"checkpoint stage for the stalled write: (\w+)", text)
    failures = [l.strip() for l in text.splitlines() if "Failure" in l or "error:" in l.lower()]
    return {"seed": seed, "ok": rc == 0, "rc": rc, "wall_s": round(wall, 1),
            "faults": [f"{f} @{u}" for u, f in faults], "stage": stage.group(1) if stage else "?",
            "why": failures[:3], "tail": text[-3000:] if rc != 0 else ""}


def short(fault):
    return (fault.replace("SIGKILL learner-0 during a checkpoint write", "kill learner mid-checkpoint")
            .replace("SIGKILL learner-0", "kill learner")
            .replace("SIGKILL reward-0 holding scored batches", "kill reward")
            .replace("SIGKILL a rollout actor", "kill rollout")
            .replace("SIGSTOP a rollout actor, SIGCONT later", "stop/cont rollout"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seeds", default="")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s] or \
        [random.randrange(1, 2**31) for _ in range(args.runs)]
    results = []
    for i, seed in enumerate(seeds):
        r = run_one(args.build, seed, args.timeout)
        results.append(r)
        print(f"[{i + 1}/{len(seeds)}] seed {seed}: {'held' if r['ok'] else 'FAILED'} "
              f"({r['wall_s']} s)", flush=True)
        if not r["ok"]:
            sys.stderr.write(r["tail"] + "\n")
    print()
    print("| seed | schedule (fault @ update) | stalled checkpoint stage | outcome | wall |")
    print("|---|---|---|---|---|")
    for r in results:
        sched = ", ".join(short(f) for f in r["faults"])
        outcome = "held" if r["ok"] else "FAILED: " + "; ".join(r["why"])[:160]
        print(f"| {r['seed']} | {sched} | {r['stage']} | {outcome} | {r['wall_s']:.0f} s |")
    held = sum(r["ok"] for r in results)
    print(json.dumps({"bench": "chaos", "schedules": len(results), "held": held,
                      "held_fraction": round(held / max(1, len(results)), 3),
                      "failed_seeds": [r["seed"] for r in results if not r["ok"]],
                      "median_wall_s": sorted(r["wall_s"] for r in results)[len(results) // 2]}))
    return 0 if held == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
