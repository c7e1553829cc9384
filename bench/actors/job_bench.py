#!/usr/bin/env python3
"""Job-level benchmarks of Troupe (issue 6), each against a peer or a limit in the same run.

  1. default job vs the Python peer: wall time from the end of the warm start to
     95% held-out exact match, `troupe run configs/tiny_reverse.yaml` against a
     plain single-process PyTorch GRPO loop (bench/reference/grpo_reverse.py) with
     the same task, model and batch shape, on the same 2 cores (2 threads) with its
     own best recipe (bench/reference/sweep_grpo_reverse.py); --rounds rounds in
     alternating order, each round's ratio and their median (target >= 2).
  2. asynchrony: wall time to the same held-out accuracy with max_policy_lag 0
     vs 2, median of --async-repeats runs each, alternating (target: >= 1.5x
     faster with lag on a long-tailed task); also updates to the target, updates
     per second and response lengths. `async`: the default task (short, even
     responses); `async_multiturn`: multi-turn tool episodes
     (configs/multiturn_file_reverse.yaml); `async_longtail`: long-tailed response
     lengths (configs/longtail_reverse.yaml; --longtail-set KEY=VALUE changes it, e.g.
     a longer tail); each of the last two from one shared warm start. Every lag run also
     samples its job's processes (/proc, every 0.5 s from update 20 to its last): cores
     busy and CPU milliseconds an update; `*_throughput_ratio_limit` is what lag 2 could
     reach at its own CPU an update with every core busy, over lag 0's rate (on 2 cores a
     lag-0 job that keeps 1.4 cores busy leaves lag 2 at most 2/1.4 of its throughput).
  3. actor-system overhead: one rollout actor's tokens per process CPU-second
     inside the full job vs the engine alone doing the same work
     (bench/actors/standalone_rollout), --overhead-rounds rounds of the job bracketed by
     the engine alone (a run before and one after it, pooled: the VM's speed drifts within
     minutes), each round's ratio and the medians (target: >= 0.9);
     the wall-clock ratio is reported too (on 2 cores the learner takes its share).
     Then --overhead-side-rounds rounds of the two at the same time (side_by_side_*):
     the same machine conditions for both (back to back, the engine alone has an
     idle core beside it, the job never does); in each, also the engine alone paced
     as the learner-bound job's rollout is (side_by_side_paced_*: a wave of one
     update's groups and a weight update every job_wave_period_ms, idle between),
     which separates the actor system's own cost from the duty cycle's.
  4. duty cycle (duty_cycle): what idling between grant waves costs with no actor system at
     all: the engine alone (standalone_rollout --waves, one update's groups a wave) with
     --duty-gaps idle milliseconds between waves, against the same waves back to back, in
     --duty-rounds rounds of alternating order; beside it the same gaps for a plain PyTorch
     loop of matmul bursts over a working set of the engine's size (idle_burst.py: this
     machine's own cold-start cost). Each gap's tokens per CPU-second over gap 0's.

Usage: bench/actors/job_bench.py [--build build] [--only default,async,async_multiturn,async_longtail,overhead,duty_cycle] [--rounds 3]
Ends with one JSON line of the figures and ratios.
"""
import argparse, atexit, json, os, re, shutil, signal, subprocess, sys, tempfile, time

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny_reverse.yaml")
# The overhead job and its engine-alone peers: one rollout actor, far from the lag gate.
# Lag runs sample their CPU from this update on (the first updates start the pipeline).
CPU_FROM_STEP = 20
OVERHEAD_SETS = ["rollout.count=1", "trainer.max_policy_lag=8"]


def tree_cpu_seconds(root):
    """CPU seconds (user + system) of process `root` and every live descendant, from /proc,
    and the set of their pids."""
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        parent[int(d)] = int(f[1])
        cpu[int(d)] = (int(f[11]) + int(f[12])) / CLK_TCK
    total, todo, pids = 0.0, [root], set()
    while todo:
        p = todo.pop()
        pids.add(p)
        total += cpu.get(p, 0.0)
        todo += [c for c, pp in parent.items() if pp == p]
    return total, pids


