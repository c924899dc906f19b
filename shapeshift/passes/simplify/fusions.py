"""Graph fusions run by the simplify worklist: fewer nodes, the same numbers.

These are rewrite rules like those of rules.py, registered in the same table with
:func:`rewrite`, but most fold work into a neighbour (a Conv's weight, a Gemm's bias)
rather than remove an op that does nothing, which changes the ops a later stage
sees; so they run only when ``SimplifyOptions.fusions`` is set (`shapeshift
simplify` sets it; the native lowering and the tuner do not, yet):

- BatchNormalization (inference) folded into the Conv, ConvTranspose, Gemm or
  MatMul before it (the weight scaled per output channel, the shift into the bias);
- MatMuls that read one input with private constant weights merged into one
  MatMul and a Split, their bias Adds into one Add (``merge_matmuls``);
- MatMul + Add of a constant bias into Gemm, where the input is 2-D;
- a zero constant Pad of the spatial dims folded into the pads of the Conv or
  AveragePool (count_include_pad) that reads it;
- Add/Sub and Mul/Div by constants merged in chains: x*a*b -> x*(a*b);
- Unsqueeze of an Unsqueeze, and Squeeze of a Squeeze, merged into one;
- x + 0, x * 1 (and - 0, / 1) and a Gather of a whole axis in order removed.

Every rule checks what makes it exact and refuses otherwise: float dtypes where
rounding matters, constant initializers, a producer read by nothing but the node
(so its work is not done twice), the shapes it needs known.  Whether a rule
applies is decided from types and small constants; a weight's array is read only
by the rule that folds it.  New constants are computed in
float64 and rounded once to the model's dtype, so the results differ from the
original's only by float rounding.  Each rule looks one producer up (the MatMul
merge: the readers of one value), so a visit costs O(1) in the graph's size.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DOUBLE, FLOAT, FLOAT16, TensorType, to_numpy_dtype
from ...symbolic import Expr
from ..infer_types import infer_node
from .rewriter import Rewriter
from .rules import (_axes, _dtype, _has_input, _input_dims, _normalize, _ones, _opset, _producer, _replace,
                    _shape, forward, forward_to, rewrite)

#: The dtypes folded: numpy computes them exactly as ONNX does, up to rounding.
_FLOATS = frozenset({FLOAT16, FLOAT, DOUBLE})
#: Constants are read only up to this many elements to decide whether a rule applies;
#: a weight's array is made only by the rule that folds it.  Import reads weights
#: lazily (ir.graph.LazyConstant) and an array once made stays: looking at every
#: MatMul's weight would copy a BERT-base's 340 MB out of the model for nothing.
_READ_LIMIT = 1 << 16


# -- helpers ---------------------------------------------------------------------------


def _input(node: Node, index: int) -> Optional[Value]:
    return node.inputs[index] if index < len(node.inputs) else None


def _constant_type(value: Optional[Value]) -> Optional[TensorType]:
    """The static type of ``value`` when it is a constant, asked without reading its array."""
    if value is None or not value.is_initializer:
        return None
    t = value.type
    return t if isinstance(t, TensorType) and t.is_static else None


def _const(node: Node, index: int) -> Optional[np.ndarray]:
    """Input ``index`` of ``node`` when it is a constant small enough to read to decide
    whether a rule applies (None when absent, computed or larger: see _READ_LIMIT)."""
    value = _input(node, index)
    t = _constant_type(value)
    if t is None or math.prod(t.shape) > _READ_LIMIT:
        return None
    return value.const


def _weight(node: Node, index: int) -> Optional[np.ndarray]:
    """Input ``index`` of ``node`` when it is a constant, whatever its size: read only by a
    rule that has checked everything else and folds it (the array is made here)."""
    value = _input(node, index)
    return None if _constant_type(value) is None else value.const


def _sole_reader(value: Optional[Value], rw: Rewriter) -> Optional[Node]:
    """The one node reading ``value`` (once), when nothing else reads or returns it."""
    if value is None or len(value.users) != 1 or rw.is_returned(value):
        return None
    return value.users[0][0]


def _feeds_only(producer: Optional[Node], node: Node, rw: Rewriter) -> bool:
    """Whether ``producer`` (in ``node``'s graph) has one output, read by ``node`` alone:
    folding it into ``node`` then removes it instead of computing it twice."""
    return (producer is not None and producer.graph is node.graph and len(producer.outputs) == 1
            and _sole_reader(producer.outputs[0], rw) is node)


def _weight_type(node: Node, index: int) -> Optional[TensorType]:
    """The type of input ``index`` when it is a constant (its array not read)."""
    return _constant_type(_input(node, index))


def _rounded(array: np.ndarray, like: np.dtype) -> Optional[np.ndarray]:
    """``array`` (computed in float64) in the model's dtype; None when a value overflows
    it or is NaN: the original, rounding at each step, might have stayed finite."""
    out = np.asarray(array).astype(like)
    return out if np.isfinite(out).all() else None


def _substitute(node: Node, rw: Rewriter, op_type: str, inputs: Sequence[Optional[Value]], attrs: dict,
                like: Optional[Node] = None) -> Node:
    """Put one new node in place of ``node`` (which computes the same tensor), placed
    just before it, named and with attribute types taken from ``like`` (default: node)."""
    like = like or node
    types = {k: v for k, v in like.attr_types.items() if k in attrs}
    new = _replace(node, rw, op_type, inputs, attrs, name=like.name)
    new.attr_types = types
    return new


def _operand(node: Node) -> Optional[tuple[Value, np.ndarray]]:
    """(x, c) when ``node`` computes x op c (or c op x, for Add and Mul) with c a small
    constant and x computed."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    a, b = node.inputs
    if b.is_initializer and not a.is_initializer:
        c = _const(node, 1)
        return None if c is None else (a, c)
    if node.op_type in ("Add", "Mul") and a.is_initializer and not b.is_initializer:
        c = _const(node, 0)
        return None if c is None else (b, c)
    return None


def _string_attr(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


# -- ops that leave their input as it is ---------------------------------------------------

#: The constant that makes each op return its other input.
_NEUTRAL = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1}


@rewrite("Add", "Sub", "Mul", "Div", options=("fusions",))
def neutral_constant(node: Node, rw: Rewriter) -> bool:
    """x + 0, x - 0, x * 1, x / 1 -> x, when the constant broadcasts x to nothing larger.

    Exporters write a bias Add of zeros for a layer made without bias (and the MatMul
    merge joins a missing bias as zeros). Exact, up to the sign of a zero (-0 + 0 is +0).
    """
    operand = _operand(node)
    if operand is None:
        return False
    x, c = operand
    if c.dtype.kind not in "fiu" or not (c == _NEUTRAL[node.op_type]).all():
        return False
    if x.type is None or x.type != node.outputs[0].type:
        return False
    return forward_to(node, rw, x)


@rewrite("Gather", options=("fusions",))
def gather_of_everything(node: Node, rw: Rewriter) -> bool:
    """Gather(x, [0, 1, ..., n-1]) along an axis of size n -> x.

    Position embeddings read for a static sequence length (Whisper's encoder gathers all
    1500 rows of its table): too large an output to fold, and equal to the table.
    """
    indices, shape = _const(node, 1), _shape(node.inputs[0])
    if indices is None or indices.ndim != 1 or indices.dtype.kind not in "iu" or shape is None:
        return False
    axis = _normalize([node.attrs.get("axis", 0)], len(shape))
    size = None if axis is None else shape[axis[0]]
    if not isinstance(size, int) or indices.size != size or not np.array_equal(indices, np.arange(size)):
        return False
    return forward(node, rw)


# -- BatchNormalization into the op before it ---------------------------------------------


def _batch_norm_affine(node: Node, rw: Rewriter) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(s, t), float64 per channel, with BN(y) = y * s + t, when ``node`` is an inference
    BatchNormalization with constant parameters whose statistics outputs nobody reads."""
    opset = _opset(node)
    if any(rw.is_used(out) for out in node.outputs[1:]) or node.attrs.get("training_mode", 0):
        return None
    if opset < 7 and not node.attrs.get("is_test", 0):
        return None  # before opset 7 the default is training (batch statistics)
    if opset < 9 and not node.attrs.get("spatial", 1):
        return None  # per-position statistics: not one scale per channel
    if _dtype(node.inputs[0]) not in _FLOATS:
        return None
    params = [_const(node, i) for i in range(1, 5)]
    if any(p is None or p.ndim != 1 or p.dtype.kind != "f" for p in params) or len({p.size for p in params}) != 1:
        return None
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    t = bias - mean * s
    if not (np.isfinite(s).all() and np.isfinite(t).all()):
        return None
    return s, t


def _conv_bias(conv: Node, channels: int, dtype: np.dtype) -> Optional[np.ndarray]:
    """The Conv's bias, zeros when it has none; None when it is computed."""
    if not _has_input(conv, 2):
        return np.zeros(channels, dtype)
    t = _weight_type(conv, 2)
    return _weight(conv, 2) if t is not None and t.shape == (channels,) else None


def _into_conv(conv: Node, bn: Node, s: np.ndarray, t: np.ndarray, rw: Rewriter) -> bool:
    """Conv weight [M, C/g, k...]: output channel m is scaled by s[m]."""
    wt = _weight_type(conv, 1)
    if wt is None or len(wt.shape) < 3 or wt.shape[0] != s.size:
        return False
    w = _weight(conv, 1)
    bias = _conv_bias(conv, s.size, w.dtype)
    if bias is None:
        return False
    weight = _rounded(w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1)), w.dtype)
    return _emit_conv(conv, bn, weight, _rounded(bias * s + t, w.dtype), rw)


