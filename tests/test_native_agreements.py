"""Shape agreements the types cannot prove are checked when the native program runs.

Exporters name each input dim on its own, so MatMul [m, k1] x [k2, n] types as [m, n]
whatever k1 and k2 turn out to be; the native kernel took one for both and read past the
other input (wrong results that changed from run to run). Each case here builds an op
whose inputs carry independent symbols, runs it with dims that disagree (a clear
ExecutionError naming the node, the dims and their values) and with dims that agree
(the reference backend's result).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift import errors

from .conftest import shared_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes, inputs, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", F, None)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


WEIGHT = _f(8, 3, 3, 3)
LSTM_W, LSTM_R = _f(1, 16, 3), _f(1, 16, 4)

# (id, model, feed whose dims disagree, message pattern, feed whose dims agree)
CASES = [
    ("matmul", _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                      [("a", F, ["m", "k1"]), ("b", F, ["k2", "n"])]),
     {"a": _f(4, 5), "b": _f(5000, 3)}, r"'mm' \(MatMul\): dimension 1 of 'a' must equal dimension 0 of 'b' "
                                        r"\(got 5 and 5000\)",
     {"a": _f(4, 5), "b": _f(5, 3)}),
    ("gemm k", _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm", transB=1)],
                      [("a", F, ["m", "k1"]), ("b", F, ["n", "k2"]), ("c", F, ["cn"])]),
     {"a": _f(4, 5), "b": _f(3, 6), "c": _f(3)}, r"'gemm' \(Gemm\): dimension 1 of 'a' must equal dimension 1 of "
                                                 r"'b' \(got 5 and 6\)",
     {"a": _f(4, 5), "b": _f(3, 5), "c": _f(3)}),
    ("gemm bias", _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm")],
                         [("a", F, ["m", "k1"]), ("b", F, ["k2", "n"]), ("c", F, ["cn"])]),
     {"a": _f(4, 5), "b": _f(5, 3), "c": _f(7)}, r"dimension 0 of 'c' must be 1 or equal .* \(got 7 and 3\)",
     {"a": _f(4, 5), "b": _f(5, 3), "c": _f(1)}),
    ("conv channels", _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
                             [("x", F, ["n", "c", "h", "w"])], [("w", WEIGHT)]),
     {"x": _f(1, 5, 8, 8)}, r"'conv' \(Conv\): dimension 1 of 'x' \(channels\) must equal .* \(got 5 and 3\)",
     {"x": _f(2, 3, 8, 8)}),
    ("concat", _model([helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=0)],
                      [("a", F, ["p", "q"]), ("b", F, ["r", "s"])]),
     {"a": _f(2, 3), "b": _f(2, 4)}, r"'cat' \(Concat\): dimension 1 of 'b' must equal dimension 1 of 'a' "
                                     r"\(got 4 and 3\)",
     {"a": _f(2, 3), "b": _f(5, 3)}),
    ("split", _model([helper.make_node("Split", ["x", "sp"], ["y", "rest"], name="split", axis=0)],
                     [("x", F, ["n", 2])], [("sp", np.array([2, 3], np.int64))]),
     {"x": _f(3, 2)}, r"'split' \(Split\): the parts' sizes along axis 0 must add up to dimension 0 of 'x' "
                      r"\(got 5 and 3\)",
     {"x": _f(5, 2)}),
    ("batchnorm", _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")],
                         [("x", F, ["n", "c", "h"]), ("s", F, ["c1"]), ("b", F, ["c2"]), ("m", F, ["c3"]),
                          ("v", F, ["c4"])]),
     {"x": _f(1, 8, 4), "s": _f(2), "b": _f(2), "m": _f(2), "v": np.ones(2, np.float32)},
     r"'bn' \(BatchNormalization\): dimension 0 of 's' must equal dimension 1 of 'x' \(got 2 and 8\)",
     {"x": _f(2, 8, 4), "s": _f(8), "b": _f(8), "m": _f(8), "v": np.ones(8, np.float32)}),
    ("scatter", _model([helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], name="sc", axis=0)],
                       [("d", F, ["p"]), ("i", TensorProto.INT64, ["r"]), ("u", F, ["t"])]),
     {"d": _f(3), "i": np.array([0, 1], np.int64), "u": _f(1)},
     r"'sc' \(ScatterElements\): dimension 0 of 'u' must equal dimension 0 of 'i' \(got 1 and 2\)",
     {"d": _f(3), "i": np.array([2, 0], np.int64), "u": _f(2)}),
    ("lstm", _model([helper.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["Y", "y"], name="lstm",
                                      hidden_size=4)],
                    [("x", F, ["s", "b", 3]), ("h0", F, [1, "b2", 4]), ("c0", F, [1, "b3", 4])],
                    [("W", LSTM_W), ("R", LSTM_R)]),
     {"x": _f(2, 1000, 3), "h0": _f(1, 1, 4), "c0": _f(1, 1, 4)},
     r"'lstm' \(LSTM\): dimension 1 of 'h0' must equal dimension 1 of 'x' \(got 1 and 1000\)",
     {"x": _f(2, 5, 3), "h0": _f(1, 5, 4), "c0": _f(1, 5, 4)}),
]


@pytest.mark.parametrize("model,bad,pattern,good", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_disagreeing_dims_are_named_and_agreeing_ones_run(model, bad, pattern, good):
    native = shapeshift.InferenceSession(model, backend="native")
    with pytest.raises(errors.ExecutionError, match=pattern):
        native.run(None, bad)
    want = shapeshift.InferenceSession(model, backend="reference").run(None, good)[0]
    np.testing.assert_allclose(native.run(None, good)[0], want, rtol=1e-4, atol=1e-5)


def test_a_model_whose_types_prove_its_agreements_gets_no_checks(encoder_path):
    """Checks only where the types cannot prove the dims equal: none in a well-typed model."""
    from shapeshift.codegen.lower.contracts import agreements

    session = shapeshift.InferenceSession(encoder_path, backend="native")
    assert not [n for n in session.graph.walk_nodes() if agreements(n)]


def test_silero_vad_with_a_state_of_another_batch_is_refused():
    """The real model: its LSTM's state comes in through an input of its own batch dim."""
    session = shapeshift.InferenceSession(shared_model("silero_vad.onnx"), backend="native")
    feed = {"input": np.zeros((2, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64)}
    with pytest.raises(errors.ExecutionError, match=r"\(LSTM\): dimension 1 of .* must equal dimension 1 of .*"
                                                    r"\(got 1 and 2\)"):
        session.run(None, feed)
    feed["state"] = np.zeros((2, 2, 128), np.float32)
    assert [o.shape for o in session.run(None, feed)] == [(2, 1), (2, 2, 128)]


def test_yolov8n_at_a_size_its_concats_cannot_take_is_refused_as_onnxruntime_does():
    """At 100 x 100 the upsampled P5 map (2 x 4 = 8 rows) meets P4's 7 at a Concat:
    onnxruntime refuses it there, and native ran on, past the end of the smaller one."""
    session = shapeshift.InferenceSession(shared_model("yolov8n_nudenet.320n.onnx"), backend="native")
    with pytest.raises(errors.ExecutionError, match=r"'/model.11/Concat' \(Concat\): dimension 2 of .* must equal "
                                                    r"dimension 2 of .* \(got 7 and 8\)"):
        session.run(None, {"images": np.zeros((1, 3, 100, 100), np.float32)})
    assert session.run(None, {"images": np.zeros((1, 3, 96, 128), np.float32)})[0].shape == (1, 22, 252)
