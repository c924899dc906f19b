"""Windowed pooling: MaxPool (with or without Indices), AveragePool, and MaxUnpool.

Each is one call of a kernel of kernels/pool.py. The pool kernels take NC and three spatial
axes: a 1-D or 2-D pool is a 3-D one whose leading axes have extent 1. The geometry goes to
them as local int64 arrays: extents from the values' types (shape inference has already
applied ceil_mode and auto_pad to the output extents), kernel, strides and dilations from
the attributes, and the pads from the attributes too, except under auto_pad SAME_*, where
they depend on the (possibly symbolic) input extents and ``ss_pool_same_pads`` works them
out at run time.

GlobalMaxPool and GlobalAveragePool are reductions (lower/reduce.py); LpPool is lower/lp.py.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...ir.graph import Node, Value
from ...ir.types import DOUBLE, FLOAT, INT8, INT64, UINT8
from ...symbolic import Dim, prove_eq
from . import lowers
from .context import LowerContext, Lowered, Unsupported, c_array

MAX_SPATIAL = 3
# Kernel suffix per element type (the ONNX types of each op the kernels cover).
MAX_POOL_TYPES = {FLOAT: "f32", DOUBLE: "f64", INT8: "i8", UINT8: "u8"}
AVERAGE_POOL_TYPES = {FLOAT: "f32", DOUBLE: "f64"}
SAME_PADS = ("SAME_UPPER", "SAME_LOWER")

# The names the geometry arrays get in the generated code (each step is its own block).
GEOMETRY = "pool_in, pool_out, pool_k, pool_s, pool_p"


def _text(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _kernel_suffix(node: Node, ctx: LowerContext, table: dict[int, str]) -> str:
    dtype = ctx.dtype(node.inputs[0])
    if dtype not in table:
        raise Unsupported(f"{node.op_type} on element type {dtype}")
    return table[dtype]


def per_axis(node: Node, name: str, default: int, count: int) -> list[int]:
    """An attribute with ``count`` ints (default ``default`` each); declines another length."""
    values = [int(v) for v in node.attrs.get(name, [default] * count)]
    if len(values) != count:
        raise Unsupported(f"{node.op_type} {name} of {len(values)} values for {count}")
    return values


def as_3d(values: Sequence[str], fill: str) -> list[str]:
    """Per-spatial-axis C expressions padded in front to three axes (a 2-D pool has D = 1)."""
    return [fill] * (MAX_SPATIAL - len(values)) + list(values)


def spatial_rank(node: Node, ctx: LowerContext) -> int:
    spatial = len(ctx.shape(node.inputs[0])) - 2
    if not 1 <= spatial <= MAX_SPATIAL:
        raise Unsupported(f"{node.op_type} with {spatial} spatial axes")
    return spatial


def _spatial_dims(ctx: LowerContext, value: Value) -> list[str]:
    return [ctx.dim(d) for d in ctx.shape(value)[2:]]


def _geometry(node: Node, ctx: LowerContext, x: Value, y: Value) -> list[str]:
    """C declarations of the geometry arrays pool_in, pool_out, pool_k, pool_s, pool_dil,
    pool_p (begin pads) and pool_p_end (end pads)."""
    spatial = spatial_rank(node, ctx)
    if node.attrs.get("kernel_shape") is None:
        raise Unsupported(f"{node.op_type} without kernel_shape")
    kernel = per_axis(node, "kernel_shape", 1, spatial)
    strides = per_axis(node, "strides", 1, spatial)
    dilations = per_axis(node, "dilations", 1, spatial)
    lines = [c_array("pool_in", as_3d(_spatial_dims(ctx, x), "1")),
             c_array("pool_out", as_3d(_spatial_dims(ctx, y), "1")),
             c_array("pool_k", as_3d([str(k) for k in kernel], "1")),
             c_array("pool_s", as_3d([str(s) for s in strides], "1")),
             c_array("pool_dil", as_3d([str(d) for d in dilations], "1"))]
    auto = _text(node, "auto_pad", "NOTSET") or "NOTSET"
    if auto in SAME_PADS:
        upper = int(auto == "SAME_UPPER")
        return lines + ["int64_t pool_p[3], pool_p_end[3];",
                        f"ss_pool_same_pads(pool_in, pool_out, pool_k, pool_s, pool_dil, {upper}, pool_p, pool_p_end);"]
    if auto not in ("NOTSET", "VALID"):
        raise Unsupported(f"auto_pad {auto}")
    pads = per_axis(node, "pads", 0, 2 * spatial) if auto == "NOTSET" else [0] * (2 * spatial)
    if any(p < 0 for p in pads):
        raise Unsupported(f"{node.op_type} with negative pads")
    return lines + [c_array("pool_p", as_3d([str(p) for p in pads[:spatial]], "0")),
                    c_array("pool_p_end", as_3d([str(p) for p in pads[spatial:]], "0"))]


def _wanted_output(ctx: LowerContext, node: Node, index: int) -> Optional[Value]:
    """The node's output ``index`` if something reads it, else None (the kernel skips it)."""
    if index < len(node.outputs) and node.outputs[index] is not None and not ctx.unused(node.outputs[index]):
        return node.outputs[index]
    return None


