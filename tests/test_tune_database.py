"""The tuning database as the task protocol keeps it: workloads by task key and family,
candidates by family, measurements by the CPU that made them, and databases from before
migrated in place (tune/database.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.errors import ShapeshiftError
from shapeshift.tune import space
from shapeshift.tune.database import Database
from shapeshift.tune.gemm_family import GEMM
from shapeshift.tune.records import GemmTuning
from shapeshift.tune.search import TuneConfig, Tuner
from shapeshift.tune.task import family_named, families
from shapeshift.tune.workload import BatchedGemmWorkload, GemmWorkload

pytest.importorskip("sklearn")

WORKLOAD = GemmWorkload(64, 96, 1, 32)
SMALL = GemmSchedule(mr=4, nr=8, kc=32, mc=8, nc=32, unroll_k=2, small_m=2, small_nc=16)
OTHER = GemmSchedule(mr=2, nr=16, kc=64, mc=8, nc=64, small_nc=32)

# The layout of every table before tasks named their family and measurements their CPU.
OLD_SCHEMA = """
CREATE TABLE workloads (id INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, key TEXT NOT NULL,
    k INTEGER NOT NULL, n INTEGER NOT NULL);
CREATE TABLE candidates (id INTEGER PRIMARY KEY, schedule TEXT UNIQUE NOT NULL);
CREATE TABLE measurements (workload_id INTEGER NOT NULL, candidate_id INTEGER NOT NULL,
    m INTEGER NOT NULL, threads INTEGER NOT NULL, seconds REAL, error TEXT, created REAL NOT NULL,
    PRIMARY KEY (workload_id, candidate_id, m, threads));
CREATE TABLE selections (id INTEGER PRIMARY KEY, workload_id INTEGER NOT NULL,
    lo INTEGER NOT NULL, hi INTEGER NOT NULL, threads INTEGER NOT NULL, strategy TEXT NOT NULL,
    kernels TEXT NOT NULL, tree TEXT NOT NULL, created REAL NOT NULL);
"""


def _old_database(path):
    """A database as shapeshift wrote it before: a dense and a batched workload (K and N
    columns, 0 for the batched one), two candidates, measurements, one selection."""
    batched = BatchedGemmWorkload(2, (0, 1, 0), (0, 1, 0), (64, 0, 0), ((0, 64, 0), (0, 64 * 2, 0), (1, 0, 0)),
                                  ((0, 64, 0), (1, 0, 0), (0, 64 * 2, 0)), ((0, 0, 1), (0, 2, 0)), 1, 16)
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.execute("INSERT INTO workloads VALUES (7, ?, ?, 64, 96)", (WORKLOAD.hash, WORKLOAD.key))
    conn.execute("INSERT INTO workloads VALUES (8, ?, ?, 0, 0)", (batched.hash, batched.key))
    conn.execute("INSERT INTO candidates VALUES (3, ?)", (space.to_json(SMALL),))
    conn.execute("INSERT INTO candidates VALUES (4, ?)", (space.to_json(OTHER),))
    conn.executemany("INSERT INTO measurements VALUES (7, ?, ?, 1, ?, NULL, 0.0)",
                     [(3, 1, 1e-6), (3, 32, 4e-6), (4, 1, 2e-6), (4, 32, 3e-6)])
    conn.execute("INSERT INTO selections VALUES (1, 7, 1, 32, 1, 'dietcode', ?, ?, 0.0)",
                 (json.dumps([{"candidate": 3, "schedule": space.to_json(SMALL)}]), '{"leaf": 0}'))
    conn.commit()
    conn.close()
    return batched


def test_workloads_are_keyed_by_task_and_family_not_k_and_n(tmp_path):
    with Database(tmp_path / "t.db") as db:
        wid = db.workload_id(WORKLOAD)
        assert db.workload_id(GemmWorkload(64, 96, 5, 500)) == wid  # the key names no range
        columns = [row[1] for row in db.conn.execute("PRAGMA table_info(workloads)")]
        assert columns == ["id", "hash", "key", "family"]
        assert db.conn.execute("SELECT key, family FROM workloads").fetchall() == [("gemm-prepacked:64:96", "gemm")]
        cid = db.candidate_id(SMALL, GEMM)
        assert db.conn.execute("SELECT family FROM candidates WHERE id = ?", (cid,)).fetchone() == ("gemm",)


def test_a_candidate_of_another_family_is_refused_as_damage(tmp_path):
    class Other:
        name = "conv"

    with Database(tmp_path / "t.db") as db:
        cid = db.candidate_id(SMALL)
        with pytest.raises(ShapeshiftError, match="is a 'gemm' schedule, measured for a 'conv' task"):
            db.schedule(cid, Other())


def test_families_are_looked_up_by_the_name_the_database_records():
    assert family_named("gemm") is GEMM and "gemm" in families()
    with pytest.raises(ValueError, match="unknown kernel family 'conv2d-nchwc'"):
        family_named("conv2d-nchwc")


def test_measurements_of_another_cpu_are_kept_apart(tmp_path):
    """A measurement names the CPU that made it: a database shared by two machines keeps both
    sets, and each machine's tuner sees (and resumes from) its own only."""
    with Database(tmp_path / "t.db") as db:
        wid, cid = db.workload_id(WORKLOAD), db.candidate_id(SMALL)
        db.add_measurements(wid, cid, 1, {1: 1e-6})
        here = db.target_key
        db.target_key = "another-cpu"
        db.add_measurements(wid, cid, 1, {1: 5e-6, 32: 9e-6})  # the same (candidate, M) on another CPU: kept
        db.add_measurements(wid, db.candidate_id(OTHER), 1, {}, error="wrong result", ms=[1])
        assert db.measurements(wid, 1) == [(cid, 1, 5e-6, None), (cid, 32, 9e-6, None),
                                           (db.candidate_id(OTHER), 1, None, "wrong result")]
        db.target_key = here
        assert db.measurements(wid, 1) == [(cid, 1, 1e-6, None)]
        assert db.measured_ms(wid, cid, 1) == {1}
        assert db.failed_candidates(wid, 1) == set()
        rows = db.conn.execute("SELECT target, COUNT(*) FROM measurements GROUP BY target ORDER BY target").fetchall()
        assert rows == sorted([("another-cpu", 3), (here, 1)])


