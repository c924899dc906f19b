"""The blocked depthwise conv (kernels/conv_nchwc.py ``ss_dwconv_nchwc_L``) at every shape
its paths split on, against onnxruntime.

Rows of 3x3 and 5x5 taps at stride 1 and 2 with no dilation along them take fixed-shape
tiles (each input vector loaded once for all its taps; those at a row's ends skip the
input columns in the padding); 7x7 taps and dilated rows the generic tile, their rows
staged zero-padded where the borders dominate. Each case here is one depthwise conv with
bias and Relu at a ragged channel count (a last block of 1 lane) and a whole one, on
planes from narrower than a tile to several tiles with a ragged tail, batch 1 and 2.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen.lower.layout_assign import CONV

from .test_models import _assert_close

ort = pytest.importorskip("onnxruntime")


def _depthwise(c: int, k: int, stride: int, dilation: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32) / k
    b = (rng.standard_normal(c) * 0.2).astype(np.float32)
    pad = dilation * (k - 1) // 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y0"], kernel_shape=[k, k], strides=[stride, stride],
                              pads=[pad] * 4, dilations=[dilation, dilation], group=c),
             helper.make_node("Relu", ["y0"], ["y"])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("channels", [17, 32])
@pytest.mark.parametrize("k,stride,dilation", [(3, 1, 1), (3, 2, 1), (5, 1, 1), (5, 2, 1), (7, 1, 1), (3, 1, 2),
                                               (5, 2, 2)])
def test_depthwise_matches_onnxruntime(k, stride, dilation, channels, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    model = _depthwise(channels, k, stride, dilation)
    session = shapeshift.InferenceSession(model, backend="native")
    convs = [n for n in session.graph.nodes if n.op_type == CONV]
    assert [n.attrs["kind"] for n in convs] == ["depthwise"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n, h, w in ((1, 7, 7), (2, 14, 14), (1, 9, 40), (1, 23, 5), (2, 56, 29)):
        feed = {"x": rng.standard_normal((n, channels, h, w)).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed),
                      f"k{k} s{stride} d{dilation} C={channels} at {n}x{h}x{w}")
