"""Repeated runs of one session. What a run skips when an earlier one saw the same feed
signature (the remembered feed check in session.py; the VM's last plan and its output
copies in vm.py) must never change a result, hand out memory twice, or let a wrong feed
through."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift import errors

C1 = np.linspace(-1, 1, 16, dtype=np.float32)
C2 = np.linspace(0.5, 2, 16, dtype=np.float32)


def _model():
    """X[N, 16] -> Add -> Relu -> Mul -> Y, with the Add's result a second output."""
    nodes = [helper.make_node("Add", ["X", "c1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Mul", ["r", "c2"], ["Y"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 16])],
        initializer=[numpy_helper.from_array(C1, "c1"), numpy_helper.from_array(C2, "c2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _want(x: np.ndarray) -> list[np.ndarray]:
    return [np.maximum(x + C1, 0) * C2, x + C1]


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


@pytest.fixture(scope="module", params=["native", "reference"])
def session(request):
    return shapeshift.InferenceSession(_model(), dynamic={"N": (1, 64)}, backend=request.param)


def test_shapes_changing_between_repeated_runs_bind_their_own_dims(session):
    # Runs of one shape, then others, back and forth: each binds its own N, and every result
    # is an array of its own that later runs leave alone.
    kept = []
    for k, n in enumerate((8, 8, 8, 1, 64, 8, 1, 1, 33, 8)):
        x = _x(n, seed=k)
        got = session.run(None, {"X": x})
        for g, w in zip(got, _want(x)):
            assert g.shape == (n, 16) and g.flags.c_contiguous and g.flags.writeable
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        kept.append((got, [g.copy() for g in got]))
    for got, at_return in kept:
        for g, r in zip(got, at_return):
            np.testing.assert_array_equal(g, r)
    arrays = [g for got, _ in kept for g in got]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])


def test_a_result_written_by_the_caller_leaves_the_next_run_alone(session):
    x = _x(4)
    first = session.run(None, {"X": x})
    for g in first:
        g[...] = np.nan
    np.testing.assert_allclose(session.run(None, {"X": x})[0], _want(x)[0], rtol=1e-6)


@pytest.mark.parametrize("mutate,error,pattern", [
    (lambda f: f.update(X=f["X"].astype(np.float64)), errors.InputDtypeError, "'X'.*float"),
    (lambda f: f.update(X=f["X"][0]), errors.InputRankError, "'X'.*rank 2"),
    (lambda f: f.update(X=_x(65)), errors.SymbolRangeError, r"'X'.*'N' = 65 .*\[1, 64\]"),
    (lambda f: f.update(X=np.zeros((3, 15), np.float32)), errors.InputShapeError, "'X': dimension 1 must be 16"),
    (lambda f: f.pop("X"), errors.MissingInputError, "'X'"),
    (lambda f: f.update(extra=np.zeros(1, np.float32)), errors.UnknownInputError, "'extra'"),
    (lambda f: f.update(X=f["X"].astype(object)), errors.InputDtypeError, "'X'.*Python objects"),
    (lambda f: f.update(X=f["X"].astype(">f4")), errors.InputDtypeError, "'X'.*opposite byte order"),
    (lambda f: f.update(X=np.float32(1.0)), errors.InputRankError, "'X'.*rank 2"),
])
def test_a_wrong_feed_after_remembered_ones_still_raises_its_error(session, mutate, error, pattern):
    good = {"X": _x(3)}
    for _ in range(2):  # the second run finds the signature remembered
        session.run(None, good)
    for _ in range(2):  # a wrong feed is checked, and refused, every time
        feed = dict(good)
        mutate(feed)
        with pytest.raises(error, match=pattern):
            session.run(None, feed)
    np.testing.assert_allclose(session.run(None, good)[0], _want(good["X"])[0], rtol=1e-6)


def test_a_feed_that_is_no_mapping_is_refused_after_remembered_ones(session):
    session.run(None, {"X": _x(2)})
    with pytest.raises(errors.InputError, match="must map input names to arrays .* got a list.*'X'"):
        session.run(None, [_x(2)])


def test_output_names_pick_from_remembered_runs(session):
    x = _x(5)
    y, a = _want(x)
    for _ in range(2):
        (only,) = session.run(["a"], {"X": x})
        np.testing.assert_allclose(only, a, rtol=1e-6)
        got = session.run(["a", "Y"], {"X": x})
        np.testing.assert_allclose(got[0], a, rtol=1e-6)
        np.testing.assert_allclose(got[1], y, rtol=1e-6)
        assert len(session.run([], {"X": x})) == 2  # none named: all, as onnxruntime
    with pytest.raises(errors.UnknownOutputError, match="'nope'"):
        session.run(["nope"], {"X": x})


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_scalars_and_lists_run_like_the_arrays_they_become(backend):
    # A NumPy scalar has the shape and dtype of a 0-d array, a list becomes an array: each
    # runs as that array does, before and after an array of that signature was remembered.
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"])], "scale",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["n"]),
         helper.make_tensor_value_info("s", TensorProto.DOUBLE, [])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["n"])])
    session = shapeshift.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                          backend=backend)
    x = np.arange(4.0)
    feeds = [{"x": x, "s": np.float64(3.0)}, {"x": x, "s": np.array(2.0)}, {"x": x, "s": np.float64(3.0)},
             {"x": [1.0, 2.0], "s": 4.0}, {"x": [1.0, 2.0], "s": 5.0}, {"x": x, "s": np.array(6.0)}]
    for feed in feeds:
        (got,) = session.run(None, feed)
        np.testing.assert_array_equal(got, np.asarray(feed["x"]) * float(feed["s"]))


def test_the_native_vm_takes_the_plan_of_each_binding():
    session = shapeshift.InferenceSession(_model(), dynamic={"N": (1, 64)}, backend="native")
    vm = session._executor.vm
    for n in (8, 8, 2, 8, 2, 2):
        x = _x(n, seed=n)
        np.testing.assert_allclose(session.run(None, {"X": x})[0], _want(x)[0], rtol=1e-6)
        binding, plan = vm._last_plan
        assert binding == {"N": n} and plan is vm._plans[(n,)]
    assert len(vm._plans) == 2


def test_threads_sharing_a_native_session_each_get_their_own_results():
    session = shapeshift.InferenceSession(_model(), dynamic={"N": (1, 64)}, backend="native")
    failures = []

    def work(sizes):
        try:
            for k in range(100):
                x = _x(sizes[k % len(sizes)], seed=k)
                got = session.run(None, {"X": x})
                for g, w in zip(got, _want(x)):
                    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(sizes,)) for sizes in ((8,), (8, 3), (64, 1, 8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
