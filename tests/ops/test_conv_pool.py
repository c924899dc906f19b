"""Tests of convolution and pooling: symbolic type rules, numerics against onnxruntime.

The central table runs each op with symbolic spatial dims H and W through its
type rule, then at several concrete sizes checks that the symbolic dims
evaluate to the shape onnxruntime produces and that the evaluator's values
match onnxruntime's.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.types import FLOAT, INT32, INT64, UINT8, TensorType
from shapeshift.symbolic import Expr, ceildiv, evaluate, floordiv, symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

N = symbol("N", 1, 16)
H = symbol("H", 1, 4096)
W = symbol("W", 1, 4096)
SIZES = [(8, 13), (16, 16), (37, 41)]

rng = np.random.default_rng(0)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def rand(*shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# -- symbolic type rules checked against onnxruntime at several sizes ---------------

# (op, channels in, weight shape or None, attrs, opset, outputs)
WINDOW_CASES = [
    ("Conv", 3, (8, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 11, 1),
    ("Conv", 3, (8, 3, 3, 3), {}, 11, 1),
    ("Conv", 4, (6, 4, 3, 2), {"pads": [1, 2, 0, 1], "strides": [2, 3], "dilations": [2, 1]}, 11, 1),
    ("Conv", 4, (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, 11, 1),
    ("Conv", 4, (8, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, 11, 1),
    ("Conv", 3, (5, 3, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 11, 1),
    ("Conv", 3, (5, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}, 11, 1),
    ("Conv", 3, (5, 3, 4, 3), {"auto_pad": "VALID", "strides": [2, 3]}, 11, 1),
    ("Conv", 3, (5, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2], "kernel_shape": [7, 7]}, 22, 1),
    ("ConvTranspose", 4, (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 11, 1),
    ("ConvTranspose", 4, (4, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 11, 1),
    ("ConvTranspose", 4, (4, 3, 3, 2), {"strides": [2, 3], "output_padding": [1, 2], "dilations": [1, 2]}, 11, 1),
    ("ConvTranspose", 4, (4, 2, 3, 3), {"group": 2, "strides": [2, 2], "auto_pad": "SAME_UPPER"}, 11, 1),
    ("ConvTranspose", 4, (4, 3, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, 11, 1),
    ("ConvTranspose", 4, (4, 3, 2, 1), {"strides": [3, 2], "auto_pad": "SAME_UPPER"}, 11, 1),  # kernel < stride
    ("MaxPool", 3, None, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, 12, 1),
    ("MaxPool", 3, None, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 12, 2),
    ("MaxPool", 3, None, {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}, 12, 2),
    ("MaxPool", 3, None, {"kernel_shape": [3, 2], "strides": [2, 1], "dilations": [2, 2], "storage_order": 1}, 12, 2),
    ("MaxPool", 3, None, {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, 12, 2),
    ("AveragePool", 3, None, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, 19, 1),
    ("AveragePool", 3, None, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, 19, 1),
    ("AveragePool", 3, None, {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 1, 1], "ceil_mode": 1,
                              "count_include_pad": 1}, 19, 1),
    ("AveragePool", 3, None, {"kernel_shape": [3, 3], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2]}, 19, 1),
    ("AveragePool", 3, None, {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2],
                              "count_include_pad": 1}, 11, 1),
    ("AveragePool", 3, None, {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2], "ceil_mode": 1}, 11, 1),
    ("LpPool", 3, None, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2], "p": 3}, 18, 1),
    ("LpPool", 3, None, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 18, 1),
]


def _bias_for(op, weight_shape, attrs):
    channels = weight_shape[1] * attrs.get("group", 1) if op == "ConvTranspose" else weight_shape[0]
    return rand(channels)


@pytest.mark.parametrize("op, channels, weight_shape, attrs, opset, outputs", WINDOW_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(WINDOW_CASES)])
def test_symbolic_type_matches_onnxruntime(op, channels, weight_shape, attrs, opset, outputs):
    symbolic_inputs = [f32(N, channels, H, W)]
    if weight_shape is not None:
        symbolic_inputs += [f32(*weight_shape)]
    types = infer_op(op, symbolic_inputs, attrs, opset, outputs)
    assert all(isinstance(t.shape[2], Expr) and isinstance(t.shape[3], Expr) for t in types)
    for h, w in SIZES:
        inputs = [rand(2, channels, h, w)]
        if weight_shape is not None:
            inputs += [rand(*weight_shape), _bias_for(op, weight_shape, attrs)]
        want = ort_op(op, inputs, attrs, opset, outputs)
        got = apply_op(op, inputs, attrs, opset, outputs)
        binding = {"N": 2, "H": h, "W": w}
        for t, expected, actual in zip(types, want, got):
            assert tuple(evaluate(d, binding) for d in t.shape) == expected.shape, (h, w)
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_conv_output_dim_is_one_floordiv():
    # k=3, pad 1, stride 2: floor((H + 2 - 3) / 2) + 1 == (H + 1) // 2.
    (y,) = infer_op("Conv", [f32(N, 3, H, W), f32(16, 3, 3, 3)], {"pads": [1, 1, 1, 1], "strides": [2, 2]})
    assert y.shape[:2] == (N, 16)
    assert y.shape[2] is floordiv(H + 1, 2)
    # SAME padding gives ceil(H / 2): the very same interned expression, so a
    # residual Add of the two branches sees equal dims.
    (same,) = infer_op("Conv", [f32(N, 3, H, W), f32(16, 3, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]})
    assert same.shape[2] is ceildiv(H, 2) is y.shape[2]


def test_stride_one_same_size_conv_keeps_dims():
    (y,) = infer_op("Conv", [f32(N, 8, H, W), f32(8, 8, 3, 3)], {"pads": [1, 1, 1, 1]})
    assert y == f32(N, 8, H, W)


def test_ceil_mode_adds_no_minimum_when_no_window_can_start_in_padding():
    (y,) = infer_op("MaxPool", [f32(N, 3, H, W)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                   "strides": [2, 2], "ceil_mode": 1}, 12)
    assert y.shape[2] is floordiv(H, 2) + 1


@pytest.mark.parametrize("h", range(1, 12))
def test_ceil_mode_drops_a_window_starting_in_the_padding(h):
    attrs = {"kernel_shape": [2], "strides": [3], "pads": [1, 1], "ceil_mode": 1}
    (y,) = infer_op("MaxPool", [f32(1, 1, H)], attrs, 12)
    x = rand(1, 1, h)
    want = ort_op("MaxPool", [x], attrs, 12)[0]
    assert evaluate(y.shape[2], {"H": h}) == want.shape[2]
    np.testing.assert_array_equal(apply_op("MaxPool", [x], attrs, 12)[0], want)


def test_conv_transpose_output_shape_attribute():
    attrs = {"strides": [2, 2], "output_shape": [21, 24]}
    (y,) = infer_op("ConvTranspose", [f32(N, 4, H, W), f32(4, 3, 3, 3)], attrs)
    assert y == f32(N, 3, 21, 24)
    inputs = [rand(1, 4, 10, 11), rand(4, 3, 3, 3)]
    np.testing.assert_allclose(apply_op("ConvTranspose", inputs, attrs)[0],
                               ort_op("ConvTranspose", inputs, attrs)[0], rtol=1e-4, atol=1e-4)


def test_conv_transpose_symbolic_upsampling():
    (y,) = infer_op("ConvTranspose", [f32(N, 16, H, W), f32(16, 8, 4, 4)], {"strides": [2, 2], "pads": [1, 1, 1, 1]})
    assert y.shape[1] == 8 and y.shape[2] is 2 * H and y.shape[3] is 2 * W


# -- degraded and invalid inputs -------------------------------------------------------


def test_unknown_rank_and_dtype_degrade():
    assert infer_op("Conv", [TensorType(FLOAT), TensorType(FLOAT)], {}) == [TensorType(FLOAT)]
    assert infer_op("MaxPool", [TensorType(FLOAT)], {"kernel_shape": [2, 2]}, 12, 2) == [
        TensorType(FLOAT), TensorType(INT64)]
    assert infer_op("Conv", [None, f32(8, 3, 3, 3)], {}) == [None]
    assert infer_op("GlobalAveragePool", [TensorType(FLOAT)], {}) == [TensorType(FLOAT)]


def test_unknown_weight_shape_gives_fresh_dims_unless_kernel_shape_is_given():
    (y,) = infer_op("Conv", [f32(N, 3, H, W), TensorType(FLOAT)], {"pads": [1, 1, 1, 1]})
    assert y.shape[0] is N and all(isinstance(d, Expr) for d in y.shape)
    assert y.shape[2] is not H
    (y,) = infer_op("Conv", [f32(N, 3, H, W), TensorType(FLOAT)], {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]})
    assert y.shape[2:] == (H, W)


def test_unknown_input_shape_keeps_weight_channels():
    (y,) = infer_op("Conv", [TensorType(FLOAT), f32(16, 3, 3, 3)], {})
    assert y.rank == 4 and y.shape[1] == 16


@pytest.mark.parametrize("op, inputs, attrs", [
    ("Conv", [f32(N, 4, H, W), f32(8, 3, 3, 3)], {}),                       # channel mismatch
    ("Conv", [f32(N, 4, H, W), f32(8, 2, 3, 3)], {"group": 3}),            # group mismatch
    ("Conv", [f32(N, 3, H, W), f32(8, 3, 3, 3)], {"pads": [1, 1]}),        # pads length
    ("Conv", [f32(N, 3, H, W), f32(8, 3, 3, 3)], {"strides": [0, 1]}),     # zero stride
    ("Conv", [f32(N, 3, 2, 2), f32(8, 3, 3, 3)], {}),                       # kernel larger than input
    ("Conv", [f32(N, 3), f32(8, 3)], {}),                                   # no spatial axis
    ("MaxPool", [f32(N, 3, H, W)], {}),                                     # kernel_shape missing
    ("MaxPool", [f32(N, 3, H, W)], {"kernel_shape": [3, 3], "auto_pad": "SAME"}),
    ("ConvTranspose", [f32(N, 4, H, W), f32(3, 3, 3, 3)], {}),
])
def test_invalid_inputs_fail(op, inputs, attrs):
    with pytest.raises(ShapeInferenceError):
        infer_op(op, inputs, attrs, 12)


# -- other numerics ----------------------------------------------------------------------


@pytest.mark.parametrize("shape, weight, attrs", [
    ((2, 3, 17), (5, 3, 4), {"strides": [3], "pads": [2, 1]}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
])
def test_conv_1d_and_3d(shape, weight, attrs):
    inputs = [rand(*shape), rand(*weight), rand(weight[0])]
    want = ort_op("Conv", inputs, attrs)
    assert_types_match(infer_op("Conv", inputs, attrs), want)
    np.testing.assert_allclose(apply_op("Conv", inputs, attrs)[0], want[0], rtol=1e-4, atol=1e-4)


def test_conv_float16_accumulates_in_float32():
    inputs = [rand(1, 8, 9, 9, dtype=np.float16), rand(4, 8, 3, 3, dtype=np.float16)]
    got = apply_op("Conv", inputs, {"pads": [1, 1, 1, 1]})[0]
    want = ort_op("Conv", inputs, {"pads": [1, 1, 1, 1]})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("x_zero, w_zero", [(None, None), (np.array(100, np.uint8), np.array(120, np.uint8))])
def test_conv_integer(x_zero, w_zero):
    x = rng.integers(0, 255, (1, 3, 9, 8)).astype(np.uint8)
    w = rng.integers(0, 255, (4, 3, 3, 3)).astype(np.uint8)
    inputs = [x, w] + ([] if x_zero is None else [x_zero, w_zero])
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 1]}
    (t,) = infer_op("ConvInteger", [TensorType(UINT8, (N, 3, H, W)), TensorType(UINT8, (4, 3, 3, 3))], attrs, 10)
    assert t.dtype == INT32 and evaluate(t.shape[2], {"H": 9}) == 5
    np.testing.assert_array_equal(apply_op("ConvInteger", inputs, attrs, 10)[0],
                                  ort_op("ConvInteger", inputs, attrs, 10)[0])


def test_max_pool_int8_and_indices():
    x = rng.integers(-128, 127, (2, 3, 7, 6)).astype(np.int8)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    got = apply_op("MaxPool", [x], attrs, 12, 2)
    want = ort_op("MaxPool", [x], attrs, 12, 2)
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], want[0])
    # Ties between equal int8 values may pick different cells; values at them must agree.
    np.testing.assert_array_equal(x.reshape(-1)[got[1]], x.reshape(-1)[want[1]])


@pytest.mark.parametrize("op, attrs", [
    ("GlobalAveragePool", {}), ("GlobalMaxPool", {}), ("GlobalLpPool", {"p": 3}), ("GlobalLpPool", {}),
])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_global_pools(op, attrs, shape):
    x = rand(*shape)
    (t,) = infer_op(op, [f32(N, 3, *([H] * (len(shape) - 2)))], attrs)
    assert t == f32(N, 3, *([1] * (len(shape) - 2)))
    np.testing.assert_allclose(apply_op(op, [x], attrs)[0], ort_op(op, [x], attrs)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, output_shape", [((1, 2, 8, 8), None), ((2, 2, 9, 7), [2, 2, 9, 7])])
def test_max_unpool_inverts_max_pool(shape, output_shape):
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    values, indices = ort_op("MaxPool", [rand(*shape)], pool, 12, 2)
    inputs = [values, indices] + ([] if output_shape is None else [np.array(output_shape, np.int64)])
    consts = [2] if output_shape is not None else []
    want = ort_op("MaxUnpool", inputs, pool, 11)
    assert_types_match(infer_op("MaxUnpool", inputs, pool, 11, const_inputs=consts), want)
    np.testing.assert_array_equal(apply_op("MaxUnpool", inputs, pool, 11)[0], want[0])


def test_max_unpool_symbolic():
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    (t,) = infer_op("MaxUnpool", [f32(N, 3, H, W), TensorType(INT64, (N, 3, H, W))], pool, 11)
    assert t == f32(N, 3, 2 * H, 2 * W)
    (t,) = infer_op("MaxUnpool", [f32(N, 3, H, W), TensorType(INT64, (N, 3, H, W)), TensorType(INT64, (4,))],
                    pool, 11)
    assert t.shape[:2] == (N, 3) and t.rank == 4


def test_conv_on_a_large_image_is_fast():
    x, w = rand(1, 64, 224, 224), rand(64, 64, 3, 3)
    attrs = {"pads": [1, 1, 1, 1]}
    start = time.perf_counter()
    got = apply_op("Conv", [x, w], attrs)[0]
    elapsed = time.perf_counter() - start
    np.testing.assert_allclose(got, ort_op("Conv", [x, w], attrs)[0], rtol=1e-3, atol=1e-3)
    # Well under a second on an idle machine; the bound leaves room for a loaded
    # CI runner while still catching a slow (non-BLAS) path, which takes minutes.
    assert elapsed < 5.0, f"Conv took {elapsed:.2f}s"
