"""`shapeshift tune MODEL --dynamic SYM=LO:HI` and `shapeshift tune --gemm K N --dynamic M=LO:HI`.

With a model, every weight shape its MatMul/Gemm calls use is one task (or, with --group and
by default for a static model, all of them together: tune/gemm_group.py), every class of
its dense convs of static sizes (kernel, strides, dilations; tune/conv_workload.py) one
task over the class's instances (with --no-group, one per instance), and so is every
batched GEMM structure whose sizes depend on one dim (attention's Q K^T and P V; see
tune/extract.py); the task list is printed first with FLOPs and an estimated time, then each task is tuned in
turn (most work first) with a progress line per search round, then a summary table.
``compile --db`` and ``InferenceSession(..., tuning_db=)`` use the records.
With ``--gemm`` one GEMM is tuned. ``--show`` prints the kernels and each decision tree as C.
With ``--cluster`` the measurements run on a Ray cluster (tune/cluster.py); on a cluster of
several CPU models everything is tuned once per model, in turn, on that model's nodes, and
recorded under its target key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path
from typing import Optional

from ..files import output_target
from ..errors import ShapeshiftError
from ..tune import dispatch
from ..tune.database import Database, check_database_path
from ..tune.deps import require_plotting, require_tuning_dependencies
from ..tune.extract import BatchedTask, ConvTask, GroupTask, ModelTask, group_task, model_tasks
from ..tune.runner import RunnerConfig
from ..tune.search import OutOfTime, TuneConfig, Tuner, TuneResult, tree_point
from ..tune.workload import GemmWorkload
from .tune_display import TuneDisplay


class TuneError(ShapeshiftError):
    """The tuning task could not be set up."""


# Rough seconds per trial (two compiles at a time, then a measurement at a few M): only for
# the estimate printed before tuning starts.
SECONDS_PER_TRIAL = 2.5
# And per instance of a task over instances (a group, a conv class), whose shortlist and
# kernel set are timed at every instance: PP-OCRv4's detector over 96..960 (AMD Zen 2, 6
# trials a task) took 69-77 s for its 110-instance pointwise class, 14-23 s for classes of
# 12-18 instances, 6-10 s for one of 6; trials alone made it 15 s a task.
SECONDS_PER_INSTANCE = 0.5
# M past this is not a range one tunes for: a dim was left undeclared (default bound).
MAX_TUNED_M = 1 << 20


def _workload(args) -> GemmWorkload:
    if len(args.dynamic) != 1:
        raise TuneError("expected exactly one --dynamic M=LO:HI (the GEMM's row count)")
    (name, (lo, hi)), = args.dynamic.items()
    k, n = args.gemm
    if lo < 1:
        raise TuneError(f"--dynamic {name}={lo}:{hi}: M must be >= 1")
    if k < 1 or n < 1:
        raise TuneError(f"--gemm {k} {n}: K and N must be >= 1")
    return GemmWorkload(k=k, n=n, lo=lo, hi=hi, cold=args.measure == "cold")


def print_summary(result: TuneResult, show: bool) -> None:
    w = result.workload
    reused = f", {result.reused} more from the database" if result.reused else ""
    print(f"\n{result.strategy}: {result.trials} trials{reused} ({result.failed} failed candidates in the database), "
          f"{result.wall_s:.1f} s, {len(result.kernels)} kernel(s)"
          + (f", cost model held-out Spearman {result.spearman:.2f}" if result.spearman is not None else ""))
    group = not getattr(w, "ordered", True)
    print(f"  {'#' if group else 'M':>6} {'kernel':>6} {'GFLOPS':>8} {'us/call':>9}"
          + (f"  {w.instance_fields}" if group else ""))
    for m in result.sampled_ms:
        s = result.seconds.get(m, math.nan)
        print(f"  {m:>6} {dispatch.choose(result.tree, tree_point(w, m)):>6} {result.gflops(m):>8.1f} {s * 1e6:>9.1f}"
              + (f"  {w.instance(m)}" if group else ""))
    if show:
        family = w.family.name
        print("\nkernels:")
        for i, s in enumerate(result.kernels):
            fields = (" ".join(f"{name}={value}" for name, value in dataclasses.asdict(s).items()) if family == "gemm"
                      else w.family.to_json(s))
            print(f"  {dispatch.prefix(i)}{family}: {fields}")
        params = ", ".join(f"int64_t {a}" for a in getattr(w, "tree_args", (w.variable,)))
        print(f"\ndispatch ({w.describe()}):\nint ss_{family}_tuned_choice({params})\n{{\n"
              f"{dispatch.tree_c(result.tree, var=w.variable)}\n}}")


def _check_args(args) -> None:
    for flag, value in (("--trials", args.trials), ("--threads", args.threads), ("--max-kernels", args.max_kernels)):
        if value < 1:
            raise TuneError(f"{flag} must be >= 1, got {value}")
    if args.measure_cap < 0:
        raise TuneError(f"--measure-cap must be >= 0, got {args.measure_cap}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise TuneError(f"--time-budget must be > 0 minutes, got {args.time_budget:g}")
    if (args.model is None) == (args.gemm is None):
        raise TuneError("give either a MODEL or --gemm K N")


def _config(args, budget_s: float, workload: GemmWorkload, weighted: Optional[dict[int, float]] = None,
            sampled: Optional[tuple[list[int], list[float]]] = None) -> TuneConfig:
    """``weighted``: a histogram of the dynamic dim; ``sampled``: the values and weights
    themselves (a group's instances and their calls)."""
    samples: dict = {}
    if weighted:
        sampled = workload.weighted_samples(weighted)
    if sampled:
        ms, weights = sampled
        samples = dict(sample_ms=tuple(ms), sample_weights=tuple(weights))
    return TuneConfig(strategy=args.strategy, trials=args.trials, time_budget_s=budget_s, threads=args.threads,
                      max_kernels=args.max_kernels, one_layout=not args.any_layout, measure_cap=args.measure_cap,
                      runner=RunnerConfig(threads=args.threads), **samples)


def read_shape_weights(spec: Optional[str]) -> Optional[tuple[str, dict[int, float]]]:
    """``SYM=FILE``: FILE holds one ``value weight`` pair per line (space or comma between;
    ``#`` starts a comment), how often the dim SYM takes each value."""
    if spec is None:
        return None
    symbol, sep, path = spec.partition("=")
    if not sep or not symbol or not path:
        raise TuneError(f"--shape-weights {spec!r}: expected SYM=FILE")
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TuneError(f"--shape-weights: cannot read {path}: {exc.strerror}") from None
    histogram: dict[int, float] = {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        try:
            value, weight = int(fields[0]), float(fields[1])
            if len(fields) != 2 or value < 0 or not weight > 0 or not math.isfinite(weight):
                raise ValueError
        except (ValueError, IndexError):
            raise TuneError(f"{path}:{number}: expected 'VALUE WEIGHT' (an integer >= 0 and a weight > 0), "
                            f"got {line.strip()!r}") from None
        histogram[value] = histogram.get(value, 0.0) + weight
    if not histogram:
        raise TuneError(f"{path}: no 'VALUE WEIGHT' lines")
    return symbol, histogram


def cmd_tune(args) -> int:
    _check_args(args)
    # Everything that would otherwise fail after the tuning is refused before it starts.
    require_tuning_dependencies()
    if args.plot:
        require_plotting()
        output_target(args.plot, "plot")
    db_path = Path(args.db)
    check_database_path(db_path)
    cache_dir = Path(args.cache_dir) if args.cache_dir else db_path.with_name(db_path.name + ".cache")
    cluster = _connect(args.cluster)
    try:
        tune = _tune_model if args.model is not None else _tune_gemm
        if cluster is not None and len(cluster.models) > 1:
            return _tune_each_model(tune, args, db_path, cache_dir, cluster)
        return tune(args, db_path, cache_dir, cluster)
    finally:
        if cluster is not None:
            print(cluster.summary())
            cluster.shutdown()


def _connect(address: Optional[str]):
    """The Ray cluster measurements run on (tune/cluster.py), its nodes printed; None: this machine."""
    if address is None:
        return None
    from ..tune.cluster import RayCluster

    cluster = RayCluster(address)
    print(cluster.describe(), flush=True)
    return cluster


def _tune_each_model(tune, args, db_path: Path, cache_dir: Path, cluster) -> int:
    """A cluster of several CPU models: everything tuned once per model, one model after
    another, each on its own nodes (tune/cluster.py's ModelNodes), so that each model's
    measurements and selections are its own (the Tuner records them under its target key)."""
    models = cluster.models
    deadline = time.monotonic() + args.time_budget * 60 if args.time_budget else math.inf
    for i, model in enumerate(models):
        own = copy.copy(args)
        nodes = model.nodes()
        line = (f"\nCPU model {i + 1}/{len(models)}: {model.target.cpu_model} (target key {model.target.key}), "
                f"{len(nodes)} node(s), {sum(c for _, _, c in nodes)} CPU(s)")
        if args.time_budget:
            # The models run in turn, so --time-budget is wall time for them all, shared as
            # the tasks of one model share theirs: the time left, evenly among the models
            # still to tune (what one leaves unused goes to those after it).
            left = deadline - time.monotonic()
            if left <= 0:
                print(line + ": no time left in the budget, its tasks keep the default schedule", flush=True)
                continue
            own.time_budget = left / 60 / (len(models) - i)
            line += f", budget {own.time_budget:.3g} min"
        if args.plot:  # a plot per model, beside the one named
            plot = Path(args.plot)
            own.plot = str(plot.with_name(f"{plot.stem}-{model.target.key[:8]}{plot.suffix}"))
        print(line, flush=True)
        tune(own, db_path, cache_dir, model)
    return 0


def _tune_gemm(args, db_path: Path, cache_dir: Path, cluster) -> int:
    workload = _workload(args)
    budget = args.time_budget * 60 if args.time_budget else math.inf
    weighted = read_shape_weights(args.shape_weights)
    if weighted is not None and weighted[0] not in args.dynamic:
        raise TuneError(f"--shape-weights {weighted[0]}=...: with --gemm the weighted dim is M's, "
                        f"{next(iter(args.dynamic))}")
    try:
        config = _config(args, budget, workload, weighted[1] if weighted else None)
    except ValueError as exc:
        raise TuneError(f"--shape-weights: {exc}") from None
    print(f"task: {workload.describe()}")
    print(f"  {workload.range_flops() / 1e9:.3g} GFLOP over the range (one call at every M), "
          f"structural hash {workload.hash[:16]}, {args.threads} thread(s)")
    with Database(db_path) as db:
        tuner = Tuner(workload, db, cache_dir, config, cluster=cluster)
        print(f"  sampled M: {' '.join(map(str, tuner.ms))}; strategy {args.strategy}, {args.trials} trials"
              + (f", budget {args.time_budget:g} min" if args.time_budget else ""))
        try:
            result = tuner.run()
        except RuntimeError as exc:
            raise TuneError(str(exc)) from None
    print_summary(result, args.show)
    if args.plot:
        _plot([(workload.describe(), result)], args.plot)
    return 0


def _plot(results, path: str) -> None:
    from ..tune.plot import plot_results

    plot_results(results, Path(path))
    print(f"wrote {path}")


def _model_tasks(args) -> list[ModelTask | BatchedTask | GroupTask]:
    """The model's tasks; the dense GEMMs as one group with --group, and by default when no
    weight's calls have a dynamic M (a static model: DietCode's grouping of its instances)."""
    group = getattr(args, "group", None)
    tasks = model_tasks(args.model, args.dynamic, group_convs=group is not False)
    if not tasks:
        raise TuneError(f"{args.model}: no MatMul or Gemm with a constant float32 weight, no batched MatMul "
                        f"sized by one dynamic dim and no dense Conv of static sizes: nothing to tune")
    for t in tasks:
        if t.hi > MAX_TUNED_M:
            names = ", ".join(sorted(t.symbols)) or "?"
            where = f"the rows of the {t.label} weight's calls ({t.nodes[0]})" if isinstance(t, ModelTask) \
                else f"T of the batched MatMul {t.label}"
            raise TuneError(f"{args.model}: {where} reach {t.hi}; declare the range of {names} with "
                            f"--dynamic SYM=LO:HI")
    dense = [t for t in tasks if isinstance(t, ModelTask)]
    if group is None:
        group = bool(dense) and all(t.lo == t.hi for t in dense)
    if not group or not dense:
        return tasks
    if args.shape_weights:
        raise TuneError("--shape-weights weighs one dynamic dim's values; with --group the instances weigh by "
                        "their calls: add --no-group to use it")
    return [group_task(dense), *(t for t in tasks if not isinstance(t, ModelTask))]


def print_tasks(tasks: list[ModelTask | BatchedTask], args, display: Optional[TuneDisplay] = None) -> None:
    display = display or TuneDisplay()
    total = sum(t.range_flops() for t in tasks)
    title = (f"{len(tasks)} task(s) in {args.model}, {args.threads} thread(s), strategy {args.strategy}, "
             f"measured {args.measure or 'cold'}, {args.trials} trials each"
             + (f", budget {args.time_budget:g} min in all" if args.time_budget else ""))
    def est(t) -> float:
        instances = t.hi if isinstance(t, (GroupTask, ConvTask)) else 0
        return (args.trials * SECONDS_PER_TRIAL + instances * SECONDS_PER_INSTANCE) / 60

    rows = [[str(i), t.label, str(t.calls),
             f"{t.hi} instance(s)" if isinstance(t, (GroupTask, ConvTask)) else f"{t.lo}..{t.hi}", f"{t.range_flops() / 1e9:.4g}",
             f"{t.range_flops() / total:.1%}", f"{est(t):.1f}"] for i, t in enumerate(tasks)]
    est_all = sum(est(t) for t in tasks)
    if args.time_budget:
        est_all = min(est_all, args.time_budget)
    display.table(title, ["#", "weight [K, N] or batched", "calls", "M or T range", "GFLOP", "share", "est. min"],
                  rows, [f"GFLOP: one call at every M of the range, times the calls per run; estimated "
                         f"{est_all:.0f} min in all"])


def _tune_model(args, db_path: Path, cache_dir: Path, cluster=None) -> int:
    tasks = _model_tasks(args)
    cold = args.measure != "warm"
    weighted = read_shape_weights(args.shape_weights)
    display = TuneDisplay()
    print_tasks(tasks, args, display)
    start = time.monotonic()
    deadline = start + args.time_budget * 60 if args.time_budget else math.inf
    fixed = {name: lo for name, (lo, hi) in args.dynamic.items() if lo == hi}  # dims declared with one value
    results: list[tuple[ModelTask | BatchedTask, TuneResult, Optional[float]]] = []
    no_time: list[ModelTask | BatchedTask] = []  # tasks the budget ran out before: they keep the default
    with Database(db_path) as db:
        for i, task in enumerate(tasks):
            workload = task.workload(cold)
            print(f"\n[{i + 1}/{len(tasks)}] {workload.describe()}, {task.calls} call(s) per run", flush=True)
            left = deadline - time.monotonic()
            if left <= 0:
                print("  no time left in the budget: the default schedule is kept", flush=True)
                no_time.append(task)
                continue
            # The time left is shared evenly by the tasks still to tune.
            budget = left / (len(tasks) - i)
            ms = task.weighted_ms(*weighted, fixed) if weighted else None
            if weighted and not ms:
                print(f"  (its M does not depend on {weighted[0]} alone: uniform samples)")
            sampled = task.sample_weights() if isinstance(task, (GroupTask, ConvTask)) else None
            tuner = Tuner(workload, db, cache_dir, _config(args, budget, workload, ms, sampled),
                          log=display.progress(i, len(tasks), task.label, start, lambda: tuner.trials,
                                               lambda: args.trials - tuner.reused, lambda: _best_gflops(tuner)),
                          cluster=cluster)
            try:
                result = tuner.run()
            except OutOfTime:
                display.task_done()
                # The tasks before it took the budget: no selection is written, the native
                # backend runs its default schedule; the tasks tuned so far are kept.
                print("  the budget ran out before any measurement: the default schedule is kept", flush=True)
                no_time.append(task)
                continue
            except RuntimeError as exc:
                raise TuneError(f"task {task.label}: {exc}") from None
            finally:
                display.task_done()
            results.append((task, result, _speedup_over_default(tuner, result)))
            if args.show:
                print_summary(result, True)
    _print_model_summary(results, time.monotonic() - start, db_path, no_time, display)
    if args.plot:
        _plot([(f"{t.label} x {t.calls} call(s): {r.strategy}, {len(r.kernels)} kernel(s)", r)
               for t, r, _ in results], args.plot)
    return 0


def _best_gflops(tuner: Tuner) -> Optional[float]:
    """The best GFLOPS measured so far at the task's largest sampled M (the live status)."""
    m = max(tuner.ms)
    times = [t[m] for c, t in tuner.times.items() if m in t and c not in tuner.failed]
    return tuner.w.flops(m) / min(times) / 1e9 if times else None


def _speedup_over_default(tuner: Tuner, result: TuneResult) -> Optional[float]:
    """Geomean over the sampled M of default-schedule time / tuned time, where both were measured."""
    default = next((c for c, s in tuner.schedules.items() if s == tuner.default), None)
    # The same source as the dispatcher's times: for dietcode, both timed in one process.
    times = {m: t for m in result.seconds if (t := tuner.measured(default, m))} if default is not None else {}
    ratios = [times[m] / s for m, s in result.seconds.items() if m in times and s > 0 and not math.isnan(s)]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def _print_model_summary(results, wall_s: float, db_path: Path, no_time=(), display: Optional[TuneDisplay] = None
                         ) -> None:
    display = display or TuneDisplay()
    display.line(f"\nsummary: {len(results)} task(s) in {wall_s:.0f} s, records in {db_path}")
    if no_time:
        display.line(f"  no time for {len(no_time)} task(s): {', '.join(t.label for t in no_time)}: the time budget "
                     f"ran out before them, so they keep the default schedule (no record written). Run again with "
                     f"a larger --time-budget to tune them: the measurements made are reused.")
    if not results:
        return
    rows = []
    for task, r, speedup in results:
        ms = r.sampled_ms
        rows.append([task.label, str(r.trials), str(r.reused), f"{r.wall_s:.0f}", str(len(r.kernels)),
                     f"{r.gflops(ms[0]):.1f}..{r.gflops(ms[-1]):.1f}", f"{speedup:.2f}x" if speedup is not None else "-",
                     f"{r.spearman:.2f}" if r.spearman is not None else "-"])
    display.table("", ["task", "trials", "stored", "s", "kernels", "GFLOPS lo..hi M", "vs default", "Spearman"], rows,
                  ["trials: candidates measured by this run; stored: trials taken from the database (measured "
                   "before, not again); vs default: geomean over the sampled M of the default schedule's measured "
                   "time over the dispatcher's (when the default was measured)"])
