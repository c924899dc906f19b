"""Tuning on a Ray cluster: 1 against 2 single-CPU workers here, and the driver emulated on 8-128.

    python bench/cluster.py [--gemm 768x768,768x3072] [--lo 1] [--hi 128] [--trials 16] [--seed 0]
                            [--replay-trials 256] [--workers 8,32,128] [--output bench/results/cluster.md]
    python bench/cluster.py --replay bench/results/cluster.json [--replay-trials 256] [--workers ...] [--output ...]

Part 1, measured: the same dense GEMM tasks (BERT-base weight shapes, M in [lo, hi]) tuned
from an empty database with the same trials and seed on ``--cluster local:1`` and on
``local:2`` (tune/cluster.py: every candidate built and measured as a Ray task on a worker
of one CPU, drawn asynchronously as slots free up). Reports the wall time of each, the
ratio, and the dispatchers both runs chose (kernel set and tree), timed after both runs in
this process, interleaved, at every sampled M (``compare_dispatchers``: each run's own
figures were measured under different load, the 2-worker run's with two measurements and
the driver sharing the two cores), beside the GFLOPS each run reported. What the 1-worker run measured (its candidate tasks'
seconds, its joint timings, Ray's costs per task) is written beside OUTPUT (.json);
``--replay TRACE`` emulates from such a trace without measuring again.

Part 2, emulated: the real tuning driver (search, cost model and its background fit,
database) against a cluster of W workers that exist only as clocks, in real time, each
candidate task lasting what the 1-worker run's tasks lasted, in their order, plus Ray's
measured round trip, and the driver paying Ray's measured costs per submit and per result
(bench/cluster_emulation.py). Per W: the wall time; the driver's CPU seconds (this
process's threads, so its share of the wall time is how busy the driver was; the
background fit runs in a child process, on another core of the driver's machine); and the
speed-up as the seconds of work handed to the workers over the wall time (what one worker
would need for the same tasks, back to back, without the driver's time: a lower bound of
the speed-up over one worker). ``--replay-trials`` trials per task: the long tunes a
cluster is for. Writes the table and a plot (OUTPUT with .png).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from cluster_emulation import EmulatedCluster  # noqa: E402
from shapeshift.tune.cluster import RayCluster  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.tune.runner import RunnerConfig  # noqa: E402
from shapeshift.tune.search import TuneConfig, Tuner  # noqa: E402
from shapeshift.tune.workload import GemmWorkload  # noqa: E402

OVERHEAD_TASKS = 200
WORKERS = (8, 32, 128)
# Joint tasks of one kernel at one M timed for the fixed cost of a joint timing's task.
FIXED_TASKS = 3
# The two runs' dispatchers timed after both: passes over the sampled Ms (forwards, then
# backwards), samples per pass of at least this many seconds each.
DISPATCH_PASSES = 3
DISPATCH_REPEATS = 5
DISPATCH_SAMPLE_S = 0.02


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemm", default="768x768,768x3072")
    parser.add_argument("--lo", type=int, default=1)
    parser.add_argument("--hi", type=int, default=128)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay-trials", type=int, default=256,
                        help="trials per task in the emulation: the long tunes a cluster is for")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cluster.md")
    parser.add_argument("--replay", type=Path, default=None, metavar="TRACE",
                        help="emulate from this trace (a run's .json) instead of measuring")
    parser.add_argument("--control", action="store_true",
                        help="tune on 1 worker a second time: the spread between two runs of one setting")
    parser.add_argument("--workers", type=lambda text: [int(w) for w in text.split(",")], default=list(WORKERS),
                        help="emulated cluster sizes, comma-separated")
    return parser.parse_args()


def tune_on(workers: int, workloads: list[GemmWorkload], args) -> dict:
    """Every task tuned on a fresh local cluster of ``workers`` CPUs; wall time and traces."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    # A compile cache of its own for each run (the workers inherit it): the same seed draws the
    # same candidates, which a shared cache would hand the second run already built.
    old_cache = os.environ.get("SHAPESHIFT_CACHE_DIR")
    os.environ["SHAPESHIFT_CACHE_DIR"] = str(tmp / "node_cache")
    cluster = RayCluster(f"local:{workers}")
    try:
        out = {"tasks": []}
        start = time.perf_counter()
        for w in workloads:
            cfg = TuneConfig(trials=args.trials, seed=args.seed, runner=RunnerConfig(threads=1))
            with Database(tmp / "t.db") as db:
                tuner = Tuner(w, db, tmp / "cache", cfg, log=lambda s: None, cluster=cluster)
                tasks0, t0 = len(cluster.task_seconds), time.perf_counter()
                result = tuner.run()
                out["tasks"].append({
                    "workload": w.describe(), "wall": time.perf_counter() - t0,
                    "gflops": {m: result.gflops(m) for m in result.sampled_ms},
                    "kernels": [vars(k) for k in result.kernels], "tree": result.tree,
                    "trials": result.trials, "batch": tuner.batch,
                    "candidate_tasks": len(cluster.task_seconds) - tasks0,
                    "search_rows": tuner.search_rows, "samples": len(tuner.ms),
                    "driver_s": dict(tuner.driver_s), "driver_n": dict(tuner.driver_n),
                    "joint_costs": [{str(m): c for m, c in costs.items()} for costs in tuner.joint_costs]})
        out["wall"] = time.perf_counter() - start
        out["task_seconds"] = list(cluster.task_seconds)
        out["joint_tasks"] = list(cluster.joint_tasks)
        out.update(task_overhead(cluster))
        out["joint_fixed_s"] = joint_fixed(cluster, workloads[0])
        return out
    finally:
        cluster.shutdown()
        if old_cache is None:
            os.environ.pop("SHAPESHIFT_CACHE_DIR", None)
        else:
            os.environ["SHAPESHIFT_CACHE_DIR"] = old_cache
        shutil.rmtree(tmp, ignore_errors=True)


