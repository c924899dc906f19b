"""Convolutional nets for bench/cnn.py, built with onnx.helper and seeded random weights.

    python bench/cnn_models.py OUT_DIR [--models resnet50 mobilenet_v3_small yolo_style]

- ``resnet50``: torchvision's ResNet-50 (v1.5: the stride on the bottleneck's 3x3), its
  BatchNorms folded into the convs (plain Conv with bias), global average pool, Flatten,
  Gemm 2048 -> 1000. Input images[batch, 3, height, width].
- ``mobilenet_v3_small``: torchvision's MobileNetV3-small channel plan with its
  BatchNormalization nodes left in, as some exporters leave them: depthwise 3x3 and 5x5 at
  stride 1 and 2, HardSwish, ReLU, squeeze-excite (GlobalAveragePool, 1x1 convs, ReLU,
  HardSigmoid, Mul), classifier Gemm 576 -> 1024 -> 1000.
- ``yolo_style``: a YOLOv8n-sized detector: 3x3/2 downsampling convs, C2f blocks (1x1 conv,
  Split, bottlenecks, Concat, 1x1 conv), SiLU written x * Sigmoid(x), SPPF (three MaxPool
  5x5), an upsampling neck (Resize nearest x2 + Concat, and 3x3/2 convs back down), conv
  heads at strides 8, 16, 32 reshaped and concatenated to [batch, 144, anchors]. Height and
  width: any multiple of 32.

Weights are He-style and then scaled layer by layer so that the activations keep their scale
through the depth (LSUV-style): the net is evaluated as it is built, on one seeded random
image of CALIBRATION_HW pixels a side, one node at a time with onnxruntime, and each conv's and
Gemm's weights are scaled so that its output (before the bias) has root-mean-square 1 on that
image. Fixed gains cannot do it for SiLU and HardSwish, which are not homogeneous (about x/2
near 0, x far from it): a gain right at one scale is too much above it and too little below,
and with fixed gains the MobileNet and YOLO-style outputs grew 20-40x over the depth. The last
conv of each residual branch aims at RESIDUAL_SCALE instead of 1 (as zero-init residual
training leaves it), so that residual sums do not double the variance per block.
``activation_stats`` runs a model on onnxruntime and reports its output's spread: the bench
and its test check that it is finite and not all ~0.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
INPUT = "images"
# The side of the random image the weights are scaled on (a multiple of 32, the YOLO-style
# net's stride): small, so that building the nets stays cheap.
CALIBRATION_HW = 160
# The last conv of a residual branch: its output's scale relative to the others' (1).
RESIDUAL_SCALE = 0.3


class _Net:
    """Accumulates nodes and initializers with unique names, evaluating each node as it is
    added (onnxruntime on that node alone, inputs fed from earlier results) so that weights
    can be scaled on what actually reaches them."""

    def __init__(self, seed: int, calibration_hw: int = CALIBRATION_HW):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0
        image = np.random.default_rng(seed + 1).standard_normal((1, 3, calibration_hw, calibration_hw))
        self.values: dict[str, np.ndarray] = {INPUT: image.astype(np.float32)}

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.values[name] = np.asarray(array)
        self.initializers.append(numpy_helper.from_array(self.values[name], name))
        return name

    def node(self, op: str, inputs: list[str], hint: Optional[str] = None, outputs: int = 1, **attrs):
        """Add a node; its output name (a list of names when ``outputs`` > 1)."""
        names = [self.name(hint or op.lower()) for _ in range(outputs)]
        node = helper.make_node(op, inputs, names, name=self.name("n_" + op.lower()), **attrs)
        self.values.update(zip(names, _evaluate(node, self.values)))
        self.nodes.append(node)
        return names[0] if outputs == 1 else names

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1, scale: float = 1.0,
             bias: bool = True) -> str:
        """Conv with 'same' padding for odd k (torchvision's and Ultralytics' k // 2), its
        weights scaled so that its output before the bias has root-mean-square ``scale``."""
        fan_in = c_in // group * k * k
        w = self.rng.standard_normal((c_out, c_in // group, k, k)) * math.sqrt(2.0 / fan_in)
        b = self.rng.standard_normal(c_out) * 0.02 if bias else None
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        probe = helper.make_node("Conv", [x, "w"], ["y"], **attrs)
        y = _evaluate(probe, {x: self.values[x], "w": w.astype(np.float32)})[0]
        w *= scale / max(_rms(y), 1e-12)
        inputs = [x, self.const("w", w.astype(np.float32))]
        if b is not None:
            inputs.append(self.const("b", b.astype(np.float32)))
        return self.node("Conv", inputs, "conv", **attrs)

    def gemm(self, x: str, k: int, n: int, scale: float = 1.0) -> str:
        w = self.rng.standard_normal((n, k))
        w *= scale / max(_rms(self.values[x] @ w.T.astype(np.float32)), 1e-12)
        b = (self.rng.standard_normal(n) * 0.02).astype(np.float32)
        return self.node("Gemm", [x, self.const("fc_w", w.astype(np.float32)), self.const("fc_b", b)], "fc", transB=1)

    def batchnorm(self, x: str, c: int) -> str:
        """BatchNormalization (inference) with plausible statistics: the normalised output
        keeps about the input's scale."""
        scale = self.rng.uniform(0.8, 1.2, c).astype(np.float32)
        shift = (self.rng.standard_normal(c) * 0.02).astype(np.float32)
        mean = (self.rng.standard_normal(c) * 0.02).astype(np.float32)
        var = self.rng.uniform(0.8, 1.2, c).astype(np.float32)
        return self.node("BatchNormalization", [x, self.const("bn_scale", scale), self.const("bn_bias", shift),
                                                self.const("bn_mean", mean), self.const("bn_var", var)], "bn",
                         epsilon=1e-3)

    def act(self, x: str, kind: str) -> str:
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "hardswish":
            return self.node("HardSwish", [x])
        if kind == "silu":  # the exporters' spelling of SiLU
            return self.node("Mul", [x, self.node("Sigmoid", [x])], "silu")
        if kind == "none":
            return x
        raise ValueError(f"unknown activation {kind!r}")

    def model(self, output: str, name: str, input_shape: list, output_shape: Optional[list] = None) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name,
                                  [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, input_shape)],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)],
                                  initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="bench/cnn_models")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _attr(node: onnx.NodeProto, name: str):
    """An attribute's value, or None."""
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return None


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))


