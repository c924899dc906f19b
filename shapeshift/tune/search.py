"""Tuning strategies and the loop that drives builder, runner, database and cost model.

The dynamic value is called M throughout: the rows of a dense GEMM, or T for a batched
one (workload.py). ``dietcode``: one evolutionary search over shape-generic schedules for
all sampled M at once. Each round scores a population with the cost model at every sampled M, ranks the M
values by regret (predicted optimum over the best measured so far, worst first) and, M by
M in that order, picks the best-predicted schedule not yet measured there; each pick is
measured at the M values where it is predicted best among the picks. ``per-shape``: the
same loop run separately at each sampled M, the trial budget split evenly (every shape
gets the same budget). ``pad-max``: the loop at M = hi only, one kernel for every M.
Afterwards (dietcode only) the range's powers of two that were not sampled are *probed*:
the candidates predicted best there, and the hand-tuned default, are measured there, since
uniform samples leave the small shapes, where speed changes fastest, to prediction alone
(over [1, 512] the first two samples are 1 and 58). dietcode measures no M above
``measure_cap`` (MEASURE_CAP): its samples, probes and dense grid lie in [lo, cap], the cap's
sample weighs for the Ms above it, and those Ms are dispatched to the kernel best at the cap
(DietCode's own argument: a micro-kernel's speed does not depend on how many times it
repeats; at batch 16, M = 16 T reaches 8192, and measuring there cost 4x a measurement at
2048 for the same GFLOPS). Then the kernel set is chosen
(``dispatch.greedy_cover``) over the sampled and probed Ms. dietcode first *shortlists* the
best two candidates at each of those Ms (and the default), times them *together*, in one
worker process with their samples interleaved (``runner.measure_together``), and chooses
the set from the shortlist on those times; then it times the set together at a *dense*
grid of the range (``dense_points``, about 8 Ms per doubling of M), cheapest points first
within a budget of a fraction of the time spent so far. The other strategies choose on the
times measured alone, measuring the chosen kernels wherever they were only predicted. The decision tree is
trained on the best kernel per M over the whole range: from those joint times where it has
them, else measured alone where measured, else predicted. Why both: between samples the
cost model was 20-40% wrong in places (Q K^T at 2 threads: the tree sent T = 9..15 to a
kernel a third slower there than the default), and at 2 threads a kernel's speed differs
by up to 15% from one worker process to the next (in one tuning a kernel's whole
measurement ran at one core's speed, half its speed in the next), which decided labels
between kernels measured in different processes.

Measuring. The search measures through one interface (``submit``, ``wait``,
``time_together``; runner.LocalRunner here, tune/cluster.py's RayCluster on a cluster) and
draws ``step`` candidates whenever that many of ``in_flight`` are free, recording each
result as it comes and refitting the cost model every ``batch`` results. On this machine
that is a synchronous round (``batch`` drawn, measured, the model refit). On a cluster it is
asynchronous (two in flight per slot, one drawn per result), so no slot waits for a
round's slowest candidate, and with BACKGROUND_FIT_SLOTS slots or more the refit runs in a
child process while the search draws from the last model (background_fit.py); the joint
timings are split by M over the slots (``split_by_cost``). Results are taken one at a time in the order they finish, and what is
drawn depends only on them: with one worker (tasks finish in the order submitted) a seed
gives one sequence.

Resuming. Every measurement goes to the database as it is made, and a Tuner starts from
every stored one of its task on this CPU and thread count (``_load``): a run killed and
started again, or run again when done, measures nothing that is stored. The trials are
counted the same way: a candidate stored with a measurement at one of the search's Ms is
one of its trials, so ``trials`` is what the task has in all, not what one run adds (raise
it to search further). Without that, a resumed search drew ``trials`` new candidates (its
cost model, trained on the stored ones, picked others than the first run had), as long as
a fresh run. The default is the first trial at every M the search runs at. A probed M
where the default and PROBE_PICKS candidates are stored is not
probed again. What is re-timed is what must be taken in one process to compare: the
shortlist and the kernel set timed together (cached builds, a worker process each). Their
budgets are fractions of the tuning time so far, which counts the estimated cost of the
stored measurements a run reuses (``reused_s``), so that a resumed run shortlists as the
fresh run did.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Optional, Sequence

import numpy as np

from ..errors import ShapeshiftError
from ..target import host_target
from . import dispatch
from .background_fit import BackgroundFit
from .builder import CandidateSource, SourceFn, measurement_source
from .cost_model import CostModel
from .database import Database
from .deps import require_tuning_dependencies
from .runner import COLD_BYTES, LocalRunner, Result, RunnerConfig, measure, measure_together
from .task import Schedule, TuningTask
from .workload import uniform_samples

STRATEGIES = ("dietcode", "per-shape", "pad-max")
# Points of the range the decision tree is trained on (all of them when the range is smaller).
TREE_POINTS = 1024
# Leaves of the dispatch tree: per kernel kept, and at most (a nested if per level in C).
TREE_LEAVES_PER_KERNEL = 8
TREE_MAX_LEAVES = 64
# dietcode keeps the hand-tuned default in its kernel set and dispatches another kernel only
# where that one is predicted (or measured) this much faster: the cost model's errors between
# samples are about this size, and a swap on a wrong prediction loses more than one gains.
DEFAULT_MARGIN = 0.05
# Candidates measured at each probed M: this many predicted best there (plus the default).
PROBE_PICKS = 2
# Before choosing the kernel set, dietcode times together (one process) this many best
# candidates at each sampled or probed M (measured alone, else predicted), at most
# SHORTLIST_MAX in all plus the default, and chooses among them on those times.
SHORTLIST_PER_M = 2
SHORTLIST_MAX = 12
# Past each M's best, the shortlist takes candidates only while timing them is estimated to
# fit in this fraction of the tuning time so far: at batch 16 (M up to 8192) timing a full
# shortlist cost as much as the search before it and doubled dietcode's tuning time.
SHORTLIST_BUDGET = 0.5
# The dense grid of M the kernel set is timed on before the tree is trained: this many
# points per doubling of M (every M below it) ...
DENSE_PER_OCTAVE = 8
# ... within this fraction of the wall time the tuning has taken until then (cheapest
# points first: a kernel at a large M of a big GEMM costs more to time than at a small one).
DENSE_BUDGET = 0.25
# dietcode measures no M above this (in the dynamic value's units): past a few MC blocks of
# rows a GEMM's speed no longer depends on M (batch 16, M up to 8192: 78-87 GFLOPS from M =
# 256 on, dispatcher, pad-max and per-shape alike), while a measurement costs in proportion to M. The
# Ms above are dispatched to what is best at the cap, which stands for them with its weight.
MEASURE_CAP = 2048
# Estimates for that budget: float64 GFLOPS of the worker's NumPy check of each M, and the
# seconds the worker process takes to start.
CHECK_GFLOPS = 5.0
WORKER_START_S = 0.3
# On a cluster, candidates in flight per measurement slot: one running, one queued behind it,
# so that a slot never idles while the driver records a result and draws the next.
IN_FLIGHT_PER_SLOT = 2
# On a cluster of at least this many measurement slots the cost model is fit in a child
# process while the search draws from the last fit (background_fit.py): with 32 slots the
# fits in line were most of the driver's time, and the driver a fifth of the wall time.
BACKGROUND_FIT_SLOTS = 4
# Estimated seconds one candidate's build took (a resumed run's stored measurements count in
# its tuning time by estimate: ``Tuner.reused_s``); ~1.5-3 s each, two at a time.
BUILD_S = 2.5


class OutOfTime(ShapeshiftError):
    """The time budget ran out before a task measured any candidate: it keeps the default
    schedule (no selection is written for it)."""


def probe_points(lo: int, hi: int, sampled: list[int]) -> list[int]:
    """The powers of two strictly inside (lo, hi) that are not sampled."""
    points, p = [], 1
    while p < hi:
        if p > lo and p not in sampled:
            points.append(p)
        p *= 2
    return points


def dense_points(lo: int, hi: int, per_octave: int = DENSE_PER_OCTAVE) -> list[int]:
    """About ``per_octave`` Ms in each doubling of M over [lo, hi]: every M up to
    2 x per_octave - 1, then the odd M nearest above the middle of each of ``per_octave``
    equal steps per octave (17, 19, ...; 35, 39, ...; 69, 77, ...). Odd, because the probes
    (powers of two) already cover aligned Ms, and a kernel's edge tiles make its speed
    depend on M modulo its tile, which uniform and aligned samples both miss."""
    points = []
    m = max(1, lo)
    while m <= hi:
        base = 1 << (m.bit_length() - 1)
        step = base // per_octave
        if step <= 1:
            points.append(m)
            m += 1
            continue
        points.extend(p for p in ((base + i * step + step // 2) | 1 for i in range(per_octave)) if lo <= p <= hi)
        m = 2 * base
    return points


def split_by_cost(points: Sequence[int], costs: Sequence[float], parts: int) -> list[list[int]]:
    """``points`` in at most ``parts`` chunks of about equal estimated cost (costliest point
    first onto the cheapest chunk), each sorted; no empty chunk."""
    chunks: list[list[int]] = [[] for _ in range(max(1, min(parts, len(points))))]
    loads = [0.0] * len(chunks)
    for cost, m in sorted(zip(costs, points), key=lambda cm: (-cm[0], cm[1])):
        i = loads.index(min(loads))
        chunks[i].append(m)
        loads[i] += cost
    return [sorted(c) for c in chunks if c]


def _fold_above(ms: list[int], weights: np.ndarray, top: int, hi: int, uniform: bool
                ) -> tuple[list[int], np.ndarray]:
    """The sampled Ms and weights once no M above ``top`` is measured: ``top`` stands for
    them. Given samples above it become ``top``, their weights added to its own; uniform
    samples of [lo, top] give ``top`` the share of (top, hi] too, as many samples' weight
    as their spacing fits in it (the Ms of the range count alike, measured or not)."""
    if top >= hi:
        return ms, weights
    folded: dict[int, float] = {}
    for m, w in zip(ms, weights):
        folded[min(m, top)] = folded.get(min(m, top), 0.0) + float(w)
    if uniform:
        spacing = (top - ms[0]) / max(1, len(ms) - 1) or 1.0
        folded[top] = folded.get(top, 0.0) + (hi - top) / spacing
    out = sorted(folded)
    return out, np.array([folded[m] for m in out])


@dataclass
class TuneConfig:
    strategy: str = "dietcode"
    trials: int = 32  # candidate measurements in all
    time_budget_s: float = math.inf
    samples: int = 10
    # Explicit sampled M values and their weights (how often each occurs in production,
    # e.g. a histogram of sequence lengths); empty: ``samples`` uniform points, equal weights.
    sample_ms: tuple[int, ...] = ()
    sample_weights: tuple[float, ...] = ()
    threads: int = 1
    max_kernels: int = 8
    # Keep kernels that share one packed-B layout: a model then holds one packed copy of
    # each weight, as untuned (False allows one copy per distinct layout in the set).
    one_layout: bool = True
    # dietcode: probe the unsampled powers of two of the range before choosing the kernels.
    probes: bool = True
    # dietcode: time the chosen kernels together on ``dense_points`` of the range within this
    # fraction of the tuning time so far (0: only at the sampled and probed Ms).
    dense_budget: float = DENSE_BUDGET
    # dietcode: the shortlist's candidates past each M's best are timed within this fraction
    # of the tuning time so far (SHORTLIST_BUDGET).
    shortlist_budget: float = SHORTLIST_BUDGET
    # dietcode: the largest M measured (MEASURE_CAP; 0: no cap).
    measure_cap: int = MEASURE_CAP
    population: int = 64
    batch: int = 4  # candidates measured per round
    jobs: int = 2  # parallel compiles
    seed: int = 0
    runner: RunnerConfig = field(default_factory=RunnerConfig)


@dataclass
class TuneResult:
    workload: TuningTask
    strategy: str
    sampled_ms: list[int]
    kernels: list[Schedule]
    tree: dict
    seconds: dict[int, float]  # the dispatcher's kernel at each sampled M (Tuner.measured)
    trials: int  # candidates measured by this run
    failed: int
    wall_s: float
    spearman: Optional[float]
    # Seconds of each chosen kernel at each sampled M (Tuner.measured; every one is measured there).
    kernel_seconds: list[dict[int, float]] = field(default_factory=list)
    reused: int = 0  # trials taken from the database (a resumed or repeated run): not measured again

    def gflops(self, m: int) -> float:
        return self.workload.flops(m) / self.seconds[m] / 1e9 if m in self.seconds else float("nan")


def tree_point(workload: TuningTask, value: int):
    """What a dispatch tree of ``workload`` is asked at ``value`` (``dispatch.choose``): the
    value itself, or for an unordered task (a group) the instance's dims."""
    return value if getattr(workload, "ordered", True) else workload.point(value)


