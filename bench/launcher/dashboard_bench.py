#!/usr/bin/env python3
"""The dashboard's cost to a job (issue 19), in one run of this script:

  without: the default job (configs/tiny_reverse.yaml) with dashboard.enabled=false;
  with:    the same job with the dashboard served and open in headless Chromium
           (tests/reference/npm/dashboard_browser.mjs watch: the page polls the
           head every second, charts redraw) for the whole job.

Figures: time to the target accuracy (the learner's summary time_to_target_s,
measured from the end of the warm start) and the head's CPU (the troupe
process's own user+system time from /proc, sampled every 0.2 s, over its wall
time, as a percentage of one core), and the browser's CPU (node + Chromium,
from wait4). Targets: time to target within noise (ratio with/without near
1; single runs on 2 shared cores vary by 10-30%); the head's CPU with the page
open <= 3 percentage points above without.

Usage: bench/launcher/dashboard_bench.py [--build build] [--pairs 1] [--timeout 900]
Ends with one JSON line.
"""
import argparse, atexit, json, os, re, shutil, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny_reverse.yaml")
BROWSER = os.path.join(ROOT, "tests", "reference", "npm", "dashboard_browser.mjs")
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """The process's own user+system seconds (not its children's), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def run_job(build, sets, timeout, with_browser):
    runs = tempfile.mkdtemp(prefix="troupe-dash-bench-")
    if not os.environ.get("TROUPE_BENCH_KEEP_RUNS"):
        atexit.register(shutil.rmtree, runs, True)
    cmd = [os.path.join(build, "launcher", "troupe"), "--runs-dir", runs, "run", CONFIG]
    for s in sets:
        cmd += ["--set", s]
    out_path = os.path.join(runs, "troupe.out")
    out = open(out_path, "w")
    t0 = time.time()
    head = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    browser, browser_cpu, url = None, None, None
    cpu = 0.0
    deadline = t0 + timeout
    while head.poll() is None:
        if time.time() > deadline:
            head.kill()
            raise SystemExit("the job did not finish within --timeout")
        c = proc_cpu(head.pid)
        if c is not None:
            cpu = c
        if with_browser and browser is None:
            m = re.search(r"troupe: dashboard (http://\S+)", open(out_path).read())
            if m:
                url = m.group(1)
                browser = subprocess.Popen(["node", BROWSER, "watch", url, "--seconds", str(timeout)],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)  # sampling another process's /proc: nothing to wait on
    wall = time.time() - t0
    if browser is not None:
        # The page sees the job end and the script closes Chromium by itself.
        for _ in range(300):
            pid, status, ru = os.wait4(browser.pid, os.WNOHANG)
            if pid:
                browser_cpu = ru.ru_utime + ru.ru_stime
                break
            time.sleep(0.1)
        else:
            browser.kill()
            raise SystemExit("the browser did not close after the job ended")
    out.close()
    text = open(out_path).read()
    if head.returncode != 0:
        sys.stderr.write(text[-4000:])
        raise SystemExit(f"troupe run failed ({head.returncode})")
    if with_browser and url is None:
        raise SystemExit("the job printed no dashboard URL")
    summary = {}
    with open(os.path.join(runs, "latest", "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "summary":
                summary = r
    sys.stderr.write("".join(l + "\n" for l in text.splitlines() if l.startswith(("warm", "summary", "  ", "troupe:"))))
    return {"time_to_target_s": summary.get("time_to_target_s"), "best_accuracy": summary.get("best_accuracy"),
            "steps": summary.get("steps"), "wall_s": wall, "head_cpu_s": cpu,
            "head_cpu_pct": 100.0 * cpu / wall if wall > 0 else None, "browser_cpu_s": browser_cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--pairs", type=int, default=1,
                    help="pairs of runs, alternating the order (without/with, with/without, ...); medians reported")
    a = ap.parse_args()
    runs = {"without": [], "with": []}
    for p in range(a.pairs):
        for kind in (["without", "with"] if p % 2 == 0 else ["with", "without"]):
            r = run_job(a.build, ["dashboard.enabled=false"] if kind == "without" else [], a.timeout, kind == "with")
            sys.stderr.write(f"{kind} the page open in Chromium: {json.dumps(r)}\n")
            runs[kind].append(r)

    def med(kind, key):
        xs = sorted(r[key] for r in runs[kind] if r[key] is not None)
        return xs[len(xs) // 2] if xs else None

    t0, t1 = med("without", "time_to_target_s"), med("with", "time_to_target_s")
    c0, c1 = med("without", "head_cpu_pct"), med("with", "head_cpu_pct")
    res = {
        "bench": "dashboard", "pairs": a.pairs,
        "without_time_to_target_s": t0, "with_time_to_target_s": t1,
        "time_to_target_ratio": (t1 / t0) if t0 and t1 and t0 > 0 else None,
        "without_head_cpu_pct": c0, "with_head_cpu_pct": c1, "head_cpu_pct_delta": c1 - c0,
        "head_cpu_target_pct": 3.0,
        "browser_cpu_s": med("with", "browser_cpu_s"),
        "all_time_to_target_s": {k: [r["time_to_target_s"] for r in v] for k, v in runs.items()},
        "all_head_cpu_pct": {k: [round(r["head_cpu_pct"], 2) for r in v] for k, v in runs.items()},
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
