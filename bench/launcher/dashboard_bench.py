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

Usage: bench/launcher/dashboard_bench.py [--build build] [--timeout 900]
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
    a = ap.parse_args()
    without = run_job(a.build, ["dashboard.enabled=false"], a.timeout, False)
    sys.stderr.write(f"without the dashboard: {json.dumps(without)}\n")
    with_page = run_job(a.build, [], a.timeout, True)
    sys.stderr.write(f"with the page open in Chromium: {json.dumps(with_page)}\n")
    t0, t1 = without["time_to_target_s"], with_page["time_to_target_s"]
    res = {
        "bench": "dashboard",
        "without_time_to_target_s": t0, "with_time_to_target_s": t1,
        "time_to_target_ratio": (t1 / t0) if t0 and t1 and t0 > 0 else None,
        "without_head_cpu_pct": without["head_cpu_pct"], "with_head_cpu_pct": with_page["head_cpu_pct"],
        "head_cpu_pct_delta": with_page["head_cpu_pct"] - without["head_cpu_pct"],
        "head_cpu_target_pct": 3.0,
        "browser_cpu_s": with_page["browser_cpu_s"],
        "without_wall_s": without["wall_s"], "with_wall_s": with_page["wall_s"],
        "without_steps": without["steps"], "with_steps": with_page["steps"],
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