class _ScoreCache:
    """Predicted log GFLOPS of schedules at the Ms of one search, under one fit of the cost
    model: between two refits the asynchronous search draws from the same pool many times."""

    def __init__(self, tuner: "Tuner", ms: list[int]):
        self.tuner, self.ms = tuner, ms
        self.rows: dict[Schedule, np.ndarray] = {}
        self._pool: Optional[list[Schedule]] = None
        self._pool_scores = np.zeros((0, len(ms)))

    def pool(self, schedules: list[Schedule]) -> np.ndarray:
        """The scores of the search's pool: the same list is asked for at every draw until the
        next refit, so its matrix is kept (it is not to be changed in place)."""
        if schedules is not self._pool:
            self._pool, self._pool_scores = schedules, self(schedules)
        return self._pool_scores

    def __call__(self, schedules: list[Schedule]) -> np.ndarray:
        missing = [s for s in dict.fromkeys(schedules) if s not in self.rows]
        if missing:
            start = time.perf_counter()
            self.rows.update(zip(missing, self.tuner._scores(missing, self.ms)))
            # Counted apart from the draw that asked (bench/cluster.py): it grows with the pool.
            self.tuner._spent("score", start)
            self.tuner.driver_n["scored"] += len(missing) * len(self.ms)
        return np.array([self.rows[s] for s in schedules]).reshape(len(schedules), len(self.ms))


