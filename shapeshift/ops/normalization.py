"""Normalization ops: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LRN, MeanVarianceNormalization and LpNormalization.

All keep the input's shape; the rules only add the few extra outputs
(BatchNormalization's running statistics in training mode, LayerNormalization's
Mean and InvStdDev, whose dtype is ``stash_type`` and whose shape keeps the
leading ``axis`` dims and sets the normalized ones to 1).

Evaluators compute statistics in float32 (float64 for double inputs, or the
``stash_type`` where the op has one) and cast back to the input's dtype, as
onnxruntime does for halves.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.types import TensorType, to_numpy_dtype
from ..symbolic import Expr
from .common import normalize_axes, normalize_axis
from .context import EvalContext, InferContext
from .registry import define
from .window import compute_dtype

# -- shared helpers ---------------------------------------------------------------


def _channel_shaped(param: np.ndarray, rank: int, dtype) -> np.ndarray:
    """A per-channel parameter (C,) shaped to broadcast against (N, C, *spatial).

    A parameter of higher rank (BatchNormalization with spatial=0 before opset
    9) already has the (C, *spatial) shape.
    """
    param = np.asarray(param).astype(dtype, copy=False)
    if param.ndim <= 1:
        return param.reshape((1, -1) + (1,) * (rank - 2))
    return param.reshape((1,) + param.shape)


def _moments(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population) variance over ``axes``, kept as size-1 dims."""
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    return mean, (centered * centered).mean(axis=axes, keepdims=True)


def _check_rank(ctx: InferContext, least: int) -> Optional[tuple]:
    shape = ctx.input_shape(0)
    if shape is not None and len(shape) < least:
        ctx.fail(f"input must have rank >= {least}, got rank {len(shape)}")
    return shape


def _same_as_input_checked(least: int):
    """A type rule: the input's type, after checking the input has rank >= ``least``."""

    def infer(ctx: InferContext) -> list:
        _check_rank(ctx, least)
        return [ctx.input_type(0)]

    return infer


# -- BatchNormalization -------------------------------------------------------------


def _training(ctx) -> bool:
    """Training mode: the attribute from opset 14, extra outputs before it."""
    if ctx.opset >= 14:
        return bool(ctx.attr("training_mode", 0))
    return ctx.num_outputs > 1


def _batch_norm_type(ctx: InferContext) -> list:
    x = _check_rank(ctx, 2)
    dtype = ctx.input_dtype(0)
    result: list = [None if dtype is None else TensorType(dtype, x)]
    if ctx.num_outputs == 1:
        return result
    # Running statistics (opset 14+) or the four training outputs of older
    # opsets: all per channel, typed like the mean input.
    stats_dtype = ctx.input_dtype(3) if ctx.input_dtype(3) is not None else dtype
    channels = x[1] if x is not None else (ctx.input_shape(3) or (ctx.fresh_dim("C"),))[0]
    stats = None if stats_dtype is None else TensorType(stats_dtype, (channels,))
    return result + [stats] * (ctx.num_outputs - 1)


def _batch_norm(ctx: EvalContext, x, scale, bias, mean, var) -> list:
    work = compute_dtype(x.dtype)
    eps = float(ctx.attr("epsilon", 1e-5))
    xs = x.astype(work, copy=False)
    extras: list = []
    if _training(ctx):
        mean, var, extras = _batch_statistics(ctx, xs, mean, var, eps)
    inv_std = 1.0 / np.sqrt(_channel_shaped(var, x.ndim, work) + eps)
    y = (xs - _channel_shaped(mean, x.ndim, work)) * inv_std
    y = y * _channel_shaped(scale, x.ndim, work) + _channel_shaped(bias, x.ndim, work)
    return [y.astype(x.dtype, copy=False)] + extras[: ctx.num_outputs - 1]


