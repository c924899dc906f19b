"""Tuned records in the native backend: `shapeshift tune MODEL`, `InferenceSession(...,
tuning_db=)`, `compile --db` and the errors around them.

The records are written straight into a database (no measuring) where the test is about
using them: three kernels of two packed-B layouts and a tree that routes M = 1..9, 10..33
and 34.. to different kernels, so every dispatch path and a shared packed copy run.
Outputs are compared with onnxruntime at several values of each dynamic dim.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift import InferenceSession, ShapeshiftError
from shapeshift.cli.main import main
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.tune import dispatch, space
from shapeshift.tune.database import Database
from shapeshift.tune.extract import model_tasks
from shapeshift.tune.records import GemmTuning
from shapeshift.tune.workload import GemmWorkload

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

RANGES = {"B": (1, 4), "T": (1, 64)}
SHAPES = [(1, 1), (1, 5), (2, 9), (1, 10), (1, 17), (3, 40), (4, 64)]  # M = B*T crosses every split
# Kernels 0 and 1 share a packed layout (nr, kc); kernel 2 has its own.
KERNELS = [GemmSchedule(), GemmSchedule(mr=4, mc=64, small_m=2),
           GemmSchedule(mr=2, nr=32, mc=8, nc=64, small_m=0, small_nc=64, kc=48)]
TREE = {"le": 9, "left": {"leaf": 1}, "right": {"le": 33, "left": {"leaf": 2}, "right": {"leaf": 0}}}


def _model(path) -> str:
    """x[B,T,64] -> MatMul [64,96] + bias -> Relu -> reshape to [B*T,96] -> Gemm with a
    transposed [48,96] weight (-> [B*T,48])."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((48, 96)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([-1, 96], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "b1"], ["h2"]), helper.make_node("Relu", ["h2"], ["h3"]),
             helper.make_node("Reshape", ["h3", "shape"], ["h4"]),
             helper.make_node("Gemm", ["h4", "w2"], ["y"], transB=1, name="head")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = str(path / "tiny.onnx")
    onnx.save(model, out)
    return out


