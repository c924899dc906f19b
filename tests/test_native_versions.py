"""Program versions for Ifs decided by input shapes (runtime/versions.py).

The model is torch's ``x.squeeze(1)`` as its exporters write it: ``If(Equal(Gather(Shape(x),
1), 1))`` with a Squeeze in one branch and an Identity in the other, so the If's output
has rank 1 or 2 depending on T, and everything after it has an unknown rank. One session
must build one version per outcome and run every T natively, matching onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.runtime.versions import VersionedExecutor

ort = pytest.importorskip("onnxruntime")


def _squeeze_model(path, data_dependent: bool = False) -> str:
    """y = Relu(x.squeeze(1) if x.shape[1] == 1 else x) * 2 for x [B, T]; with
    ``data_dependent`` the test reads x's first element instead of its shape."""
    nodes = []
    if data_dependent:
        nodes += [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
                  helper.make_node("Greater", ["m", "zero"], ["cond"])]
    else:
        nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                  helper.make_node("Gather", ["shape", "one_i"], ["t"], axis=0),
                  helper.make_node("Equal", ["t", "one_i"], ["cond"])]
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "axes"], ["sq"])], "then", [],
                             [helper.make_tensor_value_info("sq", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["id"])], "else", [],
                              [helper.make_tensor_value_info("id", TensorProto.FLOAT, None)])
    nodes += [helper.make_node("If", ["cond"], ["h"], then_branch=then, else_branch=other, name="squeeze_if"),
              helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one_i"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    graph = helper.make_graph(nodes, "squeeze_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    out = str(path / ("data_if.onnx" if data_dependent else "shape_if.onnx"))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def test_shape_decided_if_runs_natively_in_every_version(tmp_path, compiler_calls):
    path = _squeeze_model(tmp_path)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    executor = session._executor
    assert isinstance(executor, VersionedExecutor)
    assert [g.name for g in executor.guards] == ["squeeze_if"] and set(executor.versions) == {(False,), (True,)}
    for version in executor.versions.values():
        assert not version.program.fallback_ops(), "each version is fully native"
    built = len(compiler_calls)
    assert built <= 2
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, t in [(1, 1), (3, 1), (2, 5), (8, 16), (4, 1), (1, 7)]:
        x = rng.standard_normal((b, t)).astype(np.float32)
        got, = session.run(None, {"x": x})
        want, = reference.run(None, {"x": x})
        assert got.shape == want.shape, (b, t)
        np.testing.assert_allclose(got, want, err_msg=f"B={b} T={t}")
        assert executor.select(session.bind({"x": x})) is executor.versions[(t == 1,)]
    assert len(compiler_calls) == built, "no build while running: every version exists from the start"


def test_an_if_on_data_is_not_a_guard(tmp_path, compiler_calls):
    path = _squeeze_model(tmp_path, data_dependent=True)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    assert not isinstance(session._executor, VersionedExecutor)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for sign in (1.0, -1.0):
        x = np.full((2, 1), sign, np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0])


def test_a_version_that_fails_to_build_leaves_the_plain_program(tmp_path, compiler_calls, monkeypatch):
    from shapeshift.runtime import native

    path = _squeeze_model(tmp_path)
    real = native.prepare_program
    calls = []

    def second_fails(graph, tuning=None, profile=False):
        calls.append(graph)
        if len(calls) == 2:  # the first version (the plain program is the first call)
            raise ValueError("simulated lowering bug")
        return real(graph, tuning, profile)

    monkeypatch.setattr(native, "prepare_program", second_fails)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    assert not isinstance(session._executor, VersionedExecutor)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for t in (1, 4):
        x = np.linspace(-1, 1, 2 * t, dtype=np.float32).reshape(2, t)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0])
