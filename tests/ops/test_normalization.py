"""Tests of the normalization ops: type rules on symbolic shapes, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.types import DOUBLE, FLOAT, FLOAT16, TensorType
from shapeshift.symbolic import symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

N = symbol("N", 1, 64)
T = symbol("seq", 1, 512)
H = symbol("H", 1, 1024)

rng = np.random.default_rng(0)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def rand(*shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def positive(*shape) -> np.ndarray:
    return (np.abs(rand(*shape)) + 0.1).astype(np.float32)


# -- type rules ------------------------------------------------------------------------

# (op, inputs, attrs, opset, expected output types)
TYPE_CASES = [
    ("BatchNormalization", [f32(N, 8, H, H)] + [f32(8)] * 4, {}, 15, [f32(N, 8, H, H)]),
    ("BatchNormalization", [f32(N, 8, H)] + [f32(8)] * 4, {"training_mode": 1}, 15,
     [f32(N, 8, H), f32(8), f32(8)]),
    ("BatchNormalization", [f32(N, 8, H)] + [f32(8)] * 4, {}, 9, [f32(N, 8, H)] + [f32(8)] * 4),
    ("BatchNormalization", [TensorType(FLOAT)] + [f32(8)] * 4, {"training_mode": 1}, 15,
     [TensorType(FLOAT), f32(8), f32(8)]),
    ("InstanceNormalization", [f32(N, 4, H, H), f32(4), f32(4)], {}, 6, [f32(N, 4, H, H)]),
    ("LayerNormalization", [f32(N, T, 64), f32(64), f32(64)], {}, 17,
     [f32(N, T, 64), f32(N, T, 1), f32(N, T, 1)]),
    ("LayerNormalization", [TensorType(FLOAT16, (N, T, 64)), TensorType(FLOAT16, (64,))], {"axis": 1}, 17,
     [TensorType(FLOAT16, (N, T, 64)), f32(N, 1, 1), f32(N, 1, 1)]),
    ("LayerNormalization", [TensorType(DOUBLE, (N, T)), TensorType(DOUBLE, (T,))], {"stash_type": DOUBLE}, 17,
     [TensorType(DOUBLE, (N, T)), TensorType(DOUBLE, (N, 1))]),
    ("LayerNormalization", [TensorType(FLOAT), f32(64)], {}, 17, [TensorType(FLOAT), TensorType(FLOAT)]),
    ("GroupNormalization", [f32(N, 6, H), f32(3), f32(3)], {"num_groups": 3}, 18, [f32(N, 6, H)]),
    ("GroupNormalization", [f32(N, 6, H), f32(6), f32(6)], {"num_groups": 3}, 21, [f32(N, 6, H)]),
    ("LRN", [f32(N, 6, H, H)], {"size": 3}, 13, [f32(N, 6, H, H)]),
    ("MeanVarianceNormalization", [f32(N, 6, H, H)], {}, 13, [f32(N, 6, H, H)]),
    ("LpNormalization", [f32(N, T)], {"p": 1}, 1, [f32(N, T)]),
    ("LpNormalization", [None], {}, 1, [None]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, expected", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, expected):
    assert infer_op(op, inputs, attrs, opset, num_outputs=len(expected)) == expected


@pytest.mark.parametrize("op, inputs, attrs, opset", [
    ("LayerNormalization", [f32(N, T), f32(T)], {"axis": 2}, 17),
    ("GroupNormalization", [f32(N, 6, H), f32(4), f32(4)], {"num_groups": 4}, 18),
    ("GroupNormalization", [f32(N, 6, H), f32(6), f32(6)], {}, 21),
    ("MeanVarianceNormalization", [f32(N, 6)], {"axes": [0, 2]}, 13),
    ("LpNormalization", [f32(N, T)], {"p": 3}, 1),
    ("LpNormalization", [f32(N, T)], {"axis": -3}, 1),
    ("InstanceNormalization", [f32(N, 4), f32(4), f32(4)], {}, 6),
])
def test_invalid_inputs_fail(op, inputs, attrs, opset):
    with pytest.raises(ShapeInferenceError):
        infer_op(op, inputs, attrs, opset)


# -- numerics against onnxruntime ------------------------------------------------------


def _channels(c):
    return [rand(c), rand(c), rand(c), positive(c)]


# (op, input builder, attrs, opset, outputs, tolerance)
NUMERIC_CASES = [
    ("BatchNormalization", lambda s: [rand(*s)] + _channels(s[1]), {"epsilon": 1e-3}, 9, 1, 1e-5),
    ("BatchNormalization", lambda s: [rand(*s)] + _channels(s[1]), {}, 15, 1, 1e-5),
    ("BatchNormalization", lambda s: [rand(*s)] + _channels(s[1]), {"training_mode": 1, "momentum": 0.7}, 15, 3, 1e-5),
    ("BatchNormalization", lambda s: [rand(*s)] + _channels(s[1]), {"momentum": 0.8}, 9, 5, 1e-5),
    ("BatchNormalization", lambda s: [rand(*s, dtype=np.float16)] + _channels(s[1]), {}, 15, 1, 1e-2),
    ("InstanceNormalization", lambda s: [rand(*s), rand(s[1]), rand(s[1])], {"epsilon": 1e-3}, 6, 1, 1e-4),
    ("LayerNormalization", lambda s: [rand(*s), rand(s[-1]), rand(s[-1])], {}, 17, 3, 1e-4),
    ("LayerNormalization", lambda s: [rand(*s), rand(*s[1:])], {"axis": 1}, 17, 3, 1e-4),
    ("LayerNormalization", lambda s: [rand(*s, dtype=np.float16), rand(s[-1], dtype=np.float16)], {}, 17, 3, 1e-2),
    ("LayerNormalization", lambda s: [rand(*s, dtype=np.float64), rand(s[-1], dtype=np.float64)], {}, 17, 3, 1e-5),
    ("GroupNormalization", lambda s: [rand(*s), rand(2), rand(2)], {"num_groups": 2}, 18, 1, 1e-4),
    ("GroupNormalization", lambda s: [rand(*s), rand(s[1]), rand(s[1])], {"num_groups": 2, "epsilon": 1e-3},
     21, 1, 1e-4),
    # One group per channel (every shape in SHAPES has 4): InstanceNormalization.
    ("GroupNormalization", lambda s: [rand(*s), rand(s[1]), rand(s[1])], {"num_groups": 4}, 21, 1, 1e-4),
    ("LRN", lambda s: [rand(*s)], {"size": 3}, 13, 1, 1e-5),
    ("LRN", lambda s: [rand(*s)], {"size": 5, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, 13, 1, 1e-5),
    ("MeanVarianceNormalization", lambda s: [rand(*s)], {}, 13, 1, 1e-4),
    ("MeanVarianceNormalization", lambda s: [rand(*s)], {"axes": [1, 3]}, 13, 1, 1e-4),
    ("LpNormalization", lambda s: [rand(*s)], {"p": 1, "axis": 1}, 1, 1, 1e-5),
    ("LpNormalization", lambda s: [rand(*s)], {"p": 2}, 1, 1, 1e-5),
]


SHAPES = [(2, 4, 5, 6), (1, 4, 3, 7), (3, 4, 1, 9)]


@pytest.mark.parametrize("op, build, attrs, opset, outputs, tol", NUMERIC_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(NUMERIC_CASES)])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_onnxruntime(op, build, attrs, opset, outputs, tol, shape):
    inputs = build(shape)
    want = ort_op(op, inputs, attrs, opset, outputs)
    got = apply_op(op, inputs, attrs, opset, outputs)
    assert_types_match(infer_op(op, inputs, attrs, opset, outputs), want)
    for actual, expected in zip(got, want):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def test_lp_normalization_of_a_zero_vector_is_zero():
    x = rand(3, 4)
    x[1] = 0
    (y,) = apply_op("LpNormalization", [x], {"p": 2, "axis": 1}, 1)
    assert not np.isnan(y).any()
    np.testing.assert_array_equal(y[1], 0)
    np.testing.assert_allclose(np.linalg.norm(y[[0, 2]], axis=1), 1, rtol=1e-6)


def test_batch_norm_before_opset_14_with_three_outputs_is_training():
    x = rand(4, 3, 5)
    inputs = [x] + _channels(3)
    y, running_mean, running_var = apply_op("BatchNormalization", inputs, {"momentum": 0.5}, 9, 3)
    np.testing.assert_allclose(running_mean, 0.5 * inputs[3] + 0.5 * x.mean(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(y.mean(axis=(0, 2)), inputs[2], atol=1e-5)
