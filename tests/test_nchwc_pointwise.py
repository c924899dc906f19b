"""The blocked pointwise kernel (kernels/conv_nchwc.py, ``ss_cnc_pointwise_L``) against onnxruntime.

A 1 x 1 unpadded conv of a blocked input takes the pointwise kernel: input channels in
chunks, pixels in ranges, output-block pairs split among threads. The shapes here are
chosen so that every CPU's caches give several chunks (600 input channels: at least 2 with
8-float blocks and a 64 KB L1) and several ranges (768 pixels past any L2's range); ragged
output channels (37: a last block with lanes past M, a pair with one block), ragged input
channels (24, 45, 88: a last input block summed only to its last channel), planes whose
pixel count leaves tiles of 4 and of 1, strides 1 and 2, a batch, with and without the fused
residual Add and Relu, on 1 and 2 threads (few output channels: one pair of output blocks,
whose plane is cut into ranges for the threads); both block widths (the host's, and 8 through an
artifact compiled for x86-64-v3).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen.lower.layout_assign import CONV

from .test_models import _assert_close

ort = pytest.importorskip("onnxruntime")

# (batch, height, width): 768 pixels (several ranges), 35 (5 tiles of 6, one of 4, one of 1),
# 2 x 15 x 17 = a batch of 255 (a tile of 3 pixels' worth of singles), 6 x 7, and one row
# of 50 (ranges of whole tiles rather than rows, the last tile ragged).
SIZES = [(1, 24, 32), (1, 5, 7), (2, 15, 17), (1, 6, 7), (1, 1, 50)]


@pytest.fixture(autouse=True)
def _nchwc_on(monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")


def pointwise_model(c: int, m: int, stride: int, residual: bool, seed: int = 0) -> onnx.ModelProto:
    """x [n, c, h, w] -> 1x1 conv (stride) with bias; with ``residual``, a second such conv
    plus the first one's output, then Relu (fused into the second conv's epilogue)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    for i in range(2 if residual else 1):
        inits += [numpy_helper.from_array((rng.standard_normal((m, c, 1, 1)) / np.sqrt(c)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(m) * 0.1).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"y{i}"], kernel_shape=[1, 1],
                                      strides=[stride, stride]))
    out = "y0"
    if residual:
        nodes += [helper.make_node("Add", ["y1", "y0"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
        out = "z"
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_empty_tensor_value_info(out)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(session, model: onnx.ModelProto, c: int, what: str) -> None:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    checked = 0
    for n, h, w in SIZES:
        feed = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed), f"{what} at {n}x{c}x{h}x{w}")
        checked += 1
    assert checked == len(SIZES)


def _blocked_convs(session) -> list:
    return [node for node in session.graph.nodes if node.op_type == CONV]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("c,m,stride,residual", [
    (600, 37, 1, True), (600, 40, 1, False), (600, 37, 2, True), (24, 96, 1, True), (96, 24, 2, False),
    (88, 24, 1, True), (45, 37, 1, True)])
def test_pointwise_matches_onnxruntime(c, m, stride, residual, threads):
    model = pointwise_model(c, m, stride, residual)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=threads)
    convs = _blocked_convs(session)
    assert len(convs) == 1 + residual and all(node.attrs["kernel"] == [1, 1] for node in convs)
    # The residual Add and Relu run in the conv's epilogue.
    assert not any(node.op_type in ("Add", "Relu") for node in session.graph.nodes)
    _check(session, model, c, f"{c}->{m} stride {stride}, {threads} thread(s)")


@pytest.mark.parametrize("c,stride", [(600, 1), (600, 2), (45, 1)])
def test_pointwise_blocks_of_8(c, stride, tmp_path):
    """The same kernel in blocks of 8, built with -march=x86-64-v3 (no AVX-512)."""
    model = pointwise_model(c, 37, stride, True)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    artifact = shapeshift.compile(path, tmp_path / "m.ssa", target="x86-64-v3")
    assert "-march=x86-64-v3" in artifact.header["flags"]
    session = shapeshift.InferenceSession(tmp_path / "m.ssa")
    convs = _blocked_convs(session)
    assert len(convs) == 2 and all(node.attrs["lanes"] == 8 for node in convs)
    _check(session, model, c, f"{c}->37 stride {stride} (x86-64-v3)")
