"""Indexing ops: gathers, scatters, and the selections whose sizes depend on data.

Gather-family outputs are built from input shapes alone.  NonZero, Compress
and Unique produce a count nobody knows before run time; their type rules give
it a fresh symbol whose range is bounded by the input size (or compute it
exactly when the input is a constant).  TopK's ``k`` is read from the
attribute (opset < 10) or the ``K`` input, constant or symbolic.

Evaluators are pure NumPy, vectorized with index arrays from ``np.indices``;
indices are range-checked and negative ones wrapped before use so that a bad
index becomes a clear error naming the node, not a NumPy IndexError.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..ir.types import INT64, TensorType
from ..symbolic import DEFAULT_HI, Dim, Expr, bounds, prove_le
from .common import normalize_axis, product, same_as_input, tensor
from .context import EvalContext, InferContext
from .registry import define
from .shape_ops import gather_shape_contents

# -- shared helpers ----------------------------------------------------------------


def _is_int(d: Dim) -> bool:
    return not isinstance(d, Expr)


def _same_dim(a: Dim, b: Dim) -> Dim:
    """Two dims a valid model says are equal: keep the more informative one."""
    return b if isinstance(a, Expr) and _is_int(b) else a


def _size_hi(dims: Sequence[Dim]) -> int:
    """An upper bound on the number of elements of a tensor of shape ``dims``."""
    return min(bounds(product(dims))[1], DEFAULT_HI)


def _wrap_indices(ctx: EvalContext, indices: np.ndarray, dim: int) -> np.ndarray:
    """Indices with negatives counted from the end; out-of-range ones are an error."""
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        bad = indices[(indices < -dim) | (indices >= dim)].reshape(-1)[0]
        ctx.fail(f"index {int(bad)} is out of range for a dimension of size {dim}")
    return np.where(indices < 0, indices + dim, indices)


def _element_index(indices: np.ndarray, axis: int) -> list:
    """Index arrays addressing, per element of ``indices``, its position with ``axis`` replaced.

    This is the addressing shared by GatherElements and ScatterElements: the
    coordinate along ``axis`` comes from ``indices``, the others from the
    element's own position.
    """
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = indices
    return grid


def _check_static_range(ctx: InferContext, index: int, dim: Dim) -> None:
    """Fail early when constant indices are out of range for a static dimension."""
    const = ctx.input_const(index)
    if const is None or not _is_int(dim) or const.size == 0:
        return
    # Indices are mostly a handful of ints: Python's min/max beat NumPy's reductions there.
    if const.size <= 64:
        values = const.reshape(-1).tolist()
        lo, hi = min(values), max(values)
    else:
        lo, hi = const.min(), const.max()
    if lo < -dim or hi >= dim:
        ctx.fail(f"constant indices out of range for a dimension of size {dim}")


# -- Gather ------------------------------------------------------------------------


def _gather_type(ctx: InferContext) -> list:
    dtype, data, indices = ctx.input_dtype(0), ctx.input_shape(0), ctx.input_shape(1)
    if data is not None and len(data) == 0:
        ctx.fail("Gather needs data of rank >= 1")
    # Gather over a shape tensor, e.g. Shape(x)[[0, 2]], keeps its dims as contents.
    ctx.set_contents(0, gather_shape_contents(ctx))
    if data is None or indices is None:
        return [tensor(dtype, None)]
    axis = normalize_axis(ctx.attr("axis", 0), len(data), ctx)
    _check_static_range(ctx, 1, data[axis])
    return [tensor(dtype, data[:axis] + tuple(indices) + data[axis + 1:])]


def _gather(ctx: EvalContext, data, indices):
    axis = normalize_axis(ctx.attr("axis", 0), data.ndim)
    indices = _wrap_indices(ctx, indices, data.shape[axis])
    return [np.take(data, indices, axis=axis)]


# -- GatherElements / ScatterElements / Scatter ------------------------------------


def _gather_elements_type(ctx: InferContext) -> list:
    dtype, data, indices = ctx.input_dtype(0), ctx.input_shape(0), ctx.input_shape(1)
    if data is not None and indices is not None and len(data) != len(indices):
        ctx.fail(f"data has rank {len(data)} but indices rank {len(indices)}")
    if data is not None:
        axis = normalize_axis(ctx.attr("axis", 0), len(data), ctx)
        for d, (n, i) in enumerate(zip(data, indices or ())):
            # Only along the axis may indices be longer: elsewhere an index position reads data
            # at that position (onnxruntime refuses the same; symbolic sizes are checked at run
            # time, codegen/lower/contracts.py).
            if d != axis and isinstance(n, int) and isinstance(i, int) and i > n:
                ctx.fail(f"indices dimension {d} ({i}) exceeds data dimension {d} ({n}); only axis {axis} may "
                         "differ")
    if indices is None:
        if data is None:
            return [tensor(dtype, None)]
        indices = tuple(ctx.fresh_dim("gather") for _ in data)
    return [tensor(dtype, indices)]


def _gather_elements(ctx: EvalContext, data, indices):
    axis = normalize_axis(ctx.attr("axis", 0), data.ndim)
    grid = _element_index(_wrap_indices(ctx, indices, data.shape[axis]), axis)
    return [data[tuple(grid)]]


#: ufuncs applying a scatter reduction in place, duplicates accumulated.
_REDUCE_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(ctx: EvalContext, data: np.ndarray, index: tuple, updates: np.ndarray) -> np.ndarray:
    """A copy of ``data`` with ``updates`` written (or reduced) at ``index``."""
    out = np.array(data, copy=True)
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        out[index] = updates
    elif reduction in _REDUCE_AT:
        _REDUCE_AT[reduction].at(out, index, updates)
    else:
        ctx.fail(f"unknown reduction {reduction!r}")
    return out


def _scatter_elements(ctx: EvalContext, data, indices, updates):
    axis = normalize_axis(ctx.attr("axis", 0), data.ndim)
    if indices.shape != updates.shape:
        ctx.fail(f"indices shape {indices.shape} differs from updates shape {updates.shape}")
    grid = _element_index(_wrap_indices(ctx, indices, data.shape[axis]), axis)
    return [_scatter_into(ctx, data, tuple(grid), updates)]


# -- GatherND / ScatterND ----------------------------------------------------------


def _gather_nd_type(ctx: InferContext) -> list:
    dtype, data, indices = ctx.input_dtype(0), ctx.input_shape(0), ctx.input_shape(1)
    b = ctx.attr("batch_dims", 0)
    if b < 0:
        ctx.fail(f"batch_dims={b}: it counts leading dimensions, so it is 0 or more")
    if data is None or indices is None or not indices or not _is_int(indices[-1]):
        return [tensor(dtype, None)]
    m = indices[-1]
    if b >= min(len(data), len(indices)) or m < 1 or b + m > len(data):
        ctx.fail(f"indices of shape {indices} do not fit data of rank {len(data)} "
                 f"with batch_dims={b}")
    batch = tuple(_same_dim(i, d) for i, d in zip(indices[:b], data[:b]))
    return [tensor(dtype, batch + tuple(indices[b:-1]) + tuple(data[b + m:]))]


def _nd_index(ctx: EvalContext, data_shape: tuple, indices: np.ndarray) -> tuple:
    """Index arrays picking ``data[tuple(indices[..., :])]`` for every index tuple."""
    m = indices.shape[-1]
    if m > len(data_shape):
        ctx.fail(f"index tuples of length {m} exceed data rank {len(data_shape)}")
    return tuple(_wrap_indices(ctx, indices[..., j], data_shape[j]) for j in range(m))


def _gather_nd(ctx: EvalContext, data, indices):
    b = ctx.attr("batch_dims", 0)
    batch_shape = data.shape[:b]
    middle = indices.shape[b:-1]
    # Fold the batch dims into one leading axis addressed by an arange.
    flat_data = data.reshape((-1,) + data.shape[b:]) if b else data[None]
    flat_indices = indices.reshape((-1,) + indices.shape[b:]) if b else indices[None]
    batch = np.arange(flat_data.shape[0]).reshape((-1,) + (1,) * len(middle))
    batch = np.broadcast_to(batch, (flat_data.shape[0],) + middle)
    picked = flat_data[(batch,) + _nd_index(ctx, flat_data.shape[1:], flat_indices)]
    return [picked.reshape(batch_shape + middle + data.shape[b + indices.shape[-1]:])]


def _scatter_nd(ctx: EvalContext, data, indices, updates):
    m = indices.shape[-1]
    expected = indices.shape[:-1] + data.shape[m:]
    if updates.shape != expected:
        ctx.fail(f"updates shape {updates.shape} should be {expected}")
    if m == 0:
        # Each update covers the whole tensor; apply them one after another.
        out = data
        for update in updates.reshape((-1,) + data.shape):
            out = _scatter_into(ctx, out, (slice(None),) * data.ndim, update)
        return [np.array(out, copy=True)]
    return [_scatter_into(ctx, data, _nd_index(ctx, data.shape, indices), updates)]


# -- NonZero -----------------------------------------------------------------------


def _nonzero_type(ctx: InferContext) -> list:
    shape, const = ctx.input_shape(0), ctx.input_const(0)
    if const is not None:
        count: Dim = int(np.count_nonzero(const))
    elif shape is not None:
        count = ctx.fresh_dim("nonzero", 0, _size_hi(shape))
    else:
        count = ctx.fresh_dim("nonzero", 0)
    # A scalar counts as a 1-element vector, as onnxruntime does.
    rank: Dim = max(len(shape), 1) if shape is not None else ctx.fresh_dim("rank", 1)
    return [TensorType(INT64, (rank, count))]


def _nonzero(ctx: EvalContext, x):
    x = np.asarray(x)
    if x.ndim == 0:
        x = x.reshape(1)
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


# -- TopK --------------------------------------------------------------------------


def _topk_k(ctx: InferContext) -> Optional[Dim]:
    if ctx.opset < 10:
        return ctx.attr("k")
    dims = ctx.input_dims(1)
    return dims[0] if dims is not None and len(dims) == 1 else None


def _topk_type(ctx: InferContext) -> list:
    dtype, shape = ctx.input_dtype(0), ctx.input_shape(0)
    k = _topk_k(ctx)
    if _is_int(k) and k is not None and k < 0:
        ctx.fail(f"k must be non-negative, got {k}")
    if shape is None:
        return [tensor(dtype, None), TensorType(INT64, None)]
    if not shape:
        ctx.fail("TopK needs an input of rank >= 1")
    axis = normalize_axis(ctx.attr("axis", -1), len(shape), ctx)
    if k is None:
        k = ctx.fresh_dim("topk", 0, bounds(shape[axis])[1])
    elif _is_int(k) and _is_int(shape[axis]) and k > shape[axis]:
        ctx.fail(f"k={k} exceeds the axis size {shape[axis]}")
    out = shape[:axis] + (k,) + shape[axis + 1:]
    return [tensor(dtype, out), TensorType(INT64, out)]


def _stable_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Sorting permutation along ``axis``; equal values keep ascending index order.

    For descending order the input is flipped, sorted stably ascending, and the
    result flipped back: ties then come out lowest index first, and no value
    is negated (which would break unsigned and bool inputs).
    """
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return np.flip(n - 1 - order, axis)


