"""Clean-up rewrite rules run by the simplify worklist.

A rule is a function ``rule(node, rw) -> bool`` registered for one or more op
types with :func:`rewrite`; it returns True when it changed the graph, having
made every change through the Rewriter ``rw`` (which keeps def-use lists right
and enqueues what needs another look).  Rules see the node's inferred types and
known contents (``value.const``, ``value.shape_contents``) and must keep the
graph's outputs' values the same.

The rules here remove ops that do nothing (Identity, inference Dropout, a Cast
to the type it already has, a Reshape/Expand/Squeeze... that keeps the shape,
an identity Transpose) and merge chains that collapse (Reshape of a reshape,
Transpose of a Transpose, Squeeze of an Unsqueeze, Cast of a widening Cast).
They only ever look one producer up, so each costs O(1) per visit; when a rule
merges a chain it makes the outer node read the inner one's input and leaves
the inner node for the engine to drop once nothing reads it.

A rule that replaces a node by a new one gives the new output the old one's
type and contents: the replacement computes the same tensor, and this keeps
the graph typed for whoever looks next, before the engine re-infers it.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import numpy as np

from ...ir.graph import Node, StaticParam, Value
from ...ir.types import (BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8, UINT16,
                         UINT32, UINT64, TensorType)
from ...ops import lookup
from ...ops.constant_ops import EXACT_INTEGERS, whole_number
from ...ops.context import EvalContext
from ...symbolic import Dim, Expr, prove_eq
from .rewriter import Rewriter

Rule = Callable[[Node, Rewriter], bool]
RULES: dict[str, list[Rule]] = {}


def rewrite(*op_types: str, options: Sequence[str] = ()):
    """Register the decorated function as a rule for ``op_types`` of the ONNX domain.

    The registered rule skips nodes of other domains (a custom ``Identity`` is
    not ONNX's); the decorated function itself is returned unchanged.
    ``options`` names SimplifyOptions fields (or properties) that must all be true for the engine
    to run the rule (the fusions of fusions.py: see :func:`rules_for`).
    """

    def register(fn: Rule) -> Rule:
        @functools.wraps(fn)
        def rule(node: Node, rw: Rewriter) -> bool:
            if node.domain not in ("", "ai.onnx"):
                return False
            return fn(node, rw)

        rule.options = tuple(options)
        for op in op_types:
            RULES.setdefault(op, []).append(rule)
        return fn

    return register


def rules_for(options) -> dict[str, list[Rule]]:
    """RULES less the rules whose ``options`` are not all set in ``options`` (a
    SimplifyOptions): the table is filtered once per run, not asked per visit."""
    return {op: kept for op, rules in RULES.items()
            if (kept := [r for r in rules if all(getattr(options, name) for name in r.options)])}


def forward(node: Node, rw: Rewriter, index: int = 0) -> bool:
    """Replace the node's only output by its input ``index`` and drop the node."""
    return forward_to(node, rw, node.inputs[index])


def forward_to(node: Node, rw: Rewriter, source: Optional[Value]) -> bool:
    """Replace the node's only output by ``source`` (an equal tensor) and drop the node.

    Refused (False) when the output is returned by a body graph and ``source``
    lives outside that body: a body must not return an outer value directly,
    since nothing would then keep that value's producer alive (graph outputs
    are not among a value's users) and ONNX tools expect the Identity there.
    """
    if source is None:
        return False
    old = node.outputs[0]
    graph = node.graph
    if graph.parent is not None and source.graph is not graph and any(v is old for v in graph.outputs):
        return False
    rw.replace_value(old, source)
    rw.remove_node(node)
    return True


# -- helpers ---------------------------------------------------------------------------


def _opset(node: Node) -> int:
    return node.graph.opset.get("", 1) if node.graph is not None else 1


def _tensor_type(value: Optional[Value]) -> Optional[TensorType]:
    if value is None or not isinstance(value.type, TensorType):
        return None
    return value.type


def _shape(value: Optional[Value]) -> Optional[tuple]:
    t = _tensor_type(value)
    return None if t is None else t.shape


def _dtype(value: Optional[Value]) -> Optional[int]:
    t = _tensor_type(value)
    return None if t is None else t.dtype


def _same_shape(a: Optional[tuple], b: Optional[tuple]) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def _producer(value: Optional[Value], *op_types: str) -> Optional[Node]:
    """The ONNX-domain node of one of ``op_types`` that computes ``value``."""
    if value is None or value.producer is None:
        return None
    node = value.producer
    if node.graph is None or node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
        return None
    return node


def _input_dims(node: Node, index: int) -> Optional[tuple]:
    """What is known of a 0-D/1-D integer input's contents, as dims (as the type rules see it)."""
    param = node.params.get(index)
    if param is not None:
        return tuple(param.dims)
    if index >= len(node.inputs) or node.inputs[index] is None:
        return None
    value = node.inputs[index]
    if value.const is not None:
        array = np.asarray(value.const)
        if array.ndim <= 1 and array.dtype.kind in "iub":
            return tuple(int(v) for v in array.reshape(-1))
        return None
    return value.shape_contents


def _has_input(node: Node, index: int) -> bool:
    return index < len(node.inputs) and (node.inputs[index] is not None or index in node.params)


def _normalize(axes: Sequence[Dim], rank: int) -> Optional[list[int]]:
    """Axes as non-negative ints, or None when one is symbolic or out of range."""
    out = []
    for a in axes:
        if isinstance(a, Expr) or not -rank <= int(a) < rank:
            return None
        out.append(int(a) % rank if rank else 0)
    return out


def _replace(node: Node, rw: Rewriter, op_type: str, inputs: Sequence[Optional[Value]], attrs: dict,
             name: Optional[str] = None) -> Node:
    """Put a new single-output node in place of ``node`` (which computes the same tensor),
    named ``name`` (default: node's)."""
    new = rw.add_node(node.graph, op_type, inputs, 1, attrs, before=node, name=node.name if name is None else name)
    old = node.outputs[0]
    new.outputs[0].type = old.type
    new.outputs[0].shape_contents = old.shape_contents
    rw.replace_value(old, new.outputs[0])
    rw.remove_node(node)
    return new


# -- Identity, Dropout, Constant -------------------------------------------------------


@rewrite("Identity")
def identity(node: Node, rw: Rewriter) -> bool:
    return forward(node, rw)


@rewrite("Dropout")
def dropout(node: Node, rw: Rewriter) -> bool:
    """Dropout in inference mode passes its input through (the evaluator's reading of the spec:
    before opset 12 there is no training mode; from 12 on it is input 2, false by default)."""
    if _opset(node) >= 12 and _has_input(node, 2):
        mode = None if node.inputs[2] is None else node.inputs[2].const
        if mode is None or mode.size != 1 or bool(mode.reshape(-1)[0]):
            return False
    if len(node.outputs) > 1 and rw.is_used(node.outputs[1]):
        return False  # the mask is all true, but of a shape that may only be known at run time
    return forward(node, rw)


@rewrite("Constant")
def constant(node: Node, rw: Rewriter) -> bool:
    """A Constant node becomes an initializer of its graph."""
    rule = lookup("", "Constant", _opset(node))
    if rule is None:
        return False
    array = rule.evaluate(EvalContext(node, _opset(node)))[0]
    value = rw.constant(node.graph, np.asarray(array), hint=node.outputs[0].name)
    rw.replace_value(node.outputs[0], value)
    rw.remove_node(node)
    return True


# -- Cast ------------------------------------------------------------------------------

#: source dtype -> the dtypes that hold every one of its values exactly.
_WIDENS_EXACTLY: dict[int, frozenset] = {
    BOOL: frozenset({INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE}),
    UINT8: frozenset({UINT16, UINT32, UINT64, INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE}),
    INT8: frozenset({INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT, DOUBLE}),
    UINT16: frozenset({UINT32, UINT64, INT32, INT64, FLOAT, DOUBLE}),
    INT16: frozenset({INT32, INT64, FLOAT, DOUBLE}),
    UINT32: frozenset({UINT64, INT64, DOUBLE}),
    INT32: frozenset({INT64, DOUBLE}),
    FLOAT16: frozenset({FLOAT, DOUBLE}),
    BFLOAT16: frozenset({FLOAT, DOUBLE}),
    FLOAT: frozenset({DOUBLE}),
}
#: Targets a cast reaches from any value of the same number in the same way.  Strings
#: are not among them (a float prints differently as float32 and float64), nor the
#: float8 types (their casts saturate and round in ways we do not model here).
_VALUE_CASTS = frozenset({BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64,
                          FLOAT16, BFLOAT16, FLOAT, DOUBLE})


@rewrite("Cast")
def cast(node: Node, rw: Rewriter) -> bool:
    """Cast to the type the input has → the input; Cast(Cast(x)) → Cast(x) when the
    inner cast widens exactly (int8→int32→float: one cast; int64→int32→int64 stays)."""
    to = node.attrs.get("to")
    source = _dtype(node.inputs[0])
    if to is None or source is None:
        return False
    if int(to) == source:
        return forward(node, rw)
    inner = _producer(node.inputs[0], "Cast")
    if inner is None or int(to) not in _VALUE_CASTS:
        return False
    original = inner.inputs[0]
    first = _dtype(original)
    if first is None or source not in _WIDENS_EXACTLY.get(first, ()):
        return False
    if int(to) != first or not forward_to(node, rw, original):
        rw.set_input(node, 0, original)
    return True


@rewrite("CastLike")
def cast_like(node: Node, rw: Rewriter) -> bool:
    source, like = _dtype(node.inputs[0]), _dtype(node.inputs[1] if len(node.inputs) > 1 else None)
    if source is None or source != like:
        return False
    return forward(node, rw)


# -- ops that keep the data and may keep the shape ---------------------------------------


@rewrite("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand")
def same_shape(node: Node, rw: Rewriter) -> bool:
    """A reshape or broadcast whose output has its input's (symbolic) shape does nothing."""
    x, y = _tensor_type(node.inputs[0] if node.inputs else None), _tensor_type(node.outputs[0])
    if x is None or y is None or x.dtype != y.dtype or not _same_shape(x.shape, y.shape):
        return False
    return forward(node, rw)


#: Ops that only re-view their input: same elements, same row-major order.
_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


@rewrite("Reshape")
def reshape_of_view(node: Node, rw: Rewriter) -> bool:
    """Reshape(Reshape(x, s1), s2) → Reshape(x, s2), and likewise over Flatten/(Un)Squeeze.

    Safe when s2 does not refer to the intermediate's dims: a -1 only depends
    on the element count, which x shares, but a 0 copies the intermediate's dim
    at that position, so each entry that may be 0 must sit where x and the
    intermediate have the same dim.
    """
    inner = _producer(node.inputs[0], *_VIEWS)
    if inner is None or not inner.inputs or inner.inputs[0] is None:
        return False
    target = _input_dims(node, 1)
    if target is None:
        return False
    original = inner.inputs[0]
    allowzero = _opset(node) >= 14 and bool(node.attrs.get("allowzero", 0))
    if not allowzero:
        x_shape, mid_shape = _shape(original), _shape(node.inputs[0])
        for position, entry in enumerate(target):
            may_be_zero = entry.lo <= 0 if isinstance(entry, Expr) else int(entry) == 0
            if not may_be_zero:
                continue
            if (x_shape is None or mid_shape is None or position >= min(len(x_shape), len(mid_shape))
                    or not prove_eq(x_shape[position], mid_shape[position])):
                return False
    out = _tensor_type(node.outputs[0])
    if (out is None or not _same_shape(out.shape, _shape(original)) or _dtype(original) != out.dtype
            or not forward_to(node, rw, original)):
        rw.set_input(node, 0, original)
    return True


# -- Transpose ------------------------------------------------------------------------


def _perm(node: Node) -> Optional[list[int]]:
    """The node's permutation, or None when it is not known (no perm and unknown rank)."""
    perm = node.attrs.get("perm")
    if perm is None:
        shape = _shape(node.inputs[0])
        return None if shape is None else list(range(len(shape)))[::-1]
    perm = _normalize(list(perm), len(perm))
    if perm is None or sorted(perm) != list(range(len(perm))):
        return None
    return perm


@rewrite("Transpose")
def transpose(node: Node, rw: Rewriter) -> bool:
    """An identity Transpose goes; Transpose(Transpose(x, p), q) → Transpose(x, p∘q)."""
    perm = _perm(node)
    if perm is None:
        return False
    if perm == sorted(perm):
        return forward(node, rw)
    inner = _producer(node.inputs[0], "Transpose")
    if inner is None:
        return False
    inner_perm = _perm(inner)
    if inner_perm is None or len(inner_perm) != len(perm):
        return False
    # Output axis i is the intermediate's axis perm[i], which is x's axis inner_perm[perm[i]].
    composed = [inner_perm[p] for p in perm]
    if composed == sorted(composed):
        return forward_to(node, rw, inner.inputs[0])
    _replace(node, rw, "Transpose", [inner.inputs[0]], {"perm": composed})
    return True


# -- Squeeze / Unsqueeze pairs ------------------------------------------------------------


def _axes(node: Node) -> tuple[Optional[list], bool]:
    """(axes, known) of a Squeeze/Unsqueeze: from the attribute before opset 13, then
    input 1.  axes None with known True means no axes were given."""
    if _opset(node) < 13:
        axes = node.attrs.get("axes")
        return (None if axes is None else list(axes)), True
    if not _has_input(node, 1):
        return None, True
    dims = _input_dims(node, 1)
    if dims is None or any(isinstance(d, Expr) for d in dims):
        return None, False
    return [int(d) for d in dims], True


def _ones(shape: Optional[tuple]) -> Optional[list[int]]:
    """The positions a Squeeze without axes removes, when the shape tells them for sure."""
    if shape is None or any(isinstance(d, Expr) and d.lo <= 1 <= d.hi for d in shape):
        return None
    return [i for i, d in enumerate(shape) if not isinstance(d, Expr) and int(d) == 1]


@rewrite("Squeeze")
def squeeze_of_unsqueeze(node: Node, rw: Rewriter) -> bool:
    """Squeeze(Unsqueeze(x, a), a) → x: it removes exactly the axes the Unsqueeze added."""
    inner = _producer(node.inputs[0], "Unsqueeze")
    if inner is None:
        return False
    added, known = _axes(inner)
    removed, removed_known = _axes(node)
    if not known or added is None or not removed_known:
        return False
    # Both lists of axes count in the intermediate's rank.
    x_shape, mid_shape = _shape(inner.inputs[0]), _shape(node.inputs[0])
    if mid_shape is not None:
        rank = len(mid_shape)
    elif x_shape is not None:
        rank = len(x_shape) + len(added)
    else:
        return False
    added = _normalize(added, rank)
    removed = _ones(mid_shape) if removed is None else _normalize(removed, rank)
    if added is None or removed is None or set(added) != set(removed) or len(removed) != len(set(removed)):
        return False
    return forward_to(node, rw, inner.inputs[0])


@rewrite("Unsqueeze")
def unsqueeze_of_squeeze(node: Node, rw: Rewriter) -> bool:
    """Unsqueeze(Squeeze(x, a), a) → x: the axes put back are the ones taken out (all of size 1)."""
    inner = _producer(node.inputs[0], "Squeeze")
    if inner is None:
        return False
    x_shape = _shape(inner.inputs[0])
    removed, removed_known = _axes(inner)
    added, known = _axes(node)
    if x_shape is None or not removed_known or not known or added is None:
        return False
    rank = len(x_shape)
    removed = _ones(x_shape) if removed is None else _normalize(removed, rank)
    if removed is None or len(set(removed)) != len(removed) or len(added) != len(removed):
        return False
    added = _normalize(added, rank)
    if added is None or set(added) != set(removed):
        return False
    return forward_to(node, rw, inner.inputs[0])


# -- Range over a cast integer ------------------------------------------------------------


def _integral_scalar(value: Optional[Value], limit: int) -> Optional[int]:
    """A constant scalar's value when it is a whole number of magnitude below ``limit``."""
    if value is None or value.const is None or np.asarray(value.const).size != 1:
        return None
    number = whole_number(float(np.asarray(value.const).reshape(-1)[0]))
    return number if number is not None and abs(number) < limit else None


@rewrite("Range")
def range_of_cast_integer(node: Node, rw: Rewriter) -> bool:
    """Range(a, Cast<float>(n), d), a and d whole-number constants and n an integer scalar
    of known (tracked) value → the same Range with n's dims as its limit parameter.

    Exporters write ``torch.arange(w).float()``-style anchors so (yolov8n's detection head:
    Range(0.0, Cast(Gather(Shape(x), 3)), 1.0)). The float limit carries no dims, so the
    Range's length was a fresh symbol bound at run time, which ended a native segment.
    As a parameter (of the float type: it materializes as the Cast did), the limit is a dim
    of n, and the type rule gives the length as one (ops/constant_ops.py): exact while every
    value is a whole number the float type holds, which the symbols' ranges prove or a
    run-time check ahead of the Range's kernel enforces (codegen/lower/contracts.py)."""
    out = _dtype(node.outputs[0])
    limit = EXACT_INTEGERS.get(out)
    if limit is None or len(node.inputs) < 3 or node.params:
        return False
    start, delta = _integral_scalar(node.inputs[0], limit), _integral_scalar(node.inputs[2], limit)
    cast = _producer(node.inputs[1], "Cast")
    if start is None or not delta or cast is None or cast.attrs.get("to") is None or int(cast.attrs["to"]) != out:
        return False
    dims = _input_dims(cast, 0)
    if _dtype(cast.inputs[0]) not in (INT32, INT64) or _shape(cast.inputs[0]) != () or dims is None \
            or len(dims) != 1:
        return False
    node.params[1] = StaticParam((dims[0],), (), out)
    rw.set_input(node, 1, None)
    return True
