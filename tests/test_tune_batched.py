"""Batched GEMMs in the tuner: attention's Q K^T and P V, no constant operand, sized by T.

A two-head attention block ([T, 32] -> heads of 16 through Reshape and Transpose) is the
model: the native lowering reads its heads through strides, so the batched workloads carry
those strides. It also returns its attention probabilities (as a model exported with
output_attentions does), so its two MatMuls stay batched GEMMs: an attention whose
probabilities nobody else reads is one fused kernel instead (codegen/lower/attention_fusion.py),
with no batched GEMM call to tune. Records are written straight into a database where the test is about using
them (three kernels, a tree with splits at T = 9 and 33), and tuned for real (tiny budgets)
where it is about tuning. Outputs are compared with onnxruntime or NumPy at several T.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift import InferenceSession
from shapeshift.cli.main import main
from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import gemm
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.symbolic import mul, symbol
from shapeshift.tune import dispatch, space
from shapeshift.tune.builder import build_one
from shapeshift.tune.database import Database
from shapeshift.tune.extract import BatchedTask, model_tasks
from shapeshift.tune.records import GemmTuning
from shapeshift.tune.runner import RunnerConfig, measure
from shapeshift.tune.search import TuneConfig, Tuner
from shapeshift.tune.workload import BatchedGemmWorkload, batched_workload, fit_poly

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

HEADS, HEAD_DIM = 2, 16
RANGES = {"T": (1, 48)}
TS = [1, 2, 9, 10, 33, 34, 48]  # both ends and both sides of every split of TREE
KERNELS = [GemmSchedule(), GemmSchedule(mr=4, nr=8, mc=64, small_m=2, pack_rows=16),
           GemmSchedule(mr=2, nr=32, mc=8, nc=64, small_m=0, small_nc=64, kc=48)]
TREE = {"le": 9, "left": {"leaf": 1}, "right": {"le": 33, "left": {"leaf": 2}, "right": {"leaf": 0}}}
FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=30)
SMALL = GemmSchedule(mr=4, nr=8, kc=32, mc=8, nc=32, unroll_k=2, small_m=2, small_nc=16)

# Q K^T of the model below, as the lowering emits it: A = q[t, h, d], B(k, n) = k[n, h, k].
QK = BatchedGemmWorkload(HEADS, (0, 1, 0), (0, 1, 0), (HEAD_DIM, 0, 0),
                         ((HEAD_DIM, 0, 0), (HEADS * HEAD_DIM, 0, 0), (1, 0, 0)),
                         ((HEAD_DIM, 0, 0), (1, 0, 0), (HEADS * HEAD_DIM, 0, 0)), ((0, 0, 1), (0, 1, 0)), 1, 48)


def _model(path) -> str:
    """q, k, v [T, 32] -> per head softmax(q k^T / 4) v -> [T, 32]."""
    shape = numpy_helper.from_array(np.array([-1, HEADS, HEAD_DIM], np.int64), "heads")
    flat = numpy_helper.from_array(np.array([-1, HEADS * HEAD_DIM], np.int64), "flat")
    scale = numpy_helper.from_array(np.array(0.25, np.float32), "scale")
    nodes = [helper.make_node("Reshape", [x, "heads"], [f"{x}3"]) for x in "qkv"]
    nodes += [helper.make_node("Transpose", ["q3"], ["qh"], perm=[1, 0, 2]),
              helper.make_node("Transpose", ["k3"], ["kt"], perm=[1, 2, 0]),
              helper.make_node("Transpose", ["v3"], ["vh"], perm=[1, 0, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s"], name="scores"),
              helper.make_node("Mul", ["s", "scale"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["o"], name="context"),
              helper.make_node("Transpose", ["o"], ["o2"], perm=[1, 0, 2]),
              helper.make_node("Reshape", ["o2", "flat"], ["y"])]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["T", HEADS * HEAD_DIM]) for x in "qkv"]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "p")]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, [shape, flat, scale])
    out = str(path / "attention.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def _records(path, model: str, threads: int = 1) -> str:
    out = str(path / "records.db")
    with Database(out) as db:
        for task in model_tasks(model, RANGES):
            wid = db.workload_id(task.workload())
            db.add_selection(wid, 1, 48, threads, "dietcode",
                             [{"candidate": i, "schedule": space.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = tmp_path_factory.mktemp("batched")
    model = _model(path)
    return model, _records(path, model), path


def _check(session, model_path) -> None:
    ref = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for t in TS:
        feed = {x: rng.standard_normal((t, HEADS * HEAD_DIM)).astype(np.float32) for x in "qkv"}
        np.testing.assert_allclose(session.run(None, feed)[0], ref.run(None, feed)[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"T={t}")


# ---- workloads --------------------------------------------------------------------------

def test_fit_poly_recovers_quadratics_and_refuses_the_rest():
    assert fit_poly(lambda t: 3 * t * t - 2 * t + 7) == (7, -2, 3)
    assert fit_poly(lambda t: 64) == (64, 0, 0)
    assert fit_poly(lambda t: t ** 3) is None
    assert fit_poly(lambda t: t // 2) is None


def test_model_tasks_find_both_attention_matmuls(files):
    model, _, _ = files
    tasks = model_tasks(model, RANGES)
    assert all(isinstance(t, BatchedTask) for t in tasks)
    assert sorted(t.label for t in tasks) == ["2 x [T, 16] x [16, T]", "2 x [T, T] x [T, 16]"]
    assert {(t.lo, t.hi, t.calls) for t in tasks} == {(1, 48, 1)}
    qk = next(t for t in tasks if t.label == "2 x [T, 16] x [16, T]")
    assert qk.workload() == QK
    pv = next(t for t in tasks if t != qk).workload()
    # P [H, T, T] contiguous: batch stride T^2, row stride T; V and the output through strides.
    assert pv.a == ((0, 0, 1), (0, 1, 0), (1, 0, 0)) and pv.c == ((HEAD_DIM, 0, 0), (HEADS * HEAD_DIM, 0, 0))
    assert qk.weighted_ms("T", {5: 2.0, 99: 1.0}) == {5: 2.0} and qk.weighted_ms("B", {5: 1.0}) == {}


def test_batched_workload_accepts_one_dynamic_dim_only():
    t, b = symbol("T", 1, 64), symbol("B", 1, 4)
    one = symbol("one", 1, 1)  # declared with one value: a constant
    args = dict(m=t, n=t, k=16, a_strides=[16, 32, 1], b_strides=[16, 1, 32], c_strides=[mul(t, t), t])
    assert batched_workload(batch=[2], **args).key == QK.key
    assert batched_workload(batch=[one, 2], **{**args, "a_strides": [mul(32, t), 16, 32, 1],
                                               "b_strides": [7, 16, 1, 32], "c_strides": [0, mul(t, t), t]}).key \
        == QK.key
    assert batched_workload(batch=[b], **args) is None  # a dynamic batch
    assert batched_workload(batch=[2], **{**args, "k": b}) is None  # two dynamic dims
    assert batched_workload(batch=[2], **{**args, "m": mul(2, t), "n": mul(2, t)}) is None  # none of M, N, K is T
    assert batched_workload(batch=[2], **{**args, "m": 5, "n": 5, "c_strides": [25, 5]}) is None  # static


def test_workload_key_round_trips_and_checks_its_range():
    assert BatchedGemmWorkload.from_key(QK.key, 1, 48) == QK
    with pytest.raises(ValueError, match="one of M, N, K must be T"):
        BatchedGemmWorkload(2, (0, 2, 0), (0, 2, 0), (16, 0, 0), QK.a, QK.b, QK.c, 1, 8)
    with pytest.raises(ValueError, match="malformed"):
        BatchedGemmWorkload.from_key("bmm:2:1,2,3", 1, 8)


# ---- measuring and tuning ---------------------------------------------------------------

def _doubled(schedule: GemmSchedule) -> str:
    """Computes 2 * A x B: a wrong result."""
    return gemm.source(schedule).replace("C, sc0, sc1, ldc, alpha,", "C, sc0, sc1, ldc, 2.0f * alpha,")


def test_cost_model_predicts_the_padding_between_aligned_samples():
    """Trained only at T = multiples of 8 (no padding), the model still predicts the drop
    just past them (N = T padded to a whole vector), which the regressor alone could not."""
    pytest.importorskip("sklearn")
    import math

    from shapeshift.tune.cost_model import CostModel
    from shapeshift.tune.gemm_family import work_ratio

    schedules = [GemmSchedule(), SMALL, GemmSchedule(mr=4, nr=24, mc=48, nc=96, small_nc=96)]
    # A made-up rate per schedule, the useful fraction of the work done at each T.
    rows = [(s, t) for s in schedules for t in range(8, 49, 8)]
    y = [math.log(10 + s.mr) - math.log(work_ratio(s, t, t)) for s, t in rows]
    model = CostModel(QK, 1)
    model.fit(rows, y)
    for s in schedules:
        at = dict(zip((16, 17, 24), model.predict([(s, 16), (s, 17), (s, 24)])))
        assert work_ratio(s, 17, 17) == pytest.approx(24 / 17)
        assert at[17] < min(at[16], at[24]) - 0.2


def test_runner_measures_a_batched_candidate_and_catches_a_wrong_one(tmp_path):
    result = measure(build_one(SMALL, tmp_path), QK, [1, 5, 17], FAST)
    assert result.error is None and set(result.seconds) == {1, 5, 17}
    assert all(s > 0 for s in result.seconds.values())
    wrong = measure(build_one(SMALL, tmp_path, _doubled), QK, [5], FAST)
    assert wrong.error is not None and "wrong result at T=5" in wrong.error


def _library(kernels, tree, t_arg, tmp_path):
    lib = compile_library(dispatch.batched_library_source(kernels, tree, t_arg), name_hint="bmm_tuned",
                          cache_dir=tmp_path).cdll
    dispatch.load_batched(lib).ss_set_num_threads(1)
    return lib


def _run(lib, w: BatchedGemmWorkload, t: int, rng) -> None:
    m, k, n, batch = w.shape(t)
    st = w.strides(t)
    a = rng.standard_normal(1 + (batch - 1) * st["a"][0] + (m - 1) * st["a"][1] + (k - 1) * st["a"][2])
    b = rng.standard_normal(1 + (batch - 1) * st["b"][0] + (k - 1) * st["b"][1] + (n - 1) * st["b"][2])
    a, b = a.astype(np.float32), b.astype(np.float32)
    c = np.full(1 + (batch - 1) * st["c"][0] + (m - 1) * st["c"][1] + n - 1, np.nan, np.float32)
    lib.ss_bmm_tuned_bench(1, m, n, k, batch, a.ctypes.data, *st["a"], b.ctypes.data, *st["b"], c.ctypes.data,
                           *st["c"])
    view = np.lib.stride_tricks.as_strided
    av = view(a, (batch, m, k), [4 * s for s in st["a"]]).astype(np.float64)
    bv = view(b, (batch, k, n), [4 * s for s in st["b"]]).astype(np.float64)
    cv = view(c, (batch, m, n), [4 * s for s in (*st["c"], 1)])
    np.testing.assert_allclose(cv, av @ bv, rtol=1e-4, atol=1e-4, err_msg=f"T={t}")


def test_dispatcher_runs_every_t_of_the_range(tmp_path):
    """Every T in [1, 48] reaches a kernel of the tree, and each computes the right product."""
    lib = _library(KERNELS, TREE, "M", tmp_path)
    assert [lib.ss_bmm_tuned_choice(t) for t in (1, 9, 10, 33, 34, 48)] == [1, 1, 2, 2, 0, 0]
    rng = np.random.default_rng(0)
    for t in range(1, 49):
        _run(lib, QK, t, rng)


def test_tuner_tunes_a_batched_workload(tmp_path):
    """A real (tiny) dietcode run over T in [1, 24]: kernels chosen, tree covers the range,
    and the dispatcher library computes every T correctly."""
    w = BatchedGemmWorkload(QK.batch, QK.m, QK.n, QK.k, QK.a, QK.b, QK.c, 1, 24)
    with Database(tmp_path / "t.db") as db:
        result = Tuner(w, db, tmp_path / "cache", TuneConfig(trials=4, samples=4, batch=2, runner=FAST),
                       log=lambda line: None).run()
    assert result.sampled_ms == [1, 9, 16, 24] and set(result.seconds) == set(result.sampled_ms)
    assert 1 <= len(result.kernels) <= 8 and all(s > 0 for s in result.seconds.values())
    lib = _library(result.kernels, result.tree, w.t_arg, tmp_path)
    rng = np.random.default_rng(2)
    for t in range(1, 25):
        _run(lib, w, t, rng)


# ---- records in the native backend ------------------------------------------------------

def test_session_runs_the_tuned_batched_dispatchers(files):
    model, db, _ = files
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    program = session._executor.program
    names = {t.name for t in GemmTuning.from_db(db, 1)}
    assert len(names) == 2 and names <= program.tuned_names()
    assert all(f"{name}gemm(" in program.source for name in names)
    _check(session, model)


def test_batched_records_of_another_thread_count_are_not_used(files):
    model, db, _ = files
    with pytest.warns(UserWarning, match="holds selections for 1 thread\\(s\\), none for 2: its records are not used"):
        session = InferenceSession(model, RANGES, backend="native", num_threads=2, tuning_db=db)
    assert "ss_tuned_bmm_" not in session._executor.program.source
    _check(session, model)


def test_batched_records_round_trip_and_travel_in_artifacts(files, tmp_path):
    model, db, _ = files
    tuning = GemmTuning.from_db(db, 1)
    again = GemmTuning.from_json(tuning.to_json())
    assert [(t.key, t.kernels, t.tree) for t in again] == [(t.key, t.kernels, t.tree) for t in tuning]
    assert again.get_batched(QK.key).kernels == tuple(KERNELS)
    out = tmp_path / "attention.ssa"
    artifact = shapeshift.compile(model, out, RANGES, tuning_db=db, threads=1)
    assert sorted(t["key"] for t in artifact.header["tuning"]) == sorted(t.key for t in tuning)
    session = InferenceSession(str(out), num_threads=1)
    assert "ss_tuned_bmm_" in session._executor.program.source
    _check(session, model)


def test_cli_tune_model_tunes_the_attention_matmuls(files, tmp_path, capsys):
    model, _, _ = files
    db = tmp_path / "tuned.db"
    assert main(["tune", model, "--dynamic", "T=1:48", "--trials", "2", "--db", str(db), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 task(s)" in out and "2 x [T, 16] x [16, T]" in out and "2 x [T, T] x [T, 16]" in out
    session = InferenceSession(model, RANGES, backend="native", num_threads=1, tuning_db=db)
    assert sum(name.startswith("ss_tuned_bmm_") for name in session._executor.program.tuned_names()) == 2
    _check(session, model)