def _topk(ctx: EvalContext, x, k=None):
    k = ctx.attr("k") if ctx.opset < 10 else int(np.asarray(k).reshape(-1)[0])
    axis = normalize_axis(ctx.attr("axis", -1), x.ndim)
    if not 0 <= k <= x.shape[axis]:
        ctx.fail(f"k={k} is out of range for an axis of size {x.shape[axis]}")
    order = _stable_order(x, axis, bool(ctx.attr("largest", 1)))
    indices = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, indices, axis=axis), indices]


# -- CumSum ------------------------------------------------------------------------


def _cumsum_type(ctx: InferContext) -> list:
    shape, axis = ctx.input_shape(0), ctx.input_dims(1)
    if shape is not None and axis is not None and len(axis) == 1 and _is_int(axis[0]):
        normalize_axis(axis[0], len(shape), ctx)
    return [ctx.input_type(0)]


def _axis_slice(rank: int, axis: int, part: slice) -> tuple:
    return tuple(part if i == axis else slice(None) for i in range(rank))


def _cumsum(ctx: EvalContext, x, axis):
    axis = normalize_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    reverse = bool(ctx.attr("reverse", 0))
    data = np.flip(x, axis) if reverse else x
    total = np.cumsum(data, axis=axis, dtype=x.dtype)
    if ctx.attr("exclusive", 0):
        # Shift by one along the axis: each sum leaves out its own element.
        shifted = np.zeros_like(total)
        shifted[_axis_slice(x.ndim, axis, slice(1, None))] = total[_axis_slice(x.ndim, axis, slice(None, -1))]
        total = shifted
    return [np.flip(total, axis) if reverse else total]


