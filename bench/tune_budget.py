"""`shapeshift tune` within a wall-clock budget against OpenBLAS, over a whole range of M.

    python bench/tune_budget.py [--gemm 768 3072] [--lo 1] [--hi 512] [--budget-min 3] [--threads 1]
                                [--dense-to 64] [--step 16] [--repeats 5] [--passes 2] [--sample-ms 2.5]
                                [--output bench/results/dietcode_768x3072.md]

The target-description issue's acceptance: the dense GEMM C[M,N] = A[M,K] x B[K,N] (B a
constant weight) tuned by dietcode from an empty database within ``--budget-min`` minutes
(TuneConfig.time_budget_s; the trial count is left unbounded so the budget is what stops
it), then timed at every M up to ``--dense-to`` and every ``--step``-th M after, against
numpy's OpenBLAS (``matmul(..., out=)``, OPENBLAS_NUM_THREADS set before numpy loads),
onnxruntime and our untuned default, interleaved in one child process
(bench/dietcode_timing.py: every output checked against numpy first; fastest of
``--repeats`` samples per pass, ``--passes`` passes alternately forwards and backwards).

Writes OUTPUT (markdown): the machine (CPU model, flags, measured FMA peak), the tuning
(wall time, trials, kernels, held-out Spearman), a per-M table (GFLOPS of each, % of the
measured peak, ratio to OpenBLAS) and the targets: geomean >= 1.2x OpenBLAS, and no M below
0.9x. The raw rows go to OUTPUT with ``.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from dietcode import run_timing  # noqa: E402
from shapeshift.codegen.defaults import default_schedule  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.tune.runner import RunnerConfig  # noqa: E402
from shapeshift.tune.search import TuneConfig, Tuner  # noqa: E402
from shapeshift.tune.workload import GemmWorkload  # noqa: E402

GEOMEAN_TARGET = 1.2
WORST_TARGET = 0.9
# dietcode stops on the budget, not on a trial count.
UNBOUNDED_TRIALS = 10_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemm", type=int, nargs=2, metavar=("K", "N"), default=[768, 3072])
    parser.add_argument("--lo", type=int, default=1)
    parser.add_argument("--hi", type=int, default=512)
    parser.add_argument("--budget-min", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dense-to", type=int, default=64, help="time every M up to this ...")
    parser.add_argument("--step", type=int, default=16, help="... then every step-th M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--sample-ms", type=float, default=2.5)
    parser.add_argument("--output", type=Path)
    return parser.parse_args()


def grid(lo: int, hi: int, dense_to: int, step: int) -> list[int]:
    ms = set(range(lo, min(hi, dense_to) + 1)) | set(range(max(lo, dense_to + step), hi + 1, step)) | {hi}
    return sorted(ms)


def main() -> None:
    args = parse_args()
    k, n = args.gemm
    output = args.output or ROOT / "bench" / "results" / f"dietcode_{k}x{n}.md"
    workload = GemmWorkload(k, n, args.lo, args.hi)
    tmp = Path(tempfile.mkdtemp(prefix="tune_budget_"))
    try:
        print(f"tuning {workload.describe()} within {args.budget_min:g} min, {args.threads} thread(s)", flush=True)
        cfg = TuneConfig(strategy="dietcode", trials=UNBOUNDED_TRIALS, time_budget_s=args.budget_min * 60,
                         threads=args.threads, runner=RunnerConfig(threads=args.threads))
        start = time.perf_counter()
        with Database(tmp / "tune.db") as db:
            result = Tuner(workload, db, tmp / "cache", cfg, log=lambda s: print("  " + s, flush=True)).run()
        wall = time.perf_counter() - start
        print(f"tuned: {wall:.0f} s, {result.trials} trials, {len(result.kernels)} kernel(s)", flush=True)
        libraries = {"dietcode": {"kernels": [dataclasses.asdict(s) for s in result.kernels], "tree": result.tree},
                     "untuned": {"kernels": [dataclasses.asdict(default_schedule())], "tree": {"leaf": 0}}}
        ms = grid(args.lo, args.hi, args.dense_to, args.step)
        spec = {"kind": "dense", "k": k, "n": n, "threads": args.threads, "repeats": args.repeats,
                "passes": args.passes, "sample_s": args.sample_ms / 1e3, "libraries": libraries,
                "points": [{"m": m, "ours": {"dispatcher": "dietcode", "untuned": "untuned"}} for m in ms]}
        timed = run_timing(spec, args.threads, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = report(args, workload, result, wall, timed)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    output.with_suffix(".json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                       "wall_s": wall, "trials": result.trials,
                                                       "kernels": [dataclasses.asdict(s) for s in result.kernels],
                                                       "tree": result.tree, "rows": timed["rows"],
                                                       "blas": timed["blas"]}, indent=1))
    print(text)
    print(f"wrote {output}")


def report(args, workload: GemmWorkload, result, wall: float, timed: dict) -> str:
    peak = machine.peak_gflops() * args.threads
    lines = [f"# `shapeshift tune` within {args.budget_min:g} minutes against OpenBLAS: {workload.describe()}", "",
             machine.describe(), "",
             f"Command: `python bench/tune_budget.py --gemm {args.gemm[0]} {args.gemm[1]} --lo {args.lo} --hi {args.hi} "
             f"--budget-min {args.budget_min:g} --threads {args.threads} --dense-to {args.dense_to} --step {args.step} "
             f"--repeats {args.repeats} --passes {args.passes} --sample-ms {args.sample_ms:g}`", "",
             f"Tuning (dietcode, empty database): {wall:.0f} s wall, {result.trials} trials, "
             f"{len(result.kernels)} kernel(s), cost model held-out Spearman "
             + (f"{result.spearman:.2f}" if result.spearman is not None else "n/a") + ".", "",
             f"Timing: {args.threads} thread(s); fastest of {args.repeats} interleaved samples per pass over "
             f"{args.passes} passes; % peak against {peak:.0f} GFLOPS ({args.threads} x the measured FMA peak "
             "of one core).", "",
             "| M | kernel | tuned GFLOPS | % peak | untuned | OpenBLAS | onnxruntime | tuned / OpenBLAS |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for row in timed["rows"]:
        g = row["gflops"]
        ratio = g["dispatcher"] / g["numpy"]
        ratios.append((row["m"], ratio))
        lines.append(f"| {row['m']} | {row['kernel']} | {g['dispatcher']:.1f} | {100 * g['dispatcher'] / peak:.0f}% | "
                     f"{g['untuned']:.1f} | {g['numpy']:.1f} | {g.get('onnxruntime', math.nan):.1f} | {ratio:.2f} |")
    geomean = math.exp(sum(math.log(r) for _, r in ratios) / len(ratios))
    worst_m, worst = min(ratios, key=lambda x: x[1])
    lines += ["", "## Targets", "",
              f"- geomean tuned / OpenBLAS over the {len(ratios)} Ms: **{geomean:.2f}** (target >= {GEOMEAN_TARGET}: "
              f"{'met' if geomean >= GEOMEAN_TARGET else 'NOT met'})",
              f"- worst: **{worst:.2f}** at M = {worst_m} (target >= {WORST_TARGET}: "
              f"{'met' if worst >= WORST_TARGET else 'NOT met'})",
              f"- Ms below {WORST_TARGET}: {', '.join(str(m) for m, r in ratios if r < WORST_TARGET) or 'none'}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
