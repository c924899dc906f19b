"""Program versions for Ifs decided by input shapes or small inputs' values (runtime/versions.py).

The model is torch's ``x.squeeze(1)`` as its exporters write it: ``If(Equal(Gather(Shape(x),
1), 1))`` with a Squeeze in one branch and an Identity in the other, so the If's output
has rank 1 or 2 depending on T, and everything after it has an unknown rank. One session
must build one version per outcome and run every T natively, matching onnxruntime.

An If on the value of a scalar input (silero_vad's sample rate ``sr``) is a guard too: one
flat version per outcome, chosen from the feed at each run; guards nest, so a shape test
inside one branch makes versions only where that branch is taken.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.runtime.versions import Guard, VersionedExecutor, outcomes

from .conftest import shared_model

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
    return _save(path / ("data_if.onnx" if data_dependent else "shape_if.onnx"), nodes, [], zero=0.0)


def _save(path, nodes, inputs, **scalars) -> str:
    """The model of ``nodes`` reading x [B, T] and ``inputs``, writing y, saved at ``path``;
    its initializers are one_i = 1, axes = [1], two = 2.0 and ``scalars`` (float32)."""
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one_i"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             *(numpy_helper.from_array(np.array(v, np.float32), k) for k, v in scalars.items())]
    graph = helper.make_graph(nodes, "versions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T"]),
                                                  *inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


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

    def second_fails(graph, tuning=None, profile=False, target=None):
        calls.append(graph)
        if len(calls) == 2:  # the first version (the plain program is the first call)
            raise ValueError("simulated lowering bug")
        return real(graph, tuning, profile, target)

    monkeypatch.setattr(native, "prepare_program", second_fails)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    assert not isinstance(session._executor, VersionedExecutor)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for t in (1, 4):
        x = np.linspace(-1, 1, 2 * t, dtype=np.float32).reshape(2, t)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0])


def _mode_model(path, nested: bool = False) -> str:
    """y = (x * 3 if mode == 1 else Relu(x) * 2) for x [B, T] and a scalar int64 ``mode``;
    with ``nested`` the then branch is the squeeze test of ``_squeeze_model`` instead, on x * 3."""
    three = helper.make_node("Mul", ["x", "three"], ["x3"])
    if nested:
        inner_then = helper.make_graph([helper.make_node("Squeeze", ["x3", "axes"], ["sq"])], "inner_then", [],
                                       [helper.make_tensor_value_info("sq", TensorProto.FLOAT, None)])
        inner_else = helper.make_graph([helper.make_node("Identity", ["x3"], ["same"])], "inner_else", [],
                                       [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)])
        then_nodes = [three, helper.make_node("Shape", ["x"], ["shape"]),
                      helper.make_node("Gather", ["shape", "one_i"], ["t"], axis=0),
                      helper.make_node("Equal", ["t", "one_i"], ["t_is_1"]),
                      helper.make_node("If", ["t_is_1"], ["a"], then_branch=inner_then, else_branch=inner_else,
                                       name="squeeze_if")]
    else:
        then_nodes = [three, helper.make_node("Identity", ["x3"], ["a"])]
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["b"])],
                              "else", [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Equal", ["mode", "one_i"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other, name="mode_if")]
    return _save(path / ("nested_if.onnx" if nested else "mode_if.onnx"), nodes,
                 [helper.make_tensor_value_info("mode", TensorProto.INT64, [])], three=3.0)


def test_an_if_on_an_input_value_runs_as_flat_versions(tmp_path, compiler_calls):
    path = _mode_model(tmp_path)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    executor = session._executor
    assert isinstance(executor, VersionedExecutor)
    assert [(g.name, g.reads) for g in executor.guards] == [("mode_if", ("mode",))]
    assert set(executor.versions) == {(False,), (True,)}
    for version in executor.versions.values():
        assert not version.program.branches and not version.program.fallback_ops(), "the If is inlined"
    built = len(compiler_calls)
    # The same shape with another mode must switch versions: the choice is cached per values too.
    _run_like_onnxruntime(session, path, [((2, 5), 1), ((2, 5), 0), ((2, 5), 1), ((1, 1), 7), ((8, 16), 1),
                                          ((3, 4), -1)], lambda t, mode: (mode == 1,))
    assert len(compiler_calls) == built, "no build while running"


def test_a_guard_inside_a_branch_makes_versions_only_where_it_runs(tmp_path, compiler_calls):
    path = _mode_model(tmp_path, nested=True)
    session = shapeshift.InferenceSession(path, {"B": (1, 8), "T": (1, 16)}, backend="native")
    executor = session._executor
    assert [g.name for g in executor.guards] == ["mode_if", "squeeze_if"]
    assert executor.guards[1].within == (("mode_if", True),)
    # mode != 1 never runs the squeeze test: three versions, not four.
    assert set(executor.versions) == {(True, False), (True, True), (False, None)}
    _run_like_onnxruntime(session, path, [((2, 1), 1), ((2, 6), 1), ((2, 1), 0), ((4, 9), 0), ((1, 1), 1)],
                          lambda t, mode: (True, t == 1) if mode == 1 else (False, None))


def _run_like_onnxruntime(session, path, cases, version_key) -> None:
    """Each ((B, T), mode) of ``cases`` gives onnxruntime's output and runs on the version
    ``version_key(T, mode)`` names."""
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(len(cases))
    executor = session._executor
    for (b, t), mode in cases:
        feed = {"x": rng.standard_normal((b, t)).astype(np.float32), "mode": np.array(mode, np.int64)}
        got, = session.run(None, feed)
        want, = reference.run(None, feed)
        assert got.shape == want.shape, (b, t, mode)
        np.testing.assert_allclose(got, want, err_msg=f"B={b} T={t} mode={mode}")
        assert executor.select(session.bind(feed), {"mode": feed["mode"]}) is executor.versions[version_key(t, mode)]


def test_outcomes_leave_out_the_guards_an_outer_outcome_skips():
    def guard(name, within=()):
        return Guard(name, lambda binding, values: True, (), within)

    outer, a, b = guard("outer"), guard("a", (("outer", True),)), guard("b", (("outer", False),))
    deeper = guard("deeper", (("outer", True), ("a", False)))
    assert outcomes([outer, a, b]) == [(False, None, False), (False, None, True), (True, False, None),
                                       (True, True, None)]
    assert outcomes([outer, a, deeper]) == [(False, None, None), (True, False, False), (True, False, True),
                                            (True, True, None)]
    # An enclosing If that is not a guard (both branches may run) does not prune.
    assert len(outcomes([guard("x", (("not_a_guard", True),)), guard("y")])) == 4


@pytest.mark.models
@pytest.mark.parametrize("sr, samples", [(16000, 576), (8000, 288)])
def test_silero_runs_a_flat_version_per_sample_rate(sr, samples, compiler_calls):
    path = shared_model("silero_vad.onnx")
    session = shapeshift.InferenceSession(path, backend="native")
    executor = session._executor
    assert isinstance(executor, VersionedExecutor)
    assert executor.guards[0].reads == ("sr",), "the If on the sample rate is a guard"
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for batch in (1, 3):
        state = np.zeros((2, batch, 128), np.float32)
        for _ in range(2):  # the second chunk reads the state the first one left
            feed = {"input": (rng.standard_normal((batch, samples)) * 0.1).astype(np.float32), "state": state,
                    "sr": np.array(sr, np.int64)}
            got = session.run(None, feed)
            want = reference.run(None, feed)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"sr={sr} batch={batch}")
            state = want[1]
        version = executor.select(session.bind(feed), {"sr": feed["sr"]})
        assert not version.program.branches, "no If left on the run's path"
        assert not version.program.fallback_ops(), "the version this feed selects is fully native"