class TrainSteps:
    """The last train step a growing metrics.jsonl reports, reading only what was appended."""

    def __init__(self, path):
        self.path, self.offset, self.step = path, 0, 0

    def last(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                for line in f:
                    if not line.endswith("\n"):
                        break  # a line still being written: read it next time
                    self.offset += len(line.encode())
                    if '"kind":"train"' in line:
                        self.step = max(self.step, json.loads(line).get("step", 0))
        except (OSError, ValueError):
            pass
        return self.step


def stop(proc):
    """Stops `troupe run` as Ctrl-C would (it stops the actors it started), then kills it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def troupe_run(build, sets, timeout, with_runs=False, config=CONFIG, cpu_from_step=0):
    """Runs a job in a private runs folder; returns the parsed metrics.jsonl records.
    cpu_from_step > 0: also samples the job's process tree every 0.5 s and returns, as a
    third element, its CPU over the RL updates from that step to the last one sampled
    ({"cpu_s", "wall_s", "updates", "cores", "cpu_ms_per_update"}; None when too short)."""
    runs = tempfile.mkdtemp(prefix="troupe-bench-")
    if not os.environ.get("TROUPE_BENCH_KEEP_RUNS"):  # set it to keep the run folders
        atexit.register(shutil.rmtree, runs, True)
    cmd = [os.path.join(build, "launcher", "troupe"), "--runs-dir", runs, "run", config]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True)
        first = last = None  # (step, cpu, time) samples bracketing the measured updates
        steps = TrainSteps(os.path.join(runs, "latest", "metrics.jsonl"))
        try:
            while proc.poll() is None:
                if time.time() - t0 > timeout:
                    stop(proc)
                    raise SystemExit(f"troupe run timed out after {timeout} s: {' '.join(sets)}")
                if cpu_from_step > 0:
                    step = steps.last()
                    if step >= cpu_from_step:
                        cpu, pids = tree_cpu_seconds(proc.pid)
                        sample = (step, cpu, time.time(), pids)
                        # Only samples whose step moved on while every process of the first
                        # sample lives: the updates still run (an exited actor's CPU leaves the
                        # tree, and the job's shutdown is not counted).
                        if first is None:
                            first = sample
                        elif step > (last or first)[0] and pids >= first[3]:
                            last = sample
                time.sleep(0.5)
        finally:
            stop(proc)
        log.seek(0)
        out = log.read()
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"troupe run failed ({proc.returncode}): {' '.join(sets)}")
    recs = []
    with open(os.path.join(runs, "latest", "metrics.jsonl")) as f:
        for line in f:
            recs.append(json.loads(line))
    sys.stderr.write("".join(l + "\n" for l in out.splitlines() if l.startswith(("warm", "summary", "  "))))
    res = (recs, wall, runs) if with_runs else (recs, wall)
    if cpu_from_step > 0:
        cpu = None
        if first and last and last[0] > first[0]:
            n, c, w = last[0] - first[0], last[1] - first[1], last[2] - first[2]
            cpu = {"cpu_s": c, "wall_s": w, "updates": n, "cores": c / w, "cpu_ms_per_update": 1000 * c / n}
        res += (cpu,)
    return res


def time_to(recs, target):
    for r in recs:
        if r.get("kind") == "eval" and r.get("eval_accuracy", 0) >= target:
            return r["elapsed_s"]
    return None


def summary(recs):
    for r in recs:
        if r.get("kind") == "summary":
            return r
    return {}


def run_json(cmd, timeout, env):
    """Runs a benchmark command that ends with one JSON line; returns that line, parsed."""
    out = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_peer(a):
    """The Python peer at its best on the same 2 cores (bench/reference/grpo_reverse.py: 2 intra-op
    threads, OMP_WAIT_POLICY=PASSIVE, the recipe of its sweep), evaluating as often as the job does."""
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench", "reference", "grpo_reverse.py"),
           "--max-seconds", str(a.reference_seconds), "--target", "0.95", "--threads", str(a.peer_threads),
           "--eval-every", "10"] + a.peer_args.split()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    env.pop("OMP_NUM_THREADS", None)
    return run_json(cmd, a.reference_seconds + 300, env)


def bench_default(a):
    """The default job, as README's command runs it, against the peer: --rounds rounds,
    alternating which runs first; each round's ratio is peer time / Troupe time to 95% held-out
    from the end of each one's warm start (target >= 2, i.e. Troupe in <= 0.5x the peer's time)."""
    rounds = []
    for i in range(a.rounds):
        order = ("troupe", "peer") if i % 2 == 0 else ("peer", "troupe")
        got = {}
        for who in order:
            got[who] = troupe_run(a.build, [], a.timeout)[0] if who == "troupe" else run_peer(a)
        recs, ref = got["troupe"], got["peer"]
        s = summary(recs)
        t95, t90 = time_to(recs, 0.95), time_to(recs, 0.90)
        r = {"round": i + 1, "first": order[0],
             "troupe_warm_acc": s.get("warm_accuracy"), "troupe_best_acc": s.get("best_accuracy"),
             "troupe_t95_s": t95, "troupe_t90_s": t90, "troupe_updates_t95": steps_to(recs, 0.95),
             "troupe_gen_tok_s": s.get("gen_tokens_per_s"), "troupe_train_tok_s": s.get("train_tokens_per_s"),
             "peer_warm_acc": ref["warm_acc"], "peer_t95_s": ref["t95_s"], "peer_t90_s": ref["t90_s"],
             "peer_updates": ref["steps"], "peer_gen_tok_s": ref["gen_tok_s"], "peer_train_tok_s": ref["train_tok_s"]}
        if t90 and ref["t90_s"]:
            r["speedup_t90"] = ref["t90_s"] / t90
        if t95:
            # The peer may miss 95% within its budget: then the ratio is a lower bound.
            r["speedup_t95"] = (ref["t95_s"] or a.reference_seconds) / t95
            r["speedup_t95_is_lower_bound"] = not ref["t95_s"]
        sys.stderr.write(f"round {i + 1}: {json.dumps(r)}\n")
        rounds.append(r)
    res = {"rounds": rounds, "peer_threads": a.peer_threads, "peer_args": a.peer_args}
    for k in ("speedup_t95", "speedup_t90", "troupe_t95_s", "peer_t95_s"):
        res[k] = median([r.get(k) for r in rounds])
    return res


def steps_to(recs, target):
    for r in recs:
        if r.get("kind") == "eval" and r.get("eval_accuracy", 0) >= target:
            return r.get("step")
    return None


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def lag_runs(a, config, sets, target, seconds, tag):
    """Lag 0 vs 2 on one config, alternating, a.async_repeats times each: RL runs to a
    target vary with their sampling path, so the medians are compared. Updates to the
    target (sample efficiency), updates per second (throughput) and response lengths
    (the tail a lag-0 update waits for) separate what asynchrony costs from what it buys."""
    common = sets + ["stop.target_accuracy=%g" % target, "stop.max_seconds=%d" % seconds]
    runs = {0: [], 2: []}
    for i in range(a.async_repeats):
        for lag in ((0, 2) if i % 2 == 0 else (2, 0)):
            recs, _, cpu = troupe_run(a.build, common + ["trainer.max_policy_lag=%d" % lag], a.timeout,
                                      config=config, cpu_from_step=CPU_FROM_STEP)
            t, n = time_to(recs, target), steps_to(recs, target)
            trains = [r for r in recs if r.get("kind") == "train"]
            run = {"s": t, "updates": n, "updates_per_s": (n / t) if t and n else None,
                   "best_acc": summary(recs).get("best_accuracy")}
            if cpu:  # the job's processes while it trains: cores busy, CPU an update
                run.update({"cores": cpu["cores"], "cpu_ms_per_update": cpu["cpu_ms_per_update"],
                            "sampled_updates_per_s": cpu["updates"] / cpu["wall_s"]})
            if trains:
                run["response_len_mean"] = sum(r.get("response_len_mean", 0) for r in trains) / len(trains)
                run["response_len_max_mean"] = sum(r.get("response_len_max", 0) for r in trains) / len(trains)
            sys.stderr.write(f"{tag} lag {lag}: {json.dumps(run)}\n")
            runs[lag].append(run)
    res = {tag + "target": target, tag + "repeats": a.async_repeats,
           tag + "lag0_runs": runs[0], tag + "lag2_runs": runs[2]}
    for lag in (0, 2):
        for k, field in (("time_s", "s"), ("updates", "updates"), ("updates_per_s", "updates_per_s")):
            res["%slag%d_%s" % (tag, lag, k)] = median([r[field] for r in runs[lag]])
    if res[tag + "lag0_time_s"] and res[tag + "lag2_time_s"]:
        res[tag + "speedup"] = res[tag + "lag0_time_s"] / res[tag + "lag2_time_s"]
    if res[tag + "lag0_updates_per_s"] and res[tag + "lag2_updates_per_s"]:
        res[tag + "throughput_ratio"] = res[tag + "lag2_updates_per_s"] / res[tag + "lag0_updates_per_s"]
    # The limit of the throughput ratio on these cores: lag 2 keeping every core busy at its own
    # CPU per update, over lag 0's rate (both sampled over the same stretch of each run).
    for lag in (0, 2):
        for k in ("cores", "cpu_ms_per_update", "sampled_updates_per_s"):
            res["%slag%d_%s" % (tag, lag, k)] = median([r.get(k) for r in runs[lag]])
    cores = len(os.sched_getaffinity(0))
    if res[tag + "lag2_cpu_ms_per_update"] and res[tag + "lag0_sampled_updates_per_s"]:
        res[tag + "cores_available"] = cores
        res[tag + "sampled_throughput_ratio"] = (res[tag + "lag2_sampled_updates_per_s"] /
                                                 res[tag + "lag0_sampled_updates_per_s"])
        res[tag + "throughput_ratio_limit"] = (1000.0 * cores / res[tag + "lag2_cpu_ms_per_update"] /
                                               res[tag + "lag0_sampled_updates_per_s"])
    return res


def bench_async(a):
    """The default task, RL from its 100-step warm start to --async-target."""
    return lag_runs(a, CONFIG, [], a.async_target, a.async_seconds, "async_")


def warm_start_once(a, config, given, sets=()):
    """One supervised warm start of `config` (with `sets`) for every lag run (its first
    checkpoint, before RL), or `given` when set: the runs then differ only in their RL."""
    if given:
        return given
    _, _, runs = troupe_run(a.build, list(sets) + ["stop.max_steps=1", "eval.every_steps=0"], a.timeout,
                            with_runs=True, config=config)
    ckpts = sorted(c for c in os.listdir(os.path.join(runs, "latest", "checkpoints")) if c.startswith("ckpt-"))
    warm = os.path.join(runs, "latest", "checkpoints", ckpts[0])
    sys.stderr.write(f"warm start of {os.path.basename(config)}: {warm}\n")
    return warm


def bench_async_multiturn(a):
    """Multi-turn tool episodes (configs/multiturn_file_reverse.yaml: read w.txt, submit the
    word reversed; 2 model turns and a tool output, ~80 tokens an episode), from one shared
    warm start (475 supervised steps)."""
    config = os.path.join(ROOT, "configs", "multiturn_file_reverse.yaml")
    warm = warm_start_once(a, config, a.multiturn_init_from)
    sets = ["warm_start.steps=0", "warm_start.init_from=" + warm, "eval.prompts=%d" % a.multiturn_eval_prompts]
    return lag_runs(a, config, sets, a.multiturn_target, a.multiturn_seconds, "multiturn_")


def bench_async_longtail(a):
    """Long-tailed response lengths (configs/longtail_reverse.yaml: words of 3-64 letters with
    P(len) ~ len^-2, responses of 4-65 tokens): a lag-0 update waits for its slowest groups,
    decoded in ever smaller batches. From one shared warm start (200 supervised steps).
    --longtail-set overrides apply to the warm start and every run (e.g. a longer tail)."""
    config = os.path.join(ROOT, "configs", "longtail_reverse.yaml")
    warm = warm_start_once(a, config, a.longtail_init_from, a.longtail_set)
    sets = a.longtail_set + ["warm_start.steps=0", "warm_start.init_from=" + warm]
    res = lag_runs(a, config, sets, a.longtail_target, a.longtail_seconds, "longtail_")
    res["longtail_sets"] = a.longtail_set
    return res


def actor_env():
    """The environment `troupe run` gives its actors (launcher/head.h ActorEnvironment): the
    peers run with the same OpenMP waits."""
    return dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def standalone(a, sets, seconds, weights, extra=()):
    """The engine alone (bench/actors/standalone_rollout) with the job's config and weights."""
    return run_json([os.path.join(a.build, "bench", "actors", "standalone_rollout"), CONFIG, "--seconds",
                     "%.1f" % seconds, "--weights", weights] + sum([["--set", s] for s in sets], []) + list(extra),
                    seconds + 120, actor_env())


