"""Elementwise ops and activations: type rules (symbolic shapes, unknown ranks),
tracked contents of shape computations, and numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.graph import Graph
from shapeshift.ir.types import BOOL, DOUBLE, FLOAT, FLOAT16, INT32, INT64, UINT8, TensorType
from shapeshift.ops import lookup
from shapeshift.ops.context import InferContext
from shapeshift.symbolic import floordiv, symbol
from shapeshift.testing import apply_op, assert_types_match, infer_op, ort_op

SEQ = symbol("seq", 1, 512)
BATCH = symbol("batch", 1, 64)
SIGNED = symbol("signed", -8, 8)

RNG = np.random.default_rng(1234)


def f32(*shape):
    return TensorType(FLOAT, shape)


# -- numerics against onnxruntime ---------------------------------------------------------

# onnxruntime computes some double kernels (HardSwish, Shrink) through float32.
TOLERANCE = {np.float16: (2e-3, 2e-3), np.float32: (2e-5, 2e-6), np.float64: (1e-6, 1e-9)}


def check_against_ort(op, inputs, attrs=None, opset=18, num_outputs=1):
    """The evaluator matches onnxruntime, and the type rule matches the evaluator."""
    want = ort_op(op, inputs, attrs, opset, num_outputs)
    got = apply_op(op, inputs, attrs, opset, num_outputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray), f"{op} returned a {type(g).__name__}, not an array"
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            rtol, atol = TOLERANCE[w.dtype.type]
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)
    assert_types_match(infer_op(op, inputs, attrs, opset, num_outputs), got)


def uniform(lo, hi):
    return lambda shape, dtype: RNG.uniform(lo, hi, shape).astype(dtype)


NORMAL = uniform(-4, 4)
# op -> input generator (domain of the function)
UNARY = {
    "Abs": NORMAL, "Acos": uniform(-1, 1), "Acosh": uniform(1, 5), "Asin": uniform(-1, 1),
    "Asinh": NORMAL, "Atan": NORMAL, "Atanh": uniform(-0.99, 0.99), "Cos": NORMAL,
    "Cosh": NORMAL, "Sin": NORMAL, "Sinh": NORMAL, "Tan": uniform(-1.5, 1.5), "Tanh": NORMAL,
    "Ceil": NORMAL, "Floor": NORMAL, "Round": NORMAL, "Sign": NORMAL, "Neg": NORMAL,
    "Reciprocal": uniform(0.1, 4), "Sqrt": uniform(0, 9), "Exp": NORMAL, "Log": uniform(0.01, 9),
    "Erf": NORMAL, "Relu": NORMAL, "Sigmoid": uniform(-30, 30), "Softplus": uniform(-30, 30),
    "Softsign": NORMAL, "Mish": NORMAL, "HardSwish": NORMAL, "HardSigmoid": NORMAL,
    "Elu": NORMAL, "Selu": NORMAL, "Celu": NORMAL, "LeakyRelu": NORMAL, "ThresholdedRelu": NORMAL,
    "Shrink": NORMAL,
}
# Types onnxruntime has kernels for besides float32 (at opset 18).
EXTRA_DTYPES = {
    op: (np.float16, np.float64) for op in
    ["Abs", "Cos", "Sin", "Tanh", "Ceil", "Floor", "Round", "Sign", "Neg", "Reciprocal", "Sqrt",
     "Exp", "Log", "Relu", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Sigmoid",
     "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Shrink"]
}
SHAPES = [(), (7,), (3, 4, 5)]


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_matches_onnxruntime(op):
    for dtype in (np.float32, *EXTRA_DTYPES.get(op, ())):
        for shape in SHAPES:
            check_against_ort(op, [UNARY[op](shape, dtype)])


@pytest.mark.parametrize("op, attrs, opset", [
    ("LeakyRelu", {"alpha": 0.2}, 16), ("Elu", {"alpha": 0.5}, 6), ("Selu", {"alpha": 2.0, "gamma": 3.0}, 6),
    ("Celu", {"alpha": 2.5}, 12), ("HardSigmoid", {"alpha": 0.3, "beta": 0.6}, 6),
    ("ThresholdedRelu", {"alpha": 2.0}, 10), ("Shrink", {"lambd": 1.5, "bias": 0.5}, 9),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("IsInf", {"detect_negative": 0}, 20), ("IsInf", {"detect_positive": 0}, 10),
])
def test_activation_attributes(op, attrs, opset):
    x = NORMAL((4, 6), np.float32)
    x.flat[:3] = [np.inf, -np.inf, np.nan]
    check_against_ort(op, [x], attrs, opset)


def test_integer_activations_and_float16_gelu():
    check_against_ort("Relu", [np.array([-5, 0, 7], np.int8)], opset=14)
    check_against_ort("Relu", [np.array([[-5, 3]], np.int32)], opset=14)
    (relu64,) = apply_op("Relu", [np.array([-5, 3], np.int64)], opset=14)
    assert relu64.dtype == np.int64 and relu64.tolist() == [0, 3]
    check_against_ort("Shrink", [np.array([-5, 0, 1, 2, 100], np.int32)], {"lambd": 1.5, "bias": 1.5}, 9)
    check_against_ort("Gelu", [NORMAL((5, 3), np.float16)], {}, 20)
    check_against_ort("Abs", [np.array([-5, 0, 7], np.int32)])
    check_against_ort("Sign", [np.array([-5, 0, 7], np.int64)], opset=13)
    check_against_ort("BitwiseNot", [np.array([0, 1, 255], np.uint8)], opset=18)
    check_against_ort("Not", [np.array([[True, False]])], opset=1)
    check_against_ort("IsNaN", [np.array([np.nan, 1.0], np.float16)], opset=20)


def test_prelu_broadcasts_slope_to_x():
    x = NORMAL((2, 3, 4, 5), np.float32)
    for slope_shape in [(1,), (3, 1, 1), (4, 5), (2, 3, 4, 5)]:
        check_against_ort("PRelu", [x, NORMAL(slope_shape, np.float32)], opset=16)
    check_against_ort("PRelu", [np.array([-3, 4], np.int32), np.array([2], np.int32)], opset=16)


BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (2, 3)), ((5, 1, 3), (1, 2, 1))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
def test_float_arithmetic_broadcasts_like_onnxruntime(op):
    for dtype in (np.float32, np.float64, np.float16):
        for a_shape, b_shape in BROADCAST_SHAPES:
            a = uniform(0.5, 3)(a_shape, dtype)
            b = uniform(-2, 2)(b_shape, dtype)
            check_against_ort(op, [a, b], opset=14 if op != "Pow" else 15)


def random_ints(shape, dtype, lo=-20, hi=20):
    info = np.iinfo(dtype)
    return RNG.integers(max(lo, info.min), min(hi, info.max), shape, endpoint=True).astype(dtype)


def nonzero_ints(shape, dtype):
    x = random_ints(shape, dtype, -9, 9)
    x[x == 0] = 3
    return x


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_integer_arithmetic_truncates_and_wraps_like_onnxruntime(dtype):
    for a_shape, b_shape in BROADCAST_SHAPES:
        a, b = random_ints(a_shape, dtype), nonzero_ints(b_shape, dtype)
        for op in ("Add", "Sub", "Mul", "Div"):
            check_against_ort(op, [a, b], opset=14)
        for fmod in (0, 1):
            check_against_ort("Mod", [a, b], {"fmod": fmod}, opset=13)
    # Overflow wraps around, as in C.
    extremes = np.array([np.iinfo(dtype).max, np.iinfo(dtype).min], dtype)
    step = np.array([1, -1] if np.iinfo(dtype).min < 0 else [1, 0], dtype)
    check_against_ort("Add", [extremes, step], opset=14)


def test_pow_keeps_the_base_dtype():
    int_base = np.array([2, 3, -2, 0, 5], np.int64)
    check_against_ort("Pow", [int_base, np.array([-1, 2, 3, 0, 2], np.int64)], opset=15)
    check_against_ort("Pow", [int_base.astype(np.int32), np.array([0.5, 2, 3, 1, 1.5], np.float32)], opset=15)
    check_against_ort("Pow", [np.array([2, 3, 4], np.float32), np.array([2, 3, -1], np.int64)], opset=15)
    check_against_ort("Pow", [uniform(0.1, 3)((3, 2), np.float32), np.array(0.5, np.float64)], opset=15)


def test_float_mod_and_bit_ops():
    a, b = uniform(-5, 5)((4, 3), np.float32), uniform(0.5, 2)((3,), np.float32)
    check_against_ort("Mod", [a, b], {"fmod": 1}, opset=13)
    x, s = np.array([1, 2, 255, 16], np.uint8), np.array([1, 7, 1, 4], np.uint8)
    for direction in ("LEFT", "RIGHT"):
        check_against_ort("BitShift", [x, s], {"direction": direction}, opset=11)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check_against_ort(op, [random_ints((3, 4), np.int32, -100, 100), random_ints((4,), np.int32)], opset=18)


@pytest.mark.parametrize("op, opset", [("Equal", 13), ("Greater", 13), ("Less", 13),
                                       ("GreaterOrEqual", 16), ("LessOrEqual", 16)])
def test_comparisons_give_bool(op, opset):
    for dtype in (np.float32, np.int64, np.int32, np.uint8):
        a, b = RNG.integers(0, 3, (3, 4)).astype(dtype), RNG.integers(0, 3, (4,)).astype(dtype)
        check_against_ort(op, [a, b], opset=opset)
    strings = np.array(["a", "bb", ""], dtype=object)
    check_against_ort("Equal", [strings, np.array(["a", "b", ""], dtype=object)], opset=19)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical_ops(op):
    a, b = RNG.random((3, 1, 4)) > 0.5, RNG.random((2, 1)) > 0.5
    check_against_ort(op, [a, b], opset=7)


def test_variadic_ops_broadcast_across_all_inputs():
    inputs = [NORMAL(s, np.float32) for s in [(2, 1, 3), (4, 1), (3,)]]
    for op in ("Max", "Min", "Sum", "Mean"):
        check_against_ort(op, inputs, opset=13)
        check_against_ort(op, inputs[:1], opset=13)
        check_against_ort(op, [x.astype(np.float16) for x in inputs], opset=13)
    ints = [random_ints(s, np.int32) for s in [(2, 3), (3,)]]
    check_against_ort("Max", ints, opset=13)
    check_against_ort("Min", ints + [np.array(0, np.int32)], opset=13)
    with_nan = np.array([np.nan, 1, 2], np.float32)
    check_against_ort("Max", [with_nan, np.array([0, np.nan, 3], np.float32)], opset=13)


def test_where_and_clip():
    condition = RNG.random((3, 1)) > 0.5
    check_against_ort("Where", [condition, NORMAL((3, 4), np.float32), NORMAL((4,), np.float32)], opset=16)
    check_against_ort("Where", [condition, random_ints((1, 4), np.int64), random_ints((), np.int64)], opset=16)
    x = NORMAL((3, 4), np.float32)
    check_against_ort("Clip", [x, np.array(-1, np.float32), np.array(1, np.float32)], opset=13)
    check_against_ort("Clip", [x, None, np.array(0.5, np.float32)], opset=13)
    check_against_ort("Clip", [x, np.array(0.5, np.float32)], opset=13)
    check_against_ort("Clip", [x, np.array(2, np.float32), np.array(1, np.float32)], opset=13)  # min > max
    check_against_ort("Clip", [random_ints((5,), np.int32), np.array(-3, np.int32), np.array(4, np.int32)], opset=13)
    check_against_ort("Clip", [x], {"min": -0.5, "max": 0.25}, opset=7)
    check_against_ort("Clip", [x], {"max": 0.25}, opset=7)


CAST_VALUES = np.array([0.0, -0.0, 1.5, -2.5, 0.47892547, 1e-7, 300.25, -300.0, 1 / 3], np.float32)


@pytest.mark.parametrize("to", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT8,
                                TensorProto.UINT8, TensorProto.INT64, TensorProto.BOOL, TensorProto.STRING,
                                TensorProto.FLOAT8E4M3FN])
def test_cast_from_float(to):
    x = CAST_VALUES if to not in (TensorProto.UINT8, TensorProto.INT8) else np.abs(CAST_VALUES) % 100
    got = apply_op("Cast", [x], {"to": to}, opset=19)[0]
    want = ort_op("Cast", [x], {"to": to}, opset=19)[0]
    assert got.shape == want.shape
    if to == TensorProto.STRING:
        assert got.dtype == want.dtype and list(got) == list(want)
    elif to == TensorProto.FLOAT8E4M3FN:
        # onnxruntime hands float8 back as their bit patterns.
        np.testing.assert_array_equal(got.view(np.uint8), want)
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_cast_strings_ints_and_bools():
    check_against_ort("Cast", [np.array(["1.5", "INF", "-inf", "NaN", "+Inf", "1e3", "7"], dtype=object)],
                      {"to": TensorProto.FLOAT}, opset=19)
    check_against_ort("Cast", [np.array(["12", "-3", "0"], dtype=object)], {"to": TensorProto.INT64}, opset=19)
    check_against_ort("Cast", [np.array([True, False])], {"to": TensorProto.STRING}, opset=19)
    check_against_ort("Cast", [np.array([-5, 7, 2**40], np.int64)], {"to": TensorProto.STRING}, opset=19)
    check_against_ort("Cast", [np.array([300, -1, 255], np.int32)], {"to": TensorProto.UINT8}, opset=19)
    check_against_ort("Cast", [np.array([np.nan, -1.7, 0.0], np.float32)], {"to": TensorProto.BOOL}, opset=19)
    check_against_ort("Cast", [np.array([True, False])], {"to": TensorProto.FLOAT16}, opset=19)
    check_against_ort("CastLike", [np.array([1.5, -2.5], np.float64), np.array([0], np.int32)], opset=19)
    check_against_ort("CastLike", [np.array([1, 0], np.int64), np.array([True])], opset=15)


def test_cast_saturates_float8():
    x = np.array([1e6, -1e6, np.inf, 0.3], np.float32)
    got = apply_op("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN}, opset=19)[0]
    np.testing.assert_array_equal(got.astype(np.float32), [448, -448, 448, 0.3125])
    unsaturated = apply_op("Cast", [x], {"to": TensorProto.FLOAT8E4M3FN, "saturate": 0}, opset=19)[0]
    assert np.isnan(unsaturated.astype(np.float32)[:3]).all()


def test_identity_and_dropout():
    x = NORMAL((3, 4), np.float32)
    check_against_ort("Identity", [x], opset=14)
    check_against_ort("Dropout", [x], opset=13, num_outputs=2)
    check_against_ort("Dropout", [x, np.array(0.3, np.float32)], opset=13, num_outputs=2)
    check_against_ort("Dropout", [x, np.array(0.3, np.float32), np.array(False)], opset=13, num_outputs=2)
    # Before opset 12 Dropout is inference-only; the mask (uint-typed at 7) marks what is kept.
    y, mask = apply_op("Dropout", [x], {"ratio": 0.4}, opset=7, num_outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.float32 and (mask == 1).all()


def test_training_dropout_is_seeded():
    x = np.ones((50, 40), np.float32)
    inputs = [x, np.array(0.25, np.float32), np.array(True)]
    y, mask = apply_op("Dropout", inputs, {"seed": 3}, opset=13, num_outputs=2)
    again, _ = apply_op("Dropout", inputs, {"seed": 3}, opset=13, num_outputs=2)
    np.testing.assert_array_equal(y, again)
    assert mask.dtype == np.bool_ and 0.6 < mask.mean() < 0.9
    np.testing.assert_allclose(y, np.where(mask, 1 / 0.75, 0), rtol=1e-6)


# -- type rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("a, b, expected", [
    ((SEQ, 1), (1, 768), (SEQ, 768)),
    ((BATCH, SEQ), (SEQ,), (BATCH, SEQ)),
    ((BATCH, 1, SEQ), (12, 1), (BATCH, 12, SEQ)),
    ((SEQ,), (768,), (768,)),
    ((), (BATCH, 3), (BATCH, 3)),
    ((BATCH, SEQ, 1), (SEQ, 64), (BATCH, SEQ, 64)),
])
def test_broadcast_type_rule_on_symbolic_dims(a, b, expected):
    for op in ("Add", "Mul", "Div", "Pow", "Max", "Sum"):
        assert infer_op(op, [f32(*a), f32(*b)]) == [f32(*expected)]
    assert infer_op("Equal", [TensorType(INT64, a), TensorType(INT64, b)]) == [TensorType(BOOL, expected)]


def test_broadcast_of_two_symbols_and_unknown_ranks():
    (out,) = infer_op("Add", [f32(SEQ), f32(BATCH)])
    assert out.rank == 1  # max(seq, batch): both are at least 1
    assert infer_op("Add", [TensorType(FLOAT, None), f32(SEQ)]) == [TensorType(FLOAT, None)]
    assert infer_op("Less", [TensorType(INT64, None), None]) == [TensorType(BOOL, None)]
    assert infer_op("Mul", [None, TensorType(INT32, (3,))]) == [TensorType(INT32, None)]
    assert infer_op("Relu", [TensorType(FLOAT16, None)]) == [TensorType(FLOAT16, None)]
    assert infer_op("Cast", [None], {"to": INT64}) == [TensorType(INT64, None)]


def test_incompatible_static_broadcast_fails():
    with pytest.raises(ShapeInferenceError, match="broadcast"):
        infer_op("Add", [f32(3, 4), f32(5)])
    with pytest.raises(ShapeInferenceError):
        infer_op("Where", [TensorType(BOOL, (2,)), f32(3), f32(3)], opset=16)


def test_output_dtypes():
    x = TensorType(INT32, (BATCH, SEQ))
    assert infer_op("Pow", [x, f32(1)], opset=15) == [x]
    assert infer_op("Where", [TensorType(BOOL, (SEQ, 1)), TensorType(DOUBLE, (1, 4)), TensorType(DOUBLE, ())],
                    opset=16) == [TensorType(DOUBLE, (SEQ, 4))]
    assert infer_op("IsNaN", [f32(SEQ, 2)], opset=13) == [TensorType(BOOL, (SEQ, 2))]
    assert infer_op("IsInf", [f32(SEQ)], opset=10) == [TensorType(BOOL, (SEQ,))]
    assert infer_op("Cast", [f32(BATCH, SEQ)], {"to": UINT8}) == [TensorType(UINT8, (BATCH, SEQ))]
    assert infer_op("CastLike", [f32(SEQ), TensorType(FLOAT16, (1,))]) == [TensorType(FLOAT16, (SEQ,))]
    assert infer_op("Mean", [f32(SEQ, 1), f32(4), f32(1, 1)]) == [f32(SEQ, 4)]
    assert infer_op("Clip", [f32(SEQ), f32(), f32()], opset=13) == [f32(SEQ)]
    assert infer_op("Gelu", [TensorType(DOUBLE, (SEQ, 3))], opset=20) == [TensorType(DOUBLE, (SEQ, 3))]


def test_prelu_and_dropout_types():
    x = f32(BATCH, 3, SEQ, SEQ)
    assert infer_op("PRelu", [x, f32(3, 1, 1)], opset=16) == [x]
    assert infer_op("PRelu", [TensorType(FLOAT, None), f32(1)], opset=16) == [TensorType(FLOAT, None)]
    assert infer_op("Dropout", [x], opset=13, num_outputs=2) == [x, TensorType(BOOL, x.shape)]
    assert infer_op("Dropout", [x], opset=7, num_outputs=2) == [x, x]
    assert infer_op("Dropout", [x], opset=13) == [x]


def test_ops_need_their_opset():
    # Before an op exists, our rule must not claim it (whatever onnx's fallback makes of it).
    for op, since in [("Gelu", 20), ("Mish", 18), ("BitwiseNot", 18), ("Mod", 10), ("CastLike", 15)]:
        early = lookup("", op, since - 1)
        assert early is None or early.delegated, op
        assert lookup("", op, since).since == since and not lookup("", op, since).delegated


# -- tracked contents of shape computations -------------------------------------------------


def contents_of(op, inputs, attrs=None, opset=17):
    """The output contents the type rule records.

    Each input is a NumPy constant, or a pair (dtype, dims) for a 1-D tensor
    whose contents are known symbolically (as Shape(x) would give), or a pair
    (dtype, length) for a 1-D tensor whose contents are unknown.
    """
    graph = Graph("contents", opset={"": opset})
    values = []
    for i, item in enumerate(inputs):
        if isinstance(item, np.ndarray):
            values.append(graph.add_initializer(f"in{i}", item))
        else:
            dtype, known = item
            length = known if isinstance(known, int) else len(known)
            value = graph.add_input(f"in{i}", TensorType(dtype, (length,)))
            value.shape_contents = None if isinstance(known, int) else tuple(known)
            values.append(value)
    node = graph.add_node(op, values, 1, attrs or {})
    ctx = InferContext(node, opset, graph.symbols)
    lookup("", op, opset).infer(ctx)
    return ctx.output_contents.get(0)


def dims(*values):
    return (INT64, values)


def test_arithmetic_contents():
    shape = dims(BATCH, SEQ, 768)
    assert contents_of("Mul", [shape, np.array(2, np.int64)]) == (2 * BATCH, 2 * SEQ, 1536)
    assert contents_of("Add", [shape, dims(1, 0, -768)]) == (BATCH + 1, SEQ, 0)
    assert contents_of("Sub", [dims(SEQ), np.array([1], np.int64)]) == (SEQ - 1,)
    assert contents_of("Div", [shape, np.array(12, np.int64)]) == (floordiv(BATCH, 12), floordiv(SEQ, 12), 64)
    assert contents_of("Div", [dims(12 * SEQ), np.array(12, np.int64)]) == (SEQ,)
    assert contents_of("Mod", [dims(4 * SEQ + 3), np.array(4, np.int64)]) == (3,)
    assert contents_of("Max", [dims(SEQ, 0), np.array(1, np.int64)]) == (SEQ, 1)
    assert contents_of("Min", [dims(SEQ), np.array([512, 1000], np.int64), dims(600)]) == (SEQ, SEQ)


def test_division_contents_truncate_toward_zero():
    assert contents_of("Div", [np.array([-7, 7, -7], np.int64), np.array([2, -2, -2], np.int64)]) == (-3, -3, 3)
    assert contents_of("Div", [dims(-SEQ), np.array(2, np.int64)]) == (-floordiv(SEQ, 2),)
    # The sign of `signed` is unknown, so its quotient cannot be written with floordiv.
    assert contents_of("Div", [dims(SIGNED), np.array(2, np.int64)]) is None
    assert contents_of("Div", [dims(SEQ), dims(SIGNED)]) is None
    assert contents_of("Div", [dims(SEQ), np.array(0, np.int64)]) is None
    assert contents_of("Mod", [np.array([-7, 7], np.int64), np.array([2, -2], np.int64)]) == (1, -1)
    assert contents_of("Mod", [np.array([-7, 7], np.int64), np.array([2, -2], np.int64)], {"fmod": 1}) == (-1, 1)


def test_comparison_and_logic_contents():
    assert contents_of("Equal", [dims(SEQ, BATCH, 3), dims(SEQ, 0, 4)]) == (1, 0, 0)
    assert contents_of("Equal", [dims(SEQ), np.array(5, np.int64)]) is None
    assert contents_of("Less", [dims(SEQ, SEQ), np.array([513, 1], np.int64)]) == (1, 0)
    assert contents_of("GreaterOrEqual", [dims(SEQ), np.array(1, np.int64)], opset=16) == (1,)
    assert contents_of("Greater", [dims(SEQ), np.array(100, np.int64)]) is None
    assert contents_of("Not", [np.array([True, False])]) == (0, 1)
    assert contents_of("And", [np.array([True, False]), np.array(True)]) == (1, 0)
    assert contents_of("Or", [np.array([True, False]), np.array([False])]) == (1, 0)
    assert contents_of("Less", [np.array([1.0], np.float32), np.array([2.0], np.float32)]) is None


def test_where_cast_and_identity_contents():
    condition = np.array([True, False, True])
    assert contents_of("Where", [condition, dims(SEQ, 1, 2), dims(7, BATCH, 9)], opset=16) == (SEQ, BATCH, 2)
    assert contents_of("Where", [(BOOL, 1), dims(SEQ), dims(1)], opset=16) is None
    assert contents_of("Cast", [dims(SEQ, 2**32 + 5, -1)], {"to": INT32}) == (SEQ, 5, -1)
    assert contents_of("Cast", [dims(SEQ, 0, SIGNED)], {"to": BOOL}) is None
    assert contents_of("Cast", [dims(SEQ, 0)], {"to": BOOL}) == (1, 0)
    assert contents_of("Cast", [dims(SEQ)], {"to": FLOAT}) is None
    assert contents_of("Identity", [dims(BATCH, SEQ)]) == (BATCH, SEQ)


def test_contents_need_every_input_known_and_at_most_1d():
    assert contents_of("Add", [dims(SEQ, BATCH), (INT64, 2)]) is None
    assert contents_of("Add", [dims(SEQ, BATCH), np.zeros((2, 2), np.int64)]) is None
    assert contents_of("Max", [dims(SEQ, BATCH), (INT64, 1)]) is None
