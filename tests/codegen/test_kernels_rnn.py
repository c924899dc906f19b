"""ss_lstm (shapeshift/codegen/kernels/rnn.py) against onnxruntime.

A one-node LSTM model (opset 14, layout 0) at each direction, with and without bias and
initial states, odd sizes, every output or only some; the same random inputs go to the
kernel, whose workspace starts as NaN so that a read of unwritten scratch shows. R goes
in as it is (packed by the kernel into its workspace) or packed beforehand by
ss_rnn_pack; the fragment is built for this machine and with -mno-avx512f (ymm blocks).
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.build import DEFAULT_FLAGS
from shapeshift.codegen.kernels import rnn, vmath

from .naive_gemm import build_with_gemm

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}


I32P, INT = ctypes.POINTER(ctypes.c_int32), ctypes.c_int
KIND_LSTM = 3


@pytest.fixture(scope="module", params=["native", "ymm"])
def lib(request, build_cache):
    flags = (*DEFAULT_FLAGS, "-mno-avx512f") if request.param == "ymm" else None
    cdll = build_with_gemm(vmath.source() + rnn.source(), build_cache, f"test_rnn_{request.param}",
                           flags=flags).cdll
    cdll.ss_lstm.restype = None
    cdll.ss_lstm.argtypes = ([F32P] * 6 + [I32P] + [F32P] * 6 + [I64] * 4 + [INT] * 3 + [I32P, F32P, F32P]
                             + [ctypes.c_float, F32P])
    cdll.ss_recur_work_size.restype = I64
    cdll.ss_recur_work_size.argtypes = [I64] * 4 + [INT, INT]
    cdll.ss_rnn_packed_size.restype = I64
    cdll.ss_rnn_packed_size.argtypes = [I64, I64, INT]
    cdll.ss_rnn_pack.restype = None
    cdll.ss_rnn_pack.argtypes = [F32P, I64, I64, INT, F32P]
    return cdll


def lstm(lib, inputs, outs, T, B, I, H, direction, prepacked=False):
    """ss_lstm on ``inputs`` (ONNX names) into ``outs`` (Y, Y_h, Y_c; None: not asked for),
    workspace and packed copy NaN-filled."""
    D = 2 if direction == 2 else 1
    packed = None
    if prepacked:
        packed = np.full(lib.ss_rnn_packed_size(D, H, 4), np.nan, np.float32)
        lib.ss_rnn_pack(ptr(inputs["R"]), D, H, KIND_LSTM, ptr(packed))
    work = np.full(max(lib.ss_recur_work_size(T, B, H, D, KIND_LSTM, int(prepacked)), 1), np.nan, np.float32)
    lib.ss_lstm(ptr(inputs["X"]), ptr(inputs["W"]), None, None if prepacked else ptr(inputs["R"]), ptr(packed),
                ptr(inputs.get("B")), None, ptr(inputs.get("initial_h")), ptr(inputs.get("initial_c")), None,
                *(ptr(o) for o in outs), T, B, I, H, direction, 0, 0, None, None, None, -1.0, ptr(work))


def ptr(a):
    return None if a is None else a.ctypes.data_as(F32P)


def run_ort(inputs, hidden, direction):
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c"]
    given = [n if inputs.get(n) is not None else "" for n in names]
    while given and not given[-1]:
        given.pop()
    node = helper.make_node("LSTM", given, ["Y", "Y_h", "Y_c"], hidden_size=hidden, direction=direction)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, inputs[n].shape) for n in given if n],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: inputs[n] for n in given if n})


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("with_bias,with_state,prepacked", [(False, False, False), (True, False, True),
                                                            (False, True, True), (True, True, False)])
@pytest.mark.parametrize("T,B,I,H", [(1, 1, 1, 1), (5, 3, 7, 9), (9, 2, 4, 17), (3, 33, 10, 40)])
def test_lstm(lib, direction, with_bias, with_state, prepacked, T, B, I, H):
    rng = np.random.default_rng(abs(hash((direction, with_bias, with_state, T, B, I, H))) % 2**32)
    D = 2 if direction == "bidirectional" else 1

    def rand(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    inputs = {"X": rand(T, B, I), "W": rand(D, 4 * H, I), "R": rand(D, 4 * H, H),
              "B": rand(D, 8 * H) if with_bias else None,
              "initial_h": rand(D, B, H) if with_state else None,
              "initial_c": rand(D, B, H) if with_state else None}
    expected = run_ort(inputs, H, direction)
    Y, Y_h, Y_c = (np.full(e.shape, np.nan, np.float32) for e in expected)
    lstm(lib, inputs, (Y, Y_h, Y_c), T, B, I, H, DIRECTIONS[direction], prepacked)
    for got, want in zip((Y, Y_h, Y_c), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_lstm_optional_outputs(lib):
    """Y and Y_c NULL: only Y_h is written, and it still matches."""
    rng = np.random.default_rng(3)
    T, B, I, H = 4, 2, 3, 5
    inputs = {"X": rng.uniform(-1, 1, (T, B, I)).astype(np.float32),
              "W": rng.uniform(-1, 1, (1, 4 * H, I)).astype(np.float32),
              "R": rng.uniform(-1, 1, (1, 4 * H, H)).astype(np.float32)}
    expected = run_ort(inputs, H, "forward")
    Y_h = np.full(expected[1].shape, np.nan, np.float32)
    lstm(lib, inputs, (None, Y_h, None), T, B, I, H, 0)
    np.testing.assert_allclose(Y_h, expected[1], rtol=1e-4, atol=1e-5)


def test_lstm_tiles_split_only_on_a_small_register_file():
    """16 ymm registers: an LSTM tile of all four gates holds 2 rows, so rows 3..6 run as two
    passes of two gates, each over a panel of its own, and the generated dispatch has those
    passes and whole tiles that read both panels; 32 zmm registers hold 6 rows of all four
    and never split (one panel)."""
    from shapeshift.codegen.kernels import rnn_step

    assert rnn_step.rows_per_tile(16, 4) == 2 and rnn_step.split_rows(16) == 6 and rnn_step.lstm_rows(16) == 6
    assert rnn_step.split_rows(32) == 0 and rnn_step.lstm_rows(32) == rnn_step.rows_per_tile(32, 4) == 6
    assert rnn_step.lstm_panels(16) == 2 and rnn_step.lstm_panels(32) == 1
    ymm = rnn_step._vector_branch(16, 8)
    assert "#define SS_RNN_LSTM_PANELS 2" in ymm
    assert all(f"case {4 * 16 + r}: ss_rnn_dot_g2o4_r{r}(P, h, ldh, H, out); "
               f"ss_rnn_dot_g2o4_r{r}(P + 2 * H * SS_RNN_VW," in ymm for r in range(3, 7))
    assert "case 66: ss_rnn_dot_g4p2_r2(" in ymm
    zmm = rnn_step._vector_branch(32, 16)
    assert "#define SS_RNN_LSTM_PANELS 1" in zmm and "case 70: ss_rnn_dot_g4_r6(" in zmm
    assert "o4_r" not in zmm and "g4p2" not in zmm


_ACTIVATIONS_HARNESS = r"""
void ss_test_gate_acts(const float* x, int64_t n, float* tv, float* sv, float* ts, float* ss) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(tv + i, ss_rg_tanh(_mm256_loadu_ps(x + i)));
        _mm256_storeu_ps(sv + i, ss_rg_sigmoid(_mm256_loadu_ps(x + i)));
    }
    for (i = 0; i < n; ++i) {
        ts[i] = ss_rg_tanhf(x[i]);
        ss[i] = ss_rg_sigmoidf(x[i]);
    }
}
"""


def test_ymm_gate_activations(tmp_path):
    """The ymm gate updates' rational tanh and sigmoid (rnn_gates.RATIONAL_TANH_*): each
    vector lane equals its scalar twin bit for bit, tanh is within 4e-7 of tanh relative
    (and in [-1, 1]), sigmoid within 2.5e-7 absolute (and in [0, 1]); NaN stays NaN and
    infinities saturate. Built with -mno-avx512f, where the ymm blocks run."""
    cdll = build_with_gemm(vmath.source() + rnn.source() + _ACTIVATIONS_HARNESS, tmp_path, "test_rnn_acts",
                           flags=(*DEFAULT_FLAGS, "-mno-avx512f")).cdll
    cdll.ss_test_gate_acts.restype = None
    cdll.ss_test_gate_acts.argtypes = [F32P, I64, F32P, F32P, F32P, F32P]
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-30, 30, 600_001), np.geomspace(1e-12, 1, 20_000), -np.geomspace(1e-12, 1, 20_000),
                        rng.standard_normal(20_000) * 4, [0.0, -0.0, np.inf, -np.inf, np.nan, 9.0, -9.0, 1e30]])
    x = x.astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 8, np.float32)])
    tv, sv, ts, ss = (np.empty_like(x) for _ in range(4))
    ptr = [a.ctypes.data_as(F32P) for a in (x, tv, sv, ts, ss)]
    cdll.ss_test_gate_acts(ptr[0], len(x), *ptr[1:])
    np.testing.assert_array_equal(tv.view(np.uint32), ts.view(np.uint32))
    np.testing.assert_array_equal(sv.view(np.uint32), ss.view(np.uint32))
    finite = np.isfinite(x)
    x64 = x[finite].astype(np.float64)
    tanh, sig = np.tanh(x64), 0.5 * (1.0 + np.tanh(0.5 * x64))
    assert np.all(np.abs(ts[finite] - tanh) <= 4e-7 * np.maximum(np.abs(tanh), 1e-30))
    assert np.abs(ss[finite] - sig).max() <= 2.5e-7
    assert np.nanmin(ts) >= -1 and np.nanmax(ts) <= 1 and np.nanmin(ss) >= 0 and np.nanmax(ss) <= 1
    nan, pinf, ninf = (np.flatnonzero(np.isnan(x))[0], np.flatnonzero(x == np.inf)[0], np.flatnonzero(x == -np.inf)[0])
    assert np.isnan(ts[nan]) and np.isnan(ss[nan])
    assert (ts[pinf], ts[ninf], ss[pinf], ss[ninf]) == (1.0, -1.0, 1.0, 0.0)
