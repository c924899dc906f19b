"""The tuner's failure modes (issue 30, item 5): a missing scikit-learn is a one-line error
before any work; a time budget that runs out keeps the default schedule for the tasks it
did not reach and ends normally; a resumed run reuses every stored measurement; reading a
database creates no file beside it; a directory given as the database is named as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from shapeshift import InferenceSession, ShapeshiftError
from shapeshift.cli import tune_cmd
from shapeshift.cli.main import main
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.tune import runner, search
from shapeshift.tune.builder import Built
from shapeshift.tune.database import Database, read_only
from shapeshift.tune.deps import MissingDependencyError
from shapeshift.tune.records import GemmTuning
from shapeshift.tune.runner import RunnerConfig
from shapeshift.tune.search import OutOfTime, TuneConfig, Tuner
from shapeshift.tune.workload import GemmWorkload

from .test_tune_model import RANGES, _model, _records

pytest.importorskip("sklearn")

FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=20)
WORKLOAD = GemmWorkload(64, 64, 1, 64)
GEMM_ARGS = ["tune", "--gemm", "64", "64", "--dynamic", "M=1:64", "--trials", "2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tune_cache")


@pytest.fixture
def counted(monkeypatch):
    """Counts the worker processes the tuner starts: measurements alone and together."""
    calls = {"alone": [], "together": []}
    alone, together = search.measure, search.measure_together

    def measure(built, workload, ms, config):
        calls["alone"].append(list(ms))
        return alone(built, workload, ms, config)

    def measure_together(builts, workload, ms, config, timeout_s=None):
        calls["together"].append((len(builts), list(ms)))
        return together(builts, workload, ms, config, timeout_s=timeout_s)

    monkeypatch.setattr(search, "measure", measure)
    monkeypatch.setattr(search, "measure_together", measure_together)
    return calls


def _no_worker(*args, **kwargs):
    raise AssertionError("a measurement was started")


# ---- a: scikit-learn missing -------------------------------------------------------------

@pytest.fixture
def no_sklearn(monkeypatch):
    """``import sklearn`` (and its submodules) fails, as where it is not installed."""
    for name in ("sklearn", "sklearn.ensemble", "sklearn.tree"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(search, "measure", _no_worker)
    monkeypatch.setattr(search, "measure_together", _no_worker)


@pytest.mark.parametrize("model", [False, True])
def test_tune_without_sklearn_is_one_line_before_any_work(no_sklearn, tmp_path, capsys, model):
    db = tmp_path / "t.db"
    argv = (["tune", _model(tmp_path), "--dynamic", "B=1:4", "--dynamic", "T=1:64", "--trials", "2"] if model
            else GEMM_ARGS)
    assert main([*argv, "--db", str(db)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("shapeshift tune: error: ") and "scikit-learn" in err
    assert "pip install 'shapeshift[tune]'" in err
    assert captured.out == "" and not db.exists()  # nothing done: no task list, no database


def test_tuner_without_sklearn_raises_naming_the_fix(no_sklearn, tmp_path):
    with Database(tmp_path / "t.db") as db:
        with pytest.raises(MissingDependencyError, match=r"pip install 'shapeshift\[tune\]'"):
            Tuner(WORKLOAD, db, tmp_path / "cache", TuneConfig(trials=2, runner=FAST), log=lambda s: None)


# ---- b: a time budget that runs out --------------------------------------------------------

def test_a_tuner_without_time_says_so_rather_than_no_candidate_built(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "measure", _no_worker)
    with Database(tmp_path / "t.db") as db:
        tuner = Tuner(WORKLOAD, db, tmp_path / "cache", TuneConfig(time_budget_s=0.0, runner=FAST),
                      log=lambda s: None)
        with pytest.raises(OutOfTime, match="time budget ran out before any candidate was measured"):
            tuner.run()
        assert db.conn.execute("SELECT COUNT(*) FROM selections").fetchone()[0] == 0


def test_a_budget_spent_before_the_last_task_ends_normally_and_keeps_its_default(tmp_path, monkeypatch, capsys):
    """The first task takes the whole budget (the CLI's clock jumps past it once the task is
    tuned): the second gets no time, the run exits 0 and says so, the first task's records
    are kept and the second has none (a session runs its default schedule)."""
    model = _model(tmp_path)
    db = tmp_path / "t.db"

    class Clock:  # the CLI's clock only; the tuner's own deadline runs on real time
        offset = 0.0

        def monotonic(self) -> float:
            return time.monotonic() + self.offset

    clock = Clock()
    monkeypatch.setattr(tune_cmd, "time", clock)
    real_run = Tuner.run

    def run_then_spend_the_budget(self):
        result = real_run(self)
        clock.offset = 1e6
        return result

    monkeypatch.setattr(Tuner, "run", run_then_spend_the_budget)
    assert main(["tune", model, "--dynamic", "B=1:4", "--dynamic", "T=1:64", "--trials", "2", "--db", str(db),
                 "--time-budget", "10"]) == 0
    out = capsys.readouterr().out
    tuned, skipped = ("[64, 96]", "[96, 48]") if out.index("[64, 96]") < out.index("[96, 48]") else \
        ("[96, 48]", "[64, 96]")
    assert "no time left in the budget: the default schedule is kept" in out
    assert f"no time for 1 task(s): {skipped}" in out and "summary: 1 task(s)" in out
    records = GemmTuning.from_db(db, 1)
    k, n = (int(d) for d in tuned.strip("[]").split(", "))
    assert [(r.k, r.n) for r in records] == [(k, n)]
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    # The task without time packs its weight for the default schedule (ss_gemm_prepacked).
    assert {p.prefix for p in session._executor.program.packs} == {f"ss_tuned_{k}x{n}_", "ss_gemm_"}


# ---- c: resuming --------------------------------------------------------------------------

def test_a_resumed_tuning_measures_nothing_it_has(tmp_path, cache, counted, monkeypatch):
    """A run killed after its search (here: an exception where it probes), then the same
    tuning again: the search's trials come from the database (no candidate measured alone);
    only the probes it never reached are measured. A third run measures nothing alone: what
    it does is time the shortlist and the kernel set together, once each (times are compared
    only within one worker process)."""
    config = TuneConfig(trials=4, batch=2, samples=3, runner=FAST)

    class Killed(Exception):
        pass

    def killed(self):
        raise Killed

    with Database(tmp_path / "t.db") as db:
        with monkeypatch.context() as patch:
            patch.setattr(Tuner, "_probe", killed)
            with pytest.raises(Killed):
                Tuner(WORKLOAD, db, cache, config, log=lambda s: None).run()
        searched = len(counted["alone"])
        assert searched >= 2 and not counted["together"]

        counted["alone"].clear()
        second = Tuner(WORKLOAD, db, cache, config, log=lambda s: None)
        result = second.run()
        assert result.trials == 0 and result.reused == 4
        probes = search.probe_points(WORKLOAD.lo, WORKLOAD.hi, second.ms)
        # Only probes: no M of the search measured again.
        assert counted["alone"] and all(set(ms) <= set(probes) for ms in counted["alone"])

        counted["alone"].clear()
        counted["together"].clear()
        third = Tuner(WORKLOAD, db, cache, config, log=lambda s: None).run()
        assert counted["alone"] == [] and third.trials == 0 and third.reused == 4
        assert len(counted["together"]) <= 2  # the shortlist, then the kernel set at the dense Ms


def test_more_trials_measure_only_the_new_ones(tmp_path, cache, counted):
    """``trials`` counts the stored candidates: asking for 2 more measures 2 more."""
    config = TuneConfig(trials=2, batch=2, samples=3, runner=FAST, probes=False, dense_budget=0)
    with Database(tmp_path / "t.db") as db:
        Tuner(WORKLOAD, db, cache, config, log=lambda s: None).run()
        counted["alone"].clear()
        bigger = TuneConfig(trials=4, batch=2, samples=3, runner=FAST, probes=False, dense_budget=0)
        tuner = Tuner(WORKLOAD, db, cache, bigger, log=lambda s: None)
        result = tuner.run()
    assert result.reused == 2 and result.trials == 2
    assert len(counted["alone"]) == 2


def test_a_worker_ended_by_ctrl_c_is_the_users_interrupt_not_a_failed_candidate(tmp_path, monkeypatch):
    """Ctrl-C reaches the worker too; should it die of it first, the candidate must not be
    stored as failed (a resumed run would never measure it)."""
    def interrupted(args, **kwargs):
        return subprocess.CompletedProcess(args, -signal.SIGINT, "", "KeyboardInterrupt")

    monkeypatch.setattr(runner.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.measure(Built(GemmSchedule(), tmp_path / "candidate.so"), WORKLOAD, [1], FAST)


# ---- d: read-only opening ----------------------------------------------------------------

def _listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_reading_records_creates_no_file_beside_the_database(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    db = _records(folder)
    assert _listing(folder) == ["records.db"]  # closed: SQLite removed its -wal and -shm
    assert len(GemmTuning.from_db(db, 1)) == 2
    assert _listing(folder) == ["records.db"]


def test_reading_records_beside_a_writer_sees_what_it_committed(tmp_path):
    """While a tuner has the database open, committed records may be in its WAL only: they
    are read (through the WAL), which immutable reading alone would miss."""
    db = _records(tmp_path)
    with Database(db) as writer:
        wid = writer.workload_id(GemmWorkload(32, 32, 1, 8))
        kernels = json.loads(writer.conn.execute("SELECT kernels FROM selections LIMIT 1").fetchone()[0])
        writer.add_selection(wid, 1, 8, 1, "dietcode", kernels, {"leaf": 0})
        assert os.path.exists(f"{db}-wal")
        assert GemmTuning.from_db(db, 1).get(32, 32) is not None


def test_a_writer_starting_during_an_immutable_read_sends_it_through_the_wal(tmp_path):
    """A writer that opens the database while it is read without locks could checkpoint
    under the read: the answer is thrown away and read again the locked way."""
    db = _records(tmp_path)
    answers = []

    def query(conn):
        if not answers:  # the first, immutable read: a writer starts meanwhile
            writer = Database(db)
            writer.workload_id(GemmWorkload(16, 16, 1, 8))
            answers.append(writer)
        return conn.execute("SELECT COUNT(*) FROM workloads").fetchone()[0]

    try:
        assert read_only(tmp_path / "records.db", query) == 3  # the writer's workload seen
    finally:
        answers[0].close()


# ---- e: a directory as the database --------------------------------------------------------

def test_a_directory_as_the_database_is_named_as_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(search, "measure", _no_worker)
    folder = tmp_path / "dbdir"
    folder.mkdir()
    assert main([*GEMM_ARGS, "--db", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"tuning database {folder} is a directory" in err and "does not exist" not in err
    with pytest.raises(ShapeshiftError, match="is a directory, not a database file"):
        Database(folder)
    model = _model(tmp_path)
    with pytest.raises(ShapeshiftError, match=f"tuning database {folder} is a directory"):
        InferenceSession(model, RANGES, backend="native", tuning_db=folder)
    assert main(["compile", model, "-o", str(tmp_path / "x.ssa"), "--dynamic", "B=1:4", "--dynamic", "T=1:64",
                 "--db", str(folder)]) == 2
    assert "is a directory" in capsys.readouterr().err