# The runs whose dispatchers are compared, by label: the 1-worker run first (the reference),
# then the 2-worker run, and with --control a second 1-worker run (same trials and seed):
# how far two runs of one setting land apart, the yardstick for the 2-worker run's spread.
RUN_LABELS = {1: "1 worker", 2: "2 workers", "control": "1 worker, again"}


def compare_dispatchers(runs: dict, workloads: list[GemmWorkload], cache: Path) -> list[dict]:
    """Each task's dispatcher (kernel set and tree) as every run chose it, timed in this
    process after all of them, interleaved at every sampled M (and checked against numpy):
    what each run selected, compared on equal terms. The GFLOPS each run reported were
    measured while it ran, the 2-worker run's with two measurements and the driver sharing
    the two cores. Per row: GFLOPS by run label, and each run's kernel there."""
    from dietcode_timing import Method, load_tuned, python_loop, run_passes, summarize, sample_point

    rows = []
    labels = [RUN_LABELS[key] for key in runs if key in RUN_LABELS]
    for t, w in enumerate(workloads):
        tasks = {RUN_LABELS[key]: run["tasks"][t] for key, run in runs.items() if key in RUN_LABELS}
        b = np.random.default_rng(0).standard_normal((w.k, w.n)).astype(np.float32)
        libs = {name: load_tuned(task, b, 1, cache) for name, task in tasks.items()}
        points = [{"m": int(m)} for m in tasks[labels[0]]["gflops"]]

        def sample_at(i: int, point: dict) -> dict[str, list[float]]:
            m = point["m"]
            a = np.random.default_rng((1, i)).standard_normal((m, w.k)).astype(np.float32)
            methods = {}
            for name, (lib, packed) in libs.items():
                c = np.full((m, w.n), np.nan, dtype=np.float32)
                methods[name] = Method(lambda calls, lib=lib, packed=packed, c=c: lib.ss_gemm_tuned_bench(
                    calls, m, w.n, w.k, a.ctypes.data, packed.ctypes.data, c.ctypes.data), c)
            c_np = np.empty((m, w.n), dtype=np.float32)
            methods["numpy"] = Method(python_loop(lambda: np.matmul(a, b, out=c_np)), c_np)
            return sample_point(methods, w.k, DISPATCH_REPEATS, DISPATCH_SAMPLE_S, f"M={m}")

        samples = run_passes(points, sample_at, DISPATCH_PASSES, lambda p: f"M={p['m']}")
        for point, got in zip(points, samples):
            fastest = summarize(got)[0]
            flops = w.flops(point["m"])
            rows.append({"workload": w.describe(), "m": point["m"],
                         "gflops": {name: flops / fastest[name] / 1e9 for name in libs},
                         # which kernel of its set each dispatcher ran there, and its schedule
                         "kernels": {name: tasks[name]["kernels"][lib.ss_gemm_tuned_choice(point["m"])]
                                     for name, (lib, _) in libs.items()}})
    return rows


