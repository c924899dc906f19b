"""Issue #5's bench: DietCode-style tuning against per-shape tuning, pad-max, OpenBLAS and
onnxruntime on the BERT-base GEMMs and attention matmuls, over a whole range of sequence
lengths T.

    python bench/dietcode.py [--workloads 768x768,768x3072,3072x768,768x2304] [--batches 1,16]
                             [--attention qk,pv] [--threads 1,2] [--lo 1] [--hi 512] [--trials 32]
                             [--per-shape-trials 8]
                             [--held-out 8] [--dense-to 128] [--step 8] [--repeats 5] [--passes 2] [--sample-ms 2.5]
                             [--output bench/results/dietcode.md] [--quick] [--dry-run]

Tasks: every (workload KxN, batch, threads) is a dense task, C[M,N] = A[M,K] x B[K,N] with B
a constant weight and M = batch x T, T in [lo, hi]; every (attention matmul, batch,
threads) is a batched task over 12 x batch heads, all operands contiguous: qk is
Q K^T, [b,12,T,64] x [b,12,64,T], and pv is P V, [b,12,T,T] x [b,12,T,64] (both T dims
dynamic; the tuner's dynamic value is T itself).

Per task, each strategy tunes from an empty database and compile cache (so wall times
compare): dietcode over the whole range, pad-max likewise, per-shape on the tuner's sampled
shapes (the same trials per shape, ``--per-shape-trials``), and per-shape on ``--held-out``
more shapes, each tuned alone as a one-point range. Then a child process
(bench/dietcode_timing.py, with the thread count fixed before numpy loads) checks and
times, interleaved at every point: the dispatcher and pad-max at every T of the grid (every
T up to ``--dense-to``, then every ``--step``-th), per-shape at its own shapes, numpy
(OpenBLAS) and onnxruntime MatMul at the same thread count, and for a batched task the
untuned default schedule too.

Writes OUTPUT (markdown: per-task summaries with issue #5's targets marked met / not met,
per-T tables), a PNG and the raw results (``.json``; ``--render`` writes the report again
from them) next to it, at the end; after every task, the results so far go to OUTPUT with
``.partial.md`` (and ``.partial.json``) so that a killed run leaves something. ``--quick`` is a
smoke test of the script (a few minutes), writing bench/results/dietcode_quick.md;
``--dry-run`` prints the tasks and the estimated time only (the default run takes hours).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dietcode_report as report  # noqa: E402
import machine  # noqa: E402
from shapeshift.codegen.kernels.gemm import GemmSchedule  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.tune.runner import RunnerConfig  # noqa: E402
from shapeshift.tune.search import TuneConfig, Tuner, TuneResult  # noqa: E402
from shapeshift.tune.workload import BatchedGemmWorkload, GemmWorkload  # noqa: E402

TIMING_SCRIPT = Path(__file__).resolve().parent / "dietcode_timing.py"

DEFAULTS = dict(workloads="768x768,768x3072,3072x768,768x2304", attention="qk,pv", batches="1,16", threads="1,2",
                lo=1, hi=512,
                trials=32, per_shape_trials=8, held_out=8, dense_to=128, step=8, repeats=5, passes=2,
                sample_ms=2.5,
                output=ROOT / "bench" / "results" / "dietcode.md")
QUICK = dict(DEFAULTS, workloads="768x768", attention="qk", batches="1", threads="1", hi=64, trials=8,
             per_shape_trials=2,
             held_out=4, dense_to=16, step=8, repeats=3, passes=1,
             output=ROOT / "bench" / "results" / "dietcode_quick.md")

# For the printed estimate only (a rough guide, calibrated on this shared 2-core machine).
# A trial is one candidate: its compile (~3 s, two at a time) and a worker process.
SECONDS_PER_TRIAL = 3.0
# A worker's measurement at one M costs about this many calls (warm-up, float64 check, 3
# samples of at least one call), at this many GFLOPS per thread.
CALLS_PER_MEASUREMENT = 8
ASSUMED_GFLOPS = 60.0
# Measurements per trial (a dietcode pick runs at every M where it is predicted best), plus
# the kernel-set validation (chosen kernels at every sampled M) per tuning run.
MEASUREMENTS_PER_TRIAL = 1.5
VALIDATION_MEASUREMENTS = 20


# ---- the plan ---------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", help="comma list of KxN (default %(default)s)")
    parser.add_argument("--attention", help="comma list of attention matmuls to tune: qk, pv (empty: none)")
    parser.add_argument("--batches", help="comma list; M = batch x T (dense), 12 x batch heads (attention)")
    parser.add_argument("--threads", help="comma list of thread counts")
    parser.add_argument("--lo", type=int, help="smallest T")
    parser.add_argument("--hi", type=int, help="largest T")
    parser.add_argument("--trials", type=int, help="dietcode and pad-max trials per task")
    parser.add_argument("--per-shape-trials", type=int, help="per-shape trials per shape")
    parser.add_argument("--held-out", type=int, help="held-out shapes per task, tuned by per-shape alone")
    parser.add_argument("--dense-to", type=int, help="time every T up to this ...")
    parser.add_argument("--step", type=int, help="... then every step-th T")
    parser.add_argument("--repeats", type=int, help="timed samples per method and point (fastest kept)")
    parser.add_argument("--passes", type=int, help="passes over the grid, alternately forwards and backwards")
    parser.add_argument("--sample-ms", type=float, help="each sample runs enough calls to last this long")
    parser.add_argument("--output", type=Path, help="markdown file; the PNG goes next to it")
    parser.add_argument("--quick", action="store_true", help="smoke configuration (a few minutes)")
    parser.add_argument("--dry-run", action="store_true", help="print the tasks and the time estimate, then stop")
    parser.add_argument("--render", type=Path, metavar="RESULTS.json",
                        help="write OUTPUT (and its plot) again from a run's saved results, measuring nothing")
    args = parser.parse_args()
    # --quick changes the defaults only: options given next to it still win.
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not 1 <= args.lo <= args.hi:
        parser.error(f"need 1 <= --lo <= --hi, got {args.lo}, {args.hi}")
    return args


def make_tasks(args: argparse.Namespace) -> list[dict]:
    """Dense tasks, then the attention tasks, per (threads, batch)."""
    shapes = [tuple(int(x) for x in w.lower().split("x")) for w in args.workloads.split(",") if w]
    ops = [op for op in args.attention.split(",") if op]
    for op in ops:
        if op not in report.ATTENTION_OPS:
            raise SystemExit(f"--attention: unknown matmul {op!r}; choose from {', '.join(report.ATTENTION_OPS)}")
    tasks = []
    for threads in (int(x) for x in args.threads.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            tasks += [{"kind": "dense", "k": k, "n": n, "batch": batch, "threads": threads} for k, n in shapes]
            tasks += [{"kind": "attention", "op": op, "batch": batch, "threads": threads} for op in ops]
    return tasks


def attention_workload(op: str, batch: int, lo: int, hi: int) -> BatchedGemmWorkload:
    """12 x batch contiguous heads: Q K^T ([T,64] x [64,T]) or P V ([T,T] x [T,64])."""
    heads, d = report.HEADS * batch, report.HEAD_DIM
    t, t2, c = (0, 1, 0), (0, 0, 1), (lambda x: (x, 0, 0))
    if op == "qk":
        return BatchedGemmWorkload(heads, t, t, c(d), ((0, d, 0), c(d), c(1)), ((0, d, 0), t, c(1)), (t2, t), lo, hi)
    return BatchedGemmWorkload(heads, t, c(d), t, (t2, t, c(1)), ((0, d, 0), c(d), c(1)), ((0, d, 0), c(d)), lo, hi)


def _timing_s(flops: list[float], methods: int, args: argparse.Namespace, threads: int) -> float:
    """The timing child: per pass, each method runs 2 + repeats samples of >= one call per point."""
    rate = ASSUMED_GFLOPS * 1e9 * threads
    per_call = [max(args.sample_ms / 1e3, f / rate) for f in flops]
    return args.passes * sum(methods * (2 + args.repeats) * c + 0.02 for c in per_call)


def estimate_s(task: dict, args: argparse.Namespace) -> float:
    grid = report.t_grid(args.lo, args.hi, args.dense_to, args.step)
    b, t = task["batch"], task["threads"]
    if task["kind"] == "attention":
        workload = attention_workload(task["op"], b, args.lo, args.hi)
        flops_at, methods = workload.flops, 5
    else:
        k, n = task["k"], task["n"]

        def flops_at(x: float) -> float:
            return 2.0 * k * n * b * x

        methods = 4
    samples = TuneConfig().samples
    trials = 2 * args.trials + args.per_shape_trials * (samples + args.held_out)
    runs = 3 + args.held_out
    mid_flops = flops_at((args.lo + args.hi) // 2)  # measurements spread over the range
    measure_s = CALLS_PER_MEASUREMENT * mid_flops / (ASSUMED_GFLOPS * 1e9 * t)
    tuning = trials * (SECONDS_PER_TRIAL + MEASUREMENTS_PER_TRIAL * measure_s) + 3 * VALIDATION_MEASUREMENTS * measure_s
    tuning += runs * 2.0  # start-up of a Tuner run (database, first cost-model fit)
    points = [flops_at(x) for x in grid] + [mid_flops] * (samples + args.held_out)
    return tuning + _timing_s(points, methods, args, t)


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def print_plan(tasks: list[dict], args: argparse.Namespace) -> None:
    grid = report.t_grid(args.lo, args.hi, args.dense_to, args.step)
    estimates = [estimate_s(task, args) for task in tasks]
    print(f"T grid: {len(grid)} points in [{args.lo}, {args.hi}] (every T to {args.dense_to}, then every "
          f"{args.step}th); trials: dietcode {args.trials}, pad-max {args.trials}, per-shape {args.per_shape_trials} "
          f"per shape on {TuneConfig().samples} sampled + {args.held_out} held-out shapes.")
    print(f"{len(tasks)} tasks, estimated {fmt_duration(sum(estimates))} in all (~{SECONDS_PER_TRIAL:g} s per "
          f"tuning trial plus the calls at large M; a rough guide):")
    for i, (task, est) in enumerate(zip(tasks, estimates), 1):
        print(f"  {i}. {report.task_label(task)}: ~{fmt_duration(est)}")
    sys.stdout.flush()


# ---- one task -----------------------------------------------------------------------------

def tune(workload: GemmWorkload | BatchedGemmWorkload, cfg: TuneConfig, root: Path, label: str
         ) -> tuple[TuneResult, float]:
    """One tuning from an empty database and compile cache; (result, wall seconds)."""
    print(f"    {label}: {workload.describe()}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="tune_", dir=root))
    start = time.perf_counter()
    with Database(folder / "tune.db") as db:
        result = Tuner(workload, db, folder / "cache", cfg, log=lambda s: print("      " + s, flush=True)).run()
    wall = time.perf_counter() - start
    shutil.rmtree(folder, ignore_errors=True)
    print(f"    {label}: {wall:.0f} s, {result.trials} trials, {len(result.kernels)} kernel(s)", flush=True)
    return result, wall


def library(result: TuneResult) -> dict:
    return {"kernels": [dataclasses.asdict(s) for s in result.kernels], "tree": result.tree}


def points(grid: list[int], batch: int, sampled: list[int], held: list[int]) -> list[dict]:
    """What to time at each M: the dispatcher and pad-max everywhere, per-shape at its shapes."""
    flags = {}
    for m in [batch * t for t in grid] + sampled + held:
        flags[m] = {"m": m, "t": m / batch, "grid": m % batch == 0 and m // batch in grid, "sampled": m in sampled,
                    "held_out": m in held, "ours": {"dispatcher": "dietcode", "pad-max": "pad-max"}}
        if m in sampled:
            flags[m]["ours"]["per-shape"] = "per-shape"
        elif m in held:
            flags[m]["ours"]["per-shape"] = f"held-out {m}"
    return [flags[m] for m in sorted(flags)]


def run_timing(spec: dict, threads: int, tmp: Path) -> dict:
    """bench/dietcode_timing.py in a child with the thread count fixed before numpy loads."""
    spec_path = Path(tempfile.mkstemp(suffix=".json", dir=tmp)[1])
    out_path = spec_path.with_suffix(".out.json")
    spec_path.write_text(json.dumps(dict(spec, cache_dir=str(tmp / "timing_cache"))))
    # Short spin-waits: three thread pools share one process and the cores.
    env = dict(os.environ, **machine.peer_env(threads), GOMP_SPINCOUNT="10000", OPENBLAS_THREAD_TIMEOUT="4")
    subprocess.run([sys.executable, str(TIMING_SCRIPT), str(spec_path), str(out_path)], env=env, check=True)
    return json.loads(out_path.read_text())


def run_task(task: dict, args: argparse.Namespace, tmp: Path) -> dict:
    threads = task["threads"]
    if task["kind"] == "dense":
        # The tuner's dynamic value is M = batch x T.
        batch = task["batch"]
        workload = GemmWorkload(task["k"], task["n"], batch * args.lo, batch * args.hi)

        def one_point(m: int):
            return GemmWorkload(task["k"], task["n"], m, m)
    else:
        # ... or T itself, the batch being part of the structure (12 x batch heads).
        batch = 1
        workload = attention_workload(task["op"], task["batch"], args.lo, args.hi)

        def one_point(m: int):
            return attention_workload(task["op"], task["batch"], m, m)

    def config(strategy: str, trials: int, **extra) -> TuneConfig:
        return TuneConfig(strategy=strategy, trials=trials, threads=threads, runner=RunnerConfig(threads=threads),
                          **extra)

    diet, diet_wall = tune(workload, config("dietcode", args.trials), tmp, "dietcode")
    pad, pad_wall = tune(workload, config("pad-max", args.trials), tmp, "pad-max")
    # The range's uniform samples (what per-shape tunes): dietcode's own lie below its
    # measurement cap at batch 16, and held-out shapes must spread over the whole range.
    sampled = workload.sampled_ms(TuneConfig().samples)
    # Every sampled shape may keep its own kernel: per-shape means tuned for exactly that M.
    per, per_wall = tune(workload, config("per-shape", args.per_shape_trials * len(sampled),
                                          max_kernels=len(sampled)), tmp, "per-shape (sampled shapes)")
    held = report.held_out_ms(sampled, batch, args.held_out)
    held_results = {m: tune(one_point(m), config("per-shape", args.per_shape_trials), tmp,
                            f"per-shape (held out, {'M' if task['kind'] == 'dense' else 'T'} = {m})")
                    for m in held}
    libraries = {"dietcode": library(diet), "pad-max": library(pad), "per-shape": library(per)}
    libraries.update({f"held-out {m}": library(r) for m, (r, _) in held_results.items()})
    grid = report.t_grid(args.lo, args.hi, args.dense_to, args.step)
    pts = points(grid, batch, sampled, held)
    if task["kind"] == "attention":  # what tuning gained over the hand-picked default
        libraries["untuned"] = {"kernels": [dataclasses.asdict(GemmSchedule())], "tree": {"leaf": 0}}
        for p in pts:
            p["ours"]["untuned"] = "untuned"
    print(f"    timing {len(pts)} points", flush=True)
    start = time.perf_counter()
    spec = {**{key: task[key] for key in ("kind", "k", "n", "op", "batch") if key in task},
            "threads": threads, "repeats": args.repeats, "passes": args.passes, "sample_s": args.sample_ms / 1e3,
            "libraries": libraries,
            "points": [{"m": p["m"], "ours": p["ours"]} for p in pts]}
    timed = run_timing(spec, threads, tmp)
    print(f"    timing: {time.perf_counter() - start:.0f} s", flush=True)
    rows = [dict({key: p[key] for key in ("m", "t", "grid", "sampled", "held_out")}, kernel=r["kernel"],
                 gflops=r["gflops"], gflops_median=r["gflops_median"]) for p, r in zip(pts, timed["rows"])]
    return {"task": task, "rows": rows, "blas": timed["blas"], "sampled_ms": sampled, "held_out_ms": held,
            "t_range": [args.lo, args.hi], "extrapolate_to": report.extrapolate_count(args.lo, args.hi),
            "wall": {"dietcode": diet_wall, "pad-max": pad_wall, "per-shape": per_wall,
                     "held-out": [w for _, w in held_results.values()]},
            "trials": {"dietcode": diet.trials, "pad-max": pad.trials, "per-shape (sampled)": per.trials,
                       "per-shape (held out)": sum(r.trials for r, _ in held_results.values())},
            "kernels": len(diet.kernels), "spearman": diet.spearman, "dietcode_ms": diet.sampled_ms}


# ---- output -----------------------------------------------------------------------------

METHOD = """How it was measured:

