"""ss_reduce, ss_argmax/ss_argmin and ss_softmax (shapeshift/codegen/kernels/reduce.py)
against NumPy in float64, and the empty reductions against onnx.reference."""

from __future__ import annotations

import ctypes
import warnings
import zlib

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import reduce, vmath
from shapeshift.codegen.kernels.prelude import PRELUDE

I64 = ctypes.c_int64
P = ctypes.c_void_p

# [outer, n, inner]: zero and one extents, odd sizes, both the contiguous (inner == 1) and
# the column (inner > 1) paths, full 32-column blocks and masked remainders, long rows
# that span several summation chunks.
SHAPES = [(1, 1, 1), (2, 1, 1), (0, 4, 3), (2, 5, 0), (4, 37, 1), (5, 9, 1), (3, 7, 1), (3, 1000, 1),
          (1, 5003, 1), (2, 7, 13), (3, 33, 40), (1, 300, 64), (2, 3, 100), (1, 1, 9), (2, 400, 33),
          (64, 70, 1), (3, 2, 32)]
KINDS = reduce.KINDS
ONNX_OPS = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd",
            "sum_square": "ReduceSumSquare", "l1": "ReduceL1", "l2": "ReduceL2", "log_sum": "ReduceLogSum",
            "log_sum_exp": "ReduceLogSumExp"}


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + vmath.source() + reduce.source()
    cdll = compile_library(source, name_hint="test reduce", cache_dir=build_cache).cdll
    cdll.ss_reduce.argtypes = [ctypes.c_int, P, P, I64, I64, I64]
    for name in ("ss_argmax", "ss_argmin"):
        getattr(cdll, name).argtypes = [P, P, I64, I64, I64, ctypes.c_int]
    cdll.ss_softmax.argtypes = [P, P, I64, I64, I64, ctypes.c_int]
    for name in ("ss_reduce", "ss_argmax", "ss_argmin", "ss_softmax"):
        getattr(cdll, name).restype = None
    return cdll


def seed(key) -> int:
    """A seed that is the same in every process (hash() of a str is salted per process)."""
    return zlib.crc32(repr(key).encode())


def run_reduce(lib, kind: str, x: np.ndarray) -> np.ndarray:
    outer, n, inner = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((outer, inner), 777.0, dtype=np.float32)
    lib.ss_reduce(KINDS.index(kind), x.ctypes.data, y.ctypes.data, outer, n, inner)
    return y


def run_arg(lib, which: str, x: np.ndarray, last: bool) -> np.ndarray:
    outer, n, inner = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((outer, inner), -5, dtype=np.int64)
    getattr(lib, f"ss_arg{which}")(x.ctypes.data, y.ctypes.data, outer, n, inner, int(last))
    return y


def run_softmax(lib, x: np.ndarray, log: bool) -> np.ndarray:
    outer, n, inner = x.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full_like(x, 777.0)
    lib.ss_softmax(x.ctypes.data, y.ctypes.data, outer, n, inner, int(log))
    return y


def reference(kind: str, x: np.ndarray) -> np.ndarray:
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if kind == "log_sum_exp":
            m = d.max(axis=1, keepdims=True)
            return (np.log(np.exp(d - m).sum(axis=1)) + m[:, 0]).astype(np.float64)
        return {
            "sum": lambda: d.sum(axis=1), "mean": lambda: d.mean(axis=1), "max": lambda: d.max(axis=1),
            "min": lambda: d.min(axis=1), "prod": lambda: d.prod(axis=1),
            "sum_square": lambda: (d * d).sum(axis=1), "l1": lambda: np.abs(d).sum(axis=1),
            "l2": lambda: np.sqrt((d * d).sum(axis=1)), "log_sum": lambda: np.log(d.sum(axis=1)),
        }[kind]()


def random_input(kind: str, shape, rng) -> np.ndarray:
    if kind == "prod":  # near 1, so that long products neither overflow nor vanish
        return rng.uniform(0.9, 1.1, shape).astype(np.float32)
    if kind == "log_sum":
        return rng.uniform(0.0, 2.0, shape).astype(np.float32)
    if kind == "log_sum_exp":
        return rng.normal(0.0, 30.0, shape).astype(np.float32)
    return rng.normal(0.0, 1.0, shape).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", KINDS)
def test_reduce_matches_numpy(lib, kind, shape):
    rng = np.random.default_rng(seed((kind, shape)))
    x = random_input(kind, shape, rng)
    if shape[1] == 0:
        pytest.skip("empty reductions are checked against onnx.reference below")
    got = run_reduce(lib, kind, x)
    want = reference(kind, x)
    if kind in ("max", "min"):
        np.testing.assert_array_equal(got, want.astype(np.float32))
        return
    assert np.all(np.abs(got - want) <= tolerance(kind, x, want)), np.max(np.abs(got - want) / tolerance(kind, x, want))