def pooled(runs):
    """standalone_rollout JSON lines of several runs as one: counts summed, rates recomputed."""
    out = {k: sum(r[k] for r in runs) for k in ("cpu_s", "seconds", "tokens", "engine_tokens",
                                               "engine_step_cpu_s", "engine_decode_steps")}
    out["tokens_per_s"] = out["tokens"] / max(out["seconds"], 1e-9)
    out["tokens_per_cpu_s"] = out["tokens"] / max(out["cpu_s"], 1e-9)
    return out


def overhead_round(a, sets, weights):
    """One job bracketed by the engine alone (before and after it, pooled), and their ratios:
    this VM's speed drifts by 10-30 % within minutes, and a peer measured on both sides of the
    job cancels a drift across it. The engine alone generates with the job's final weights
    (same response lengths): the first round's job provides them (that round has no run
    before its job); later rounds reuse that run folder."""
    alone = [standalone(a, sets, a.overhead_alone_seconds, weights)] if weights else []
    recs, _, runs = troupe_run(a.build, sets, a.timeout, with_runs=True)
    fin = [r for r in recs if r.get("kind") == "final" and r.get("actor", "").startswith("rollout")]
    if not fin:
        raise SystemExit("no rollout final report")
    fin = fin[0]
    seconds = a.overhead_alone_seconds if weights else max(5.0, fin["gen_active_s"])
    alone.append(standalone(a, sets, seconds, weights or os.path.join(runs, "latest")))
    return overhead_ratios(fin, pooled(alone)), runs