def _batch_statistics(ctx: EvalContext, xs: np.ndarray, mean, var, eps: float):
    """Training mode: the batch's mean and variance, and the extra outputs.

    The extras are the running statistics (``input * momentum + batch * (1 -
    momentum)``) and, before opset 14, the batch mean and inverse standard
    deviation (onnxruntime's saved_mean and saved_var).
    """
    axes = (0,) + tuple(range(2, xs.ndim))
    batch_mean, batch_var = (m.reshape(-1) for m in _moments(xs, axes))
    momentum = float(ctx.attr("momentum", 0.9))
    stats_dtype = np.asarray(mean).dtype
    extras = [mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)]
    if ctx.opset < 14:
        extras += [batch_mean, 1.0 / np.sqrt(batch_var + eps)]
    return batch_mean, batch_var, [e.astype(stats_dtype, copy=False) for e in extras]


# -- Instance, Group and Layer normalization ---------------------------------------


def _instance_norm(ctx: EvalContext, x, scale, bias) -> list:
    work = compute_dtype(x.dtype)
    xs = x.astype(work, copy=False)
    mean, var = _moments(xs, tuple(range(2, x.ndim)))
    y = (xs - mean) / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))
    y = y * _channel_shaped(scale, x.ndim, work) + _channel_shaped(bias, x.ndim, work)
    return [y.astype(x.dtype, copy=False)]


def _stash_dtype(ctx, default) -> np.dtype:
    stash = ctx.attr("stash_type")
    return default if stash is None else to_numpy_dtype(int(stash))


def _group_norm(ctx: EvalContext, x, scale, bias) -> list:
    groups = int(ctx.attr("num_groups"))
    n, c = x.shape[:2]
    if groups <= 0 or c % groups:
        ctx.fail(f"num_groups {groups} does not divide the {c} channels")
    work = _stash_dtype(ctx, compute_dtype(x.dtype)) if ctx.opset >= 21 else compute_dtype(x.dtype)
    grouped = x.astype(work, copy=False).reshape(n, groups, -1)
    mean, var = _moments(grouped, (2,))
    normed = ((grouped - mean) / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))).astype(x.dtype)
    affine = compute_dtype(x.dtype)
    scale = np.asarray(scale).astype(affine).reshape(-1)
    bias = np.asarray(bias).astype(affine).reshape(-1)
    if scale.size == groups and groups != c:
        # Opset 18: one scale and bias per group; opset 21: per channel.
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    y = normed.reshape(x.shape).astype(affine)
    y = y * _channel_shaped(scale, x.ndim, affine) + _channel_shaped(bias, x.ndim, affine)
    return [y.astype(x.dtype, copy=False)]


def _group_norm_type(ctx: InferContext) -> list:
    x = _check_rank(ctx, 2)
    groups = ctx.attr("num_groups")
    if groups is None:
        ctx.fail("attribute num_groups is required")
    groups = int(groups)
    channels = None if x is None else x[1]
    if groups <= 0 or (channels is not None and not isinstance(channels, Expr) and channels % groups):
        ctx.fail(f"num_groups {groups} does not divide the {channels} channels")
    return [ctx.input_type(0)]


def _layer_axis(ctx, rank: int) -> int:
    return normalize_axis(int(ctx.attr("axis", -1)), rank, ctx)


def _layer_norm_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    x = ctx.input_shape(0)
    axis = None if x is None else _layer_axis(ctx, len(x))
    result: list = [None if dtype is None else TensorType(dtype, x)]
    # Mean and InvStdDev: stash_type, the leading dims kept, the normalized ones 1.
    stats_dtype = int(ctx.attr("stash_type", 1))
    stats_shape = None if x is None else tuple(x[:axis]) + (1,) * (len(x) - axis)
    return result + [TensorType(stats_dtype, stats_shape)] * (ctx.num_outputs - 1)