# -- Compress ----------------------------------------------------------------------


def _compress_count(ctx: InferContext, length: Optional[Dim]) -> Dim:
    """How many slices survive: exact for a constant condition when ``length`` permits."""
    cond, cond_shape = ctx.input_const(1), ctx.input_shape(1)
    if cond is not None:
        cond = cond.reshape(-1).astype(bool)
        if length is not None and _is_int(length):
            return int(np.count_nonzero(cond[:length]))
        if length is not None and prove_le(cond.size, length):
            return int(np.count_nonzero(cond))
        return ctx.fresh_dim("compress", 0, int(np.count_nonzero(cond)))
    hi = DEFAULT_HI
    if cond_shape is not None and len(cond_shape) == 1:
        hi = min(hi, bounds(cond_shape[0])[1])
    if length is not None:
        hi = min(hi, bounds(length)[1])
    return ctx.fresh_dim("compress", 0, hi)


def _compress_type(ctx: InferContext) -> list:
    dtype, shape = ctx.input_dtype(0), ctx.input_shape(0)
    axis = ctx.attr("axis")
    if axis is None:
        return [tensor(dtype, (_compress_count(ctx, None if shape is None else product(shape)),))]
    if shape is None:
        return [tensor(dtype, None)]
    axis = normalize_axis(axis, len(shape), ctx)
    return [tensor(dtype, shape[:axis] + (_compress_count(ctx, shape[axis]),) + shape[axis + 1:])]


