"""Tuning on a Ray cluster: 1 against 2 single-CPU workers here, and a replay on 1-128 workers.

    python bench/cluster.py [--gemm 768x768,768x3072] [--lo 1] [--hi 128] [--trials 16] [--seed 0]
                            [--replay-trials 256] [--output bench/results/cluster.md]
    python bench/cluster.py --replay bench/results/cluster.json [--replay-trials 256] [--output ...]

Part 1, measured: the same dense GEMM tasks (BERT-base weight shapes, M in [lo, hi]) tuned
from an empty database with the same trials and seed on ``--cluster local:1`` and on
``local:2`` (tune/cluster.py: every candidate built and measured as a Ray task on a worker
of one CPU, drawn asynchronously as slots free up). Reports the wall time of each, the
ratio, and the dispatcher's GFLOPS of both at every sampled M (as each run measured them,
taken together in worker processes). The 1-worker run's trace is written beside OUTPUT
(.json); ``--replay TRACE`` replays a trace without measuring again.

Part 2, a replay: how the wall time would fall with W workers, by an event simulation of
what the tuner does on a cluster (search.py). Per task: the search keeps
IN_FLIGHT_PER_SLOT x W candidates in flight, one worker each as workers free up (first in,
first out); the driver takes the results one at a time in the order they finish, spends its
measured seconds per result (recording it) and per draw (drawing the next candidate), and
every max(batch, W) results refits the cost model and evolves the pool (the fit's seconds
measured here at the replay's row counts, with the held-out Spearman's second fit where the
rows grew by half since it was last taken, as search.Tuner._fit does; the scoring after it, the measured seconds per
(schedule, M) predicted times the pool, the measured candidates and those in flight).
Then the post-search candidates (probes, validation) go out at once, and each joint timing
is split by M into W chunks (search.split_by_cost, on the tuner's own estimates), one task
each, lasting the measured fixed cost of a joint task plus its share of the measured timing.
Task seconds replay the 1-worker run's candidate tasks in their order, each with Ray's
round trip (``OVERHEAD_TASKS`` empty tasks). The driver share is its busy seconds over the
wall time. Writes the table and a plot (OUTPUT with .png).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import random
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
from shapeshift.tune.cost_model import CostModel  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.tune.runner import RunnerConfig  # noqa: E402
from shapeshift.tune.search import IN_FLIGHT_PER_SLOT, TuneConfig, Tuner, split_by_cost  # noqa: E402
from shapeshift.tune.workload import GemmWorkload  # noqa: E402

OVERHEAD_TASKS = 200
WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)
# Rows the cost model's fit is timed at (the replay interpolates between them), and joint
# tasks of one kernel at one M timed for the fixed cost of a joint timing's task.
FIT_ROWS = (64, 256, 1024)
FIXED_TASKS = 3


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
    parser.add_argument("--replay", type=Path, default=None, metavar="TRACE",
                        help="replay this trace (a run's .json) instead of measuring")
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
                    "trials": result.trials, "batch": tuner.batch,
                    "candidate_tasks": len(cluster.task_seconds) - tasks0,
                    "search_rows": tuner.search_rows, "samples": len(tuner.ms),
                    "driver_s": dict(tuner.driver_s), "driver_n": dict(tuner.driver_n),
                    "joint_costs": [{str(m): c for m, c in costs.items()} for costs in tuner.joint_costs]})
        out["wall"] = time.perf_counter() - start
        out["task_seconds"] = list(cluster.task_seconds)
        out["joint_tasks"] = list(cluster.joint_tasks)
        out["overhead_s"] = task_overhead(cluster)
        out["joint_fixed_s"] = joint_fixed(cluster, workloads[0])
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


def fit_seconds(workload: GemmWorkload, rows: tuple[int, ...] = FIT_ROWS,
                holdout: bool = False) -> dict[int, float]:
    """The driver's seconds to fit the cost model on each number of rows (random schedules of
    this machine at the sampled Ms; the fit's time does not depend on the values), with or
    without the held-out Spearman's second fit."""
    from shapeshift.target import host_target
    from shapeshift.tune.gemm_family import GEMM
    from shapeshift.tune.workload import uniform_samples

    rng, target = random.Random(0), host_target()
    ms = uniform_samples(workload.lo, workload.hi, 10)
    out = {}
    for n in rows:
        data = [(GEMM.random(rng, target), rng.choice(ms)) for _ in range(n)]
        ys = [rng.uniform(2.0, 5.0) for _ in data]
        model = CostModel(workload, 1)
        model.fit(data[:16], ys[:16])  # the first fit imports scikit-learn
        start = time.perf_counter()
        model.fit(data, ys, holdout=holdout)
        out[n] = time.perf_counter() - start
    return out


