"""A model's dense GEMMs tuned as one group (tune/gemm_group.py): the task, the worker's
measurement of its instances, the tree on (M, N, K), the dispatcher built from it (every
instance and shapes between them computed right), the records and the CLI's --group.

Outputs are checked against float64 NumPy (the dispatcher alone) and onnxruntime (a
session built with the records).
"""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift import InferenceSession
from shapeshift.cli.main import main
from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import gemm
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.tune import dispatch, space
from shapeshift.tune.database import Database
from shapeshift.tune.extract import ModelTask, group_task, model_tasks
from shapeshift.tune.gemm_group import DIMS, GemmGroupWorkload
from shapeshift.tune.records import GemmTuning, TunedGemmGroup
from shapeshift.tune.runner import RunnerConfig, measure
from shapeshift.tune.builder import build_one

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=30)
# Three kernels of one packed-B layout (nr 16, kc 256): one packed copy per weight.
KERNELS = (GemmSchedule(), GemmSchedule(mr=4, mc=64, small_m=2), GemmSchedule(mr=2, mc=16, small_m=0))
# K <= 64 -> kernel 1; else M <= 20 -> kernel 2; else kernel 0.
TREE = {"var": "K", "le": 64, "left": {"leaf": 1},
        "right": {"var": "M", "le": 20, "left": {"leaf": 2}, "right": {"leaf": 0}}}
INSTANCES = ((48, 64, 96), (48, 96, 48), (5, 100, 33))


