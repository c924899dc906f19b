"""Products by one shared constant weight batched into one: a simplify rule (issue #32).

An LSTM unrolled by the TorchScript exporter multiplies every step's input by the same
input weight, ``Gemm(x_t, W_ih, transB=1)``, one row (the batch) at a time: each step
streams the whole weight from memory for a few rows, though no step's input depends on
the recurrence. This rule turns the MatMul/Gemm nodes that read one constant weight and
independent inputs into

    Concat(x_1, ..., x_n) -> one MatMul/Gemm -> Split

so the weight is read (and, by the native backend, packed) once for all the rows. A
product whose input depends on another one's output (the recurrent ``Gemm(h, W_hh)``:
h of step t comes from the product of step t - 1) stays where it is.

Why a simplify rule and not a lowering: the lowering sees one node at a time, while this
needs the weight's readers and their order; the worklist engine gives both, with def-use
lists, and the native backend, the tuner and ``shapeshift simplify`` then see an ordinary
graph (the merged product lowers, packs and tunes as any other). It runs under
``SimplifyOptions.shared_weights``, which the native backend sets (runtime/native.py).

When the rule applies (each checked, else the node is left alone):

- the nodes are MatMul (inputs of equal rank >= 2, equal middle dims) or Gemm (the same
  alpha, beta, transA, transB, and the same C broadcast over rows, or none) in one graph,
  reading the same constant 2-D weight as B, with the same dtype;
- an input depends on no product of the group: found by walking back from it over the
  nodes placed after the group's first product (a node placed before cannot read a
  product), a walk of at most ``_WALK_LIMIT`` nodes, a longer one or one through a node
  with subgraphs counting as dependent;
- the stacked rows split back: the row counts are all known, or provably all equal;
- the merged product goes just before the first reader of any product's output; an
  input computed after that point has the nodes it needs from there on (at most
  ``_HOIST_LIMIT``, none with subgraphs) moved before it, in order: a step's
  ``Gather(x, t)`` placed next to its product in the exported model is the usual case.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...ir.graph import Node, Value
from ...symbolic import prove_eq
from ..infer_types import infer_node
from .rewriter import Rewriter
from .rules import _opset, rewrite

#: Nodes walked back from one input to decide that it depends on no product of the group.
_WALK_LIMIT = 64
#: Nodes moved before the merged product for one input at most.
_HOIST_LIMIT = 16


def _shape(value: Optional[Value]) -> Optional[tuple]:
    t = getattr(value, "type", None)
    return getattr(t, "shape", None)


def _gemm_key(node: Node) -> Optional[tuple]:
    """What Gemms must share to stack their rows: attributes and a row-broadcast C."""
    attrs = (float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0)),
             int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0)))
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None:
        c_shape = _shape(c)
        # A C with a row per output row would have to be stacked too: not done.
        if c_shape is None or len(c_shape) > 2 or (len(c_shape) == 2 and c_shape[0] != 1):
            return None
    return ("Gemm", attrs, id(c) if c is not None else None)


def _candidate(node: Node, rw: Rewriter) -> Optional[tuple]:
    """(key, rows axis of A) when ``node`` is a product this rule can stack, else None."""
    if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    a, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    w_shape, a_shape = _shape(w), _shape(a)
    if a is None or w is None or not w.is_initializer or w_shape is None or len(w_shape) != 2 or a_shape is None:
        return None
    if not rw.is_used(out) or any(user.graph is not node.graph for user, _ in out.users):
        return None
    dtype = getattr(a.type, "dtype", None)
    if node.op_type == "MatMul":
        if len(a_shape) < 2:
            return None
        return ("MatMul", len(a_shape), dtype), 0
    key = _gemm_key(node)
    if key is None or len(a_shape) != 2:
        return None
    return (*key, dtype), key[1][2]


def _depends(value: Value, members: set[int], after: float, rw: Rewriter) -> bool:
    """Whether ``value`` may depend on an output of a node in ``members`` (ids): a walk back
    over producers placed after ``after``; True when the walk is too long to tell."""
    stack, seen = [value], set()
    while stack:
        producer = stack.pop().producer
        if producer is None or id(producer) in seen or rw.order(producer) < after:
            continue
        if id(producer) in members or producer.has_subgraphs() or len(seen) >= _WALK_LIMIT:
            return True
        seen.add(id(producer))
        stack.extend(v for v in producer.inputs if v is not None)
    return False


def _to_hoist(value: Value, anchor: float, graph, rw: Rewriter) -> Optional[list[Node]]:
    """The nodes at or after position ``anchor`` that ``value`` needs, or None when they are
    too many or one cannot move (subgraphs, another graph)."""
    stack, found = [value], {}
    while stack:
        producer = stack.pop().producer
        if producer is None or id(producer) in found or rw.order(producer) < anchor:
            continue
        if producer.graph is not graph or producer.has_subgraphs() or len(found) >= _HOIST_LIMIT:
            return None
        found[id(producer)] = producer
        stack.extend(v for v in producer.inputs if v is not None)
    return sorted(found.values(), key=rw.order)


def _move_before(node: Node, anchor: Optional[Node], rw: Rewriter) -> None:
    """Recreate ``node`` just before ``anchor`` (every input it reads is defined there) and
    let its outputs' readers read the copy."""
    copy = rw.add_node(node.graph, node.op_type, list(node.inputs), len(node.outputs), dict(node.attrs),
                       before=anchor, name=node.name)
    copy.attr_types = dict(node.attr_types)
    for old, new in zip(node.outputs, copy.outputs):
        new.type, new.shape_contents = old.type, old.shape_contents
        rw.replace_value(old, new)
    rw.remove_node(node)


