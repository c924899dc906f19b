"""The native lowerings added for ONNX node conformance (lower/misc.py and the newer
elementwise expressions), against onnxruntime at three values of each symbolic dim.

Like tests/test_native_backend.py, every case asserts that no node fell back to the
reference evaluator, so a rule that silently declines fails here.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import shapeshift

from .test_native_backend import _const, _input, _output
from .test_native_backend import _model as _model17

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F, D, I64, I32, U8, B = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32,
                         TensorProto.UINT8, TensorProto.BOOL)
SIZES = (1, 3, 7)


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    return _model17(nodes, inputs, outputs, initializers, opset)


def _run_both(model, feeds_list, rtol=1e-5, atol=1e-6):
    import onnxruntime as ort

    session = shapeshift.InferenceSession(model, backend="native")
    fallback = session._executor.program.fallback_ops()
    assert not fallback, f"left to the reference fallback: {dict(fallback)} " + "; ".join(
        f"{s.node.op_type}: {s.reason}" for s in session._executor.program.steps if s.reason)
    try:
        reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - onnxruntime lacks a kernel (double Tan...): onnx's evaluator
        from onnx.reference import ReferenceEvaluator

        reference = ReferenceEvaluator(model)
    for feed in feeds_list:
        got = session.run(None, feed)
        want = reference.run(None, feed)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return session


def _rand(rng, shape, low=-2.0, high=2.0, dtype=np.float32):
    return np.asarray(rng.uniform(low, high, shape), dtype=dtype)


# -- elementwise ---------------------------------------------------------------------------

# (op, attributes, input range): each op on its own input of its domain.
UNARY = [("Tan", {}, (-1.2, 1.2)), ("Asin", {}, (-0.99, 0.99)), ("Acos", {}, (-0.99, 0.99)), ("Atan", {}, (-3, 3)),
         ("Sinh", {}, (-3, 3)), ("Cosh", {}, (-3, 3)), ("Asinh", {}, (-3, 3)), ("Acosh", {}, (1.01, 4)),
         ("Atanh", {}, (-0.99, 0.99)), ("ThresholdedRelu", {"alpha": 0.5}, (-2, 2)),
         ("Shrink", {"lambd": 0.7, "bias": 0.2}, (-2, 2)), ("Celu", {"alpha": 1.5}, (-3, 3))]


@pytest.mark.parametrize("dtype", [F, D], ids=["float", "double"])
def test_unary_math_ops(dtype):
    ops = [u for u in UNARY if not (dtype == D and u[0] == "Celu")]  # Celu is float-only in ONNX
    nodes = [helper.make_node(op, [f"x{k}"], [f"y{k}"], **attrs) for k, (op, attrs, _) in enumerate(ops)]
    model = _model(nodes, [_input(f"x{k}", ["n", 4], dtype) for k in range(len(ops))],
                   [_output(f"y{k}", dtype) for k in range(len(ops))])
    rng = np.random.default_rng(0)
    np_dtype = np.float32 if dtype == F else np.float64
    _run_both(model, [{f"x{k}": _rand(rng, (n, 4), *r, dtype=np_dtype) for k, (_, _, r) in enumerate(ops)}
                      for n in SIZES])


def test_is_inf_with_detect_flags():
    nodes = [helper.make_node("IsInf", ["x"], ["a"]), helper.make_node("IsInf", ["x"], ["p"], detect_negative=0),
             helper.make_node("IsInf", ["x"], ["m"], detect_positive=0)]
    model = _model(nodes, [_input("x", ["n"])], [_output(o, B) for o in "apm"])
    values = np.array([np.inf, -np.inf, np.nan, 1.0, -2.0, 0.0, np.inf], np.float32)
    _run_both(model, [{"x": values[:n]} for n in SIZES])


@pytest.mark.parametrize("dtype", [I64, I32, U8], ids=["int64", "int32", "uint8"])
def test_bitwise_ops(dtype):
    nodes = [helper.make_node(op, ["a", "b"], [f"y{k}"]) for k, op in enumerate(["BitwiseAnd", "BitwiseOr", "BitwiseXor"])]
    nodes.append(helper.make_node("BitwiseNot", ["a"], ["y3"]))
    model = _model(nodes, [_input("a", ["n", 3], dtype), _input("b", [3], dtype)], [_output(f"y{k}", dtype) for k in range(4)])
    rng = np.random.default_rng(1)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    low = 0 if dtype == U8 else -100
    _run_both(model, [{"a": rng.integers(low, 100, (n, 3)).astype(np_dtype), "b": rng.integers(low, 100, 3).astype(np_dtype)}
                      for n in SIZES])


def test_bit_shift_uint8():
    nodes = [helper.make_node("BitShift", ["a", "s"], ["l"], direction="LEFT"),
             helper.make_node("BitShift", ["a", "s"], ["r"], direction="RIGHT")]
    model = _model(nodes, [_input("a", ["n"], U8), _input("s", ["n"], U8)], [_output("l", U8), _output("r", U8)])
    rng = np.random.default_rng(2)
    _run_both(model, [{"a": rng.integers(0, 256, n).astype(np.uint8), "s": rng.integers(0, 8, n).astype(np.uint8)}
                      for n in SIZES])


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_variadic_sum_and_mean(op):
    nodes = [helper.make_node(op, ["a", "b", "c"], ["y"])]
    model = _model(nodes, [_input("a", ["n", 4]), _input("b", [4]), _input("c", ["n", 1])], [_output("y")])
    rng = np.random.default_rng(3)
    _run_both(model, [{"a": _rand(rng, (n, 4)), "b": _rand(rng, (4,)), "c": _rand(rng, (n, 1))} for n in SIZES])


# -- gathers and scatters ------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    model = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)],
                   [_input("x", ["n", 5]), _input("i", ["n", 3], I64)], [_output("y")])
    rng = np.random.default_rng(4)
    feeds = []
    for n in SIZES:
        dim = (n, 5)[axis]
        feeds.append({"x": _rand(rng, (n, 5)), "i": rng.integers(-dim, dim, (n, 3)).astype(np.int64)})
    _run_both(model, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    model = _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)],
                   [_input("x", ["n", 6]), _input("i", ["n", 2], I64), _input("u", ["n", 2])], [_output("y")])
    rng = np.random.default_rng(5)
    feeds = []
    for n in SIZES:
        # Distinct indices per row: with reduction "none" a repeated index is unspecified.
        idx = np.stack([rng.choice(np.arange(-6, 6), 2, replace=False) for _ in range(n)])
        idx = np.where((idx[:, :1] % 6) == (idx[:, 1:] % 6), np.array([[0, 1]]), idx)
        feeds.append({"x": _rand(rng, (n, 6)), "i": idx.astype(np.int64), "u": _rand(rng, (n, 2))})
    _run_both(model, feeds)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    model = _model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
                   [_input("x", ["n", 4, 3]), _input("i", ["n", 2, 1] if batch_dims else ["m", 2], I64)], [_output("y")])
    rng = np.random.default_rng(6)
    feeds = []
    for n in SIZES:
        if batch_dims:
            i = rng.integers(-4, 4, (n, 2, 1))
        else:
            i = np.stack([rng.integers(0, n, n + 1), rng.integers(-4, 4, n + 1)], axis=1)
        feeds.append({"x": _rand(rng, (n, 4, 3)), "i": i.astype(np.int64)})
    _run_both(model, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd(reduction):
    model = _model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                   [_input("x", ["n", 3]), _input("i", [2, 1], I64), _input("u", [2, 3])], [_output("y")])
    rng = np.random.default_rng(7)
    # Two distinct rows (a repeated index is unspecified with reduction "none"), one negative.
    feeds = [{"x": _rand(rng, (n, 3)), "i": np.array([[0], [-1]], np.int64), "u": _rand(rng, (2, 3))} for n in (2, 3, 7)]
    _run_both(model, feeds)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    model = _model([helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)],
                   [_input("i", ["n", 2], I64)], [_output("y")],
                   [_const("depth", np.array([5], np.int64)), _const("values", np.array([-1.0, 3.0], np.float32))])
    rng = np.random.default_rng(8)
    _run_both(model, [{"i": rng.integers(-6, 6, (n, 2)).astype(np.int64)} for n in SIZES])


# -- scans, masks, layouts -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F, I64, D, I32], ids=["float", "int64", "double", "int32"])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(dtype, exclusive, reverse):
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                   [_input("x", ["n", 4], dtype)], [_output("y", dtype)], [_const("axis", np.int64(0))])
    rng = np.random.default_rng(9)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    _run_both(model, [{"x": (rng.integers(-9, 9, (n, 4)) * 1.25).astype(np_dtype) if dtype in (F, D)
                       else rng.integers(-9, 9, (n, 4)).astype(np_dtype)} for n in SIZES])


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(upper):
    model = _model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
                   [_input("x", [2, "n", "m"]), _input("k", [], I64)], [_output("y")])
    rng = np.random.default_rng(10)
    _run_both(model, [{"x": _rand(rng, (2, n, m)), "k": np.array(k, np.int64)}
                      for n, m, k in ((1, 3, 0), (3, 5, -1), (7, 4, 2))])


@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 0), (11, 1)])
def test_hardmax(opset, axis):
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], [_input("x", ["n", 3, 4])], [_output("y")],
                   opset=opset)
    rng = np.random.default_rng(11)
    feeds = []
    for n in SIZES:
        x = np.round(_rand(rng, (n, 3, 4)))  # ties: the first maximum wins
        feeds.append({"x": x})
    _run_both(model, feeds)


def test_eye_like_and_cast_like():
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], k=1, dtype=I64),
             helper.make_node("CastLike", ["x", "like"], ["c"])]
    model = _model(nodes, [_input("x", ["n", "m"]), _input("like", [1], D)], [_output("e", I64), _output("c", D)])
    rng = np.random.default_rng(12)
    _run_both(model, [{"x": _rand(rng, (n, m)), "like": np.zeros(1)} for n, m in ((1, 1), (3, 5), (6, 2))])


def test_dropout_inference_with_mask():
    model = _model([helper.make_node("Dropout", ["x", "ratio"], ["y", "mask"])], [_input("x", ["n", 3])],
                   [_output("y"), _output("mask", B)], [_const("ratio", np.float32(0.3))])
    rng = np.random.default_rng(13)
    _run_both(model, [{"x": _rand(rng, (n, 3))} for n in SIZES])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    model = _model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)],
                   [_input("x", ["n", 8, "h", "w"])], [_output("y")])
    rng = np.random.default_rng(14)
    _run_both(model, [{"x": _rand(rng, (n, 8, h, w))} for n, h, w in ((1, 1, 1), (2, 3, 2), (1, 4, 5))])


def test_space_to_depth():
    model = _model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], [_input("x", ["n", 3, 4, 6])],
                   [_output("y")])
    rng = np.random.default_rng(15)
    _run_both(model, [{"x": _rand(rng, (n, 3, 4, 6))} for n in SIZES])


@pytest.mark.parametrize("dtype", [I64, I32], ids=["int64", "int32"])
def test_integer_div_truncates_toward_zero(dtype):
    model = _model([helper.make_node("Div", ["a", "b"], ["y"])], [_input("a", ["n"], dtype), _input("b", ["n"], dtype)],
                   [_output("y", dtype)])
    rng = np.random.default_rng(16)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    feeds = []
    for n in SIZES:
        b = rng.integers(1, 9, n) * rng.choice([-1, 1], n)  # no zero divisor: onnxruntime leaves it undefined
        feeds.append({"a": rng.integers(-50, 50, n).astype(np_dtype), "b": b.astype(np_dtype)})
    _run_both(model, feeds)


@pytest.mark.parametrize("dims", [["n", 3, 3], [2, "n", 4, 4], ["n", 1, 1]])
def test_det(dims):
    node = helper.make_node("Det", ["x"], ["y"])
    model = _model([node], [_input("x", dims)], [_output("y")])
    rng = np.random.default_rng(11)
    feeds = []
    for n in SIZES:
        x = _rand(rng, [n if d == "n" else d for d in dims])
        if x.shape[-1] > 1 and x.size:
            x.reshape(-1, *x.shape[-2:])[0, 1] = x.reshape(-1, *x.shape[-2:])[0, 0]  # a singular matrix too
        feeds.append({"x": x})
    _run_both(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_pad_modes_that_read_the_input(mode):
    pads = _const("pads", np.array([0, 1, 2, 0, 2, 1], dtype=np.int64))  # begins then ends per axis
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = _model([node], [_input("x", ["n", 3, 4])], [_output("y")], [pads], opset=19)
    rng = np.random.default_rng(12)
    _run_both(model, [{"x": _rand(rng, (n, 3, 4))} for n in SIZES])


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
@pytest.mark.parametrize("pads", [[0, 0, 7, 0, 0, 9], [0, 2, 0, 0, 1, 13], [1, 0, 3, 2, 0, 0]])
def test_pad_modes_row_by_row(mode, pads):
    # Pads on the last axis wider than it (its middle copied, both sides mapped), or on the
    # outer axes only (whole rows copied from mapped rows), at a dynamic middle axis. Against
    # numpy's np.pad: onnxruntime refuses reflect pads wider than the axis.
    pads_init = _const("pads", np.array(pads, dtype=np.int64))
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
    model = _model([node], [_input("x", [2, "n", 5])], [_output("y")], [pads_init], opset=19)
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    rng = np.random.default_rng(13)
    for n in (2, 3, 6):
        x = _rand(rng, (2, n, 5))
        expected = np.pad(x, list(zip(pads[:3], pads[3:])), mode=mode)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)


def test_reflect_pad_wider_than_the_axis_folds_again():
    # numpy and onnxruntime keep mirroring when a pad exceeds the axis (one element: repeats).
    pads = _const("pads", np.array([0, 5, 0, 4], dtype=np.int64))
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
    model = _model([node], [_input("x", ["n", 3])], [_output("y")], [pads], opset=19)
    import shapeshift

    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    for n in (1, 2, 4):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.pad(x, ((0, 0), (5, 4)), mode="reflect"))
