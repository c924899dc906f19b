"""Layout assignment (codegen/lower/layout_assign.py): CNNs run in NCHWc give onnxruntime's outputs.

Models built with onnx.helper — a MobileNetV3-style block (depthwise conv, BatchNormalization
left in, HardSwish, squeeze-excite), a ResNet bottleneck with a projection shortcut and a
max-pool stem, and a graph whose Sigmoid and Add of a constant need whole blocks — at ragged
channel counts and 3 image sizes, with symbolic batch and plane; the models in
../shared/models that have convs at 3 sizes each. Both block widths: the host's (16 with
AVX-512) in a session, 8 through an artifact compiled for x86-64-v3 (AVX2 only). Each test
also checks what the pass did (convs blocked, epilogues fused, conversions), and
SHAPESHIFT_NCHWC=0 turns it off.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen.lower.layout_assign import CONV, UNBLOCK, assign_layouts
from shapeshift.target import named_target

from .conftest import shared_model
from .shared_models import feeds
from .test_models import _assert_close

ort = pytest.importorskip("onnxruntime")


class _Net:
    """A small ONNX graph builder: each method adds nodes and returns its output's name."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []

    def _name(self, hint: str) -> str:
        return f"{hint}{len(self.nodes)}_{len(self.inits)}"

    def const(self, array: np.ndarray, hint: str = "k") -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = True,
             dilation: int = 1) -> str:
        w = self.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)
        inputs = [x, self.const(w, "w")] + ([self.const(self.rng.standard_normal(cout) * 0.1, "b")] if bias else [])
        pad = dilation * (k - 1) // 2
        return self.op("Conv", *inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                       group=group, dilations=[dilation, dilation])

    def bn(self, x: str, c: int) -> str:
        rng = self.rng
        return self.op("BatchNormalization", x, self.const(rng.standard_normal(c) * 0.5 + 1),
                       self.const(rng.standard_normal(c) * 0.1), self.const(rng.standard_normal(c) * 0.1),
                       self.const(np.abs(rng.standard_normal(c)) + 0.5))

    def model(self, outputs: list[str], channels: int = 3) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, "h", "w"])],
            [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mobilenet_block(c: int = 17, squeeze: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Stem conv, depthwise 5x5 with BatchNormalization and HardSwish, squeeze-excite
    (GlobalAveragePool, 1x1 + Relu, 1x1 + HardSigmoid, Mul), a 1x1 projection with a residual
    Add, a stride-2 depthwise 3x3, an average pool and a classifier head (Flatten)."""
    net = _Net(seed)
    h = net.op("HardSwish", net.bn(net.conv("x", 3, c, 3, 2, bias=False), c))
    d = net.op("HardSwish", net.bn(net.conv(h, c, c, 5, 1, group=c, bias=False), c))
    s = net.op("Relu", net.conv(net.op("GlobalAveragePool", d), c, squeeze, 1))
    s = net.op("HardSigmoid", net.conv(s, squeeze, c, 1), alpha=1 / 6, beta=0.5)
    p = net.op("Add", net.conv(net.op("Mul", d, s), c, c, 1), h)
    q = net.op("Relu", net.conv(p, c, c, 3, 2, group=c))
    a = net.op("AveragePool", q, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    f = net.op("Flatten", net.op("GlobalAveragePool", a))
    return net.model([f, p])


def resnet_bottleneck(c: int = 24, mid: int = 5, out: int = 33, seed: int = 1) -> onnx.ModelProto:
    """A 7x7 stride-2 stem with a max pool, then a bottleneck (1x1, 3x3 dilated, 1x1, each
    with BatchNormalization) whose projection shortcut is a 1x1 conv, Add and Relu."""
    net = _Net(seed)
    x = net.op("Relu", net.bn(net.conv("x", 3, c, 7, 2, bias=False), c))
    x = net.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = net.op("Relu", net.bn(net.conv(x, c, mid, 1, bias=False), mid))
    y = net.op("Relu", net.bn(net.conv(y, mid, mid, 3, dilation=2, bias=False), mid))
    y = net.bn(net.conv(y, mid, out, 1, bias=False), out)
    shortcut = net.bn(net.conv(x, c, out, 1, bias=False), out)
    return net.model([net.op("Relu", net.op("Add", y, shortcut))])


def whole_block_ops(c: int, seed: int = 2) -> onnx.ModelProto:
    """Ops that write nonzero values into the lanes past C (Sigmoid, Add of a scalar, Div):
    blocked only when C fills whole blocks; Concat of two convs on channels, Clip(0, 6)."""
    net = _Net(seed)
    a = net.conv("x", 3, c, 3)
    b = net.op("Sigmoid", a)
    b = net.op("Add", b, net.const(np.array(0.25)))
    b = net.op("Clip", net.op("Mul", b, a), net.const(np.array(0.0)), net.const(np.array(6.0)))
    cat = net.op("Concat", net.conv(b, c, c, 1), net.conv(b, c, 5, 3), axis=1)
    return net.model([net.conv(cat, c + 5, 7, 3)])


SIZES = [(1, 31, 13), (2, 16, 16), (1, 7, 45)]


def _ort(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _check(session, model: onnx.ModelProto, what: str, sizes=SIZES) -> None:
    ref = _ort(model)
    rng = np.random.default_rng(7)
    for n, h, w in sizes:
        feed = {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)}
        _assert_close(session.run(None, feed), ref.run(None, feed), f"{what} at {n}x3x{h}x{w}")


def _stats(session):
    return session.graph.metadata.get("nchwc")


MODELS = {"mobilenet_block": mobilenet_block, "resnet_bottleneck": resnet_bottleneck}


@pytest.fixture(autouse=True)
def _nchwc_on(monkeypatch):
    """The pass forced on ("auto" leaves nets without a depthwise conv plain); a test that
    sets the variable itself overrides this."""
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_blocks_match_onnxruntime_at_the_native_width(name):
    model = MODELS[name]()
    session = shapeshift.InferenceSession(model, backend="native")
    stats = _stats(session)
    assert stats is not None and stats.lanes == (16 if named_target("native").avx512 else 8)
    assert stats.convs == sum(1 for n in model.graph.node if n.op_type == "Conv")
    _check(session, model, name)


def test_mobilenet_block_keeps_its_trunk_blocked():
    """One conversion per plain reader: the Flatten of the head and the graph output p;
    the stem reads the image plain; the BatchNormalizations are the convs' weights and bias
    (simplify folds them), HardSwish, Relu, HardSigmoid and the residual Add ride in the conv
    epilogues."""
    session = shapeshift.InferenceSession(mobilenet_block(), backend="native")
    stats = _stats(session)
    assert "BatchNormalization" not in {n.op_type for n in session.graph.nodes}
    assert (stats.to_blocked, stats.to_plain) == (0, 2)
    assert stats.fused == 2 + 1 + 1 + 1 + 1  # 2x HardSwish, Relu, HardSigmoid, Add, Relu
    assert stats.ops == 4  # 2 GlobalAveragePool, the SE Mul, the AveragePool


def test_resnet_bottleneck_fuses_batchnorm_add_and_relu():
    session = shapeshift.InferenceSession(resnet_bottleneck(), backend="native")
    stats = _stats(session)
    assert "BatchNormalization" not in {n.op_type for n in session.graph.nodes}  # folded by simplify
    assert (stats.convs, stats.to_blocked, stats.to_plain) == (5, 0, 1)
    # 3 Relu after the convs, and the last conv's Add + Relu (the shortcut conv runs first).
    assert stats.fused == 3 + 2


@pytest.mark.parametrize("c", [16, 17, 24, 32])
def test_ops_that_need_whole_blocks(c):
    model = whole_block_ops(c)
    session = shapeshift.InferenceSession(model, backend="native")
    stats = _stats(session)
    _check(session, model, f"whole_block_ops c={c}")
    whole = c % stats.lanes == 0
    # Sigmoid, Add, Mul, Clip blocked (the concat too, when its first input fills whole blocks),
    # or the trunk broken after the first conv: back to plain there, and to blocked for the concat.
    if whole:
        assert stats.ops == 5 and stats.conversions == 1
    else:
        assert stats.ops < 5 and stats.conversions > 1


@pytest.mark.parametrize("name", sorted(MODELS) + ["whole_block_ops"])
def test_avx2_artifact_blocks_by_8(name, tmp_path):
    """Compiled for x86-64-v3: blocks of 8, built with -march=x86-64-v3 (no AVX-512)."""
    model = MODELS[name]() if name in MODELS else whole_block_ops(20)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    artifact = shapeshift.compile(path, tmp_path / "m.ssa", target="x86-64-v3")
    assert "-march=x86-64-v3" in artifact.header["flags"]
    session = shapeshift.InferenceSession(tmp_path / "m.ssa")
    convs = [n for n in session.graph.nodes if n.op_type == CONV]
    assert convs and all(n.attrs["lanes"] == 8 for n in convs)
    _check(session, model, f"{name} (x86-64-v3)")


def test_switch_off(monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    model = mobilenet_block(c=24)
    session = shapeshift.InferenceSession(model, backend="native")
    assert _stats(session) is None
    assert not any(n.op_type in (CONV, UNBLOCK) for n in session.graph.nodes)
    _check(session, model, "mobilenet_block, NCHWc off", sizes=SIZES[:1])


def test_pass_is_a_no_op_without_convs():
    from shapeshift.frontend.onnx_import import import_model

    net = _Net()
    model = net.model([net.op("Relu", net.op("Add", "x", net.const(np.ones((1, 3, 1, 1)))))])
    graph = import_model(model)
    before = [n.op_type for n in graph.nodes]
    stats = assign_layouts(graph, named_target("x86-64-v4"), on=True)
    assert [n.op_type for n in graph.nodes] == before and stats.conversions == 0 and stats.lanes == 16


CNN_MODELS = ["yolov8n_nudenet.320n.onnx", "ppocr_det.det_infer.onnx", "ssdlite320_mobilenet_v3_large.ts.onnx"]


@pytest.mark.parametrize("name", CNN_MODELS)
def test_shared_cnns_match_onnxruntime(name):
    path = shared_model(name)
    session = shapeshift.InferenceSession(path, backend="native")
    stats = _stats(session)
    assert stats.convs > 20
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for index in range(3):
        feed = feeds(name, index)
        _assert_close(session.run(None, feed), ref.run(None, feed), f"{name} feed {index}")


def test_info_prints_the_conversions(tmp_path, capsys, monkeypatch):
    from shapeshift.cli.main import main

    path = tmp_path / "mb.onnx"
    onnx.save(mobilenet_block(), path)
    assert main(["info", str(path), "--backend", "native"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("  layout:"))
    assert "6 conv(s)" in line and "2 layout conversion(s) (0 to blocked, 2 back to plain)" in line
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    assert main(["info", str(path), "--backend", "native"]) == 0
    assert "  layout: NCHW (NCHWc off: SHAPESHIFT_NCHWC=0)" in capsys.readouterr().out.splitlines()


def dense_after_depthwise(c: int = 24, seed: int = 3) -> onnx.ModelProto:
    """A depthwise net whose head is a dense 3x3 conv of c channels (PP-OCR det's 96 -> 24)."""
    net = _Net(seed)
    h = net.op("Relu", net.conv("x", 3, c, 3, 2))
    d = net.op("Relu", net.conv(h, c, c, 3, 1, group=c))
    y = net.op("Sigmoid", net.bn(net.conv(d, c, 7, 3, bias=False), 7))
    return net.model([net.op("Add", y, net.conv(d, c, 7, 1))])


def test_auto_leaves_dense_kxk_convs_plain(monkeypatch):
    # "auto": the stem (3 channels, read plain), the depthwise and the 1x1 conv run blocked;
    # the dense 3x3 of 24 channels runs NCHW, its input converted back to plain once.
    monkeypatch.delenv("SHAPESHIFT_NCHWC")
    model = dense_after_depthwise()
    session = shapeshift.InferenceSession(model, backend="native")
    stats = _stats(session)
    assert stats is not None and stats.convs == 3
    assert sum(n.op_type == "Conv" for n in session.graph.nodes) == 1
    _check(session, model, "dense_after_depthwise, auto")
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "1")
    forced = shapeshift.InferenceSession(model, backend="native")
    assert _stats(forced).convs == 4 and not any(n.op_type == "Conv" for n in forced.graph.nodes)
    _check(forced, model, "dense_after_depthwise, on")


def test_auto_blocks_only_nets_with_a_depthwise_conv(monkeypatch):
    monkeypatch.delenv("SHAPESHIFT_NCHWC")
    mobile = shapeshift.InferenceSession(mobilenet_block(c=24), backend="native")
    assert _stats(mobile) is not None and _stats(mobile).convs > 0
    model = resnet_bottleneck()
    dense = shapeshift.InferenceSession(model, backend="native")
    assert _stats(dense) is None and not any(n.op_type == CONV for n in dense.graph.nodes)
    _check(dense, model, "resnet_bottleneck, auto", sizes=SIZES[:1])
