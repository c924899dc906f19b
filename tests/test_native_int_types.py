"""int16, uint16, uint32 and uint64 on the native backend: elementwise arithmetic (with
C's traps and integer promotion handled: x / 0, x % 0, MIN / -1, uint16 products),
comparisons, bitwise ops, shifts, and the layout ops that copy by element size.

Compared with onnxruntime, or onnx's reference evaluator where onnxruntime has no kernel
for the dtype, at three values of a symbolic dim; every case must run with no fallback.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from . import test_native_ops_extra
from .test_native_ops_extra import _input, _model, _output, _run_both

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

WIDE = {TensorProto.INT16: np.int16, TensorProto.UINT16: np.uint16,
        TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}
UNSIGNED = (TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64)
SIZES = (1, 4, 9)


def _values(rng, dtype, shape, nonzero=False):
    info = np.iinfo(dtype)
    # Include the extremes: wrap-around and promotion bugs show there.
    data = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    flat = data.reshape(-1)
    if flat.size >= 2:
        flat[0], flat[-1] = info.max, info.min
    if nonzero:
        data[data == 0] = 1
    return data


def _binary_case(op, onnx_dtype, nonzero_b=False, out_dtype=None, **attrs):
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    model = _model([node], [_input("a", ["n", 3], onnx_dtype), _input("b", ["n", 3], onnx_dtype)],
                   [_output("y", out_dtype or onnx_dtype)], opset=18)
    rng = np.random.default_rng(hash((op, onnx_dtype)) % 2**32)
    dtype = WIDE[onnx_dtype]
    feeds = [{"a": _values(rng, dtype, (n, 3)), "b": _values(rng, dtype, (n, 3), nonzero_b)} for n in SIZES]
    _run_both(model, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Max", "Min"])
def test_arithmetic(op, onnx_dtype):
    _binary_case(op, onnx_dtype)


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
def test_div_truncates(onnx_dtype):
    _binary_case("Div", onnx_dtype, nonzero_b=True)


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod(onnx_dtype, fmod):
    _binary_case("Mod", onnx_dtype, nonzero_b=True, fmod=fmod)


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
def test_comparisons(op, onnx_dtype):
    _binary_case(op, onnx_dtype, out_dtype=TensorProto.BOOL)


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise(op, onnx_dtype):
    _binary_case(op, onnx_dtype)


@pytest.mark.parametrize("onnx_dtype", UNSIGNED)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_past_the_width_is_zero(onnx_dtype, direction):
    dtype = WIDE[onnx_dtype]
    bits = np.iinfo(dtype).bits
    node = helper.make_node("BitShift", ["a", "b"], ["y"], direction=direction)
    model = _model([node], [_input("a", ["n"], onnx_dtype), _input("b", ["n"], onnx_dtype)], [_output("y", onnx_dtype)])
    rng = np.random.default_rng(bits)
    feeds = [{"a": _values(rng, dtype, (n,)), "b": rng.integers(0, bits + 3, n).astype(dtype)} for n in SIZES]
    _run_both(model, feeds, rtol=0, atol=0)


def test_division_traps_are_defined():
    """MIN / -1 wraps and MIN % -1 is 0, and x / 0 and x % 0 are an error naming the node (as
    onnxruntime refuses them), instead of trapping."""
    import shapeshift
    from shapeshift.errors import ExecutionError

    nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"])]
    model = _model(nodes, [_input("a", ["n"], TensorProto.INT16), _input("b", ["n"], TensorProto.INT16)],
                   [_output("q", TensorProto.INT16), _output("r", TensorProto.INT16)])
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    a = np.array([7, -32768, 5, -7], dtype=np.int16)
    b = np.array([3, -1, -2, 2], dtype=np.int16)
    q, r = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(q, np.array([2, -32768, -2, -3], dtype=np.int16))
    np.testing.assert_array_equal(r, np.array([1, 0, -1, 1], dtype=np.int16))
    b[2] = 0
    with pytest.raises(ExecutionError, match="integer division by zero"):
        session.run(None, {"a": a, "b": b})


@pytest.mark.parametrize("onnx_dtype", list(WIDE))
def test_layout_ops_copy_any_width(onnx_dtype):
    nodes = [helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=1),
             helper.make_node("Where", ["m", "a", "b"], ["w"])]
    model = _model(nodes, [_input("a", ["n", 3], onnx_dtype), _input("b", ["n", 3], onnx_dtype),
                           _input("m", ["n", 3], TensorProto.BOOL)],
                   [_output("c", onnx_dtype), _output("w", onnx_dtype)])
    rng = np.random.default_rng(5)
    dtype = WIDE[onnx_dtype]
    feeds = [{"a": _values(rng, dtype, (n, 3)), "b": _values(rng, dtype, (n, 3)),
              "m": rng.integers(0, 2, (n, 3)).astype(bool)} for n in SIZES]
    _run_both(model, feeds, rtol=0, atol=0)