def _layer_norm(ctx: EvalContext, x, scale, bias=None) -> list:
    axis = _layer_axis(ctx, x.ndim)
    stash = _stash_dtype(ctx, np.dtype(np.float32))
    xs = x.astype(stash, copy=False)
    mean, var = _moments(xs, tuple(range(axis, x.ndim)))
    inv_std = 1.0 / np.sqrt(var + np.asarray(float(ctx.attr("epsilon", 1e-5)), dtype=stash))
    normed = ((xs - mean) * inv_std).astype(x.dtype, copy=False)
    y = normed * scale
    if bias is not None:
        y = y + bias
    return [y.astype(x.dtype, copy=False), mean, inv_std][: ctx.num_outputs]


# -- LRN, MeanVarianceNormalization, LpNormalization ------------------------------------


def _lrn(ctx: EvalContext, x) -> list:
    size = int(ctx.attr("size"))
    alpha = float(ctx.attr("alpha", 1e-4))
    beta = float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    work = compute_dtype(x.dtype)
    squares = np.square(x.astype(work, copy=False))
    # The window over channels is [c - floor((size-1)/2), c + ceil((size-1)/2)];
    # a cumulative sum over zero-padded channels gives every window at once.
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    widths = [(0, 0), (before + 1, after)] + [(0, 0)] * (x.ndim - 2)
    cumulative = np.cumsum(np.pad(squares, widths), axis=1)
    c = x.shape[1]
    window_sum = cumulative[:, size:size + c] - cumulative[:, :c]
    y = x.astype(work, copy=False) / (bias + (alpha / size) * window_sum) ** beta
    return [y.astype(x.dtype, copy=False)]


def _mvn_axes(ctx, rank: int) -> tuple[int, ...]:
    return tuple(normalize_axes(ctx.attr("axes", [0, 2, 3]), rank, ctx))


def _mvn_type(ctx: InferContext) -> list:
    x = ctx.input_shape(0)
    if x is not None:
        _mvn_axes(ctx, len(x))
    return [ctx.input_type(0)]


def _mvn(ctx: EvalContext, x) -> list:
    axes = _mvn_axes(ctx, x.ndim)
    work = compute_dtype(x.dtype)
    xs = x.astype(work, copy=False)
    # The ONNX function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9).
    mean = xs.mean(axis=axes, keepdims=True)
    variance = (xs * xs).mean(axis=axes, keepdims=True) - mean * mean
    y = (xs - mean) / (np.sqrt(np.maximum(variance, 0)) + work.type(1e-9))
    return [y.astype(x.dtype, copy=False)]


def _lp_norm_type(ctx: InferContext) -> list:
    x = ctx.input_shape(0)
    if x is not None:
        normalize_axis(int(ctx.attr("axis", -1)), len(x), ctx)
    if int(ctx.attr("p", 2)) not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {ctx.attr('p')}")
    return [ctx.input_type(0)]


def _lp_norm(ctx: EvalContext, x) -> list:
    axis = normalize_axis(int(ctx.attr("axis", -1)), x.ndim, ctx)
    work = compute_dtype(x.dtype)
    xs = x.astype(work, copy=False)
    if int(ctx.attr("p", 2)) == 1:
        norm = np.abs(xs).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt((xs * xs).sum(axis=axis, keepdims=True))
    # A zero norm gives zero, not NaN (as the ONNX reference does).
    safe = np.where(norm == 0, 1, norm)
    return [np.where(norm == 0, 0, xs / safe).astype(x.dtype, copy=False)]


def _lrn_type(ctx: InferContext) -> list:
    size = int(ctx.attr("size", 0))
    if size < 1:
        ctx.fail(f"attribute size must be at least 1, got {size}")
    return _same_as_input_checked(2)(ctx)


define("BatchNormalization", infer=_batch_norm_type, evaluate=_batch_norm)
define("InstanceNormalization", infer=_same_as_input_checked(3), evaluate=_instance_norm)
define("LayerNormalization", infer=_layer_norm_type, evaluate=_layer_norm)
define("GroupNormalization", infer=_group_norm_type, evaluate=_group_norm)
define("LRN", infer=_lrn_type, evaluate=_lrn)
define("MeanVarianceNormalization", infer=_mvn_type, evaluate=_mvn)
define("LpNormalization", infer=_lp_norm_type, evaluate=_lp_norm)
