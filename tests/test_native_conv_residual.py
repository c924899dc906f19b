"""A residual Add fused into the conv before it (codegen/lower/nn.py's ``_conv_residual``,
kernels/conv.py's ``ss_conv2d_residual``), end to end against onnxruntime.

ResNet's bottleneck ends ``Conv -> Add(conv, identity) -> Relu``, YOLO's C2f shortcut
``Conv -> SiLU -> Add``: each becomes one step, the conv's, whose store adds the other
operand. Covered: 1x1 and 3x3 convs at ragged channel counts, odd planes, pads and
strides, either Add operand order, with and without the Relu, dynamic batch and image
sizes (batch 1 and 2); an Add of two convs' outputs (the later conv takes it); and the
cases that must not fuse (the conv's output read elsewhere or a graph output, a
broadcast operand), which still match; an exporter's BatchNormalization between the conv
and the Add, folded into the conv first. The NCHW kernels throughout: with the blocked
layout on (``SHAPESHIFT_NCHWC``), layout_assign.py fuses the residual into its own convs.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _nchw(monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "residual", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(rng, m, c, k):
    return (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)


def _run(model, feeds, rtol=1e-4, atol=1e-4):
    """The native session (nothing left to the fallback), checked against onnxruntime."""
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return session._executor.program


def _steps(program):
    return [s.node.op_type for s in program.steps]


def _absorbed(program):
    return {s.node.name: [n.op_type for n in s.lowered.absorbed] for s in program.steps if s.lowered}


# (kernel, stride, pads, C, M): 1x1 (the GEMM on NCHW; strided: the im2col GEMM) and 3x3 (the
# implicit GEMM), on the planes below (small ones take the small-plane GEMM).
GEOMETRIES = [(1, 1, [0, 0, 0, 0], 13, 21), (1, 2, [0, 0, 0, 0], 19, 37), (3, 1, [1, 1, 1, 1], 11, 17),
              (3, 2, [1, 0, 1, 2], 9, 20)]
PLANES = [(1, 9, 11), (2, 7, 5), (1, 23, 21), (2, 3, 3)]


@pytest.mark.parametrize("relu", [False, True], ids=["add", "add_relu"])
@pytest.mark.parametrize("conv_first", [True, False], ids=["conv+other", "other+conv"])
@pytest.mark.parametrize("geometry", GEOMETRIES,
                         ids=lambda g: f"k{g[0]}s{g[1]}p{''.join(map(str, g[2]))}C{g[3]}M{g[4]}")
def test_conv_add_relu_is_one_step(geometry, conv_first, relu):
    # The identity is another conv of the same geometry, run first (as ResNet's downsample
    # shortcut): its output has the fused conv's shape at every image size.
    k, s, pads, c, m = geometry
    rng = np.random.default_rng(k * 10 + s)
    inits = {"w": _weights(rng, m, c, k), "b": rng.standard_normal(m).astype(np.float32),
             "ws": _weights(rng, m, c, k)}
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads)
    nodes = [helper.make_node("Conv", ["x", "ws"], ["shortcut"], name="shortcut", **attrs),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **attrs),
             helper.make_node("Add", ["c", "shortcut"] if conv_first else ["shortcut", "c"], ["a"], name="add")]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"], name="relu"))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", c, "h", "w"])], ["y" if relu else "a"], inits)
    feeds = [{"x": rng.standard_normal((n, c, h, w)).astype(np.float32)} for n, h, w in PLANES]
    program = _run(model, feeds)
    assert _steps(program) == ["Conv", "Conv"]  # three steps (Conv, Add, Relu) became one
    assert _absorbed(program)["conv"] == (["Add", "Relu"] if relu else ["Add"])
    assert "ss_conv2d_residual(" in next(st for st in program.steps if st.node.name == "conv").lowered.code


@pytest.mark.parametrize("act", ["Relu", "SiLU"])
def test_activation_then_add_is_one_step(act):
    # YOLO's C2f shortcut: Conv -> SiLU -> Add(identity); the identity a graph input of the
    # conv output's dims (3x3, stride 1, padded: the image's own).
    rng = np.random.default_rng(3)
    inits = {"w": _weights(rng, 24, 24, 3), "b": rng.standard_normal(24).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["h"]))
    else:
        nodes += [helper.make_node("Sigmoid", ["c"], ["sg"]), helper.make_node("Mul", ["c", "sg"], ["h"])]
    nodes.append(helper.make_node("Add", ["x", "h"], ["y"]))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 24, "h", "w"])], ["y"], inits)
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in ((2, 24, 13, 11), (1, 24, 4, 5))]
    program = _run(model, feeds)
    assert _steps(program) == ["Conv"]
    assert _absorbed(program)["conv"][-1] == "Add"


def test_resnet_bottlenecks_fuse_every_residual_add():
    # The bench's ResNet-50 graph, narrow: all 16 Add + Relu pairs ride in a conv (each
    # stage's first block adds the downsample conv's output, which runs after the block's
    # last conv: the Add goes to the downsample conv), at dynamic sizes and batch 2.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import cnn_models
    finally:
        sys.path.pop(0)
    model = cnn_models.resnet50(width=8, num_classes=10)
    rng = np.random.default_rng(0)
    feeds = [{"images": rng.standard_normal((n, 3, h, w)).astype(np.float32)} for n, h, w in ((2, 64, 48), (1, 35, 61))]
    program = _run(model, feeds)
    assert "Add" not in _steps(program) and "Relu" not in _steps(program)
    assert sum("ss_conv2d_residual(" in s.lowered.code for s in program.steps if s.lowered) == 16


def _batch_norm(rng, m, prefix="bn"):
    """BatchNormalization parameters of ``m`` channels (scale, bias, mean, variance)."""
    return {f"{prefix}_s": (rng.random(m) + 0.5).astype(np.float32),
            f"{prefix}_b": rng.standard_normal(m).astype(np.float32),
            f"{prefix}_m": (0.3 * rng.standard_normal(m)).astype(np.float32),
            f"{prefix}_v": (rng.random(m) + 0.5).astype(np.float32)}


@pytest.mark.parametrize("geometry", GEOMETRIES,
                         ids=lambda g: f"k{g[0]}s{g[1]}p{''.join(map(str, g[2]))}C{g[3]}M{g[4]}")
def test_batch_norm_folds_into_the_conv(geometry):
    # As some exporters write a ResNet block: Conv (no bias) -> BatchNormalization -> Add ->
    # Relu. The native backend folds the BatchNormalization into the conv's weights and bias
    # (simplify's fold_batch_norm), so the Add and Relu ride in the conv as well: one step
    # where there were four (the BatchNormalization was an elementwise pass of its own).
    k, s, pads, c, m = geometry
    rng = np.random.default_rng(k * 10 + s + 1)
    inits = {"w": _weights(rng, m, c, k), "ws": _weights(rng, m, c, k), **_batch_norm(rng, m)}
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads)
    nodes = [helper.make_node("Conv", ["x", "ws"], ["shortcut"], name="shortcut", **attrs),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv", **attrs),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"], name="bn"),
             helper.make_node("Add", ["n", "shortcut"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", c, "h", "w"])], ["y"], inits)
    feeds = [{"x": rng.standard_normal((n, c, h, w)).astype(np.float32)} for n, h, w in PLANES]
    program = _run(model, feeds)
    assert _steps(program) == ["Conv", "Conv"]
    assert _absorbed(program)["conv"] == ["Add", "Relu"]


def test_batch_norm_of_a_conv_read_elsewhere_stays():
    # The conv's output also feeds a Sigmoid: folding would change what the Sigmoid reads, so
    # the BatchNormalization runs as a step of its own, and everything still matches.
    rng = np.random.default_rng(8)
    inits = {"w": _weights(rng, 12, 5, 3), **_batch_norm(rng, 12)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"], name="bn"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 5, "h", "w"])], ["y", "s"], inits)
    feeds = [{"x": rng.standard_normal((n, 5, h, w)).astype(np.float32)} for n, h, w in ((1, 9, 7), (2, 4, 13))]
    program = _run(model, feeds)
    assert "BatchNormalization" in _steps(program)


def _not_fused(program, add_name="add"):
    assert add_name in {s.node.name for s in program.steps}
    assert not any("ss_conv2d_residual(" in s.lowered.code for s in program.steps if s.lowered)


def test_conv_output_read_elsewhere_does_not_fuse():
    rng = np.random.default_rng(5)
    inits = {"w": _weights(rng, 10, 7, 3), "b": rng.standard_normal(10).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"]),
             helper.make_node("Sigmoid", ["c"], ["s"])]
    inputs = [helper.make_tensor_value_info("x", F, ["n", 7, "h", "w"]),
              helper.make_tensor_value_info("r", F, ["n", 10, "h", "w"])]
    feeds = [{"x": rng.standard_normal((n, 7, 9, 6)).astype(np.float32),
              "r": rng.standard_normal((n, 10, 9, 6)).astype(np.float32)} for n in (1, 2)]
    _not_fused(_run(_model(nodes, inputs, ["y", "s"], inits), feeds))
    # The conv's output a graph output itself: it must be stored, so the Add runs alone.
    _not_fused(_run(_model(nodes[:3], inputs, ["y", "c"], inits), feeds))


@pytest.mark.parametrize("shape", [[1, 10, 1, 1], [10, 1, 1], [1]], ids=str)
def test_broadcast_operand_does_not_fuse(shape):
    rng = np.random.default_rng(6)
    inits = {"w": _weights(rng, 10, 7, 1), "r": rng.standard_normal(shape).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["r", "c"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["n", 7, "h", "w"])], ["y"], inits)
    feeds = [{"x": rng.standard_normal((n, 7, 5, 9)).astype(np.float32)} for n in (1, 2)]
    _not_fused(_run(model, feeds))
