"""Layout assignment: run the conv trunk of a CNN in the blocked layout NCHWc.

A pass over the simplified graph, run by ``build_program`` before lowering. It walks the
nodes in order and moves into the blocked layout (kernels/nchwc.py: [N, ceil(C/c), H, W, c],
c = 16 with AVX-512, else 8, from the target description):

- every 2-D float Conv with constant weights that is dense, depthwise (group == C == M) or
  grouped with whole blocks per group, as one ``NCHWcConv`` node (domain com.shapeshift)
  with its weights packed here, once, and its epilogue fused: Mul / Add / Sub / Div by
  per-channel constants (a BatchNormalization that an exporter wrote out; a
  BatchNormalization node itself the native backend's simplify has folded into the conv
  already), folded into the weights and bias, then one activation (Relu, Clip, HardSwish, HardSigmoid,
  Sigmoid, SiLU as ``x * Sigmoid(x)``, LeakyRelu), then a residual Add of a tensor of its
  output's shape and one more activation. The fused node sits where the chain's last node
  was, so the residual exists when it runs. A dense conv whose input is not blocked reads
  it plain when it has fewer channels than a block (the image a network starts with: no
  conversion, no padding of 3 channels to 16);
- the ops after such convs that run in the blocked layout unchanged, on the physical
  rank-5 shapes: elementwise activations and Add/Sub/Mul (constants broadcast per channel
  are blocked here; squeeze-excite's [N, C, 1, 1] scale broadcasts as [N, C/c, 1, 1, c]),
  Concat on channels when every input but the last fills whole blocks;
- Split on channels when every part but the last fills whole blocks;
- MaxPool, AveragePool and GlobalAveragePool, as ``NCHWcPool`` / ``NCHWcGlobalAveragePool``.

The lanes past C in the last block are zero and stay so: the conv kernels store zeros
there, and an op joins a region only if zero inputs give zero outputs (Relu, Mul, Add of
two blocked tensors...) or if C is a multiple of c (then there are no such lanes: Sigmoid,
HardSigmoid, Add of a scalar). A value produced in the blocked layout that anything else
reads (a Reshape, a graph output, an op with no blocked form) gets one ``NCHWcUnblock``
after its producer; a plain value that a blocked op reads one ``NCHWcBlock``. Their count
is kept in ``graph.metadata["nchwc"]`` and printed by ``shapeshift info --backend native``.

By default ("auto") the pass runs on graphs with a depthwise conv only (``has_depthwise_conv``
says why, with the measurements), and leaves their dense k x k convs of at least a block of
input channels in NCHW (``assign_layouts`` says why); ``SHAPESHIFT_NCHWC=1`` blocks every
conv of every graph and ``=0`` none (convs then run NCHW through kernels/conv.py), for A/B
measurement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...ir.types import FLOAT, TensorType
from ...symbolic import prove_eq
from ..kernels.conv_nchwc import blocked, pack_dense, pack_depthwise, pad_channels
from ..kernels.nchwc import (ACT_CLIP, ACT_HARDSIGMOID, ACT_HARDSWISH, ACT_LEAKY, ACT_NONE, ACT_RELU, ACT_SIGMOID,
                             ACT_SILU, block_width)

DOMAIN = "com.shapeshift"
BLOCK, UNBLOCK, CONV, POOL, GAP = "NCHWcBlock", "NCHWcUnblock", "NCHWcConv", "NCHWcPool", "NCHWcGlobalAveragePool"
ENV = "SHAPESHIFT_NCHWC"

#: f(0) == 0: they keep the zero lanes zero whatever C is.
ZERO_SAFE_UNARY = frozenset({"Relu", "LeakyRelu", "HardSwish", "Tanh", "Neg", "Abs", "Elu", "Identity", "Erf",
                             "Softsign", "Gelu"})
#: Elementwise with f(0) != 0: blocked only when C fills whole blocks.
WHOLE_BLOCK_UNARY = frozenset({"Sigmoid", "HardSigmoid", "Exp", "Softplus"})
BINARY = frozenset({"Add", "Sub", "Mul"})


def mode() -> str:
    """``$SHAPESHIFT_NCHWC``: "off" (0/off/false/no), "on" (1/on/true/yes) or "auto" (unset)."""
    text = os.environ.get(ENV, "auto").strip().lower()
    if text in ("0", "off", "false", "no"):
        return "off"
    return "on" if text in ("1", "on", "true", "yes") else "auto"


def enabled() -> bool:
    """Whether ``$SHAPESHIFT_NCHWC`` may run the pass (on or auto)."""
    return mode() != "off"


def has_depthwise_conv(graph: Graph) -> bool:
    """Whether the graph has a depthwise Conv (group == input channels > 1): what "auto" asks.

    Measured on bench/cnn.py --quick (1 thread, quiet Xeon, 2026-12-02), native / onnxruntime
    with the pass on and off: MobileNetV3-small 1.05 / 1.40, SSDlite 0.30 / 0.32, PP-OCR det
    0.74 / 0.73, but ResNet-50 1.48 / 1.39, the YOLO-style net 1.59 / 1.35, yolov8n 1.19 /
    1.04: the blocked depthwise kernels win, the blocked dense k x k convs do not yet beat
    the NCHW implicit GEMM (kernels/conv_igemm.py). So by default only nets with depthwise
    convs run blocked.

    Again on an AMD Zen 4 (2026-12-03, ResNet-50 at 224x224, batch 1, 1 thread, per-step
    profiles): all blocked 100-112 ms against 70-80 NCHW, the blocked direct 3x3s 2.5x
    slower than the NCHW Winograd ones, the blocked 1x1s 7-8% faster, the strided 1x1s
    1.8x slower. Blocking only the stride-1 1x1s (the "auto" rule below, extended to strided
    1x1s) measured 70.8-82.9 against 71.4-78.5 ms: 2.9-3.5 ms of conversions took the gain."""
    for node in graph.nodes:
        if node.op_type == "Conv" and node.domain in ("", "ai.onnx"):
            group = int(node.attrs.get("group", 1))
            shape = _float4(node.inputs[0])
            if group > 1 and shape is not None and shape[1] == group:
                return True
    return False


@dataclass
class LayoutStats:
    """What the pass did to one graph."""

    lanes: int
    convs: int = 0  # Conv nodes now NCHWcConv
    ops: int = 0  # other nodes that run blocked (pools, elementwise, Concat)
    fused: int = 0  # nodes folded into the convs' epilogues
    to_blocked: int = 0  # NCHWcBlock nodes inserted
    to_plain: int = 0  # NCHWcUnblock nodes inserted

    @property
    def conversions(self) -> int:
        return self.to_blocked + self.to_plain

    def describe(self) -> str:
        return (f"NCHWc{self.lanes}: {self.convs} conv(s) and {self.ops} other op(s) blocked, {self.fused} fused "
                f"into conv epilogues; {self.conversions} layout conversion(s) ({self.to_blocked} to blocked, "
                f"{self.to_plain} back to plain)")


def assign_layouts(graph: Graph, target=None, on: Optional[bool] = None) -> Optional[LayoutStats]:
    """Rewrite ``graph`` (simplified, typed) so that its conv trunk runs in NCHWc; returns
    what it did, or None when it does not run: ``on`` False, $SHAPESHIFT_NCHWC=0, or (``on``
    None and $SHAPESHIFT_NCHWC unset: "auto") a graph with no depthwise conv."""
    # "auto" leaves dense k x k convs that read a blocked-width input (C >= c) in NCHW,
    # converting around them: the NCHW kernels (kernels/conv_panels.py, conv_igemm.py) run
    # them faster than the blocked dense kernel, whose border tiles take its checked path on
    # every tile of a narrow plane. On an AMD Zen 5, 1 thread: PP-OCR det's 96->24 3x3 on
    # 16x24 took 209 us blocked, 104 us NCHW (the conv step alone); the model at 2x3x64x96
    # 1.88-1.92 -> 1.42-1.46 ms (onnxruntime 1.47), 1x3x32x64 0.507 -> 0.491, 3x3x96x32
    # 2.00 -> 1.90; SSDlite, whose one dense conv is its stem (C = 3, read plain by the
    # blocked kernel), unchanged. SHAPESHIFT_NCHWC=1 (or on=True) blocks every conv.
    dense_kxk_plain = on is None and mode() == "auto"
    if on is None:
        on = mode() == "on" or (mode() == "auto" and has_depthwise_conv(graph))
    if not on:
        graph.metadata.pop("nchwc", None)
        return None
    if target is None:
        from ...target import host_target

        target = host_target()
    stats = _Pass(graph, block_width(target), dense_kxk_plain).run()
    graph.metadata["nchwc"] = stats
    return stats


def _std(node: Node) -> bool:
    return node.domain in ("", "ai.onnx") and not node.has_subgraphs()


def _float4(value: Optional[Value]) -> Optional[tuple]:
    """The shape of a float tensor of rank 4 with a static channel count, else None."""
    t = value.type if value is not None else None
    if not isinstance(t, TensorType) or t.dtype != FLOAT or t.shape is None or len(t.shape) != 4:
        return None
    return tuple(t.shape) if isinstance(t.shape[1], int) else None


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def _scalar_const(value: Optional[Value]) -> Optional[float]:
    if value is None or value.const is None or np.asarray(value.const).size != 1:
        return None
    return float(np.asarray(value.const).reshape(()))


class _Pass:
    def __init__(self, graph: Graph, lanes: int, dense_kxk_plain: bool = False):
        self.graph = graph
        self.lanes = lanes
        self.dense_kxk_plain = dense_kxk_plain  # dense k x k convs of C >= lanes stay NCHW
        self.stats = LayoutStats(lanes)
        self.twin: dict[int, Value] = {}  # id(plain value) -> its blocked twin
        self.plain_of: dict[int, Value] = {}  # id(blocked twin) -> the plain value
        self.logical: dict[int, tuple] = {}  # id(blocked value) -> its logical NCHW shape
        self.moved: list[Value] = []  # plain values whose producer now writes their twin
        self.outputs = {id(v) for v in graph.outputs}

    # -- helpers -------------------------------------------------------------------------

    def physical(self, shape: tuple) -> tuple:
        n, c, h, w = shape
        return (n, -(-c // self.lanes), h, w, self.lanes)

    def whole_blocks(self, c: int) -> bool:
        return c % self.lanes == 0

    def single(self, value: Value) -> bool:
        return len(value.users) == 1 and id(value) not in self.outputs

    def _index_after(self, value: Value) -> int:
        if value.producer is None:
            return 0
        return self.graph.nodes.index(value.producer) + 1

    def new_blocked(self, plain: Value, shape: tuple, node: Node, index: int = 0) -> Value:
        """A blocked value for the logical ``shape``, written by ``node`` as output ``index``."""
        vb = self.graph.new_value(f"{plain.name}_nchwc", TensorType(FLOAT, self.physical(shape)))
        vb.producer = node
        node.outputs[index] = vb
        self.logical[id(vb)] = shape
        self.twin[id(plain)] = vb
        self.plain_of[id(vb)] = plain
        return vb

    def blocked(self, value: Value) -> Value:
        """The blocked twin of ``value`` (a rank-4 float of static C), converting it once."""
        found = self.twin.get(id(value))
        if found is not None:
            return found
        shape = _float4(value)
        node = self.graph.add_node(BLOCK, [value], attrs={"lanes": self.lanes, "channels": shape[1]}, domain=DOMAIN,
                                   name=self.graph.fresh_name(f"{value.name}_to_nchwc"),
                                   index=self._index_after(value))
        node.outputs[0].producer = None
        self.new_blocked(value, shape, node)
        self.stats.to_blocked += 1
        return self.twin[id(value)]

    def move_output(self, node: Node, index: int = 0) -> Value:
        """Make ``node`` write the blocked twin of its output ``index`` instead."""
        plain = node.outputs[index]
        plain.producer = None
        self.moved.append(plain)
        return self.new_blocked(plain, _float4(plain), node, index)

    def repoint(self, node: Node, index: int, value: Value) -> None:
        node.set_input(index, value)

    # -- the walk ------------------------------------------------------------------------

    def run(self) -> LayoutStats:
        for node in list(self.graph.nodes):
            if node.graph is None or not _std(node):
                continue  # absorbed into a conv already, or not an op this pass knows
            op = node.op_type
            if op == "Conv":
                self.conv(node)
            elif op in ZERO_SAFE_UNARY or op in WHOLE_BLOCK_UNARY or op == "Clip":
                self.unary(node)
            elif op in BINARY:
                self.binary(node)
            elif op in ("MaxPool", "AveragePool"):
                self.pool(node)
            elif op == "GlobalAveragePool":
                self.global_pool(node)
            elif op == "Concat":
                self.concat(node)
            elif op == "Split":
                self.split(node)
        self.finish()
        return self.stats

    def finish(self) -> None:
        """An NCHWcUnblock for every moved value that something still reads plain."""
        for plain in self.moved:
            if not plain.users and id(plain) not in self.outputs:
                continue
            vb = self.twin[id(plain)]
            node = self.graph.add_node(UNBLOCK, [vb], attrs={"lanes": self.lanes, "channels": self.logical[id(vb)][1]},
                                       domain=DOMAIN, name=self.graph.fresh_name(f"{plain.name}_from_nchwc"),
                                       index=self._index_after(vb))
            node.outputs[0] = plain
            plain.producer = node
            self.stats.to_plain += 1

    # -- convolution ---------------------------------------------------------------------

    def conv(self, node: Node) -> None:
        x, w = node.inputs[0], node.inputs[1]
        b = node.inputs[2] if len(node.inputs) > 2 else None
        shape, out_shape = _float4(x), _float4(node.outputs[0])
        if shape is None or out_shape is None or w.const is None or (b is not None and b.const is None):
            return
        weights = np.asarray(w.const, np.float32)
        if weights.ndim != 4:
            return
        c, m, group = shape[1], weights.shape[0], int(node.attrs.get("group", 1))
        if group == c == m and weights.shape[1] == 1 and group > 1:
            kind = "depthwise"
        elif group == 1:
            kind = "dense"
        elif (c // group) % self.lanes == 0 and (m // group) % self.lanes == 0:
            kind = "grouped"
        else:
            return  # a group's channels would straddle blocks
        if kind == "dense" and self.dense_kxk_plain and weights.shape[2] * weights.shape[3] > 1 and c >= self.lanes:
            return  # the NCHW kernels run it faster (see assign_layouts)
        bias = np.zeros(m, np.float32) if b is None else np.asarray(b.const, np.float32).reshape(m)
        chain, weights, bias, epilogue, res = self.epilogue(node, weights, bias)
        last = chain[-1] if chain else node
        if _float4(last.outputs[0]) is None or not _same_shape(_float4(last.outputs[0]), out_shape):
            return
        if id(x) in self.twin or kind != "dense" or c >= self.lanes:
            xin, xblk = self.blocked(x), self.lanes
        else:
            xin, xblk = x, 1
        if kind == "depthwise":
            packed = pack_depthwise(weights, self.lanes)
        else:
            packed = pack_dense(weights, group, self.lanes, xblk)
        wv = self.graph.add_initializer(f"{w.name}_nchwc{self.lanes}", packed)
        bv = self.graph.add_initializer(f"{node.name or 'conv'}_bias_nchwc", pad_channels(bias, self.lanes))
        attrs = {k: v for k, v in node.attrs.items() if k in ("auto_pad", "pads", "strides", "dilations")}
        attrs.update(kind=kind, group=group, channels=c, out_channels=m, kernel=list(weights.shape[2:]),
                     lanes=self.lanes, xblk=xblk, **epilogue)
        rb = self.blocked(res) if res is not None else None
        final = last.outputs[0]
        index = self.graph.nodes.index(last)  # after the conversions above: they shift it
        fused = self.graph.add_node(CONV, [xin, wv, bv, rb], attrs=attrs, domain=DOMAIN,
                                    name=node.name or self.graph.fresh_name("conv"), index=index + 1)
        self._detach([node, *chain], keep=final)
        final.producer = None
        self.moved.append(final)
        self.new_blocked(final, _float4(final), fused)
        self.stats.convs += 1
        self.stats.fused += len(chain)

    def _detach(self, nodes: list[Node], keep: Value) -> None:
        """Remove ``nodes`` (a conv and the chain fused into it); ``keep``, the chain's
        output, keeps its readers."""
        for n in nodes:
            for i, value in enumerate(n.inputs):
                if value is not None:
                    value.users.remove((n, i))
            self.graph.nodes.remove(n)
            n.graph = None
            for out in n.outputs:
                if out is not keep:
                    out.producer = None

    def epilogue(self, conv: Node, weights: np.ndarray, bias: np.ndarray):
        """The nodes after ``conv`` that its store can do: (nodes, weights, bias, epilogue
        attributes, residual value or None)."""
        chain: list[Node] = []
        cur = conv.outputs[0]
        while self.single(cur):
            folded = self.fold_affine(cur, weights, bias)
            if folded is None:
                break
            weights, bias, node = folded
            chain.append(node)
            cur = node.outputs[0]
        act, a0, a1, nodes = self.activation(cur)
        chain += nodes
        cur = nodes[-1].outputs[0] if nodes else cur
        epi = dict(act=act, a0=a0, a1=a1, act2=ACT_NONE, b0=0.0, b1=0.0)
        res = None
        user = cur.users[0][0] if self.single(cur) else None
        if user is not None and _std(user) and user.op_type == "Add" and len(user.inputs) == 2:
            other = user.inputs[1] if user.inputs[0] is cur else user.inputs[0]
            other_shape, cur_shape = _float4(other), _float4(cur)
            # Add(conv_a, conv_b...): the later operand's conv takes it, reading the earlier
            # one's output once that is blocked (the earlier conv would have had to convert
            # the later operand, made plain, back to blocks).
            later = other.producer is not None and id(other) not in self.twin \
                and self.graph.nodes.index(other.producer) > self.graph.nodes.index(conv)
            fits = other_shape is not None and cur_shape is not None and _same_shape(other_shape, cur_shape) \
                and _same_shape(_float4(user.outputs[0]) or (), cur_shape)
            if not later and other is not cur and other.const is None and fits:
                res = other
                chain.append(user)
                cur = user.outputs[0]
                act2, b0, b1, nodes = self.activation(cur)
                chain += nodes
                epi.update(act2=act2, b0=b0, b1=b1)
        return chain, weights, bias, epi, res

    @staticmethod
    def channel_const(node: Node, cur: Value, m: int) -> Optional[np.ndarray]:
        """The other operand of a binary ``node`` reading ``cur``, as [m] float64 when it is a
        constant scalar or per-channel ([m, 1, 1] / [1, m, 1, 1]) vector, else None."""
        if len(node.inputs) != 2 or node.inputs[0] is not cur or node.inputs[1] is cur:
            return None
        const = node.inputs[1].const
        if const is None:
            return None
        arr = np.asarray(const)
        if arr.dtype != np.float32:
            return None
        if arr.size == 1 and arr.ndim <= 4:
            return np.full(m, float(arr.reshape(())))
        if arr.ndim in (3, 4) and arr.shape[-3] == m and arr.size == m:
            return arr.reshape(m).astype(np.float64)
        return None

    def fold_affine(self, cur: Value, weights: np.ndarray, bias: np.ndarray):
        """(weights, bias, node) with the Mul / Add / Sub / Div by a constant after the conv
        folded in, or None."""
        node = cur.users[0][0]
        if not _std(node) or node.op_type not in ("Mul", "Add", "Sub", "Div") or _float4(node.outputs[0]) is None:
            return None
        if node.op_type in ("Mul", "Add") and len(node.inputs) == 2 and node.inputs[1] is cur:
            k = self.channel_const(_Swapped(node), cur, weights.shape[0])
        else:
            k = self.channel_const(node, cur, weights.shape[0])
        if k is None or (node.op_type == "Div" and np.any(k == 0)):
            return None
        if node.op_type in ("Mul", "Div"):
            k = k if node.op_type == "Mul" else 1.0 / k
            return (weights * k[:, None, None, None]).astype(np.float32), (bias * k).astype(np.float32), node
        k = k if node.op_type == "Add" else -k
        return weights, (bias + k).astype(np.float32), node

    def hardswish_chain(self, cur: Value) -> Optional[list[Node]]:
        """``cur * Clip(cur + 3, 0, 6) / 6`` (or ``* (1/6)``) after ``cur``: its four nodes."""
        users = [u for u, _ in cur.users]
        if len(users) != 2 or not all(_std(u) for u in users):
            return None
        add = next((u for u in users if u.op_type == "Add"), None)
        mul = next((u for u in users if u.op_type == "Mul"), None)
        if add is None or mul is None or not self.single(add.outputs[0]):
            return None
        other = add.inputs[1] if add.inputs[0] is cur else add.inputs[0]
        clip = add.outputs[0].users[0][0]
        if _scalar_const(other) != 3.0 or clip.op_type != "Clip" or not _std(clip) \
                or clip.inputs[0] is not add.outputs[0] or self.clip_bounds(clip) != (0.0, 6.0) \
                or not self.single(clip.outputs[0]) or clip.outputs[0].users[0][0] is not mul \
                or {id(v) for v in mul.inputs} != {id(cur), id(clip.outputs[0])} or not self.single(mul.outputs[0]):
            return None
        scale = mul.outputs[0].users[0][0]
        if not _std(scale) or len(scale.inputs) != 2 or scale.inputs[0] is not mul.outputs[0]:
            return None
        k = _scalar_const(scale.inputs[1])
        if not ((scale.op_type == "Div" and k == 6.0) or (scale.op_type == "Mul" and k is not None
                                                           and abs(k - 1 / 6) < 1e-7)):
            return None
        return [add, clip, mul, scale]

    def activation(self, cur: Value) -> tuple[int, float, float, list[Node]]:
        """(code, a0, a1, nodes) of the activation reading ``cur``, if its store can do it."""
        none = (ACT_NONE, 0.0, 0.0, [])
        if id(cur) in self.outputs:
            return none
        users = [u for u, _ in cur.users]
        hardswish = self.hardswish_chain(cur)
        if hardswish is not None:
            return ACT_HARDSWISH, 0.0, 0.0, hardswish
        if len(users) == 2 and all(_std(u) for u in users):
            sig = next((u for u in users if u.op_type == "Sigmoid"), None)
            mul = next((u for u in users if u.op_type == "Mul"), None)
            if sig is not None and mul is not None and self.single(sig.outputs[0]) \
                    and sig.outputs[0].users[0][0] is mul \
                    and {id(v) for v in mul.inputs} == {id(cur), id(sig.outputs[0])}:
                return ACT_SILU, 0.0, 0.0, [sig, mul]
        if len(users) != 1 or not _std(users[0]) or users[0].inputs[0] is not cur:
            return none
        user = users[0]
        op = user.op_type
        if op == "Relu":
            return ACT_RELU, 0.0, 0.0, [user]
        if op == "Sigmoid":
            return ACT_SIGMOID, 0.0, 0.0, [user]
        if op == "HardSwish":
            return ACT_HARDSWISH, 0.0, 0.0, [user]
        if op == "HardSigmoid":
            return ACT_HARDSIGMOID, float(user.attrs.get("alpha", 0.2)), float(user.attrs.get("beta", 0.5)), [user]
        if op == "LeakyRelu":
            return ACT_LEAKY, float(user.attrs.get("alpha", 0.01)), 0.0, [user]
        if op == "Clip":
            bounds = self.clip_bounds(user)
            if bounds is not None:
                return ACT_CLIP, bounds[0], bounds[1], [user]
        return none

    @staticmethod
    def clip_bounds(node: Node) -> Optional[tuple[float, float]]:
        """Clip's (min, max) when constant (attributes before opset 11, inputs after)."""
        if "min" in node.attrs or "max" in node.attrs:
            return float(node.attrs.get("min", -np.inf)), float(node.attrs.get("max", np.inf))
        bounds = []
        for index, default in ((1, -np.inf), (2, np.inf)):
            value = node.inputs[index] if index < len(node.inputs) else None
            if value is None:
                bounds.append(default)
                continue
            const = _scalar_const(value)
            if const is None:
                return None
            bounds.append(const)
        return bounds[0], bounds[1]

    # -- ops that run blocked unchanged --------------------------------------------------

    def unary(self, node: Node) -> None:
        x = node.inputs[0]
        vb = self.twin.get(id(x))
        out = node.outputs[0] if len(node.outputs) == 1 else None
        if vb is None or out is None or _float4(out) is None:
            return
        c = self.logical[id(vb)][1]
        if node.op_type == "Clip":
            bounds = self.clip_bounds(node)
            if bounds is None:
                return
            if not bounds[0] <= 0.0 <= bounds[1] and not self.whole_blocks(c):
                return
        elif node.op_type in WHOLE_BLOCK_UNARY and not self.whole_blocks(c):
            return
        self.repoint(node, 0, vb)
        self.move_output(node)
        self.stats.ops += 1

    def binary(self, node: Node) -> None:
        out = node.outputs[0]
        out_shape = _float4(out)
        if out_shape is None or len(node.inputs) != 2 or not any(id(v) in self.twin for v in node.inputs):
            return
        c = out_shape[1]
        plan: list[tuple[int, object]] = []
        for index, value in enumerate(node.inputs):
            if id(value) in self.twin:
                if self.logical[id(self.twin[id(value)])][1] != c:
                    return
                plan.append((index, self.twin[id(value)]))
            elif value.const is not None:
                arr = np.asarray(value.const)
                blocked = self.block_const(arr, c)
                if blocked is None or arr.dtype != np.float32:
                    return
                per_channel = arr.ndim >= 3 and arr.shape[arr.ndim - 3] == c
                if node.op_type != "Mul" and not per_channel and not self.whole_blocks(c) and np.any(arr != 0):
                    return  # x + k would write k into the zero lanes
                plan.append((index, blocked))
            else:
                shape = _float4(value)
                if shape is None or shape[1] != c:
                    return
                plan.append((index, value))
        for index, item in plan:
            if isinstance(item, np.ndarray):
                item = self.graph.add_initializer(f"{node.inputs[index].name}_nchwc", item)
            elif id(item) not in self.plain_of:
                item = self.blocked(item)
            self.repoint(node, index, item)
        self.move_output(node)
        self.stats.ops += 1

    def block_const(self, arr: np.ndarray, c: int) -> Optional[np.ndarray]:
        """A constant that broadcasts against [N, C, H, W], as one that broadcasts against
        the blocked [N, C/c, H, W, c] (zero in the lanes past C), or None."""
        if arr.ndim > 4:
            return None
        a4 = arr.reshape((1,) * (4 - arr.ndim) + arr.shape)
        if a4.shape[1] == 1:
            return np.ascontiguousarray(a4.reshape(*a4.shape, 1))
        if a4.shape[1] != c:
            return None
        return blocked(a4, self.lanes)

    def pool(self, node: Node) -> None:
        x = node.inputs[0]
        vb = self.twin.get(id(x))
        outs = [v for v in node.outputs if v is not None]
        if vb is None or len(outs) != 1 or len(node.outputs) != 1 or _float4(node.outputs[0]) is None:
            return
        if node.op_type == "AveragePool" and int(node.attrs.get("ceil_mode", 0)) \
                and int(node.attrs.get("count_include_pad", 0)):
            return  # windows past the end pad: the divisor is not KH * KW there
        attrs = {k: v for k, v in node.attrs.items()
                 if k in ("auto_pad", "pads", "strides", "dilations", "kernel_shape", "count_include_pad")}
        attrs.update(mode="max" if node.op_type == "MaxPool" else "average", lanes=self.lanes)
        self._replace(node, POOL, vb, attrs)

    def global_pool(self, node: Node) -> None:
        vb = self.twin.get(id(node.inputs[0]))
        if vb is None or _float4(node.outputs[0]) is None:
            return
        self._replace(node, GAP, vb, {"lanes": self.lanes})

    def _replace(self, node: Node, op: str, vb: Value, attrs: dict) -> None:
        """``node`` as the blocked op ``op`` reading ``vb``, at the same place."""
        index = self.graph.nodes.index(node)
        new = self.graph.add_node(op, [vb], attrs=attrs, domain=DOMAIN, name=node.name or self.graph.fresh_name(op),
                                  index=index + 1)
        plain = node.outputs[0]
        self._detach([node], keep=plain)
        plain.producer = None
        self.moved.append(plain)
        self.new_blocked(plain, _float4(plain), new)
        self.stats.ops += 1

    def concat(self, node: Node) -> None:
        out_shape = _float4(node.outputs[0])
        if out_shape is None or not any(id(v) in self.twin for v in node.inputs):
            return
        axis = int(node.attrs.get("axis", 0))
        if axis not in (1, -3):
            return
        shapes = [_float4(v) for v in node.inputs]
        if any(s is None for s in shapes) or any(not self.whole_blocks(s[1]) for s in shapes[:-1]):
            return
        for index, value in enumerate(list(node.inputs)):
            self.repoint(node, index, self.blocked(value))
        node.attrs["axis"] = 1
        self.move_output(node)
        self.stats.ops += 1


    def split(self, node: Node) -> None:
        """Split on channels with every part but the last filling whole blocks: the
        lowering copies by the outputs' (now blocked) shapes, so the parts are whole blocks."""
        vb = self.twin.get(id(node.inputs[0]))
        if vb is None or int(node.attrs.get("axis", 0)) not in (1, -3) or any(v is None for v in node.outputs):
            return
        shapes = [_float4(v) for v in node.outputs]
        if any(s is None for s in shapes) or any(not self.whole_blocks(s[1]) for s in shapes[:-1]):
            return
        self.repoint(node, 0, vb)
        node.attrs["axis"] = 1
        for index in range(len(node.outputs)):
            self.move_output(node, index)
        self.stats.ops += 1


class _Swapped:
    """A commutative binary node seen with its operands swapped (for channel_const)."""

    def __init__(self, node: Node):
        self.inputs = [node.inputs[1], node.inputs[0]]
