"""Windows and rearrangements of a tensor: Slice, Pad, Trilu, DepthToSpace, SpaceToDepth.

Slice is the op whose output sizes depend most on symbolic dims: with
constant starts/ends and a symbolic dim, the extent is computed with symbolic
min/max so that ``x[0:2]`` of a ``seq`` axis is ``min(2, seq)`` and ``x[1:]`` is
``seq - 1`` (the bounds prove ``seq >= 1``).  Slice of a known 1-D shape
tensor also slices its recorded contents.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.types import INT64
from ..symbolic import Dim, Expr, add, bounds, ceildiv, floordiv, maximum, minimum, mul, sub
from .common import normalize_axes, tensor
from .context import InferContext
from .registry import define
from .shape_ops import fresh_shape, ints_of, param_length, static_ints, vector_contents

# -- Slice -----------------------------------------------------------------------


def _clamp(x: Dim, lo: Dim, hi: Dim) -> Dim:
    return minimum(maximum(x, lo), hi)


def _resolve_index(value: Dim, dim: Dim, lo: Dim, hi: Dim) -> Optional[Dim]:
    """A start/end made absolute (negative counts from the end), clamped to [lo, hi].

    None when a symbolic index might be either negative or not.
    """
    if not isinstance(value, Expr):
        # Past +-(largest dim + 1) every index clamps alike; capping keeps
        # INT64_MAX-style sentinels out of the expressions.
        reach = bounds(dim)[1] + 1
        value = max(-reach, min(reach, int(value)))
    vlo, vhi = bounds(value)
    if vlo >= 0:
        absolute = value
    elif vhi < 0:
        absolute = add(value, dim)
    else:
        return None
    return _clamp(absolute, lo, hi)


def slice_range(start: Dim, end: Dim, step: int, dim: Dim) -> Optional[tuple[Dim, Dim]]:
    """The effective (start, end) of one sliced axis, clamped as the spec says."""
    if step > 0:
        first, last = _resolve_index(start, dim, 0, dim), _resolve_index(end, dim, 0, dim)
    else:
        top = sub(dim, 1)
        first, last = _resolve_index(start, dim, 0, top), _resolve_index(end, dim, -1, top)
    if first is None or last is None:
        return None
    return first, last


def step_within(step: int, dim: Dim) -> int:
    """``step`` capped to just past the axis: a step at least that long takes one element at
    most, whatever its size, and an INT64_MAX-style step stays out of the expressions (the
    count's ceiling division added it to the window and overflowed in C: a Slice by 2**63 - 1
    kept no row instead of one)."""
    reach = bounds(dim)[1] + 1
    return step if abs(step) <= reach else (reach if step > 0 else -reach)


def slice_extent(start: Dim, end: Dim, step: Dim, dim: Dim) -> Optional[Dim]:
    """The number of elements one axis keeps; None when it cannot be known."""
    if isinstance(step, Expr) or step == 0:
        return None
    step = step_within(int(step), dim)
    window = slice_range(start, end, step, dim)
    if window is None:
        return None
    first, last = window
    if step > 0:
        count = ceildiv(sub(last, first), step)
    else:
        count = ceildiv(sub(first, last), -step)
    return maximum(count, 0)


def _slice_params(ctx: InferContext):
    """(starts, ends, axes, steps) as dims; an entry is None when unknown, axes None = default."""
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        return starts, ends, axes, None if starts is None else [1] * len(starts)
    starts, ends = ctx.input_dims(1), ctx.input_dims(2)
    axes = static_ints(ctx.input_dims(3)) if ctx.has_input(3) else None
    if ctx.has_input(4):
        steps = ctx.input_dims(4)
    else:
        length = len(starts) if starts is not None else param_length(ctx, 1)
        steps = None if length is None else [1] * length
    return starts, ends, axes, steps


def _slice_axes(ctx: InferContext, rank: int, axes, count: Optional[int]) -> Optional[list[int]]:
    """The sliced axes, normalized; None when not known."""
    if ctx.opset >= 10 and ctx.has_input(3) and axes is None:
        return None
    if axes is None:
        return None if count is None else list(range(count))
    return normalize_axes(axes, rank, ctx, unique=True)


def _slice_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    if shape is None:
        return [tensor(dtype, None)]
    starts, ends, axes, steps = _slice_params(ctx)
    count = next((len(p) for p in (starts, ends, steps) if p is not None), param_length(ctx, 1))
    axes = _slice_axes(ctx, len(shape), axes, count)
    if axes is None:
        return [tensor(dtype, fresh_shape(ctx, len(shape), "slice"))]
    for name, values in (("starts", starts), ("ends", ends), ("steps", steps)):
        if values is not None and len(values) != len(axes):
            ctx.fail(f"{name} has {len(values)} entries for {len(axes)} axes")
    if steps is not None and any(not isinstance(s, Expr) and s == 0 for s in steps):
        ctx.fail("slice step cannot be 0")
    out = list(shape)
    for i, axis in enumerate(axes):
        extent = None
        if starts is not None and ends is not None and steps is not None:
            extent = slice_extent(starts[i], ends[i], steps[i], shape[axis])
        out[axis] = extent if extent is not None else ctx.fresh_dim("slice")
    _slice_contents(ctx, shape, starts, ends, steps)
    return [tensor(dtype, tuple(out))]


def _slice_contents(ctx: InferContext, shape, starts, ends, steps) -> None:
    contents = vector_contents(ctx, 0)
    params = [static_ints(p) for p in (starts, ends, steps)]
    if len(shape) != 1 or contents is None or any(p is None or len(p) != 1 for p in params):
        return
    (start,), (end,), (step,) = params
    first, last = slice_range(start, end, step, len(contents))
    ctx.set_contents(0, tuple(contents[i] for i in range(first, last, step)))


def _slice(ctx, x, starts=None, ends=None, axes=None, steps=None):
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
    else:
        starts, ends, axes, steps = ints_of(starts), ints_of(ends), ints_of(axes), ints_of(steps)
    axes = normalize_axes(axes if axes is not None else range(len(starts)), x.ndim)
    steps = steps if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            ctx.fail("slice step cannot be 0")
        first, last = slice_range(start, end, step, x.shape[axis])
        # A clamped end of -1 means "through index 0", which Python spells None.
        index[axis] = slice(first, None if last < 0 else last, step)
    return [x[tuple(index)]]


define("Slice", infer=_slice_type, evaluate=_slice, params=(1, 2, 3, 4))

# -- Pad ---------------------------------------------------------------------------


def _pad_params(ctx: InferContext):
    """(pads, axes) as read for this opset; pads None when unknown, axes None = all."""
    if ctx.opset < 11:
        return ctx.attr("pads"), None
    axes = None
    if ctx.opset >= 18 and ctx.has_input(3):
        axes = static_ints(ctx.input_dims(3))
        if axes is None:
            return None, None
    return ctx.input_dims(1), axes


def _pad_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    if shape is None:
        return [tensor(dtype, None)]
    if ctx.opset >= 11 and ctx.input_dtype(1) not in (None, INT64):
        # The kernels index by these as integers; onnx types pads as tensor(int64).
        ctx.fail(f"Pad's pads must be int64, got {ctx.input_dtype(1)}")
    pads, axes = _pad_params(ctx)
    rank = len(shape)
    axes = list(range(rank)) if axes is None else normalize_axes(axes, rank, ctx)
    if pads is None:
        out = list(shape)
        for axis in axes:
            out[axis] = ctx.fresh_dim("pad")
        return [tensor(dtype, tuple(out))]
    if len(pads) != 2 * len(axes):
        ctx.fail(f"{len(pads)} pads for {len(axes)} axes")
    out = list(shape)
    for i, axis in enumerate(axes):
        out[axis] = add(add(shape[axis], pads[i]), pads[i + len(axes)])
        if not isinstance(out[axis], Expr) and out[axis] < 0:
            ctx.fail(f"pads make axis {axis} negative")
    return [tensor(dtype, tuple(out))]


def pad_array(x: np.ndarray, begins: list[int], ends: list[int], mode: str, value) -> np.ndarray:
    """np.pad, where negative pads crop: after the constant padding (so that an axis is
    n + begin + end long, as the type rule and onnxruntime have it, even where a crop takes
    more than the axis holds: length 1 with pads [-2, 1] is empty), before the other modes'
    (whose padding reads the cropped input)."""
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    if mode == "constant":
        padded = np.pad(x, widths, mode="constant", constant_values=value).astype(x.dtype, copy=False)
        return padded[tuple(slice(max(-b, 0), max(n - max(-e, 0), max(-b, 0)))
                            for n, b, e in zip(padded.shape, begins, ends))]
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(x.shape, begins, ends))
    x = x[crop]
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"unknown pad mode {mode!r}")
    return np.pad(x, widths, mode=mode)


def _pad(ctx, x, pads=None, constant_value=None, axes=None):
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads, value = ctx.attr("pads"), ctx.attr("value")
    else:
        pads = ints_of(pads)
        value = None if constant_value is None or constant_value.size == 0 else constant_value.reshape(-1)[0]
    if value is None:
        # The spec's default: 0, False, or the empty string.
        value = "" if x.dtype == object else 0
    axes = list(range(x.ndim)) if axes is None else normalize_axes(ints_of(axes), x.ndim)
    if len(pads) != 2 * len(axes):
        ctx.fail(f"{len(pads)} pads for {len(axes)} axes")  # as the type rule says it
    begins, ends = [0] * x.ndim, [0] * x.ndim
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = pads[i], pads[i + len(axes)]
    try:
        return [pad_array(x, begins, ends, mode, value)]
    except ValueError as exc:
        ctx.fail(str(exc))


define("Pad", infer=_pad_type, evaluate=_pad, params=(1, 2, 3), single=(2,))

# -- Trilu ---------------------------------------------------------------------------


def _trilu_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is not None and len(shape) < 2:
        ctx.fail(f"Trilu needs rank >= 2, got {len(shape)}")
    return [ctx.input_type(0)]


def _trilu(ctx, x, k=None):
    offset = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    if ctx.attr("upper", 1):
        return [np.triu(x, offset)]
    return [np.tril(x, offset)]


define("Trilu", infer=_trilu_type, evaluate=_trilu, params=(1,), single=(1,))

# -- DepthToSpace, SpaceToDepth --------------------------------------------------------


def _blocksize(ctx) -> int:
    b = ctx.attr("blocksize")
    if b is None or int(b) < 1:
        ctx.fail(f"blocksize must be a positive int, got {b}")
    return int(b)


def _blocks_type(ctx: InferContext, to_space: bool) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    if shape is None:
        return [tensor(dtype, fresh_shape(ctx, 4, "block"))]
    if len(shape) != 4:
        ctx.fail(f"expected a 4-D input, got rank {len(shape)}")
    b = _blocksize(ctx)
    n, c, h, w = shape
    if to_space:
        if not isinstance(c, Expr) and c % (b * b):
            ctx.fail(f"channels {c} not divisible by blocksize^2 = {b * b}")
        out = (n, floordiv(c, b * b), mul(h, b), mul(w, b))
    else:
        for name, d in (("height", h), ("width", w)):
            if not isinstance(d, Expr) and d % b:
                ctx.fail(f"{name} {d} not divisible by blocksize {b}")
        out = (n, mul(c, b * b), floordiv(h, b), floordiv(w, b))
    return [tensor(dtype, out)]


def _depth_to_space(ctx, x):
    b = _blocksize(ctx)
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        tmp = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        tmp = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [tmp.reshape(n, c // (b * b), h * b, w * b)]


def _space_to_depth(ctx, x):
    b = _blocksize(ctx)
    n, c, h, w = x.shape
    tmp = x.reshape(n, c, h // b, b, w // b, b)
    # DCR puts the block offsets before the channel, CRD (opset 28) after it.
    if ctx.attr("mode", "DCR") == "DCR":
        tmp = tmp.transpose(0, 3, 5, 1, 2, 4)
    else:
        tmp = tmp.transpose(0, 1, 3, 5, 2, 4)
    return [tmp.reshape(n, c * b * b, h // b, w // b)]


def _depth_to_space_type(ctx: InferContext) -> list:
    return _blocks_type(ctx, to_space=True)


def _space_to_depth_type(ctx: InferContext) -> list:
    return _blocks_type(ctx, to_space=False)


define("DepthToSpace", infer=_depth_to_space_type, evaluate=_depth_to_space)
define("SpaceToDepth", infer=_space_to_depth_type, evaluate=_space_to_depth)
