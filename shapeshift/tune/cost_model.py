"""A learned cost model: predicts log GFLOPS of a schedule at one value of a task's dynamic variable.

The features are the task's family's (tune/task.py): how the schedule meets the call's
shape at that value, as well as the schedule's own fields. The regressor is scikit-learn's
gradient boosting, retrained from scratch on all measurements whenever new ones arrive (a
few hundred rows train in well under a second), in line or, on a cluster, in a child
process (``train`` is a plain function of arrays; tune/background_fit.py). Until enough
measurements exist it ranks by the family's prior.

As in DietCode (cost = f_k x padding ratio x occupancy), the padding is not left to the
regressor: it learns the rate of the work the kernel actually does, and the prediction
divides that by the family's work ratio (padding and edge vectors) at that value.
"""

from __future__ import annotations

import math
import time
from typing import Optional, Sequence

import numpy as np

MIN_TRAIN_ROWS = 8
# Feature rows kept (``CostModel._encode``); past this the cache starts again (a few MB).
MAX_CACHED_ROWS = 200_000


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
    """``task``: a tuning task (tune/task.py); rows are (schedule, value of its dynamic variable)."""

    def __init__(self, task, threads: int, seed: int = 0):
        self.task, self.threads, self.seed = task, threads, seed
        self.family = task.family
        self.model = None
        self.holdout_spearman: Optional[float] = None
        self._rows: dict[tuple, tuple[list[float], float]] = {}  # (schedule, value) -> (features, log work)

    def _encode(self, rows: Sequence[tuple]) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix, and log work ratio per row: the regressor learns log GFLOPS +
        log work ratio (the rate of the work done), predictions subtract it. A row depends
        on its (schedule, value) only, so each is computed once (``_rows``): the search
        scores the same pool, and refits on the same measurements, again and again, and
        the features were most of a draw's time."""
        if len(self._rows) > MAX_CACHED_ROWS:
            self._rows.clear()
        x, log_work = [], []
        for key in rows:
            cached = self._rows.get(key)
            if cached is None:
                s, value = key
                row, work = self.family.features(s, self.task, value, self.threads)
                cached = self._rows[key] = (row, math.log(work))
            x.append(cached[0])
            log_work.append(cached[1])
        return np.array(x), np.array(log_work)

    def fit(self, rows: Sequence[tuple], log_gflops: Sequence[float], holdout: bool = True) -> None:
        """Retrain on all rows; first, with ``holdout``, on 80% of them, to report Spearman on
        the other 20% (a second fit: the search asks for it only now and then)."""
        job = self.fit_job(rows, log_gflops, holdout)
        if job is not None:
            self.adopt(train(*job))

    def fit_job(self, rows: Sequence[tuple], log_gflops: Sequence[float], holdout: bool = True
                ) -> Optional[tuple]:
        """The arguments of ``train`` for a fit on these rows (None: too few rows), for a fit
        run elsewhere (the search's background process) and taken in with ``adopt``."""
        if len(rows) < MIN_TRAIN_ROWS:
            return None
        x, log_work = self._encode(rows)
        return x, np.asarray(log_gflops, dtype=float) + log_work, log_work, self.seed, holdout

    def adopt(self, trained: tuple) -> None:
        """Take in what ``train`` returned: the regressor, and the held-out Spearman if it took one."""
        model, rho, _ = trained
        self.model = model
        if rho is not None:
            self.holdout_spearman = rho

    def predict(self, rows: Sequence[tuple]) -> np.ndarray:
        """Predicted log GFLOPS of each (schedule, value)."""
        if not rows:
            return np.zeros(0)
        if self.model is None:
            return np.array([self.family.prior(s, self.task, value) for s, value in rows])
        x, log_work = self._encode(rows)
        return self.model.predict(x) - log_work


def train(x: np.ndarray, y: np.ndarray, log_work: np.ndarray, seed: int, holdout: bool
          ) -> tuple[object, Optional[float], float]:
    """The regressor fit on (x, y) and, with ``holdout``, the Spearman of a second fit on 80%
    of the rows against the other 20% (else None); the seconds it took. A plain function of
    arrays, so that it runs in another process as well as here."""
    from sklearn.ensemble import GradientBoostingRegressor

    start = time.perf_counter()

    def make():
        return GradientBoostingRegressor(n_estimators=150, max_depth=3, learning_rate=0.1, subsample=0.9,
                                         random_state=seed)

    rho = None
    order = np.random.default_rng(seed).permutation(len(y))
    # Fewer than 5 held-out points make the correlation meaningless (it is +-1 at 2).
    held = order[: max(5, len(y) // 5)]
    train_rows = order[len(held):]
    if holdout and len(train_rows) >= MIN_TRAIN_ROWS:
        probe = make().fit(x[train_rows], y[train_rows])
        # Ranked on log GFLOPS, what the search compares.
        rho = spearman(probe.predict(x[held]) - log_work[held], y[held] - log_work[held])
    return make().fit(x, y), rho, time.perf_counter() - start