def overhead_ratios(fin, alone):
    """The rollout actor's final report against the engine alone's JSON line."""
    job_rate = fin["gen_tokens"] / max(fin["gen_active_s"], 1e-9)
    # Per process CPU-second: the actor system's own cost (transport, heartbeats,
    # weight updates), independent of the share of the 2 cores the learner takes.
    job_cpu_rate = fin["gen_tokens"] / max(fin["gen_cpu_s"], 1e-9)
    res = {"job_rollout_tok_s": job_rate, "standalone_tok_s": alone["tokens_per_s"],
           "overhead_ratio_wall": job_rate / alone["tokens_per_s"],
           "job_rollout_tok_per_cpu_s": job_cpu_rate, "standalone_tok_per_cpu_s": alone["tokens_per_cpu_s"],
           "overhead_ratio": job_cpu_rate / alone["tokens_per_cpu_s"]}
    if fin.get("engine_weight_updates"):
        # The job's pace: one learner update (one grant wave, one weight update) every this often.
        res["job_wave_period_ms"] = 1000 * fin["gen_active_s"] / fin["engine_weight_updates"]
    # Where the difference goes: how full the engine's decode batches were (sampled tokens per
    # decode step), the share of the process CPU spent outside engine steps (transport, the
    # actor's loop, weight updates, rendering), and the engine's own tokens per CPU-second.
    for name, r, cpu in (("job", fin, fin["gen_cpu_s"]), ("standalone", alone, alone["cpu_s"])):
        if r.get("engine_decode_steps"):
            res[name + "_tokens_per_decode_step"] = r["engine_tokens"] / r["engine_decode_steps"]
            res[name + "_engine_cpu_share"] = r["engine_step_cpu_s"] / max(cpu, 1e-9)
            res[name + "_engine_tok_per_cpu_s"] = r["engine_tokens"] / max(r["engine_step_cpu_s"], 1e-9)
    if res.get("standalone_engine_tok_per_cpu_s"):
        res["engine_efficiency_ratio"] = res["job_engine_tok_per_cpu_s"] / res["standalone_engine_tok_per_cpu_s"]
    return res