def _into_conv_transpose(conv: Node, bn: Node, s: np.ndarray, t: np.ndarray, rw: Rewriter) -> bool:
    """ConvTranspose weight [C, M/g, k...]: input channel c of group c // (C/g) feeds output
    channels (c // (C/g)) * M/g + j, so the scale is laid out as [g, 1, M/g, 1...]."""
    wt = _weight_type(conv, 1)
    group = int(conv.attrs.get("group", 1))
    if (wt is None or len(wt.shape) < 3 or group < 1 or wt.shape[0] % group
            or wt.shape[1] * group != s.size):
        return False
    w = _weight(conv, 1)
    bias = _conv_bias(conv, s.size, w.dtype)
    if bias is None:
        return False
    kernel = w.shape[2:]
    grouped = w.astype(np.float64).reshape((group, w.shape[0] // group, w.shape[1]) + kernel)
    scaled = grouped * s.reshape((group, 1, w.shape[1]) + (1,) * len(kernel))
    return _emit_conv(conv, bn, _rounded(scaled.reshape(w.shape), w.dtype), _rounded(bias * s + t, w.dtype), rw)


def _emit_conv(conv: Node, bn: Node, weight, bias, rw: Rewriter) -> bool:
    if weight is None or bias is None:
        return False
    graph = conv.graph
    inputs = [conv.inputs[0], rw.constant(graph, weight, conv.inputs[1].name), rw.constant(graph, bias, "bias")]
    _substitute(bn, rw, conv.op_type, inputs, dict(conv.attrs), like=conv)
    return True


def _into_matmul(matmul: Node, bn: Node, s: np.ndarray, t: np.ndarray, rw: Rewriter) -> bool:
    """MatMul of a 2-D input: BN's channel axis (1) is the weight's column; the shift
    needs an addition, so the pair becomes one Gemm."""
    a_shape, wt = _shape(matmul.inputs[0]), _weight_type(matmul, 1)
    if a_shape is None or len(a_shape) != 2 or wt is None or len(wt.shape) != 2 or wt.shape[1] != s.size:
        return False
    if _opset(bn) < 7:
        return False  # Gemm before opset 7 broadcasts its C only when told to
    w = _weight(matmul, 1)
    weight = _rounded(w.astype(np.float64) * s, w.dtype)
    bias = _rounded(t, w.dtype)
    if weight is None or bias is None:
        return False
    graph = matmul.graph
    inputs = [matmul.inputs[0], rw.constant(graph, weight, matmul.inputs[1].name), rw.constant(graph, bias, "bias")]
    _substitute(bn, rw, "Gemm", inputs, {}, like=matmul)
    return True


def _into_gemm(gemm: Node, bn: Node, s: np.ndarray, t: np.ndarray, rw: Rewriter) -> bool:
    """alpha*A*B + beta*C, then *s + t: B's output columns scaled by s, and C becomes
    beta*C*s + t with beta 1."""
    bt, ct = _weight_type(gemm, 1), _weight_type(gemm, 2)
    trans_b = bool(gemm.attrs.get("transB", 0))
    if _opset(gemm) < 7 or bt is None or len(bt.shape) != 2 or bt.shape[0 if trans_b else 1] != s.size:
        return False
    if _has_input(gemm, 2) and (ct is None or len(ct.shape) > 2):
        return False
    b = _weight(gemm, 1)
    c = _weight(gemm, 2) if _has_input(gemm, 2) else np.zeros((), b.dtype)
    beta = float(gemm.attrs.get("beta", 1.0))
    weight = _rounded(b.astype(np.float64) * (s[:, None] if trans_b else s), b.dtype)
    bias = _rounded(beta * c.astype(np.float64) * s + t, b.dtype)
    if weight is None or bias is None:
        return False
    graph = gemm.graph
    attrs = dict(gemm.attrs)
    attrs["beta"] = 1.0
    inputs = [gemm.inputs[0], rw.constant(graph, weight, gemm.inputs[1].name), rw.constant(graph, bias, "bias")]
    _substitute(bn, rw, "Gemm", inputs, attrs, like=gemm)
    return True


_BATCH_NORM_FOLDS = {"Conv": _into_conv, "ConvTranspose": _into_conv_transpose, "MatMul": _into_matmul,
                     "Gemm": _into_gemm}


@rewrite("BatchNormalization", options=("folds_batch_norm",))
def batch_norm_into_producer(node: Node, rw: Rewriter) -> bool:
    """BN(Conv(x, W, b)) -> Conv(x, W*s, b*s + t); likewise ConvTranspose, Gemm, and a
    MatMul of a 2-D input (into a Gemm), when the producer's output feeds the BN alone."""
    producer = _producer(node.inputs[0], *_BATCH_NORM_FOLDS)
    if not _feeds_only(producer, node, rw):
        return False
    affine = _batch_norm_affine(node, rw)
    if affine is None or _dtype(producer.inputs[1]) != _dtype(node.inputs[0]):
        return False
    return _BATCH_NORM_FOLDS[producer.op_type](producer, node, *affine, rw)


# -- MatMuls of one input merged ------------------------------------------------------------


def _bias_add(matmul: Node, columns: int, rw: Rewriter) -> Optional[tuple[Node, Value]]:
    """(Add, bias) when the MatMul's output is read only by an Add of a constant [columns]."""
    add = _sole_reader(matmul.outputs[0], rw)
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or add.graph is not matmul.graph:
        return None
    bias = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
    t = _constant_type(bias)
    if t is None or t.shape != (columns,) or t.dtype != _dtype(matmul.outputs[0]):
        return None
    return add, bias


def _merge_candidate(node: Node, rw: Rewriter) -> Optional[TensorType]:
    """The type of the MatMul's 2-D float weight when nothing else reads the weight and
    something reads the MatMul."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or not rw.is_used(node.outputs[0]):
        return None
    t = _weight_type(node, 1)
    if t is None or len(t.shape) != 2 or t.dtype not in _FLOATS or _sole_reader(node.inputs[1], rw) is not node:
        return None
    return t


@rewrite("MatMul", options=("fusions", "merge_matmuls"))
def merge_sibling_matmuls(node: Node, rw: Rewriter) -> bool:
    """MatMul(x, W1), MatMul(x, W2)... (+ b1, + b2...) -> Split(MatMul(x, [W1 W2...]) + [b1 b2...]).

    Exporters that write attention as separate Q, K and V projections (PyTorch's dynamo)
    leave three MatMuls and three Adds per layer; onnx-simplifier merges them. Each
    weight must be read by its MatMul alone (else it would be stored twice), with the
    same K rows; a MatMul without a bias Add next to ones with gets zeros. Only when
    it leaves fewer nodes: the Split costs a node and a copy.
    """
    x, mine = node.inputs[0], _merge_candidate(node, rw)
    x_shape = _shape(x)
    if mine is None or x_shape is None or len(x_shape) < 2:
        return False
    siblings = []
    for user, index in x.users:
        if index != 0 or user.graph is not node.graph or user in siblings:
            continue
        t = _merge_candidate(user, rw)
        if t is not None and t.shape[0] == mine.shape[0] and t.dtype == mine.dtype:
            siblings.append(user)
    if len(siblings) < 2:
        return False
    siblings.sort(key=rw.order)
    widths = [s.inputs[1].type.shape[1] for s in siblings]
    biases = [_bias_add(s, width, rw) for s, width in zip(siblings, widths)]
    added = sum(b is not None for b in biases)
    if len(siblings) + added <= 2 + (added > 0):
        return False  # no node fewer (two MatMuls become a MatMul and a Split): leave them
    graph, first, rank = node.graph, siblings[0], len(x_shape)
    # Before the first sibling: x and the constants are defined there, and every reader of
    # a sibling's output (or of its bias Add's) comes after it.
    weight = np.concatenate([_weight(s, 1) for s in siblings], axis=1)
    merged = rw.add_node(graph, "MatMul", [x, rw.constant(graph, weight, "weight")], before=first, name=first.name)
    infer_node(merged, retype_bodies=False)
    out = merged.outputs[0]
    if any(b is not None for b in biases):
        joined = np.concatenate([np.zeros(width, weight.dtype) if b is None else b[1].const
                                 for b, width in zip(biases, widths)])
        add = rw.add_node(graph, "Add", [out, rw.constant(graph, joined, "bias")], before=first)
        infer_node(add, retype_bodies=False)
        out = add.outputs[0]
    if _opset(node) >= 13:
        split = rw.add_node(graph, "Split", [out, rw.constant(graph, np.array(widths, np.int64), "split")],
                            len(siblings), {"axis": rank - 1}, before=first)
    else:
        split = rw.add_node(graph, "Split", [out], len(siblings), {"axis": rank - 1, "split": widths}, before=first)
    infer_node(split, retype_bodies=False)
    for sibling, bias, part in zip(siblings, biases, split.outputs):
        last = sibling if bias is None else bias[0]
        part.type = last.outputs[0].type  # the same tensor: keep the type readers were inferred with
        rw.replace_value(last.outputs[0], part)
        rw.remove_node(last)  # a bias Add takes its MatMul with it (no reader left)
    return True


# -- MatMul + Add into Gemm --------------------------------------------------------------


@rewrite("Add", options=("fusions",))
def matmul_add_into_gemm(node: Node, rw: Rewriter) -> bool:
    """Add(MatMul(a, W), c) -> Gemm(a, W, c) for a 2-D ``a`` and constants W and c.

    Only rank 2: on a 3-D ``a`` a Gemm needs a Reshape on each side (which is what
    onnx-simplifier's fusion leaves on the exports of 3-D activations). ``c`` must
    broadcast to [M, N] without growing it. Decided from types: no array is read.
    """
    for index in (0, 1):
        matmul = _producer(node.inputs[index], "MatMul")
        bias = node.inputs[1 - index]
        if matmul is not None and _constant_type(bias) is not None:
            break
    else:
        return False
    if _opset(node) < 7 or not _feeds_only(matmul, node, rw):
        return False
    a_shape, wt, ct = _shape(matmul.inputs[0]), _weight_type(matmul, 1), bias.type
    if a_shape is None or len(a_shape) != 2 or wt is None or len(wt.shape) != 2 or len(ct.shape) > 2:
        return False
    dtype = _dtype(matmul.inputs[0])
    if dtype not in _FLOATS or wt.dtype != dtype or ct.dtype != dtype:
        return False
    rows, columns = (1,) * (2 - len(ct.shape)) + tuple(ct.shape)
    if columns not in (1, wt.shape[1]) or (rows != 1 and not (isinstance(a_shape[0], int) and rows == a_shape[0])):
        return False
    _substitute(node, rw, "Gemm", [matmul.inputs[0], matmul.inputs[1], bias], {}, like=matmul)
    return True


# -- Pad into the pads of a Conv or AveragePool ----------------------------------------


def _zero_spatial_pads(pad: Node, rank: int) -> Optional[tuple[list[int], list[int]]]:
    """(begins, ends) over the spatial dims when ``pad`` adds zeros there only."""
    if _string_attr(pad, "mode", "constant") != "constant":
        return None
    if _opset(pad) < 11:
        pads, value, axes = pad.attrs.get("pads", pad.attrs.get("paddings")), pad.attrs.get("value", 0.0), None
    else:
        pads = _input_dims(pad, 1)
        value = 0.0
        if _has_input(pad, 2):
            # A float value is a constant; an integer one may have become a node parameter.
            const, dims = _const(pad, 2), _input_dims(pad, 2)
            if const is not None and const.size == 1:
                value = const.reshape(-1)[0]
            else:
                value = dims[0] if dims is not None and len(dims) == 1 else None
        axes = _input_dims(pad, 3) if _has_input(pad, 3) else None
        if _has_input(pad, 3) and axes is None:
            return None
    if pads is None or value is None or isinstance(value, Expr) or float(value) != 0.0:
        return None
    if any(isinstance(p, Expr) for p in pads) or any(isinstance(a, Expr) for a in axes or ()):
        return None
    axes = list(range(rank)) if axes is None else _normalize(list(axes), rank)
    if axes is None or len(set(axes)) != len(axes) or len(pads) != 2 * len(axes):
        return None
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = int(pads[i]), int(pads[i + len(axes)])
    if min(begins + ends) < 0 or any(begins[:2]) or any(ends[:2]):
        return None  # a crop, or padding of the batch or channel dim: not a window's pads
    return begins[2:], ends[2:]


@rewrite("Conv", "AveragePool", options=("fusions",))
def pad_into_window(node: Node, rw: Rewriter) -> bool:
    """Conv(Pad(x, zeros)) -> Conv(x) with the pads added to its own; likewise an
    AveragePool that counts its padding (the padded zeros count either way).

    Not MaxPool: its padding is -inf, not the zeros Pad adds.
    """
    pad = _producer(node.inputs[0], "Pad")
    if not _feeds_only(pad, node, rw):
        return False
    shape = _shape(pad.inputs[0])
    if shape is None or len(shape) < 3:
        return False
    spatial = len(shape) - 2
    added = _zero_spatial_pads(pad, len(shape))
    auto_pad = _string_attr(node, "auto_pad", "NOTSET")
    if added is None or auto_pad not in ("NOTSET", "VALID"):
        return False
    own = [0] * (2 * spatial) if auto_pad == "VALID" else [int(p) for p in node.attrs.get("pads", [0] * (2 * spatial))]
    if len(own) != 2 * spatial:
        return False
    attrs = dict(node.attrs)
    attrs.pop("auto_pad", None)
    if node.op_type == "AveragePool":
        # ceil_mode: the overhang past the padding never counts, the explicit zeros did.
        if _opset(node) < 7 or node.attrs.get("ceil_mode", 0):
            return False
        if not node.attrs.get("count_include_pad", 0) and any(own):
            return False  # its own padding must keep not counting
        attrs["count_include_pad"] = 1
    begins, ends = added
    attrs["pads"] = [own[i] + begins[i] for i in range(spatial)] + [own[spatial + i] + ends[i] for i in range(spatial)]
    if node.op_type == "AveragePool":
        kernel = list(node.attrs.get("kernel_shape", ()))
        if len(kernel) != spatial or any(p >= kernel[i % spatial] for i, p in enumerate(attrs["pads"])):
            return False  # onnxruntime refuses a pool's pad as wide as its window
    _substitute(node, rw, node.op_type, [pad.inputs[0]] + list(node.inputs[1:]), attrs)
    return True


# -- chains of arithmetic by constants ----------------------------------------------------

_ADDITIVE = {"Add": 1.0, "Sub": -1.0}
_MULTIPLICATIVE = ("Mul", "Div")


def _combine(inner: str, outer: str, c1: np.ndarray, c2: np.ndarray) -> Optional[tuple[str, np.ndarray]]:
    """The op and constant that do (x inner c1) outer c2 in one step."""
    a, b = c1.astype(np.float64), c2.astype(np.float64)
    if inner in _ADDITIVE:
        if inner == outer == "Sub":
            return "Sub", a + b
        return "Add", _ADDITIVE[inner] * a + _ADDITIVE[outer] * b
    if (inner == "Div" and not a.all()) or (outer == "Div" and not b.all()):
        return None  # a division by zero: leave its infinities where they were
    if inner == outer:
        return inner, a * b
    return "Mul", (a / b if inner == "Mul" else b / a)


@rewrite("Add", "Sub", "Mul", "Div", options=("fusions",))
def constant_chain(node: Node, rw: Rewriter) -> bool:
    """(x + a) + b -> x + (a + b), x - a - b -> x - (a + b), (x * a) / b -> x * (a / b)...

    Only within a family (Add/Sub, Mul/Div), when the intermediate is read by ``node``
    alone, for floats; the constants broadcast together into one no larger than the
    larger of them, so the output's shape is the same.
    """
    outer = _operand(node)
    family = tuple(_ADDITIVE) if node.op_type in _ADDITIVE else _MULTIPLICATIVE
    inner = None if outer is None else _producer(outer[0], *family)
    if outer is None or not _feeds_only(inner, node, rw):
        return False
    operand = _operand(inner)
    if operand is None:
        return False
    x, c1 = operand
    c2 = outer[1]
    dtype = _dtype(x)
    if dtype not in _FLOATS or c1.dtype != to_numpy_dtype(dtype) or c2.dtype != c1.dtype:
        return False
    if np.broadcast_shapes(c1.shape, c2.shape) not in (c1.shape, c2.shape):
        return False
    combined = _combine(inner.op_type, node.op_type, c1, c2)
    constant = None if combined is None else _rounded(combined[1], c1.dtype)
    if constant is None:
        return False
    op, _ = combined
    value = rw.constant(node.graph, constant, "const")
    _substitute(node, rw, op, [x, value], {})
    return True


# -- Unsqueeze / Squeeze chains -------------------------------------------------------------


def _emit_axes_op(node: Node, rw: Rewriter, source: Value, axes: list[int]) -> None:
    """Put a Squeeze/Unsqueeze of ``source`` by ``axes`` in place of ``node`` (axes as
    an input from opset 13, an attribute before)."""
    if _opset(node) >= 13:
        axes_value = rw.constant(node.graph, np.array(axes, np.int64), "axes")
        _substitute(node, rw, node.op_type, [source, axes_value], {})
    else:
        _substitute(node, rw, node.op_type, [source], {"axes": axes})


@rewrite("Unsqueeze", options=("fusions",))
def unsqueeze_of_unsqueeze(node: Node, rw: Rewriter) -> bool:
    """Unsqueeze(Unsqueeze(x, a), b) -> Unsqueeze(x, a'∪b): a's axes, counted in the
    intermediate, move to where the intermediate's dims land in the output."""
    inner = _producer(node.inputs[0], "Unsqueeze")
    x_shape = None if inner is None else _shape(inner.inputs[0])
    if x_shape is None:
        return False
    first, known = _axes(inner)
    second, second_known = _axes(node)
    if not known or not second_known or first is None or second is None:
        return False
    middle_rank = len(x_shape) + len(first)
    first, second = _normalize(first, middle_rank), _normalize(second, middle_rank + len(second))
    if first is None or second is None or len(set(first)) != len(first) or len(set(second)) != len(second):
        return False
    kept = [p for p in range(middle_rank + len(second)) if p not in second]  # the intermediate's dims
    _emit_axes_op(node, rw, inner.inputs[0], sorted(set(second) | {kept[a] for a in first}))
    return True


@rewrite("Squeeze", options=("fusions",))
def squeeze_of_squeeze(node: Node, rw: Rewriter) -> bool:
    """Squeeze(Squeeze(x, a), b) -> Squeeze(x, a∪b'): b's axes, counted in the
    intermediate, are x's dims that the first Squeeze kept."""
    inner = _producer(node.inputs[0], "Squeeze")
    x_shape = None if inner is None else _shape(inner.inputs[0])
    if x_shape is None:
        return False
    first, known = _axes(inner)
    second, second_known = _axes(node)
    if not known or not second_known:
        return False
    first = _ones(x_shape) if first is None else _normalize(first, len(x_shape))
    if first is None or len(set(first)) != len(first):
        return False
    kept = [p for p in range(len(x_shape)) if p not in first]  # x's dims in the intermediate
    second = _ones(tuple(x_shape[p] for p in kept)) if second is None else _normalize(second, len(kept))
    if second is None or len(set(second)) != len(second) or not (first or second):
        return False  # no axes at all would mean "every dim of size 1" to a Squeeze
    _emit_axes_op(node, rw, inner.inputs[0], sorted(set(first) | {kept[b] for b in second}))
    return True