def _compress(ctx: EvalContext, x, condition):
    axis = ctx.attr("axis")
    length = x.size if axis is None else x.shape[normalize_axis(axis, x.ndim)]
    # A condition longer than the axis is cut to it, as onnxruntime does.
    condition = np.asarray(condition, dtype=bool).reshape(-1)[:length]
    return [np.compress(condition, x, axis=axis)]


# -- ReverseSequence ---------------------------------------------------------------


def _reverse_sequence_axes(rank: int, ctx) -> tuple[int, int]:
    time_axis = normalize_axis(ctx.attr("time_axis", 0), rank, ctx)
    batch_axis = normalize_axis(ctx.attr("batch_axis", 1), rank, ctx)
    if time_axis == batch_axis or time_axis > 1 or batch_axis > 1:
        ctx.fail(f"time_axis and batch_axis must be 0 and 1 in some order, "
                 f"got {time_axis} and {batch_axis}")
    return time_axis, batch_axis


def _reverse_sequence_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is not None:
        if len(shape) < 2:
            ctx.fail("ReverseSequence needs an input of rank >= 2")
        _reverse_sequence_axes(len(shape), ctx)
    return [ctx.input_type(0)]


def _reverse_sequence(ctx: EvalContext, x, sequence_lens):
    time_axis, batch_axis = _reverse_sequence_axes(x.ndim, ctx)
    lens = np.asarray(sequence_lens, dtype=np.int64)
    if lens.shape != (x.shape[batch_axis],) or lens.min(initial=0) < 0 or \
            lens.max(initial=0) > x.shape[time_axis]:
        ctx.fail(f"sequence_lens {lens.tolist()} do not fit input shape {x.shape}")
    grid = list(np.indices(x.shape, sparse=True))
    time = grid[time_axis]
    lens = lens.reshape([-1 if i == batch_axis else 1 for i in range(x.ndim)])
    # Within each batch entry, the first lens[b] steps are read back to front.
    grid[time_axis] = np.where(time < lens, lens - 1 - time, time)
    return [x[tuple(np.broadcast_arrays(*grid))]]


