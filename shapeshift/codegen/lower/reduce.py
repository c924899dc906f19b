"""Reductions, Softmax and ArgMax/ArgMin over an [outer, n, inner] view of the input.

Every reduction here reduces one contiguous run of axes, so the input is three extents:
the axes before, the reduced ones, the axes after (kernels/reduce.py). Reductions over
axes that are not adjacent are left to the fallback.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...ir.graph import Node
from ...ir.types import FLOAT
from ...ops.common import product
from ...symbolic import Dim
from . import lowers
from .context import LowerContext, Lowered, Unsupported
from .layout import param_values

REDUCE_KINDS = {
    "ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4,
    "ReduceSumSquare": 5, "ReduceL1": 6, "ReduceL2": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9,
}
# The opset from which each reduction takes its axes as an input instead of an attribute.
AXES_INPUT_SINCE = {"ReduceSum": 13}
AXES_INPUT_DEFAULT = 18


def three_extents(ctx: LowerContext, shape: Sequence[Dim], axes: Sequence[int]) -> tuple[str, str, str]:
    """C expressions for (outer, n, inner) when ``axes`` are adjacent."""
    axes = sorted(axes)
    if axes and axes != list(range(axes[0], axes[-1] + 1)):
        raise Unsupported("reduction over axes that are not adjacent")
    first, last = (axes[0], axes[-1] + 1) if axes else (len(shape), len(shape))
    return (ctx.dim(product(list(shape[:first]))), ctx.dim(product(list(shape[first:last]))),
            ctx.dim(product(list(shape[last:]))))


def _float_only(ctx: LowerContext, node: Node) -> None:
    if ctx.dtype(node.inputs[0]) != FLOAT:
        raise Unsupported(f"{node.op_type} on a dtype other than float32")


def _normalize(axes, rank: int) -> list[int]:
    return sorted({int(a) + rank if int(a) < 0 else int(a) for a in axes})


# Reductions of integer tensors (shape arithmetic, detection post-processing): a plain
# loop, since they are small; (identity, C combining expression over acc and v).
INTEGER_REDUCTIONS = {
    "ReduceSum": ("0", "acc + v"), "ReduceProd": ("1", "acc * v"),
    "ReduceMax": ("MINVAL", "v > acc ? v : acc"), "ReduceMin": ("MAXVAL", "v < acc ? v : acc"),
}
INTEGER_LIMITS = {"int64_t": ("INT64_MIN", "INT64_MAX"), "int32_t": ("INT32_MIN", "INT32_MAX")}


def _integer_reduce(node: Node, ctx: LowerContext, outer: str, n: str, inner: str) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    ctype = ctx.ctype(x)
    if node.op_type not in INTEGER_REDUCTIONS or ctype not in INTEGER_LIMITS:
        raise Unsupported(f"{node.op_type} on {ctype}")
    identity, combine = INTEGER_REDUCTIONS[node.op_type]
    lo, hi = INTEGER_LIMITS[ctype]
    identity = identity.replace("MINVAL", lo).replace("MAXVAL", hi)
    code = f"""const {ctype}* x = {ctx.ptr(x)};
{ctype}* y = {ctx.ptr(y)};
const int64_t O = {outer}, N = {n}, I = {inner};
for (int64_t o = 0; o < O; o++)
    for (int64_t i = 0; i < I; i++) {{
        {ctype} acc = {identity};
        for (int64_t k = 0; k < N; k++) {{ const {ctype} v = x[(o * N + k) * I + i]; acc = {combine}; }}
        y[o * I + i] = acc;
    }}"""
    return Lowered(code)


@lowers(*REDUCE_KINDS)
def lower_reduce(node: Node, ctx: LowerContext, opset: int) -> Optional[Lowered]:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if opset >= AXES_INPUT_SINCE.get(node.op_type, AXES_INPUT_DEFAULT):
        axes = param_values(node, 1, ctx)
    else:
        axes = node.attrs.get("axes")
    if axes is None or len(axes) == 0:
        if node.attrs.get("noop_with_empty_axes", 0):
            raise Unsupported("noop_with_empty_axes")
        axes = list(range(len(shape)))
    if not all(isinstance(a, int) for a in axes):
        raise Unsupported("axes computed at run time")
    outer, n, inner = three_extents(ctx, shape, _normalize(axes, len(shape)))
    if ctx.dtype(x) != FLOAT:
        return _integer_reduce(node, ctx, outer, n, inner)
    code = f"ss_reduce({REDUCE_KINDS[node.op_type]}, {ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner});"
    return Lowered(code, fragments=("reduce",))


@lowers("Softmax", "LogSoftmax")
def lower_softmax(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    if rank == 0:
        raise Unsupported("softmax of a scalar")
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    # Before opset 13 the input is flattened to 2-D at ``axis``: everything after is one axis.
    axes = [axis] if opset >= 13 else list(range(axis, rank))
    outer, n, inner = three_extents(ctx, shape, axes)
    log = 1 if node.op_type == "LogSoftmax" else 0
    return Lowered(f"ss_softmax({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner}, {log});", fragments=("reduce",))


@lowers("ArgMax", "ArgMin")
def lower_argmax(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    axis = int(node.attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    outer, n, inner = three_extents(ctx, shape, [axis])
    fn = "ss_argmax" if node.op_type == "ArgMax" else "ss_argmin"
    last = int(node.attrs.get("select_last_index", 0))
    return Lowered(f"{fn}({ctx.ptr(x)}, {ctx.ptr(y, 'int64_t')}, {outer}, {n}, {inner}, {last});",
                   fragments=("reduce",))


@lowers("GlobalAveragePool", "GlobalMaxPool")
def lower_global_pool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) < 3:
        raise Unsupported("global pool of rank < 3")
    outer, n, inner = three_extents(ctx, shape, list(range(2, len(shape))))
    kind = 1 if node.op_type == "GlobalAveragePool" else 2
    return Lowered(f"ss_reduce({kind}, {ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner});", fragments=("reduce",))
