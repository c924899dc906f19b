"""ss_rnn and ss_gru (shapeshift/codegen/kernels/rnn.py) against a float64 NumPy reference.

The reference below follows the ONNX equations step by step, one direction at a time, in
layout 0 (layout 1 transposes on the way in and out), and masks rows past their
sequence length the way onnxruntime does (state kept, zero output, zero Y_h for a row
of length 0). Every direction, both layouts, both GRU ``linear_before_reset`` values,
sizes of 1 and odd sizes, with and without bias, initial state and sequence lengths; the
kernel's workspace and outputs start as NaN so that a read of unwritten scratch, or a
value never written, shows. R goes in as it is (the kernel packs it into its workspace)
in layout 0 and packed beforehand by ss_rnn_pack in layout 1; the fragment is built for
this machine, with -mno-avx512f (ymm blocks, 16-register row tiles), and with a small
projection chunk (several chunks per direction).
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest

from shapeshift.codegen.build import DEFAULT_FLAGS
from shapeshift.codegen.kernels import rnn, vmath

from .naive_gemm import build_with_gemm

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, I32P, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}
GATES = {"RNN": 1, "GRU": 3}
DEFAULT_ACTIVATIONS = {"RNN": [("tanh", 0.0, 0.0)], "GRU": [("sigmoid", 0.0, 0.0), ("tanh", 0.0, 0.0)]}


# Builds: this machine's; -mno-avx512f (ymm blocks); and input projections computed 97
# floats at a time (several chunks per direction, in either order, whatever the layout).
BUILDS = {"native": ((), None), "ymm": (("-mno-avx512f",), None), "chunks": ((), 97)}


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request, build_cache):
    extra, chunk = BUILDS[request.param]
    flags = (*DEFAULT_FLAGS, *extra) if extra else None
    cdll = build_with_gemm(vmath.source() + rnn.source(chunk_floats=chunk), build_cache,
                           f"test_rnn_gru_{request.param}", flags=flags).cdll
    head = [F32P] * 6 + [I32P] + [F32P] * 3 + [I64] * 4 + [ctypes.c_int] * 2
    tail = [I32P, F32P, F32P, ctypes.c_float, F32P]
    cdll.ss_rnn.argtypes = head + tail
    cdll.ss_gru.argtypes = head + [ctypes.c_int] + tail
    cdll.ss_rnn.restype = cdll.ss_gru.restype = None
    cdll.ss_recur_work_size.restype = I64
    cdll.ss_recur_work_size.argtypes = [I64] * 4 + [ctypes.c_int] * 2
    cdll.ss_rnn_packed_size.restype = I64
    cdll.ss_rnn_packed_size.argtypes = [I64, I64, ctypes.c_int]
    cdll.ss_rnn_pack.restype = None
    cdll.ss_rnn_pack.argtypes = [F32P, I64, I64, ctypes.c_int, F32P]
    return cdll


# -- float64 reference -------------------------------------------------------------------------


def _activation(name, alpha, beta, x):
    return {
        "sigmoid": lambda: 1.0 / (1.0 + np.exp(-x)),
        "tanh": lambda: np.tanh(x),
        "relu": lambda: np.maximum(x, 0.0),
        "affine": lambda: alpha * x + beta,
        "leakyrelu": lambda: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda: np.where(x > alpha, x, 0.0),
        "scaledtanh": lambda: alpha * np.tanh(beta * x),
        "hardsigmoid": lambda: np.clip(alpha * x + beta, 0.0, 1.0),
        "elu": lambda: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
        "softsign": lambda: x / (1.0 + np.abs(x)),
        "softplus": lambda: np.logaddexp(0.0, x),
    }[name]()


def _cell(op, acts, clip, lbr, x, h, r, rb):
    """One step of one direction: x is the input projection plus Wb, [B, G*H]."""
    def act(k, v):
        return _activation(*acts[k], v if clip is None else np.clip(v, -clip, clip))

    if op == "RNN":
        return act(0, x + h @ r.T + rb)
    H = h.shape[1]
    z = act(0, x[:, :H] + h @ r[:H].T + rb[:H])
    reset = act(0, x[:, H:2 * H] + h @ r[H:2 * H].T + rb[H:2 * H])
    if lbr:
        cand = act(1, x[:, 2 * H:] + reset * (h @ r[2 * H:].T + rb[2 * H:]))
    else:
        cand = act(1, x[:, 2 * H:] + (reset * h) @ r[2 * H:].T + rb[2 * H:])
    return (1 - z) * cand + z * h


def reference(op, X, W, R, bias, lens, h0, direction, layout=0, lbr=0, acts=None, clip=None):
    """(Y, Y_h) in float64, the layout of the inputs."""
    X, W, R = (a.astype(np.float64) for a in (X, W, R))
    if layout:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
    T, B, _ = X.shape
    D, H = W.shape[0], R.shape[-1]
    G = GATES[op] * H
    bias = np.zeros((D, 2 * G)) if bias is None else bias.astype(np.float64)
    h0 = np.zeros((D, B, H)) if h0 is None else h0.astype(np.float64)
    Y, Y_h = np.zeros((T, D, B, H)), np.zeros((D, B, H))
    for d in range(D):
        h = h0[d]
        dir_acts = (acts or {}).get(d, DEFAULT_ACTIVATIONS[op])
        steps = range(T - 1, -1, -1) if direction == "reverse" or d == 1 else range(T)
        for t in steps:
            new = _cell(op, dir_acts, clip, lbr, X[t] @ W[d].T + bias[d, :G], h, R[d], bias[d, G:])
            active = np.ones((B, 1), bool) if lens is None else (t < lens)[:, None]
            h = np.where(active, new, h)
            Y[t, d] = np.where(active, new, 0.0)
        Y_h[d] = h if lens is None else np.where((lens > 0)[:, None], h, 0.0)
    if layout:
        return Y.transpose(2, 0, 1, 3), Y_h.transpose(1, 0, 2)
    return Y, Y_h


# -- calling the kernels ------------------------------------------------------------------------


def ptr(a, kind=F32P):
    return None if a is None else a.ctypes.data_as(kind)


def run_kernel(lib, op, inputs, direction, layout=0, lbr=0, acts=None, clip=None, outputs=("Y", "Y_h"),
               prepacked=None):
    """The kernel's (Y, Y_h), each None where not asked for; unwritten elements stay NaN.
    ``prepacked`` (default: in layout 1) packs R with ss_rnn_pack first."""
    X, R = inputs["X"], inputs["R"]
    T, B = X.shape[:2] if layout == 0 else X.shape[1::-1]
    I, H, D = X.shape[2], R.shape[-1], R.shape[0]
    y_shape = (T, D, B, H) if layout == 0 else (B, T, D, H)
    s_shape = (D, B, H) if layout == 0 else (B, D, H)
    Y = np.full(y_shape, np.nan, np.float32) if "Y" in outputs else None
    Y_h = np.full(s_shape, np.nan, np.float32) if "Y_h" in outputs else None
    kind = 0 if op == "RNN" else (2 if lbr else 1)
    prepacked = layout == 1 if prepacked is None else prepacked
    packed = None
    if prepacked:
        packed = np.full(max(lib.ss_rnn_packed_size(D, H, GATES[op]), 1), np.nan, np.float32)
        lib.ss_rnn_pack(ptr(R), D, H, kind, ptr(packed))
    work = np.full(max(lib.ss_recur_work_size(T, B, H, D, kind, int(prepacked)), 1), np.nan, np.float32)
    codes = alphas = betas = None
    if acts is not None:
        flat = [acts[d][k] for d in range(D) for k in range(len(acts[d]))]
        codes = np.array([rnn.ACTIVATION_CODES[name] for name, _, _ in flat], np.int32)
        alphas = np.array([a for _, a, _ in flat], np.float32)
        betas = np.array([b for _, _, b in flat], np.float32)
    lens = inputs.get("sequence_lens")
    args = [ptr(X), ptr(inputs["W"]), None, None if prepacked else ptr(R), ptr(packed), ptr(inputs.get("B")),
            ptr(lens, I32P), ptr(inputs.get("initial_h")),
            ptr(Y), ptr(Y_h), T, B, I, H, DIRECTIONS[direction], layout]
    tail = [ptr(codes, I32P), ptr(alphas), ptr(betas), -1.0 if clip is None else clip, ptr(work)]
    if op == "RNN":
        lib.ss_rnn(*args, *tail)
    else:
        lib.ss_gru(*args, lbr, *tail)
    return Y, Y_h


def make_inputs(rng, op, T, B, I, H, direction, layout, with_bias, with_state, with_lens, scale=1.0):
    D, G = (2 if direction == "bidirectional" else 1), GATES[op] * H

    def rand(*shape):
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    inputs = {"X": rand(*((T, B, I) if layout == 0 else (B, T, I))), "W": rand(D, G, I), "R": rand(D, G, H)}
    if with_bias:
        inputs["B"] = rand(D, 2 * G)
    if with_state:
        inputs["initial_h"] = rand(*((D, B, H) if layout == 0 else (B, D, H)))
    if with_lens:
        lens = rng.integers(0, T + 1, B).astype(np.int32)
        lens[0] = max(T - 1, 0)  # at least one row shorter than the sequence ...
        lens[-1] = T if B > 1 else lens[-1]  # ... and one that runs to the end
        inputs["sequence_lens"] = lens
    return inputs


def check(lib, op, inputs, direction, layout=0, lbr=0, acts=None, clip=None, rtol=1e-4, atol=2e-5):
    lens = inputs.get("sequence_lens")
    want = reference(op, inputs["X"], inputs["W"], inputs["R"], inputs.get("B"), lens, inputs.get("initial_h"),
                     direction, layout, lbr, acts, clip)
    got = run_kernel(lib, op, inputs, direction, layout, lbr, acts, clip)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# -- tests --------------------------------------------------------------------------------------

SIZES = [(1, 1, 1, 1), (5, 3, 7, 9), (9, 2, 4, 17), (3, 33, 10, 40), (1, 4, 3, 8)]
OPTIONS = {"plain": (False, False, False), "bias_state": (True, True, False), "all": (True, True, True),
           "lens_only": (False, False, True)}
VARIANTS = {"rnn": ("RNN", 0), "gru": ("GRU", 0), "gru_lbr": ("GRU", 1)}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("T,B,I,H", SIZES)
def test_against_reference(lib, variant, direction, layout, options, T, B, I, H):
    op, lbr = VARIANTS[variant]
    seed = abs(hash((variant, direction, layout, options, T, B, I, H))) % 2**32
    inputs = make_inputs(np.random.default_rng(seed), op, T, B, I, H, direction, layout, *OPTIONS[options])
    check(lib, op, inputs, direction, layout, lbr)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", [0, 1])
def test_all_rows_of_length_zero_or_full(lib, variant, layout):
    """Lengths 0 and T only: zero outputs and zero Y_h for the empty rows, h0 untouched elsewhere."""
    op, lbr = VARIANTS[variant]
    inputs = make_inputs(np.random.default_rng(7), op, 4, 5, 3, 6, "bidirectional", layout, True, True, False)
    inputs["sequence_lens"] = np.array([0, 4, 0, 4, 0], np.int32)
    check(lib, op, inputs, "bidirectional", layout, lbr)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("wanted", [("Y",), ("Y_h",)])
def test_one_output_only(lib, variant, wanted):
    """The absent output is NULL: the other is still right, and nothing writes through NULL."""
    op, lbr = VARIANTS[variant]
    inputs = make_inputs(np.random.default_rng(11), op, 6, 3, 5, 7, "bidirectional", 0, True, True, True)
    want = reference(op, inputs["X"], inputs["W"], inputs["R"], inputs["B"], inputs["sequence_lens"],
                     inputs["initial_h"], "bidirectional", 0, lbr)
    got = run_kernel(lib, op, inputs, "bidirectional", 0, lbr, outputs=wanted)
    index = 0 if wanted == ("Y",) else 1
    assert got[1 - index] is None
    np.testing.assert_allclose(got[index], want[index], rtol=1e-4, atol=2e-5)


# Activation lists, one per direction (each (name, alpha, beta)); small weights keep the
# unbounded ones (Relu, Affine, ...) from growing over the steps.
ACTIVATION_LISTS = {
    "RNN": [[("relu", 0.0, 0.0)], [("affine", 0.7, -0.2)], [("leakyrelu", 0.1, 0.0)],
            [("thresholdedrelu", 0.3, 0.0)], [("scaledtanh", 1.5, 0.8)], [("hardsigmoid", 0.3, 0.4)],
            [("elu", 0.9, 0.0)], [("softsign", 0.0, 0.0)], [("softplus", 0.0, 0.0)], [("sigmoid", 0.0, 0.0)]],
    "GRU": [[("hardsigmoid", 0.2, 0.5), ("relu", 0.0, 0.0)], [("sigmoid", 0.0, 0.0), ("softsign", 0.0, 0.0)],
            [("softplus", 0.0, 0.0), ("elu", 1.2, 0.0)], [("scaledtanh", 0.9, 1.1), ("leakyrelu", 0.05, 0.0)]],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("clip", [None, 0.6])
def test_activation_lists_and_clip(lib, variant, clip):
    op, lbr = VARIANTS[variant]
    lists = ACTIVATION_LISTS[op]
    for k, first in enumerate(lists):
        second = lists[(k + 1) % len(lists)]  # the two directions differ
        inputs = make_inputs(np.random.default_rng(k), op, 5, 3, 4, 6, "bidirectional", k % 2, True, True, True,
                             scale=0.5)
        check(lib, op, inputs, "bidirectional", k % 2, lbr, acts={0: first, 1: second}, clip=clip)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_empty_sequence_and_batch(lib, variant):
    """T = 0 reports initial_h as Y_h; B = 0 writes nothing (and reads nothing)."""
    op, lbr = VARIANTS[variant]
    inputs = make_inputs(np.random.default_rng(5), op, 0, 3, 4, 5, "forward", 0, True, True, False)
    check(lib, op, inputs, "forward", 0, lbr)
    inputs = make_inputs(np.random.default_rng(5), op, 4, 0, 4, 5, "forward", 0, True, True, False)
    Y, Y_h = run_kernel(lib, op, inputs, "forward", 0, lbr)
    assert Y.size == 0 and Y_h.size == 0


@pytest.mark.parametrize("T,B,I,H", [(1, 1, 1, 1), (7, 3, 5, 9), (100, 17, 33, 64)])
def test_work_size_formulas_agree(lib, T, B, I, H):
    """The lowering sizes the workspace with the Python formulas: at least the C ones (the
    packed R at the widest block), and the same where R comes prepacked (both give the
    projection chunk room for every step, whatever chunk the kernel then takes)."""
    for kind in range(4):
        for D in (1, 2):
            for prepacked in (True, False):
                assert rnn.work_floats(T, B, H, D, kind, prepacked) >= lib.ss_recur_work_size(T, B, H, D, kind,
                                                                                             int(prepacked))
            assert rnn.work_floats(T, B, H, D, kind, True) == lib.ss_recur_work_size(T, B, H, D, kind, 1)
