"""Step timers of the native backend (``InferenceSession(..., profile=True)``, runtime/profile.py).

A profiled session must compute exactly what an unprofiled one does, count every step
once per run (native steps in the generated C, fallback steps in the VM, an If's branch
steps in their own rows), account for no more time than the runs took, and refuse to
profile where it cannot. The default build must carry no timers.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.cli.main import main
from shapeshift.errors import ShapeshiftError
from shapeshift.runtime.profile import BRANCH, by_op_type, exclusive, format_profile

ort = pytest.importorskip("onnxruntime")


def _mlp_with_unique(path) -> str:
    """y = Relu(x W + b) * Relu(x W + b); s = sum(Unique(round(x))): a GEMM, elementwise ops,
    and Unique, which has no native rule (a fallback step)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "r"], ["y"], name="square"),
             helper.make_node("Round", ["x"], ["xr"], name="round"),
             helper.make_node("Unique", ["xr"], ["u"], name="unique"),
             helper.make_node("ReduceSum", ["u"], ["s"], keepdims=0, name="sum")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 24)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, None)], inits)
    out = str(path / "mlp.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def test_profiled_runs_match_and_every_step_is_counted_once_per_run(tmp_path):
    path = _mlp_with_unique(tmp_path)
    plain = shapeshift.InferenceSession(path, {"n": (1, 64)}, backend="native")
    profiled = shapeshift.InferenceSession(path, {"n": (1, 64)}, backend="native", profile=True)
    assert "omp_get_wtime" not in plain._executor.program.source, "the default build has no timers"
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = [{"x": (3 * rng.standard_normal((n, 16))).astype(np.float32)} for n in (1, 7, 64, 30)]
    profiled.run(None, feeds[0])
    profiled.profile(reset=True)
    start = time.perf_counter()
    for feed in feeds:
        got = profiled.run(None, feed)
        np.testing.assert_array_equal(got[0], plain.run(None, feed)[0])
        for mine, theirs in zip(got, reference.run(None, feed)):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)
    wall = time.perf_counter() - start

    rows = profiled.profile()
    program = profiled._executor.program
    assert [r.step for r in rows] == list(range(len(program.steps)))
    kinds = {r.node: r.kind for r in rows}
    assert kinds["unique"] == "fallback" and kinds["matmul"] == "native", kinds
    for row in rows:
        if row.kind in ("native", "fallback"):
            assert row.calls == len(feeds), row
            assert row.seconds > 0, row
    total = sum(r.seconds for r in exclusive(rows))
    assert 0 < total <= wall, (total, wall)
    ops = {op: steps for op, steps, _ in by_op_type(rows)}
    assert ops["Unique"] == 1 and "MatMul" in ops, ops
    text = format_profile(rows, len(feeds))
    assert "time per run in the steps" in text and "unique" in text

    zeroed = profiled.profile(reset=True)
    assert zeroed == rows  # the rows before the reset
    assert all(r.calls == 0 and r.seconds == 0 for r in profiled.profile())


def _if_on_data(path) -> str:
    """y = Sigmoid(x) if max(x) > 0 else Neg(x), then Relu: the If's condition is data."""
    then = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["t"], name="then_sigmoid")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n"])])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["h"], then_branch=then, else_branch=other, name="if_on_data"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "if_on_data", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
                              [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    out = str(path / "if_on_data.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def test_if_branches_are_rows_of_their_own(tmp_path):
    path = _if_on_data(tmp_path)
    session = shapeshift.InferenceSession(path, {"n": (1, 64)}, backend="native", profile=True)
    assert session._executor.program.branches, "both branches are native programs"
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for x in (np.linspace(-1, 2, 9), np.linspace(0.5, 3, 40), np.linspace(-3, -1, 5)):
        x = x.astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0], rtol=1e-6)
    rows = session.profile()
    position = next(i for i, r in enumerate(rows) if r.kind == BRANCH)
    branch = rows[position]
    assert branch.node == "if_on_data" and branch.calls == 3
    inside = {r.node: r for r in rows[position + 1:position + 3]}
    assert inside["then_sigmoid"].calls == 2 and inside["else_neg"].calls == 1  # max(x) > 0 twice
    assert all(r.program for r in inside.values()) and all(r.kind == "native" for r in inside.values())
    assert sum(r.seconds for r in inside.values()) <= branch.seconds
    assert all(r.kind != BRANCH for r in exclusive(rows))


def test_sessions_of_one_library_keep_their_own_counters(tmp_path):
    """Two profiled sessions of one model load one library; each counts its own runs (the
    counters were once the library's, so that one session's profile showed the other's)."""
    path = _if_on_data(tmp_path)
    first = shapeshift.InferenceSession(path, {"n": (1, 64)}, backend="native", profile=True)
    second = shapeshift.InferenceSession(path, {"n": (1, 64)}, backend="native", profile=True)
    assert first._executor.vm.library.cdll._handle == second._executor.vm.library.cdll._handle, "one loaded library"
    x = np.linspace(-1, 2, 9).astype(np.float32)
    for _ in range(3):
        first.run(None, {"x": x})
    second.run(None, {"x": np.linspace(-3, -1, 5).astype(np.float32)})  # max(x) <= 0: the else branch
    calls = [{(r.node, r.program): r.calls for r in s.profile()} for s in (first, second)]
    assert calls[0][("relu", "")] == 3 and calls[1][("relu", "")] == 1
    then, other = (next(k for k in calls[0] if k[0] == name) for name in ("then_sigmoid", "else_neg"))
    assert (calls[0][then], calls[0][other]) == (3, 0) and (calls[1][then], calls[1][other]) == (0, 1)
    first.profile(reset=True)
    assert all(r.calls == 0 for r in first.profile()) and second.profile()[-1].calls == 1


def test_profile_is_refused_where_there_are_no_timers(tmp_path):
    path = _mlp_with_unique(tmp_path)
    with pytest.raises(ShapeshiftError, match="native backend"):
        shapeshift.InferenceSession(path, backend="reference", profile=True)
    session = shapeshift.InferenceSession(path, backend="native")
    with pytest.raises(ShapeshiftError, match="without profile=True"):
        session.profile()


def test_cli_run_profile(tmp_path, capsys):
    path = _mlp_with_unique(tmp_path)
    assert main(["run", path, "--random", "--dynamic", "n=1:32", "--backend", "reference", "--profile"]) != 0
    assert "--backend native" in capsys.readouterr().err
    # Native is the default backend: --profile needs no --backend (it asked for one before).
    for backend in (["--backend", "native"], []):
        assert main(["run", path, "--random", "--dynamic", "n=1:32", *backend, "--profile", "--repeat", "3"]) == 0
        out = capsys.readouterr().out
        assert "(2 run(s))" in out and "Unique" in out and "slowest" in out
