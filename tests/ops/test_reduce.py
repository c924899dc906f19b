"""Tests of the reductions: symbolic type rules, contents tracking, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.graph import Graph
from shapeshift.ir.types import BOOL, FLOAT, INT64, TensorType, tensor_type_of
from shapeshift.ops import lookup
from shapeshift.ops.context import InferContext
from shapeshift.symbolic import Expr, bounds, mul, symbol
from shapeshift.testing import apply_op, infer_op, ort_op

B = symbol("batch", 1, 64)
T = symbol("seq", 1, 512)

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def i64(*shape) -> TensorType:
    return TensorType(INT64, shape)


def axes(*values) -> np.ndarray:
    return np.array(values, np.int64)


def _axes_are_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)


def reduce_call(op: str, data, axis_list, opset: int, **attrs):
    """Inputs and attrs of a Reduce node in the form its opset wants."""
    if axis_list is None:
        return [data], attrs
    if _axes_are_input(op, opset):
        return [data, axes(*axis_list)], attrs
    return [data], {**attrs, "axes": list(axis_list)}


# -- type rules ----------------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axis_list, keepdims, expected", [
    ([-1], 1, (B, T, 1)),
    ([-1], 0, (B, T)),
    ([0, 2], 0, (T,)),
    ([1], 1, (B, 1, 768)),
    (None, 1, (1, 1, 1)),
    (None, 0, ()),
])
def test_reduce_type_on_symbolic_dims(op, opset, axis_list, keepdims, expected):
    inputs, attrs = reduce_call(op, f32(B, T, 768), axis_list, opset, keepdims=keepdims)
    consts = [1] if len(inputs) > 1 else []
    assert infer_op(op, inputs, attrs, opset, const_inputs=consts) == [f32(*expected)]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_noop_with_empty_axes_keeps_the_shape(op):
    inputs = [f32(B, T, 768), axes()]
    out = infer_op(op, inputs, {"noop_with_empty_axes": 1, "keepdims": 0}, 18, const_inputs=[1])
    assert out == [f32(B, T, 768)]
    # An omitted axes input counts as empty too.
    assert infer_op(op, [f32(B, T, 768)], {"noop_with_empty_axes": 1}, 18) == [f32(B, T, 768)]
    # Before axes became an input the attribute does not exist: all axes are reduced.
    assert infer_op(op, [f32(B, T, 768)], {"noop_with_empty_axes": 1}, 11) == [f32(1, 1, 1)]


def test_unknown_rank_degrades():
    for op, opset in [("ReduceSum", 13), ("ReduceMean", 11), ("ReduceMax", 18)]:
        inputs, attrs = reduce_call(op, TensorType(FLOAT), [1], opset)
        assert infer_op(op, inputs, attrs, opset, const_inputs=[1] if len(inputs) > 1 else []) == [
            TensorType(FLOAT)]
    assert infer_op("ArgMax", [TensorType(FLOAT)], {"axis": 1}, 13) == [TensorType(INT64)]


def test_unknown_axes_keep_the_rank_with_bounded_dims():
    (out,) = infer_op("ReduceSum", [f32(B, 1, 768), i64(1)], {"keepdims": 1}, 13)
    assert len(out.shape) == 3 and out.shape[1] == 1
    assert all(isinstance(d, Expr) for d in (out.shape[0], out.shape[2]))
    assert bounds(out.shape[0]) == (1, 64) and bounds(out.shape[2]) == (1, 768)


def test_unknown_axes_without_keepdims_drop_as_many_dims_as_axes():
    (out,) = infer_op("ReduceMean", [f32(B, T, 768), i64(2)], {"keepdims": 0}, 18)
    assert len(out.shape) == 1 and isinstance(out.shape[0], Expr)
    # Unknown number of axes: the rank is unknown too.
    (out,) = infer_op("ReduceMean", [f32(B, T, 768), i64(T)], {"keepdims": 0}, 18)
    assert out == TensorType(FLOAT)


@pytest.mark.parametrize("op, attrs, expected", [
    ("ArgMax", {"axis": -1, "keepdims": 0}, i64(B, T)),
    ("ArgMax", {"axis": -1}, i64(B, T, 1)),
    ("ArgMin", {"keepdims": 0}, i64(T, 50)),
    ("ArgMin", {"axis": 1, "select_last_index": 1}, i64(B, 1, 50)),
])
def test_arg_type(op, attrs, expected):
    assert infer_op(op, [f32(B, T, 50)], attrs, 13) == [expected]


def test_bool_reduce_max_keeps_bool():
    inputs = [TensorType(BOOL, (B, 4)), axes(1)]
    assert infer_op("ReduceMax", inputs, {}, 20, const_inputs=[1]) == [TensorType(BOOL, (B, 1))]


@pytest.mark.parametrize("op, inputs, attrs, opset", [
    ("ReduceSum", [f32(B, T), axes(2)], {}, 13),
    ("ReduceMean", [f32(B, T)], {"axes": [-3]}, 11),
    ("ArgMax", [f32(B, T)], {"axis": 2}, 13),
    ("ArgMin", [f32()], {}, 13),
])
def test_invalid_axes_fail_with_a_clear_error(op, inputs, attrs, opset):
    consts = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray)]
    with pytest.raises(ShapeInferenceError, match="node"):
        infer_op(op, inputs, attrs, opset, const_inputs=consts)


# -- contents tracking ---------------------------------------------------------------


def _infer_on_shape_tensor(op, contents, opset, attrs, with_axes=None):
    """Run the rule on an int64 vector whose contents are known only as dims."""
    graph = Graph("g", opset={"": opset})
    shape = graph.add_input("shape", i64(len(contents)))
    shape.shape_contents = tuple(contents)
    inputs = [shape]
    if with_axes is not None:
        inputs.append(graph.add_initializer("axes", axes(*with_axes)))
    node = graph.add_node(op, inputs, 1, attrs, name="reduce")
    ctx = InferContext(node, opset, graph.symbols)
    return lookup("", op, opset).infer(ctx), ctx.output_contents


def test_reduce_prod_of_a_shape_is_the_symbolic_element_count():
    types, contents = _infer_on_shape_tensor("ReduceProd", (B, T, 64), 13, {"keepdims": 0})
    assert types == [i64()]
    assert contents[0] == (mul(mul(B, T), 64),)


def test_reduce_sum_of_a_shape_with_keepdims_and_axes_input():
    types, contents = _infer_on_shape_tensor("ReduceSum", (B, T, 3), 13, {"keepdims": 1}, with_axes=[0])
    assert types == [i64(1)]
    assert contents[0] == (B + T + 3,)


def test_reduce_of_a_static_constant_vector_records_its_value():
    x = np.array([2, 3, 7], np.int64)
    graph = Graph("g", opset={"": 18})
    node = graph.add_node("ReduceProd", [graph.add_initializer("x", x)], 1, {"keepdims": 0}, name="p")
    ctx = InferContext(node, 18, graph.symbols)
    lookup("", "ReduceProd", 18).infer(ctx)
    assert ctx.output_contents[0] == (42,)


def test_reduce_max_of_a_shape_records_nothing():
    _, contents = _infer_on_shape_tensor("ReduceMax", (B, T), 18, {"keepdims": 0})
    assert contents == {}


# -- numerics against onnxruntime ------------------------------------------------------

RNG = np.random.default_rng(0)
SHAPES_AXES = [((5,), [0]), ((3, 4), [1]), ((3, 4), None), ((2, 3, 4), [0, -1]), ((2, 3, 4), [1]),
               ((2, 0, 3), [1]), ((2, 0, 3), [2])]


def _random(shape, dtype) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-4, 5, size=shape).astype(dtype)
    # Positive data keeps ReduceLogSum out of NaN territory.
    return (RNG.random(shape) * 2 + 0.1).astype(dtype)


def _assert_matches_ort(op, inputs, attrs, opset):
    ours = apply_op(op, inputs, attrs, opset)
    ref = ort_op(op, inputs, attrs, opset)
    for got, want in zip(ours, ref):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)
    consts = list(range(1, len(inputs)))
    assert infer_op(op, inputs, attrs, opset, const_inputs=consts) == [tensor_type_of(x) for x in ours]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_matches_ort(op, opset, keepdims, dtype):
    for shape, axis_list in SHAPES_AXES:
        inputs, attrs = reduce_call(op, _random(shape, dtype), axis_list, opset, keepdims=keepdims)
        _assert_matches_ort(op, inputs, attrs, opset)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_reduce_matches_ort(op, dtype):
    x = _random((3, 5), dtype)
    for axis_list in ([1], [0], None):
        inputs, attrs = reduce_call(op, x, axis_list, 18, keepdims=0)
        _assert_matches_ort(op, inputs, attrs, 18)


def test_integer_mean_rounds_toward_zero():
    x = np.array([[-7, -3, 0], [2, -1, 9]], np.int32)
    _assert_matches_ort("ReduceMean", [x, axes(1)], {"keepdims": 0}, 18)
    assert apply_op("ReduceMean", [x, axes(1)], {"keepdims": 0}, 18)[0].tolist() == [-3, 3]


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes_matches_ort(op):
    x = _random((2, 3), np.float32)
    _assert_matches_ort(op, [x, axes()], {"noop_with_empty_axes": 1}, 18)


@pytest.mark.parametrize("op, expected", [
    ("ReduceMax", -np.inf), ("ReduceMin", np.inf), ("ReduceProd", 1.0), ("ReduceSum", 0.0),
    ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf), ("ReduceL2", 0.0),
])
def test_empty_set_gives_the_identity(op, expected):
    (out,) = apply_op(op, [np.zeros((2, 0), np.float32), axes(1)], {"keepdims": 0}, 18)
    assert out.dtype == np.float32 and out.tolist() == [expected, expected]


def test_empty_set_integer_extremes():
    x = np.zeros((0, 3), np.int32)
    assert apply_op("ReduceMax", [x, axes(0)], {}, 18)[0].tolist() == [[np.iinfo(np.int32).min] * 3]
    assert apply_op("ReduceMin", [x, axes(0)], {}, 18)[0].tolist() == [[np.iinfo(np.int32).max] * 3]


def test_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], np.float32)
    (out,) = apply_op("ReduceLogSumExp", [x, axes(1)], {"keepdims": 0}, 18)
    np.testing.assert_allclose(out, [1000.0 + np.log(2.0), -np.inf])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2"])
def test_float16_accumulates_like_ort(op):
    x = RNG.standard_normal((4, 3000)).astype(np.float16)
    (ours,) = apply_op(op, [x, axes(1)], {"keepdims": 0}, 18)
    (ref,) = ort_op(op, [x, axes(1)], {"keepdims": 0}, 18)
    assert ours.dtype == np.float16
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_arg_matches_ort(op, select_last_index, keepdims, dtype):
    # Few distinct values, so ties are common and select_last_index matters.
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(dtype)
    for axis in (0, 1, -1):
        attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": select_last_index}
        _assert_matches_ort(op, [x], attrs, 13)
