"""QuantizeLinear / DequantizeLinear against onnxruntime (optimizations off: with them on it
fuses DequantizeLinear -> MatMul into a dynamically quantized matmul, which is not exact),
at every opset that changed them, and their type rules against what the evaluator makes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from shapeshift.errors import ExecutionError
from shapeshift.ir.types import tensor_type_of
from shapeshift.testing import apply_op, infer_op, ort_op

RNG = np.random.default_rng(0)


def _check(op, inputs, attrs, opset):
    ours = apply_op(op, inputs, attrs, opset)
    want = ort_op(op, inputs, attrs, opset)
    for got, ref in zip(ours, want):
        assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
        np.testing.assert_array_equal(got, ref)
    types = [None if x is None else tensor_type_of(x) for x in inputs]
    assert infer_op(op, types, attrs, opset) == [tensor_type_of(x) for x in ours]


PER_TENSOR = [(np.uint8, 10), (np.int8, 10), (np.uint8, 13), (np.int8, 19), (np.uint8, 21), (np.int16, 21),
              (np.uint16, 21)]


@pytest.mark.parametrize("dtype,opset", PER_TENSOR)
def test_per_tensor_round_trip(dtype, opset):
    # Values on both sides of the range (saturation) and exact halves of the (power of two)
    # scale: round half to even.
    scale = np.array(0.25 if np.dtype(dtype).itemsize == 1 else 2.0 ** -7, np.float32)
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], np.float32) * scale
    x = np.concatenate([RNG.standard_normal(40).astype(np.float32) * 30, halves,
                        np.array([1e9, -1e9], np.float32)]).reshape(-1, 1)
    zero_point = np.array(3, dtype)
    _check("QuantizeLinear", [x, scale, zero_point], {}, opset)
    q = apply_op("QuantizeLinear", [x, scale, zero_point], {}, opset)[0]
    _check("DequantizeLinear", [q, scale, zero_point], {}, opset)


@pytest.mark.parametrize("opset", [13, 19, 21])
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_per_axis(opset, axis):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32) * 10
    n = x.shape[axis]
    scale = (RNG.random(n) + 0.05).astype(np.float32)
    zero_point = RNG.integers(-5, 5, n).astype(np.int8)
    _check("QuantizeLinear", [x, scale, zero_point], {"axis": axis}, opset)
    q = RNG.integers(-128, 127, x.shape).astype(np.int8)
    _check("DequantizeLinear", [q, scale, zero_point], {"axis": axis}, opset)


def test_without_zero_point_the_output_is_uint8_or_output_dtype():
    x = np.abs(RNG.standard_normal((2, 6)).astype(np.float32)) * 20
    scale = np.array(0.1, np.float32)
    _check("QuantizeLinear", [x, scale], {}, 13)
    _check("QuantizeLinear", [x, scale], {"output_dtype": TensorProto.INT8}, 21)


@pytest.mark.parametrize("axis", [0, 1])
def test_blocked_scales(axis):
    shape = [2, 2]
    shape[axis] = 7  # blocks of 3 along the axis: 3 + 3 + 1
    x = RNG.standard_normal(shape).astype(np.float32) * 4
    blocks = list(shape)
    blocks[axis] = 3
    scale = (RNG.random(blocks) + 0.1).astype(np.float32)
    zero_point = RNG.integers(-3, 3, blocks).astype(np.int8)
    _check("QuantizeLinear", [x, scale, zero_point], {"axis": axis, "block_size": 3}, 21)
    q = RNG.integers(-128, 127, x.shape).astype(np.int8)
    _check("DequantizeLinear", [q, scale, zero_point], {"axis": axis, "block_size": 3}, 21)


def test_int32_and_float16_scales():
    q = RNG.integers(-10**6, 10**6, 9).astype(np.int32)  # quantized biases are int32
    _check("DequantizeLinear", [q, np.array(0.001, np.float32)], {}, 13)
    q8 = RNG.integers(0, 255, (3, 3)).astype(np.uint8)
    _check("DequantizeLinear", [q8, np.array(0.5, np.float16), np.array(128, np.uint8)], {}, 19)


def test_mismatched_scales_are_clear_errors():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ExecutionError, match="per-axis scale must be 1-D with x's 4 entries along axis 1"):
        apply_op("QuantizeLinear", [x, np.ones(3, np.float32), np.zeros(3, np.int8)], {"axis": 1}, 13)
    with pytest.raises(ExecutionError, match="block_size 3 has 2 entries along axis 1, not 1"):
        apply_op("DequantizeLinear", [x.astype(np.int8), np.ones((2, 1), np.float32)], {"axis": 1, "block_size": 3}, 21)
    with pytest.raises(ExecutionError, match="DequantizeLinear input of type int64 is not supported"):
        apply_op("DequantizeLinear", [x.astype(np.int64), np.ones((), np.float32)], {}, 13)