def _records(path, threads: int = 1, shapes=((64, 96), (96, 48))) -> str:
    out = str(path / "records.db")
    with Database(out) as db:
        for k, n in shapes:
            wid = db.workload_id(GemmWorkload(k, n, 1, 256))
            db.add_selection(wid, 1, 256, threads, "dietcode",
                             [{"candidate": i, "schedule": space.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = tmp_path_factory.mktemp("tuned")
    return _model(path), _records(path), path


def _check(session, model_path) -> None:
    ref = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b, t in SHAPES:
        x = rng.standard_normal((b, t, 64)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4,
                                   atol=1e-3, err_msg=f"B={b} T={t}")


def test_extracts_one_task_per_weight_shape(files):
    model, _, _ = files
    tasks = model_tasks(model, RANGES)
    assert [(t.k, t.n, t.lo, t.hi, t.calls) for t in tasks] == [(64, 96, 1, 256, 1), (96, 48, 1, 256, 1)]
    assert tasks[0].symbols == {"B", "T"}


def test_task_weights_come_from_a_histogram_of_one_dim(files):
    model, _, _ = files
    task = model_tasks(model, {"B": (2, 2), "T": (1, 64)})[0]
    # M = B x T with B declared as 2: T = 3 gives M = 6; T = 70 (M = 140) is past the range.
    assert (task.lo, task.hi) == (2, 128)
    assert task.weighted_ms("T", {3: 5.0, 70: 1.0}, {"B": 2}) == {6: 5.0}
    assert task.weighted_ms("T", {3: 5.0}) == {}  # M depends on B too


def test_session_runs_the_tuned_dispatchers(files):
    model, db, _ = files
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    program = session._executor.program
    assert {p.prefix for p in program.packs} == {"ss_tuned_64x96_", "ss_tuned_96x48_"}
    assert "ss_tuned_64x96_prepacked(" in program.source and "ss_tuned_96x48_prepacked(" in program.source
    _check(session, model)


def test_dispatcher_packs_one_copy_per_layout(tmp_path):
    from shapeshift.codegen.build import compile_library
    from shapeshift.codegen.kernels.prelude import PRELUDE

    source = PRELUDE + dispatch.tuned_gemm_c(KERNELS, TREE, "t_")
    lib = compile_library(source, name_hint="tuned_layouts", cache_dir=tmp_path).cdll
    lib.t_packed_b_size.restype = lib.t_choice.restype = None
    import ctypes

    lib.t_packed_b_size.restype = ctypes.c_int64
    size = lib.t_packed_b_size(ctypes.c_int64(70), ctypes.c_int64(50))
    # Kernels 0 and 1 read one copy (nr 16); kernel 2 its own (nr 32).
    assert size == 70 * 64 + 70 * 64
    lib.t_choice.restype = ctypes.c_int
    assert [lib.t_choice(ctypes.c_int64(m)) for m in (1, 9, 10, 33, 34, 500)] == [1, 1, 2, 2, 0, 0]


def test_records_of_another_thread_count_are_not_used(files):
    model, db, _ = files
    with pytest.warns(UserWarning, match="holds selections for 1 thread\\(s\\), none for 2: its records are not used"):
        session = InferenceSession(model, RANGES, backend="native", num_threads=2, tuning_db=db)
    assert {p.prefix for p in session._executor.program.packs} == {"ss_gemm_"}
    _check(session, model)


def test_a_weight_shape_without_records_keeps_the_default(files, tmp_path):
    model, _, _ = files
    db = _records(tmp_path, shapes=((96, 48),))
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    assert sorted(p.prefix for p in session._executor.program.packs) == ["ss_gemm_", "ss_tuned_96x48_"]
    _check(session, model)


def test_artifact_carries_the_records(files, tmp_path):
    model, db, _ = files
    out = tmp_path / "tiny.ssa"
    artifact = shapeshift.compile(model, out, RANGES, tuning_db=db, threads=1)
    assert sorted((t["k"], t["n"]) for t in artifact.header["tuning"]) == [(64, 96), (96, 48)]
    session = InferenceSession(str(out), num_threads=1)
    assert "ss_tuned_64x96_prepacked(" in session._executor.program.source
    _check(session, model)
    with pytest.raises(ShapeshiftError, match="carries the tuning records"):
        InferenceSession(str(out), tuning_db=db)


def test_records_round_trip_as_json(files):
    _, db, _ = files
    tuning = GemmTuning.from_db(db, 1)
    again = GemmTuning.from_json(tuning.to_json())
    assert [(t.k, t.n, t.kernels, t.tree) for t in again] == [(t.k, t.n, t.kernels, t.tree) for t in tuning]
    assert again.get(64, 96).kernels == tuple(KERNELS) and again.get(1, 1) is None


def test_missing_and_corrupt_databases_are_clear_errors(files, tmp_path):
    model, _, _ = files
    with pytest.raises(ShapeshiftError, match="nope.db does not exist"):
        InferenceSession(model, RANGES, backend="native", tuning_db=tmp_path / "nope.db")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not an SQLite file" * 100)
    with pytest.raises(ShapeshiftError, match="bad.db cannot be read"):
        InferenceSession(model, RANGES, backend="native", tuning_db=bad)
    with pytest.raises(ShapeshiftError, match="native backend only"):
        InferenceSession(model, RANGES, backend="reference", tuning_db=bad)


def test_cli_compile_db_errors_without_traceback(files, tmp_path, capsys):
    model, _, _ = files
    out = tmp_path / "x.ssa"
    assert main(["compile", model, "-o", str(out), "--dynamic", "B=1:4", "--dynamic", "T=1:64",
                 "--db", str(tmp_path / "missing.db")]) != 0
    err = capsys.readouterr().err
    assert "missing.db does not exist" in err and "Traceback" not in err
    assert not out.exists()


def test_cli_tune_model_then_session(files, tmp_path, capsys):
    """The whole path on a real (tiny) tuning run: tune the model's two weight shapes, then
    a session built with the database runs their dispatchers and matches onnxruntime."""
    model, _, _ = files
    db = tmp_path / "tuned.db"
    assert main(["tune", model, "--dynamic", "B=1:4", "--dynamic", "T=1:64", "--trials", "2", "--db", str(db),
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 task(s)" in out and "[64, 96]" in out and "[96, 48]" in out and "summary: 2 task(s)" in out
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    assert {p.prefix for p in session._executor.program.packs} == {"ss_tuned_64x96_", "ss_tuned_96x48_"}
    _check(session, model)


def test_cli_tune_model_needs_declared_ranges(files, tmp_path, capsys):
    model, _, _ = files
    assert main(["tune", model, "--db", str(tmp_path / "t.db"), "--trials", "1"]) != 0
    err = capsys.readouterr().err
    assert "declare the range of B, T" in err and "Traceback" not in err


def test_cli_tune_needs_model_or_gemm(tmp_path, capsys):
    assert main(["tune", "--dynamic", "M=1:8", "--db", str(tmp_path / "t.db")]) != 0
    assert "give either a MODEL or --gemm K N" in capsys.readouterr().err


def test_records_tuned_on_another_cpu_are_refused_with_a_warning(files, tmp_path):
    """A selection records the CPU it was tuned on; a session applies only this machine's:
    one tuned on another CPU model (the Zen 4 sample's description) is not used, and a
    warning names both CPUs. A selection from before the column existed (NULL: an old
    database, migrated when a tuner opens it) is used as it is, with a warning."""
    import sqlite3

    from .sample_targets import sample_target

    model, _, _ = files
    zen4 = sample_target("zen4")
    out = str(tmp_path / "zen4.db")
    with Database(out) as db:
        for k, n in ((64, 96), (96, 48)):
            wid = db.workload_id(GemmWorkload(k, n, 1, 256))
            db.add_selection(wid, 1, 256, 1, "dietcode",
                             [{"candidate": i, "schedule": space.to_json(s)} for i, s in enumerate(KERNELS)], TREE,
                             target=zen4)
    with pytest.warns(UserWarning, match="tuned on another CPU are not used: AMD EPYC 9R14.*this machine is"):
        session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=out)
    assert {p.prefix for p in session._executor.program.packs} == {"ss_gemm_"}
    _check(session, model)

    # An old database: no target column. Opening it for tuning adds the column (old rows NULL).
    old = str(tmp_path / "old.db")
    _records(tmp_path)  # records.db, made with this machine's target
    conn = sqlite3.connect(str(tmp_path / "records.db"))
    conn.execute("CREATE TABLE legacy AS SELECT id, workload_id, lo, hi, threads, strategy, kernels, tree, created "
                 "FROM selections")
    conn.close()
    src = sqlite3.connect(str(tmp_path / "records.db"))
    dst = sqlite3.connect(old)
    src.backup(dst)
    src.close()
    dst.execute("DROP TABLE selections")
    dst.execute("ALTER TABLE legacy RENAME TO selections")
    dst.commit()
    dst.close()
    with pytest.warns(UserWarning, match="2 selection\\(s\\) recorded before tuning records named their CPU"):
        session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=old)
    assert sorted(p.prefix for p in session._executor.program.packs) == ["ss_tuned_64x96_", "ss_tuned_96x48_"]
    with Database(old) as db:
        assert "target" in [row[1] for row in db.conn.execute("PRAGMA table_info(selections)")]