- Tuning: each strategy starts from an empty database and compile cache, so wall times compare. dietcode and
  pad-max tune the whole range of M = batch x T. per-shape tunes the tuner's sampled Ms in one run (the same
  trials per shape) and each held-out M alone, as a one-point range. Held-out shapes: midpoints between
  consecutive sampled Ms, rounded to a multiple of the batch (the shapes farthest from what dietcode measured).
- Per-shape tuning of every T in [1, 128] is not run: its time is **extrapolated** as (measured wall time per
  shape of the one-point per-shape tunings of the held-out shapes with T <= 128) x (number of T). Held-out
  shapes past T = 128 are left out of it: a larger M costs more to tune, and at batch 16 those reach M = 7744,
  which would lean in dietcode's favour; the summary also gives the ratio from all held-out shapes. The run
  over the sampled shapes is not used for it: its kernel-set validation measures every chosen kernel at every
  sampled M, which tuning each T alone does not do.
- Timing: one child process per task with OPENBLAS_NUM_THREADS and OMP_NUM_THREADS equal to the thread count
  and OpenBLAS on the kernel it picks for this CPU (bench/machine.py's peer_env)
  (onnxruntime: intra_op_num_threads, inter_op 1, all graph optimizations, spinning off; short spin-waits for
  OpenMP and OpenBLAS, so idle pools do not hold the cores). At every point each method runs once and its
  output is checked against numpy's; then the methods are sampled in turn, interleaved (samples of about
  --sample-ms; 3 samples when one call takes over 50 ms). The grid is timed in --passes passes, alternately
  forwards and backwards, so that a point's samples lie minutes apart, and each method's fastest sample over
  all passes is kept: other work on this machine only ever adds time, and comes in bursts of seconds that
  slowed every method at a run of neighbouring points, or some methods at one point, when each point was
  timed once. Every method is timed the same way; the summaries also give the ratios from the median samples.
