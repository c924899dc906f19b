"""`shapeshift tune --gemm K N --dynamic M=LO:HI`: tune a dense GEMM for a range of M.

Prints the task, one line per search round and a summary table; ``--show`` also prints
the chosen kernels and the decision tree as the C of ``ss_gemm_tuned_choice``.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import ShapeshiftError
from ..tune import dispatch
from ..tune.database import Database
from ..tune.runner import RunnerConfig
from ..tune.search import TuneConfig, Tuner, TuneResult
from ..tune.workload import GemmWorkload


class TuneError(ShapeshiftError):
    """The tuning task could not be set up."""


def _workload(args) -> GemmWorkload:
    if len(args.dynamic) != 1:
        raise TuneError("expected exactly one --dynamic M=LO:HI (the GEMM's row count)")
    (name, (lo, hi)), = args.dynamic.items()
    k, n = args.gemm
    if lo < 1:
        raise TuneError(f"--dynamic {name}={lo}:{hi}: M must be >= 1")
    if k < 1 or n < 1:
        raise TuneError(f"--gemm {k} {n}: K and N must be >= 1")
    return GemmWorkload(k=k, n=n, lo=lo, hi=hi)


def print_summary(result: TuneResult, show: bool) -> None:
    w = result.workload
    print(f"\n{result.strategy}: {result.trials} trials ({result.failed} failed candidates in the database), "
          f"{result.wall_s:.1f} s, {len(result.kernels)} kernel(s)"
          + (f", cost model held-out Spearman {result.spearman:.2f}" if result.spearman is not None else ""))
    print(f"  {'M':>6} {'kernel':>6} {'GFLOPS':>8} {'us/call':>9}")
    for m in result.sampled_ms:
        s = result.seconds.get(m, math.nan)
        print(f"  {m:>6} {dispatch.choose(result.tree, m):>6} {result.gflops(m):>8.1f} {s * 1e6:>9.1f}")
    if show:
        print("\nkernels:")
        for i, s in enumerate(result.kernels):
            print(f"  {dispatch.prefix(i)}gemm: mr={s.mr} nr={s.nr} kc={s.kc} mc={s.mc} nc={s.nc} unroll_k={s.unroll_k} "
                  f"small_m={s.small_m} small_nc={s.small_nc} parallel_min_flops={s.parallel_min_flops}")
        print(f"\ndispatch ({w.describe()}):\nint ss_gemm_tuned_choice(int64_t M)\n{{\n{dispatch.tree_c(result.tree)}\n}}")


def cmd_tune(args) -> int:
    workload = _workload(args)
    for flag, value in (("--trials", args.trials), ("--threads", args.threads), ("--max-kernels", args.max_kernels)):
        if value < 1:
            raise TuneError(f"{flag} must be >= 1, got {value}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise TuneError(f"--time-budget must be > 0 minutes, got {args.time_budget:g}")
    db_path = Path(args.db)
    cache_dir = Path(args.cache_dir) if args.cache_dir else db_path.with_name(db_path.name + ".cache")
    budget = args.time_budget * 60 if args.time_budget else math.inf
    config = TuneConfig(strategy=args.strategy, trials=args.trials, time_budget_s=budget, threads=args.threads,
                        max_kernels=args.max_kernels, runner=RunnerConfig(threads=args.threads))
    print(f"task: {workload.describe()}")
    print(f"  {workload.range_flops() / 1e9:.3g} GFLOP over the range (one call at every M), "
          f"structural hash {workload.hash[:16]}, {args.threads} thread(s)")
    with Database(db_path) as db:
        tuner = Tuner(workload, db, cache_dir, config)
        print(f"  sampled M: {' '.join(map(str, tuner.ms))}; strategy {args.strategy}, {args.trials} trials"
              + (f", budget {args.time_budget:g} min" if args.time_budget else ""))
        try:
            result = tuner.run()
        except RuntimeError as exc:
            raise TuneError(str(exc)) from None
    print_summary(result, args.show)
    return 0
