"""The GEMV path (kernels/gemv.py) against NumPy, and MatMul/Gemm with constant weights
(lower/linalg.py) against onnxruntime.

Kernel builds: this machine's widths (zmm on AVX-512), the AVX2 target's schedule built
without AVX-512, the AVX-512 schedule built without it (its ymm form, six vectors a
panel), each with every row count on the streaming path; this machine's own schedule (its
class may hand some or all row counts to the GEMM) and one handing M < 3 to it; a small-kc
schedule (several K blocks, every call parallel, software prefetch), a GEMV generated for
another panel width than the GEMM's, and a build without AVX2 (both
of the last hand every call to the GEMM). Shapes: M = 1..4 (and 0, 5: handed on), N and
K not multiples of the vector width or the panel, K = 0, A transposed through its
strides, B packed from its transpose (Gemm's transB), every bias form, alpha and beta,
Relu; C written into a NaN-filled buffer wider than the result.
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
from onnx import helper

import shapeshift
from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.codegen.defaults import default_schedule
from shapeshift.codegen.kernels import gemm, gemv
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.target import named_target

from . import test_native_ops_extra
from .test_native_backend import _const, _input, _model, _output

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler
ort = pytest.importorskip("onnxruntime")

AVX2_GEMM = default_schedule(named_target("x86-64-v3"))
AVX512_GEMM = default_schedule(named_target("x86-64-v4"))
SMALL_KC = GemmSchedule(kc=7, small_m=4)
NO_AVX512 = (*DEFAULT_FLAGS, "-mno-avx512f")
SCALAR_FLAGS = tuple(f for f in DEFAULT_FLAGS if f != "-march=native")

i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_CALL = [i64] * 5 + [ptr, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, f32, ptr, f32, i64, i64, ctypes.c_int]


def _build(cache, gemm_schedule, gemv_schedule, flags=None):
    src = PRELUDE + gemm.source(gemm_schedule) + gemv.source(gemv_schedule)
    lib = compile_library(src, name_hint="gemv_test", flags=flags, cache_dir=cache).cdll
    for fn in (lib.ss_gemv_prepacked, lib.ss_gemm_prepacked):
        fn.argtypes = _CALL
        fn.restype = None
    lib.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    lib.ss_gemm_packed_b_size.argtypes = [i64, i64]
    lib.ss_gemm_packed_b_size.restype = i64
    lib.ss_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def _every_row(schedule):
    return dataclasses.replace(schedule, min_m=1)


@pytest.fixture(scope="module")
def libs(build_cache):
    cache = build_cache
    # Every row count on the streaming path (min_m 1) whatever this CPU's class takes it for,
    # so that its kernels are tested on every machine; "class": this machine's own schedule.
    return {
        "native": _build(cache, default_schedule(), _every_row(gemv.default_schedule())),
        "avx2": _build(cache, AVX2_GEMM, _every_row(gemv.schedule_for(AVX2_GEMM)), NO_AVX512),
        "zmm_as_ymm": _build(cache, AVX512_GEMM, _every_row(gemv.schedule_for(AVX512_GEMM)), NO_AVX512),
        "class": _build(cache, default_schedule(), gemv.default_schedule()),
        "from_3": _build(cache, default_schedule(), dataclasses.replace(gemv.default_schedule(), min_m=3)),
        "small_kc": _build(cache, SMALL_KC, gemv.GemvSchedule(nr=SMALL_KC.nr, lanes=SMALL_KC.lanes,
                                                               registers=SMALL_KC.registers, prefetch_rows=3,
                                                               parallel_min_floats=0)),
        "other_nr": _build(cache, AVX2_GEMM, gemv.GemvSchedule(nr=AVX2_GEMM.nr + 8), NO_AVX512),
        # No AVX2 at all: every call handed to the GEMM's scalar code.
        "scalar": _build(cache, default_schedule(), gemv.default_schedule(), SCALAR_FLAGS),
    }


def _pack(lib, w, trans_b=False):
    """W [K, N] packed at load; with trans_b, from its transpose [N, K] as stored (Gemm's transB)."""
    k, n = w.shape
    packed = np.zeros(max(1, lib.ss_gemm_packed_b_size(k, n)), dtype=np.float32)
    if trans_b:
        stored = np.ascontiguousarray(w.T)
        lib.ss_gemm_pack_b(k, n, stored.ctypes.data, 1, k, packed.ctypes.data)
    else:
        lib.ss_gemm_pack_b(k, n, w.ctypes.data, n, 1, packed.ctypes.data)
    return packed


BIASES = {  # name -> (shape of the stored bias for M x N, rs, cs)
    "none": None, "row": (lambda m, n: (n,), 0, 1), "full": (lambda m, n: (m, n), "n", 1),
    "scalar": (lambda m, n: (1,), 0, 0), "column": (lambda m, n: (m, 1), 1, 0),
}


def _run(lib, m, n, k, trans_a=False, bias="none", alpha=1.0, beta=1.0, act=0, seed=0, threads=1, trans_b=False,
         fn="ss_gemv_prepacked"):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    stored = np.ascontiguousarray(a.T) if trans_a else a
    rsa, csa = (1, max(m, 1)) if trans_a else (k, 1)
    ldc = n + 3
    c = np.full((max(m, 1), ldc), np.nan, dtype=np.float32)
    want = alpha * (a.astype(np.float64) @ w.astype(np.float64))
    b_ptr, rs, cs = None, 0, 0
    if BIASES[bias] is not None:
        shape_of, rs, cs = BIASES[bias]
        bvals = rng.standard_normal(shape_of(m, n)).astype(np.float32)
        rs = n if rs == "n" else rs
        b_ptr = bvals.ctypes.data
        want = want + beta * np.broadcast_to(bvals.reshape(-1, 1) if bias == "column" else bvals, (m, n))
    if act:
        want = np.maximum(want, 0)
    lib.ss_set_num_threads(threads)
    packed = _pack(lib, w, trans_b)  # held: a temporary's address would dangle during the call
    getattr(lib, fn)(m, n, k, 1, 1, stored.ctypes.data, 0, 0, rsa, csa, packed.ctypes.data,
                     c.ctypes.data, 0, 0, ldc, alpha, b_ptr, beta, rs, cs, act)
    if m:
        np.testing.assert_allclose(c[:m, :n], want, rtol=1e-4, atol=1e-4 * (1 + np.sqrt(k)))
        assert np.isnan(c[:m, n:]).all(), "wrote past the N columns of C"
    return c[:m, :n]


SHAPES = [(1, 1, 1), (1, 7, 3), (2, 17, 5), (3, 47, 161), (4, 49, 333), (1, 100, 0), (2, 130, 64), (4, 97, 17),
          (1, 200, 1000), (3, 129, 7), (0, 9, 4), (5, 33, 20)]


@pytest.mark.parametrize("build", ["native", "avx2", "zmm_as_ymm", "class", "from_3", "small_kc", "other_nr", "scalar"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_matches_numpy(libs, build, m, n, k):
    _run(libs[build], m, n, k, seed=m * 1000 + n + k)


@pytest.mark.parametrize("build", ["native", "avx2", "zmm_as_ymm", "small_kc"])
@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_gemv_epilogue_and_transposed_operands(libs, build, bias, m):
    _run(libs[build], m, 53, 37, trans_a=True, bias=bias, alpha=0.5, beta=-1.5, act=int(bias != "none"), seed=m)
    _run(libs[build], m, 53, 37, trans_a=False, bias=bias, alpha=2.0, beta=0.25, act=0, seed=m + 10)
    _run(libs[build], m, 101, 170, trans_a=True, bias=bias, alpha=-1.0, beta=1.0, act=1, seed=m + 20, trans_b=True)


@pytest.mark.parametrize("build", ["native", "small_kc", "avx2"])
def test_gemv_thread_count_changes_no_bit(libs, build):
    # Large enough to run in parallel by default: the columns split between threads must
    # be summed in the same order as on one thread.
    for m in (1, 2, 3, 4):
        one = _run(libs[build], m, 1000, 300, seed=m, threads=1)
        two = _run(libs[build], m, 1000, 300, seed=m, threads=2)
        assert np.array_equal(one, two)


def test_rows_below_min_m_take_the_gemm_path(libs):
    # The GEMM's small-M path sums in another order than the streaming kernels (C reloaded
    # after each K block), so bits tell which path ran: below min_m (3 here) the GEMM's,
    # from it on the streaming one's (the "native" build: every row count streams).
    for m in (1, 2, 3, 4):
        args = dict(m=m, n=300, k=1000, seed=m, bias="row", act=1)
        got = _run(libs["from_3"], **args)
        gemm_sum = _run(libs["from_3"], **args, fn="ss_gemm_prepacked")
        streamed = _run(libs["native"], **args)
        assert not np.array_equal(gemm_sum, streamed), "the two paths' sums must differ for this to tell"
        assert np.array_equal(got, gemm_sum if m < 3 else streamed), m


def test_blocking_fits_the_registers():
    for vectors, registers in ((3, 32), (1, 32), (6, 16), (2, 16), (4, 16), (3, 16)):
        for m in range(1, gemv.MAX_ROWS + 1):
            b = gemv.blocking(m, vectors, registers, gemv.MAX_PANELS)
            assert vectors % b.width == 0 and 1 <= b.panels <= gemv.MAX_PANELS
            used = m * b.width * b.panels * b.sets + (b.width * b.panels if m > 1 else 0) + 1
            assert used <= registers, (m, vectors, registers, b)


def test_schedule_rejects_bad_fields():
    with pytest.raises(ValueError, match="max_m"):
        gemv.GemvSchedule(max_m=5)
    with pytest.raises(ValueError, match="min_m"):
        gemv.GemvSchedule(min_m=6)
    with pytest.raises(ValueError, match="nr"):
        gemv.GemvSchedule(nr=12)
    with pytest.raises(ValueError, match="vector ISA"):
        gemv.GemvSchedule(lanes=16, registers=16)


# -- end to end: MatMul and Gemm by a constant weight ---------------------------------------


def _rand(rng, shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _gemm_model(rng, trans_a, trans_b, k, n, with_c, alpha=1.0, beta=1.0):
    w = _rand(rng, (n, k) if trans_b else (k, n))
    inits = [_const("w", w)]
    inputs = ["x", "w"]
    if with_c:
        inits.append(_const("c", _rand(rng, (n,))))
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    x_dims = [k, "m"] if trans_a else ["m", k]
    return _model([node], [_input("x", x_dims)], [_output("y")], inits)


def _check(model, feeds, calls_gemv=True):
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops()
    code = "\n".join(s.lowered.code for s in program.steps if s.lowered is not None)
    assert ("ss_gemv_prepacked(" in code) == calls_gemv, code
    assert len(program.packs) == 1, "the constant weight is packed once, at load"
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        got, = session.run(None, feed)
        want, = reference.run(None, feed)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return session


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_constant_weight_any_transposition(trans_a, trans_b):
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    k, n = 37, 75
    model = _gemm_model(rng, trans_a, trans_b, k, n, with_c=True, alpha=0.75, beta=1.25)
    feeds = []
    for m in (1, 2, 3, 4, 5, 9):
        x = _rand(rng, (k, m) if trans_a else (m, k))
        feeds.append({"x": x})
    _check(model, feeds)


def test_gemm_lstm_step_shape_without_bias():
    # The TorchScript LSTM step: Gemm(x_t, W_ih, transB=1), W_ih [4H, I], M the batch.
    rng = np.random.default_rng(3)
    model = _gemm_model(rng, 0, 1, 100, 4 * 67, with_c=False)
    _check(model, [{"x": _rand(rng, (m, 100))} for m in (1, 2, 4, 7)])


def test_matmul_constant_weight_batched_rows_and_bias_relu():
    rng = np.random.default_rng(5)
    w, b = _rand(rng, (45, 70)), _rand(rng, (70,))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["q"]),
             helper.make_node("Relu", ["q"], ["y"])]
    model = _model(nodes, [_input("x", ["s", "t", 45])], [_output("y")], [_const("w", w), _const("b", b)])
    _check(model, [{"x": _rand(rng, shape)} for shape in ((1, 1, 45), (1, 3, 45), (2, 2, 45), (3, 5, 45))])


def test_static_m_past_the_gemv_rows_keeps_the_gemm():
    rng = np.random.default_rng(7)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_input("x", [6, 33])], [_output("y")],
                   [_const("w", _rand(rng, (33, 20)))])
    _check(model, [{"x": _rand(rng, (6, 33))}], calls_gemv=False)
