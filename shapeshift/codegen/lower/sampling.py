"""Sampling and positional ops: GridSample, RotaryEmbedding and CenterCropPad.

GridSample and RotaryEmbedding are one kernel call each (kernels/sample.py,
kernels/rotary.py); this module turns their attributes into the kernels' arguments and
declines what the kernels do not cover. CenterCropPad only moves elements: a zero fill when
some axis pads, then one strided copy (``ss_fill``, ``ss_copy`` of kernels/layout.py) of
the part of the input that the output keeps, at offsets computed from the extents at run
time, so one build serves every binding of the input's symbols.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...ir.graph import Node, Value
from ...ir.types import FLOAT, INT64, to_numpy_dtype
from ...symbolic import Dim, prove_eq
from ..kernels.sample import MAX_RANK as GRID_MAX_RANK
from ..kernels.sample import MODES as GRID_MODES
from ..kernels.sample import PADDINGS as GRID_PADDINGS
from . import lowers
from .context import LowerContext, Lowered, Unsupported, c_array
from .layout import contiguous_strides, copy_call, param_values

# GridSample's mode names: opset 16 spelled the 2-D modes, opset 20 renamed them for N-D.
GRID_MODE_NAMES = {16: {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"},
                   20: {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}}


def _text(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _require_float(ctx: LowerContext, node: Node, values: Sequence[Value]) -> None:
    for value in values:
        if ctx.dtype(value) != FLOAT:
            raise Unsupported(f"{node.op_type} on a dtype other than float32")


def _dims(ctx: LowerContext, dims: Sequence[Dim]) -> list[str]:
    return [ctx.dim(d) for d in dims]


def _equal_extent_checks(ctx: LowerContext, pairs: Sequence[tuple[Dim, Dim]]) -> list[str]:
    """C lines failing the step when two extents that must agree do not; pairs the types
    already prove equal need none (different symbols may still be bound to one value)."""
    return [f"if ({ctx.dim(a)} != {ctx.dim(b)}) return STEP_ERROR;" for a, b in pairs if not prove_eq(a, b)]


# -- GridSample ------------------------------------------------------------------------------


def _grid_mode(node: Node, opset: int) -> int:
    names = GRID_MODE_NAMES[16 if opset < 20 else 20]
    mode = _text(node, "mode", "bilinear" if opset < 20 else "linear")
    if mode not in names:
        raise Unsupported(f"GridSample mode {mode!r} at opset {opset}")
    return GRID_MODES[names[mode]]


@lowers("GridSample")
def lower_grid_sample(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, grid, y = node.inputs[0], node.inputs[1], node.outputs[0]
    _require_float(ctx, node, (x, grid, y))
    mode = _grid_mode(node, opset)
    padding = GRID_PADDINGS.get(_text(node, "padding_mode", "zeros"))
    if padding is None:
        raise Unsupported(f"GridSample padding_mode {_text(node, 'padding_mode', '')!r}")
    align = int(node.attrs.get("align_corners", 0))
    x_shape, grid_shape = ctx.shape(x), ctx.shape(grid)
    rank = len(x_shape) - 2
    if not 1 <= rank <= GRID_MAX_RANK:
        raise Unsupported(f"GridSample with {rank} spatial axes")
    if len(grid_shape) != rank + 2 or not prove_eq(grid_shape[-1], rank):
        raise Unsupported("GridSample grid whose shape does not match the input's rank")
    n, c = (ctx.dim(d) for d in x_shape[:2])
    checks = _equal_extent_checks(ctx, [(x_shape[0], grid_shape[0])])
    code = "\n".join([
        *checks,
        c_array("in_dims", _dims(ctx, x_shape[2:])),
        c_array("out_dims", _dims(ctx, grid_shape[1:-1])),
        f"ss_grid_sample({ctx.ptr(x)}, {ctx.ptr(grid)}, {ctx.ptr(y)}, {n}, {c}, {rank}, in_dims, out_dims, "
        f"{mode}, {padding}, {1 if align else 0});"])
    return Lowered(code, fragments=("sample",), can_fail=bool(checks))


# -- RotaryEmbedding -------------------------------------------------------------------------


def _rotary_layout(node: Node, ctx: LowerContext, shape: Sequence[Dim]) -> list[str]:
    """C lines declaring B, S, H, D and the row strides sb, ss, sh of the input (failing the
    step when a 3-D input's hidden size is not a multiple of num_heads)."""
    if len(shape) == 4:  # [batch, heads, sequence, head size]
        b, h, s, d = _dims(ctx, shape)
        return [f"const int64_t B = {b}, H = {h}, S = {s}, D = {d};",
                "const int64_t sb = H * S * D, sh = S * D, ss = D;"]
    if len(shape) == 3:  # [batch, sequence, heads * head size]
        heads = int(node.attrs.get("num_heads", 0))
        if heads <= 0:
            raise Unsupported("RotaryEmbedding of a 3-D input without num_heads")
        b, s, hidden = _dims(ctx, shape)
        return [f"if (({hidden}) % {heads} != 0) return STEP_ERROR;",
                f"const int64_t B = {b}, S = {s}, H = {heads}, D = {hidden} / {heads};",
                f"const int64_t sb = S * {hidden}, ss = {hidden}, sh = D;"]
    raise Unsupported(f"RotaryEmbedding of a rank-{len(shape)} input")


def _rotary_extents(ctx: LowerContext, x_shape: Sequence[Dim], cos: Value, sin: Value,
                    ids: Optional[Value]) -> tuple[Dim, list[tuple[Dim, Dim]]]:
    """The number of cache rows (max position + 1; 0 without position ids), and the pairs
    of extents that must agree for the kernel to stay in bounds: the two caches, and the
    caches (without ids) or the ids (with them) against the input's batch and sequence."""
    cos_shape, sin_shape = ctx.shape(cos), ctx.shape(sin)
    batch, seq = x_shape[0], x_shape[2] if len(x_shape) == 4 else x_shape[1]
    if len(cos_shape) != (2 if ids is not None else 3) or len(sin_shape) != len(cos_shape):
        raise Unsupported("RotaryEmbedding caches of a rank other than the spec's")
    pairs = list(zip(cos_shape, sin_shape))
    if ids is None:
        return 0, pairs + [(cos_shape[0], batch), (cos_shape[1], seq)]
    ids_shape = ctx.shape(ids)
    if len(ids_shape) != 2:
        raise Unsupported("RotaryEmbedding position_ids of rank other than 2")
    return cos_shape[0], pairs + [(ids_shape[0], batch), (ids_shape[1], seq)]


@lowers("RotaryEmbedding")
def lower_rotary_embedding(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, cos, sin, y = node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]
    ids = node.inputs[3] if len(node.inputs) > 3 else None
    _require_float(ctx, node, (x, cos, sin, y))
    if ids is not None and ctx.dtype(ids) != INT64:
        raise Unsupported("RotaryEmbedding position_ids of a dtype other than int64")
    shape = ctx.shape(x)
    layout = _rotary_layout(node, ctx, shape)
    max_pos, must_agree = _rotary_extents(ctx, shape, cos, sin, ids)
    rot = int(node.attrs.get("rotary_embedding_dim", 0))
    interleaved = 1 if int(node.attrs.get("interleaved", 0)) else 0
    ids_ptr = ctx.ptr(ids) if ids is not None else "NULL"
    code = "\n".join([
        *layout,
        *_equal_extent_checks(ctx, must_agree),
        f"const int64_t rot = {rot} > 0 ? {rot} : D;",
        f"if (ss_rotary_embedding({ctx.ptr(x)}, {ctx.ptr(cos)}, {ctx.ptr(sin)}, {ids_ptr}, {ctx.ptr(y)}, B, S, H, D, "
        f"rot, {ctx.dim(ctx.shape(cos)[-1])}, {ctx.dim(max_pos)}, sb, ss, sh, {interleaved})) return STEP_ERROR;"])
    return Lowered(code, fragments=("rotary",), can_fail=True)


# -- CenterCropPad ---------------------------------------------------------------------------


def _layout_elem_size(ctx: LowerContext, value: Value) -> int:
    """Bytes per element of a numeric tensor (all-zero bytes being its zero), else decline."""
    dtype = to_numpy_dtype(ctx.dtype(value))
    if dtype.kind not in "biufc" or dtype.itemsize not in (1, 2, 4, 8):
        raise Unsupported(f"CenterCropPad of dtype {dtype}")
    return dtype.itemsize


def _crop_axes(node: Node, ctx: LowerContext, out_shape: Sequence[Dim]) -> list[int]:
    """The axes the target sizes apply to, checked against the sizes and the output's shape."""
    rank = len(out_shape)
    sizes = param_values(node, 1, ctx)
    if sizes is None:
        raise Unsupported("CenterCropPad without target sizes")
    axes = node.attrs.get("axes")
    axes = list(range(rank)) if axes is None else [int(a) + rank if int(a) < 0 else int(a) for a in axes]
    if len(axes) != len(sizes) or len(set(axes)) != len(axes) or not all(0 <= a < rank for a in axes):
        raise Unsupported("CenterCropPad axes that do not match the target sizes")
    if not all(prove_eq(out_shape[a], size) for a, size in zip(axes, sizes)):
        raise Unsupported("CenterCropPad output shape that is not the target sizes")
    return axes


@lowers("CenterCropPad")
def lower_center_crop_pad(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    if len(in_shape) != len(out_shape) or not in_shape:
        raise Unsupported("CenterCropPad output of another rank than its input")
    elem = _layout_elem_size(ctx, x)
    axes = set(_crop_axes(node, ctx, out_shape))
    in_strides, out_strides = _dims(ctx, contiguous_strides(in_shape)), _dims(ctx, contiguous_strides(out_shape))
    # Per cropped or padded axis: the extent both tensors share, centred in the larger one
    # (the odd element goes to the end: start offsets round down).
    lines = ["int64_t src_off = 0, dst_off = 0; int pads = 0;"]
    extents = []
    for a, (d_in, d_out) in enumerate(zip(in_shape, out_shape)):
        if a not in axes:
            if not prove_eq(d_in, d_out):
                raise Unsupported("CenterCropPad changed an axis it was not given")
            extents.append(ctx.dim(d_in))
            continue
        lines.append(f"const int64_t in{a} = {ctx.dim(d_in)}, out{a} = {ctx.dim(d_out)};")
        lines.append(f"const int64_t ext{a} = in{a} < out{a} ? in{a} : out{a};")
        lines.append(f"if (in{a} > out{a}) src_off += ((in{a} - out{a}) / 2) * {in_strides[a]};")
        lines.append(f"if (out{a} > in{a}) {{ dst_off += ((out{a} - in{a}) / 2) * {out_strides[a]}; pads = 1; }}")
        extents.append(f"ext{a}")
    lines += ["const uint64_t zero = 0;",
              f"if (pads) ss_fill({elem}, {ctx.raw_ptr(y)}, {ctx.numel(out_shape)}, &zero);",
              copy_call(ctx, elem, extents, f"(const char*){ctx.raw_ptr(x)} + src_off * {elem}", in_strides,
                        f"(char*){ctx.raw_ptr(y)} + dst_off * {elem}", out_strides)]
    return Lowered("\n".join(lines), fragments=("layout",))