def task_overhead(cluster: RayCluster) -> dict[str, float]:
    """Ray's cost per task, from OVERHEAD_TASKS empty tasks: the round trip (submitted at
    once, all waited for, per task), and the driver's own seconds per ``.remote()`` call
    and per ``ray.get`` of a finished task."""
    noop = cluster.ray.remote(num_cpus=1)(lambda: None)
    cluster.ray.get([noop.remote() for _ in range(10)])  # warm the workers
    start = time.perf_counter()
    refs = [noop.options(num_cpus=1).remote() for _ in range(OVERHEAD_TASKS)]
    submit = time.perf_counter() - start
    cluster.ray.wait(refs, num_returns=len(refs))
    trip = time.perf_counter() - start
    start = time.perf_counter()
    for ref in refs:
        cluster.ray.get(ref)
    get = time.perf_counter() - start
    return {"overhead_s": (trip + get) / OVERHEAD_TASKS, "submit_s": submit / OVERHEAD_TASKS,
            "get_s": get / OVERHEAD_TASKS}


def joint_fixed(cluster: RayCluster, workload: GemmWorkload) -> float:
    """Seconds of a joint timing's task that do not depend on its Ms: one kernel (built in
    the node's cache by the first) timed at M = lo, the fastest of FIXED_TASKS."""
    from shapeshift.tune.builder import measurement_source
    from shapeshift.tune.gemm_family import GEMM

    source = measurement_source(GEMM.default(cluster.target))
    config = RunnerConfig(threads=1, repeats=1)
    seconds = []
    for _ in range(FIXED_TASKS):
        cluster.time_together([source], workload, [[workload.lo]], config, [60.0])
        seconds.append(cluster.joint_tasks.pop()[1])
    return min(seconds)


def make_trace(one: dict, workloads: list[GemmWorkload]) -> dict:
    """What the emulation needs, from the 1-worker run (tasks one after another: no contention)."""
    tasks = one["tasks"]
    # Each task's joint timings in the order they ran (one chunk each, on the one worker),
    # with the tuner's estimated cost at each M.
    measured = iter(s for _, s in one["joint_tasks"])
    joint = [[{"costs": {str(m): c for m, c in costs.items()}, "seconds": next(measured)} for costs in t["joint_costs"]]
             for t in tasks]
    return {"task_seconds": one["task_seconds"], "overhead_s": one["overhead_s"], "submit_s": one["submit_s"],
            "get_s": one["get_s"], "joint_fixed_s": one["joint_fixed_s"], "joint": joint,
            "workloads": [[w.k, w.n, w.lo, w.hi] for w in workloads]}


