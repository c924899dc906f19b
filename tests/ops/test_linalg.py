"""Tests of the linear-algebra ops: symbolic type rules, numerics against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from shapeshift.errors import ShapeInferenceError
from shapeshift.ir.types import DOUBLE, FLOAT, INT8, INT32, UINT8, TensorType, tensor_type_of
from shapeshift.symbolic import Expr, symbol
from shapeshift.testing import apply_op, infer_op, ort_op

B = symbol("batch", 1, 64)
T = symbol("seq", 1, 512)
H = symbol("heads", 1, 32)


def f32(*shape) -> TensorType:
    return TensorType(FLOAT, shape)


UNKNOWN = TensorType(FLOAT, None)

# -- type rules ----------------------------------------------------------------------

# (op, input types, attrs, opset, expected output types)
TYPE_CASES = [
    ("MatMul", [f32(B, T, 768), f32(768, 3072)], {}, 13, [f32(B, T, 3072)]),
    ("MatMul", [f32(B, H, T, 64), f32(B, H, 64, T)], {}, 13, [f32(B, H, T, T)]),
    ("MatMul", [f32(T, 64), f32(B, 64, 10)], {}, 13, [f32(B, T, 10)]),
    ("MatMul", [f32(B, 1, T, 8), f32(H, 8, 5)], {}, 13, [f32(B, H, T, 5)]),
    ("MatMul", [f32(768), f32(768, 3072)], {}, 13, [f32(3072)]),
    ("MatMul", [f32(B, T, 768), f32(768)], {}, 13, [f32(B, T)]),
    ("MatMul", [f32(T), f32(T)], {}, 9, [f32()]),
    ("MatMul", [UNKNOWN, f32(768, 10)], {}, 13, [UNKNOWN]),
    ("MatMul", [TensorType(DOUBLE, (B, 3)), TensorType(DOUBLE, (3, 2))], {}, 7, [TensorType(DOUBLE, (B, 2))]),
    ("Gemm", [f32(B, 768), f32(10, 768), f32(10)], {"transB": 1}, 13, [f32(B, 10)]),
    ("Gemm", [f32(768, B), f32(768, 10)], {"transA": 1, "alpha": 0.5}, 11, [f32(B, 10)]),
    ("Gemm", [f32(B, 4), f32(4, 3), f32(1, 1)], {"beta": 2.0}, 7, [f32(B, 3)]),
    ("Einsum", [f32(B, H, T, 64), f32(B, H, T, 64)], {"equation": "bhqd,bhkd->bhqk"}, 12, [f32(B, H, T, T)]),
    ("Einsum", [f32(B, T, 4), f32(4, 5)], {"equation": "...ij,jk->...ik"}, 12, [f32(B, T, 5)]),
    ("Einsum", [f32(B, 1, 3, 4), f32(H, 4, 2)], {"equation": "...ij, ...jk"}, 12, [f32(B, H, 3, 2)]),
    ("Einsum", [f32(B, 3, 4), f32(B, 4, 5)], {"equation": "bij,bjk"}, 12, [f32(3, 5)]),
    ("Einsum", [f32(T, T)], {"equation": "ii->i"}, 12, [f32(T)]),
    ("Einsum", [f32(B, T)], {"equation": "ij->"}, 12, [f32()]),
    ("Einsum", [UNKNOWN, f32(4, 5)], {"equation": "...ij,jk->...ik"}, 12, [UNKNOWN]),
    ("Softmax", [f32(B, H, T, T)], {}, 13, [f32(B, H, T, T)]),
    ("LogSoftmax", [f32(B, T, 10)], {"axis": 2}, 11, [f32(B, T, 10)]),
    ("Hardmax", [UNKNOWN], {"axis": 0}, 13, [UNKNOWN]),
    ("MatMulInteger", [TensorType(UINT8, (B, T, 64)), TensorType(INT8, (64, 32))], {}, 10,
     [TensorType(INT32, (B, T, 32))]),
    ("Det", [f32(B, 3, 3)], {}, 11, [f32(B)]),
    ("Det", [f32(T, T)], {}, 11, [f32()]),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, expected", TYPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TYPE_CASES)])
def test_type_rule(op, inputs, attrs, opset, expected):
    assert infer_op(op, inputs, attrs, opset) == expected


def test_gemm_with_unknown_a_takes_rows_from_c():
    (out,) = infer_op("Gemm", [UNKNOWN, f32(4, 3), f32(7, 3)], {}, 13)
    assert out.shape == (7, 3)
    (out,) = infer_op("Gemm", [UNKNOWN, f32(4, 3)], {}, 13)
    assert isinstance(out.shape[0], Expr) and out.shape[1] == 3


def test_einsum_label_missing_from_known_inputs_is_fresh():
    (out,) = infer_op("Einsum", [UNKNOWN, f32(4, 5)], {"equation": "ij,jk->ik"}, 12)
    assert isinstance(out.shape[0], Expr) and out.shape[1] == 5


def test_qlinear_matmul_output_dtype_is_the_zero_points():
    scale = TensorType(FLOAT, ())
    inputs = [TensorType(UINT8, (B, 8)), scale, TensorType(UINT8, ()), TensorType(INT8, (8, 4)), scale,
              TensorType(INT8, ()), scale, TensorType(INT8, ())]
    assert infer_op("QLinearMatMul", inputs, {}, 10) == [TensorType(INT8, (B, 4))]


@pytest.mark.parametrize("op, inputs, attrs", [
    ("MatMul", [f32(B, T, 768), f32(512, 10)], {}),
    ("MatMul", [f32(B, T), f32(768, 10)], {}),  # seq <= 512 can never be 768
    ("MatMul", [f32(3, 2, 4), f32(5, 4, 2)], {}),
    ("MatMul", [f32(), f32(3)], {}),
    ("Gemm", [f32(B, 4, 1), f32(4, 3)], {}),
    ("Gemm", [f32(B, 4), f32(5, 3)], {}),
    ("Gemm", [f32(B, 4), f32(4, 3), f32(2, 5)], {}),
    ("Einsum", [f32(3, 4), f32(5, 6)], {"equation": "ij,jk->ik"}),
    ("Einsum", [f32(3, 4, 5)], {"equation": "ij->i"}),
    ("Einsum", [f32(3, 4)], {"equation": "ij->k"}),
    ("Softmax", [f32(B, T)], {"axis": 2}),
    ("Det", [f32(3, 4)], {}),
])
def test_invalid_inputs_fail_with_a_clear_error(op, inputs, attrs):
    with pytest.raises(ShapeInferenceError, match="node"):
        infer_op(op, inputs, attrs, 13)


# -- numerics against onnxruntime ------------------------------------------------------

RNG = np.random.default_rng(0)
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
#: Ops onnxruntime's CPU provider implements for float32 only.
ORT_FLOAT32_ONLY = {"Hardmax", "Det"}


def _random(shape, dtype=np.float32) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -20), min(info.max, 20), size=shape, endpoint=True).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _ort_reference(op, inputs, attrs, opset) -> list:
    """onnxruntime's outputs; ops it lacks in float64 run in float32 and are cast back."""
    if op in ORT_FLOAT32_ONLY and inputs[0].dtype == np.float64:
        outs = ort_op(op, [x.astype(np.float32) for x in inputs], attrs, opset)
        return [o.astype(np.float64) for o in outs]
    return ort_op(op, inputs, attrs, opset)