def side_by_side_round(a, sets, weights, period_ms):
    """The job and the engine alone at the same time: the engine alone starts once the job
    trains and runs --overhead-side-seconds while the job goes on, so both see the same
    machine (the learner busy on the other core, the same neighbours), which the back-to-back
    rounds cannot give: there the engine alone has an idle core beside it.

    Then, still beside the job, the engine alone paced as the job's rollout is (paced_*): a
    wave of one update's groups every period_ms (the back-to-back jobs' median), the engine
    idle in between, and a weight update per wave. The job's rollout is learner-bound and idle
    between grant waves; this peer has that duty cycle and no actor system, so its ratio is
    the actor system's own cost, and the continuous peer's the duty cycle's on top."""
    runs = tempfile.mkdtemp(prefix="troupe-bench-")
    if not os.environ.get("TROUPE_BENCH_KEEP_RUNS"):
        atexit.register(shutil.rmtree, runs, True)
    steps = [x for x in sets if not x.startswith("stop.max_steps=")] + \
        ["stop.max_steps=%d" % a.overhead_side_steps]
    cmd = [os.path.join(a.build, "launcher", "troupe"), "--runs-dir", runs, "run", CONFIG]
    for x in steps:
        cmd += ["--set", x]
    job = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        metrics = os.path.join(runs, "latest", "metrics.jsonl")
        deadline = time.time() + a.timeout
        while time.time() < deadline and job.poll() is None:
            if os.path.exists(metrics) and '"kind":"train"' in open(metrics).read():
                break
            time.sleep(0.2)
        if job.poll() is not None:
            raise SystemExit("side-by-side job ended before it trained (rc %s)" % job.returncode)
        alone = standalone(a, sets, a.overhead_side_seconds, weights)
        paced = standalone(a, sets, a.overhead_side_seconds, weights,
                           ["--wave-period-ms", "%.2f" % period_ms, "--weight-updates-per-s", "%.2f" % (1000 / period_ms)])
        if job.poll() is not None:
            raise SystemExit("the side-by-side job ended before the engine alone did: raise --overhead-side-steps")
        job.wait(timeout=a.timeout)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    if job.returncode != 0:
        raise SystemExit("side-by-side job failed (rc %d)" % job.returncode)
    fin = [json.loads(l) for l in open(metrics)]
    fin = [r for r in fin if r.get("kind") == "final" and r.get("actor", "").startswith("rollout")]
    if not fin:
        raise SystemExit("no rollout final report")
    res = overhead_ratios(fin[0], alone)
    for k, v in overhead_ratios(fin[0], paced).items():
        if k.startswith("standalone_") or k in ("overhead_ratio", "overhead_ratio_wall", "engine_efficiency_ratio"):
            res["paced_" + k] = v
    return res


