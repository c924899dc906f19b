"""Shape agreements an op requires of its inputs, checked where the types cannot prove them.

A type rule fails a node whose input dims provably disagree (MatMul's [m, 4] x [5, n]),
but it lets pass dims it cannot compare: exporters give each input dim a symbol of its
own, so MatMul's [m, k1] x [k2, n] types as [m, n] whatever k1 and k2 turn out to be.
A native kernel then takes one of them as the extent of both and reads past the end of
the other input: results that are wrong, and differ from run to run. (The reference
backend runs numpy, which raises.)

Each op here lists its agreements as pairs of dims that must be equal (or the first
may be 1, where it broadcasts; or, for a pool's spatial dims, the first must be at least
the second); the program builder turns those it cannot prove into
run-time checks ahead of the node's kernel (``return STEP_ERROR``), and on a failed one
the VM names the agreement, with the values it found, from the same list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import TensorType
from ...ops.common import product
from ...ops.constant_ops import EXACT_INTEGERS, whole_number
from ...ops.registry import one_element_inputs, one_element_message
from ...symbolic import Dim, add_all, bounds, mul, prove_eq
from .layout_assign import CONV, DOMAIN


@dataclass(frozen=True)
class Agreement:
    """``lhs`` must equal ``rhs`` (or be 1 when ``broadcast``; or, with ``at_least``, be at
    least ``rhs``); ``what`` says which dims."""

    lhs: Dim
    rhs: Dim
    what: str
    broadcast: bool = False
    at_least: bool = False

    def holds(self, lhs: int, rhs: int) -> bool:
        if self.at_least:
            return lhs >= rhs
        return lhs == rhs or (self.broadcast and lhs == 1)

    def proven(self) -> bool:
        """Whether the types prove it, whatever the symbols' values in their ranges."""
        if self.at_least:
            return bounds(self.lhs)[0] >= bounds(self.rhs)[1]
        return prove_eq(self.lhs, self.rhs)


_RULES: dict[tuple[str, str], Callable[[Node], list[Agreement]]] = {}


def _rule(*op_types: str, domain: str = ""):
    def register(fn: Callable[[Node], list[Agreement]]):
        for op in op_types:
            _RULES[(domain, op)] = fn
        return fn

    return register