def make_trace(one: dict, fits: dict[int, float], holdout_fits: dict[int, float]) -> dict:
    """What the replay needs, from the 1-worker run (tasks one after another: no contention)."""
    tasks = one["tasks"]

    def per(kind: str) -> float:
        n = sum(t["driver_n"].get(kind, 0) for t in tasks)
        return sum(t["driver_s"].get(kind, 0.0) for t in tasks) / max(1, n)

    candidate_tasks = sum(t["candidate_tasks"] for t in tasks)
    # Each task's joint timings in the order they ran (one chunk each, on the one worker),
    # with the tuner's estimated cost at each M.
    measured = iter(s for _, s in one["joint_tasks"])
    joint = [[{"costs": {str(m): c for m, c in costs.items()}, "seconds": next(measured)} for costs in t["joint_costs"]]
             for t in tasks]
    def total(kind: str, counts: str = "driver_s") -> float:
        return sum(t[counts].get(kind, 0) for t in tasks)

    # A draw's own seconds, less the scoring it asked for (which the replay counts per
    # refit, in proportion to the schedules scored).
    draw_s = (total("pick") + total("pool") - total("score")) / max(1, total("pick", "driver_n"))
    return {"task_seconds": one["task_seconds"], "overhead_s": one["overhead_s"],
            "joint_fixed_s": one["joint_fixed_s"], "record_s": per("record"), "draw_s": draw_s,
            "score_row_s": total("score") / max(1, total("scored", "driver_n")),
            "samples": tasks[0]["samples"], "fit_rows": {str(n): s for n, s in fits.items()},
            "holdout_fit_rows": {str(n): s for n, s in holdout_fits.items()},
            "rows_per_result": sum(t["search_rows"] for t in tasks) / max(1, sum(t["trials"] for t in tasks)),
            "trials": sum(t["trials"] for t in tasks) / len(tasks),
            "post_tasks": sum(t["candidate_tasks"] - t["trials"] for t in tasks) / len(tasks),
            "joint": joint, "population": TuneConfig().population, "batch": TuneConfig().batch}