def bench_overhead(a):
    """--overhead-rounds rounds of a job bracketed by the engine alone (overhead_round); each
    round's ratios, and their medians."""
    sets = OVERHEAD_SETS + ["stop.target_accuracy=0", "stop.max_steps=%d" % a.overhead_steps,
            "eval.every_steps=0", "rollout.credit_reserve=%d" % a.credit_reserve] + a.overhead_set
    if a.overhead_rounds < 1:
        raise SystemExit("--overhead-rounds must be at least 1 (its job's weights feed the engine alone)")
    rounds, weights = [], None
    for i in range(a.overhead_rounds):
        r, runs = overhead_round(a, sets, weights)
        weights = weights or os.path.join(runs, "latest")
        sys.stderr.write("overhead round %d: %s\n" % (i + 1, json.dumps({k: round(v, 3) for k, v in r.items()})))
        rounds.append(r)
    res = {k: median([r.get(k) for r in rounds]) for k in rounds[0]}
    res["overhead_rounds"] = len(rounds)
    res["overhead_ratio_by_round"] = [round(r["overhead_ratio"], 3) for r in rounds]
    res["overhead_ratio_wall_by_round"] = [round(r["overhead_ratio_wall"], 3) for r in rounds]
    side = []
    period_ms = res.get("job_wave_period_ms")
    for i in range(a.overhead_side_rounds if period_ms else 0):
        r = side_by_side_round(a, sets, weights, period_ms)
        sys.stderr.write("overhead side by side %d: %s\n" % (i + 1, json.dumps({k: round(v, 3) for k, v in r.items()})))
        side.append(r)
    if side:
        for k in ("overhead_ratio", "engine_efficiency_ratio", "job_engine_cpu_share", "standalone_engine_cpu_share",
                  "job_tokens_per_decode_step", "standalone_tokens_per_decode_step", "paced_overhead_ratio",
                  "paced_engine_efficiency_ratio", "paced_standalone_engine_cpu_share",
                  "paced_standalone_tokens_per_decode_step"):
            res["side_by_side_" + k] = median([r.get(k) for r in side])
        res["side_by_side_overhead_ratio_by_round"] = [round(r["overhead_ratio"], 3) for r in side]
        res["side_by_side_paced_overhead_ratio_by_round"] = [round(r["paced_overhead_ratio"], 3) for r in side]
    return res