def _first_reader(group: list[Node], rw: Rewriter) -> Optional[Node]:
    readers = [user for node in group for user, _ in node.outputs[0].users]
    return min(readers, key=rw.order) if readers else None


def _rows_split(rows: list) -> Optional[list]:
    """Split sizes for the stacked rows: the counts when all are known, [] when all are
    provably equal (an even split), None otherwise."""
    if all(isinstance(r, int) for r in rows):
        return rows
    if all(prove_eq(r, rows[0]) for r in rows):
        return []
    return None


@rewrite("MatMul", "Gemm", options=("shared_weights",))
def batch_shared_weight(node: Node, rw: Rewriter) -> bool:
    """MatMul/Gemm(x_i, W) for independent x_i -> Split(MatMul/Gemm(Concat(x_i), W))."""
    mine = _candidate(node, rw)
    if mine is None:
        return False
    key, axis = mine
    weight, graph = node.inputs[1], node.graph
    middle = _shape(node.inputs[0])[1:-1]  # MatMul: the dims between rows and K must agree
    candidates: list[Node] = []
    for user, index in weight.users:
        if index == 1 and user.graph is graph and user not in candidates and _candidate(user, rw) == mine:
            if key[0] == "MatMul" and not all(prove_eq(x, y) for x, y in zip(_shape(user.inputs[0])[1:-1], middle)):
                continue
            candidates.append(user)
    if len(candidates) < 2:
        return False
    candidates.sort(key=rw.order)
    ids = {id(c) for c in candidates}
    first = rw.order(candidates[0])
    group = [c for c in candidates if not _depends(c.inputs[0], ids, first, rw)]
    # Inputs computed after the merged product's place need their nodes moved before it;
    # a member whose nodes cannot move leaves the group (the place can then only move later).
    while len(group) >= 2:
        anchor = _first_reader(group, rw)
        where = rw.order(anchor) if anchor is not None else float("inf")
        hoists = [_to_hoist(c.inputs[0], where, graph, rw) for c in group]
        if all(h is not None for h in hoists):
            break
        group = [c for c, h in zip(group, hoists) if h is not None]
    if len(group) < 2:
        return False
    split = _rows_split([_shape(c.inputs[0])[axis] for c in group])
    if split is None:
        return False
    moved: dict[int, Node] = {}
    for nodes in hoists:
        for n in nodes:
            moved.setdefault(id(n), n)
    for n in sorted(moved.values(), key=rw.order):
        _move_before(n, anchor, rw)
    _merge(group, axis, split, anchor, rw)
    return True


def _merge(group: list[Node], axis: int, split: list, anchor: Optional[Node], rw: Rewriter) -> None:
    first, graph = group[0], group[0].graph
    concat = rw.add_node(graph, "Concat", [c.inputs[0] for c in group], 1, {"axis": axis}, before=anchor,
                         name=f"{first.name}_rows")
    infer_node(concat, retype_bodies=False)
    product = rw.add_node(graph, first.op_type, [concat.outputs[0], *first.inputs[1:]], 1, dict(first.attrs),
                          before=anchor, name=first.name)
    product.attr_types = dict(first.attr_types)
    infer_node(product, retype_bodies=False)
    count, attrs, inputs = len(group), {"axis": 0}, [product.outputs[0]]
    if split and _opset(first) >= 13:
        inputs.append(rw.constant(graph, np.array(split, np.int64), "split"))
    elif split:
        attrs["split"] = split
    elif _opset(first) >= 18:
        attrs["num_outputs"] = count
    parts = rw.add_node(graph, "Split", inputs, count, attrs, before=anchor, name=f"{first.name}_split")
    infer_node(parts, retype_bodies=False)
    for member, part in zip(group, parts.outputs):
        part.type = member.outputs[0].type  # the same tensor: keep the type its readers were inferred with
        rw.replace_value(member.outputs[0], part)
        rw.remove_node(member)