def _model(path, batch: int = 2) -> str:
    """x[batch, 24, 64] -> MatMul [64, 96] -> Relu -> MatMul [96, 48] -> reshape to
    [batch * 24, 48] -> Gemm with a transposed [200, 48] weight: three weight shapes."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((96, 48)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((200, 48)).astype(np.float32), "w3"),
             numpy_helper.from_array(np.array([-1, 48], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w2"], ["h2"]), helper.make_node("Reshape", ["h2", "shape"], ["h3"]),
             helper.make_node("Gemm", ["h3", "w3"], ["y"], transB=1)]
    dims = [batch if batch else "B", 24, 64]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    out = str(path / f"group_{batch}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def _check(session, model_path, batches=(2,)) -> None:
    ref = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b in batches:
        x = rng.standard_normal((b, 24, 64)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4,
                                   atol=1e-3, err_msg=f"batch {b}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("group_cache")


# ---- the task --------------------------------------------------------------------------

def test_group_workload_round_trips_and_checks_its_instances():
    w = GemmGroupWorkload.of([(48, 96, 48), (48, 64, 96), (48, 64, 96)])
    assert w.instances == ((48, 64, 96), (48, 96, 48)) and (w.lo, w.hi) == (1, 2)
    assert GemmGroupWorkload.from_key(w.key) == w and w.hash != GemmGroupWorkload.of(w.instances, cold=True).hash
    assert w.shape(2) == (48, 96, 48, 1) and w.point(1) == {"M": 48, "N": 96, "K": 64}
    assert w.flops(1) == 2 * 48 * 64 * 96 and w.range_flops() == w.flops(1) + w.flops(2)
    assert w.weights() == {(64, 96), (96, 48)} and w.sampled_ms() == [1, 2]
    assert w.request()["shapes"] == {"1": [48, 64, 96], "2": [48, 96, 48]}
    for bad in ((), ((0, 4, 4),)):
        with pytest.raises(ValueError):
            GemmGroupWorkload.of(bad)
    with pytest.raises(ValueError):
        GemmGroupWorkload(((4, 4, 4), (2, 2, 2)))  # not sorted
    with pytest.raises(ValueError, match="not a GEMM group"):
        GemmGroupWorkload.from_key("gemm-prepacked:4:4")


def test_worker_measures_each_instance_at_its_own_shape(cache):
    """The measurement of a group computes every instance's own product (checked against
    NumPy in the worker) cold and warm; a wrong kernel fails naming the instance."""
    w = GemmGroupWorkload.of(INSTANCES)
    built = build_one(GemmSchedule(mr=4, nr=16, kc=64, mc=16, nc=64, small_m=2), cache)
    for cold in (0, 8 << 20):
        result = measure(built, w, [1, 2, 3], RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=30,
                                                           cold_bytes=cold))
        assert result.error is None and sorted(result.seconds) == [1, 2, 3]
    doubled = build_one(GemmSchedule(), cache, lambda s: gemm.source(s).replace(
        "C, sc0, sc1, ldc, alpha,", "C, sc0, sc1, ldc, 2.0f * alpha,"))
    result = measure(doubled, w, [2], FAST)
    assert result.error and "(M, K, N) = (48, 64, 96), instance=2" in result.error  # sorted: (5, 100, 33) first


# ---- the tree and the dispatcher -------------------------------------------------------

def test_tree_splits_on_the_dims_that_decide():
    """Labels that depend on K alone give a tree that tests K; choose and the C agree."""
    points = [(m, n, k) for m in (1, 7, 48) for n in (33, 96) for k in (16, 64, 200)]
    labels = [0 if k <= 64 else 1 for _, _, k in points]
    tree = dispatch.fit_tree(points, labels, max_leaves=4, names=DIMS)
    assert tree["var"] == "K" and 64 <= tree["le"] < 200
    for (m, n, k), label in zip(points, labels):
        assert dispatch.choose(tree, {"M": m, "N": n, "K": k}) == label
    assert "if (K <= " in dispatch.tree_c(tree)
    # One variable: the trees stay as they were (no "var").
    assert "var" not in str(dispatch.fit_tree([1, 2, 30, 40], [0, 0, 1, 1], max_leaves=4))


def _group_library(tmp_path):
    name = "ss_grp_"
    source = PRELUDE + dispatch.tuned_gemm_c(KERNELS, TREE, name, tree_args=DIMS)
    lib = compile_library(source, name_hint="group_dispatch", cache_dir=tmp_path).cdll
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ss_grp_choice.argtypes = [i64] * 3
    lib.ss_grp_packed_b_size.argtypes = [i64, i64]
    lib.ss_grp_packed_b_size.restype = i64
    lib.ss_grp_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_grp_prepacked.argtypes = ([i64] * 5 + [ptr, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, ctypes.c_float,
                                                  ptr, ctypes.c_float, i64, i64, ctypes.c_int])
    return lib


@pytest.mark.parametrize("shape", [*INSTANCES, (1, 64, 96), (21, 65, 7), (20, 65, 7), (300, 96, 48), (3, 3, 130)],
                         ids=lambda s: "x".join(map(str, s)))
def test_group_dispatcher_computes_instances_and_shapes_between(tmp_path, shape):
    """The dispatcher of a group picks the tree's kernel by (M, N, K) and computes A x B at
    the instances and at shapes none was tuned at (ragged, on both sides of each split)."""
    lib = _group_library(tmp_path)
    m, k, n = shape
    assert lib.ss_grp_choice(m, n, k) == dispatch.choose(TREE, {"M": m, "N": n, "K": k})
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = np.empty(lib.ss_grp_packed_b_size(k, n), dtype=np.float32)
    lib.ss_grp_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
    c = np.full((m, n), np.nan, dtype=np.float32)
    lib.ss_grp_prepacked(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data, c.ctypes.data, 0, 0, n,
                         1.0, None, 0.0, 0, 0, 0)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# ---- records, the session, the CLI -----------------------------------------------------

def _group_records(path, model_path, threads: int = 1) -> str:
    """The hand-made selection above for the model's own instances, straight into a database."""
    task = group_task([t for t in model_tasks(model_path) if isinstance(t, ModelTask)])
    out = str(path / "group.db")
    with Database(out) as db:
        wid = db.workload_id(task.workload())
        db.add_selection(wid, 1, task.hi, threads, "dietcode",
                         [{"candidate": i, "schedule": space.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    return out


def test_one_dispatcher_serves_every_weight_of_the_group(tmp_path):
    model = _model(tmp_path)
    db = _group_records(tmp_path, model)
    tuning = GemmTuning.from_db(db, 1)
    (record,) = list(tuning)
    assert isinstance(record, TunedGemmGroup) and tuning.get(64, 96) is tuning.get(48, 200) is record
    assert tuning.get(64, 64) is None
    assert GemmTuning.from_json(tuning.to_json()).get(96, 48).key == record.key
    session = InferenceSession(model, backend="native", num_threads=1, tuning_db=db)
    assert {p.prefix for p in session._executor.program.packs} == {record.name}
    _check(session, model)


def test_cli_groups_a_static_model_by_default_and_the_session_matches(tmp_path, capsys):
    """A real (tiny) tuning run of a static model: one group task, its records used by a session."""
    model = _model(tmp_path)
    db = tmp_path / "tuned.db"
    assert main(["tune", model, "--trials", "2", "--db", str(db), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 task(s)" in out and "group: 3 weight shape(s), 3 instance(s)" in out
    session = InferenceSession(model, backend="native", num_threads=1, tuning_db=db)
    (prefix,) = {p.prefix for p in session._executor.program.packs}
    assert prefix.startswith("ss_tuned_group_")
    _check(session, model)


def test_cli_no_group_tunes_each_weight_shape(tmp_path, capsys):
    model = _model(tmp_path)
    assert main(["tune", model, "--no-group", "--trials", "1", "--db", str(tmp_path / "t.db")]) == 0
    assert "3 task(s)" in capsys.readouterr().out


def test_cli_group_of_a_dynamic_model_samples_each_weights_rows(tmp_path, capsys):
    """--group with a dynamic batch: instances at sampled M per weight shape; the session's
    dispatcher then serves batches between them."""
    model = _model(tmp_path, batch=0)
    db = tmp_path / "dyn.db"
    assert main(["tune", model, "--group", "--dynamic", "B=1:4", "--trials", "2", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "group: 3 weight shape(s), 12 instance(s)" in out  # B = 1..4: M = 24, 48, 72, 96 per weight
    session = InferenceSession(model, {"B": (1, 4)}, backend="native", num_threads=1, tuning_db=db)
    _check(session, model, batches=(1, 3, 4))


def test_cli_group_refuses_shape_weights(tmp_path, capsys):
    model = _model(tmp_path, batch=0)
    weights = tmp_path / "w.txt"
    weights.write_text("2 1\n")
    assert main(["tune", model, "--group", "--dynamic", "B=1:4", "--shape-weights", f"B={weights}",
                 "--db", str(tmp_path / "t.db")]) == 2
    err = capsys.readouterr().err
    assert "--no-group" in err and "Traceback" not in err


def test_pad_max_of_a_group_tunes_at_its_instance_of_most_work(tmp_path, cache):
    """pad-max's one shape for an unordered task is its instance of most FLOPs (its largest
    value is only the last instance in the key's order), and one kernel serves them all."""
    from shapeshift.tune.search import TuneConfig, Tuner

    w = GemmGroupWorkload.of([(64, 96, 48), (5, 100, 33), (100, 4, 4)])
    heaviest = max(range(1, w.hi + 1), key=w.flops)
    assert heaviest != w.hi
    with Database(tmp_path / "t.db") as db:
        tuner = Tuner(w, db, cache, TuneConfig(strategy="pad-max", trials=2, batch=2, runner=FAST), log=lambda s: None)
        result = tuner.run()
    assert len(result.kernels) == 1 and sorted(result.seconds) == [1, 2, 3]
    assert tuner.tried and all(heaviest in ms for ms in tuner.tried.values())  # every candidate searched there
