"""Tests of LSTM, GRU and RNN: symbolic type rules, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.types import DOUBLE, FLOAT, INT32, TensorType
from shapeshift.symbolic import Expr, symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

S = symbol("seq", 1, 512)
B = symbol("batch", 1, 64)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
NUM_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def weights(op: str, dirs: int, hidden: int, inputs: int) -> list:
    g = GATES[op]
    return [f32(dirs, g * hidden, inputs), f32(dirs, g * hidden, hidden)]


# -- type rules ----------------------------------------------------------------------

# (op, inputs, attrs, opset, num_outputs, expected)
TYPE_CASES = [
    ("LSTM", [f32(S, B, 8), *weights("LSTM", 1, 16, 8)], {"hidden_size": 16}, 14, 3,
     [f32(S, 1, B, 16), f32(1, B, 16), f32(1, B, 16)]),
    ("LSTM", [f32(S, B, 8), *weights("LSTM", 2, 16, 8)], {"hidden_size": 16, "direction": "bidirectional"}, 7, 2,
     [f32(S, 2, B, 16), f32(2, B, 16)]),
    ("LSTM", [f32(B, S, 8), *weights("LSTM", 1, 16, 8)], {"hidden_size": 16, "layout": 1}, 14, 3,
     [f32(B, S, 1, 16), f32(B, 1, 16), f32(B, 1, 16)]),
    # layout is an opset-14 attribute: ignored before.
    ("LSTM", [f32(S, B, 8), *weights("LSTM", 1, 16, 8)], {"hidden_size": 16}, 7, 1, [f32(S, 1, B, 16)]),
    ("GRU", [f32(S, B, 3), *weights("GRU", 2, 5, 3)], {"hidden_size": 5, "direction": "bidirectional"}, 14, 2,
     [f32(S, 2, B, 5), f32(2, B, 5)]),
    ("GRU", [f32(B, S, 3), *weights("GRU", 1, 5, 3)], {"hidden_size": 5, "layout": 1}, 22, 2,
     [f32(B, S, 1, 5), f32(B, 1, 5)]),
    ("RNN", [f32(S, 4, 3), *weights("RNN", 1, 7, 3)], {"hidden_size": 7, "direction": "reverse"}, 14, 2,
     [f32(S, 1, 4, 7), f32(1, 4, 7)]),
    # hidden_size read off R when the attribute is absent.
    ("RNN", [f32(S, B, 3), *weights("RNN", 1, 7, 3)], {}, 14, 2, [f32(S, 1, B, 7), f32(1, B, 7)]),
    ("GRU", [TensorType(DOUBLE, (S, B, 3)), TensorType(DOUBLE, (1, 15, 3)), TensorType(DOUBLE, (1, 15, 5))],
     {}, 14, 1, [TensorType(DOUBLE, (S, 1, B, 5))]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, num_outputs, expected", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, num_outputs, expected):
    assert infer_op(op, inputs, attrs, opset, num_outputs) == expected


def test_unknown_x_rank_keeps_output_ranks_and_known_dims():
    lens = TensorType(INT32, (B,))
    y, y_h = infer_op("GRU", [TensorType(FLOAT, None), *weights("GRU", 1, 5, 3), None, lens],
                      {"hidden_size": 5}, 14, 2)
    assert y.dtype == FLOAT and len(y.shape) == 4 and isinstance(y.shape[0], Expr)
    assert y.shape[1:] == (1, B, 5) and y_h.shape == (1, B, 5)


def test_unknown_dtype_gives_unknown_types():
    assert infer_op("LSTM", [None, None, None], {"hidden_size": 4}, 14, 3) == [None, None, None]


def test_hidden_size_unknown_gives_fresh_dim():
    (y,) = infer_op("RNN", [f32(S, B, 3), TensorType(FLOAT, None), TensorType(FLOAT, None)], {}, 14, 1)
    assert y.shape[:3] == (S, 1, B) and isinstance(y.shape[3], Expr)


def test_wrong_x_rank_fails():
    with pytest.raises(ShapeInferenceError):
        infer_op("LSTM", [f32(S, 8), *weights("LSTM", 1, 16, 8)], {"hidden_size": 16}, 14, 3)


# -- numerics against onnxruntime ----------------------------------------------------


def make_inputs(rng, op, seq, batch, inputs, hidden, dirs, *, bias=True, lens=None, h0=False, c0=False,
                peepholes=False) -> list:
    g = GATES[op]
    arrays = [
        rng.standard_normal((seq, batch, inputs)).astype(np.float32),
        (0.5 * rng.standard_normal((dirs, g * hidden, inputs))).astype(np.float32),
        (0.5 * rng.standard_normal((dirs, g * hidden, hidden))).astype(np.float32),
        (0.5 * rng.standard_normal((dirs, 2 * g * hidden))).astype(np.float32) if bias else None,
        None if lens is None else np.array(lens, dtype=np.int32),
        rng.standard_normal((dirs, batch, hidden)).astype(np.float32) if h0 else None,
    ]
    if op == "LSTM":
        arrays.append(rng.standard_normal((dirs, batch, hidden)).astype(np.float32) if c0 else None)
        arrays.append(rng.standard_normal((dirs, 3 * hidden)).astype(np.float32) if peepholes else None)
    while arrays[-1] is None:
        arrays.pop()
    return arrays


# (op, seq, batch, input, hidden, direction, input options, extra attrs)
NUMERIC_CASES = [
    ("LSTM", 5, 3, 4, 6, "forward", {}, {}),
    ("LSTM", 1, 1, 2, 3, "reverse", {"h0": True, "c0": True}, {}),
    ("LSTM", 6, 2, 3, 4, "bidirectional", {"h0": True, "c0": True, "peepholes": True}, {}),
    ("LSTM", 5, 3, 4, 6, "bidirectional", {"lens": [5, 2, 0], "h0": True, "c0": True}, {}),
    ("LSTM", 5, 3, 4, 6, "reverse", {"lens": [1, 4, 3], "peepholes": True}, {}),
    ("LSTM", 4, 2, 3, 5, "forward", {"peepholes": True}, {"input_forget": 1, "clip": 0.4}),
    ("LSTM", 4, 2, 3, 5, "forward", {"bias": False},
     {"activations": ["HardSigmoid", "ScaledTanh", "Affine"], "activation_alpha": [0.3, 0.9, 0.5],
      "activation_beta": [0.4, 1.1, 0.1]}),
    ("GRU", 5, 3, 4, 6, "forward", {}, {}),
    ("GRU", 7, 2, 5, 3, "reverse", {"h0": True}, {}),
    ("GRU", 5, 3, 4, 6, "bidirectional", {"lens": [5, 2, 3], "h0": True}, {"linear_before_reset": 1}),
    ("GRU", 4, 2, 3, 5, "forward", {"bias": False}, {"clip": 0.5}),
    ("GRU", 4, 2, 3, 5, "bidirectional", {},
     {"activations": ["HardSigmoid", "Tanh", "Sigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.1],
      "activation_beta": [0.4]}),
    ("RNN", 5, 3, 4, 6, "forward", {}, {}),
    ("RNN", 5, 3, 4, 6, "bidirectional", {"lens": [0, 5, 1], "h0": True}, {}),
    ("RNN", 3, 2, 3, 5, "forward", {}, {"activations": ["Relu"], "clip": 0.8}),
    ("RNN", 3, 2, 3, 5, "reverse", {}, {"activations": ["LeakyRelu"]}),
    ("RNN", 3, 2, 3, 5, "forward", {}, {"activations": ["Elu"]}),
    ("RNN", 3, 2, 3, 5, "forward", {}, {"activations": ["Softsign"]}),
    ("RNN", 3, 2, 3, 5, "forward", {}, {"activations": ["Softplus"]}),
    ("RNN", 3, 2, 3, 5, "forward", {}, {"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}),
]


@pytest.mark.parametrize("op, seq, batch, inp, hidden, direction, options, attrs", NUMERIC_CASES,
                         ids=[f"{c[0]}-{c[5]}-{i}" for i, c in enumerate(NUMERIC_CASES)])
def test_matches_onnxruntime(op, seq, batch, inp, hidden, direction, options, attrs):
    rng = np.random.default_rng(100 * seq + 10 * batch + hidden)
    dirs = 2 if direction == "bidirectional" else 1
    inputs = make_inputs(rng, op, seq, batch, inp, hidden, dirs, **options)
    attrs = {"hidden_size": hidden, "direction": direction, **attrs}
    n = NUM_OUTPUTS[op]
    want = ort_op(op, inputs, attrs, opset=14, num_outputs=n)
    got = apply_op(op, inputs, attrs, opset=14, num_outputs=n)
    assert_types_match(infer_op(op, inputs, attrs, 14, n), want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_1_is_layout_0_transposed(op):
    # onnxruntime does not implement layout=1, so compare with its layout-0 result.
    rng = np.random.default_rng(7)
    inputs = make_inputs(rng, op, 4, 3, 2, 5, 2, lens=[4, 1, 2], h0=True, c0=True)
    attrs = {"hidden_size": 5, "direction": "bidirectional"}
    n = NUM_OUTPUTS[op]
    want = ort_op(op, inputs, attrs, opset=14, num_outputs=n)
    batchwise = list(inputs)
    batchwise[0] = inputs[0].transpose(1, 0, 2)
    for i in (5, 6):  # initial_h, initial_c
        if i < len(inputs):
            batchwise[i] = inputs[i].transpose(1, 0, 2)
    got = apply_op(op, batchwise, {**attrs, "layout": 1}, opset=14, num_outputs=n)
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
    assert_types_match(infer_op(op, batchwise, {**attrs, "layout": 1}, 14, n), got)


def test_affine_defaults_follow_the_onnx_operator():
    # The spec's defaults are the Affine operator's (alpha=1, beta=0): the identity.
    # (onnxruntime defaults both to 0 instead, so it is not the reference here.)
    rng = np.random.default_rng(3)
    inputs = make_inputs(rng, "RNN", 3, 2, 3, 4, 1)
    (y,) = apply_op("RNN", inputs, {"hidden_size": 4, "activations": ["Affine"]}, opset=14)
    (ref,) = apply_op("RNN", inputs, {"hidden_size": 4, "activations": ["Affine"],
                                      "activation_alpha": [1.0], "activation_beta": [0.0]}, opset=14)
    np.testing.assert_array_equal(y, ref)


def test_float16_input_keeps_its_dtype():
    rng = np.random.default_rng(5)
    inputs = [a.astype(np.float16) for a in make_inputs(rng, "GRU", 3, 2, 3, 4, 1)]
    y, y_h = apply_op("GRU", inputs, {"hidden_size": 4}, opset=14, num_outputs=2)
    ref = apply_op("GRU", [a.astype(np.float32) for a in inputs], {"hidden_size": 4}, opset=14, num_outputs=2)
    assert y.dtype == np.float16 and y_h.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), ref[0], atol=2e-3)