def test_measurements_name_the_machine_that_made_them(tmp_path):
    """Node, target description and measured FMA peak (tune/machine.py), kept once per machine."""
    from shapeshift.target import host_target
    from shapeshift.tune.machine import peak_gflops, this_machine

    here = this_machine()
    assert here["node"] == "local" and here["target_key"] == host_target().key and peak_gflops(here) > 1.0
    other = {**here, "node": "0123abcd", "fma": None}
    with Database(tmp_path / "t.db") as db:
        wid, cid = db.workload_id(WORKLOAD), db.candidate_id(SMALL)
        db.add_measurements(wid, cid, 1, {1: 1e-6, 2: 2e-6}, machine=here)
        db.add_measurements(wid, cid, 1, {4: 3e-6}, machine=other)
        db.add_measurements(wid, cid, 1, {8: 4e-6})  # a caller that does not say
        assert db.machines(wid) == [(here, 2), (other, 1)]
        assert db.conn.execute("SELECT COUNT(*) FROM machines").fetchone() == (2,)


def test_a_database_from_before_is_migrated_and_resumed_from(tmp_path):
    """Opened for tuning, a database of the old layout is migrated in place (ids kept); its
    measurements, of an unknown CPU, are used as this machine's, and the tuner says so;
    its selection still reaches the native backend."""
    path = tmp_path / "old.db"
    _old_database(path)
    # Read-only first: the records load from the old layout as they are, nothing migrated.
    with pytest.warns(UserWarning, match="1 selection\\(s\\) recorded before"):
        tuning = GemmTuning.from_db(path, 1)
    assert tuning.get(64, 96).kernels == (SMALL,)
    assert "k" in {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(workloads)")}

    logs = []
    with Database(path) as db:
        assert [row[1] for row in db.conn.execute("PRAGMA table_info(workloads)")] == ["id", "hash", "key", "family"]
        assert "machine" in {row[1] for row in db.conn.execute("PRAGMA table_info(measurements)")}
        assert db.workload_id(WORKLOAD) == 7
        assert db.schedule(3) == SMALL and db.schedule(4) == OTHER
        tuner = Tuner(WORKLOAD, db, tmp_path / "cache", TuneConfig(trials=1), log=logs.append)
        assert tuner.times == {3: {1: 1e-6, 32: 4e-6}, 4: {1: 2e-6, 32: 3e-6}}
        assert any("4 measurement(s) stored before measurements named their CPU" in line for line in logs)
        # Measured again here, a pair is recorded for this CPU beside the unknown one, and wins.
        db.add_measurements(7, 3, 1, {1: 7e-6})
        assert Tuner(WORKLOAD, db, tmp_path / "cache", TuneConfig(trials=1), log=logs.append).times[3][1] == 7e-6
    with pytest.warns(UserWarning, match="1 selection\\(s\\) recorded before"):
        assert GemmTuning.from_db(path, 1).get(64, 96).kernels == (SMALL,)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT COUNT(*) FROM measurements").fetchone() == (5,)
