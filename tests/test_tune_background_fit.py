"""The cost model fit in a child process (tune/background_fit.py) and the search that uses it
on a cluster of several slots (tune/search.py), against the in-process fake cluster of
test_tune_async.py, its results handed back in real time so that the child's fits come back
while the search still draws."""

from __future__ import annotations

import math
import random
import threading
import time

import numpy as np
import pytest

from shapeshift.errors import ShapeshiftError
from shapeshift.target import host_target
from shapeshift.tune.background_fit import BackgroundFit
from shapeshift.tune.cost_model import CostModel, train
from shapeshift.tune.gemm_family import GEMM
from shapeshift.tune.search import BACKGROUND_FIT_SLOTS
from shapeshift.tune.workload import uniform_samples
from .test_tune_async import BROKEN, WORKLOAD, FakeCluster, _tune

pytest.importorskip("sklearn")


def _rows(n: int, seed: int = 0):
    rng, target = random.Random(seed), host_target()
    ms = uniform_samples(WORKLOAD.lo, WORKLOAD.hi, 6)
    rows = [(GEMM.random(rng, target), rng.choice(ms)) for _ in range(n)]
    return rows, [rng.uniform(2.0, 5.0) for _ in rows]


def test_a_fit_in_the_child_predicts_as_the_same_fit_in_line():
    rows, ys = _rows(120)
    here, there = CostModel(WORKLOAD, 1), CostModel(WORKLOAD, 1)
    here.fit(rows, ys)
    fitter = BackgroundFit()
    try:
        fitter.start(there.fit_job(rows, ys))
        assert fitter.busy
        with pytest.raises(RuntimeError):
            fitter.start(there.fit_job(rows, ys))  # one at a time
        trained = fitter.take()
    finally:
        fitter.close()
    there.adopt(trained)
    assert not fitter.busy and trained[2] > 0
    probe, _ = _rows(50, seed=1)
    np.testing.assert_array_equal(here.predict(probe), there.predict(probe))
    assert here.holdout_spearman == there.holdout_spearman is not None


def test_a_child_that_dies_is_an_error_naming_it():
    rows, ys = _rows(40)
    model = CostModel(WORKLOAD, 1)
    fitter = BackgroundFit()
    try:
        fitter.start(model.fit_job(rows, ys))
        fitter.take()
        fitter._child.kill()
        fitter._child.wait()
        fitter.start(model.fit_job(rows, ys))
        with pytest.raises(ShapeshiftError, match="background fit process stopped"):
            fitter.take()
    finally:
        fitter.close()


def test_closing_with_a_fit_running_ends_the_child_quietly(monkeypatch):
    """The run's end closes the fitter while a fit may still be running (its result no longer
    wanted): the thread finishes that fit, sends nothing more, and ends the child."""
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    rows, ys = _rows(200)
    model = CostModel(WORKLOAD, 1)
    fitter = BackgroundFit()
    fitter.start(model.fit_job(rows, ys))
    fitter.take()  # the child is up
    fitter.start(model.fit_job(rows, ys))
    thread, child = fitter._thread, fitter._child
    fitter.close()
    thread.join(timeout=60)
    assert not thread.is_alive() and child.poll() is not None and errors == []


class RealTimeCluster(FakeCluster):
    """The fake cluster, each result handed back ``pause`` seconds of real time after the last."""

    def __init__(self, slots: int, pause: float):
        super().__init__(slots)
        self.pause = pause

    def wait(self, tickets):
        time.sleep(self.pause)
        return super().wait(tickets)


def _best_from_scratch(tuner) -> dict[int, float]:
    best: dict[int, float] = {}
    for cid, by_m in tuner.times.items():
        if cid not in tuner.failed:
            for m, t in by_m.items():
                best[m] = min(best.get(m, math.inf), t)
    return best


def test_on_several_slots_every_fit_runs_in_the_child(tmp_path):
    slots = BACKGROUND_FIT_SLOTS + 4
    tuner, result, rows = _tune(tmp_path, RealTimeCluster(slots, pause=0.03), trials=160)
    assert tuner.fitter is not None and tuner.fitter._child is None  # closed when the run ended
    # Fits came back from the child while the search drew (a refit every `slots` results) ...
    assert len(tuner.child_fits) >= 2, tuner.child_fits
    assert all(n >= 8 and s > 0 for n, s in tuner.child_fits)
    # ... and none ran in line, after the search either (the one at start had no rows to fit).
    assert tuner.driver_n["fit"] == 1 and tuner.model.model is not None
    assert result.trials == 160 and len(rows) >= 160
    # The model in use is the child's last fit (test_a_fit_in_the_child_predicts_as_the_same_fit_in_line).
    n_rows, _ = tuner.child_fits[-1]
    assert 8 <= n_rows <= len(rows)
    assert tuner._best_seconds() == _best_from_scratch(tuner)


def test_one_slot_fits_in_line(tmp_path):
    tuner, result, _ = _tune(tmp_path, FakeCluster(1), trials=12)
    assert tuner.child_fits == [] and result.trials == 12


def test_the_best_times_kept_as_results_come_match_a_pass_over_all_of_them(tmp_path):
    """Failed candidates among them: their times never count."""
    def broken_sometimes(schedule):
        from shapeshift.codegen.kernels import gemm

        text = gemm.source(schedule)
        return text + BROKEN if schedule.kc % 3 == 0 else text

    tuner, _, rows = _tune(tmp_path, FakeCluster(3), source_fn=broken_sometimes, trials=24)
    assert tuner.failed and any(error is None for *_, error in rows)
    assert tuner._best_seconds() == _best_from_scratch(tuner)
    tuner._best_s = None
    assert tuner._best_seconds() == _best_from_scratch(tuner)