- Attention tasks: the batched matmuls of 12 x batch heads, contiguous operands (Q [b,12,T,64], K^T
  [b,12,64,T], P [b,12,T,T], V [b,12,T,64]); the tuner's dynamic value is T (both T dims of the product
  follow it), so held-out and sampled shapes are Ts. Their tables add the untuned default schedule.
- Ours (`ss_gemm_tuned` of each dispatcher, B prepacked; `ss_bmm_tuned_gemm` for attention) is timed by a
  loop in C; numpy
  (`np.matmul(a, b, out=c)`) and onnxruntime (B an initializer, `run_with_iobinding` into a bound output) by
  Python loops, so they pay a few microseconds of call overhead per call, which shows at the smallest T.
- Per-shape tuned is timed at its own shapes only, as the dispatcher its tuning produced (the kernel its tree
  picks at that M). GFLOPS = 2MNK / time; the T grid of the summaries is the regular grid (sampled Ms that
  are not a multiple of the batch are extra rows).
- The machine is shared with other work: any figure may be off by 20% or more, 2-thread figures most."""


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor())


def header(load_before: float, started: str) -> dict:
    import numpy as np

    return {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {cpu_name()}, {os.cpu_count()} CPUs", "numpy": np.__version__,
            "onnxruntime": metadata.version("onnxruntime"), "load_before": load_before, "started": started,
            "method": METHOD}


def describe_blas(results: list[dict]) -> str:
    pools = next((r["blas"] for r in results if r.get("blas")), [])
    blas = [p for p in pools if p["internal_api"] in ("openblas", "mkl", "blis")]
    named = [f"{p['internal_api']} {p['version']}" + (f" ({p['architecture']} kernels)" if p.get("architecture") else "")
             for p in blas]
    return ", ".join(named) or "BLAS unknown (no threadpoolctl)"


def _plain(value):
    """A NumPy scalar as the Python number it holds (for json.dumps)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot save {type(value).__name__} in the results")


