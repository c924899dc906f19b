"""Ops that make tensors from parameters: Constant, ConstantOfShape, Range, EyeLike, OneHot.

Their output shapes come from attributes or from the *contents* of small
inputs (a shape, a depth, a range's bounds), so the type rules read those with
``ctx.input_dims``; integer outputs small enough get their contents recorded.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir.types import DOUBLE, FLOAT, TensorType, from_numpy_dtype, tensor_type_of, to_numpy_dtype
from ..symbolic import Dim, Expr, ceildiv, maximum, sub
from .common import normalize_axis, product, tensor
from .context import MAX_CONTENTS, InferContext
from .registry import define
from .shape_ops import fresh_shape, param_length, static_ints

# -- Constant ---------------------------------------------------------------------

_SCALAR_ATTRS = {"value_float": np.float32, "value_int": np.int64, "value_string": object}
_VECTOR_ATTRS = {"value_floats": np.float32, "value_ints": np.int64, "value_strings": object}


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse_value attribute as a dense array."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates rather than flat offsets
        indices = np.ravel_multi_index(tuple(indices.T), dims)
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(dims)


def constant_value(ctx) -> np.ndarray:
    """The tensor a Constant node holds, whichever attribute carries it."""
    if ctx.has_attr("value"):
        return np.asarray(ctx.attr("value"))
    for name, dtype in _SCALAR_ATTRS.items():
        if ctx.has_attr(name):
            return np.array(ctx.attr(name), dtype=dtype)
    for name, dtype in _VECTOR_ATTRS.items():
        if ctx.has_attr(name):
            return np.array(list(ctx.attr(name)), dtype=dtype).reshape(-1)
    if ctx.has_attr("sparse_value"):
        return _dense(ctx.attr("sparse_value"))
    ctx.fail("Constant has no value attribute")


def _record_int_contents(ctx: InferContext, array: np.ndarray) -> None:
    if array.dtype.kind in "iu" and array.ndim <= 1 and array.size <= MAX_CONTENTS:
        ctx.set_contents(0, tuple(array.reshape(-1).tolist()))  # Python ints, in one call


def _constant_type(ctx: InferContext) -> list:
    value = constant_value(ctx)
    _record_int_contents(ctx, value)
    return [tensor_type_of(value)]


def _constant(ctx):
    return [constant_value(ctx)]


define("Constant", infer=_constant_type, evaluate=_constant)

# -- ConstantOfShape -------------------------------------------------------------------


def _fill_value(ctx) -> np.ndarray:
    value = ctx.attr("value")
    if value is None:
        return np.zeros((), dtype=np.float32)
    return np.asarray(value).reshape(-1)[:1].reshape(())


def _constant_of_shape_type(ctx: InferContext) -> list:
    fill = _fill_value(ctx)
    dtype = from_numpy_dtype(fill.dtype)
    dims = ctx.input_dims(0)
    if dims is None:
        return [tensor(dtype, fresh_shape(ctx, param_length(ctx, 0), "fill"))]
    static = static_ints(dims)
    if static is not None and any(d < 0 for d in static):
        ctx.fail(f"negative dimension in shape {static}")
    count = product(static) if static is not None else None
    if len(dims) <= 1 and count is not None and count <= MAX_CONTENTS and fill.dtype.kind in "iu":
        ctx.set_contents(0, (int(fill),) * count)
    return [TensorType(dtype, tuple(dims))]


def _constant_of_shape(ctx, shape):
    fill = _fill_value(ctx)
    return [np.full(tuple(int(d) for d in shape.reshape(-1)), fill, dtype=fill.dtype)]


define("ConstantOfShape", infer=_constant_of_shape_type, evaluate=_constant_of_shape, params=(0,))

# -- Range -----------------------------------------------------------------------------


def _scalar(ctx: InferContext, index: int):
    """A scalar input's value: an int or Expr when integral, a float, or None."""
    dims = ctx.input_dims(index)
    if dims is not None and len(dims) == 1:
        return dims[0]
    const = ctx.input_const(index)
    if const is not None and const.size == 1:
        return const.reshape(-1)[0]
    return None


def _integral(value) -> bool:
    return isinstance(value, (int, np.integer, Expr)) and not isinstance(value, bool)


# Integers of at most this magnitude are exact in each float type.
EXACT_INTEGERS = {FLOAT: 1 << 24, DOUBLE: 1 << 53}


