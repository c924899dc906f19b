"""Attention as exporters write it, fused into one ``ss_attention`` call (kernels/attention.py).

The chain, from the first MatMul::

    S = MatMul(Q, K)               Q [..., M, D], K [..., D, N] (often a Transpose, read
                                   through strides)
    S = S * c  or  S / c           any number of scalar float constants, before the mask
    S = S + mask                   optional; mask broadcasts to S without growing it
    P = Softmax(S, axis=-1)
    P = Where(IsNaN(P), 0, P)      optional: PyTorch's guard for fully masked rows
    O = MatMul(P, V)               V [..., N, E]

Every value but O must be read only by the next node of the chain (and not be a graph
output). O may be written straight into a Transpose that reads it, as a plain MatMul's
product is. Anything else declines, and the nodes lower one by one as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import FLOAT
from ...symbolic import Dim, prove_eq
from .context import LowerContext, Lowered, Unsupported, float_literal
from .layout import contiguous_strides
from .matmul_views import (MAX_BATCH_DIMS, View, as_matrix, batch_strides, broadcast_batch, broadcast_strides,
                           merge_batch, operand_view, output_view)

ONNX_DOMAINS = ("", "ai.onnx")
#: Scale and mask nodes looked through between the first MatMul and the Softmax.
MAX_BETWEEN = 4


@dataclass
class _Chain:
    """What the pattern found after the first MatMul."""

    alpha: float = 1.0
    mask: Optional[Value] = None
    nan_to_zero: bool = False
    second: Optional[Node] = None  # the MatMul by V
    absorbed: list[Node] = field(default_factory=list)


def _is_onnx(node: Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ONNX_DOMAINS


def _scalar(ctx: LowerContext, value: Optional[Value]) -> Optional[float]:
    const = ctx.const(value)
    if const is None or const.dtype != np.float32 or const.size != 1:
        return None
    return float(const.reshape(-1)[0])


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def chain_nodes(first: Node, escapes: Callable[[Value], bool]) -> Optional[list[Node]]:
    """The nodes after MatMul ``first`` through the second MatMul, by op types and readers
    alone (``escapes``: whether a value is read after the graph), or None. What the
    lowering then also checks — constants, shapes, dtypes, the Softmax axis — is not
    looked at, so that the builder can order nodes with it before lowering any."""

    def only_reader(value: Value) -> Optional[Node]:
        return value.users[0][0] if len(value.users) == 1 and not escapes(value) else None

    nodes: list[Node] = []
    value = first.outputs[0]
    while True:
        user = only_reader(value)
        if user is None:
            return None
        nodes.append(user)
        if _is_onnx(user, "Softmax"):
            break
        if not (_is_onnx(user, "Mul") or _is_onnx(user, "Add") or (_is_onnx(user, "Div") and user.inputs[0] is value)) \
                or len(user.inputs) != 2 or len(nodes) > MAX_BETWEEN:
            return None
        value = user.outputs[0]
    probs = value = nodes[-1].outputs[0]
    readers = {u.op_type: u for u, _ in probs.users}
    if len(probs.users) == 2 and not escapes(probs) and set(readers) == {"IsNaN", "Where"}:
        isnan, where = readers["IsNaN"], readers["Where"]
        flag = isnan.outputs[0]
        if not (_is_onnx(isnan, "IsNaN") and _is_onnx(where, "Where") and only_reader(flag) is where
                and len(where.inputs) == 3 and where.inputs[0] is flag and where.inputs[2] is probs
                and where.inputs[1] is not probs):
            return None
        nodes += [isnan, where]
        value = where.outputs[0]
    second = only_reader(value)
    if second is None or not _is_onnx(second, "MatMul") or second.inputs[0] is not value or second.inputs[1] is value:
        return None
    return nodes + [second]


def fusion_order(nodes: Sequence[Node], escapes: Callable[[Value], bool]) -> list[Node]:
    """``nodes`` (in a topological order) with each attention chain's nodes but the last
    moved to just before its second MatMul: still a topological order, since only the
    chain reads what they make, and now whatever the chain reads besides — a mask or V
    computed after Q K^T, as the TorchScript exporter orders BERT — exists when its first
    MatMul, where the fused step runs, comes."""
    moved: dict[int, list[Node]] = {}
    skipped: set[int] = set()
    for node in nodes:
        if not _is_onnx(node, "MatMul") or id(node) in moved or id(node) in skipped:
            continue
        chain = chain_nodes(node, escapes)
        if chain is not None and id(chain[-1]) not in skipped:
            moved[id(chain[-1])] = [node, *chain[:-1]]
            skipped.update(id(n) for n in moved[id(chain[-1])])
    if not moved:
        return list(nodes)
    order: list[Node] = []
    for node in nodes:
        if id(node) not in skipped:
            order.extend(moved.get(id(node), ()))
            order.append(node)
    return order


def _match(first: Node, ctx: LowerContext, opset: int) -> Optional[_Chain]:
    nodes = chain_nodes(first, ctx.escapes)
    if nodes is None:
        return None
    chain = _Chain(second=nodes[-1], absorbed=nodes)
    value = first.outputs[0]
    shape = ctx.shape(value)
    for node in nodes[:-1]:
        other = next((v for v in node.inputs if v is not value), None)
        if node.op_type in ("Mul", "Div"):
            c = _scalar(ctx, other)
            if c is None or c == 0.0 or chain.mask is not None or not _same_shape(ctx.shape(node.outputs[0]), shape):
                return None  # (a scale after the mask would scale the mask too)
            chain.alpha *= c if node.op_type == "Mul" else 1.0 / c
        elif node.op_type == "Add":
            if chain.mask is not None or other is None or ctx.dtype(other) != FLOAT \
                    or len(ctx.shape(other)) > len(shape) or not _same_shape(ctx.shape(node.outputs[0]), shape):
                return None
            chain.mask = other
        elif node.op_type == "Softmax":
            # Before opset 13 Softmax flattens at ``axis`` (default 1): only the last axis
            # means rows either way.
            axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1))
            if axis + (len(shape) if axis < 0 else 0) != len(shape) - 1:
                return None
        elif node.op_type == "Where":
            if _scalar(ctx, node.inputs[1]) != 0.0 or not _same_shape(ctx.shape(node.outputs[0]), shape):
                return None
            chain.nan_to_zero = True
        value = node.outputs[0]
    if ctx.dtype(chain.second.inputs[1]) != FLOAT:
        return None
    return chain


def fused_attention(first: Node, ctx: LowerContext, opset: int) -> Optional[Lowered]:
    """The attention starting at MatMul ``first`` as one kernel call, or None."""
    try:
        plan = _plan(first, ctx, opset)
    except Unsupported:
        return None  # before any storage or extent was asked for: nothing to undo
    return None if plan is None else _emit(plan, ctx)


@dataclass
class _Plan:
    chain: _Chain
    q: View
    k: View
    v: View
    out: Value
    moved: tuple
    sizes: list  # M, N, D, E
    batch: list
    strides: dict  # operand -> [batch strides..., row, column]


def _scaled_operand(value: Value, ctx: LowerContext) -> tuple[View, float]:
    """How the fused kernel reads Q or K, and a factor for alpha. PyTorch's exporter scales
    both by sqrt(scale) before the product, the keys after transposing them: a Mul by a
    constant scalar that only the product reads becomes part of alpha and the Transpose
    under it strides, so the cached keys are not copied twice per layer to be read once."""
    producer = value.producer
    if producer is not None and _is_onnx(producer, "Mul") and len(producer.inputs) == 2 and ctx.cancellable(producer):
        for k in (0, 1):
            c = _scalar(ctx, producer.inputs[1 - k])
            x = producer.inputs[k]
            if c is not None and x is not None and ctx.dtype(x) == FLOAT \
                    and _same_shape(ctx.shape(x), ctx.shape(value)):
                view = operand_view(x, ctx)
                return View(view.source, view.shape, view.strides, (producer, *view.cancels)), c
    return operand_view(value, ctx), 1.0


def _plan(first: Node, ctx: LowerContext, opset: int) -> Optional[_Plan]:
    if ctx.dtype(first.inputs[0]) != FLOAT or ctx.dtype(first.inputs[1]) != FLOAT:
        return None
    if len(ctx.shape(first.inputs[0])) < 2 or len(ctx.shape(first.inputs[1])) < 2:
        return None
    chain = _match(first, ctx, opset)
    if chain is None:
        return None
    second = chain.second
    vq, q_scale = _scaled_operand(first.inputs[0], ctx)
    vk, k_scale = _scaled_operand(first.inputs[1], ctx)
    vq, vk = as_matrix(vq, True), as_matrix(vk, False)
    chain.alpha *= q_scale * k_scale
    vv = as_matrix(operand_view(second.inputs[1], ctx), False)
    m, d, n, e = vq.shape[-2], vq.shape[-1], vk.shape[-1], vv.shape[-1]
    if not prove_eq(vv.shape[-2], n):
        return None
    batch_shape = broadcast_batch(vq.shape[:-2], vk.shape[:-2])
    out_shape = (*batch_shape, m, e)
    if not _same_shape(ctx.shape(second.outputs[0]), out_shape):
        return None  # V would widen the batch: the plain lowering handles that
    if not all(ctx.defined_before(v) for v in (vq.source, vk.source, vv.source, chain.mask)):
        return None  # the step runs at the first MatMul (fusion_order makes this rare)
    out, o_strides, moved = output_view(second, out_shape, ctx)
    scores = (*batch_shape, m, n)
    mask_strides = [0] * len(scores)
    if chain.mask is not None:
        mask_shape = ctx.shape(chain.mask)
        mask_strides = broadcast_strides(mask_shape, contiguous_strides(mask_shape), scores)
    batch, q_b, k_b, v_b, m_b, o_b = merge_batch(
        list(batch_shape), batch_strides(vq, batch_shape), batch_strides(vk, batch_shape),
        batch_strides(vv, batch_shape), mask_strides[:-2], o_strides[:-2])
    strides = {"q": q_b + list(vq.strides[-2:]), "k": k_b + list(vk.strides[-2:]), "v": v_b + list(vv.strides[-2:]),
               "mask": m_b + list(mask_strides[-2:]), "out": o_b + [o_strides[-2]]}
    return _Plan(chain, vq, vk, vv, out, moved, [m, n, d, e], batch, strides)


def _emit(plan: _Plan, ctx: LowerContext) -> Lowered:
    pad = MAX_BATCH_DIMS - len(plan.batch)
    dims = lambda xs: ", ".join(ctx.dim(x) for x in xs)  # noqa: E731

    def strided(value: Value, key: str) -> str:
        return f"{ctx.ptr(value)}, {dims([0] * pad + plan.strides[key])}"

    chain = plan.chain
    mask = strided(chain.mask, "mask") if chain.mask is not None else "NULL, 0, 0, 0, 0"
    code = (f"if (ss_attention({dims([1] * pad + plan.batch)}, {dims(plan.sizes)},\n"
            f"    {strided(plan.q.source, 'q')},\n    {strided(plan.k.source, 'k')},\n"
            f"    {strided(plan.v.source, 'v')},\n"
            f"    {mask}, {float_literal(chain.alpha)}, {int(chain.nan_to_zero)},\n"
            f"    {strided(plan.out, 'out')}) != 0) return STEP_ERROR;")
    views = (plan.q, plan.k, plan.v)
    return Lowered(code, fragments=("attention",), absorbed=tuple(chain.absorbed) + plan.moved, can_fail=True,
                   cancels=tuple(c for view in views for c in view.cancels),
                   reads=tuple(view.source for view in views if view.cancels))