def write(args: argparse.Namespace, meta: dict, results: list[dict], final: bool) -> None:
    """OUTPUT (``.partial.md`` until the run ends) and the raw results beside it (``.json``),
    from which ``--render`` writes the report again (after a change to the summaries)."""
    meta = dict(meta, blas=describe_blas(results))
    partial = args.output.with_name(args.output.stem + ".partial.md")
    saved = args.output.with_suffix(".partial.json" if not final else ".json")
    report.write_atomic(saved, json.dumps({"meta": meta, "results": results}, indent=1, default=_plain))
    if not final:
        report.write_atomic(partial, report.render(meta, results, None, partial=True))
        return
    # The tables first: a run of an hour must not lose them to a failing plot.
    report.write_atomic(args.output, report.render(meta, results, None))
    partial.unlink(missing_ok=True)
    args.output.with_suffix(".partial.json").unlink(missing_ok=True)
    png = args.output.with_suffix(".png")
    if report.plot(results, png):
        report.write_atomic(args.output, report.render(meta, results, png.name))


def main() -> None:
    args = parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        write(args, saved["meta"], saved["results"], final=True)
        print(report.targets_section(saved["results"]))
        print(f"wrote {args.output} from {args.render}")
        return
    tasks = make_tasks(args)
    print_plan(tasks, args)
    if args.dry_run:
        return
    meta = header(os.getloadavg()[0], datetime.datetime.now().isoformat(timespec="seconds"))
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_dietcode_") as tmp:
        for i, task in enumerate(tasks, 1):
            print(f"== task {i}/{len(tasks)}: {report.task_label(task)} "
                  f"({(time.perf_counter() - start) / 60:.0f} min so far)", flush=True)
            results.append(run_task(task, args, Path(tmp)))
            for what, value, threshold, met in report.evaluate_targets(report.dense_summary(results[-1])):
                print(f"    {'met' if met else 'NOT met'}: {what} = {value:.3g} (>= {threshold:g})", flush=True)
            write(args, meta, results, final=False)
    meta.update(load_after=os.getloadavg()[0], took=fmt_duration(time.perf_counter() - start))
    write(args, meta, results, final=True)
    print(report.targets_section(results))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