def whole_number(value) -> Optional[int]:
    """A float scalar's value as an int when it is a whole number, else None."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def _range_count(start, limit, delta) -> Dim:
    """max(ceil((limit - start) / delta), 0), symbolically for integer inputs, and for a
    float Range whose start and delta are whole numbers and whose limit is a dim (a limit
    parameter, passes/simplify/rules.py ``range_of_cast_integer``): there the count is the
    integer one, which codegen/lower/contracts.py makes sure of at run time."""
    if isinstance(limit, Expr) and not _integral(start):
        start, delta = whole_number(start), whole_number(delta)
        return maximum(ceildiv(sub(limit, start), delta), 0)
    if not all(_integral(v) for v in (start, limit, delta)):
        # The span is taken in the input type, as onnxruntime does, then divided in double.
        dtype = np.asarray(start).dtype
        span = np.asarray(limit, dtype) - np.asarray(start, dtype)
        return max(math.ceil(float(span) / float(delta)), 0)
    start, limit, delta = (v if isinstance(v, Expr) else int(v) for v in (start, limit, delta))
    return maximum(ceildiv(sub(limit, start), delta), 0)


def _range_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    start, limit, delta = (_scalar(ctx, i) for i in range(3))
    if start is None or limit is None or delta is None or isinstance(delta, Expr):
        return [tensor(dtype, (ctx.fresh_dim("range"),))]
    if delta == 0:
        ctx.fail("Range delta cannot be 0")
    count = _range_count(start, limit, delta)
    ends = static_ints([start, limit]) if all(_integral(v) for v in (start, limit, delta)) else None
    if ends is not None and not isinstance(count, Expr) and count <= MAX_CONTENTS:
        ctx.set_contents(0, tuple(range(ends[0], ends[1], int(delta))))
    return [tensor(dtype, (count,))]


def _range(ctx, start, limit, delta):
    dtype = np.asarray(start).dtype
    start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
    if delta == 0:
        ctx.fail("Range delta cannot be 0")
    count = _range_count(start, limit, delta)
    if dtype.kind in "iu":
        return [(int(start) + np.arange(count, dtype=np.int64) * int(delta)).astype(dtype)]
    return [(start + np.arange(count, dtype=dtype) * delta).astype(dtype)]


define("Range", infer=_range_type, evaluate=_range, params=(0, 1, 2), single=(0, 1, 2))

# -- EyeLike -------------------------------------------------------------------------------


def _eye_dtype(ctx, input_dtype: Optional[int]) -> Optional[int]:
    return int(ctx.attr("dtype")) if ctx.has_attr("dtype") else input_dtype


def _eye_like_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is not None and len(shape) != 2:
        ctx.fail(f"EyeLike needs a 2-D input, got rank {len(shape)}")
    return [tensor(_eye_dtype(ctx, ctx.input_dtype(0)), shape if shape is not None else fresh_shape(ctx, 2, "eye"))]


def _eye_like(ctx, x):
    dtype = to_numpy_dtype(_eye_dtype(ctx, from_numpy_dtype(x.dtype)))
    return [np.eye(x.shape[0], x.shape[1], k=int(ctx.attr("k", 0)), dtype=dtype)]


define("EyeLike", infer=_eye_like_type, evaluate=_eye_like)

# -- OneHot ----------------------------------------------------------------------------------


def _depth(ctx: InferContext) -> Optional[Dim]:
    value = _scalar(ctx, 1)
    if value is None or isinstance(value, Expr):
        return value
    return int(value)


def _one_hot_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(2)
    shape = ctx.input_shape(0)
    if shape is None:
        return [tensor(dtype, None)]
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(shape) + 1, ctx)
    depth = _depth(ctx)
    if depth is None:
        depth = ctx.fresh_dim("depth")
    elif not isinstance(depth, Expr) and depth < 1:
        ctx.fail(f"depth must be positive, got {depth}")
    return [tensor(dtype, shape[:axis] + (depth,) + shape[axis:])]


def _one_hot(ctx, indices, depth, values):
    depth = int(np.asarray(depth).reshape(-1)[0])
    axis = normalize_axis(int(ctx.attr("axis", -1)), indices.ndim + 1)
    positions = indices.astype(np.int64)
    positions = np.where(positions < 0, positions + depth, positions)
    classes = np.arange(depth).reshape((-1,) + (1,) * (indices.ndim - axis))
    hot = np.expand_dims(positions, axis) == classes
    off, on = values.reshape(-1)[:2]
    return [np.where(hot, on, off).astype(values.dtype)]


define("OneHot", infer=_one_hot_type, evaluate=_one_hot, params=(1,), single=(1,))
