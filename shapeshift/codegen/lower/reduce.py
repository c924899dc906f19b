"""Reductions, Softmax and ArgMax/ArgMin over an [outer, n, inner] view of the input.

The kernels reduce one contiguous run of axes, so the input is three extents: the axes
before, the reduced ones, the axes after (kernels/reduce.py). A reduction over axes that
are not adjacent first copies the input into scratch space with the reduced axes moved
next to each other (one strided ``ss_copy``), then reduces that copy.

Float32 reductions call ``ss_reduce``; integer and bool ones are a plain loop, since
they are small (shape arithmetic, detection post-processing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...ir.graph import Node, Value
from ...ir.types import BOOL, FLOAT, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64
from ...ops.common import product
from ...symbolic import Dim
from . import lowers
from .context import LowerContext, Lowered, Unsupported
from .layout import contiguous_strides, copy_call, param_values

REDUCE_KINDS = {
    "ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4,
    "ReduceSumSquare": 5, "ReduceL1": 6, "ReduceL2": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9,
}
# The opset from which each reduction takes its axes as an input instead of an attribute.
AXES_INPUT_SINCE = {"ReduceSum": 13}
AXES_INPUT_DEFAULT = 18
MAX_COPY_RANK = 8  # ss_copy's limit (kernels/layout.py)


def three_extents(ctx: LowerContext, shape: Sequence[Dim], axes: Sequence[int]) -> tuple[str, str, str]:
    """C expressions for (outer, n, inner) when ``axes`` are adjacent."""
    axes = sorted(axes)
    if not _adjacent(axes):
        raise Unsupported("reduction over axes that are not adjacent")
    first, last = (axes[0], axes[-1] + 1) if axes else (len(shape), len(shape))
    return (ctx.dim(product(list(shape[:first]))), ctx.dim(product(list(shape[first:last]))),
            ctx.dim(product(list(shape[last:]))))


def _adjacent(axes: Sequence[int]) -> bool:
    """Whether sorted ``axes`` form one contiguous run (none at all counts)."""
    return not axes or list(axes) == list(range(axes[0], axes[-1] + 1))


def _float_only(ctx: LowerContext, node: Node) -> None:
    if ctx.dtype(node.inputs[0]) != FLOAT:
        raise Unsupported(f"{node.op_type} on a dtype other than float32")


def _normalize(axes, rank: int) -> list[int]:
    return sorted({int(a) + rank if int(a) < 0 else int(a) for a in axes})


# -- the [outer, n, inner] view a reduction reads ------------------------------------------


@dataclass
class _View:
    """What a reduction kernel reads: a pointer and three extents, and the code (and
    scratch space) that prepares it when the input cannot be read in place."""

    source: str  # C pointer expression, typed like the input
    outer: str
    n: str
    inner: str
    gather: str = ""
    work_bytes: Dim = 0


def _reduction_view(ctx: LowerContext, x: Value, axes: Sequence[int]) -> _View:
    shape = ctx.shape(x)
    if _adjacent(axes):
        return _View(ctx.ptr(x), *three_extents(ctx, shape, axes))
    return _gathered_view(ctx, x, shape, axes)


def _gathered_view(ctx: LowerContext, x: Value, shape: Sequence[Dim], axes: Sequence[int]) -> _View:
    """Reduced axes that are not adjacent: copy x into WORK ordered as [kept axes before
    the last reduced one, the reduced axes, the kept axes after it]. The trailing kept axes
    stay innermost and contiguous, so the kernel's column path still reads them in place."""
    if len(shape) > MAX_COPY_RANK:
        raise Unsupported(f"reduction over axes that are not adjacent, rank > {MAX_COPY_RANK}")
    last = axes[-1]
    before = [a for a in range(last) if a not in axes]
    after = list(range(last + 1, len(shape)))
    order = before + list(axes) + after
    gathered = [shape[a] for a in order]
    outer, n, inner = (ctx.dim(product([shape[a] for a in group])) for group in (before, axes, after))
    work_bytes = product([*gathered, ctx.elem_size(x)])
    if isinstance(work_bytes, int) and work_bytes == 0:
        # An extent known to be 0: the kernel reads nothing (and no scratch space exists).
        return _View(ctx.ptr(x), outer, n, inner)
    strides = contiguous_strides(shape)
    gather = copy_call(ctx, ctx.elem_size(x), [ctx.dim(d) for d in gathered], ctx.raw_ptr(x),
                       [ctx.dim(strides[a]) for a in order], "WORK",
                       [ctx.dim(s) for s in contiguous_strides(gathered)])
    return _View(f"((const {ctx.ctype(x)}*)WORK)", outer, n, inner, gather, work_bytes)


# -- integer and bool reductions ------------------------------------------------------------


@dataclass(frozen=True)
class _IntegerReduction:
    """One reduction as a C loop over elements ``v`` of type {T}: the accumulator's C type,
    its identity, how it takes in ``v``, and the result from ``acc`` and the count ``N``."""

    acc: str  # "{T}" for the element type
    identity: str
    combine: str
    result: str = "({T})acc"
    on_bool: bool = False  # ONNX allows bool for ReduceMax/ReduceMin only