class Replay:
    """The event simulation of the module docstring, for one number of workers."""

    def __init__(self, trace: dict, workers: int):
        self.trace, self.workers = trace, workers
        self.free = [0.0] * workers  # when each worker is next free (a heap)
        self.t = 0.0  # the driver's clock
        self.busy = 0.0  # the driver's own seconds
        self.durations = itertools.cycle(trace["task_seconds"])
        rows = sorted((int(n), s) for n, s in trace["fit_rows"].items())
        self._fit_rows, self._fit_s = [n for n, _ in rows], [s for _, s in rows]
        # A trace from before the held-out fit was occasional timed every fit with it.
        rows = sorted((int(n), s) for n, s in trace.get("holdout_fit_rows", trace["fit_rows"]).items())
        self._holdout_rows, self._holdout_s = [n for n, _ in rows], [s for _, s in rows]
        self._last_holdout = 0.0  # rows at the last held-out fit

    def drive(self, seconds: float) -> None:
        self.t += seconds
        self.busy += seconds

    def run(self, seconds: float) -> float:
        """A task submitted now, on the first free worker; when it is back."""
        start = max(self.t, heapq.heappop(self.free))
        end = start + seconds + self.trace["overhead_s"]
        heapq.heappush(self.free, end)
        return end

    def fit(self, results: int) -> float:
        rows = results * self.trace["rows_per_result"]
        if rows >= 1.5 * self._last_holdout:
            self._last_holdout = rows
            return float(max(0.0, _interp(rows, self._holdout_rows, self._holdout_s)))
        return float(max(0.0, _interp(rows, self._fit_rows, self._fit_s)))

    def refit(self, results: int, in_flight: int) -> float:
        """A refit's seconds: the fit, then scoring the pool and every measured candidate (the
        next pool), half a pool of new ones and those in flight, at every sampled M."""
        pop = self.trace["population"]
        scored = (pop + results + pop // 2 + in_flight) * self.trace["samples"]
        return self.fit(results) + scored * self.trace["score_row_s"]

    def search(self, trials: int) -> None:
        limit, every = IN_FLIGHT_PER_SLOT * self.workers, max(self.trace["batch"], self.workers)
        back: list[float] = []
        drawn = done = since = 0

        def draw() -> None:
            nonlocal drawn
            self.drive(self.trace["draw_s"])
            heapq.heappush(back, self.run(next(self.durations)))
            drawn += 1

        while drawn < min(limit, trials):
            draw()
        while back:
            self.t = max(self.t, heapq.heappop(back))
            self.drive(self.trace["record_s"])
            done += 1
            since += 1
            if since >= every:
                self.drive(self.refit(done, len(back)))
                since = 0
            if drawn < trials:
                draw()
        if since:
            self.drive(self.fit(done))

    def wave(self, durations: list[float]) -> None:
        """Tasks sent at once and all waited for, each result recorded."""
        for end in sorted(self.run(d) for d in durations):
            self.t = max(self.t, end)
            self.drive(self.trace["record_s"])

    def task(self, trials: int, joint: list[dict]) -> None:
        self.search(trials)
        self.wave([next(self.durations) for _ in range(round(self.trace["post_tasks"]))])
        self.drive(self.fit(trials))
        fixed = self.trace["joint_fixed_s"]
        for timing in joint:
            costs = {int(m): c for m, c in timing["costs"].items()}
            total, variable = sum(costs.values()) or 1.0, max(0.0, timing["seconds"] - fixed)
            chunks = split_by_cost(list(costs), list(costs.values()), self.workers)
            self.wave([fixed + variable * sum(costs[m] for m in c) / total for c in chunks])
            self.drive(self.fit(trials))


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    """Linear through the measured points, extended along the last segment."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0] * x / xs[0] if xs[0] else ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def replay(trace: dict, trials: int, workers: int) -> tuple[float, float]:
    """(wall seconds, driver seconds) of the trace's tasks tuned with ``trials`` candidates
    each on ``workers`` workers (see the module docstring)."""
    sim = Replay(trace, workers)
    for joint in trace["joint"]:
        sim.task(trials, joint)
    return sim.t, sim.busy


def main() -> None:
    args = parse_args()
    if args.replay is not None:
        runs, trace = None, json.loads(args.replay.read_text())
    else:
        workloads = [GemmWorkload(*map(int, spec.split("x")), args.lo, args.hi) for spec in args.gemm.split(",")]
        runs = {w: tune_on(w, workloads, args) for w in (1, 2)}
        trace = make_trace(runs[1], fit_seconds(workloads[-1]), fit_seconds(workloads[-1], holdout=True))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".json").write_text(json.dumps(trace, indent=1))
    sims = {w: replay(trace, args.replay_trials, w) for w in WORKERS}
    text = report(args, runs, trace, sims)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    plot(sims, args.output.with_suffix(".png"))
    print(text)


def report(args, runs, trace: dict, sims: dict) -> str:
    lines = ["# Tuning on a Ray cluster: 1 and 2 single-CPU workers, and a replay to 128", "", machine.describe(), ""]
    if runs is None:
        lines += [f"Command: `python bench/cluster.py --replay {args.replay} --replay-trials {args.replay_trials}`", ""]
    else:
        one, two = runs[1], runs[2]
        joint = sum(s for _, s in one["joint_tasks"])
        lines += [f"Command: `python bench/cluster.py --gemm {args.gemm} --lo {args.lo} --hi {args.hi} --trials "
                  f"{args.trials} --seed {args.seed} --replay-trials {args.replay_trials}`", "",
                  "## Measured (local cluster on this machine)", "",
                  f"- 1 worker: {one['wall']:.0f} s; 2 workers: {two['wall']:.0f} s; speed-up "
                  f"**{one['wall'] / two['wall']:.2f}x** (target >= 1.7x)",
                  f"- candidate tasks (build + measurement on the node): median "
                  f"{statistics.median(one['task_seconds']):.2f} s over {len(one['task_seconds'])}; joint timings "
                  f"{joint:.1f} s in all", "",
                  "| task | M | GFLOPS, 1 worker | GFLOPS, 2 workers | ratio |", "|---|---:|---:|---:|---:|"]
        worst = math.inf
        for a, b in zip(one["tasks"], two["tasks"]):
            for m, g in a["gflops"].items():
                ratio = b["gflops"].get(m, math.nan) / g
                worst = min(worst, ratio)
                lines.append(f"| {a['workload'][:40]} | {m} | {g:.1f} | {b['gflops'].get(m, math.nan):.1f} | "
                             f"{ratio:.2f} |")
        lines += ["", f"Worst 2-worker / 1-worker dispatcher GFLOPS: {worst:.2f} (target: within 5%).", ""]
    fits = ", ".join(f"{n} rows {s:.2f} s" for n, s in trace["fit_rows"].items())
    if "holdout_fit_rows" in trace:
        fits += " (with the held-out Spearman's fit: " + ", ".join(
            f"{s:.2f}" for s in trace["holdout_fit_rows"].values()) + " s)"
    lines += [f"## Replay on W workers ({args.replay_trials} trials per task, {len(trace['joint'])} tasks)", "",
              f"Inputs (1-worker run): {len(trace['task_seconds'])} candidate tasks, median "
              f"{statistics.median(trace['task_seconds']):.2f} s, mean {statistics.mean(trace['task_seconds']):.2f} s; "
              f"{sum(len(j) for j in trace['joint'])} joint timings, {sum(t['seconds'] for j in trace['joint'] for t in j):.1f} s "
              f"in all, fixed {trace['joint_fixed_s']:.2f} s a task; Ray round trip {trace['overhead_s'] * 1e3:.1f} ms a "
              f"task; driver {trace['record_s'] * 1e3:.1f} ms a result, {trace['draw_s'] * 1e3:.1f} ms a draw, "
              f"{trace['score_row_s'] * 1e6:.0f} us a (schedule, M) scored, {trace['rows_per_result']:.1f} Ms a "
              f"candidate; cost-model fit {fits}.", "",
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