class Tuner:
    def __init__(self, workload: TuningTask, db: Database, cache_dir: Path, config: TuneConfig = TuneConfig(),
                 source_fn: Optional[SourceFn] = None, log: Callable[[str], None] = print, cluster=None):
        if config.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {config.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        # scikit-learn is first needed after 8 measurements (the cost model), then at the end
        # (the tree): without it, a run measured and then died. Checked before any work.
        require_tuning_dependencies()
        self.w, self.db, self.cache_dir, self.cfg = workload, db, cache_dir, config
        # A cold workload is measured cold, a warm one warm, whatever the runner config says.
        self.runner = dataclasses.replace(
            config.runner, cold_bytes=(config.runner.cold_bytes or COLD_BYTES) if workload.cold else 0)
        self.source_fn, self.log = source_fn, log
        self.family = workload.family
        self.rng = random.Random(config.seed)
        # The machine the candidates are drawn for and measured on, and its untuned schedule.
        # ``cluster`` (tune/cluster.py): measurements run as Ray tasks on its nodes, whose one
        # CPU model the candidates are drawn for and the database records. Either way the
        # search measures through one interface (submit, wait, time_together: runner.py).
        self.cluster = cluster
        self.target = cluster.target if cluster is not None else host_target()
        self.measurer = cluster if cluster is not None else LocalRunner(cache_dir, config.jobs, measure,
                                                                        measure_together)
        db.target_key = self.target.key
        self.slots = self.measurer.slots(config.runner.threads)
        # Results per round, between refits of the cost model: on a cluster, at least one per
        # measurement slot (a round of ``batch`` on 32 slots would refit 8 times as often as
        # the slots deliver new information, for a driver that has the other work too).
        self.batch = max(config.batch, self.slots)
        # How many candidates are in flight at most, and how many must have come back before
        # more are drawn. Here, a round: ``batch`` drawn together, measured, the model refit.
        # On a cluster, asynchronous: a candidate drawn as each result comes, so no slot waits
        # for a round's slowest candidate; the model is refit every ``batch`` results.
        self.in_flight, self.step = ((IN_FLIGHT_PER_SLOT * self.slots, 1) if cluster is not None
                                     else (self.batch, self.batch))
        # Candidates submitted and not yet back: ticket -> (candidate id, schedule, Ms).
        self.pending: dict[int, tuple[int, Schedule, list[int]]] = {}
        # The driver's own seconds by kind (record, pick, pool, fit, score: within pick and
        # pool) and how often; ``search_rows``: (candidate, M) measured by the searches.
        # bench/cluster.py replays them.
        self.driver_s: collections.Counter = collections.Counter()
        self.driver_n: collections.Counter = collections.Counter()
        # The estimated seconds at each M of every joint timing (``_time_together``), for the replay.
        self.joint_costs: list[dict[int, float]] = []
        self.search_rows = 0
        self.default = self.family.default(self.target)
        self.wid = db.workload_id(workload)
        self.model = CostModel(workload, config.threads, config.seed)
        self._holdout_rows = 0  # rows at the last held-out Spearman (_fit)
        # Fits in a child process (on a cluster of BACKGROUND_FIT_SLOTS slots or more), a refit
        # asked for while one ran, and (rows, child seconds) of each such fit, for the replay.
        self.fitter = BackgroundFit() if cluster is not None and self.slots >= BACKGROUND_FIT_SLOTS else None
        self._refit_wanted = False
        self._stale = False  # measurements came since the last fit (``_predict``)
        self._fit_rows = 0  # rows of the fit in the child
        self.child_fits: list[tuple[int, float]] = []
        # dietcode measures Ms up to ``top`` only (``measure_cap``); the others, the whole range.
        # An unordered task (a group's instances: tune/gemm_group.py) samples every value.
        self.ordered = getattr(workload, "ordered", True)
        capped = self.ordered and config.strategy == "dietcode" and 0 < config.measure_cap < workload.hi
        self.top = max(workload.lo, config.measure_cap) if capped else workload.hi
        ms = list(config.sample_ms) or (uniform_samples(workload.lo, self.top, config.samples) if self.ordered
                                        else workload.sampled_ms())
        weights = np.asarray(config.sample_weights or [1.0] * len(ms), dtype=float)
        if len(weights) != len(ms) or (weights <= 0).any():
            raise ValueError("sample_weights must be one positive weight per sampled M")
        self.ms, weights = _fold_above(ms, weights, self.top, workload.hi, uniform=not config.sample_ms)
        self.weights = weights / weights.mean()
        # The Ms the kernel set is chosen over, and their weights: the sampled Ms, plus the
        # probed ones once probed (each with the smallest sample weight).
        self.select_ms, self.select_weights = list(self.ms), self.weights
        self.schedules: dict[int, Schedule] = {}
        self._cid_of: dict[Schedule, int] = {}  # the reverse of ``schedules``
        self.times: dict[int, dict[int, float]] = {}  # candidate id -> M -> seconds
        # candidate id -> every M it was measured at, failures included (what counts as tried).
        self.tried: dict[int, set[int]] = {}
        self.failed: set[int] = set()
        self._best_s: Optional[dict[int, float]] = None  # best measured seconds per M (``_best_seconds``)
        self.first_error: Optional[str] = None  # what the first failed candidate said
        # Times taken together with other kernels, in one process (``_time_together``): candidate -> M -> s.
        self.together: dict[int, dict[int, float]] = {}
        self.trials = 0  # candidates this run measured
        self.reused = 0  # trials its searches took from the database instead
        self.reused_s = 0.0  # estimated seconds the stored measurements took to make (module docstring)
        self._load()

    # ---- state -------------------------------------------------------------------------
    def _load(self) -> None:
        """Everything already in the database for this workload and CPU (resuming a run)."""
        unknown = self.db.unknown_cpu_measurements(self.wid, self.cfg.threads)
        if unknown:
            self.log(f"  {unknown} measurement(s) stored before measurements named their CPU are used as this "
                     f"machine's")
        for cid, m, seconds, error in self.db.measurements(self.wid, self.cfg.threads):
            if cid not in self.schedules:
                self._remember(cid, self.db.schedule(cid, self.family))
            self.tried.setdefault(cid, set()).add(m)
            if error is not None:
                self._add_failure(cid)
            else:
                self._add_times(cid, {m: seconds})
        self.reused_s = sum(BUILD_S / max(1, self.cfg.jobs) + WORKER_START_S for _ in self.tried) + sum(
            self._cost_s([s], m) for by_m in self.times.values() for m, s in by_m.items())
        self._fit()

    def _remember(self, cid: int, schedule: Schedule) -> None:
        self.schedules[cid] = schedule
        self._cid_of.setdefault(schedule, cid)

    def _tried_at(self, ms: list[int]) -> int:
        """How many candidates were measured (or failed) at one of ``ms``."""
        wanted = set(ms)
        return sum(1 for done in self.tried.values() if done & wanted)

    def _fit(self, background: bool = False) -> bool:
        """Refit the cost model on every measurement: in line (True: the new model is in), or,
        with ``background`` and a fitter (background_fit.py), in the child process (False:
        ``_take_fit`` takes the model in once it is done; a refit asked for while one runs
        starts then, on the rows of then)."""
        start = time.perf_counter()
        if background and self.fitter is not None and self.fitter.busy:
            self._refit_wanted = True
            return False
        rows, ys = [], []
        for cid, by_m in self.times.items():
            if cid in self.failed:
                continue
            for m, s in by_m.items():
                rows.append((self.schedules[cid], m))
                ys.append(math.log(self.w.flops(m) / s / 1e9))
        # The held-out Spearman takes a second fit; it is reported, not searched by, so it is
        # taken again only once the rows grew by half (on a cluster every fit is the driver's
        # time, while the workers wait for candidates).
        holdout = len(rows) >= 1.5 * self._holdout_rows
        if holdout:
            self._holdout_rows = len(rows)
        if background and self.fitter is not None:
            job = self.model.fit_job(rows, ys, holdout)
            if job is not None:
                self.fitter.start(job)
                self._fit_rows = len(rows)
            self._spent("fit_send", start)
            return False
        if self.fitter is not None:  # a fit in line supersedes one in the child
            self.fitter.drop()
            self._refit_wanted = False
        self.model.fit(rows, ys, holdout=holdout)
        self._stale = False
        self._spent("fit", start)
        return True

    def _take_fit(self) -> bool:
        """Take in the child's fit if it is done (True: the model changed)."""
        if self.fitter is None or not self.fitter.done():
            return False
        start = time.perf_counter()
        try:
            trained = self.fitter.take()
        except ShapeshiftError as exc:
            self.log(f"  {exc}: the cost model is fit in line from now on")
            self.fitter.close()
            self.fitter = None
            self._refit_wanted = False
            return self._fit()
        self.model.adopt(trained)
        self.child_fits.append((self._fit_rows, trained[2]))
        self._spent("fit_take", start)
        if self._refit_wanted:
            self._refit_wanted = False
            self._fit(background=True)
        return True

    def _spent(self, kind: str, start: float) -> None:
        """The driver's seconds since ``start`` go to ``kind`` (``driver_s``)."""
        self.driver_s[kind] += time.perf_counter() - start
        self.driver_n[kind] += 1

    def _add_times(self, cid: int, seconds: dict[int, float]) -> None:
        self.times.setdefault(cid, {}).update(seconds)
        if self._best_s is not None and cid not in self.failed:
            for m, t in seconds.items():
                if t < self._best_s.get(m, math.inf):
                    self._best_s[m] = t

    def _add_failure(self, cid: int) -> None:
        self.failed.add(cid)
        self._best_s = None  # its earlier times, if any, no longer count

    def _best_seconds(self) -> dict[int, float]:
        """The best measured seconds at each M, over the candidates that never failed: kept up
        to date as results come (every draw asks, and a pass over all times was a third of it)."""
        if self._best_s is None:
            self._best_s = {}
            for cid, by_m in self.times.items():
                if cid not in self.failed:
                    for m, t in by_m.items():
                        if t < self._best_s.get(m, math.inf):
                            self._best_s[m] = t
        return self._best_s

    def _best_measured(self, m: int) -> float:
        """Best measured log GFLOPS at m, -inf if none."""
        best = self._best_seconds().get(m)
        return math.log(self.w.flops(m) / best / 1e9) if best is not None else -math.inf

    def _source(self, schedule: Schedule) -> "str | CandidateSource":
        """A candidate's measurement library source (what a cluster node compiles): its family
        and schedule, which the building process writes out as C, or the C itself where a
        ``source_fn`` of the caller's writes it."""
        if self.source_fn is not None:
            return measurement_source(schedule, self.family, self.source_fn)
        return CandidateSource(self.family.name, self.family.to_json(schedule))

    def _submit(self, schedule: Schedule, ms: list[int]) -> bool:
        """Send a candidate to be measured at those of ``ms`` it has not been measured at (by
        this run, an earlier one or another process: not built nor measured again); False if
        there are none."""
        cid = self.db.candidate_id(schedule, self.family)
        self._remember(cid, schedule)
        stored = self.db.measured_ms(self.wid, cid, self.cfg.threads)
        todo = [m for m in ms if m not in stored]
        if not todo:
            return False
        self.pending[self.measurer.submit(self._source(schedule), self.w, todo, self.runner)] = (cid, schedule, todo)
        return True

    def _results(self):
        """The candidates in flight as they come back, one at a time, each recorded (the
        database, ``times``, ``failed``) before it is yielded as (candidate id, its Ms).
        Whatever stops the caller (an error, a lost cluster) cancels the rest."""
        try:
            while self.pending:
                for ticket, result in self.measurer.wait(list(self.pending)):
                    start = time.perf_counter()
                    cid, _, todo = self.pending.pop(ticket)
                    self._record(cid, todo, result)
                    self._spent("record", start)
                    yield cid, todo
        finally:
            if self.pending:
                self.measurer.cancel(list(self.pending))
                self.pending.clear()

    def _record(self, cid: int, todo: list[int], result: Result) -> None:
        self.db.add_measurements(self.wid, cid, self.cfg.threads, result.seconds, result.error, todo, result.machine)
        self.tried.setdefault(cid, set()).update(todo)
        if result.error:
            self._add_failure(cid)
            self.first_error = self.first_error or result.error
            self.log(f"  candidate {cid} failed: {result.error}")
        else:
            self._add_times(cid, result.seconds)

    def _measure(self, picks: list[tuple[Schedule, list[int]]]) -> None:
        """Measure every pick (all at once on a cluster) and wait for them all."""
        for schedule, ms in picks:
            self._submit(schedule, ms)
        for _ in self._results():
            pass
        self._measured_outside()

    # ---- the evolutionary loop ----------------------------------------------------------
    def _predict(self, rows: list[tuple[Schedule, int]]) -> np.ndarray:
        """The cost model's predictions. Measurements that came outside the search (probes,
        joint timings: ``_measured_outside``) are fit in line first, only now that a
        prediction needs them (a fit after each was most of the driver's time after the
        search); with a background fitter, the newest model it has returned serves, as in the
        search: its fit of those measurements ran while the next ones were made."""
        if self.fitter is not None:
            self._take_fit()
        elif self._stale:
            self._fit()
        return self.model.predict(rows)

    def _measured_outside(self) -> None:
        """New measurements outside the search: the model is stale; a background fitter
        starts on them at once."""
        self._stale = True
        if self.fitter is not None:
            self._fit(background=True)

    def _scores(self, pool: list[Schedule], ms: list[int]) -> np.ndarray:
        pred = self._predict([(s, m) for s in pool for m in ms])
        return pred.reshape(len(pool), len(ms))

    def _next_pool(self, pool: list[Schedule], ms: list[int], score: "_ScoreCache") -> list[Schedule]:
        """Keep the best half by weighted score (log ratio to each M's predicted optimum,
        averaged over M), add mutants of the best and fresh random schedules."""
        pool = list(dict.fromkeys(pool + list(self.schedules.values())))
        scores = score(pool)
        rel = (scores - scores.max(axis=0)) @ self._weights_of(ms) / len(ms)
        ranked = [pool[i] for i in np.argsort(-rel)]
        keep = ranked[: self.cfg.population // 2]
        mutants = [self.family.mutate(self.rng.choice(keep[:8]), self.rng, self.target)
                   for _ in range(self.cfg.population // 3)]
        fresh = [self.family.random(self.rng, self.target)
                 for _ in range(self.cfg.population - len(keep) - len(mutants))]
        return list(dict.fromkeys(keep + mutants + fresh))

    def _weights_of(self, ms: list[int]) -> np.ndarray:
        """The weights of ``ms`` (a subset of the sampled Ms), normalized to mean 1."""
        w = np.array([self.weights[self.ms.index(m)] if m in self.ms else 1.0 for m in ms])
        return w / w.mean()

    def _measured(self, pool: list[Schedule], ms: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Which of ``pool`` are measured (or failed) at each of ``ms`` ([pool, M] booleans), and
        which are in flight (not drawn again until back)."""
        flying = {cid for cid, _, _ in self.pending.values()}
        measured = np.zeros((len(pool), len(ms)), dtype=bool)
        in_flight = np.zeros(len(pool), dtype=bool)
        for i, schedule in enumerate(pool):
            cid = self._cid_of.get(schedule)
            if cid is None:
                continue
            in_flight[i] = cid in flying
            if cid in self.failed:
                measured[i] = True
            elif cid in self.times:
                done = self.times[cid]
                measured[i] = [m in done for m in ms]
        return measured, in_flight

    def _pick(self, pool: list[Schedule], ms: list[int], count: int, score: "_ScoreCache"
              ) -> list[tuple[Schedule, list[int]]]:
        scores = score.pool(pool)
        w = self._weights_of(ms)
        regret = [w[j] * (scores[:, j].max() - self._best_measured(m)) for j, m in enumerate(ms)]
        picks: list[int] = []
        targets: dict[int, set[int]] = {}
        measured, in_flight = self._measured(pool, ms)
        # Drawable at each M: not measured there, not in flight, not picked already.
        open_at = ~measured & ~in_flight[:, None]
        # Round robin over M, worst regret first, until the batch is full (with one M, as in
        # per-shape and pad-max, that M takes every slot). The Ms that candidates in flight
        # are measuring come after the others: a search that draws one candidate as each
        # result comes would otherwise draw every one for the M of worst regret.
        covered = [sum(m in todo for _, _, todo in self.pending.values()) for m in ms]
        order = sorted(range(len(ms)), key=lambda j: (covered[j], -regret[j]))
        while len(picks) < count and open_at.any():
            for j in order:
                if len(picks) >= count:
                    break
                if open_at[:, j].any():  # the best-predicted one open at this M
                    i = int(np.argmax(np.where(open_at[:, j], scores[:, j], -np.inf)))
                    picks.append(i)
                    open_at[i] = False
                    targets[i] = {ms[j]}
        if not picks:
            return []
        # Each pick also runs at every M where it is predicted best among the picks and the
        # candidates in flight (measured together, in a round; measured now, asynchronously).
        rivals = score([s for _, s, _ in self.pending.values()]).max(axis=0) if self.pending else None
        best = np.array(picks)[np.argmax(scores[picks], axis=0)]
        for j, i in enumerate(best):
            if rivals is None or scores[i, j] > rivals[j]:
                targets[int(i)].add(ms[j])
        return [(pool[i], sorted(m for j, m in enumerate(ms) if m in targets[i] and not measured[i, j]))
                for i in picks]

    def evolve(self, ms: list[int], trials: int, deadline: float) -> None:
        """Measure ``trials`` candidates in all at ``ms``: drawn ``step`` at a time whenever
        that many of ``in_flight`` are free, each result recorded as it comes, the cost model
        refit and the pool evolved every ``batch`` results (a round; see ``__init__``)."""
        # The target's default seeds the pool: the search starts from what ships today.
        pool = [self.default] + [self.family.random(self.rng, self.target) for _ in range(self.cfg.population - 1)]
        # Candidates stored with a measurement at these Ms are trials already made (module docstring).
        done, rnd = min(self._tried_at(ms), trials), 0
        self.reused += done
        if done:
            self.log(f"  {done} of {trials} trials at M {' '.join(map(str, ms))} are in the database: "
                     f"{'nothing to measure' if done >= trials else f'{trials - done} to go'}")
        drawn, since_fit = done, 0
        # The default is measured first, at every M of the search (one of its trials): the
        # kernel set can then keep it (DEFAULT_MARGIN). Left to the cost model's picks it was
        # often never measured: ResNet-50's five conv classes tuned with 8 trials each (AMD
        # Zen 2) kept 8 drawn candidates that all lost to it, and the net ran 87 ms tuned
        # against 80 untuned.
        if drawn < trials and time.monotonic() < deadline and self._submit(self.default, ms):
            drawn += 1
        score: Optional[_ScoreCache] = None  # the pool's scores under the current fit; None: draw a new pool

        def draw() -> bool:
            """Draw and submit candidates if enough slots are free; False if none was drawn."""
            nonlocal pool, score, drawn
            free = self.in_flight - len(self.pending)
            want = min(free, trials - drawn)
            if free < self.step or want <= 0 or time.monotonic() >= deadline:
                return False
            if self._take_fit():
                score = None  # a new model: the pool is evolved and scored again
            start = time.perf_counter()
            fresh = score is None
            if fresh:
                score = _ScoreCache(self, ms)
                pool = self._next_pool(pool, ms, score)
                self._spent("pool", start)
                start = time.perf_counter()
            picks = self._pick(pool, ms, want, score)
            if not picks and not fresh:
                # Every candidate of the pool is measured or in flight (many slots, a model not
                # yet refit): the next generation, from the same model, rather than idle slots.
                pool = self._next_pool(pool, ms, score)
                picks = self._pick(pool, ms, want, score)
            for schedule, pick_ms in picks:
                if not self._submit(schedule, pick_ms):  # stored meanwhile: a trial made already
                    self.trials += 1
            drawn += len(picks)
            self._spent("pick", start)
            return bool(picks)

        def end_round(background: bool = True) -> None:
            nonlocal rnd, since_fit, score
            if self._fit(background):
                score = None
            rnd, since_fit = rnd + 1, 0
            best = " ".join(f"{m}:{math.exp(self._best_measured(m)):.1f}" if self._best_measured(m) > -math.inf
                            else f"{m}:-" for m in ms)
            rho = self.model.holdout_spearman
            self.log(f"  round {rnd}: trials {self.trials}, best GFLOPS per M {best}"
                     + (f", cost model Spearman {rho:.2f}" if rho is not None else ""))

        while draw() or self.pending:
            # Each result is recorded, may end a round, and frees a slot before the next one
            # is taken: what is drawn depends on the results in the order they came only.
            with contextlib.closing(self._results()) as results:
                for _, todo in results:
                    self.search_rows += len(todo)
                    self.trials += 1
                    since_fit += 1
                    if since_fit >= self.batch:
                        end_round()
                    draw()
        # The last results: fit in line (probes and the shortlist are predicted by a model of
        # every result), or, with a background fitter, there, while the probes are measured
        # on what the model it last returned predicts.
        if since_fit:
            end_round(background=self.fitter is not None)

    # ---- selection ---------------------------------------------------------------------
    def measured(self, cid: int, m: int) -> Optional[float]:
        """Seconds of candidate ``cid`` at ``m``: as timed together with others (``together``),
        else as measured alone; None if never measured there."""
        s = self.together.get(cid, {}).get(m)
        return s if s is not None else self.times.get(cid, {}).get(m)

    def _time_matrix(self, cids: list[int], ms: list[int], estimate: bool = False) -> np.ndarray:
        """Seconds of each candidate at each M: ``measured``, else predicted by the model (only
        those pairs are predicted). ``estimate``: for a cost estimate (a budget, a timeout), which
        the model as it stands serves: it is not refit for it (``_predict``)."""
        out = np.empty((len(cids), len(ms)))
        missing: list[tuple[int, int]] = []
        for i, c in enumerate(cids):
            for j, m in enumerate(ms):
                s = self.measured(c, m)
                out[i, j] = s if s is not None else math.nan
                if s is None:
                    missing.append((i, j))
        if missing:
            rows = [(self.schedules[cids[i]], ms[j]) for i, j in missing]
            pred = self.model.predict(rows) if estimate else self._predict(rows)
            for (i, j), p in zip(missing, pred):
                out[i, j] = self.w.flops(ms[j]) / (math.exp(p) * 1e9)
        return out

    def _select(self, validated: bool = False, among: Optional[list[int]] = None) -> list[int]:
        """The kernel set; ``validated``: only from candidates measured at every sampled M;
        ``among``: only from these."""
        cids = [c for c in (self.times if among is None else among) if c not in self.failed
                and (not validated or all(m in self.times[c] for m in self.select_ms))]
        if not cids:
            raise ShapeshiftError("no candidate was measured successfully")
        max_k = 1 if self.cfg.strategy == "pad-max" else self.cfg.max_kernels
        if self.cfg.strategy == "pad-max":
            hi = self._pad_value()
            at_hi = [c for c in cids if hi in self.times[c]]
            return [min(at_hi or cids, key=lambda c: self.times[c].get(hi, math.inf))]
        layouts = [self.family.layout(self.schedules[c]) for c in cids]
        # Only a constant operand packed once has a layout to share; a batched GEMM packs per call.
        one_layout = self.cfg.one_layout and self.w.shares_layout
        chosen = [cids[i] for i in dispatch.layout_cover(self._time_matrix(cids, self.select_ms), layouts, max_k,
                                                        one_layout, self.select_weights)]
        default = self._default_cid()
        if (self.cfg.strategy == "dietcode" and default is not None and default not in chosen
                and default in cids and len(chosen) < max_k
                and (not one_layout or self.family.layout(self.default) == layouts[cids.index(chosen[0])])):
            chosen.append(default)
        return chosen

    def _pad_value(self) -> int:
        """pad-max's one shape: the range's largest M, or a group's instance of most work."""
        return self.w.hi if self.ordered else max(self.ms, key=self.w.flops)

    def _default_cid(self) -> Optional[int]:
        """The hand-tuned default's candidate id, if it was measured and did not fail."""
        return next((c for c, s in self.schedules.items()
                     if s == self.default and c in self.times and c not in self.failed), None)

    def _probe(self) -> None:
        """Measure at each unsampled power of two of the range the PROBE_PICKS candidates
        predicted best there and the hand-tuned default; the kernel set is then chosen over
        those Ms too."""
        probes = probe_points(self.w.lo, self.top, self.ms)
        cids = [c for c in self.times if c not in self.failed]
        if not probes or not cids:
            return
        # A probe whose measurements are stored (a resumed run) is not probed again: the cost
        # model, trained on more than when they were made, would pick other candidates there.
        default = next((c for c, s in self.schedules.items() if s == self.default), None)
        todo = [m for m in probes if not (default is not None and m in self.tried.get(default, ())
                                          and sum(m in done for done in self.tried.values()) >= PROBE_PICKS)]
        pool = [self.schedules[c] for c in cids]
        if self.default not in pool:
            pool.append(self.default)
        targets: dict[int, set[int]] = {}
        if todo:
            scores = self._scores(pool, todo)
            for j, m in enumerate(todo):
                for i in np.argsort(-scores[:, j])[:PROBE_PICKS]:
                    targets.setdefault(int(i), set()).add(m)
            targets.setdefault(pool.index(self.default), set()).update(todo)
            self._measure([(pool[i], sorted(ms)) for i, ms in targets.items()])
        stored = f", {len(probes) - len(todo)} from the database" if len(todo) < len(probes) else ""
        self.log(f"  probed M {' '.join(map(str, probes))} ({len(targets)} candidates{stored})")
        self.select_ms = sorted(set(self.ms) | set(probes))
        floor = float(self.weights.min())
        self.select_weights = np.array([self.weights[self.ms.index(m)] if m in self.ms else floor
                                        for m in self.select_ms])

    def _cost_s(self, ts: Sequence[float], m: int) -> float:
        """Estimated seconds for the worker to time kernels taking ``ts`` seconds per call
        at ``m``: per kernel a warm-up and the check's call, then ``repeats`` samples of at
        least ``sample_s``; the NumPy check once per M."""
        r = self.runner
        return float(sum(r.repeats * max(r.sample_s, t) + 2 * t for t in ts) + self.w.flops(m) / (CHECK_GFLOPS * 1e9))

    def _shortlist(self, elapsed_s: float) -> list[int]:
        """The SHORTLIST_PER_M best candidates at each sampled or probed M, best first
        round robin over the Ms, at most SHORTLIST_MAX, plus the hand-tuned default. Each
        M's best is always in; another only while the estimated cost of timing the shortlist
        so far (``_cost_s``, bests included) fits in ``shortlist_budget`` x ``elapsed_s``."""
        cids = [c for c in self.times if c not in self.failed]
        times = self._time_matrix(cids, self.select_ms)
        ranks = np.argsort(times, axis=0)
        bests = {cids[i] for i in ranks[0]}
        order: list[int] = []
        for r in range(min(SHORTLIST_PER_M, len(cids))):
            for j in range(len(self.select_ms)):
                if cids[ranks[r, j]] not in order:
                    order.append(cids[ranks[r, j]])
        budget, spent = self.cfg.shortlist_budget * elapsed_s, 0.0
        short = []
        for c in order[:SHORTLIST_MAX]:
            cost = sum(self._cost_s([times[cids.index(c), j]], m) for j, m in enumerate(self.select_ms))
            if c in bests or spent + cost <= budget:
                short.append(c)
                spent += cost
        default = self._default_cid()
        if default is not None and default not in short:
            short.append(default)
        return short

    def _time_together(self, cids: list[int], ms: list[int]) -> bool:
        """Time ``cids`` together at ``ms`` (``runner.measure_together``) into ``together``;
        new (kernel, M) points also go to the database and the cost model. False (logged)
        if a worker failed. With several measurement slots the Ms are split into chunks of
        about equal estimated cost, one worker process each (``split_by_cost``): the kernel
        set is chosen and the tree trained by comparing kernels at one M, and each M is still
        timed in one process."""
        estimate = self._time_matrix(cids, ms, estimate=True)
        costs = {m: self._cost_s(estimate[:, j], m) for j, m in enumerate(ms)}
        self.joint_costs.append(costs)
        chunks = split_by_cost(ms, [costs[m] for m in ms], self.slots)
        # A generous limit: one process times every kernel at every M of its chunk.
        timeouts = [max(self.runner.timeout_s, 4 * sum(costs[m] for m in chunk)) for chunk in chunks]
        parts = self.measurer.time_together([self._source(self.schedules[c]) for c in cids], self.w, chunks,
                                            self.runner, timeouts)
        error = next((results[0].error for results in parts if results[0].error), None)
        if error:
            self.log(f"  timing {len(cids)} kernels together failed ({error})")
            return False
        # Chunk by chunk: each was timed on one machine, which its new points are recorded with.
        for results in parts:
            for c, result in zip(cids, results):
                self.together.setdefault(c, {}).update(result.seconds)
                new = {m: t for m, t in result.seconds.items() if m not in self.times.get(c, {})}
                if new:
                    self.db.add_measurements(self.wid, c, self.cfg.threads, new, None, list(new), result.machine)
                    self._add_times(c, new)
                    self.tried.setdefault(c, set()).update(new)
        self._measured_outside()
        return True

    def _time_dense(self, chosen: list[int], elapsed_s: float) -> None:
        """Time the chosen kernels together at the ``dense_points`` that fit in
        ``dense_budget`` x ``elapsed_s`` (estimated; cheapest M first): the tree is then
        trained on those times there."""
        if not self.ordered:
            return  # a group's instances are all sampled: no points between them
        points = [m for m in dense_points(self.w.lo, self.top) if m not in self.select_ms]
        # One kernel leaves the tree nothing to choose: timing it densely would only cost time
        # (at batch 16 up to 2 minutes of a 9-minute tuning).
        if self.cfg.dense_budget <= 0 or not points or len(chosen) < 2:
            return
        estimate = self._time_matrix(chosen, points, estimate=True)
        budget = self.cfg.dense_budget * elapsed_s - WORKER_START_S
        extra, spent = [], 0.0
        for cost, m in sorted((self._cost_s(estimate[:, j], m), m) for j, m in enumerate(points)):
            if spent + cost > budget:
                break
            spent += cost
            extra.append(m)
        if extra and self._time_together(chosen, sorted(extra)):
            self.log(f"  kernel set: {len(chosen)} kernel(s) timed together at {len(extra)} of {len(points)} "
                     f"dense Ms (estimated {spent:.1f} s of a {budget:.1f} s budget)")

    def _validated_select(self) -> list[int]:
        """Measure the chosen kernels alone wherever they were only predicted, and choose
        again (the model changed); the final set comes from fully measured candidates."""
        for _ in range(3):
            chosen = self._select()
            missing = [c for c in chosen if any(m not in self.times.get(c, {}) for m in self.select_ms)]
            if not missing:
                break
            self._measure([(self.schedules[c], self.select_ms) for c in missing])
        return self._select(validated=True)

    def _tree(self, chosen: list[int]) -> dict:
        lo, hi, top = self.w.lo, self.w.hi, self.top
        if self.ordered:
            points = sorted(set(np.linspace(lo, hi, min(TREE_POINTS, hi - lo + 1)).round().astype(int).tolist())
                            | {top})
        else:
            points = list(range(lo, hi + 1))
        # Above the measurement cap the best kernel is the one best at the cap (MEASURE_CAP).
        times = self._time_matrix(chosen, [min(m, top) for m in points])
        default = self._default_cid()
        if self.cfg.strategy == "dietcode" and default in chosen:
            times[chosen.index(default)] *= 1.0 - DEFAULT_MARGIN
        labels = np.argmin(times, axis=0)
        # Up to TREE_LEAVES_PER_KERNEL leaves per kernel: where the best kernel depends on T
        # modulo a tile width (edge tiles), only many short intervals of T follow it.
        leaves = min(TREE_MAX_LEAVES, TREE_LEAVES_PER_KERNEL * len(chosen))
        if self.ordered:
            return dispatch.fit_tree(points, labels.tolist(), max_leaves=leaves)
        # A group: the tree splits on the instances' dims (the dispatcher's arguments), so that
        # a shape between the instances still gets a kernel by its dims.
        names = self.w.tree_args
        features = [[self.w.point(v)[name] for name in names] for v in points]
        return dispatch.fit_tree(features, labels.tolist(), max_leaves=leaves, names=names)

    def run(self) -> TuneResult:
        try:
            return self._run()
        finally:
            if self.fitter is not None:
                self.fitter.close()

    def _run(self) -> TuneResult:
        start = time.monotonic()
        deadline = start + self.cfg.time_budget_s
        trials0 = self.trials
        if self.top < self.w.hi:
            weights = " ".join(f"{m}:{w:.2g}" for m, w in zip(self.ms, self.weights))
            self.log(f"  measuring M <= {self.top} only; M in ({self.top}, {self.w.hi}] gets the kernel best at "
                     f"{self.top} (sampled M:weight {weights})")
        if self.cfg.strategy == "dietcode":
            self.evolve(self.ms, self.cfg.trials, deadline)
        elif self.cfg.strategy == "per-shape":
            each = max(1, self.cfg.trials // len(self.ms))
            for i, m in enumerate(self.ms):
                self.log(f" M = {m}")
                # The time left is shared evenly by the shapes still to tune.
                share = (deadline - time.monotonic()) / (len(self.ms) - i)
                self.evolve([m], each, time.monotonic() + share)
        else:
            self.evolve([self._pad_value()], self.cfg.trials, deadline)
        if not any(c not in self.failed for c in self.times):
            if self.trials == trials0 and time.monotonic() >= deadline:
                # Not a failure: the budget was spent (by the tasks before this one) before the
                # first round. The caller keeps the default schedule.
                raise OutOfTime(f"tuning {self.w.describe()}: the time budget ran out before any candidate "
                                f"was measured")
            # Nothing to choose from: no compiler, say, and every candidate failed to build.
            raise ShapeshiftError(f"tuning {self.w.describe()}: no candidate could be built and measured; "
                                  f"the first failure: {self.first_error or 'none measured'}")
        if self.cfg.strategy == "dietcode" and self.cfg.probes and self.ordered:
            self._probe()

        def tuning_s() -> float:
            # The budgets below are fractions of the tuning time so far: a resumed run's own,
            # and what the stored measurements it reused took to make; in one worker's
            # seconds, as the joint timings' costs are estimated: with S slots the run had S
            # workers' time, and its joint timings are split S ways (``_time_together``).
            return (time.monotonic() - start) * self.slots + self.reused_s

        if self.cfg.strategy == "dietcode":
            # Choose among the shortlist timed together; should that fail, as the others do.
            short = self._shortlist(tuning_s())
            if self._time_together(short, self.select_ms):
                self.log(f"  shortlist: {len(short)} candidates timed together at {len(self.select_ms)} Ms")
                chosen = self._select(among=short)
            else:
                chosen = self._validated_select()
            self._time_dense(chosen, tuning_s())
        else:
            chosen = self._validated_select()
        tree = self._tree(chosen)
        kernels = [self.schedules[c] for c in chosen]
        # Reported as chosen: the times taken together where there are some.
        seconds = {m: self.measured(chosen[dispatch.choose(tree, tree_point(self.w, m))], m) or math.nan
                   for m in self.ms}
        self.db.add_selection(self.wid, self.w.lo, self.w.hi, self.cfg.threads, self.cfg.strategy,
                              [{"candidate": c, "schedule": self.family.to_json(self.schedules[c])} for c in chosen], tree,
                              self.target)
        return TuneResult(self.w, self.cfg.strategy, self.ms, kernels, tree, seconds, self.trials - trials0,
                          len(self.failed), time.monotonic() - start, self.model.holdout_spearman,
                          [{m: t for m in self.ms if (t := self.measured(c, m))} for c in chosen], self.reused)
