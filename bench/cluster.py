"""Tuning on a Ray cluster: 1 against 2 single-CPU workers here, and a replay on 8-128 workers.

    python bench/cluster.py [--gemm 768x768,768x3072] [--lo 1] [--hi 128] [--trials 16] [--seed 0]
                            [--replay-trials 256] [--output bench/results/cluster.md]

Part 1, measured: the same dense GEMM tasks (BERT-base weight shapes, M in [lo, hi]) tuned
from an empty database with the same trials and seed on ``--cluster local:1`` and on
``local:2`` (tune/cluster.py: every candidate built and measured as a Ray task on a worker
of one CPU). Reports the wall time of each, the ratio, and the dispatcher's GFLOPS of both
at every sampled M (as each run measured them, taken together in one worker process).

Part 2, a replay: how the wall time would fall with W workers. Its inputs are measured in
part 1 and here: the seconds each candidate task took on its node (compile + measurement),
the seconds of each joint timing, the driver's own seconds per round (wall time less the
time spent waiting on tasks), and Ray's round-trip overhead per task (``OVERHEAD_TASKS``
empty tasks on the local cluster). The tuner measures max(batch, W) candidates per round,
so a task's T trials take ceil(T / W) rounds; a round lasts the driver's time plus the
longest worker queue (candidates dealt longest first) plus the overhead of its tasks; the
joint timings are one task each and do not shrink. Past W = trials a round cannot use more
workers: that, the joint timings and the driver's rounds are why the curve bends. Writes
the table and a plot (OUTPUT with .png).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from shapeshift.tune.cluster import RayCluster  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.tune.runner import RunnerConfig  # noqa: E402
from shapeshift.tune.search import TuneConfig, Tuner  # noqa: E402
from shapeshift.tune.workload import GemmWorkload  # noqa: E402

OVERHEAD_TASKS = 200
WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemm", default="768x768,768x3072")
    parser.add_argument("--lo", type=int, default=1)
    parser.add_argument("--hi", type=int, default=128)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay-trials", type=int, default=256,
                        help="trials per task in the replay: the long tunes a cluster is for")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cluster.md")
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
            rounds = []
            with Database(tmp / "t.db") as db:
                tuner = Tuner(w, db, tmp / "cache", cfg, log=lambda s: rounds.append(time.perf_counter()),
                              cluster=cluster)
                t0 = time.perf_counter()
                result = tuner.run()
                out["tasks"].append({"workload": w.describe(), "wall": time.perf_counter() - t0,
                                     "gflops": {m: result.gflops(m) for m in result.sampled_ms},
                                     "trials": result.trials, "batch": tuner.batch})
        out["wall"] = time.perf_counter() - start
        out["task_seconds"] = list(cluster.task_seconds)
        out["joint_seconds"] = list(cluster.joint_seconds)
        out["overhead_s"] = task_overhead(cluster)
        return out
    finally:
        cluster.shutdown()
        if old_cache is None:
            os.environ.pop("SHAPESHIFT_CACHE_DIR", None)
        else:
            os.environ["SHAPESHIFT_CACHE_DIR"] = old_cache
        shutil.rmtree(tmp, ignore_errors=True)


def task_overhead(cluster: RayCluster) -> float:
    """Seconds of Ray's round trip per task: empty tasks submitted at once, per task."""
    noop = cluster.ray.remote(num_cpus=1)(lambda: None)
    cluster.ray.get([noop.remote() for _ in range(10)])  # warm the workers
    start = time.perf_counter()
    cluster.ray.get([noop.remote() for _ in range(OVERHEAD_TASKS)])
    return (time.perf_counter() - start) / OVERHEAD_TASKS


def replay(trace: dict, tasks: int, trials: int, workers: int) -> tuple[float, float]:
    """(wall seconds, driver seconds) of ``tasks`` tunings of ``trials`` candidates on
    ``workers`` workers, replaying the measured task times (see the module docstring)."""
    durations = sorted(trace["task_seconds"], reverse=True)
    per_round_driver = trace["driver_per_round"]
    batch = max(4, workers)
    wall = driver = 0.0
    k = 0
    for _ in range(tasks):
        left = trials
        while left > 0:
            n = min(batch, left)
            left -= n
            queues = [0.0] * min(workers, n)
            for i in range(n):  # longest first onto the emptiest queue
                j = min(range(len(queues)), key=queues.__getitem__)
                queues[j] += durations[k % len(durations)] + trace["overhead_s"]
                k += 1
            wall += per_round_driver + max(queues)
            driver += per_round_driver
        wall += sum(trace["joint_per_task"])
    return wall, driver


