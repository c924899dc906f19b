"""Lp-norm ops: LpPool, GlobalLpPool and LpNormalization.

LpPool and GlobalLpPool are one call of ``ss_lppool3d`` (kernels/lppool.py), 1-D and 2-D
pools seen as 3-D ones with leading extents of 1, the global pool as one window covering the
whole input. LpNormalization is one call of ``ss_lp_normalize`` (kernels/lpnorm.py) over the
[outer, n, inner] view of its axis.
"""

from __future__ import annotations

import math

from ...ir.graph import Node
from ...ir.types import FLOAT
from ...ops.common import product
from . import lowers
from .context import LowerContext, Lowered, Unsupported, attr_axis, float_literal
from .nn import begin_pads
from .pooling import as_3d, per_axis, spatial_rank


def _float_only(ctx: LowerContext, node: Node) -> None:
    if ctx.dtype(node.inputs[0]) != FLOAT:
        raise Unsupported(f"{node.op_type} on a dtype other than float32")


def _exponent(node: Node) -> str:
    """The attribute p as a C float (LpPool-1 had a float p, later versions an int)."""
    p = float(node.attrs.get("p", 2))
    if not (math.isfinite(p) and p > 0):
        raise Unsupported(f"{node.op_type} with p = {p}")
    return float_literal(p)


def _lppool_call(ctx: LowerContext, node: Node, nc: str, in_dims: list[str], out_dims: list[str],
                 kernel: list[str], strides: list, pads: list[str], dilations: list, p: str) -> str:
    args = [nc, *as_3d(in_dims, "1"), *as_3d(out_dims, "1"), *as_3d(kernel, "1"),
            *(str(int(s)) for s in as_3d(strides, 1)), *as_3d(pads, "0"),
            *(str(int(d)) for d in as_3d(dilations, 1))]
    return f"ss_lppool3d({ctx.ptr(node.inputs[0])}, {ctx.ptr(node.outputs[0])}, {', '.join(args)}, {p});"


@lowers("LpPool")
def lower_lp_pool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    spatial = spatial_rank(node, ctx)
    if node.attrs.get("kernel_shape") is None:
        raise Unsupported("LpPool without kernel_shape")
    kernel = per_axis(node, "kernel_shape", 1, spatial)
    strides = per_axis(node, "strides", 1, spatial)
    dilations = per_axis(node, "dilations", 1, spatial)
    pads = begin_pads(node, ctx, in_shape[2:], out_shape[2:], kernel, strides, dilations, spatial)
    # ceil_mode needs nothing here: it only lengthens the output, whose extents the call takes.
    code = _lppool_call(ctx, node, ctx.numel(in_shape[:2]), [ctx.dim(d) for d in in_shape[2:]],
                        [ctx.dim(d) for d in out_shape[2:]], [str(k) for k in kernel], strides, pads, dilations,
                        _exponent(node))
    return Lowered(code, fragments=("lppool",))


@lowers("GlobalLpPool")
def lower_global_lp_pool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    in_shape = ctx.shape(node.inputs[0])
    spatial = spatial_rank(node, ctx)
    dims = [ctx.dim(d) for d in in_shape[2:]]
    code = _lppool_call(ctx, node, ctx.numel(in_shape[:2]), dims, ["1"] * spatial, dims, [1] * spatial,
                        ["0"] * spatial, [1] * spatial, _exponent(node))
    return Lowered(code, fragments=("lppool",))


@lowers("LpNormalization")
def lower_lp_normalization(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _float_only(ctx, node)
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not shape:
        raise Unsupported("LpNormalization of a scalar")
    axis = attr_axis(node, len(shape), default=-1)
    p = int(node.attrs.get("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"LpNormalization with p = {p}")
    outer, n, inner = (ctx.dim(product(list(part))) for part in (shape[:axis], shape[axis:axis + 1], shape[axis + 1:]))
    return Lowered(f"ss_lp_normalize({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {n}, {inner}, {p});", fragments=("lpnorm",))