@lowers("MaxPool")
def lower_max_pool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    sfx = _kernel_suffix(node, ctx, MAX_POOL_TYPES)
    x, y = node.inputs[0], node.outputs[0]
    lines = _geometry(node, ctx, x, y)
    nc = ctx.numel(ctx.shape(x)[:2])
    indices = _wanted_output(ctx, node, 1)
    if indices is None:  # storage_order only shapes the Indices
        lines.append(f"ss_maxpool3d_{sfx}({ctx.ptr(x)}, {ctx.ptr(y)}, {nc}, {GEOMETRY}, pool_dil);")
    else:
        order = int(node.attrs.get("storage_order", 0))
        if order not in (0, 1):
            raise Unsupported(f"MaxPool storage_order {order}")
        lines.append(f"ss_maxpool3d_argmax_{sfx}({ctx.ptr(x)}, {ctx.ptr(y)}, {ctx.ptr(indices)}, {nc}, {GEOMETRY}, "
                     f"pool_dil, {order});")
    return Lowered("\n".join(lines), fragments=("pool",))


@lowers("AveragePool")
def lower_average_pool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    sfx = _kernel_suffix(node, ctx, AVERAGE_POOL_TYPES)
    x, y = node.inputs[0], node.outputs[0]
    lines = _geometry(node, ctx, x, y)
    nc = ctx.numel(ctx.shape(x)[:2])
    include = int(bool(node.attrs.get("count_include_pad", 0)))
    lines.append(f"ss_avgpool3d_{sfx}({ctx.ptr(x)}, {ctx.ptr(y)}, {nc}, {GEOMETRY}, pool_p_end, pool_dil, {include});")
    return Lowered("\n".join(lines), fragments=("pool",))


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(p, q) for p, q in zip(a, b))


@lowers("MaxUnpool")
def lower_max_unpool(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """A scatter into zeros: Indices address the flattened output whatever its shape, as
    onnxruntime, PyTorch and the reference evaluator (ops/conv_pool.py) read them; the
    output's extents (from output_shape, or the default unpooled size) come from its type."""
    x, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    ctx.ctype(x)  # declines element types without native buffers
    if ctx.dtype(indices) != INT64:
        raise Unsupported("MaxUnpool indices other than int64")
    if not _same_shape(ctx.shape(x), ctx.shape(indices)):
        raise Unsupported("MaxUnpool whose indices may not have the shape of X")
    code = (f"if (ss_maxunpool({ctx.elem_size(x)}, {ctx.raw_ptr(x)}, {ctx.ptr(indices)}, {ctx.numel(ctx.shape(x))}, "
            f"{ctx.raw_ptr(y)}, {ctx.numel(ctx.shape(y))})) return STEP_ERROR;")
    return Lowered(code, fragments=("pool",), can_fail=True)
