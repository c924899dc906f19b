"""ss_lstm (shapeshift/codegen/kernels/rnn.py) against onnxruntime.

A one-node LSTM model (opset 14, layout 0) at each direction, with and without bias and
initial states, odd sizes, every output or only some; the same random inputs go to the
kernel, whose workspace starts as NaN so that a read of unwritten scratch shows.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.kernels import rnn

from .naive_gemm import build_with_gemm

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
DIRECTIONS = {"forward": 0, "reverse": 1, "bidirectional": 2}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cdll = build_with_gemm(rnn.source(), tmp_path_factory.mktemp("rnn"), "test_rnn").cdll
    cdll.ss_lstm.restype = None
    cdll.ss_lstm.argtypes = [F32P] * 9 + [I64] * 4 + [ctypes.c_int, F32P]
    cdll.ss_lstm_work_size.restype = I64
    cdll.ss_lstm_work_size.argtypes = [I64] * 4
    return cdll


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
@pytest.mark.parametrize("with_bias,with_state", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("T,B,I,H", [(1, 1, 1, 1), (5, 3, 7, 9), (9, 2, 4, 17), (3, 33, 10, 40)])
def test_lstm(lib, direction, with_bias, with_state, T, B, I, H):
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
    work = np.full(lib.ss_lstm_work_size(T, B, I, H), np.nan, np.float32)
    lib.ss_lstm(ptr(inputs["X"]), ptr(inputs["W"]), ptr(inputs["R"]), ptr(inputs["B"]), ptr(inputs["initial_h"]),
                ptr(inputs["initial_c"]), ptr(Y), ptr(Y_h), ptr(Y_c), T, B, I, H, DIRECTIONS[direction], ptr(work))
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
    work = np.full(lib.ss_lstm_work_size(T, B, I, H), np.nan, np.float32)
    lib.ss_lstm(ptr(inputs["X"]), ptr(inputs["W"]), ptr(inputs["R"]), None, None, None, None, ptr(Y_h), None,
                T, B, I, H, 0, ptr(work))
    np.testing.assert_allclose(Y_h, expected[1], rtol=1e-4, atol=1e-5)
