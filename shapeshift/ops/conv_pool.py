"""Convolutions and pooling: Conv, ConvInteger, ConvTranspose, MaxPool,
AveragePool, LpPool, their global forms, and MaxUnpool.

Type rules compute each spatial output dim symbolically from the window
geometry in :mod:`.window`: kernel 3, pad 1, stride 2 gives
``floor((H + 2 - 3) / 2) + 1``, built as ``(H + 1) // 2``, the very expression
SAME padding gives.  A convolution's weight gives the output channels and,
when ``kernel_shape`` is absent, the kernel size.  MaxPool's optional second
output holds int64 indices into the flattened input.

Convolution evaluators are im2col: the input is viewed as sliding windows
without copying, gathered a block of output rows at a time into a reused
(groups, C/g * K, positions) buffer and multiplied by the weights with one
batched ``np.matmul`` (BLAS) per block.  ConvTranspose multiplies once per
kernel offset and scatters the result with one strided add.  Pools fold the
window view one kernel offset at a time (far faster than a NumPy reduction
over short strided axes); AveragePool's divisor is the same window sum over
a mask of the cells that count, so ceil mode and dilations need no special
case.  Halves and bfloat16 accumulate in float32; ConvInteger in float64,
exact for any realistic size.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from ..ir.types import INT32, INT64, TensorType
from ..symbolic import Dim, Expr, maximum, mul
from .context import EvalContext, InferContext
from .registry import define
from .window import (
    Window,
    check_output_dim,
    compute_dtype,
    fit_spatial,
    output_dim,
    place,
    read_window,
    window_view,
)

# -- convolution type rules --------------------------------------------------------


def _static_eq(a: Dim, b: Dim) -> bool:
    """False only when both dims are static and differ."""
    return isinstance(a, Expr) or isinstance(b, Expr) or a == b


def _conv_rank(ctx: InferContext) -> Optional[int]:
    """Rank of the data, from X, then W, then kernel_shape."""
    for index in (0, 1):
        shape = ctx.input_shape(index)
        if shape is not None:
            return len(shape)
    kernel = ctx.attr("kernel_shape")
    return None if kernel is None else len(kernel) + 2


def _conv_type_common(ctx: InferContext, dtype: int) -> list:
    """Output type of Conv and ConvInteger, whose inputs are laid out alike."""
    rank = _conv_rank(ctx)
    if rank is None:
        return [TensorType(dtype, None)]
    if rank < 3:
        ctx.fail(f"convolution needs an input of rank >= 3, got rank {rank}")
    x = ctx.input_shape(0)
    w = ctx.input_shape(1)
    if w is not None and len(w) != rank:
        ctx.fail(f"weight rank {len(w)} differs from input rank {rank}")
    group = int(ctx.attr("group", 1))
    if group < 1:
        ctx.fail(f"group must be at least 1, got {group}")
    if x is not None and w is not None and not _static_eq(x[1], mul(w[1], group)):
        ctx.fail(f"input has {x[1]} channels, weight expects {w[1]} x group {group}")
    if w is not None and isinstance(w[0], int) and w[0] % group:
        ctx.fail(f"the weight's {w[0]} output channels do not split into group {group}")
    window = read_window(ctx, rank - 2, None if w is None else w[2:])
    batch = x[0] if x is not None else ctx.fresh_dim("N")
    channels = w[0] if w is not None else ctx.fresh_dim("C")
    spatial = [
        check_output_dim(ctx, None if x is None else output_dim(window, i, x[i + 2]), 1)
        for i in range(rank - 2)
    ]
    return [TensorType(dtype, (batch, channels, *spatial))]


def _conv_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    if dtype is None:
        return [None]
    return _conv_type_common(ctx, dtype)


def _conv_integer_type(ctx: InferContext) -> list:
    return _conv_type_common(ctx, INT32)


def _transpose_pads(window: Window, axis: int, size: Dim, extent: Dim, out_pad: int,
                    output_shape: Optional[list]) -> tuple[Dim, Dim, Dim]:
    """ConvTranspose's (begin pad, end pad, output length) along one axis."""
    stride = window.strides[axis]
    full = stride * (size - 1) + out_pad + extent
    if output_shape is not None:
        total = full - output_shape[axis]
    elif window.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # Aim at size * stride, but never pad negatively (onnxruntime and
        # onnx's shape inference agree): a kernel shorter than the stride
        # leaves the output at its full, unpadded length.
        total = maximum(full - size * stride, 0)
    else:
        begin, end = window.explicit_pads(axis)
        return begin, end, full - begin - end
    # The spec puts the odd element at the end for SAME_UPPER, at the start otherwise.
    if window.auto_pad == "SAME_UPPER":
        begin, end = total // 2, total - total // 2
    else:
        begin, end = total - total // 2, total // 2
    return begin, end, full - total