def _evaluate(node: onnx.NodeProto, values: dict) -> list:
    """``node``'s outputs on onnxruntime, its inputs fed from ``values`` (weights included:
    feeding them keeps each one-node model small)."""
    import onnxruntime as ort

    feeds = {name: values[name] for name in node.input if name}
    graph = helper.make_graph(
        [node], "probe",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info(n) for n in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# -- ResNet-50 ----------------------------------------------------------------------------------

RESNET50_BLOCKS = (3, 4, 6, 3)


def resnet50(seed: int = 0, num_classes: int = 1000, width: int = 64, batchnorm: bool = False) -> onnx.ModelProto:
    """torchvision.models.resnet50's graph with BatchNorm folded (conv + bias). ``width``: the
    stem's channels and the first stage's bottleneck width (64 in ResNet-50; a smaller one
    gives the same graph with fewer weights, for tests). ``batchnorm``: every conv without a
    bias and followed by a BatchNormalization, as some exporters write it."""
    net = _Net(seed)

    def conv(x: str, c_in: int, c_out: int, k: int, stride: int = 1, scale: float = 1.0) -> str:
        if not batchnorm:
            return net.conv(x, c_in, c_out, k, stride=stride, scale=scale)
        return net.batchnorm(net.conv(x, c_in, c_out, k, stride=stride, scale=scale, bias=False), c_out)

    x = net.act(conv(INPUT, 3, width, 7, stride=2), "relu")
    x = net.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = width
    for stage, blocks in enumerate(RESNET50_BLOCKS):
        inner = width << stage
        c_out = inner * 4
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = net.act(conv(x, c_in, inner, 1), "relu")
            y = net.act(conv(y, inner, inner, 3, stride=stride), "relu")  # v1.5: stride on the 3x3
            y = conv(y, inner, c_out, 1, scale=RESIDUAL_SCALE)
            shortcut = x if block > 0 else conv(x, c_in, c_out, 1, stride=stride)
            x = net.act(net.node("Add", [y, shortcut], "residual"), "relu")
            c_in = c_out
    x = net.node("GlobalAveragePool", [x], "gap")
    x = net.node("Flatten", [x], "flat", axis=1)
    x = net.gemm(x, c_in, num_classes)
    return net.model(x, "resnet50_bn" if batchnorm else "resnet50", ["batch", 3, "height", "width"],
                     ["batch", num_classes])


def resnet50_bn(seed: int = 0, num_classes: int = 1000, width: int = 64) -> onnx.ModelProto:
    """ResNet-50 with its 53 BatchNormalizations left in (``resnet50(batchnorm=True)``)."""
    return resnet50(seed, num_classes, width, batchnorm=True)


# -- MobileNetV3-small ----------------------------------------------------------------------------

# torchvision's mobilenet_v3_small plan: (in, kernel, expanded, out, squeeze-excite, activation, stride).
MOBILENET_V3_SMALL = (
    (16, 3, 16, 16, True, "relu", 2),
    (16, 3, 72, 24, False, "relu", 2),
    (24, 3, 88, 24, False, "relu", 1),
    (24, 5, 96, 40, True, "hardswish", 2),
    (40, 5, 240, 40, True, "hardswish", 1),
    (40, 5, 240, 40, True, "hardswish", 1),
    (40, 5, 120, 48, True, "hardswish", 1),
    (48, 5, 144, 48, True, "hardswish", 1),
    (48, 5, 288, 96, True, "hardswish", 2),
    (96, 5, 576, 96, True, "hardswish", 1),
    (96, 5, 576, 96, True, "hardswish", 1),
)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: round to a multiple of divisor, never below 90% of v."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _squeeze_excite(net: _Net, x: str, c: int) -> str:
    squeeze = _make_divisible(c // 4)
    s = net.node("GlobalAveragePool", [x], "se_pool")
    s = net.act(net.conv(s, c, squeeze, 1), "relu")
    # Gain 1: the gate's input stays near 0, where HardSigmoid is about 0.5 and not saturated.
    s = net.node("HardSigmoid", [net.conv(s, squeeze, c, 1)], "se_gate", alpha=1.0 / 6, beta=0.5)
    return net.node("Mul", [x, s], "se_scale")


def mobilenet_v3_small(seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """torchvision.models.mobilenet_v3_small's graph, BatchNormalization nodes unfolded."""
    net = _Net(seed)
    x = net.act(net.batchnorm(net.conv(INPUT, 3, 16, 3, stride=2, bias=False), 16), "hardswish")
    for c_in, k, expanded, c_out, se, act, stride in MOBILENET_V3_SMALL:
        y = x
        if expanded != c_in:
            y = net.act(net.batchnorm(net.conv(y, c_in, expanded, 1, bias=False), expanded), act)
        y = net.conv(y, expanded, expanded, k, stride=stride, group=expanded, bias=False)  # depthwise
        y = net.act(net.batchnorm(y, expanded), act)
        if se:
            y = _squeeze_excite(net, y, expanded)
        residual = stride == 1 and c_in == c_out
        y = net.batchnorm(net.conv(y, expanded, c_out, 1, scale=RESIDUAL_SCALE if residual else 1.0, bias=False), c_out)
        x = net.node("Add", [y, x], "residual") if residual else y
    last = 6 * MOBILENET_V3_SMALL[-1][3]
    x = net.act(net.batchnorm(net.conv(x, MOBILENET_V3_SMALL[-1][3], last, 1, bias=False),
                              last), "hardswish")
    x = net.node("Flatten", [net.node("GlobalAveragePool", [x], "gap")], "flat", axis=1)
    x = net.act(net.gemm(x, last, 1024), "hardswish")
    x = net.gemm(x, 1024, num_classes)
    return net.model(x, "mobilenet_v3_small", ["batch", 3, "height", "width"], ["batch", num_classes])


# -- YOLO-style detector ------------------------------------------------------------------------

YOLO_CLASSES = 80
YOLO_REG_MAX = 16  # box distribution bins per side, as YOLOv8's DFL head


def _cbs(net: _Net, x: str, c_in: int, c_out: int, k: int, stride: int = 1, scale: float = 1.0) -> str:
    """Conv (BatchNorm folded) + SiLU: Ultralytics' Conv module as exported."""
    return net.act(net.conv(x, c_in, c_out, k, stride=stride, scale=scale), "silu")


def _c2f(net: _Net, x: str, c_in: int, c_out: int, n: int, shortcut: bool) -> str:
    """C2f: 1x1 conv to 2c, Split in two halves, n bottlenecks chained on the second half,
    Concat of every piece, 1x1 conv to c_out."""
    c = c_out // 2
    y = _cbs(net, x, c_in, 2 * c, 1)
    pieces = list(net.node("Split", [y, net.const("split", np.array([c, c], np.int64))], "half", outputs=2, axis=1))
    for _ in range(n):
        h = _cbs(net, pieces[-1], c, c, 3)
        h = _cbs(net, h, c, c, 3, scale=RESIDUAL_SCALE if shortcut else 1.0)
        pieces.append(net.node("Add", [pieces[-1], h], "bottleneck") if shortcut else h)
    cat = net.node("Concat", pieces, "c2f_cat", axis=1)
    return _cbs(net, cat, (2 + n) * c, c_out, 1)


def _sppf(net: _Net, x: str, c: int) -> str:
    """SPPF: 1x1 conv to c/2, three chained MaxPool 5x5 stride 1, Concat of four, 1x1 conv."""
    h = _cbs(net, x, c, c // 2, 1)
    pools = [h]
    for _ in range(3):
        pools.append(net.node("MaxPool", [pools[-1]], "sppf_pool", kernel_shape=[5, 5], strides=[1, 1], pads=[2] * 4))
    return _cbs(net, net.node("Concat", pools, "sppf_cat", axis=1), 2 * c, c, 1)


def _upsample(net: _Net, x: str) -> str:
    scales = net.const("scales", np.array([1, 1, 2, 2], np.float32))
    return net.node("Resize", [x, "", scales], "up", mode="nearest")


def _head(net: _Net, x: str, c: int) -> str:
    """Box and class branches (two 3x3 convs then a 1x1 each), concatenated on channels and
    flattened to [batch, 4 * reg_max + classes, h * w]."""
    box_c, cls_c = max(16, c // 4, 4 * YOLO_REG_MAX), max(c, min(YOLO_CLASSES, 100))
    box = _cbs(net, _cbs(net, x, c, box_c, 3), box_c, box_c, 3)
    box = net.conv(box, box_c, 4 * YOLO_REG_MAX, 1)
    cls = _cbs(net, _cbs(net, x, c, cls_c, 3), cls_c, cls_c, 3)
    cls = net.conv(cls, cls_c, YOLO_CLASSES, 1)
    out = net.node("Concat", [box, cls], "head_cat", axis=1)
    shape = net.const("head_shape", np.array([0, 4 * YOLO_REG_MAX + YOLO_CLASSES, -1], np.int64))
    return net.node("Reshape", [out, shape], "head_flat")


def yolo_style(seed: int = 0) -> onnx.ModelProto:
    """A YOLOv8n-sized detector (width 0.25, depth 0.33 of YOLOv8's plan)."""
    net = _Net(seed)
    x = _cbs(net, INPUT, 3, 16, 3, 2)
    x = _cbs(net, x, 16, 32, 3, 2)
    x = _c2f(net, x, 32, 32, 1, True)
    x = _cbs(net, x, 32, 64, 3, 2)
    p3 = _c2f(net, x, 64, 64, 2, True)
    x = _cbs(net, p3, 64, 128, 3, 2)
    p4 = _c2f(net, x, 128, 128, 2, True)
    x = _cbs(net, p4, 128, 256, 3, 2)
    x = _c2f(net, x, 256, 256, 1, True)
    p5 = _sppf(net, x, 256)
    # Neck: top-down (Resize + Concat), then bottom-up (3x3/2 convs + Concat).
    n4 = _c2f(net, net.node("Concat", [_upsample(net, p5), p4], "neck_cat", axis=1), 384, 128, 1, False)
    n3 = _c2f(net, net.node("Concat", [_upsample(net, n4), p3], "neck_cat", axis=1), 192, 64, 1, False)
    m4 = _c2f(net, net.node("Concat", [_cbs(net, n3, 64, 64, 3, 2), n4], "neck_cat", axis=1), 192, 128, 1, False)
    m5 = _c2f(net, net.node("Concat", [_cbs(net, m4, 128, 128, 3, 2), p5], "neck_cat", axis=1), 384, 256, 1, False)
    heads = [_head(net, n3, 64), _head(net, m4, 128), _head(net, m5, 256)]
    out = net.node("Concat", heads, "detections", axis=2)
    return net.model(out, "yolo_style", ["batch", 3, "height", "width"],
                     ["batch", 4 * YOLO_REG_MAX + YOLO_CLASSES, "anchors"])


BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet50,
    "resnet50_bn": resnet50_bn,
    "mobilenet_v3_small": mobilenet_v3_small,
    "yolo_style": yolo_style,
}


def activation_stats(model: onnx.ModelProto, feed: dict) -> dict:
    """Run ``model`` on onnxruntime (no graph optimizations: the graph as built) and describe
    its first output: finite or not, its standard deviation and its largest magnitude."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = session.run(None, feed)[0]
    return {"finite": bool(np.isfinite(out).all()), "std": float(np.std(out)), "max_abs": float(np.abs(out).max())}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--models", nargs="+", default=list(BUILDERS), choices=list(BUILDERS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        path = args.out_dir / f"{name}.onnx"
        onnx.save(BUILDERS[name](args.seed), str(path))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
