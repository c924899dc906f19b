"""Tests of the shape-tensor, layout and constant-making ops.

Type rules on symbolic shapes (table-driven), contents tracking through small
graphs such as ``Reshape(x, Concat(Shape(x)[0:2], [12, 64]))``, graceful
degradation on unknown ranks and parameters, and numerics against onnxruntime.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper, numpy_helper

import shapeshift.ops.constant_ops  # noqa: F401  (registers the ops)
import shapeshift.ops.layout_ops  # noqa: F401
from shapeshift.errors import ShapeInferenceError
from shapeshift.ir import GraphBuilder
from shapeshift.ir.graph import Graph
from shapeshift.ir.types import DOUBLE, FLOAT, INT32, INT64, TensorType
from shapeshift.ops.context import InferContext
from shapeshift.ops.layout_ops import slice_extent
from shapeshift.ops.shape_ops import gather_shape_contents
from shapeshift.passes.infer_types import infer_types
from shapeshift.symbolic import Expr, ceildiv, evaluate, floordiv, maximum, minimum, symbol
from shapeshift.testing import apply_op, infer_op, ort_op

B = symbol("batch", 1, 64)
T = symbol("seq", 1, 512)
H = symbol("height", 1, 1024)
W = symbol("width", 1, 1024)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


def i64(*shape) -> TensorType:
    return TensorType(INT64, shape)


def ints(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _infer(op, inputs, attrs=None, opset=17, num_outputs=1):
    """infer_op with every array input known as a constant."""
    consts = [i for i, x in enumerate(inputs) if isinstance(x, np.ndarray)]
    return infer_op(op, inputs, attrs, opset, num_outputs, const_inputs=consts)


# -- type rules on symbolic shapes -------------------------------------------------------

# (op, inputs, attrs, opset, expected output types)
TYPE_CASES = [
    ("Shape", [f32(B, T, 768)], {}, 17, [i64(3)]),
    ("Shape", [f32(B, T, 768)], {"start": -2}, 15, [i64(2)]),
    ("Shape", [f32(B, T, 768)], {"start": 2, "end": 1}, 15, [i64(0)]),
    ("Size", [f32(B, T)], {}, 13, [i64()]),
    ("Reshape", [f32(B, T, 768), ints(0, -1)], {}, 14, [f32(B, 768 * T)]),
    ("Reshape", [f32(B, T, 12, 64), ints(0, 0, -1)], {}, 14, [f32(B, T, 768)]),
    ("Reshape", [f32(B, T, 768), ints(-1, 64)], {}, 13, [f32(12 * B * T, 64)]),
    ("Reshape", [f32(B, 2, 6), ints(-1, 4)], {}, 13, [f32(3 * B, 4)]),
    ("Reshape", [f32(B, T, 768), ints(-1, 2, 384)], {}, 13, [f32(B * T, 2, 384)]),
    ("Reshape", [f32(0, 3), ints(3, 0)], {"allowzero": 1}, 14, [f32(3, 0)]),
    ("Flatten", [f32(B, T, 768)], {"axis": 2}, 13, [f32(B * T, 768)]),
    ("Flatten", [f32(B, T, 768)], {"axis": 0}, 13, [f32(1, 768 * B * T)]),
    ("Flatten", [f32(B, T, 768)], {"axis": -1}, 13, [f32(B * T, 768)]),
    ("Flatten", [f32(B, T, 768)], {"axis": 3}, 13, [f32(768 * B * T, 1)]),
    ("Squeeze", [f32(B, 1, T), ints(1)], {}, 13, [f32(B, T)]),
    ("Squeeze", [f32(B, 1, T, 1)], {"axes": [-1, 1]}, 11, [f32(B, T)]),
    ("Squeeze", [f32(3, 1, 4)], {}, 13, [f32(3, 4)]),
    ("Squeeze", [f32(B, 1, 4)], {}, 13, [TensorType(FLOAT)]),  # B may be 1: rank unknown
    ("Squeeze", [f32(symbol("wide", 2, 9), 1)], {}, 13, [f32(symbol("wide", 2, 9))]),
    ("Unsqueeze", [f32(B, T), ints(0, -1)], {}, 13, [f32(1, B, T, 1)]),
    ("Unsqueeze", [f32(B, T)], {"axes": [1]}, 11, [f32(B, 1, T)]),
    ("Unsqueeze", [i64(), ints(0)], {}, 13, [i64(1)]),
    ("Transpose", [f32(B, T, 64)], {"perm": [0, 2, 1]}, 13, [f32(B, 64, T)]),
    ("Transpose", [f32(B, T, 64)], {}, 13, [f32(64, T, B)]),
    ("Concat", [f32(B, T), f32(B, 3)], {"axis": 1}, 13, [f32(B, T + 3)]),
    ("Concat", [f32(B, T), f32(2, T)], {"axis": 0}, 13, [f32(B + 2, T)]),
    ("Concat", [f32(B, T), f32(B, 4)], {"axis": 0}, 13, [f32(2 * B, 4)]),  # a static size wins
    ("Split", [f32(B, 768)], {"axis": 1}, 13, [f32(B, 256)] * 3),
    ("Split", [f32(B, 4 * T)], {"axis": -1}, 11, [f32(B, T)] * 4),
    ("Split", [f32(B, 10), ints(3, 7)], {"axis": 1}, 13, [f32(B, 3), f32(B, 7)]),
    ("Split", [f32(B, 10)], {"axis": 1, "split": [4, 6]}, 11, [f32(B, 4), f32(B, 6)]),
    ("Split", [f32(7, B)], {"num_outputs": 3}, 18, [f32(3, B), f32(3, B), f32(1, B)]),
    ("Split", [f32(T, 2)], {"num_outputs": 2}, 18,
     [f32(floordiv(T + 1, 2), 2), f32(T - floordiv(T + 1, 2), 2)]),
    ("Slice", [f32(T, 768), ints(0), ints(2), ints(0)], {}, 13, [f32(minimum(2, T), 768)]),
    ("Slice", [f32(T, 768), ints(1), ints(INT64_MAX), ints(0)], {}, 13, [f32(T - 1, 768)]),
    ("Slice", [f32(T, 768), ints(-1), ints(INT64_MAX), ints(0)], {}, 13, [f32(1, 768)]),
    ("Slice", [f32(T, 768), ints(0), ints(-1), ints(0)], {}, 13, [f32(T - 1, 768)]),
    ("Slice", [f32(T, 768), ints(-1), ints(INT64_MIN), ints(0), ints(-1)], {}, 13, [f32(T, 768)]),
    ("Slice", [f32(T, 768), ints(0, 0), ints(INT64_MAX, 10), ints(0, 1), ints(2, 3)], {}, 13,
     [f32(floordiv(T + 1, 2), 4)]),
    ("Slice", [f32(B, T, 768), ints(0, 10), ints(INT64_MAX, 20), ints(-2, -1)], {}, 13, [f32(B, T, 10)]),
    ("Slice", [f32(T, 768)], {"starts": [1], "ends": [3], "axes": [1]}, 9, [f32(T, 2)]),
    ("Slice", [f32(T, 768)], {"starts": [5, -3], "ends": [10, 1000]}, 9,
     [f32(maximum(minimum(10, T) - minimum(5, T), 0), 3)]),
    ("Expand", [f32(1, T, 1), ints(4, 1, 64)], {}, 13, [f32(4, T, 64)]),
    ("Expand", [f32(B, T, 1), ints(64)], {}, 13, [f32(B, T, 64)]),
    ("Expand", [f32(3, 1), ints(2, 1, 6)], {}, 8, [f32(2, 3, 6)]),
    ("Tile", [f32(B, 2), ints(1, 3)], {}, 13, [f32(B, 6)]),
    ("Tile", [f32(B, T), ints(2, 1)], {}, 13, [f32(2 * B, T)]),
    ("Pad", [f32(B, T), ints(0, 1, 0, 2)], {}, 13, [f32(B, T + 3)]),
    ("Pad", [f32(B, 3, H, W), ints(1, 1, 1, 1), None, ints(2, 3)], {"mode": "reflect"}, 18,
     [f32(B, 3, H + 2, W + 2)]),
    ("Pad", [f32(B, 5)], {"pads": [0, -1, 0, -2], "mode": "constant"}, 10, [f32(B, 2)]),
    ("ConstantOfShape", [ints(2, 3)], {}, 13, [f32(2, 3)]),
    ("ConstantOfShape", [ints()], {"value": np.array([7], np.int32)}, 13, [TensorType(INT32, ())]),
    ("Range", [ints(0).reshape(()), ints(10).reshape(()), ints(3).reshape(())], {}, 13, [i64(4)]),
    ("Range", [np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.3, np.float32)], {}, 13,
     [f32(4)]),
    ("Range", [ints(5).reshape(()), ints(1).reshape(()), ints(-2).reshape(())], {}, 13, [i64(2)]),
    ("Range", [ints(5).reshape(()), ints(9).reshape(()), ints(-1).reshape(())], {}, 13, [i64(0)]),
    ("OneHot", [i64(B, T), ints(10).reshape(()), np.array([0, 1], np.float32)], {}, 11, [f32(B, T, 10)]),
    ("OneHot", [i64(B, T), np.array(5.0, np.float32), ints(0, 1)], {"axis": 0}, 11, [i64(5, B, T)]),
    ("Trilu", [f32(B, T, T), ints(1).reshape(())], {"upper": 0}, 14, [f32(B, T, T)]),
    ("DepthToSpace", [f32(B, 16, H, W)], {"blocksize": 2}, 13, [f32(B, 4, 2 * H, 2 * W)]),
    ("DepthToSpace", [f32(B, 8 * T, H, W)], {"blocksize": 2, "mode": "CRD"}, 13,
     [f32(B, 2 * T, 2 * H, 2 * W)]),
    ("SpaceToDepth", [f32(B, 3, 2 * H, 2 * W)], {"blocksize": 2}, 13, [f32(B, 12, H, W)]),
    ("EyeLike", [f32(T, 5)], {"dtype": INT32}, 9, [TensorType(INT32, (T, 5))]),
    ("Constant", [], {"value_ints": [1, 2, 3]}, 13, [i64(3)]),
    ("Constant", [], {"value_float": 0.5}, 13, [f32()]),
    ("Constant", [], {"value": np.zeros((2, 3), np.int32)}, 13, [TensorType(INT32, (2, 3))]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, expected", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, expected):
    assert _infer(op, inputs, attrs, opset, num_outputs=len(expected)) == expected


# -- degrading on unknown ranks and parameters ---------------------------------------------

UNKNOWN = TensorType(FLOAT)

# (op, inputs, attrs, opset, expected rank or None for unknown rank)
DEGRADE_CASES = [
    ("Reshape", [UNKNOWN, ints(0, -1)], {}, 13, 2),
    ("Reshape", [f32(B, T), i64(3)], {}, 13, 3),           # unknown shape, known length
    ("Reshape", [f32(B, T), i64(T)], {}, 13, None),        # unknown length too
    ("Flatten", [UNKNOWN], {"axis": 1}, 13, 2),
    ("Squeeze", [UNKNOWN, ints(0)], {}, 13, None),
    ("Squeeze", [f32(B, 1, 1), i64(2)], {}, 13, 1),
    ("Unsqueeze", [UNKNOWN, ints(0)], {}, 13, None),
    ("Unsqueeze", [f32(B, T), i64(2)], {}, 13, 4),
    ("Transpose", [UNKNOWN], {"perm": [1, 0]}, 13, 2),
    ("Transpose", [UNKNOWN], {}, 13, None),
    ("Concat", [UNKNOWN, f32(B, 3)], {"axis": 1}, 13, 2),
    ("Concat", [UNKNOWN, UNKNOWN], {"axis": 1}, 13, None),
    ("Slice", [UNKNOWN, ints(0), ints(1)], {}, 13, None),
    ("Slice", [f32(B, T, 4), i64(2), i64(2)], {}, 13, 3),
    ("Slice", [f32(B, T, 4), i64(1), i64(1), ints(1)], {}, 13, 3),
    ("Expand", [UNKNOWN, ints(2, 3)], {}, 13, None),
    ("Expand", [f32(B, 1), i64(3)], {}, 13, 3),
    ("Tile", [f32(B, T), i64(2)], {}, 13, 2),
    ("Pad", [UNKNOWN, ints(0, 0)], {}, 13, None),
    ("Pad", [f32(B, T), i64(4)], {}, 13, 2),
    ("ConstantOfShape", [i64(3)], {}, 13, 3),
    ("ConstantOfShape", [i64(T)], {}, 13, None),
    ("Range", [i64(), i64(), i64()], {}, 13, 1),
    ("OneHot", [UNKNOWN, ints(3).reshape(()), ints(0, 1)], {}, 11, None),
    ("OneHot", [i64(B), i64(), ints(0, 1)], {}, 11, 2),
    ("DepthToSpace", [UNKNOWN], {"blocksize": 2}, 13, 4),
    ("EyeLike", [UNKNOWN], {}, 13, 2),
    ("Trilu", [UNKNOWN], {}, 14, None),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, rank", DEGRADE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(DEGRADE_CASES)])
def test_type_rule_degrades(op, inputs, attrs, opset, rank):
    (out,) = _infer(op, inputs, attrs, opset)
    assert isinstance(out, TensorType)
    assert out.rank == rank
    if rank is not None and op not in ("Concat", "Expand", "Slice", "Tile", "Pad", "OneHot"):
        # Nothing is known of the dims: each one is a distinct fresh symbol.
        assert all(isinstance(d, Expr) for d in out.shape)
        assert len({id(d) for d in out.shape}) == rank


def test_unknown_parameters_keep_the_dims_they_do_not_touch():
    (out,) = infer_op("Slice", [f32(B, T, 4), ints(0), i64(1), ints(1)], opset=13, const_inputs=[1, 3])
    assert out.shape[0] is B and out.shape[2] == 4 and isinstance(out.shape[1], Expr)
    (out,) = infer_op("Pad", [f32(B, T, 4), i64(2), None, ints(-1)], opset=18, const_inputs=[3])
    assert out.shape[:2] == (B, T) and isinstance(out.shape[2], Expr)
    (out,) = infer_op("Concat", [f32(B, 3), UNKNOWN], {"axis": 1}, 13)
    assert out.shape[0] is B and isinstance(out.shape[1], Expr)
    (out,) = infer_op("Shape", [UNKNOWN], opset=13)
    assert out.dtype == INT64 and out.rank == 1 and isinstance(out.shape[0], Expr)


def test_symbolic_shape_entries_are_used_when_provably_positive():
    graph = Graph("g", opset={"": 13})
    x = graph.add_input("x", f32(B, T, 768))
    target = graph.add_input("target", i64(3))
    target.shape_contents = (B, 2 * T, 384)
    node = graph.add_node("Reshape", [x, target], 1, {}, name="reshape")
    from shapeshift.ops import lookup
    assert lookup("", "Reshape", 13).infer(InferContext(node, 13, graph.symbols)) == [f32(B, 2 * T, 384)]
    target.shape_contents = (B, -1, 2 * T)
    # -1 = (B * T * 768) // (B * 2 * T), exactly: the symbols cancel.
    assert lookup("", "Reshape", 13).infer(InferContext(node, 13, graph.symbols)) == [f32(B, 384, 2 * T)]
    node = graph.add_node("Expand", [graph.add_input("y", f32(1, T, 1)), target], 1, {}, name="expand")
    target.shape_contents = (B, 1, 64)
    assert lookup("", "Expand", 13).infer(InferContext(node, 13, graph.symbols)) == [f32(B, T, 64)]


INVALID_CASES = [
    ("Reshape", [f32(2, 3), ints(4, -1)], {}, 13),
    ("Reshape", [f32(2, 3), ints(5)], {}, 13),
    ("Reshape", [f32(B, 3), ints(-1, -1)], {}, 13),
    ("Squeeze", [f32(B, 3), ints(1)], {}, 13),
    ("Unsqueeze", [f32(B, 3), ints(0, 0)], {}, 13),
    ("Unsqueeze", [f32(B, 3), ints(5)], {}, 13),
    ("Transpose", [f32(B, 3)], {"perm": [0, 0]}, 13),
    ("Concat", [f32(B, 3), f32(B, 4)], {"axis": 0}, 13),
    ("Concat", [f32(B, 3), f32(B)], {"axis": 0}, 13),
    ("Split", [f32(B, 9)], {"axis": 1}, 13),
    ("Split", [f32(B, 10), ints(3, 3)], {"axis": 1}, 13),
    ("Slice", [f32(B, 3), ints(0), ints(1), ints(0), ints(0)], {}, 13),
    ("Slice", [f32(B, 3), ints(0, 0), ints(1, 1), ints(1, -1)], {}, 13),
    ("Expand", [f32(B, 3), ints(4)], {}, 13),
    ("Tile", [f32(B, 3), ints(2)], {}, 13),
    ("Pad", [f32(B, 3), ints(0, -2, 0, -2)], {}, 13),
    ("DepthToSpace", [f32(B, 6, H, W)], {"blocksize": 2}, 13),
    ("SpaceToDepth", [f32(B, 6, 5, W)], {"blocksize": 2}, 13),
    ("Flatten", [f32(B, 3)], {"axis": 3}, 13),
    ("ConstantOfShape", [ints(2, -1)], {}, 13),
    ("Range", [ints(0).reshape(()), ints(4).reshape(()), ints(0).reshape(())], {}, 13),
]


@pytest.mark.parametrize("op, inputs, attrs, opset", INVALID_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(INVALID_CASES)])
def test_invalid_inputs_fail_with_a_clear_error(op, inputs, attrs, opset):
    num_outputs = 2 if op == "Split" else 1
    with pytest.raises(ShapeInferenceError, match="node"):
        _infer(op, inputs, attrs, opset, num_outputs)


def test_symbolic_slice_extent_agrees_with_concrete_slicing():
    # Every (start, end, step) on a symbolic axis, evaluated at each size, must
    # give the length the evaluator (checked against onnxruntime below) gives.
    n_sym = symbol("n", 1, 8)
    for start, end, step in itertools.product([-9, -3, -1, 0, 1, 2, 5, 9], [-9, -2, -1, 0, 1, 3, 9],
                                              [-3, -1, 1, 2]):
        extent = slice_extent(start, end, step, n_sym)
        assert extent is not None
        for n in (1, 2, 3, 5, 8):
            (sliced,) = apply_op("Slice", [np.zeros(n, np.float32), ints(start), ints(end), ints(0), ints(step)],
                                 opset=13)
            assert evaluate(extent, {"n": n}) == sliced.shape[0], (start, end, step, n)


# -- contents tracking ----------------------------------------------------------------------


def _builder(opset=17) -> GraphBuilder:
    return GraphBuilder(opset=opset, dynamic={"B": (1, 8), "T": (1, 512)})


def test_reshape_to_concat_of_sliced_shape_is_static():
    b = _builder()
    x = b.input("x", "float32", ("B", "T", 768))
    shape = b.Shape(x)
    head = b.Slice(shape, ints(0), ints(2))
    target = b.Concat(head, ints(12, 64), axis=0)
    y = b.Reshape(x, target)
    b.output(y)
    infer_types(b.build())
    B_, T_ = b.symbol("B"), b.symbol("T")
    assert shape.shape_contents == (B_, T_, 768)
    assert target.type == i64(4) and target.shape_contents == (B_, T_, 12, 64)
    assert y.type == f32(B_, T_, 12, 64)


def test_gathered_dims_rebuild_a_shape():
    b = _builder(opset=13)
    x = b.input("x", "float32", ("B", "T", 768))
    shape = b.Shape(x)
    batch = b.Gather(shape, np.array(0, np.int64), axis=0)
    seq = b.Gather(shape, np.array(-2, np.int64), axis=0)
    parts = [b.Unsqueeze(v, ints(0)) for v in (batch, seq)]
    target = b.Concat(parts[0], parts[1], ints(-1, 64), axis=0)
    y = b.Reshape(x, target)
    merged = b.Reshape(y, b.Concat(parts[0], ints(-1), axis=0))
    b.output(y, merged)
    infer_types(b.build())
    B_, T_ = b.symbol("B"), b.symbol("T")
    assert parts[1].type == i64(1) and parts[1].shape_contents == (T_,)
    assert y.type == f32(B_, T_, 12, 64)
    assert merged.type == f32(B_, 768 * T_)


def test_contents_through_size_range_expand_tile_and_constants():
    b = _builder()
    x = b.input("x", "float32", ("B", "T"))
    size = b.Size(x)
    positions = b.Range(np.array(0, np.int64), b.Squeeze(b.Slice(b.Shape(x), ints(1), ints(2)), ints(0)),
                        np.array(1, np.int64))
    ones = b.ConstantOfShape(ints(3), value=np.array([1], np.int64))
    expanded = b.Expand(np.array([5], np.int64), ints(3))
    tiled = b.Tile(ints(1, 2), ints(2))
    const = b.Constant(value_ints=[4, 5, 6])
    picked = b.Slice(const, ints(-1), ints(INT64_MIN), ints(0), ints(-2))
    small_range = b.Range(np.array(2, np.int64), np.array(9, np.int64), np.array(3, np.int64))
    split = b.Split(const, ints(1, 2), outputs=2, axis=0)
    flat = b.Flatten(b.Unsqueeze(const, ints(0)), axis=0)
    b.output(size, positions, ones, expanded, tiled, picked, small_range, *split, flat)
    infer_types(b.build())
    B_, T_ = b.symbol("B"), b.symbol("T")
    assert size.type == i64() and size.shape_contents == (B_ * T_,)
    assert positions.type == i64(T_)
    assert ones.shape_contents == (1, 1, 1)
    assert expanded.shape_contents == (5, 5, 5)
    assert tiled.type == i64(4) and tiled.shape_contents == (1, 2, 1, 2)
    assert picked.type == i64(2) and picked.shape_contents == (6, 4)
    assert small_range.type == i64(3) and small_range.shape_contents == (2, 5, 8)
    assert [s.shape_contents for s in split] == [(4,), (5, 6)]
    assert flat.type == i64(1, 3) and flat.shape_contents == (4, 5, 6)


def test_gather_shape_contents_for_the_gather_rule():
    graph = Graph("g", opset={"": 13})
    shape = graph.add_input("shape", i64(3))
    shape.shape_contents = (B, T, 64)
    picks = graph.add_initializer("picks", ints(0, -1))
    node = graph.add_node("Gather", [shape, picks], 1, {}, name="gather")
    assert gather_shape_contents(InferContext(node, 13, graph.symbols)) == (B, 64)
    out_of_range = graph.add_initializer("bad", ints(3))
    node = graph.add_node("Gather", [shape, out_of_range], 1, {}, name="gather_bad")
    assert gather_shape_contents(InferContext(node, 13, graph.symbols)) is None


# -- numerics against onnxruntime -------------------------------------------------------

RNG = np.random.default_rng(0)


def _assert_matches_ort(op, inputs, attrs=None, opset=17, num_outputs=1):
    ours = apply_op(op, inputs, attrs, opset, num_outputs)
    # onnx.helper takes tensor attributes as TensorProtos, the IR as arrays.
    proto_attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in (attrs or {}).items()}
    ref = ort_op(op, inputs, proto_attrs, opset, num_outputs)
    assert len(ours) == len(ref)
    for got, want in zip(ours, ref):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # The type rule, with every input known, predicts the outputs exactly.
    present = [i for i, x in enumerate(inputs) if x is not None]
    types = infer_op(op, inputs, attrs, opset, num_outputs, const_inputs=present)
    assert [(t.dtype, t.shape) for t in types] == [(t.dtype, tuple(a.shape)) for t, a in zip(types, ref)]


def _data(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


SHAPES = [(6,), (3, 4), (2, 3, 5), (2, 1, 4, 3)]


@pytest.mark.parametrize("shape", SHAPES)
def test_shape_and_views_match_ort(shape):
    x = _data(*shape)
    rank = len(shape)
    _assert_matches_ort("Shape", [x], opset=13)
    _assert_matches_ort("Shape", [x], {"start": -2, "end": 10}, opset=15)
    _assert_matches_ort("Size", [x])
    _assert_matches_ort("Reshape", [x, ints(-1)])
    _assert_matches_ort("Reshape", [x, ints(*shape[:1], -1)])
    for axis in range(-rank, rank + 1):
        _assert_matches_ort("Flatten", [x, ], {"axis": axis}, opset=13)
    _assert_matches_ort("Transpose", [x])
    _assert_matches_ort("Transpose", [x], {"perm": list(RNG.permutation(rank))})
    _assert_matches_ort("Unsqueeze", [x, ints(0, -1)], opset=13)
    _assert_matches_ort("Unsqueeze", [x], {"axes": [1]}, opset=11)
    _assert_matches_ort("Squeeze", [x[None], ints(0)], opset=13)
    _assert_matches_ort("Squeeze", [x], opset=13)


def test_reshape_zero_and_allowzero_match_ort():
    x = _data(2, 3, 4)
    _assert_matches_ort("Reshape", [x, ints(0, -1)], opset=13)
    _assert_matches_ort("Reshape", [x, ints(0, 0, 2, 2)], opset=14)
    empty = np.zeros((0, 3), np.float32)
    _assert_matches_ort("Reshape", [empty, ints(3, 0)], {"allowzero": 1}, opset=14)


@pytest.mark.parametrize("shape", SHAPES)
def test_concat_split_match_ort(shape):
    x = _data(*shape)
    for axis in range(-len(shape), len(shape)):
        y = _data(*shape[:axis % len(shape)], 2, *shape[axis % len(shape) + 1:])
        _assert_matches_ort("Concat", [x, y, x], {"axis": axis}, opset=13)
    axis = len(shape) - 1
    dim = shape[axis]
    _assert_matches_ort("Split", [x, ints(1, dim - 1)], {"axis": axis}, opset=13, num_outputs=2)
    _assert_matches_ort("Split", [x], {"axis": axis, "split": [dim - 1, 1]}, opset=11, num_outputs=2)
    for count in (2, 3):
        if dim >= count and -(-dim // count) * (count - 1) < dim:
            _assert_matches_ort("Split", [x], {"axis": axis, "num_outputs": count}, opset=18, num_outputs=count)
    _assert_matches_ort("Split", [x], {"axis": 0}, opset=13, num_outputs=shape[0])


SLICES = [  # (starts, ends, axes, steps) on a (4, 7, 5) input
    ([1], [3], [0], [1]),
    ([-1], [INT64_MIN], [1], [-1]),
    ([-10], [-100], [1], [-1]),
    ([10], [-100], [2], [-2]),
    ([0, 6], [INT64_MAX, 0], [2, 1], [2, -3]),
    ([-3, 2], [-1, 9], [-1, 0], [1, 1]),
    ([2], [1], [0], [1]),
    ([0, 0, 0], [-1, -1, -1], [0, 1, 2], [3, 2, 4]),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice_matches_ort(starts, ends, axes, steps):
    x = _data(4, 7, 5)
    _assert_matches_ort("Slice", [x, ints(*starts), ints(*ends), ints(*axes), ints(*steps)], opset=13)
    if all(s == 1 for s in steps):
        _assert_matches_ort("Slice", [x], {"starts": starts, "ends": ends, "axes": axes}, opset=9)


def test_slice_of_a_symbolic_axis_matches_ort_at_several_sizes():
    for seq in (1, 2, 5):
        x = _data(seq, 3)
        for starts, ends, steps in [(0, 2, 1), (1, INT64_MAX, 1), (-1, INT64_MIN, -1), (-3, -1, 1)]:
            inputs = [x, ints(starts), ints(ends), ints(0), ints(steps)]
            (want,) = ort_op("Slice", inputs, opset=13)
            (sym,) = infer_op("Slice", [f32(T, 3), *inputs[1:]], opset=13, const_inputs=[1, 2, 3, 4])
            assert evaluate(sym.shape[0], {"seq": seq}) == want.shape[0]


@pytest.mark.parametrize("shape, target", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((2, 1, 3), (1, 4, 1)),
                                           ((4,), (1,)), ((), (2, 2))])
def test_expand_matches_ort(shape, target):
    _assert_matches_ort("Expand", [_data(*shape), ints(*target)], opset=13)


@pytest.mark.parametrize("shape, repeats", [((3,), (2,)), ((2, 3), (1, 2)), ((2, 1, 3), (2, 3, 1)), ((2, 3), (0, 1))])
def test_tile_matches_ort(shape, repeats):
    _assert_matches_ort("Tile", [_data(*shape), ints(*repeats)], opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(1, 2, 2, 1), (0, 0, 0, 3), (2, -1, 1, 0), (-1, 2, 0, -2)])
def test_pad_matches_ort(mode, pads):
    x = _data(4, 5)
    _assert_matches_ort("Pad", [x, ints(*pads), np.array(1.5, np.float32)], {"mode": mode}, opset=19)
    if mode != "wrap":
        _assert_matches_ort("Pad", [x], {"mode": mode, "pads": list(pads), "value": 2.0}, opset=10)
    _assert_matches_ort("Pad", [x[None], ints(*pads), None, ints(-2, -1)], {"mode": mode}, opset=19)


def test_pad_of_ints_and_bools_matches_ort():
    _assert_matches_ort("Pad", [np.arange(6, dtype=np.int32).reshape(2, 3), ints(1, 0, 0, 2)], opset=13)
    _assert_matches_ort("Pad", [np.array([[True, False]]), ints(0, 1, 1, 0)], opset=13)


def test_constant_makers_match_ort():
    _assert_matches_ort("ConstantOfShape", [ints(2, 3)], {"value": np.array([3], np.int32)}, opset=13)
    _assert_matches_ort("ConstantOfShape", [ints(0, 3)], opset=13)
    _assert_matches_ort("ConstantOfShape", [ints()], {"value": np.array([2.5], np.float32)}, opset=13)
    for start, limit, delta in [(0, 10, 3), (10, 4, -2), (3, 3, 1), (5, 1, 1)]:
        args = [np.array(v, np.int64) for v in (start, limit, delta)]
        _assert_matches_ort("Range", args, opset=13)
        _assert_matches_ort("Range", [a.astype(np.int32) for a in args], opset=13)
    _assert_matches_ort("Range", [np.array(v, np.float32) for v in (1.0, 2.0, 0.3)], opset=13)
    _assert_matches_ort("Range", [np.array(v, np.float64) for v in (-1.0, -3.5, -0.5)], opset=13)
    _assert_matches_ort("EyeLike", [_data(3, 5)], {"k": 1}, opset=9)
    _assert_matches_ort("EyeLike", [_data(4, 2)], {"k": -1, "dtype": INT32}, opset=9)
    _assert_matches_ort("EyeLike", [np.zeros((3, 3), np.int64)], {"dtype": DOUBLE}, opset=9)


def test_constant_attributes_match_ort():
    cases = [
        {"value_ints": [1, 2, 3]}, {"value_int": 7}, {"value_floats": [0.5, 1.5]}, {"value_float": 2.0},
        {"value": np.arange(6, dtype=np.int32).reshape(2, 3)},
    ]
    for attrs in cases:
        _assert_matches_ort("Constant", [], attrs, opset=13)
    (strings,) = apply_op("Constant", [], {"value_strings": ["a", "bc"]}, opset=13)
    assert strings.dtype == object and list(strings) == ["a", "bc"]


def test_sparse_constant_is_densified():
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "v"),
                                       numpy_helper.from_array(ints(1, 4), "i"), [2, 3])
    (dense,) = apply_op("Constant", [], {"sparse_value": sparse}, opset=13)
    np.testing.assert_array_equal(dense, [[0, 5, 0], [0, 7, 0]])
    coords = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "v"),
                                       numpy_helper.from_array(ints(0, 1, 1, 1).reshape(2, 2), "i"), [2, 3])
    (dense,) = apply_op("Constant", [], {"sparse_value": coords}, opset=13)
    np.testing.assert_array_equal(dense, [[0, 5, 0], [0, 7, 0]])
    assert _infer("Constant", [], {"sparse_value": sparse}, 13) == [f32(2, 3)]


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_ort(axis):
    indices = np.array([[0, 3, -1], [9, -4, 2]], np.int64)
    values = np.array([-1.0, 5.0], np.float32)
    _assert_matches_ort("OneHot", [indices, ints(4).reshape(()), values], {"axis": axis}, opset=11)
    _assert_matches_ort("OneHot", [indices.astype(np.int32), np.array(6.0, np.float32), values],
                        {"axis": axis}, opset=11)
    _assert_matches_ort("OneHot", [indices, np.array(3, np.int64), ints(0, 1)], {"axis": axis}, opset=11)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5), (5, 3)])
def test_trilu_matches_ort(shape):
    x = _data(*shape)
    for upper, k in itertools.product((0, 1), (-1, 0, 2)):
        _assert_matches_ort("Trilu", [x, ints(k).reshape(())], {"upper": upper}, opset=14)
    _assert_matches_ort("Trilu", [x], opset=14)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_match_ort(mode):
    _assert_matches_ort("DepthToSpace", [_data(2, 8, 3, 2)], {"blocksize": 2, "mode": mode}, opset=13)
    _assert_matches_ort("SpaceToDepth", [_data(2, 3, 4, 6)], {"blocksize": 2}, opset=13)
    x = _data(1, 18, 2, 2)
    (space,) = apply_op("DepthToSpace", [x], {"blocksize": 3, "mode": mode}, opset=13)
    if mode == "DCR":  # SpaceToDepth undoes DCR DepthToSpace
        (back,) = apply_op("SpaceToDepth", [space], {"blocksize": 3}, opset=13)
        np.testing.assert_array_equal(back, x)


def test_split_uneven_num_outputs_on_symbolic_axis_matches_ort():
    for seq in (3, 5, 7):
        (*types,) = infer_op("Split", [f32(T, 2)], {"num_outputs": 3}, 18, num_outputs=3)
        ref = ort_op("Split", [_data(seq, 2)], {"num_outputs": 3}, 18, num_outputs=3)
        assert [evaluate(t.shape[0], {"seq": seq}) for t in types] == [r.shape[0] for r in ref]


def test_range_on_symbolic_limit_is_exact():
    graph = Graph("g", opset={"": 13})
    start = graph.add_initializer("start", np.array(1, np.int64))
    limit = graph.add_input("limit", i64())
    limit.shape_contents = (T,)
    delta = graph.add_initializer("delta", np.array(2, np.int64))
    node = graph.add_node("Range", [start, limit, delta], 1, {}, name="range")
    from shapeshift.ops import lookup
    (out,) = lookup("", "Range", 13).infer(InferContext(node, 13, graph.symbols))
    assert out.shape == (maximum(ceildiv(T - 1, 2), 0),)
    for seq in (1, 2, 6, 7):
        assert evaluate(out.shape[0], {"seq": seq}) == len(range(1, seq, 2))