def _output_shape_attr(ctx, rank: int) -> Optional[list]:
    shape = ctx.attr("output_shape")
    if shape is None:
        return None
    shape = [int(v) for v in shape]
    if len(shape) == rank + 2:  # some exporters include N and C
        shape = shape[2:]
    if len(shape) != rank:
        ctx.fail(f"output_shape has {len(shape)} values for {rank} spatial dims")
    return shape


def _output_padding(ctx, rank: int) -> list[int]:
    pads = [int(v) for v in ctx.attr("output_padding") or [0] * rank]
    if len(pads) != rank:
        ctx.fail(f"output_padding has {len(pads)} values for {rank} spatial dims")
    return pads


def _transpose_out_dim(ctx: InferContext, window: Window, axis: int, size: Optional[Dim],
                       out_pad: int) -> Dim:
    if size is None or window.kernel is None:
        return ctx.fresh_dim("convT")
    length = _transpose_pads(window, axis, size, window.dilated(axis), out_pad, None)[2]
    return check_output_dim(ctx, length, 1)


def _conv_transpose_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    if dtype is None:
        return [None]
    rank = _conv_rank(ctx)
    if rank is None:
        return [TensorType(dtype, None)]
    if rank < 3:
        ctx.fail(f"ConvTranspose needs an input of rank >= 3, got rank {rank}")
    x, w = ctx.input_shape(0), ctx.input_shape(1)
    group = int(ctx.attr("group", 1))
    if x is not None and w is not None and not _static_eq(x[1], w[0]):
        ctx.fail(f"input has {x[1]} channels, weight expects {w[0]}")
    nsp = rank - 2
    window = read_window(ctx, nsp, None if w is None else w[2:])
    out_pads = _output_padding(ctx, nsp)
    spatial = _output_shape_attr(ctx, nsp)
    if spatial is None:
        spatial = [_transpose_out_dim(ctx, window, i, None if x is None else x[i + 2], out_pads[i])
                   for i in range(nsp)]
    batch = x[0] if x is not None else ctx.fresh_dim("N")
    channels = mul(w[1], group) if w is not None else ctx.fresh_dim("C")
    return [TensorType(dtype, (batch, channels, *spatial))]


# -- convolution evaluation --------------------------------------------------------


#: Elements of im2col scratch per block; bounds memory for large images.
_BLOCK_ELEMENTS = 1 << 22


