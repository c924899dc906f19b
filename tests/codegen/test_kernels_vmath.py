"""The vmath helpers (shapeshift/codegen/kernels/vmath.py) against float64 NumPy / math.

The helpers are static inline, so a small exported wrapper applies one of them to an
array, either through the AVX2 helper (8 lanes at a time, the tail padded) or through
its scalar twin.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import vmath
from shapeshift.codegen.kernels.prelude import PRELUDE

WRAPPER = r"""
typedef float (*ss_test_fn)(float);

int ss_test_has_fma(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* which: 0 exp, 1 log, 2 tanh, 3 erf, 4 sigmoid, 5 silu, 6 exp for x <= 0 (ss_exp_nonpos8,
   whose scalar twin is ss_expf); vector: use the AVX2 helper. */
void ss_test_apply(int which, int vector, const float* x, float* y, int64_t n) {
    static const ss_test_fn scalar[7] = {ss_expf, ss_logf, ss_tanhf, ss_erff, ss_sigmoidf, ss_siluf, ss_expf};
    int64_t i = 0;
#ifdef __AVX2__
    for (; vector && i < n; i += 8) {
        float buf[8] = {0};
        int64_t m = n - i < 8 ? n - i : 8;
        memcpy(buf, x + i, (size_t)m * 4);
        __m256 v = _mm256_loadu_ps(buf);
        switch (which) {
            case 0: v = ss_exp8(v); break;
            case 1: v = ss_log8(v); break;
            case 2: v = ss_tanh8(v); break;
            case 3: v = ss_erf8(v); break;
            case 4: v = ss_sigmoid8(v); break;
            case 5: v = ss_silu8(v); break;
            default: v = ss_exp_nonpos8(v); break;
        }
        _mm256_storeu_ps(buf, v);
        memcpy(y + i, buf, (size_t)m * 4);
    }
#endif
    for (; i < n; i++) y[i] = scalar[which](x[i]);
}

/* act (1 relu, 2 sigmoid, 3 silu) through the zmm helper ss_act16, 16 lanes at a time;
   returns 0, writing nothing, in a build without AVX-512. */
int ss_test_act16(int act, const float* x, float* y, int64_t n) {
#ifdef __AVX512F__
    for (int64_t i = 0; i < n; i += 16) {
        float buf[16] = {0};
        int64_t m = n - i < 16 ? n - i : 16;
        memcpy(buf, x + i, (size_t)m * 4);
        _mm512_storeu_ps(buf, ss_act16(_mm512_loadu_ps(buf), act));
        memcpy(y + i, buf, (size_t)m * 4);
    }
    return 1;
#else
    (void)act; (void)x; (void)y; (void)n;
    return 0;
#endif
}

/* ONNX Gelu, exact (tanh == 0) or its tanh approximation, by the vector or scalar helper. */
void ss_test_gelu(int tanh, int vector, const float* x, float* y, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    for (; vector && i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(y + i, tanh ? ss_gelu_tanh8(v) : ss_gelu8(v));
    }
#endif
    for (; i < n; i++) y[i] = tanh ? ss_gelu_tanhf(x[i]) : ss_geluf(x[i]);
}
"""

NAMES = ("exp", "log", "tanh", "erf", "sigmoid", "silu")
# Tested against ss_exp8 only (test_exp_nonpos_is_exp_bit_for_bit): not in NAMES's sweeps.
EXP_NONPOS = len(NAMES)
RTOL = 4e-7
# Results below the normal range are judged in absolute terms: one subnormal ulp.
SUBNORMAL_ULP = 2.0 ** -149
FLT_MIN = 2.0 ** -126


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _silu64(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid64(x)


REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": _erf64, "sigmoid": _sigmoid64, "silu": _silu64}


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = compile_library(PRELUDE + vmath.source() + WRAPPER, name_hint="test vmath",
                           cache_dir=build_cache).cdll
    cdll.ss_test_apply.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cdll.ss_test_apply.restype = None
    cdll.ss_test_has_fma.restype = ctypes.c_int
    cdll.ss_test_gelu.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cdll.ss_test_gelu.restype = None
    cdll.ss_test_act16.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cdll.ss_test_act16.restype = ctypes.c_int
    return cdll


def apply(lib, name: str, vector: bool, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full_like(x, 12345.0)
    which = EXP_NONPOS if name == "exp_nonpos" else NAMES.index(name)
    lib.ss_test_apply(which, int(vector), x.ctypes.data, y.ctypes.data, x.size)
    return y


def sweep(name: str) -> np.ndarray:
    """Every 4099th float32 bit pattern (all magnitudes, subnormals included) plus dense
    linear sweeps over the ranges where the formulas switch; positive only for log."""
    patterns = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    patterns = patterns[np.isfinite(patterns)]
    parts = [patterns, np.linspace(-110, 110, 400_001, dtype=np.float32),
             np.linspace(-4.5, 4.5, 400_001, dtype=np.float32),
             np.linspace(-1e-3, 1e-3, 20_001, dtype=np.float32)]
    x = np.concatenate(parts)
    return np.abs(x) if name == "log" else x


@pytest.mark.parametrize("vector", [True, False], ids=["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_accuracy_over_a_dense_sweep(lib, name, vector):
    x = sweep(name)
    y = apply(lib, name, vector, x).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = REFERENCE[name](x.astype(np.float64))
        ref32 = ref.astype(np.float32).astype(np.float64)
    # Overflow and underflow where float32 overflows / rounds to zero.
    assert np.array_equal(np.isinf(y), np.isinf(ref32)), x[np.isinf(y) != np.isinf(ref32)][:5]
    assert not np.isnan(y).any(), x[np.isnan(y)][:5]
    finite = np.isfinite(ref32)
    err = np.abs(y[finite] - ref[finite])
    allowed = np.maximum(RTOL * np.abs(ref[finite]), SUBNORMAL_ULP)
    worst = np.argmax(err / allowed)
    assert err[worst] <= allowed[worst], (
        f"{name}: x={x[finite][worst]!r} got {y[finite][worst]!r} want {ref[finite][worst]!r}")
    if name in ("exp", "sigmoid", "silu"):
        assert np.all(y[(ref32 == 0) & finite] == 0)


# Hand-checked results for NaN, +inf, -inf, +0, -0 (signs of zeros matter: tanh(-0) = -0).
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
EXPECTED = {
    "exp": [np.nan, np.inf, 0.0, 1.0, 1.0],
    "log": [np.nan, np.inf, np.nan, -np.inf, -np.inf],
    "tanh": [np.nan, 1.0, -1.0, 0.0, -0.0],
    "erf": [np.nan, 1.0, -1.0, 0.0, -0.0],
    "sigmoid": [np.nan, 1.0, 0.0, 0.5, 0.5],
    "silu": [np.nan, np.inf, np.nan, 0.0, -0.0],  # -inf * sigmoid(-inf) = -inf * 0
}
# Edges of the ranges: exp's overflow and underflow, subnormals, the largest floats.
EDGES = np.array([1.0, -1.0, 88.72, 88.73, -87.3, -103.0, -104.0, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38,
                  0.625, -0.625, 3.93, -3.93], dtype=np.float32)


@pytest.mark.parametrize("vector", [True, False], ids=["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_special_values(lib, name, vector):
    want = np.array(EXPECTED[name], dtype=np.float32)
    got = apply(lib, name, vector, SPECIALS)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    assert np.array_equal(got[keep], want[keep])
    assert np.array_equal(np.signbit(got[keep]), np.signbit(want[keep]))


@pytest.mark.parametrize("vector", [True, False], ids=["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_range_edges(lib, name, vector):
    x = np.abs(EDGES) if name == "log" else EDGES
    with np.errstate(all="ignore"):
        want = REFERENCE[name](x.astype(np.float64))
        want32 = want.astype(np.float32)
    got = apply(lib, name, vector, x).astype(np.float64)
    assert np.array_equal(np.isinf(got), np.isinf(want32))
    finite = np.isfinite(want32)
    np.testing.assert_allclose(got[finite], want[finite], rtol=RTOL, atol=SUBNORMAL_ULP)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name", NAMES)
def test_scalar_twin_matches_the_vector_helper_bit_for_bit(lib, name):
    if not lib.ss_test_has_fma():
        pytest.skip("without AVX2 and FMA the twins round differently (or there is no vector helper)")
    x = sweep(name)
    x = x[np.isfinite(x)]
    assert np.array_equal(apply(lib, name, True, x).view(np.uint32), apply(lib, name, False, x).view(np.uint32))


def test_exp_nonpos_is_exp_bit_for_bit(lib):
    # Softmax's exponentials (x - max <= 0) take the short form where no lane of a vector is
    # below ln(FLT_MIN) and ss_exp8 where one is: the same bits either way, subnormal
    # results, -inf (0), -0 (1) and NaN included. Vectors mixing both kinds come from the
    # dense sweep across the bound, whose lanes straddle it.
    every = np.arange(0x80000000, 0xC3000000, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.float32(-87.3365479) + np.arange(-64, 64, dtype=np.float32) * np.float32(2.0 ** -17)
    x = np.concatenate([every, np.linspace(-110, 0, 600_001, dtype=np.float32), edges,
                        np.array([-np.inf, -0.0, 0.0, np.nan, -np.nan], np.float32)])
    assert (x[~np.isnan(x)] <= 0).all()
    got, want = apply(lib, "exp_nonpos", True, x), apply(lib, "exp", True, x)
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got)) and nan.sum() == 2
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert (got[~nan] < np.float32(2.0 ** -126)).sum() > 1000  # the subnormal range was reached
    assert got[x == -np.inf][0] == 0.0


def test_vector_tail_lengths(lib):
    # Lengths that are not multiples of 8 leave a tail: every element must still be written.
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 23):
        x = rng.uniform(-5, 5, n).astype(np.float32)
        np.testing.assert_allclose(apply(lib, "exp", True, x), np.exp(x.astype(np.float64)), rtol=RTOL)


def _gelu(lib, tanh: bool, vector: bool, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full_like(x, 12345.0)
    lib.ss_test_gelu(int(tanh), int(vector), x.ctypes.data, y.ctypes.data, x.size)
    return y


def _gelu64(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))


@pytest.mark.parametrize("vector", [True, False], ids=["avx2", "scalar"])
@pytest.mark.parametrize("tanh", [False, True], ids=["erf", "tanh"])
def test_gelu_against_float64(lib, tanh, vector):
    """The fused Gelu helpers (what a vectorized Gelu loop runs). For negative x the
    formula's 1 + erf cancels, as onnxruntime's does in float32: an absolute tolerance there.
    NaN where the float64 formula gives NaN too (-inf: -inf * 0)."""
    x = np.concatenate([np.linspace(-12, 12, 200_003, dtype=np.float32), SPECIALS[:3],
                        np.array([3.4e38, -3.4e38, 1e-40, -1e-40], dtype=np.float32)])
    got = _gelu(lib, tanh, vector, x).astype(np.float64)
    with np.errstate(all="ignore"):
        want = _gelu64(x.astype(np.float64), tanh)
    assert np.array_equal(np.isnan(got), np.isnan(want)), x[np.isnan(got) != np.isnan(want)][:5]
    finite = np.isfinite(want) & (np.abs(x) < 1e38)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("tanh", [False, True], ids=["erf", "tanh"])
def test_gelu_scalar_twin_matches_the_vector_helper_bit_for_bit(lib, tanh):
    if not lib.ss_test_has_fma():
        pytest.skip("without AVX2 and FMA the twins round differently (or there is no vector helper)")
    x = np.linspace(-12, 12, 100_000, dtype=np.float32)
    assert np.array_equal(_gelu(lib, tanh, True, x).view(np.uint32), _gelu(lib, tanh, False, x).view(np.uint32))


@pytest.mark.parametrize("act,name", [(2, "sigmoid"), (3, "silu")])
def test_zmm_twins_match_the_ymm_helpers_bit_for_bit(lib, act, name):
    # ss_act16 (the conv epilogues' activation on AVX-512 builds) runs ss_sigmoid8's and
    # ss_silu8's operations in the same order: the same bits, specials and SiLU's far-left
    # route (below -87.33) included, at lengths that leave a ragged last vector.
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -87.33, -87.34, -100.0, -128.0, -200.0, 88.0, 89.5,
                         1e-40, -1e-40], np.float32)
    x = np.concatenate([sweep(name), specials])
    x = x if x.size % 16 else np.append(x, np.float32(0.5))
    y = np.full_like(x, 12345.0)
    if not lib.ss_test_act16(act, x.ctypes.data, y.ctypes.data, x.size):
        pytest.skip("no AVX-512 in this build: ss_act16 does not exist here")
    assert np.array_equal(y.view(np.uint32), apply(lib, name, True, x).view(np.uint32))


def test_zmm_relu_keeps_nan(lib):
    x = np.array([np.nan, -1.0, 0.0, -0.0, 2.5, np.inf, -np.inf] * 3, np.float32)
    y = np.full_like(x, 12345.0)
    if not lib.ss_test_act16(1, x.ctypes.data, y.ctypes.data, x.size):
        pytest.skip("no AVX-512 in this build: ss_act16 does not exist here")
    expected = np.where(np.isnan(x), x, np.maximum(x, 0))
    assert np.array_equal(np.isnan(y), np.isnan(expected)) and np.array_equal(y[~np.isnan(y)], expected[~np.isnan(y)])