def bench_duty_cycle(a):
    """The engine alone in waves of one update's groups, idle --duty-gaps ms between waves, vs
    back to back (gap 0); and a plain PyTorch loop (idle_burst.py) with the same gaps. Rounds
    alternate the order of the gaps; each gap's ratio to gap 0 within a round, then medians."""
    weights = a.duty_weights
    if not weights:
        _, _, runs = troupe_run(a.build, OVERHEAD_SETS + ["stop.target_accuracy=0", "stop.max_steps=200",
                                                          "eval.every_steps=0"], a.timeout, with_runs=True)
        weights = os.path.join(runs, "latest")
    gaps = [0.0] + [float(g) for g in a.duty_gaps.split(",") if float(g) > 0]
    eng, loop = {g: [] for g in gaps}, {g: [] for g in gaps}
    for i in range(a.duty_rounds):
        order = gaps if i % 2 == 0 else list(reversed(gaps))
        got_e, got_l = {}, {}
        for g in order:
            r = standalone(a, OVERHEAD_SETS, a.duty_seconds, weights, ["--waves", "--wave-gap-ms", "%g" % g])
            got_e[g] = r["tokens_per_cpu_s"]
            got_l[g] = run_json(["/usr/bin/python3", os.path.join(ROOT, "bench", "actors", "idle_burst.py"),
                                 "--gap-ms", "%g" % g, "--seconds", "%g" % a.duty_seconds],
                                a.duty_seconds + 120, actor_env())["cpu_s_per_burst"]
        for g in gaps:
            eng[g].append(got_e[g] / got_e[0.0])
            loop[g].append(got_l[0.0] / got_l[g])  # work per CPU-second, relative to gap 0
        sys.stderr.write("duty cycle round %d: engine tok/CPU-s %s; loop CPU-ms per burst %s\n" % (
            i + 1, {g: round(v) for g, v in got_e.items()}, {g: round(1000 * v, 2) for g, v in got_l.items()}))
    res = {"duty_gaps_ms": gaps[1:]}
    for g in gaps[1:]:
        res["duty_engine_ratio_gap%g" % g] = median(eng[g])
        res["duty_engine_ratio_gap%g_by_round" % g] = [round(x, 3) for x in eng[g]]
        res["duty_loop_ratio_gap%g" % g] = median(loop[g])
        res["duty_loop_ratio_gap%g_by_round" % g] = [round(x, 3) for x in loop[g]]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", default="default,async,async_multiturn,async_longtail,overhead")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--reference-seconds", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3, help="default-job rounds (alternating order)")
    ap.add_argument("--peer-threads", type=int, default=2)
    ap.add_argument("--peer-args", default="--lr 2e-4 --warmup 20 --neg-scale 0.1 --skip-uniform 1",
                    help="the peer's recipe (bench/reference/sweep_grpo_reverse.py's best)")
    ap.add_argument("--async-target", type=float, default=0.8)
    ap.add_argument("--async-seconds", type=int, default=240)
    ap.add_argument("--async-repeats", type=int, default=3)
    ap.add_argument("--multiturn-target", type=float, default=0.62)
    ap.add_argument("--multiturn-seconds", type=int, default=420)
    ap.add_argument("--multiturn-eval-prompts", type=int, default=200)
    ap.add_argument("--multiturn-init-from", default="",
                    help="a warm-start checkpoint of configs/multiturn_file_reverse.yaml (default: make one)")
    ap.add_argument("--longtail-target", type=float, default=0.65)
    ap.add_argument("--longtail-seconds", type=int, default=300)
    ap.add_argument("--longtail-init-from", default="",
                    help="a warm-start checkpoint of configs/longtail_reverse.yaml (default: make one)")
    ap.add_argument("--longtail-set", action="append", default=[], metavar="KEY=VALUE",
                    help="async_longtail: a config override for the warm start and every run (repeatable)")
    ap.add_argument("--credit-reserve", type=int, default=0,
                    help="overhead: the job's rollout.credit_reserve (default 0, the default job's)")
    ap.add_argument("--overhead-steps", type=int, default=300)
    ap.add_argument("--overhead-rounds", type=int, default=3,
                    help="overhead: rounds of a job bracketed by the engine alone; medians")
    ap.add_argument("--overhead-side-rounds", type=int, default=3,
                    help="overhead: rounds of the job and the engine alone at the same time")
    ap.add_argument("--overhead-side-steps", type=int, default=1500,
                    help="overhead: the side-by-side job's updates (it must outlast the engine alone)")
    ap.add_argument("--overhead-side-seconds", type=float, default=20,
                    help="overhead: seconds of the engine alone beside the job")
    ap.add_argument("--overhead-alone-seconds", type=float, default=10,
                    help="overhead: seconds of each engine-alone run around a job")
    ap.add_argument("--overhead-set", action="append", default=[], metavar="KEY=VALUE",
                    help="overhead: another --set for the job and the engine alone (repeatable)")
    ap.add_argument("--duty-gaps", default="5,20,50", help="duty_cycle: idle ms between waves (besides 0)")
    ap.add_argument("--duty-rounds", type=int, default=3)
    ap.add_argument("--duty-seconds", type=float, default=6)
    ap.add_argument("--duty-weights", default="", help="duty_cycle: weights for the engine (default: a 200-update job's)")
    a = ap.parse_args()
    res = {"bench": "job"}
    for part in a.only.split(","):
        fn = {"default": bench_default, "async": bench_async, "async_multiturn": bench_async_multiturn,
              "async_longtail": bench_async_longtail, "overhead": bench_overhead,
              "duty_cycle": bench_duty_cycle}[part]
        r = fn(a)
        sys.stderr.write(f"{part}: {json.dumps(r)}\n")
        res.update(r)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