# Sums and products accumulate in uint64_t: unsigned arithmetic wraps (signed overflow is
# undefined in C), and its low bits are the wrapped result in every narrower width, as
# NumPy's sum in the input's dtype gives.
_WRAPPING = "uint64_t"
INTEGER_REDUCTIONS = {
    "ReduceSum": _IntegerReduction(_WRAPPING, "0", "acc + (uint64_t)v"),
    "ReduceProd": _IntegerReduction(_WRAPPING, "1", "acc * (uint64_t)v"),
    "ReduceSumSquare": _IntegerReduction(_WRAPPING, "0", "acc + (uint64_t)v * (uint64_t)v"),
    "ReduceL1": _IntegerReduction(_WRAPPING, "0", "acc + (v < 0 ? 0 - (uint64_t)v : (uint64_t)v)"),
    # onnxruntime divides the integer sum by the count in C, rounding toward zero; an
    # empty slice (sum 0) gives 0.
    "ReduceMean": _IntegerReduction(_WRAPPING, "0", "acc + (uint64_t)v", "({T})(({T})acc / (N > 0 ? N : 1))"),
    "ReduceMax": _IntegerReduction("{T}", "LOWEST", "v > acc ? v : acc", on_bool=True),
    "ReduceMin": _IntegerReduction("{T}", "HIGHEST", "v < acc ? v : acc", on_bool=True),
}
# Per dtype, the identities of max (its lowest value) and min (its highest).
INTEGER_LIMITS = {
    INT8: ("INT8_MIN", "INT8_MAX"), UINT8: ("0", "UINT8_MAX"),
    INT16: ("INT16_MIN", "INT16_MAX"), UINT16: ("0", "UINT16_MAX"),
    INT32: ("INT32_MIN", "INT32_MAX"), UINT32: ("0", "UINT32_MAX"),
    INT64: ("INT64_MIN", "INT64_MAX"), UINT64: ("0", "UINT64_MAX"),
    BOOL: ("0", "1"),
}


def _integer_reduction(node: Node, ctx: LowerContext) -> _IntegerReduction:
    dtype = ctx.dtype(node.inputs[0])
    reduction = INTEGER_REDUCTIONS.get(node.op_type)
    if reduction is None or dtype not in INTEGER_LIMITS or (dtype == BOOL and not reduction.on_bool):
        raise Unsupported(f"{node.op_type} on {ctx.ctype(node.inputs[0])}")
    return reduction


def _integer_loop(reduction: _IntegerReduction, ctx: LowerContext, view: _View, x: Value, y: Value) -> str:
    ctype = ctx.ctype(x)
    lowest, highest = INTEGER_LIMITS[ctx.dtype(x)]
    identity = reduction.identity.replace("LOWEST", lowest).replace("HIGHEST", highest)
    acc_type = reduction.acc.replace("{T}", ctype)
    result = reduction.result.replace("{T}", ctype)
    return f"""const {ctype}* x = {view.source};
{ctype}* y = {ctx.ptr(y)};
const int64_t O = {view.outer}, N = {view.n}, I = {view.inner};
for (int64_t o = 0; o < O; o++)
    for (int64_t i = 0; i < I; i++) {{
        {acc_type} acc = {identity};
        for (int64_t k = 0; k < N; k++) {{ const {ctype} v = x[(o * N + k) * I + i]; acc = {reduction.combine}; }}
        y[o * I + i] = {result};
    }}"""


# -- the Reduce* ops -------------------------------------------------------------------------


def _reduced_axes(node: Node, ctx: LowerContext, opset: int, rank: int) -> list[int]:
    """The sorted axes to reduce; [] for the no-op that ``noop_with_empty_axes`` asks for.
    Each element is then a slice of its own, so the elementwise part still applies
    (ReduceSumSquare squares, ReduceLogSum takes the log), as in the reference."""
    from_input = opset >= AXES_INPUT_SINCE.get(node.op_type, AXES_INPUT_DEFAULT)
    axes = param_values(node, 1, ctx) if from_input else node.attrs.get("axes")
    if axes is None or len(axes) == 0:
        if from_input and node.attrs.get("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    if not all(isinstance(a, int) for a in axes):
        raise Unsupported("axes computed at run time")
    return _normalize(axes, rank)


@lowers(*REDUCE_KINDS)
def lower_reduce(node: Node, ctx: LowerContext, opset: int) -> Optional[Lowered]:
    x, y = node.inputs[0], node.outputs[0]
    axes = _reduced_axes(node, ctx, opset, len(ctx.shape(x)))
    on_float = ctx.dtype(x) == FLOAT
    integer = None if on_float else _integer_reduction(node, ctx)  # declines before any code
    view = _reduction_view(ctx, x, axes)
    if integer is None:
        body = (f"ss_reduce({REDUCE_KINDS[node.op_type]}, {view.source}, {ctx.ptr(y)}, "
                f"{view.outer}, {view.n}, {view.inner});")
        fragments: tuple[str, ...] = ("reduce",)
    else:
        body, fragments = _integer_loop(integer, ctx, view, x, y), ()
    if view.gather:
        fragments += ("layout",)
    return Lowered("\n".join(part for part in (view.gather, body) if part), fragments=fragments,
                   work_bytes=view.work_bytes)


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