def _correlate(ctx: EvalContext, x: np.ndarray, w: np.ndarray, window: Window, group: int) -> np.ndarray:
    """Grouped cross-correlation of x (N, C, *S) with w (M, C/group, *K), in x's dtype."""
    placement = place(window, x.shape[2:])
    n, c = x.shape[:2]
    m = w.shape[0]
    if group < 1 or c != w.shape[1] * group or m % group:
        ctx.fail(f"input channels {c} and weight {w.shape} do not match group {group}")
    outs = placement.outs
    if 0 in outs or n == 0 or m == 0:
        return np.zeros((n, m, *outs), dtype=x.dtype)
    windows = window_view(x, placement, 0)  # (N, C, *out, *K), no copy
    rank = len(outs)
    # (N, G, C/g, *K, *out): each group's patch rows, then positions.
    cols = windows.reshape(n, group, c // group, *windows.shape[2:])
    cols = cols.transpose(0, 1, 2, *range(3 + rank, 3 + 2 * rank), *range(3, 3 + rank))
    weights = w.reshape(group, m // group, -1).astype(x.dtype, copy=False)
    patch = weights.shape[2]
    y = np.empty((n, group, m // group, *outs), dtype=x.dtype)
    # im2col a block of output rows at a time into one reused buffer, so the
    # scratch stays small however large the image is.
    row_size = group * patch * int(np.prod(outs[1:]))
    rows = max(1, min(outs[0], _BLOCK_ELEMENTS // max(row_size, 1)))
    scratch = np.empty(rows * row_size, dtype=x.dtype)
    row_axis = 2 + rank  # first output axis of cols[b]
    for b in range(n):
        for start in range(0, outs[0], rows):
            stop = min(start + rows, outs[0])
            block = cols[b][(slice(None),) * row_axis + (slice(start, stop),)]
            buffer = scratch[: block.size].reshape(block.shape)
            np.copyto(buffer, block)
            product = np.matmul(weights, buffer.reshape(group, patch, -1))
            y[b, :, :, start:stop] = product.reshape(group, m // group, stop - start, *outs[1:])
    return y.reshape(n, m, *outs)


def _add_bias(y: np.ndarray, bias: Optional[np.ndarray]) -> np.ndarray:
    if bias is None:
        return y
    return y + bias.astype(y.dtype, copy=False).reshape((1, -1) + (1,) * (y.ndim - 2))


def _conv(ctx: EvalContext, x, w, bias=None) -> list:
    work = compute_dtype(x.dtype)
    window = read_window(ctx, x.ndim - 2, w.shape[2:])
    y = _correlate(ctx, x.astype(work, copy=False), w.astype(work, copy=False), window,
                   int(ctx.attr("group", 1)))
    return [_add_bias(y, bias).astype(x.dtype, copy=False)]


def _conv_integer(ctx: EvalContext, x, w, x_zero=None, w_zero=None) -> list:
    # Subtracting the zero points first makes the zero padding right.
    xs = x.astype(np.float64) - (0.0 if x_zero is None else float(np.asarray(x_zero).reshape(-1)[0]))
    ws = w.astype(np.float64)
    if w_zero is not None:
        ws = ws - np.asarray(w_zero, dtype=np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    window = read_window(ctx, x.ndim - 2, w.shape[2:])
    y = _correlate(ctx, xs, ws, window, int(ctx.attr("group", 1)))
    return [np.rint(y).astype(np.int32)]


def _conv_transpose(ctx: EvalContext, x, w, bias=None) -> list:
    work = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    group = int(ctx.attr("group", 1))
    if w.shape[0] != c or c % group:
        ctx.fail(f"input channels {c} do not match weight {w.shape} with group {group}")
    rank = x.ndim - 2
    window = read_window(ctx, rank, w.shape[2:])
    kernel = w.shape[2:]
    sizes = x.shape[2:]
    out_pads = _output_padding(ctx, rank)
    output_shape = _output_shape_attr(ctx, rank)
    geometry = [_transpose_pads(window, i, sizes[i], window.dilated(i), out_pads[i], output_shape)
                for i in range(rank)]
    m_group = w.shape[1]
    xg = x.astype(work, copy=False).reshape(n, group, c // group, -1)
    wg = w.astype(work, copy=False).reshape(group, c // group, m_group, -1)
    full_sizes = [window.strides[i] * (sizes[i] - 1) + window.dilated(i) for i in range(rank)]
    full = np.zeros((n, group * m_group, *full_sizes), dtype=work)
    # Each kernel offset contributes w[:, :, offset]^T @ x, scattered with the
    # stride at that offset: one matmul and one strided add per offset.
    for flat, offset in enumerate(np.ndindex(*kernel)):
        part = np.matmul(wg[..., flat].transpose(0, 2, 1), xg)  # (N, G, Mg, positions)
        target = tuple(
            slice(o * d, o * d + s * (size - 1) + 1, s)
            for o, d, s, size in zip(offset, window.dilations, window.strides, sizes)
        )
        full[(slice(None), slice(None)) + target] += part.reshape(n, group * m_group, *sizes)
    y = fit_spatial(full, [-begin for begin, _, _ in geometry], [length for _, _, length in geometry], 0)
    return [_add_bias(y, bias).astype(x.dtype, copy=False)]


define("Conv", infer=_conv_type, evaluate=_conv)
define("ConvInteger", infer=_conv_integer_type, evaluate=_conv_integer)
define("ConvTranspose", infer=_conv_transpose_type, evaluate=_conv_transpose)


# -- pooling type rules ------------------------------------------------------------


def _pool_window(ctx, rank: int, ceil_mode: bool = True) -> Window:
    """The window of a pooling node, whose kernel_shape attribute is required."""
    if ctx.attr("kernel_shape") is None:
        ctx.fail("attribute kernel_shape is required")
    return read_window(ctx, rank, None, pool=ceil_mode)


def _pool_type(ctx: InferContext) -> list:
    """Windowed pools: every output (values, and MaxPool's indices) has the pooled shape."""
    dtype = ctx.input_dtype(0)
    if dtype is None:
        return [None] * ctx.num_outputs
    dtypes = [dtype, INT64][: ctx.num_outputs]
    x = ctx.input_shape(0)
    if x is None:
        return [TensorType(t, None) for t in dtypes]
    if len(x) < 3:
        ctx.fail(f"pooling needs an input of rank >= 3, got rank {len(x)}")
    window = _pool_window(ctx, len(x) - 2)
    spatial = [check_output_dim(ctx, output_dim(window, i, d)) for i, d in enumerate(x[2:])]
    return [TensorType(t, (x[0], x[1], *spatial)) for t in dtypes]


def _global_pool_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    if dtype is None:
        return [None]
    x = ctx.input_shape(0)
    if x is None:
        return [TensorType(dtype, None)]
    if len(x) < 2:
        ctx.fail(f"global pooling needs an input of rank >= 2, got rank {len(x)}")
    return [TensorType(dtype, (x[0], x[1]) + (1,) * (len(x) - 2))]


def _unpool_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    if dtype is None:
        return [None]
    x = ctx.input_shape(0)
    if ctx.has_input(2):
        return [TensorType(dtype, _given_shape(ctx, x))]
    if x is None:
        return [TensorType(dtype, None)]
    window = _pool_window(ctx, len(x) - 2, ceil_mode=False)
    spatial = []
    for i, size in enumerate(x[2:]):
        begin, end = window.explicit_pads(i)
        spatial.append(check_output_dim(ctx, (size - 1) * window.strides[i] + window.kernel[i] - begin - end))
    return [TensorType(dtype, (x[0], x[1], *spatial))]


def _given_shape(ctx: InferContext, x) -> Optional[tuple]:
    """MaxUnpool's output_shape input: its contents, else fresh dims of the right rank."""
    dims = ctx.input_dims(2)
    if dims is not None:
        return tuple(dims)
    if x is not None:  # a valid output_shape keeps N and C
        return (x[0], x[1]) + tuple(ctx.fresh_dim("unpool") for _ in x[2:])
    shape = ctx.input_shape(2)
    if shape is None or isinstance(shape[0], Expr):
        return None
    return tuple(ctx.fresh_dim("unpool") for _ in range(shape[0]))


# -- pooling evaluation ------------------------------------------------------------


def _lowest(dtype: np.dtype):
    """The padding value that never wins a max."""
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else -np.inf


def _offsets(windows: np.ndarray, rank: int):
    """Each kernel offset's strided slice of a window view: (flat offset, view)."""
    for flat, offset in enumerate(np.ndindex(*windows.shape[-rank:])):
        yield flat, windows[(Ellipsis,) + offset]


def _window_sum(windows: np.ndarray, rank: int) -> np.ndarray:
    """Sum over the kernel axes, one offset at a time.

    Adding whole strided slices is an order of magnitude faster than NumPy's
    reduction over the short, strided trailing kernel axes.
    """
    total = None
    for _, part in _offsets(windows, rank):
        if total is None:
            total = np.array(part)
        else:
            np.add(total, part, out=total)
    return total


def _window_max(windows: np.ndarray, rank: int, with_argmax: bool):
    """Max over the kernel axes and, if asked, the flat kernel offset of the first max."""
    best, where = None, None
    for flat, part in _offsets(windows, rank):
        if best is None:
            best = np.array(part)
            where = np.zeros(best.shape, dtype=np.int64) if with_argmax else None
        elif with_argmax:
            better = part > best
            np.copyto(best, part, where=better)
            where[better] = flat
        else:
            np.maximum(best, part, out=best)
    return best, where


def _empty(x: np.ndarray, outs, dtype=None) -> np.ndarray:
    return np.zeros(x.shape[:2] + tuple(outs), dtype=dtype or x.dtype)


def require_spatial(ctx: EvalContext, x: np.ndarray) -> None:
    """Pooling over an empty spatial extent has no defined value (a max or a mean of
    nothing); onnxruntime refuses such an input at run time, and so do both backends (the
    native one through its contract, codegen/lower/contracts.py)."""
    for axis in range(2, x.ndim):
        if x.shape[axis] == 0:
            ctx.fail(f"input of shape {list(x.shape)}: spatial dimension {axis} is 0, and pooling over an "
                     "empty extent is undefined")


def _max_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    rank = x.ndim - 2
    placement = place(_pool_window(ctx, rank), x.shape[2:])
    want_indices = ctx.num_outputs > 1
    if x.size == 0 or 0 in placement.outs:
        return [_empty(x, placement.outs), _empty(x, placement.outs, np.int64)][: ctx.num_outputs]
    windows = window_view(x, placement, _lowest(x.dtype))
    values, where = _window_max(windows, rank, want_indices)
    if not want_indices:
        return [values]
    return [values, _max_indices(ctx, x, where, windows.shape[-rank:], placement)]


def _max_indices(ctx: EvalContext, x: np.ndarray, where: np.ndarray, kernel, placement) -> np.ndarray:
    """Flat input indices of the maxima, given their flat kernel offsets ``where``.

    Spatial coordinates are raveled row major, or column major with
    storage_order=1; the (n, c) plane offset is added either way.
    """
    rank = x.ndim - 2
    spatial = x.shape[2:]
    offsets = np.unravel_index(where, kernel)
    coords = []
    for i in range(rank):
        starts = np.arange(placement.outs[i]) * placement.strides[i] - placement.begins[i]
        starts = starts.reshape((-1,) + (1,) * (rank - 1 - i))
        coords.append(np.clip(starts + offsets[i] * placement.dilations[i], 0, spatial[i] - 1))
    order = "F" if ctx.attr("storage_order", 0) else "C"
    inner = np.ravel_multi_index(tuple(coords), spatial, order=order)
    n, c = x.shape[:2]
    planes = np.arange(n * c, dtype=np.int64).reshape((n, c) + (1,) * rank) * int(np.prod(spatial))
    return planes + inner


def _average_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    rank = x.ndim - 2
    window = _pool_window(ctx, rank)
    placement = place(window, x.shape[2:])
    if 0 in placement.outs:
        return [_empty(x, placement.outs)]
    work = compute_dtype(x.dtype)
    sums = _window_sum(window_view(x.astype(work, copy=False), placement, 0), rank)
    counts = _average_divisor(ctx, window, placement, x.shape[2:], work)
    return [(sums / counts).astype(x.dtype, copy=False)]


def _average_divisor(ctx: EvalContext, window: Window, placement, sizes, work) -> np.ndarray:
    """How many cells of each window count: input cells, plus explicit (or SAME)
    padding with count_include_pad; the ceil-mode overhang never counts."""
    rank = len(sizes)
    mask = np.ones(sizes, dtype=work)
    begins = placement.begins
    if ctx.attr("count_include_pad", 0):
        same = window.auto_pad in ("SAME_UPPER", "SAME_LOWER")
        pads = [_same_pads(placement, sizes, i) if same else window.explicit_pads(i) for i in range(rank)]
        mask = np.ones([size + b + e for size, (b, e) in zip(sizes, pads)], dtype=work)
        begins = tuple(placement.begins[i] - pads[i][0] for i in range(rank))
    return _window_sum(window_view(mask[None, None], replace(placement, begins=begins), 0), rank)


def _same_pads(placement, sizes, axis: int) -> tuple[int, int]:
    """The begin and end pads SAME_* auto padding resolved to along ``axis``."""
    total = (placement.outs[axis] - 1) * placement.strides[axis] + placement.extents[axis] - sizes[axis]
    return placement.begins[axis], max(0, total) - placement.begins[axis]


def _lp_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    rank = x.ndim - 2
    placement = place(_pool_window(ctx, rank), x.shape[2:])
    if 0 in placement.outs:
        return [_empty(x, placement.outs)]
    p = float(ctx.attr("p", 2))
    work = compute_dtype(x.dtype)
    powered = np.abs(x.astype(work, copy=False)) ** p
    total = _window_sum(window_view(powered, placement, 0), rank)
    return [(total ** (1.0 / p)).astype(x.dtype, copy=False)]


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


def _global_average_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    work = compute_dtype(x.dtype)
    return [x.mean(axis=_spatial_axes(x), keepdims=True, dtype=work).astype(x.dtype, copy=False)]


def _global_max_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    return [x.max(axis=_spatial_axes(x), keepdims=True)]


def _global_lp_pool(ctx: EvalContext, x) -> list:
    require_spatial(ctx, x)
    p = float(ctx.attr("p", 2))
    work = compute_dtype(x.dtype)
    total = (np.abs(x.astype(work, copy=False)) ** p).sum(axis=_spatial_axes(x), keepdims=True)
    return [(total ** (1.0 / p)).astype(x.dtype, copy=False)]


def _unpooled_shape(ctx: EvalContext, x: np.ndarray, output_shape) -> list[int]:
    if output_shape is not None:
        return [int(v) for v in np.asarray(output_shape).reshape(-1)]
    window = _pool_window(ctx, x.ndim - 2, ceil_mode=False)
    shape = list(x.shape[:2])
    for i, size in enumerate(x.shape[2:]):
        begin, end = window.explicit_pads(i)
        shape.append((size - 1) * window.strides[i] + int(window.kernel[i]) - begin - end)
    return shape


def _max_unpool(ctx: EvalContext, x, indices, output_shape=None) -> list:
    # Indices address the flattened output, whatever its size: this is what
    # onnxruntime and PyTorch do (MaxPool's indices index the pooled input,
    # whose shape output_shape restores).  The ONNX reference instead fills
    # the default-size block and pads it, which fails on PyTorch's exports.
    shape = _unpooled_shape(ctx, x, output_shape)
    flat = np.zeros(int(np.prod(shape)), dtype=x.dtype)
    index = indices.reshape(-1).astype(np.int64)
    if index.size and (index.min() < 0 or index.max() >= flat.size):
        ctx.fail(f"an index is out of range for an output of {flat.size} elements")
    flat[index] = x.reshape(-1)
    return [flat.reshape(shape)]


define("MaxPool", infer=_pool_type, evaluate=_max_pool)
define("AveragePool", infer=_pool_type, evaluate=_average_pool)
define("LpPool", infer=_pool_type, evaluate=_lp_pool)
define("GlobalAveragePool", infer=_global_pool_type, evaluate=_global_average_pool)
define("GlobalMaxPool", infer=_global_pool_type, evaluate=_global_max_pool)
define("GlobalLpPool", infer=_global_pool_type, evaluate=_global_lp_pool)
define("MaxUnpool", infer=_unpool_type, evaluate=_max_unpool, params=(2,))
