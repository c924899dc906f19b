"""Tests of the indexing ops: type rules on symbolic shapes, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.graph import Graph
from shapeshift.ir.types import FLOAT, INT64, TensorType, tensor_type_of
from shapeshift.ops import lookup
from shapeshift.ops.context import InferContext
from shapeshift.symbolic import Expr, bounds, mul, symbol
from shapeshift.testing import apply_op, infer_op, ort_op

B = symbol("batch", 1, 64)
T = symbol("seq", 1, 512)
V = symbol("vocab", 1, 50000)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def i64(*shape) -> TensorType:
    return TensorType(INT64, shape)


# -- type rules ----------------------------------------------------------------------

# (op, inputs, attrs, opset, expected output types)
STATIC_TYPE_CASES = [
    ("Gather", [f32(V, 64), i64(B, T)], {}, 17, [f32(B, T, 64)]),
    ("Gather", [f32(B, T, 12), i64()], {"axis": 1}, 17, [f32(B, 12)]),
    ("Gather", [f32(B, T, 12), i64(3)], {"axis": -1}, 13, [f32(B, T, 3)]),
    ("Gather", [TensorType(FLOAT), i64(B)], {}, 17, [TensorType(FLOAT)]),
    ("GatherElements", [f32(B, T), i64(B, 4)], {"axis": 1}, 13, [f32(B, 4)]),
    ("GatherND", [f32(B, T, 8), i64(B, 5, 1)], {"batch_dims": 1}, 13, [f32(B, 5, 8)]),
    ("GatherND", [f32(B, T, 8), i64(7, 2)], {}, 13, [f32(7, 8)]),
    ("GatherND", [f32(B, T, 8), i64(7, T)], {}, 13, [TensorType(FLOAT)]),
    ("ScatterElements", [f32(B, T), i64(B, 2), f32(B, 2)], {"axis": 1}, 18, [f32(B, T)]),
    ("ScatterND", [f32(B, T, 4), i64(3, 2), f32(3, 4)], {"reduction": "add"}, 18, [f32(B, T, 4)]),
    ("Scatter", [f32(B, 6), i64(B, 2), f32(B, 2)], {"axis": 1}, 10, [f32(B, 6)]),
    ("CumSum", [f32(B, T), np.array(1, np.int64)], {}, 14, [f32(B, T)]),
    ("ReverseSequence", [f32(T, B, 3), i64(B)], {}, 13, [f32(T, B, 3)]),
    ("TopK", [f32(B, T), np.array([5], np.int64)], {}, 17, [f32(B, 5), i64(B, 5)]),
    ("TopK", [f32(T, B)], {"k": 3, "axis": 0}, 9, [f32(3, B), i64(3, B)]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, expected", STATIC_TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(STATIC_TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, expected):
    consts = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray)]
    got = infer_op(op, inputs, attrs, opset, num_outputs=len(expected), const_inputs=consts)
    assert got == expected


def test_topk_unknown_k_gets_a_bounded_fresh_dim():
    values, indices = infer_op("TopK", [f32(B, T), i64(1)], {}, 17, num_outputs=2)
    k = values.shape[1]
    assert values.shape[0] is B and isinstance(k, Expr)
    assert indices == i64(B, k)
    assert bounds(k) == (0, 512)


def test_nonzero_count_is_fresh_and_bounded_by_size():
    (out,) = infer_op("NonZero", [f32(3, 4)], {}, 13)
    assert out.shape[0] == 2 and isinstance(out.shape[1], Expr)
    assert bounds(out.shape[1]) == (0, 12)
    (out,) = infer_op("NonZero", [f32(B, T)], {}, 13)
    assert out.dtype == INT64 and bounds(out.shape[1]) == (0, 64 * 512)


def test_nonzero_of_a_constant_is_exact():
    x = np.array([[1, 0, 2], [0, 0, 3]], np.float32)
    assert infer_op("NonZero", [x], {}, 13, const_inputs=[0]) == [i64(2, 3)]


def test_compress_count_is_fresh_unless_condition_is_constant():
    (out,) = infer_op("Compress", [f32(B, 10), TensorType(9, (10,))], {"axis": 1}, 11)
    assert out.shape[0] is B and bounds(out.shape[1]) == (0, 10)
    cond = np.array([True, False, True], bool)
    # seq may be shorter than the condition: the count is then only bounded by its trues.
    (out,) = infer_op("Compress", [f32(B, T), cond], {"axis": 1}, 11, const_inputs=[1])
    assert isinstance(out.shape[1], Expr) and bounds(out.shape[1]) == (0, 2)
    assert infer_op("Compress", [f32(B, 4), cond], {"axis": 1}, 11, const_inputs=[1]) == [f32(B, 2)]
    # Flattened, batch*4 >= 3 elements always cover the condition: the count is exact.
    (flat,) = infer_op("Compress", [f32(B, 4), cond], {}, 11, const_inputs=[1])
    assert flat.shape == (2,)


def test_unique_outputs_share_one_fresh_count():
    y, first, inverse, counts = infer_op("Unique", [f32(B, T)], {}, 11, num_outputs=4)
    (u,) = y.shape
    assert isinstance(u, Expr) and bounds(u)[1] == 64 * 512
    assert first == i64(u) and counts == i64(u)
    assert inverse == i64(mul(B, T))
    y, _, inverse, _ = infer_op("Unique", [f32(B, T, 3)], {"axis": 1}, 11, num_outputs=4)
    assert y.shape[0] is B and y.shape[2] == 3 and bounds(y.shape[1]) == (1, 512)
    assert inverse == i64(T)


@pytest.mark.parametrize("op, inputs, attrs", [
    ("Gather", [f32(B, 4), i64(2)], {"axis": 2}),
    ("GatherND", [f32(B, 4), i64(3, 3)], {}),
    ("GatherElements", [f32(B, 4), i64(B, 4, 1)], {}),
    ("TopK", [f32(B, 4), np.array([5], np.int64)], {}),
    ("ReverseSequence", [f32(B, 4), i64(4)], {"time_axis": 1, "batch_axis": 1}),
])
def test_invalid_inputs_fail_with_a_clear_error(op, inputs, attrs):
    consts = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray)]
    with pytest.raises(ShapeInferenceError, match="node"):
        infer_op(op, inputs, attrs, 17, num_outputs=2 if op == "TopK" else 1, const_inputs=consts)


def test_gather_keeps_shape_tensor_contents():
    graph = Graph("g", opset={"": 17})
    shape = graph.add_input("shape", i64(3))
    shape.shape_contents = (B, T, 64)
    picks = graph.add_initializer("picks", np.array([0, -1], np.int64))
    node = graph.add_node("Gather", [shape, picks], 1, {}, name="gather")
    ctx = InferContext(node, 17, graph.symbols)
    assert lookup("", "Gather", 17).infer(ctx) == [i64(2)]
    assert ctx.output_contents[0] == (B, 64)


# -- numerics against onnxruntime ------------------------------------------------------

RNG = np.random.default_rng(0)
SHAPES = [(5,), (3, 4), (2, 3, 4)]


def _assert_matches_ort(op, inputs, attrs=None, opset=17, num_outputs=1):
    ours = apply_op(op, inputs, attrs, opset, num_outputs)
    ref = ort_op(op, inputs, attrs, opset, num_outputs)
    for got, want in zip(ours, ref):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        np.testing.assert_array_equal(got, want)
    # The type rule on the concrete input types must predict the concrete outputs.
    _assert_types_admit(infer_op(op, inputs, attrs, opset, num_outputs,
                                 const_inputs=range(1, len(inputs))), ours)


def _assert_types_admit(types, arrays):
    """Inferred types fit the arrays: static dims exactly, data-dependent ones by their range."""
    assert len(types) == len(arrays)
    for t, a in zip(types, arrays):
        assert t.dtype == tensor_type_of(a).dtype and len(t.shape) == a.ndim, (t, a.shape)
        for dim, size in zip(t.shape, a.shape):
            if isinstance(dim, Expr):
                lo, hi = bounds(dim)
                assert lo <= size <= hi, (t, a.shape)
            else:
                assert dim == size, (t, a.shape)


def _indices(shape, dim, negative=True):
    low = -dim if negative else 0
    return RNG.integers(low, dim, size=shape).astype(np.int64)


@pytest.mark.parametrize("shape", SHAPES)
def test_gather_family_matches_ort(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    for axis in range(-len(shape), len(shape)):
        _assert_matches_ort("Gather", [x, _indices((2, 3), shape[axis])], {"axis": axis})
        small = tuple(min(d, 2) for d in shape)
        _assert_matches_ort("GatherElements", [x, _indices(small, shape[axis])], {"axis": axis})
    for m in range(1, len(shape) + 1):
        index = np.stack([_indices((3,), d) for d in shape[:m]], axis=-1)
        _assert_matches_ort("GatherND", [x, index])


def test_gather_nd_batch_dims_matches_ort():
    x = RNG.standard_normal((2, 5, 3, 4)).astype(np.float32)
    index = np.stack([_indices((2, 6), 5, negative=False), _indices((2, 6), 3, negative=False)], axis=-1)
    _assert_matches_ort("GatherND", [x, index], {"batch_dims": 1})
    index = _indices((2, 5, 2, 1), 3, negative=False)
    _assert_matches_ort("GatherND", [x, index], {"batch_dims": 2})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("shape", SHAPES)
def test_scatter_elements_matches_ort(shape, reduction):
    x = RNG.standard_normal(shape).astype(np.float32)
    axis = len(shape) - 1
    # Distinct indices along the axis, so "none" has one well-defined answer.
    index = np.argsort(RNG.random(shape), axis=axis)[..., :2].astype(np.int64)
    updates = RNG.standard_normal(index.shape).astype(np.float32)
    if reduction != "none":
        index = RNG.integers(0, shape[axis], size=index.shape).astype(np.int64)
    _assert_matches_ort("ScatterElements", [x, index, updates], {"axis": axis, "reduction": reduction}, 18)


def test_scatter_opset10_matches_ort():
    x = np.zeros((3, 5), np.float32)
    index = np.array([[1, 3], [0, 4], [2, 2]], np.int64)[:, :1]
    updates = np.array([[1.0], [2.0], [3.0]], np.float32)
    _assert_matches_ort("Scatter", [x, index, updates], {"axis": 1}, 10)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_ort(reduction):
    x = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    for m in (1, 2, 3):
        rows = RNG.permutation(4)[:3]
        index = np.stack([rows] + [RNG.integers(0, d, 3) for d in (5, 3)[:m - 1]], axis=-1).astype(np.int64)
        updates = RNG.standard_normal((3,) + x.shape[m:]).astype(np.float32)
        _assert_matches_ort("ScatterND", [x, index, updates], {"reduction": reduction}, 18)


@pytest.mark.parametrize("shape", SHAPES + [(0, 3)])
def test_nonzero_matches_ort(shape):
    x = (RNG.random(shape) > 0.5).astype(np.float32)
    ours, ref = apply_op("NonZero", [x], opset=13)[0], ort_op("NonZero", [x], opset=13)[0]
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_topk_matches_ort_with_ties(shape, largest):
    # Few distinct values: ties must come out lowest index first.
    x = RNG.integers(0, 3, size=shape).astype(np.float32)
    for axis in range(len(shape)):
        k = np.array([min(3, shape[axis])], np.int64)
        _assert_matches_ort("TopK", [x, k], {"axis": axis, "largest": largest}, 11, num_outputs=2)
    xi = RNG.integers(0, 4, size=shape).astype(np.uint8)
    _assert_matches_ort("TopK", [xi, np.array([2], np.int64)], {"largest": largest}, 11, num_outputs=2)


def test_topk_opset1_k_attribute():
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    values, indices = apply_op("TopK", [x], {"k": 2}, opset=9, num_outputs=2)
    ref_values, ref_indices = ort_op("TopK", [x], {"k": 2}, opset=9, num_outputs=2)
    np.testing.assert_array_equal(values, ref_values)
    np.testing.assert_array_equal(indices, ref_indices)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_cumsum_matches_ort(shape, exclusive, reverse):
    x = RNG.integers(-5, 5, size=shape).astype(np.int32)
    for axis in range(-len(shape), len(shape)):
        _assert_matches_ort("CumSum", [x, np.array(axis, np.int64)],
                            {"exclusive": exclusive, "reverse": reverse}, 14)
    xf = RNG.standard_normal(shape).astype(np.float32)
    ours = apply_op("CumSum", [xf, np.array(0, np.int32)], {"exclusive": exclusive, "reverse": reverse}, 14)[0]
    ref = ort_op("CumSum", [xf, np.array(0, np.int32)], {"exclusive": exclusive, "reverse": reverse}, 14)[0]
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_compress_matches_ort(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    for axis in range(len(shape)):
        cond = RNG.random(shape[axis]) > 0.4
        _assert_matches_ort("Compress", [x, cond], {"axis": axis}, 11)
    _assert_matches_ort("Compress", [x, RNG.random(x.size - 1) > 0.5], {}, 11)


@pytest.mark.parametrize("shape", [(4, 3), (5, 3, 2), (3, 4, 2)])
def test_reverse_sequence_matches_ort(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    for time_axis, batch_axis in ((0, 1), (1, 0)):
        lens = RNG.integers(1, shape[time_axis] + 1, size=shape[batch_axis]).astype(np.int64)
        _assert_matches_ort("ReverseSequence", [x, lens], {"time_axis": time_axis, "batch_axis": batch_axis}, 10)


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_unique_matches_ort(shape, sorted_):
    x = RNG.integers(0, 3, size=shape).astype(np.float32)
    _assert_matches_ort("Unique", [x], {"sorted": sorted_}, 11, num_outputs=4)
    for axis in range(len(shape)):
        ours = apply_op("Unique", [x], {"sorted": sorted_, "axis": axis}, 11, num_outputs=4)
        ref = ort_op("Unique", [x], {"sorted": sorted_, "axis": axis}, 11, num_outputs=4)
        for got, want in zip(ours, ref):
            np.testing.assert_array_equal(got, want)


def test_out_of_range_index_fails_naming_the_node():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(Exception, match="out of range"):
        apply_op("Gather", [x, np.array([3], np.int64)])


def test_nonzero_of_a_scalar_counts_it_as_a_vector_like_ort():
    x = np.asarray(np.float32(2.0))
    assert infer_op("NonZero", [TensorType(FLOAT, ())], {}, 13)[0].shape[0] == 1
    ours = apply_op("NonZero", [x], opset=13)[0]
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, ort_op("NonZero", [x], opset=13)[0])


def test_empty_axis_edge_cases_match_ort():
    empty = np.zeros((0, 3), np.float32)
    _assert_matches_ort("CumSum", [empty, np.array(0, np.int64)], {"exclusive": 1}, 14)
    _assert_matches_ort("TopK", [empty.T.copy(), np.array([0], np.int64)], {}, 11, num_outputs=2)
    _assert_matches_ort("Gather", [np.arange(5.0, dtype=np.float32), np.zeros((0, 2), np.int64)])