def tolerance(kind: str, x: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Float32 accumulation error bounds: a sum of n terms accumulated in chunks errs by at
    most about eps * (chunk + n / chunk) * sum(|terms|), whatever the cancellation; then
    the final step (divide, sqrt, log) and its own rounding."""
    d = x.astype(np.float64)
    n = x.shape[1]
    eps = 2.0 ** -24
    if kind == "prod":
        return 2 * eps * (n + 8) * np.abs(want)
    if kind == "log_sum_exp":
        return 1e-5 * np.abs(want) + 1e-5
    terms = d * d if kind in ("sum_square", "l2") else np.abs(d)
    raw = eps * (min(n, 128) + n / 32 + 8) * terms.sum(axis=1)
    if kind == "mean":
        final = raw / max(n, 1)
    elif kind == "l2":
        final = raw / np.maximum(2 * want, 1e-30)
    elif kind == "log_sum":
        final = raw / np.maximum(np.exp(want), 1e-30)
    else:
        final = raw
    return final + 1e-6 * np.abs(want) + 1e-30


def onnx_reduce(op: str, x: np.ndarray) -> np.ndarray:
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("inner", [1, 5, 40])
@pytest.mark.parametrize("kind", KINDS)
def test_empty_reduction_matches_onnx_reference(lib, kind, inner):
    x = np.zeros((3, 0, inner), dtype=np.float32)
    want = onnx_reduce(ONNX_OPS[kind], x)
    if kind == "mean":
        # Undefined in ONNX: onnx.reference (NumPy) gives NaN, onnxruntime 0, which both
        # backends follow (tests/test_reduce_empty.py).
        want = np.zeros_like(want)
    got = run_reduce(lib, kind, x)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("inner", [1, 3, 40])
@pytest.mark.parametrize("kind", ["max", "min", "sum", "log_sum_exp"])
def test_nan_propagates(lib, kind, inner):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 45, inner)).astype(np.float32)
    x[1, 0, 0] = np.nan  # first element of a slice
    x[2, 44, inner - 1] = np.nan  # last element, in the scalar tail of the row path
    x[3, 20, 0] = np.nan
    got = run_reduce(lib, kind, x)
    want = reference(kind, x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).sum() == 3


@pytest.mark.parametrize("inner", [1, 9])
def test_log_sum_exp_of_infinite_slices(lib, inner):
    x = np.zeros((4, 19, inner), dtype=np.float32)
    x[0] = -np.inf  # log(0) = -inf
    x[1, 3] = np.inf  # +inf
    x[2] = 1000.0  # no overflow: 1000 + log(19)
    x[3, 5] = -np.inf  # one -inf term contributes 0
    got = run_reduce(lib, "log_sum_exp", x)
    assert np.all(got[0] == -np.inf) and np.all(got[1] == np.inf)
    np.testing.assert_allclose(got[2], 1000.0 + np.log(19.0), rtol=1e-6)
    np.testing.assert_allclose(got[3], np.log(18.0), rtol=1e-6)


def numpy_arg(which: str, x: np.ndarray, last: bool) -> np.ndarray:
    f = np.argmax if which == "max" else np.argmin
    if not last:
        return f(x, axis=1)
    return x.shape[1] - 1 - f(np.flip(x, axis=1), axis=1)


@pytest.mark.parametrize("last", [False, True], ids=["first", "last"])
@pytest.mark.parametrize("which", ["max", "min"])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] > 0], ids=lambda s: "x".join(map(str, s)))
def test_arg_matches_numpy_with_ties(lib, which, shape, last):
    rng = np.random.default_rng(seed((which, shape, last)))
    # Few distinct values, so that the extreme usually occurs several times.
    x = rng.integers(-3, 4, shape).astype(np.float32)
    np.testing.assert_array_equal(run_arg(lib, which, x, last), numpy_arg(which, x, last))
    y = rng.normal(size=shape).astype(np.float32)
    np.testing.assert_array_equal(run_arg(lib, which, y, last), numpy_arg(which, y, last))


@pytest.mark.parametrize("last", [False, True], ids=["first", "last"])
@pytest.mark.parametrize("which", ["max", "min"])
@pytest.mark.parametrize("inner", [1, 5, 33])
def test_arg_with_nan_and_infinities(lib, which, inner, last):
    rng = np.random.default_rng(7)
    x = rng.integers(-2, 3, (5, 29, inner)).astype(np.float32)
    x[0, 3, :] = np.nan
    x[0, 17, :] = np.nan
    x[1, 2, :] = np.inf
    x[1, 28, :] = np.inf
    x[2, 0, :] = -np.inf
    x[3, 9, :] = -0.0
    np.testing.assert_array_equal(run_arg(lib, which, x, last), numpy_arg(which, x, last))


def test_arg_of_empty_axis_writes_zero(lib):
    x = np.zeros((2, 0, 3), dtype=np.float32)
    np.testing.assert_array_equal(run_arg(lib, "max", x, False), np.zeros((2, 3), dtype=np.int64))


def numpy_softmax(x: np.ndarray, log: bool) -> np.ndarray:
    d = x.astype(np.float64)
    z = d - d.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z - lse if log else np.exp(z - lse)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "logsoftmax"])
@pytest.mark.parametrize("scale", [1.0, 1000.0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softmax_matches_numpy(lib, shape, scale, log):
    rng = np.random.default_rng(seed((shape, scale, log)))
    x = (rng.normal(size=shape) * scale).astype(np.float32)
    got = run_softmax(lib, x, log)
    want = numpy_softmax(x, log)
    assert np.all(np.isfinite(got))
    # Softmax outputs that underflow in float32 are compared in absolute terms.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 if not log else 1e-5 * scale)


@pytest.mark.parametrize("inner", [1, 3, 40])
def test_softmax_constant_large_rows(lib, inner):
    x = np.full((2, 77, inner), 1000.0, dtype=np.float32)
    np.testing.assert_allclose(run_softmax(lib, x, False), 1.0 / 77, rtol=1e-6)
    np.testing.assert_allclose(run_softmax(lib, x, True), -np.log(77.0), rtol=1e-6)
