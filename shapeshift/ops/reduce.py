"""Reductions: the Reduce* family and ArgMax/ArgMin.

The Reduce ops take their axes from an attribute in early opsets and from an
optional second input later (ReduceSum from opset 13, the others from 18); the
input form adds ``noop_with_empty_axes``.  With no axes the whole tensor is
reduced.  A reduction over an empty set gives the operation's identity
(0 for sums, 1 for products, -inf / the dtype's minimum for max, ...).

ReduceSum and ReduceProd of a small integer vector whose contents are known
as dims (e.g. ReduceProd(Shape(x))) record their symbolic result.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..ir.types import INT64, INT_TYPES, TensorType
from ..symbolic import Dim, Expr, add_all, bounds
from .common import Shape, normalize_axes, normalize_axis, product, tensor
from .context import EvalContext, InferContext
from .registry import define

#: A reducer: (data, axes, keepdims) -> reduced array, any dtype (cast after).
Reducer = Callable[[np.ndarray, tuple, bool], np.ndarray]


def _axes_from_input(op_type: str, opset: int) -> bool:
    """Whether this op at this opset reads its axes from input 1."""
    return opset >= (13 if op_type == "ReduceSum" else 18)


# -- type rule --------------------------------------------------------------------


def _known_axes(ctx: InferContext) -> tuple[bool, Optional[list[int]]]:
    """(known, axes): axes as given (None or empty: none given); known=False if unknown."""
    if not _axes_from_input(ctx.node.op_type, ctx.opset):
        axes = ctx.attr("axes")
        return True, None if axes is None else [int(a) for a in axes]
    if not ctx.has_input(1):
        return True, None
    dims = ctx.input_dims(1)
    if dims is not None and all(not isinstance(d, Expr) for d in dims):
        return True, [int(d) for d in dims]
    axes_shape = ctx.input_shape(1)
    if axes_shape == (0,):
        return True, []
    return False, None


def _reduced_shape(ctx: InferContext, shape: tuple, axes: Optional[list[int]], keepdims: bool) -> tuple:
    """The output shape for known axes (None/empty meaning every axis)."""
    if not axes:
        chosen = set(range(len(shape)))
    else:
        chosen = set(normalize_axes(axes, len(shape), ctx))
    if not keepdims:
        return tuple(d for i, d in enumerate(shape) if i not in chosen)
    return tuple(1 if i in chosen else d for i, d in enumerate(shape))


def _either_or_one(ctx: InferContext, dim: Dim) -> Dim:
    """A dim that is either ``dim`` (not reduced) or 1 (reduced, kept)."""
    if not isinstance(dim, Expr) and dim == 1:
        return 1
    lo, hi = bounds(dim)
    return ctx.fresh_dim("reduce", min(lo, 1), max(hi, 1))


def _unknown_axes_shape(ctx: InferContext, shape: tuple, keepdims: bool) -> Shape:
    """Degrade for axes whose contents are unknown: rank is known at best."""
    if keepdims:
        return tuple(_either_or_one(ctx, d) for d in shape)
    axes_shape = ctx.input_shape(1)
    if axes_shape is None or len(axes_shape) != 1 or isinstance(axes_shape[0], Expr):
        return None
    if ctx.attr("noop_with_empty_axes", 0):
        return None  # empty axes would keep the rank, others drop dims
    # The kept dims are some of the input's, so they lie within its dims' bounds.
    lo = min((bounds(d)[0] for d in shape), default=0)
    hi = max((bounds(d)[1] for d in shape), default=0)
    return tuple(ctx.fresh_dim("reduce", lo, hi) for _ in range(max(len(shape) - axes_shape[0], 0)))


def _reduce_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    if shape is None:
        return [tensor(dtype, None)]
    keepdims = bool(ctx.attr("keepdims", 1))
    known, axes = _known_axes(ctx)
    if not known:
        return [tensor(dtype, _unknown_axes_shape(ctx, tuple(shape), keepdims))]
    if not axes and _axes_from_input(ctx.node.op_type, ctx.opset) and ctx.attr("noop_with_empty_axes", 0):
        _track_contents(ctx, shape, noop=True)
        return [tensor(dtype, shape)]
    out = _reduced_shape(ctx, tuple(shape), axes, keepdims)
    _track_contents(ctx, shape, noop=False)
    return [tensor(dtype, out)]


def _track_contents(ctx: InferContext, shape: tuple, noop: bool) -> None:
    """Sum/product of a known 0-D/1-D integer tensor, as a dim."""
    if ctx.node.op_type not in ("ReduceSum", "ReduceProd") or ctx.input_dtype(0) not in INT_TYPES:
        return
    if len(shape) > 1:
        return
    contents = ctx.input_dims(0)
    if contents is None:
        return
    if noop or len(shape) == 0:
        ctx.set_contents(0, contents)
        return
    if ctx.node.op_type == "ReduceProd":
        ctx.set_contents(0, (product(contents),))
    else:
        ctx.set_contents(0, (add_all(contents),))


# -- evaluation -------------------------------------------------------------------


def _widen(x: np.ndarray) -> np.ndarray:
    """Low-precision floats are reduced in float32, as onnxruntime accumulates them."""
    if x.dtype == np.float16 or x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x


def _as_float(x: np.ndarray) -> np.ndarray:
    """Reductions that need real arithmetic (log, sqrt) see integers as float64."""
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _sum(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _sum_square(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return _sum(x * x, axes, keepdims)


def _l1(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return _sum(np.abs(x), axes, keepdims)


def _l2(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.sqrt(_as_float(_sum_square(x, axes, keepdims)))


def _mean(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    # ONNX leaves the mean of an empty set undefined; onnxruntime gives 0, as the
    # sum divided by at least 1 does here.
    count = max(int(np.prod([x.shape[a] for a in axes], dtype=np.int64)), 1)
    total = _sum(x, axes, keepdims)
    if x.dtype.kind in "iu":
        # onnxruntime divides integer sums in C arithmetic, rounding toward zero.
        quotient = np.abs(total) // count
        return np.where(total < 0, -quotient, quotient)
    return total / x.dtype.type(count)


def _log_sum(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.log(_as_float(_sum(x, axes, keepdims)))


def _log_sum_exp(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    if x.dtype.kind in "iu":
        return _integer_log_sum_exp(x, axes, keepdims)
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axes, keepdims=keepdims))
    peak = np.max(x, axis=axes, keepdims=True)
    # An all -inf (or inf) slice would give NaN when shifted by its own peak.
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(x - peak), axis=axes, keepdims=True)
    result = np.log(total) + peak
    return result if keepdims else np.squeeze(result, axis=axes)


def _integer_log_sum_exp(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    """onnxruntime's integer LogSumExp: exp terms truncated to the integer type and summed,
    then log(sum) + max in floating point, truncated toward zero once at the end."""
    lowest = np.iinfo(x.dtype).min
    peak = np.max(x, axis=axes, keepdims=True, initial=lowest)
    total = np.sum(np.exp(x - peak).astype(x.dtype), axis=axes, keepdims=True)
    logs = np.log(np.maximum(total, 1).astype(np.float64)) + peak
    # An empty slice has no peak: its log-sum is -inf, the type's minimum.
    result = np.where(total > 0, np.trunc(logs), lowest).astype(x.dtype)
    return result if keepdims else np.squeeze(result, axis=axes)


def _prod(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _lowest(dtype: np.dtype):
    if dtype.kind == "b":
        return False
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype: np.dtype):
    if dtype.kind == "b":
        return True
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _max(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keepdims, initial=_lowest(x.dtype))


def _min(x: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keepdims, initial=_highest(x.dtype))


def _eval_axes(ctx: EvalContext, axes_input: Optional[np.ndarray]) -> Optional[list[int]]:
    if _axes_from_input(ctx.node.op_type, ctx.opset):
        return None if axes_input is None else [int(a) for a in np.asarray(axes_input).reshape(-1)]
    axes = ctx.attr("axes")
    return None if axes is None else [int(a) for a in axes]


def _chosen_axes(ctx: EvalContext, axes: Optional[list[int]], rank: int) -> tuple:
    """The sorted axes to reduce; none given means all of them."""
    if not axes:
        return tuple(range(rank))
    if rank == 0:
        return ()
    try:
        return tuple(sorted(set(normalize_axes(axes, rank))))
    except ValueError as exc:
        ctx.fail(str(exc))
        raise


def _reduce_evaluator(reducer: Reducer):
    def evaluate(ctx: EvalContext, data: np.ndarray, axes_input: Optional[np.ndarray] = None) -> list:
        axes = _eval_axes(ctx, axes_input)
        if not axes and _axes_from_input(ctx.node.op_type, ctx.opset) and ctx.attr("noop_with_empty_axes", 0):
            # Nothing is reduced, but the elementwise part still applies
            # (ReduceSumSquare squares, ReduceLogSum takes the log, ...).
            chosen: tuple = ()
        else:
            chosen = _chosen_axes(ctx, axes, data.ndim)
        with np.errstate(all="ignore"):
            result = reducer(_widen(data), chosen, bool(ctx.attr("keepdims", 1)))
            return [np.asarray(result).astype(data.dtype)]

    return evaluate


_REDUCERS: dict[str, Reducer] = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": _sum_square,
}

for _op, _reducer in _REDUCERS.items():
    define(_op, infer=_reduce_type, evaluate=_reduce_evaluator(_reducer), params=(1,))

# -- ArgMax / ArgMin --------------------------------------------------------------


def _arg_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is None:
        return [TensorType(INT64, None)]
    if len(shape) == 0:
        ctx.fail("ArgMax/ArgMin need rank >= 1")
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape), ctx)
    if ctx.attr("keepdims", 1):
        out = tuple(1 if i == axis else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i != axis)
    return [TensorType(INT64, out)]


def _arg_evaluator(pick: Callable[..., np.ndarray]):
    def evaluate(ctx: EvalContext, data: np.ndarray) -> list:
        try:
            axis = normalize_axis(int(ctx.attr("axis", 0)), data.ndim)
        except ValueError as exc:
            ctx.fail(str(exc))
        if data.shape[axis] == 0:
            ctx.fail(f"cannot take {ctx.node.op_type} over an empty axis")
        if ctx.attr("select_last_index", 0):
            # The last extreme is the first one of the reversed axis.
            flipped = pick(np.flip(data, axis=axis), axis=axis)
            index = data.shape[axis] - 1 - flipped
        else:
            index = pick(data, axis=axis)
        if ctx.attr("keepdims", 1):
            index = np.expand_dims(index, axis)
        return [np.asarray(index, dtype=np.int64)]

    return evaluate


define("ArgMax", infer=_arg_type, evaluate=_arg_evaluator(np.argmax))
define("ArgMin", infer=_arg_type, evaluate=_arg_evaluator(np.argmin))
