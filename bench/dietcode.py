"""DietCode-style tuning against per-shape and pad-max on one BERT dense layer.

    python bench/dietcode.py [--k 768] [--n 768] [--lo 1] [--hi 128] [--trials 30] [--minutes 1.5]

Each strategy tunes from an empty database and an empty compile cache (so wall times are
comparable), then its dispatcher library (all chosen kernels plus ``ss_gemm_tuned``) is
compiled, checked against numpy and timed at the sampled M values next to numpy matmul,
both on one thread. The first row is the baseline: the hand-tuned default schedule alone,
untuned. Writes bench/results/dietcode.md.
"""

from __future__ import annotations

import os

# One thread for numpy's BLAS as for ours; set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from shapeshift.codegen.build import compile_library  # noqa: E402
from shapeshift.tune import dispatch  # noqa: E402
from shapeshift.tune.database import Database  # noqa: E402
from shapeshift.codegen.kernels.gemm import GemmSchedule  # noqa: E402
from shapeshift.tune.search import STRATEGIES, TuneConfig, Tuner, TuneResult  # noqa: E402
from shapeshift.tune.workload import GemmWorkload  # noqa: E402

REPEATS, SAMPLE_S = 5, 0.003


def _median_time(fn, calls_for) -> float:
    fn(1)
    calls = calls_for
    return statistics.median(fn(calls) for _ in range(REPEATS))


def time_dispatcher(result, cache: Path) -> dict[int, tuple[float, float, int]]:
    """M -> (ours s/call, numpy s/call, kernel index)."""
    w = result.workload
    lib = dispatch.load(compile_library(dispatch.library_source(result.kernels, result.tree), name_hint="tuned",
                                        cache_dir=cache).cdll)
    lib.ss_set_num_threads(1)
    rng = np.random.default_rng(0)
    b = rng.standard_normal((w.k, w.n)).astype(np.float32)
    packed = np.empty(lib.ss_gemm_tuned_packed_b_size(w.k, w.n), dtype=np.float32)
    lib.ss_gemm_tuned_pack_b(w.k, w.n, b.ctypes.data, w.n, 1, packed.ctypes.data)
    out = {}
    for m in result.sampled_ms:
        a = rng.standard_normal((m, w.k)).astype(np.float32)
        c = np.empty((m, w.n), dtype=np.float32)
        first = lib.ss_gemm_tuned_bench(1, m, w.n, w.k, a.ctypes.data, packed.ctypes.data, c.ctypes.data)
        assert np.allclose(c, a.astype(np.float64) @ b, rtol=1e-3, atol=1e-2), f"dispatcher wrong at M={m}"
        calls = max(1, int(SAMPLE_S / max(first, 1e-7)))
        ours = statistics.median(lib.ss_gemm_tuned_bench(calls, m, w.n, w.k, a.ctypes.data, packed.ctypes.data,
                                                         c.ctypes.data) for _ in range(REPEATS))

        def numpy_sample(n_calls: int) -> float:
            start = time.perf_counter()
            for _ in range(n_calls):
                a @ b
            return (time.perf_counter() - start) / n_calls

        ref = _median_time(numpy_sample, calls)
        out[m] = (ours, ref, lib.ss_gemm_tuned_choice(m))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--n", type=int, default=768)
    parser.add_argument("--lo", type=int, default=1)
    parser.add_argument("--hi", type=int, default=128)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=1.5, help="time budget per strategy")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "dietcode.md")
    args = parser.parse_args()
    w = GemmWorkload(args.k, args.n, args.lo, args.hi)
    load_before = os.getloadavg()[0]
    rows, summary = [], []
    with tempfile.TemporaryDirectory() as tmp:
        # Baseline: the hand-tuned default schedule alone, untuned.
        default = TuneResult(w, "default", w.sampled_ms(), [GemmSchedule()], {"leaf": 0}, {}, 0, 0, 0.0, None)
        timed = time_dispatcher(default, Path(tmp) / "default")
        gf = {m: (w.flops(m) / o / 1e9, w.flops(m) / r / 1e9, k) for m, (o, r, k) in timed.items()}
        rows.append(("default schedule", gf))
        ratio = statistics.geometric_mean([g[0] / g[1] for g in gf.values()])
        summary.append(f"| default schedule (untuned) | 0 | 0 | 1 | {ratio:.2f} | - |")
        print(summary[-1], flush=True)
        for strategy in STRATEGIES:
            print(f"== {strategy}", flush=True)
            base = Path(tmp) / strategy
            base.mkdir()
            with Database(base / "tune.db") as db:
                cfg = TuneConfig(strategy=strategy, trials=args.trials, time_budget_s=args.minutes * 60)
                result = Tuner(w, db, base / "cache", cfg).run()
            timed = time_dispatcher(result, base / "cache")
            gf = {m: (w.flops(m) / o / 1e9, w.flops(m) / r / 1e9, k) for m, (o, r, k) in timed.items()}
            rows.append((strategy, gf))
            ratio = statistics.geometric_mean([g[0] / g[1] for g in gf.values()])
            summary.append(f"| {strategy} | {result.trials} | {result.wall_s:.0f} | {len(result.kernels)} | "
                           f"{ratio:.2f} | " + (f"{result.spearman:.2f}" if result.spearman is not None else "-") + " |")
            print(summary[-1], flush=True)
    ms = rows[0][1].keys()
    # numpy is timed next to each dispatcher; the median of those timings is shown.
    head = "| M | numpy GFLOPS | " + " | ".join(f"{s} GFLOPS (kernel)" for s, _ in rows) + " |"
    table = [head, "|" + "---|" * (2 + len(rows))]
    for m in ms:
        ref = statistics.median(g[m][1] for _, g in rows)
        table.append(f"| {m} | {ref:.1f} | " + " | ".join(f"{g[m][0]:.1f} ({g[m][2]})" for _, g in rows) + " |")
    text = (
        "# DietCode-style tuning: dietcode vs per-shape vs pad-max\n\n"
        f"`python bench/dietcode.py --trials {args.trials} --minutes {args.minutes:g}` on {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared with other work: 1-minute load {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after), numpy {np.__version__}. Workload: {w.describe()}. "
        "Everything on one thread (OPENBLAS_NUM_THREADS=1 for numpy). Each strategy starts from an empty "
        "database and compile cache. GFLOPS: median of 5 samples of about 3 ms, the dispatcher "
        "(`ss_gemm_tuned`, called from a C loop) and `a @ b` in a Python loop; the numpy column is the "
        "median of the numpy timings (one next to each dispatcher); the ratio column divides by "
        "the numpy timing taken next to that strategy. Kernel: the index `ss_gemm_tuned_choice` picked. Timings on this shared machine can be off by 20% or more.\n\n"
        "| strategy | trials | tuning wall s | kernels | geomean ours/numpy | cost-model Spearman (held out) |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(summary) + "\n\n" + "\n".join(table) + "\n")
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