# -- Unique ------------------------------------------------------------------------


def _unique_count(ctx: InferContext, length: Optional[Dim]) -> Dim:
    const = ctx.input_const(0)
    if const is not None:
        return int(_unique(ctx, const)[0].shape[_unique_axis(ctx, const.ndim) or 0])
    if length is None:
        return ctx.fresh_dim("unique", 0)
    lo = 1 if bounds(length)[0] >= 1 else 0
    return ctx.fresh_dim("unique", lo, min(bounds(length)[1], DEFAULT_HI))


def _unique_axis(ctx, rank: int) -> Optional[int]:
    axis = ctx.attr("axis")
    return None if axis is None else normalize_axis(axis, rank, ctx)


def _unique_type(ctx: InferContext) -> list:
    dtype, shape = ctx.input_dtype(0), ctx.input_shape(0)
    axis = None if shape is None else _unique_axis(ctx, len(shape))
    if ctx.attr("axis") is None:
        size = None if shape is None else product(shape)
        count = _unique_count(ctx, size)
        values = tensor(dtype, (count,))
        inverse = (size if size is not None else ctx.fresh_dim("size"),)
    elif shape is None:
        count = _unique_count(ctx, None)
        values = tensor(dtype, None)
        inverse = (ctx.fresh_dim("size"),)
    else:
        count = _unique_count(ctx, shape[axis])
        values = tensor(dtype, shape[:axis] + (count,) + shape[axis + 1:])
        inverse = (shape[axis],)
    types = [values, TensorType(INT64, (count,)), TensorType(INT64, inverse), TensorType(INT64, (count,))]
    return types[:ctx.num_outputs]


def _first_occurrence_order(first, inverse, counts, values, axis):
    """Reorder sorted np.unique results by first occurrence (``sorted=0``)."""
    perm = np.argsort(first, kind="stable")
    rank = np.empty_like(perm)
    rank[perm] = np.arange(perm.size)
    values = np.take(values, perm, axis=axis or 0)
    return first[perm], rank[inverse], counts[perm], values


def _unique(ctx, x):
    axis = _unique_axis(ctx, x.ndim)
    data = x.reshape(-1) if axis is None else x
    values, first, inverse, counts = np.unique(data, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not ctx.attr("sorted", 1):
        first, inverse, counts, values = _first_occurrence_order(first, inverse, counts, values, axis)
    outputs = [values.astype(x.dtype, copy=False)] + [a.astype(np.int64) for a in (first, inverse, counts)]
    return outputs[:ctx.num_outputs]


# -- registrations -----------------------------------------------------------------

define("Gather", infer=_gather_type, evaluate=_gather)
define("GatherElements", infer=_gather_elements_type, evaluate=_gather_elements)
define("GatherND", infer=_gather_nd_type, evaluate=_gather_nd)
define("ScatterElements", infer=same_as_input(0), evaluate=_scatter_elements)
# Scatter (opsets 9-10) is ScatterElements under its old name.
define("Scatter", infer=same_as_input(0), evaluate=_scatter_elements, since=9)
define("ScatterND", infer=same_as_input(0), evaluate=_scatter_nd)
define("NonZero", infer=_nonzero_type, evaluate=_nonzero)
define("TopK", infer=_topk_type, evaluate=_topk, params=(1,), single=(1,))
define("CumSum", infer=_cumsum_type, evaluate=_cumsum, params=(1,), single=(1,))
define("Compress", infer=_compress_type, evaluate=_compress)
define("ReverseSequence", infer=_reverse_sequence_type, evaluate=_reverse_sequence)
define("Unique", infer=_unique_type, evaluate=_unique)
