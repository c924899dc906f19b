"""Native lowerings that close conformance gaps: reductions over axes that are not adjacent,
integer and bool reductions of every width, noop_with_empty_axes, Pow with an integer
base, seeded training-mode Dropout with a run-time mode, MeanVarianceNormalization and
BatchNormalization in training mode.

Compared with onnxruntime (or onnx's reference evaluator where onnxruntime has no kernel)
at three values of a symbolic dim; where neither defines the result (seeded Dropout
draws, integer overflow) with shapeshift's reference evaluator. Every case asserts that
no node fell back.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import InvalidModelError

from . import test_native_ops_extra
from .test_native_backend import _const
from .test_native_ops_extra import _input, _model, _output, _run_both

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

F, D, B = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BOOL
I8, U8, I16, U16 = TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16
I32, U32, I64, U64 = TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64
NUMPY = {F: np.float32, D: np.float64, B: np.bool_, I8: np.int8, U8: np.uint8, I16: np.int16, U16: np.uint16,
         I32: np.int32, U32: np.uint32, I64: np.int64, U64: np.uint64}
INTEGERS = (I8, U8, I16, U16, I32, U32, I64, U64)
SIZES = (1, 3, 7)
FLOAT_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")


def _assert_native(session) -> None:
    steps = session._executor.program.steps
    assert not session._executor.program.fallback_ops(), "; ".join(
        f"{s.node.op_type}: {s.reason}" for s in steps if s.reason)


def _run_against_reference(model, feeds_list, rtol=0.0):
    """Native against shapeshift's reference evaluator: bit for bit by default (NaN equal to
    NaN), within ``rtol`` where the two use different libm calls."""
    native = shapeshift.InferenceSession(model, backend="native")
    _assert_native(native)
    reference = shapeshift.InferenceSession(model, backend="reference")
    for feed in feeds_list:
        for got, want in zip(native.run(None, feed), reference.run(None, feed)):
            assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=0)


def _fallback_reasons(model) -> list[str]:
    steps = shapeshift.InferenceSession(model, backend="native")._executor.program.steps
    return [s.reason for s in steps if s.reason]


def _reduce_node(op, opset, axes, output, keepdims=1, source="x", **attrs):
    """One reduction node and its axes initializer (an input from opset 18, ReduceSum's from 13)."""
    inputs, initializers = [source], []
    if axes is not None and opset >= (13 if op == "ReduceSum" else 18):
        inputs.append(f"{output}_axes")
        initializers.append(_const(f"{output}_axes", np.array(axes, np.int64)))
    elif axes is not None:
        attrs["axes"] = axes
    return helper.make_node(op, inputs, [output], keepdims=keepdims, **attrs), initializers


def _reductions_model(cases, dtype, dims, opset=18, **attrs):
    """x reduced once per (op, axes, keepdims) in ``cases``; outputs y0, y1, ..."""
    nodes, initializers = [], []
    for k, (op, axes, keepdims) in enumerate(cases):
        node, inits = _reduce_node(op, opset, axes, f"y{k}", keepdims, **attrs)
        nodes.append(node)
        initializers += inits
    return _model(nodes, [_input("x", dims, dtype)], [_output(f"y{k}", dtype) for k in range(len(cases))],
                  initializers, opset=opset)


def _positive(rng, shape, dtype=np.float32):
    return np.asarray(rng.uniform(0.5, 2.0, shape), dtype=dtype)


# -- float reductions over axes that are not adjacent -----------------------------------------


@pytest.mark.parametrize("axes, keepdims", [([0, 2], 1), ([1, 3], 0), ([-1, 0, 2], 1), ([0, 3], 0)])
def test_float_reductions_over_axes_not_adjacent(axes, keepdims):
    model = _reductions_model([(op, axes, keepdims) for op in FLOAT_REDUCTIONS], F, [2, "n", 3, 5])
    rng = np.random.default_rng(len(axes))
    # Positive inputs keep ReduceLogSum's log defined.
    _run_both(model, [{"x": _positive(rng, (2, n, 3, 5))} for n in SIZES], rtol=1e-5, atol=1e-6)


def test_reduction_not_adjacent_keeps_trailing_axes_in_place():
    # Axes 0 and 2 of [n, 3, 4, 6]: the copy moves axis 1 first and keeps axis 3 innermost.
    model = _reductions_model([("ReduceMean", [0, 2], 1), ("ReduceMax", [0, 2], 0)], F, ["n", 3, 4, 6])
    rng = np.random.default_rng(1)
    _run_both(model, [{"x": _positive(rng, (n, 3, 4, 6))} for n in SIZES])


def test_float_reductions_not_adjacent_over_an_empty_axis():
    # A 0 extent makes every slice empty: each kind gives its identity (0, -inf, inf, 1, -inf).
    ops = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp", "ReduceL2"]
    model = _reductions_model([(op, [0, 2], 1) for op in ops], F, [0, "n", 4])
    _run_both(model, [{"x": np.zeros((0, n, 4), np.float32)} for n in SIZES])


# -- integer and bool reductions --------------------------------------------------------------


def _small_integers(rng, dtype, shape):
    """Values small enough that no sum or product overflows (onnxruntime goes through
    other arithmetic there); unsigned types get non-negative ones."""
    low = 0 if np.iinfo(dtype).min == 0 else -2
    return rng.integers(low, 3, shape).astype(dtype)


# The integer types ONNX's schemas (opset 18) give each reduction: ReduceSum, ReduceProd,
# ReduceSumSquare and ReduceL1 32- and 64-bit only; ReduceMax and ReduceMin 8-bit too; no
# reduction 16-bit. A model reducing another type is refused at load, as onnxruntime refuses it.
WIDE_INTEGERS = (I32, U32, I64, U64)
MAX_MIN_INTEGERS = (I8, U8) + WIDE_INTEGERS


@pytest.mark.parametrize("dtype", INTEGERS)
def test_integer_max_min_sum(dtype):
    ops = [op for op, allowed in (("ReduceMax", MAX_MIN_INTEGERS), ("ReduceMin", MAX_MIN_INTEGERS),
                                  ("ReduceSum", WIDE_INTEGERS)) if dtype in allowed]
    if not ops:
        _assert_refused(_reductions_model([("ReduceMax", [1], 0)], dtype, ["n", 3, 4]))
        return
    cases = [(op, axes, 0) for op in ops for axes in ([1], [0, 2])]
    model = _reductions_model(cases, dtype, ["n", 3, 4])
    rng = np.random.default_rng(dtype)
    _run_both(model, [{"x": _small_integers(rng, NUMPY[dtype], (n, 3, 4))} for n in SIZES], rtol=0, atol=0)


INTEGER_ARITHMETIC = ("ReduceProd", "ReduceMean", "ReduceSumSquare", "ReduceL1")


@pytest.mark.parametrize("dtype", [I32, I64])
def test_integer_reduction_arithmetic(dtype):
    model = _reductions_model([(op, [1], 1) for op in INTEGER_ARITHMETIC], dtype, [3, "n"])
    rng = np.random.default_rng(dtype)
    _run_both(model, [{"x": _small_integers(rng, NUMPY[dtype], (3, n))} for n in SIZES], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [U32, U64])
def test_unsigned_reduction_arithmetic(dtype):
    # Neither onnxruntime nor onnx's evaluator (it widens ReduceSumSquare to uint64) serves.
    model = _reductions_model([(op, [1], 1) for op in INTEGER_ARITHMETIC], dtype, [3, "n"])
    rng = np.random.default_rng(dtype)
    _run_against_reference(model, [{"x": _small_integers(rng, NUMPY[dtype], (3, n))} for n in SIZES])


def test_integer_mean_rounds_toward_zero():
    model = _reductions_model([("ReduceMean", [1], 1)], I32, [2, "n"])
    x = np.array([[-7, 2, -1, 0, 3, -4, 5], [7, 1, 1, 1, 1, 1, 1]], np.int32)
    _run_both(model, [{"x": x[:, :n]} for n in SIZES], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [I8, U8, I16])
def test_integer_reductions_of_types_the_schemas_refuse_are_refused_at_load(dtype):
    for op in ("ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceL1"):
        _assert_refused(_reductions_model([(op, [1], 1)], dtype, [2, "n"]))


@pytest.mark.parametrize("dtype", [I32, I64, U64])
def test_integer_reduction_wraps_like_numpy(dtype):
    # Overflow wraps in the input's width, as NumPy's sum in that dtype (the reference) does.
    info = np.iinfo(NUMPY[dtype])
    model = _reductions_model([(op, [1], 1) for op in ("ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceL1")],
                              dtype, [2, "n"])
    x = np.array([[info.max, info.max, 3, info.min, 7, info.max, 5],
                  [info.min, -1 if info.min else 9, info.min, 2, info.max, 11, 13]], NUMPY[dtype])
    _run_against_reference(model, [{"x": x[:, :n]} for n in SIZES])


@pytest.mark.parametrize("dtype", MAX_MIN_INTEGERS)
def test_integer_max_min_extremes_and_empty_set(dtype):
    info = np.iinfo(NUMPY[dtype])
    cases = [(op, axes, 0) for op in ("ReduceMax", "ReduceMin") for axes in ([0], [2])]
    # The extremes in every slice; and a 0 extent: the empty set gives the identity, the
    # dtype's lowest value (max) or highest (min).
    model = _reductions_model(cases, dtype, ["n", 3, 2])
    x = np.array([[[info.min, info.max], [0, 1], [info.max, info.min]]] * 7, NUMPY[dtype])
    _run_against_reference(model, [{"x": x[:n]} for n in SIZES])
    empty = _reductions_model(cases, dtype, [0, "n", 2])
    _run_against_reference(empty, [{"x": np.zeros((0, n, 2), NUMPY[dtype])} for n in SIZES])


def test_bool_max_min():
    cases = [(op, axes, 1) for op in ("ReduceMax", "ReduceMin") for axes in ([1], [0, 2], None)]
    model = _reductions_model(cases, B, ["n", 3, 2], opset=20)
    rng = np.random.default_rng(5)
    _run_both(model, [{"x": rng.integers(0, 2, (n, 3, 2)).astype(bool)} for n in SIZES], rtol=0, atol=0)


def test_bool_max_min_of_empty_set():
    # Max of nothing is false, min of nothing is true.
    model = _reductions_model([("ReduceMax", [0], 0), ("ReduceMin", [0], 0)], B, [0, "n"], opset=20)
    _run_against_reference(model, [{"x": np.ones((0, n), bool)} for n in SIZES])


def test_sum_of_bool_is_refused_at_load():
    # The schema has no bool ReduceSum (onnxruntime refuses it too); the native lowering
    # used to decline it and the reference backend summed it.
    _assert_refused(_reductions_model([("ReduceSum", [1], 1)], B, ["n", 3]))


def _assert_refused(model) -> None:
    for backend in ("reference", "native"):
        with pytest.raises(InvalidModelError, match="does not take for T"):
            shapeshift.InferenceSession(model, backend=backend)


# -- noop_with_empty_axes ---------------------------------------------------------------------


@pytest.mark.parametrize("axes", [[], None], ids=["empty", "absent"])
def test_noop_with_empty_axes_applies_only_the_elementwise_part(axes):
    # Each element is its own slice: ReduceSumSquare squares, ReduceLogSum takes the log...
    model = _reductions_model([(op, axes, 1) for op in FLOAT_REDUCTIONS], F, ["n", 3], noop_with_empty_axes=1)
    rng = np.random.default_rng(3)
    _run_against_reference(model, [{"x": _positive(rng, (n, 3))} for n in SIZES], rtol=1e-6)


def test_noop_with_empty_axes_matches_onnxruntime():
    model = _reductions_model([("ReduceSum", [], 1)], F, ["n", 3], opset=13, noop_with_empty_axes=1)
    rng = np.random.default_rng(3)
    _run_both(model, [{"x": _positive(rng, (n, 3))} for n in SIZES])


@pytest.mark.parametrize("dtype, op", [(I32, "ReduceSum"), (I64, "ReduceSum"), (U8, "ReduceMax"), (I8, "ReduceMin")])
def test_noop_with_empty_axes_on_integers(dtype, op):
    model = _reductions_model([(op, [], 1)], dtype, ["n", 3], noop_with_empty_axes=1)
    rng = np.random.default_rng(4)
    _run_both(model, [{"x": _small_integers(rng, NUMPY[dtype], (n, 3))} for n in SIZES], rtol=0, atol=0)


# -- Pow with an integer base -----------------------------------------------------------------


def _pows_model(pairs, opset=15):
    """y{k} = Pow(x_<base>, e_<exponent>) for each (base, exponent) dtype pair."""
    bases = sorted({b for b, _ in pairs})
    exponents = sorted({e for _, e in pairs})
    nodes = [helper.make_node("Pow", [f"x{b}", f"e{e}"], [f"y{k}"]) for k, (b, e) in enumerate(pairs)]
    inputs = [_input(f"x{b}", ["n"], b) for b in bases] + [_input(f"e{e}", ["n"], e) for e in exponents]
    return _model(nodes, inputs, [_output(f"y{k}", b) for k, (b, _) in enumerate(pairs)], opset=opset)


def _pow_feeds(pairs, bases, exponents, lengths):
    feeds = []
    for m in lengths:
        feed = {f"x{b}": bases[:m].astype(NUMPY[b]) for b, _ in pairs}
        feed.update({f"e{e}": exponents[:m].astype(NUMPY[e]) for _, e in pairs})
        feeds.append(feed)
    return feeds


BASES = np.array([0, 1, -1, 2, -2, 3, -3, 5, -7, 10, 0, 1, -1, 2, -3])


def test_integer_pow_with_integer_exponent():
    # Exponents 0 (x ** 0 == 1, 0 ** 0 included), positive and negative: 1 ** -k == 1,
    # (-1) ** -k == +-1, 0 ** -k the type's minimum (1 / 0 = inf truncated), else 0.
    pairs = [(b, e) for b in (I32, I64) for e in (I32, I64)]
    exponents = np.array([0, 0, 0, 3, 3, 2, 5, 4, -1, -2, -1, -3, -3, -1, -2])
    _run_both(_pows_model(pairs), _pow_feeds(pairs, BASES, exponents, (4, 9, 15)), rtol=0, atol=0)


def test_integer_pow_with_narrow_or_unsigned_exponent():
    pairs = [(b, e) for b in (I32, I64) for e in (I8, U8, I16, U16, U32, U64)]
    exponents = np.array([0, 4, 3, 2, 1, 5, 3, 2, 1, 0, 7, 6, 2, 3, 1])
    _run_both(_pows_model(pairs), _pow_feeds(pairs, BASES, exponents, (4, 9, 15)), rtol=0, atol=0)


def test_integer_pow_with_negative_narrow_exponent():
    # onnxruntime has no kernel for int8 exponents and onnx's evaluator rejects negative ones.
    pairs = [(I32, I8), (I64, I16)]
    exponents = np.array([-1, -2, -1, -3, -2, -1, -1, 0, -2, -1, -5, -4, -3, -2, -1])
    _run_against_reference(_pows_model(pairs), _pow_feeds(pairs, BASES, exponents, (4, 9, 15)))


def test_integer_pow_with_float_exponent():
    # pow in double, truncated; NaN (negative base, fractional exponent) and inf (0 ** -0.5)
    # give the type's minimum, as onnxruntime's cast does on x86.
    pairs = [(b, e) for b in (I32, I64) for e in (F, D)]
    exponents = np.array([0.0, 0.5, 2.0, 1.5, -0.5, 2.5, 3.0, -1.0, 0.25, 1.0, -0.5, 2.0, 0.5, 3.0, 1.5])
    _run_both(_pows_model(pairs), _pow_feeds(pairs, BASES, exponents, (4, 9, 15)), rtol=0, atol=0)


def test_integer_pow_overflow_wraps_like_numpy():
    # onnxruntime computes in double and casts (the minimum once out of range); the reference
    # evaluator's exact integer power wraps, and so does the native one.
    pairs = [(I32, I32), (I64, I64)]
    bases, exponents = np.array([3, -3, 7, 2, 5, 10, -2]), np.array([40, 41, 29, 63, 30, 19, 65])
    _run_against_reference(_pows_model(pairs), _pow_feeds(pairs, bases, exponents, (2, 5, 7)))


def test_float_pow_with_integer_exponent():
    pairs = [(b, e) for b in (F, D) for e in (I32, I64)]
    bases = np.array([0.0, -1.5, 2.0, -2.0, 0.5, -0.75, 3.0, 1.25, -1.1, 0.0])
    exponents = np.array([0, 1, 2, -1, -2, 3, 0, 5, -3, 2])
    _run_both(_pows_model(pairs), _pow_feeds(pairs, bases, exponents, (3, 6, 10)))


# -- Dropout with the training flag as an input ----------------------------------------------


def _dropouts_model(variants, dtype=F):
    """One Dropout per (seed, ratio) variant, all on x and the run-time flag ``training``;
    a ratio of None is the graph input ``ratio``. Outputs y{k} and mask{k}."""
    nodes, initializers, outputs = [], [], []
    inputs = [_input("x", ["n", 4], dtype), _input("training", [], B)]
    for k, (seed, ratio) in enumerate(variants):
        attrs = {} if seed is None else {"seed": seed}
        ratio_name = "ratio" if ratio is None else f"ratio{k}"
        if ratio is not None:
            initializers.append(_const(ratio_name, np.float32(ratio)))
        nodes.append(helper.make_node("Dropout", ["x", ratio_name, "training"], [f"y{k}", f"mask{k}"], **attrs))
        outputs += [_output(f"y{k}", dtype), _output(f"mask{k}", B)]
    if any(ratio is None for _, ratio in variants):
        inputs.append(_input("ratio", [], F))
    return _model(nodes, inputs, outputs, initializers, opset=13)


def _dropout_feeds(dtype, ratio=None, training=(True, False, True)):
    rng = np.random.default_rng(7)
    feeds = []
    # 300 x 4 elements take more than one refill of MT19937's 624-word state.
    for n, mode in zip((1, 3, 300), training):
        x = rng.normal(size=(n, 4)).astype(NUMPY[dtype])
        x[0, 0] = -3.0  # a dropped negative becomes -0.0, as NumPy's product gives
        feed = {"x": x, "training": np.array(mode)}
        if ratio is not None:
            feed["ratio"] = np.array(ratio, np.float32)
        feeds.append(feed)
    return feeds


SEEDED = [(seed, ratio) for seed in (0, 42, -3, 2**40 + 5) for ratio in (0.5, 0.75)]


@pytest.mark.parametrize("dtype", [F, D])
def test_seeded_training_dropout_draws_the_reference_numbers(dtype):
    _run_against_reference(_dropouts_model(SEEDED, dtype), _dropout_feeds(dtype))


@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_seeded_training_dropout_with_ratio_at_run_time(ratio):
    _run_against_reference(_dropouts_model([(1, None)]), _dropout_feeds(F, ratio))


def test_training_dropout_matches_the_onnx_test_generator():
    # The generator behind the ONNX conformance data: RandomState(seed).uniform >= ratio.
    from onnx.backend.test.case.node.dropout import dropout

    session = shapeshift.InferenceSession(_dropouts_model([(0, 0.75)]), backend="native")
    _assert_native(session)
    for feed in _dropout_feeds(F):
        y, mask = session.run(None, feed)
        want_y, want_mask = dropout(feed["x"], 0.75, seed=0, training_mode=bool(feed["training"]), return_mask=True)
        np.testing.assert_allclose(y, want_y, rtol=1e-6)
        np.testing.assert_array_equal(mask, want_mask)


def test_training_dropout_false_at_run_time_matches_onnxruntime():
    # onnxruntime draws other numbers in training mode: it checks inference mode only. A
    # constant ratio of 0 needs no seed: it drops nothing whatever the mode.
    model = _dropouts_model([(3, 0.5), (None, 0.0)])
    _run_both(model, _dropout_feeds(F, training=(False, False, False)))
    _run_against_reference(model, _dropout_feeds(F))


def test_training_dropout_without_seed_declines():
    reasons = _fallback_reasons(_dropouts_model([(None, 0.5)]))
    assert "Dropout in training mode without a seed (random draws)" in reasons


# -- MeanVarianceNormalization and BatchNormalization training -------------------------------


MVN_AXES = [None, [0, 2, 3], [2, 3], [0, 1, 2, 3], [1, 2, 3], [0, -1], [0, 1]]


def test_mean_variance_normalization():
    nodes = [helper.make_node("MeanVarianceNormalization", ["x"], [f"y{k}"], **({} if axes is None else {"axes": axes}))
             for k, axes in enumerate(MVN_AXES)]
    model = _model(nodes, [_input("x", ["n", 3, 4, 5])], [_output(f"y{k}") for k in range(len(MVN_AXES))], opset=13)
    rng = np.random.default_rng(8)
    _run_both(model, [{"x": rng.normal(2.0, 3.0, (n, 3, 4, 5)).astype(np.float32)} for n in SIZES],
              rtol=1e-4, atol=1e-5)


def test_mean_variance_normalization_keeping_axes_not_adjacent_declines():
    model = _model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[1, 3])],
                   [_input("x", ["n", 3, 4, 5])], [_output("y")], opset=13)
    assert "MeanVarianceNormalization keeping axes that are not adjacent" in _fallback_reasons(model)


@pytest.mark.parametrize("dims", [["n", 3], ["n", 3, 5], ["n", 2, 3, 4]])
def test_batch_normalization_training(dims):
    # With the running statistics as outputs, and without (y alone).
    c = dims[1]
    rng = np.random.default_rng(9)
    names = ("scale", "bias", "mean", "var")
    params = [_const(name, rng.uniform(0.5, 1.5, c).astype(np.float32)) for name in names]
    nodes = [helper.make_node("BatchNormalization", ["x", *names], ["y", "running_mean", "running_var"],
                              training_mode=1, momentum=0.8, epsilon=1e-3),
             helper.make_node("BatchNormalization", ["x", *names], ["y_alone"], training_mode=1)]
    outputs = [_output(o) for o in ("y", "running_mean", "running_var", "y_alone")]
    model = _model(nodes, [_input("x", dims)], outputs, params, opset=15)
    _run_both(model, [{"x": rng.normal(1.0, 2.0, (n, *dims[1:])).astype(np.float32)} for n in SIZES],
              rtol=1e-4, atol=1e-5)