def main() -> None:
    args = parse_args()
    workloads = [GemmWorkload(*map(int, spec.split("x")), args.lo, args.hi) for spec in args.gemm.split(",")]
    runs = {w: tune_on(w, workloads, args) for w in (1, 2)}
    one, two = runs[1], runs[2]
    # The replay's driver time per round: wall time not spent waiting on tasks, from the
    # 1-worker run (tasks one after another there: its waiting is their sum).
    rounds = sum(math.ceil(t["trials"] / t["batch"]) for t in one["tasks"])
    waited = sum(one["task_seconds"]) + sum(one["joint_seconds"]) + one["overhead_s"] * len(one["task_seconds"])
    trace = {"task_seconds": one["task_seconds"], "overhead_s": two["overhead_s"],
             "driver_per_round": max(0.0, (one["wall"] - waited) / max(1, rounds)),
             "joint_per_task": [s / len(workloads) for s in [sum(one["joint_seconds"])]]}
    sims = {w: replay(trace, len(workloads), args.replay_trials, w) for w in WORKERS}
    text = report(args, runs, trace, sims)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    plot(sims, args.output.with_suffix(".png"))
    print(text)


def report(args, runs: dict, trace: dict, sims: dict) -> str:
    one, two = runs[1], runs[2]
    lines = ["# Tuning on a Ray cluster: 1 and 2 single-CPU workers, and a replay to 128", "", machine.describe(), "",
             f"Command: `python bench/cluster.py --gemm {args.gemm} --lo {args.lo} --hi {args.hi} --trials "
             f"{args.trials} --seed {args.seed} --replay-trials {args.replay_trials}`", "",
             "## Measured (local cluster on this machine)", "",
             f"- 1 worker: {one['wall']:.0f} s; 2 workers: {two['wall']:.0f} s; speed-up "
             f"**{one['wall'] / two['wall']:.2f}x** (target >= 1.7x)",
             f"- candidate tasks (build + measurement on the node): median "
             f"{statistics.median(one['task_seconds']):.2f} s over {len(one['task_seconds'])}; joint timings "
             f"{sum(one['joint_seconds']):.1f} s in all; Ray round trip {trace['overhead_s'] * 1e3:.1f} ms a task; "
             f"driver {trace['driver_per_round']:.2f} s a round", "",
             "| task | M | GFLOPS, 1 worker | GFLOPS, 2 workers | ratio |", "|---|---:|---:|---:|---:|"]
    worst = math.inf
    for a, b in zip(one["tasks"], two["tasks"]):
        for m, g in a["gflops"].items():
            ratio = b["gflops"].get(m, math.nan) / g
            worst = min(worst, ratio)
            lines.append(f"| {a['workload'][:40]} | {m} | {g:.1f} | {b['gflops'].get(m, math.nan):.1f} | {ratio:.2f} |")
    lines += ["", f"Worst 2-worker / 1-worker dispatcher GFLOPS: {worst:.2f} (target: within 5%).", "",
              f"## Replay on W workers ({args.replay_trials} trials per task, {len(args.gemm.split(','))} tasks)", "",
              "| workers | wall s | speed-up | driver share |", "|---:|---:|---:|---:|"]
    base = sims[1][0]
    for w, (wall, driver) in sims.items():
        lines.append(f"| {w} | {wall:.0f} | {base / wall:.1f}x | {100 * driver / wall:.1f}% |")
    lines.append("")
    return "\n".join(lines)


def plot(sims: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ws = list(sims)
    base = sims[1][0]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ws, [base / sims[w][0] for w in ws], "o-", label="replayed speed-up")
    ax.plot(ws, ws, ":", label="linear")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("speed-up over 1 worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