def agreements(node: Node) -> list[Agreement]:
    """The node's agreements the types do not already prove (empty for most nodes)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    rule = _RULES.get((domain, node.op_type))
    found = (rule(node) if rule is not None else []) + _one_element(node, domain)
    return [a for a in found if not a.proven()]


def _one_element(node: Node, domain: str) -> list[Agreement]:
    # The inputs the spec gives one element (ops/registry.py's ``single``): a kernel reads
    # element 0 of a run-time value, whatever its size (the fuzz campaign, seed 1330).
    found = []
    for index in one_element_inputs(domain, node.op_type):
        value = _input(node, index)
        shape = _shape(value)
        if shape is None or index in node.params:
            continue
        found.append(Agreement(product(shape), 1, f"{one_element_message(index, value.name)}: its element count"))
    return found


def _shape(value: Optional[Value]) -> Optional[tuple]:
    t = value.type if value is not None else None
    return t.shape if isinstance(t, TensorType) and t.shape is not None else None


def _dim(value: Value, axis: int) -> str:
    return f"dimension {axis} of {value.name!r}"


def _pair(a: Value, axis_a: int, b: Value, axis_b: int, broadcast: bool = False) -> list[Agreement]:
    sa, sb = _shape(a), _shape(b)
    if sa is None or sb is None or not -len(sa) <= axis_a < len(sa) or not -len(sb) <= axis_b < len(sb):
        return []
    axis_a %= len(sa)
    axis_b %= len(sb)
    verb = "must be 1 or equal" if broadcast else "must equal"
    return [Agreement(sa[axis_a], sb[axis_b], f"{_dim(a, axis_a)} {verb} {_dim(b, axis_b)}", broadcast)]


def _input(node: Node, index: int) -> Optional[Value]:
    return node.inputs[index] if index < len(node.inputs) else None


@_rule("MatMul")
def _matmul(node: Node) -> list[Agreement]:
    a, b = node.inputs[0], node.inputs[1]
    sb = _shape(b)
    if sb is None:
        return []
    return _pair(a, -1, b, -2 if len(sb) >= 2 else 0)


@_rule("Gemm")
def _gemm(node: Node) -> list[Agreement]:
    a, b, c = node.inputs[0], node.inputs[1], _input(node, 2)
    trans_a, trans_b = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    out = _shape(node.outputs[0])
    found = _pair(a, 0 if trans_a else 1, b, 1 if trans_b else 0)
    sc = _shape(c)
    if sc is not None and out is not None and len(out) == 2:
        for axis in range(len(sc)):  # C broadcasts to [M, N] from the right
            found.append(Agreement(sc[axis], out[2 - len(sc) + axis],
                                   f"{_dim(c, axis)} must be 1 or equal dimension {2 - len(sc) + axis} of the "
                                   f"product", broadcast=True))
    return found


@_rule("Conv")
def _conv(node: Node) -> list[Agreement]:
    x, w, bias = node.inputs[0], node.inputs[1], _input(node, 2)
    sx, sw = _shape(x), _shape(w)
    if sx is None or sw is None or len(sx) < 2 or len(sw) < 2:
        return []
    group = int(node.attrs.get("group", 1))
    found = [Agreement(sx[1], mul(sw[1], group),
                       f"{_dim(x, 1)} (channels) must equal {_dim(w, 1)} x group {group}")]
    if bias is not None:
        found += _pair(bias, 0, w, 0)
    return found + _conv_output(node, 2, len(_shape(node.outputs[0]) or ()))


def _conv_output(node: Node, first: int, end: int) -> list[Agreement]:
    # The type rule refuses an output extent it can see is below 1; one of symbolic input
    # sizes is checked when they are known (as onnxruntime refuses the input): an empty
    # output plane made the next conv's kernels divide by zero.
    y = node.outputs[0]
    sy = _shape(y)
    return [Agreement(sy[axis], 1, f"{_dim(y, axis)} must be at least 1: the (dilated) kernel must fit in the "
                      "padded input", at_least=True) for axis in range(first, end)]


@_rule(CONV, domain=DOMAIN)
def _nchwc_conv(node: Node) -> list[Agreement]:
    # A Conv the layout pass blocked: [N, C/c, H, W, c], its plane on axes 2 and 3.
    return _conv_output(node, 2, len(_shape(node.outputs[0]) or ()) - 1)


@_rule("Concat")
def _concat(node: Node) -> list[Agreement]:
    inputs = [v for v in node.inputs if v is not None]
    first = inputs[0] if inputs else None
    s0 = _shape(first)
    if s0 is None:
        return []
    axis = int(node.attrs.get("axis", 0)) % max(len(s0), 1)
    found = []
    for other in inputs[1:]:
        so = _shape(other)
        if so is None or len(so) != len(s0):
            continue
        for d in range(len(s0)):
            if d != axis:
                found += _pair(other, d, first, d)
    return found


@_rule("Split")
def _split(node: Node) -> list[Agreement]:
    x = node.inputs[0]
    sx = _shape(x)
    outs = [_shape(v) for v in node.outputs]
    if sx is None or any(o is None or len(o) != len(sx) for o in outs) or not sx:
        return []
    axis = int(node.attrs.get("axis", 0)) % len(sx)
    total = add_all(o[axis] for o in outs)
    return [Agreement(total, sx[axis], f"the parts' sizes along axis {axis} must add up to {_dim(x, axis)}")]


@_rule("BatchNormalization", "InstanceNormalization")
def _per_channel(node: Node) -> list[Agreement]:
    x = node.inputs[0]
    sx = _shape(x)
    if sx is None or len(sx) < 2:
        return []
    return [a for v in node.inputs[1:] if v is not None for a in _pair(v, 0, x, 1)]


@_rule("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
def _view_count(node: Node) -> list[Agreement]:
    # A target shape computed at run time (from Shape, Gather, Concat...) types as symbols
    # whose element count the types may not tie to the input's: a view of the wrong count
    # read past the input (or left output unwritten). The other view ops too: their output
    # may keep a type the model declares that inference could not check (a Squeeze without
    # axes over a dim of unknown extent, declared as an output of another rank), and a view
    # of that shape silently dropped elements (the fuzz campaign, --reproduce 1320:3028).
    sx, sy = _shape(node.inputs[0]) if node.inputs else None, _shape(node.outputs[0])
    if sx is None or sy is None:
        return []
    what = "the target shape's" if node.op_type == "Reshape" else "the output's"
    return [Agreement(product(sy), product(sx),
                      f"{what} element count must equal the input's ({node.inputs[0].name!r})")]


@_rule("GatherElements")
def _gather_elements(node: Node) -> list[Agreement]:
    data, indices = node.inputs[0], node.inputs[1]
    sd, si = _shape(data), _shape(indices)
    if sd is None or si is None or len(sd) != len(si) or not sd:
        return []
    axis = int(node.attrs.get("axis", 0)) % len(sd)
    return [Agreement(sd[d], si[d], f"{_dim(data, d)} must be at least {_dim(indices, d)}", at_least=True)
            for d in range(len(sd)) if d != axis]


@_rule("ScatterElements")
def _scatter_elements(node: Node) -> list[Agreement]:
    indices, updates = node.inputs[1], node.inputs[2]
    si = _shape(indices)
    return [a for d in range(len(si or ())) for a in _pair(updates, d, indices, d)]


@_rule("LSTM", "GRU", "RNN")
def _recurrent(node: Node) -> list[Agreement]:
    if int(node.attrs.get("layout", 0)):
        return []
    x, w = node.inputs[0], node.inputs[1]
    found = _pair(w, 2, x, 2)  # input size
    initial = [_input(node, 5)] + ([_input(node, 6)] if node.op_type == "LSTM" else [])
    for state in initial:
        if state is not None:
            found += _pair(state, 1, x, 1)  # batch
    sequence_lens = _input(node, 4)
    if sequence_lens is not None:
        found += _pair(sequence_lens, 0, x, 1)
    return found


@_rule("Range")
def _range(node: Node) -> list[Agreement]:
    # A float Range whose limit is a dim (passes/simplify/rules.py range_of_cast_integer):
    # its type's length is the integer one, which is the float Range's while the limit, the
    # start and the step, and so every value, are whole numbers the float type holds.
    param, out = node.params.get(1), _shape(node.outputs[0])
    exact = EXACT_INTEGERS.get(node.outputs[0].type.dtype) if out is not None else None
    if param is None or exact is None or len(param.dims) != 1:
        return []
    ends = [whole_number(np.asarray(v.const).reshape(-1)[0]) if v is not None and v.const is not None else None
            for v in (node.inputs[0], node.inputs[2])]
    if None in ends:
        return []
    most = exact - 1 - abs(ends[0]) - abs(ends[1])
    what = f"the limit (a dim, cast to float) must be within +-{most}, where float Range values are whole numbers"
    limit = param.dims[0]
    return [Agreement(most, limit, what, at_least=True), Agreement(limit, -most, what, at_least=True)]


@_rule("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _pool(node: Node) -> list[Agreement]:
    # ops/conv_pool.py require_spatial: the reference backend refuses the same inputs.
    x = node.inputs[0]
    sx = _shape(x)
    return [Agreement(sx[axis], 1, f"{_dim(x, axis)} (spatial) must be at least 1: pooling over an empty "
                      "extent is undefined", at_least=True) for axis in range(2, len(sx or ()))]


def c_checks(items: Sequence[Agreement], dim: Callable[[Dim], str]) -> str:
    """C statements failing the step where an agreement does not hold (``dim``: a dim's C
    expression, the lowering context's)."""
    lines = []
    for a in items:
        lhs, rhs = dim(a.lhs), dim(a.rhs)
        bad = (f"{lhs} < {rhs}" if a.at_least else f"{lhs} != {rhs}" if not a.broadcast
               else f"{lhs} != {rhs} && {lhs} != 1")
        lines.append(f"if ({bad}) return STEP_ERROR;  /* {a.what.replace('*/', '* /')} */")
    return "\n".join(lines)
