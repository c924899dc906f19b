"""Every fused epilogue of the blocked-layout convs (kernels/conv_nchwc.py) against onnxruntime.

The conv kernels store a tile's accumulators, then run its epilogue once per tile with the
activation as a constant (none, Relu, Clip, HardSwish, SiLU) or through the out-of-line
form (the others); a residual Add after it and a second activation (none, Relu inline,
anything else out of line); lanes past the channel count zeroed. Each model here puts one
activation after a 1x1 conv, a 3x3 conv and a depthwise 3x3 conv, with a residual Add and a
second activation on two of them, at a ragged channel count (17: a last block with 1 lane
of 16) and a whole one (32), on planes that take each tile path: the narrow planes' flat
tiles (5x5), full row tiles with borders (13x30) and the depthwise conv's staged rows (7x7).
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

#: activation -> (op type, attributes, extra constant inputs); SiLU as x * Sigmoid(x).
ACTS = {
    "Relu": ("Relu", {}, ()),
    "Clip": ("Clip", {}, (0.0, 6.0)),
    "HardSwish": ("HardSwish", {}, ()),
    "HardSigmoid": ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, ()),
    "Sigmoid": ("Sigmoid", {}, ()),
    "SiLU": (None, {}, ()),
    "LeakyRelu": ("LeakyRelu", {"alpha": 0.1}, ()),
}
#: the activation after the residual Add, per first activation: the inline Relu, one
#: through the out-of-line form, and none.
SECOND = {"Relu": "HardSwish", "Clip": None, "HardSwish": "Relu", "HardSigmoid": "Relu", "Sigmoid": None,
          "SiLU": "Relu", "LeakyRelu": "Sigmoid", None: "Relu"}


def _model(act, channels: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(array, name):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def activation(x, kind, tag):
        if kind is None:
            return x
        op, attrs, extra = ACTS[kind]
        out = f"{tag}_{kind}"
        if op is None:
            nodes.append(helper.make_node("Sigmoid", [x], [out + "_s"]))
            nodes.append(helper.make_node("Mul", [x, out + "_s"], [out]))
            return out
        names = [const(np.array(v), f"{tag}_{kind}_{i}") for i, v in enumerate(extra)]
        nodes.append(helper.make_node(op, [x, *names], [out], **attrs))
        return out

    c = channels
    outs = []
    for tag, k, group, residual in (("pw", 1, 1, True), ("dense", 3, 1, False), ("dw", 3, c, True)):
        w = rng.standard_normal((c, c // group, k, k)) / np.sqrt(c // group * k * k)
        b = rng.standard_normal(c) * 0.3
        nodes.append(helper.make_node("Conv", ["x", const(w, f"{tag}_w"), const(b, f"{tag}_b")], [f"{tag}_y"],
                                      kernel_shape=[k, k], pads=[k // 2] * 4, group=group))
        y = activation(f"{tag}_y", act, tag)
        if residual:
            nodes.append(helper.make_node("Add", [y, "x"], [f"{tag}_r"]))
            y = activation(f"{tag}_r", SECOND[act], f"{tag}_r")
        outs.append(y)
    graph = helper.make_graph(nodes, "epilogues", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["n", c, "h", "w"])],
                              [helper.make_empty_tensor_value_info(o) for o in outs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("channels", [17, 32])
@pytest.mark.parametrize("act", [None, *ACTS])
def test_epilogue_matches_onnxruntime(act, channels, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    model = _model(act, channels)
    session = shapeshift.InferenceSession(model, backend="native")
    convs = [n for n in session.graph.nodes if n.op_type == CONV]
    assert len(convs) == 3, "every conv blocked"
    # The whole chain fused into each conv: no activation or Add left beside them.
    left = sorted({n.op_type for n in session.graph.nodes} - {CONV, "NCHWcBlock", "NCHWcUnblock"})
    assert left == [], left
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for n, h, w in ((1, 5, 5), (2, 13, 30), (1, 7, 7)):
        feed = {"x": (rng.standard_normal((n, channels, h, w)) * 2).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed), f"{act} C={channels} at {n}x{h}x{w}")


@pytest.mark.parametrize("act", ["HardSwish", "LeakyRelu"])
def test_avx2_epilogue_blocks_by_8(act, tmp_path, monkeypatch):
    """The 8-lane kernels (an artifact for x86-64-v3, no AVX-512): 17 channels leave 1 lane of 8."""
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    model = _model(act, 17)
    onnx.save(model, tmp_path / "m.onnx")
    shapeshift.compile(tmp_path / "m.onnx", tmp_path / "m.ssa", target="x86-64-v3")
    session = shapeshift.InferenceSession(tmp_path / "m.ssa")
    assert all(n.attrs["lanes"] == 8 for n in session.graph.nodes if n.op_type == CONV)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for n, h, w in ((1, 5, 5), (2, 13, 30)):
        feed = {"x": (rng.standard_normal((n, 17, h, w)) * 2).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed), f"{act} x86-64-v3 at {n}x{h}x{w}")


def _squeeze_excite(c: int, squeeze: int, seed: int = 1) -> onnx.ModelProto:
    """A depthwise conv, then squeeze-excite: GlobalAveragePool, 1x1 conv + Relu, 1x1 conv +
    HardSigmoid (both on 1x1 planes), Mul."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("wd", rng.standard_normal((c, 1, 3, 3)) / 3), ("w1", rng.standard_normal((squeeze, c, 1, 1)) / np.sqrt(c)),
        ("b1", rng.standard_normal(squeeze) * 0.1), ("w2", rng.standard_normal((c, squeeze, 1, 1)) / np.sqrt(squeeze)),
        ("b2", rng.standard_normal(c) * 0.1))]
    nodes = [helper.make_node("Conv", ["x", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
             helper.make_node("GlobalAveragePool", ["d"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["s1"]), helper.make_node("Relu", ["s1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["s2"]),
             helper.make_node("HardSigmoid", ["s2"], ["h"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["d", "h"], ["y"])]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("c,squeeze", [(40, 10), (32, 16)])
def test_squeeze_excite_convs_take_the_images_as_pixels(c, squeeze, monkeypatch):
    """The 1x1 convs on 1x1 planes run a batch's images as one tile's pixels: batches of 1,
    2, 5, 13 and 25 (one tile, ragged tiles, several) give onnxruntime's outputs."""
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    model = _squeeze_excite(c, squeeze)
    session = shapeshift.InferenceSession(model, backend="native")
    assert sum(n.op_type == CONV for n in session.graph.nodes) == 3
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for n in (1, 2, 5, 13, 25):
        feed = {"x": rng.standard_normal((n, c, 6, 5)).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed), f"C={c} S={squeeze} batch {n}")


@pytest.mark.parametrize("act", ["Sigmoid", "LeakyRelu"])
def test_narrow_plane_tiles_apply_their_epilogue_once(act, monkeypatch):
    """A plane narrower than two tiles (5x5: 25 pixels) takes tiles of RX pixels in raster
    order, the last overlapping the one before; with 2 threads the two can run at once, and
    the overlapping one stored its copy of the shared pixels between the other's store and
    its out-of-line epilogue, which then ran twice on them (a double Sigmoid or LeakyRelu in
    1 to 4 runs of 6000 here). Every one of 30000 runs of one feed must match onnxruntime."""
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    model = _model(act, 32)
    session = shapeshift.InferenceSession(model, backend="native", num_threads=2)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": (np.random.default_rng(5).standard_normal((1, 32, 5, 5)) * 2).astype(np.float32)}
    want = ref.run(None, feed)
    bad = 0
    for _ in range(30000):
        got = session.run(None, feed)
        bad += any(not np.allclose(g, w, rtol=1e-3, atol=1e-3) for g, w in zip(got, want))
    assert bad == 0, f"{bad} of 30000 runs differ from onnxruntime"
