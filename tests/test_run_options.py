"""RunOptions: a run's deadline and its terminate flag stop a Loop that asks for two billion
iterations, on both backends, with an error naming the node; runs within their limits and
runs without options are unaffected; threads sharing a session keep their own options."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import RunStoppedError, ShapeshiftError
from shapeshift.runtime.run_options import RunOptions

BACKENDS = ("reference", "native")


def _counting_loop() -> onnx.ModelProto:
    """y = x + trips (a Loop adding 1 to x ``trips`` times; trips is an input)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feed(trips: int) -> dict:
    return {"trips": np.array(trips, np.int64), "x": np.zeros(3, np.float32)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deadline_stops_two_billion_iterations_and_names_the_loop(backend):
    session = shapeshift.InferenceSession(_counting_loop(), backend=backend)
    start = time.monotonic()
    with pytest.raises(RunStoppedError, match=r"timeout_s=0.3.*Loop"):
        session.run(None, _feed(2**31 - 1), run_options=RunOptions(timeout_s=0.3))
    assert time.monotonic() - start < 10
    # The session still runs afterwards, and a run inside its limit is unchanged.
    got = session.run(None, _feed(5), run_options=RunOptions(timeout_s=60))[0]
    np.testing.assert_array_equal(got, np.full(3, 5, np.float32))
    np.testing.assert_array_equal(session.run(None, _feed(7))[0], np.full(3, 7, np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_terminate_from_another_thread_stops_the_run(backend):
    session = shapeshift.InferenceSession(_counting_loop(), backend=backend)
    options = RunOptions()
    timer = threading.Timer(0.3, lambda: setattr(options, "terminate", True))
    timer.start()
    with pytest.raises(RunStoppedError, match="terminate"):
        session.run(None, _feed(2**31 - 1), run_options=options)
    timer.join()


def test_an_onnxruntime_run_options_object_is_accepted_for_terminate():
    session = shapeshift.InferenceSession(_counting_loop(), backend="reference")
    options = ort.RunOptions()
    np.testing.assert_array_equal(session.run(None, _feed(3), run_options=options)[0], np.full(3, 3, np.float32))
    options.terminate = True
    with pytest.raises(RunStoppedError):
        session.run(None, _feed(3), run_options=options)


def test_threads_sharing_a_session_keep_their_own_options():
    session = shapeshift.InferenceSession(_counting_loop(), backend="reference")
    outcome = {}

    def unbounded():
        outcome["free"] = session.run(None, _feed(2000))[0]

    def bounded():
        try:
            session.run(None, _feed(2**31 - 1), run_options=RunOptions(timeout_s=0.2))
        except ShapeshiftError as error:
            outcome["stopped"] = error

    threads = [threading.Thread(target=bounded), threading.Thread(target=unbounded)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(outcome["stopped"], RunStoppedError)
    np.testing.assert_array_equal(outcome["free"], np.full(3, 2000, np.float32))


def test_a_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="timeout_s"):
        RunOptions(timeout_s=0)