def emulate(trace: dict, workers: int, trials: int, seed: int) -> dict:
    """The trace's tasks tuned with ``trials`` candidates each on an emulated cluster of
    ``workers`` workers (bench/cluster_emulation.py): wall seconds, the driver process's CPU
    seconds (its threads; not the background fit's child), and the seconds of work the
    workers were given (what one worker would take for the same tasks, the driver aside)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_cluster_emulated_"))
    cluster = EmulatedCluster(workers, trace)
    fits: list[tuple[int, float]] = []
    try:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for spec in trace["workloads"]:
            w = GemmWorkload(*spec)
            cfg = TuneConfig(trials=trials, seed=seed, runner=RunnerConfig(threads=1))
            with Database(tmp / "t.db") as db:
                tuner = Tuner(w, db, tmp / "cache", cfg, log=lambda s: None, cluster=cluster)
                cluster.tuner = tuner
                tuner.run()
                fits += tuner.child_fits
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"wall": wall, "driver": cpu, "worker_s": cluster.worker_s, "fits": fits}


def main() -> None:
    args = parse_args()
    if args.replay is not None:
        runs, trace = None, json.loads(args.replay.read_text())
    else:
        workloads = [GemmWorkload(*map(int, spec.split("x")), args.lo, args.hi) for spec in args.gemm.split(",")]
        runs = {w: tune_on(w, workloads, args) for w in (1, 2)}
        if args.control:
            runs["control"] = tune_on(1, workloads, args)
        with tempfile.TemporaryDirectory(prefix="bench_cluster_dispatch_") as cache:
            runs["dispatchers"] = compare_dispatchers(runs, workloads, Path(cache))
        trace = make_trace(runs[1], workloads)
        # With the emulation's inputs, what the comparison of the two runs' dispatchers found
        # (each run's kernel at each M included): a ratio out of line can be looked into.
        trace["dispatchers"] = runs["dispatchers"]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".json").write_text(json.dumps(trace, indent=1))
    sims = {}
    for w in args.workers:
        sims[w] = emulate(trace, w, args.replay_trials, args.seed)
        print(f"emulated {w} workers: wall {sims[w]['wall']:.1f} s, driver {sims[w]['driver']:.2f} s", flush=True)
    text = report(args, runs, trace, sims)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    plot(sims, args.output.with_suffix(".png"))
    print(text)


def report(args, runs, trace: dict, sims: dict) -> str:
    lines = ["# Tuning on a Ray cluster: 1 and 2 single-CPU workers, and the driver emulated to 128", "", machine.describe(), ""]
    if runs is None:
        lines += [f"Command: `python bench/cluster.py --replay {args.replay} --replay-trials {args.replay_trials} --workers "
                  f"{','.join(map(str, args.workers))}`", ""]
    else:
        one, two = runs[1], runs[2]
        joint = sum(s for _, s in one["joint_tasks"])
        lines += [f"Command: `python bench/cluster.py --gemm {args.gemm} --lo {args.lo} --hi {args.hi} --trials "
                  f"{args.trials} --seed {args.seed} --replay-trials {args.replay_trials} --workers "
                  f"{','.join(map(str, args.workers))}{' --control' if 'control' in runs else ''}`", "",
                  "## Measured (local cluster on this machine)", "",
                  f"- 1 worker: {one['wall']:.0f} s; 2 workers: {two['wall']:.0f} s; speed-up "
                  f"**{one['wall'] / two['wall']:.2f}x** (target >= 1.7x)"
                  + (f"; the second 1-worker run: {runs['control']['wall']:.0f} s" if "control" in runs else ""),
                  f"- candidate tasks (build + measurement on the node): median "
                  f"{statistics.median(one['task_seconds']):.2f} s over {len(one['task_seconds'])}; joint timings "
                  f"{joint:.1f} s in all", "",
                  "Dispatchers (kernel set and tree) each run chose, timed after the runs in one process, "
                  f"interleaved, 1 thread, fastest of {DISPATCH_PASSES} passes x {DISPATCH_REPEATS} samples of >= "
                  f"{DISPATCH_SAMPLE_S * 1e3:.0f} ms; alongside, the GFLOPS each run reported while it ran (the "
                  "2-worker run's with two measurements and the driver on the 2 cores):", "",
                  "| task | M | 1-worker dispatcher GFLOPS | 2-worker dispatcher GFLOPS | ratio |"
                  + (" second 1-worker run's | ratio |" if "control" in runs else "")
                  + " as reported: 1 worker | 2 workers |",
                  "|---|---:|---:|---:|---:|" + ("---:|---:|" if "control" in runs else "") + "---:|---:|"]
        reported = {(t["workload"], int(m)): (g, b["gflops"].get(m, math.nan))
                    for t, b in zip(one["tasks"], two["tasks"]) for m, g in t["gflops"].items()}
        control = RUN_LABELS["control"] if "control" in runs else None
        worst, spread = math.inf, math.inf
        for row in runs["dispatchers"]:
            g = row["gflops"]
            ratio = g["2 workers"] / g["1 worker"]
            worst = min(worst, ratio)
            again = ""
            if control:
                spread = min(spread, g[control] / g["1 worker"], g["1 worker"] / g[control])
                again = f" {g[control]:.1f} | {g[control] / g['1 worker']:.2f} |"
            r1, r2 = reported.get((row["workload"], row["m"]), (math.nan, math.nan))
            lines.append(f"| {row['workload'][:40]} | {row['m']} | {g['1 worker']:.1f} | {g['2 workers']:.1f} | "
                         f"{ratio:.2f} |{again} {r1:.1f} | {r2:.1f} |")
        lines += ["", f"Worst 2-worker / 1-worker dispatcher GFLOPS: {worst:.2f} (target: within 5%)."]
        if control:
            lines += [f"Two 1-worker runs of the same trials and seed: at worst {spread:.2f} of each other, the "
                      "spread of the search itself."]
        lines.append("")
    joint = [t for task in trace["joint"] for t in task]
    lines += [f"## The driver emulated on W workers ({args.replay_trials} trials per task, {len(trace['workloads'])} "
              "tasks)", "",
              f"Inputs (1-worker run): {len(trace['task_seconds'])} candidate tasks, median "
              f"{statistics.median(trace['task_seconds']):.2f} s, mean {statistics.mean(trace['task_seconds']):.2f} s; "
              f"{len(joint)} joint timings, {sum(t['seconds'] for t in joint):.1f} s in all, fixed "
              f"{trace['joint_fixed_s']:.2f} s a task; Ray round trip {trace['overhead_s'] * 1e3:.1f} ms a task, of "
              f"which the driver's own {trace['submit_s'] * 1e3:.2f} ms a submit and {trace['get_s'] * 1e3:.2f} ms a "
              "result.", "",
              "| workers | wall s | work given s | speed-up (lower bound) | driver CPU s | driver share | fits in the "
              "child: count, median s, total s |", "|---:|---:|---:|---:|---:|---:|---|"]
    for w, sim in sims.items():
        fits = sim["fits"]
        median = statistics.median(s for _, s in fits) if fits else math.nan
        lines.append(f"| {w} | {sim['wall']:.1f} | {sim['worker_s']:.0f} | {sim['worker_s'] / sim['wall']:.1f}x | "
                     f"{sim['driver']:.1f} | {100 * sim['driver'] / sim['wall']:.1f}% | {len(fits)}, {median:.2f}, "
                     f"{sum(s for _, s in fits):.1f} |")
    lines.append("")
    return "\n".join(lines)


def plot(sims: dict, path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return
    ws = list(sims)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 4))
    ax.plot(ws, [sims[w]["worker_s"] / sims[w]["wall"] for w in ws], "o-", label="emulated (lower bound)")
    ax.plot(ws, ws, ":", label="linear")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("speed-up over 1 worker")
    ax.legend()
    bx.plot(ws, [100 * sims[w]["driver"] / sims[w]["wall"] for w in ws], "o-")
    bx.axhline(5, linestyle=":", color="gray")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("workers")
    bx.set_ylabel("driver CPU, % of wall time")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
