"""A learned cost model: predicts log GFLOPS of a schedule at one value of the dynamic dim.

The workload turns that value into the call's (M, K, N, batch) (``workload.shape``); the
features describe how the schedule meets that shape (padding of M to mr and of N to nr,
block counts, whether the B-streaming path runs, how evenly the threads are loaded) as
well as the schedule's own fields; the regressor is scikit-learn's gradient boosting,
retrained from scratch on all measurements whenever new ones arrive (a few hundred rows
train in well under a second). Until enough measurements exist it predicts from the
padding alone, which is what ranks tiles before any data.

As in DietCode (cost = f_k x padding ratio x occupancy), the padding is not left to the
regressor: it learns the rate of the work the kernel actually does (``work_ratio``: the
last panel of N computed in whole vectors) and the prediction divides that by the work
ratio. Uniform samples rarely land just past a multiple of nr, so a regressor left to
learn the padding itself predicted a smooth curve through a saw-tooth.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..codegen.kernels import gemm
from ..codegen.kernels.gemm import GemmSchedule

MIN_TRAIN_ROWS = 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def work_ratio(s: GemmSchedule, m: int, n: int) -> float:
    """Multiply-adds the kernels compute over the useful ones: the last partial panel of N
    runs whole vectors of the tile's width (packed path: edge kernels) or whole passes of
    8 x width (the ymm B-streaming path, per row group); rows are never padded."""
    def columns(step: int) -> int:
        return (n // s.nr) * s.nr + _cdiv(n % s.nr, step) * step

    if m > s.small_m:
        return columns(s.lanes) / n
    groups = gemm._small_row_groups(s, m)
    return sum(rows * columns(8 * gemm._small_shape(s, rows)[0]) for rows in groups) / (m * n)


def features(s: GemmSchedule, m: int, k: int, n: int, threads: int, batch: int = 1,
             work: Optional[float] = None) -> list[float]:
    """``work``: ``work_ratio(s, m, n)``, when the caller has it already."""
    small = m <= s.small_m
    pad_m = _cdiv(m, s.mr) * s.mr / m
    pad_n = _cdiv(n, s.nr) * s.nr / n  # how much of N falls in a partial (edge) panel
    work = work_ratio(s, m, n) if work is None else work
    # The driver's work split (ss_gemm_make_plan): batches first; where they cannot feed
    # every thread, N panels, then M panels if too few.
    used = threads if 2.0 * m * n * k * batch >= s.parallel_min_flops else 1
    n_panels, m_panels = _cdiv(n, s.nr), _cdiv(m, s.mr)
    n_split = m_split = 1
    if used > 1 and batch < 8 * used:
        need = used // math.gcd(batch, used)
        n_split = min(need, n_panels)
        if n_split < need and not small:
            m_split = min(_cdiv(need, n_split), m_panels)
    items = batch * _cdiv(n_panels, _cdiv(n_panels, n_split)) * _cdiv(m_panels, _cdiv(m_panels, m_split))
    parts = min(used, items)
    balance = items / (parts * _cdiv(items, parts))
    prefetching = float(small and s.prefetch_rows > 0 and m >= s.prefetch_min_m)
    # Packed panels of B the first row group reads at once (read streams), 0 off the B-streaming path.
    in_flight = gemm._small_panels(s, *gemm._small_calls(s, m)[0]) if small else 0
    return [s.mr, s.nr, s.kc, s.mc, s.nc, s.unroll_k, s.small_m, s.small_nc, s.pack_rows, s.prefetch_rows,
            prefetching, math.log2(s.parallel_min_flops), m, math.log2(m), math.log2(n), math.log2(k), float(small),
            pad_m, pad_n, work, n % s.nr, m % s.mr, _cdiv(m, s.mc), _cdiv(n, s.nc), _cdiv(k, s.kc),
            m_panels * n_panels, balance, parts, s.small_panels, in_flight, s.lanes, s.prefetch_c, s.a_in_l1]


def prior_log_gflops(s: GemmSchedule, m: int, n: int) -> float:
    """Before any data: bigger tiles are faster; rows of a partial tile (a slower edge
    kernel) and columns past N in the last vector cost as if wasted."""
    pad = (_cdiv(m, s.mr) * s.mr / m) * work_ratio(s, m, n)
    # FMAs per load of a k step (broadcasts of A plus vectors of B), in vectors of the width.
    tile = min(s.mr, m) * s.nr / (s.mr + s.nr / s.lanes)
    return math.log(tile) - math.log(pad)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (ties get their average rank), without scipy."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):  # average the ranks of tied values
        tied = x == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


class CostModel:
    """``workload``: a GemmWorkload or BatchedGemmWorkload; rows are (schedule, value of its
    dynamic dim)."""

    def __init__(self, workload, threads: int, seed: int = 0):
        self.shape, self.threads, self.seed = workload.shape, threads, seed
        self.model = None
        self.holdout_spearman: Optional[float] = None

    def _encode(self, rows: Sequence[tuple[GemmSchedule, int]]) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix, and log work_ratio per row: the regressor learns log GFLOPS +
        log work ratio (the rate of the work done), predictions subtract it."""
        x, log_work = [], []
        for s, value in rows:
            m, k, n, batch = self.shape(value)
            work = work_ratio(s, m, n)
            x.append(features(s, m, k, n, self.threads, batch, work))
            log_work.append(math.log(work))
        return np.array(x), np.array(log_work)

    def fit(self, rows: Sequence[tuple[GemmSchedule, int]], log_gflops: Sequence[float]) -> None:
        """Retrain on all rows; first on 80% of them, to report Spearman on the other 20%."""
        if len(rows) < MIN_TRAIN_ROWS:
            return
        from sklearn.ensemble import GradientBoostingRegressor

        x, log_work = self._encode(rows)
        y = np.asarray(log_gflops, dtype=float) + log_work

        def make():
            return GradientBoostingRegressor(n_estimators=150, max_depth=3, learning_rate=0.1, subsample=0.9,
                                             random_state=self.seed)

        order = np.random.default_rng(self.seed).permutation(len(y))
        # Fewer than 5 held-out points make the correlation meaningless (it is +-1 at 2).
        held = order[: max(5, len(y) // 5)]
        train = order[len(held):]
        if len(train) >= MIN_TRAIN_ROWS:
            probe = make().fit(x[train], y[train])
            # Ranked on log GFLOPS, what the search compares.
            self.holdout_spearman = spearman(probe.predict(x[held]) - log_work[held], y[held] - log_work[held])
        self.model = make().fit(x, y)

    def predict(self, rows: Sequence[tuple[GemmSchedule, int]]) -> np.ndarray:
        """Predicted log GFLOPS of each (schedule, M)."""
        if not rows:
            return np.zeros(0)
        if self.model is None:
            return np.array([prior_log_gflops(s, self.shape(x)[0], self.shape(x)[2]) for s, x in rows])
        x, log_work = self._encode(rows)
        return self.model.predict(x) - log_work