def _assert_matches_ort(op, inputs, attrs=None, opset=13):
    ours = apply_op(op, inputs, attrs, opset)
    ref = _ort_reference(op, inputs, attrs, opset)
    for got, want in zip(ours, ref):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        rtol = TOL.get(np.dtype(np.float32) if op in ORT_FLOAT32_ONLY else want.dtype)
        if rtol is None:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=rtol * 10, atol=rtol * 10)
    # The type rule must predict exactly what the evaluator produced.
    types = [tensor_type_of(np.asarray(x)) if x is not None else None for x in inputs]
    assert infer_op(op, types, attrs, opset) == [tensor_type_of(x) for x in ours]


MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,)),
                 ((2, 1, 3, 4), (5, 4, 6)), ((1, 0, 4), (4, 2))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("a_shape, b_shape", MATMUL_SHAPES)
def test_matmul_matches_ort(a_shape, b_shape, dtype):
    _assert_matches_ort("MatMul", [_random(a_shape, dtype), _random(b_shape, dtype)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c_shape, opset", [
    (0, 0, 1.0, 1.0, (5,), 13),
    (1, 0, 0.5, 2.0, (3, 5), 13),
    (0, 1, 1.0, 0.0, (1, 5), 11),
    (1, 1, -1.5, 0.25, (3, 1), 9),
    (0, 0, 1.0, 1.0, (), 7),
    (0, 1, 2.0, 1.0, None, 13),
])
def test_gemm_matches_ort(trans_a, trans_b, alpha, beta, c_shape, opset, dtype):
    a = _random((4, 3) if trans_a else (3, 4), dtype)
    b = _random((5, 4) if trans_b else (4, 5), dtype)
    c = None if c_shape is None else _random(c_shape, dtype)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    _assert_matches_ort("Gemm", [a, b] + ([] if c is None else [c]), attrs, opset)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("equation, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("bij, bjk, bkl -> bil", [(2, 3, 4), (2, 4, 5), (2, 5, 2)]),
    ("...i->...", [(2, 3, 4)]),
])
def test_einsum_matches_ort(equation, shapes, dtype):
    _assert_matches_ort("Einsum", [_random(s, dtype) for s in shapes], {"equation": equation}, 12)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape, axis", [((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), -2), ((5,), 0),
                                         ((2, 3, 4), 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_family_matches_ort(op, opset, shape, axis, dtype):
    attrs = {} if axis is None else {"axis": axis}
    _assert_matches_ort(op, [_random(shape, dtype) * 4], attrs, opset)


def test_hardmax_picks_the_first_of_equal_maxima():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2]], np.float32)
    (out,) = apply_op("Hardmax", [x], {"axis": 1}, 13)
    np.testing.assert_array_equal(out, [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    (out,) = apply_op("Softmax", [x], {}, 13)
    np.testing.assert_allclose(out, [[0.5, 0.5], [0.0, 1.0]])


@pytest.mark.parametrize("a_type, b_type", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("a_shape, b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5))])
@pytest.mark.parametrize("zero_points", [False, True])
def test_matmul_integer_matches_ort(a_type, b_type, a_shape, b_shape, zero_points):
    a, b = _random(a_shape, a_type), _random(b_shape, b_type)
    inputs = [a, b]
    if zero_points:
        inputs += [np.array(3, a_type), np.array([1, 2, 0, 5, 4], b_type)]
    _assert_matches_ort("MatMulInteger", inputs, {}, 10)


@pytest.mark.parametrize("qtype", [np.uint8, np.int8])
def test_qlinear_matmul_matches_ort(qtype):
    a, b = _random((2, 3, 4), qtype), _random((4, 5), qtype)
    scale = np.float32
    inputs = [a, np.array(0.05, scale), np.array(2, qtype), b, np.array(0.03, scale), np.array(1, qtype),
              np.array(0.01, scale), np.array(4, qtype)]
    _assert_matches_ort("QLinearMatMul", inputs, {}, 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1)])
def test_det_matches_ort(shape, dtype):
    _assert_matches_ort("Det", [_random(shape, dtype)], {}, 11)


@pytest.mark.parametrize("op, shapes", [("MatMul", [(3, 64), (64, 5)]), ("Softmax", [(4, 300)]),
                                       ("LogSoftmax", [(4, 300)])])
def test_float16_accumulates_like_ort(op, shapes):
    # Computed in float32 and rounded once, as onnxruntime does: equal to within one
    # float16 ulp (its exp is MLAS's, not NumPy's, so a Softmax can round the other way).
    # Own seed: the module's RNG would make the inputs depend on which tests ran first.
    rng = np.random.default_rng(16)
    inputs = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    (ours,) = apply_op(op, inputs, {}, 13)
    (ref,) = ort_op(op, inputs, {}, 13)
    assert ours.dtype == np.float16
    np.testing.assert_array_max_ulp(ours, ref, maxulp=1)
    if op == "MatMul":  # no transcendental: the one rounding is the same
        np.testing.assert_array_equal(ours, ref)
