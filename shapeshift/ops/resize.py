"""Resize and Upsample: output-shape rules and a separable NumPy evaluator.

Every interpolation mode ONNX defines is separable, so the evaluator resizes
one axis at a time.  Along an axis each output position ``y`` maps to a
source coordinate ``x`` (the coordinate transformation mode), and from ``x``
to a few input taps with weights (the interpolation mode); the taps are
gathered with ``np.take`` and summed, vectorized over all other axes.  This
follows the ONNX reference: edge-clamped taps, ``exclude_outside``
renormalization, and the antialias filters stretched by ``1/scale``.

Versions: Upsample-7 (scales attribute), Upsample-9 and Resize-10 (scales
input, asymmetric coordinates, onnxruntime's legacy nearest rounding),
Resize-11+ (roi/scales/sizes inputs and all attributes), Resize-18+ (axes,
antialias, keep_aspect_ratio_policy).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from ..symbolic import DEFAULT_HI, Dim, Expr, bounds, floordiv
from .common import normalize_axes, tensor
from .context import EvalContext, InferContext
from .registry import define

#: Largest denominator of a (dyadic) scale for which floor(dim * scale) is
#: kept as an exact floordiv expression instead of a fresh dimension.
_MAX_EXACT_DENOMINATOR = 16


@dataclass(frozen=True)
class _Spec:
    """The attributes of one Resize/Upsample node, normalized across versions."""

    mode: str
    coordinate_mode: str
    nearest_mode: str
    cubic_a: float
    exclude_outside: bool
    extrapolation_value: float
    antialias: bool
    axes: Optional[tuple[int, ...]]
    policy: str


_MODES = ("nearest", "linear", "cubic")
_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                     "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _spec(ctx) -> _Spec:
    mode = ctx.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode  # Upsample-1 spelling
    modern = ctx.node.op_type == "Resize" and ctx.opset >= 11
    new = ctx.node.op_type == "Resize" and ctx.opset >= 18
    axes = ctx.attr("axes", None) if new else None
    spec = _Spec(
        mode=mode,
        # Before Resize-11, coordinates were asymmetric and nearest rounding was
        # onnxruntime's "simple" rule (see _nearest_index).
        coordinate_mode=ctx.attr("coordinate_transformation_mode", "half_pixel") if modern else "asymmetric",
        nearest_mode=ctx.attr("nearest_mode", "round_prefer_floor") if modern else "simple",
        cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
        antialias=bool(ctx.attr("antialias", 0)) if new else False,
        axes=None if axes is None else tuple(int(a) for a in axes),
        policy=ctx.attr("keep_aspect_ratio_policy", "stretch") if new else "stretch",
    )
    for value, allowed, name in [(spec.mode, _MODES, "mode"),
                                 (spec.coordinate_mode, _COORDINATE_MODES, "coordinate_transformation_mode"),
                                 (spec.nearest_mode, _NEAREST_MODES, "nearest_mode"),
                                 (spec.policy, _POLICIES, "keep_aspect_ratio_policy")]:
        if value not in allowed:
            ctx.fail(f"unsupported {name} {value!r}")
    return spec


def _input_positions(ctx) -> dict[str, int]:
    """Where roi/scales/sizes sit in this op version's inputs (absent: not at all)."""
    if ctx.node.op_type == "Resize" and ctx.opset >= 11:
        return {"roi": 1, "scales": 2, "sizes": 3}
    if ctx.node.op_type == "Upsample" and ctx.opset < 9:
        return {}
    return {"scales": 1}


# -- type rule -------------------------------------------------------------------


def _given(ctx: InferContext, index: Optional[int]) -> bool:
    """Whether an optional input is present and not an empty placeholder tensor."""
    if index is None or not ctx.has_input(index):
        return False
    const = ctx.input_const(index)
    if const is not None:
        return const.size > 0
    shape = ctx.input_shape(index)
    return not (shape is not None and len(shape) == 1 and not isinstance(shape[0], Expr) and shape[0] == 0)


def _scaled_dim(ctx: InferContext, dim: Dim, scale: float) -> Dim:
    """floor(dim * scale), exact when the scale allows it, else a fresh dim."""
    if not isinstance(dim, Expr):
        return _scaled_size(dim, scale)
    if scale.is_integer():
        return dim * int(scale)
    # A float32 scale is a dyadic rational num/2^k, so floor(dim * scale) is
    # exactly floordiv(dim * num, 2^k); keep it when the fraction is small.
    frac = Fraction(scale)
    if frac.denominator <= _MAX_EXACT_DENOMINATOR and frac.numerator < 2**20:
        return floordiv(dim * frac.numerator, frac.denominator)
    lo, hi = bounds(dim)
    return ctx.fresh_dim("resize", int(math.floor(lo * scale)), min(int(math.ceil(hi * scale)), DEFAULT_HI))


def _axes(ctx: InferContext, spec: _Spec, rank: int) -> list[int]:
    if spec.axes is None:
        return list(range(rank))
    return normalize_axes(spec.axes, rank, ctx)


def _shape_from_sizes(ctx: InferContext, shape: tuple, axes: list[int], spec: _Spec, index: int) -> list:
    out = list(shape)
    sizes = ctx.input_dims(index)
    if sizes is None:
        for a in axes:
            out[a] = ctx.fresh_dim("resize")
        return out
    if len(sizes) != len(axes):
        ctx.fail(f"sizes has {len(sizes)} entries for {len(axes)} resized axes")
    if spec.policy == "stretch":
        for a, s in zip(axes, sizes):
            out[a] = s
        return out
    static = all(not isinstance(d, Expr) for d in list(sizes) + [shape[a] for a in axes])
    if not static:
        for a in axes:
            out[a] = ctx.fresh_dim("resize")
        return out
    sizes_full, _ = _apply_aspect_policy(spec.policy, [int(d) for d in shape], axes,
                                         [int(s) for s in sizes])
    return sizes_full


def _shape_from_scales(ctx: InferContext, shape: tuple, axes: list[int], index: Optional[int]) -> list:
    out = list(shape)
    if index is None:
        scales = ctx.attr("scales", None)
    else:
        const = ctx.input_const(index)
        scales = None if const is None else const.reshape(-1).tolist()
    if scales is None:
        for a in axes:
            out[a] = ctx.fresh_dim("resize")
        return out
    if len(scales) != len(axes):
        ctx.fail(f"scales has {len(scales)} entries for {len(axes)} resized axes")
    if any(not float(s) > 0 for s in scales):  # onnxruntime refuses them too
        ctx.fail(f"scales must be positive, got {list(scales)}")
    for a, s in zip(axes, scales):
        out[a] = _scaled_dim(ctx, shape[a], float(s))
    return out


def _resize_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    if dtype is None or shape is None:
        return [tensor(dtype, None)]
    spec = _spec(ctx)
    axes = _axes(ctx, spec, len(shape))
    positions = _input_positions(ctx)
    if _given(ctx, positions.get("sizes")):
        return [tensor(dtype, _shape_from_sizes(ctx, shape, axes, spec, positions["sizes"]))]
    if "scales" in positions and not ctx.has_input(positions["scales"]):
        ctx.fail("either scales or sizes must be given")
    return [tensor(dtype, _shape_from_scales(ctx, shape, axes, positions.get("scales")))]


# -- plan: output sizes, scales and roi per axis ---------------------------------


def _scaled_size(size: int, scale: float) -> int:
    """floor(size * scale) as onnxruntime computes it: a float32 product.

    (The Python reference uses float64 and can differ by one when the float32
    scale is just below a fraction, e.g. 5 * 1.4f gives 7 here, 6 there.)
    """
    return int(math.floor(np.float32(size) * np.float32(scale)))


def _apply_aspect_policy(policy: str, in_shape: list[int], axes: list[int],
                         sizes: Sequence[int]) -> tuple[list[int], list[float]]:
    """Full output shape and per-axis scales for ``sizes`` under a policy."""
    out = list(in_shape)
    scales = [1.0] * len(in_shape)
    for a, s in zip(axes, sizes):
        out[a] = int(s)
        scales[a] = float(np.float32(s) / np.float32(in_shape[a])) if in_shape[a] else 1.0
    if policy == "stretch":
        return out, scales
    if policy not in ("not_larger", "not_smaller"):
        raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
    pick = min if policy == "not_larger" else max
    scale = pick(scales[a] for a in axes)
    for a in axes:
        scales[a] = scale
        out[a] = int(math.floor(np.float32(scale) * np.float32(in_shape[a]) + 0.5))  # round half up
    return out, scales


@dataclass
class _Plan:
    out_shape: list[int]
    scales: list[float]
    roi: list[tuple[float, float]]  # (start, end) per axis
    axes: list[int]
    lengths: list[float]  # the spec's length_resized per axis


def _plan(ctx: EvalContext, spec: _Spec, in_shape: tuple, roi, scales, sizes) -> _Plan:
    rank = len(in_shape)
    axes = list(range(rank)) if spec.axes is None else normalize_axes(spec.axes, rank)
    roi_pairs = [(0.0, 1.0)] * rank
    if roi is not None and roi.size:
        roi = roi.astype(np.float64).reshape(-1)
        n = len(axes)
        if roi.size != 2 * n:
            ctx.fail(f"roi has {roi.size} entries, expected {2 * n}")
        for i, a in enumerate(axes):
            roi_pairs[a] = (float(roi[i]), float(roi[n + i]))
    if sizes is not None and sizes.size:
        sizes = sizes.reshape(-1)
        if sizes.size != len(axes):
            ctx.fail(f"sizes has {sizes.size} entries for {len(axes)} resized axes")
        out, full_scales = _apply_aspect_policy(spec.policy, list(in_shape), axes, [int(s) for s in sizes])
        if spec.policy == "stretch":
            lengths = [float(n) for n in out]
        else:
            lengths = [s * n for s, n in zip(full_scales, in_shape)]
        return _Plan(out, full_scales, roi_pairs, axes, lengths)
    if scales is None or not np.size(scales):
        ctx.fail("either scales or sizes must be given")
    scales = np.asarray(scales, dtype=np.float32).reshape(-1)
    if scales.size != len(axes):
        ctx.fail(f"scales has {scales.size} entries for {len(axes)} resized axes")
    if not np.all(scales > 0):  # a 0 or negative scale gave an empty output; onnxruntime refuses it
        ctx.fail(f"scales must be positive, got {scales.tolist()}")
    full_scales = [1.0] * rank
    out = list(in_shape)
    for a, s in zip(axes, scales):
        full_scales[a] = float(s)
        out[a] = _scaled_size(in_shape[a], float(s))
    lengths = [s * n for s, n in zip(full_scales, in_shape)]
    return _Plan(out, full_scales, roi_pairs, axes, lengths)


# -- one axis --------------------------------------------------------------------


def _source_coords(spec: _Spec, out_len: int, in_len: int, scale: float, length: float,
                   roi: tuple[float, float]) -> np.ndarray:
    """The input coordinate each output position samples.

    Computed in float32 in onnxruntime's order of operations, because nearest
    rounding and the tf_crop_and_resize bounds test are sensitive to the last
    bit.  ``length`` is the spec's length_resized: ``scale * in_len``, which
    is fractional when the output size came from a non-integral scale (there
    onnxruntime uses the integer output size instead, and differs from the
    spec for align_corners and tf_crop_and_resize).
    """
    f = np.float32
    y = np.arange(out_len, dtype=f)
    scale_, length_, in_ = f(scale), f(length), f(in_len)
    half = f(0.5)
    mode = spec.coordinate_mode
    if mode == "half_pixel":
        return (y + half) / scale_ - half
    if mode == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale_ * in_)
        offset = in_ / f(2) * (f(1) - adjustment)
        return (np.float64(offset) + (y.astype(np.float64) + 0.5) / np.float64(scale_) - 0.5).astype(f)
    # pytorch_half_pixel's and tf_crop_and_resize's test of length_resized > 1 is onnxruntime's
    # on the output size: a scale of 0.5 on 3 pixels (length 1.5, one output) samples 0, and
    # the crop's middle, not the formula's first position (found by a fuzz campaign).
    if mode == "pytorch_half_pixel":
        return (y + half) / scale_ - half if out_len > 1 else np.zeros(out_len, f)
    if mode == "align_corners":
        return y * (in_ - f(1)) / (length_ - f(1)) if length != 1 else np.zeros(out_len, f)
    if mode == "asymmetric":
        return y / scale_
    if mode == "tf_half_pixel_for_nn":
        return (y + half) / scale_
    if mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_len > 1:
            return start * (in_ - f(1)) + (y * (end - start) * (in_ - f(1))) / (length_ - f(1))
        return np.full(out_len, 0.5 * (float(start) + float(end)) * (in_len - 1), dtype=f)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(x: np.ndarray, nearest_mode: str, scale: float) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        idx = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        idx = np.floor(x)
    elif nearest_mode == "ceil":
        idx = np.ceil(x)
    elif nearest_mode == "simple":
        # onnxruntime's rule for Upsample and Resize-10: ceil when downsampling.
        idx = np.ceil(x) if scale < 1 else np.floor(x)
    else:
        raise ValueError(f"unknown nearest_mode {nearest_mode!r}")
    return idx.astype(np.int64)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    inner = ((a + 2) * d - (a + 3)) * d * d + 1
    outer = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, inner, np.where(d < 2, outer, 0.0))


def _taps(spec: _Spec, x: np.ndarray, scale: float, in_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Input indices and weights, each [out, n], for linear or cubic modes."""
    # The reference measures the fraction from the tap on the left and, for an
    # integer x, takes x - 1 as that tap (ratio 1): base = ceil(x) - 1.
    base = np.ceil(x) - 1
    ratio = x - base
    support = 1 if spec.mode == "linear" else 2
    stretch = min(scale, 1.0) if spec.antialias else 1.0
    start = int(math.floor(-support / stretch)) + 1
    offsets = np.arange(start, 1 - start + 1)
    dist = (offsets[None, :] - ratio[:, None]) * stretch
    if spec.mode == "linear":
        weights = np.clip(1 - np.abs(dist), 0, 1)
    elif spec.mode == "cubic":
        weights = _cubic_kernel(dist, spec.cubic_a)
    else:
        raise ValueError(f"unknown mode {spec.mode!r}")
    if spec.antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    index = base.astype(np.int64)[:, None] + offsets[None, :]
    if spec.exclude_outside:
        weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, in_len - 1), weights


def _is_identity(plan: _Plan, spec: _Spec, axis: int, in_len: int) -> bool:
    trivial_roi = spec.coordinate_mode != "tf_crop_and_resize" or plan.roi[axis] == (0.0, 1.0)
    return math.isclose(plan.scales[axis], 1.0) and plan.out_shape[axis] == in_len and trivial_roi


def _resize_axis(data: np.ndarray, axis: int, plan: _Plan, spec: _Spec) -> np.ndarray:
    in_len = data.shape[axis]
    out_len = plan.out_shape[axis]
    scale = plan.scales[axis]
    x = _source_coords(spec, out_len, in_len, scale, plan.lengths[axis], plan.roi[axis])
    if spec.mode == "nearest":
        index = np.clip(_nearest_index(x, spec.nearest_mode, scale), 0, max(in_len - 1, 0))
        result = np.take(data, index, axis=axis)
    else:
        index, weights = _taps(spec, x, scale, in_len)
        gathered = np.take(data, index, axis=axis)
        weights = weights.reshape((1,) * axis + weights.shape + (1,) * (data.ndim - axis - 1))
        result = (gathered * weights).sum(axis=axis + 1)
    if spec.coordinate_mode == "tf_crop_and_resize":
        outside = ((x < 0) | (x > in_len - 1)).reshape((1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1))
        fill = np.asarray(spec.extrapolation_value).astype(result.dtype)
        result = np.where(outside, fill, result)
    return result


def _cast_back(result: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if result.dtype == dtype:
        return result
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.round(result), info.min, info.max).astype(dtype)
    return result.astype(dtype)


def _run(ctx: EvalContext, x: np.ndarray, roi, scales, sizes) -> list:
    spec = _spec(ctx)
    plan = _plan(ctx, spec, x.shape, roi, scales, sizes)
    _check_output_fits(plan.out_shape, x.dtype.itemsize)
    # Nearest only gathers, so it works on any dtype; the filters run in float64.
    data = x if spec.mode == "nearest" else x.astype(np.float64)
    for axis in plan.axes:
        if not _is_identity(plan, spec, axis, data.shape[axis]):
            data = _resize_axis(data, axis, plan, spec)
    return [_cast_back(data, x.dtype)]


def _check_output_fits(out_shape: Sequence[int], itemsize: int) -> None:
    """Refuse an output larger than the machine's memory before any of it is made: a
    scale of 1e9 built index arrays of 15 GiB per axis first, and without a memory limit
    the process was killed for memory rather than told."""
    nbytes = math.prod(int(d) for d in out_shape) * itemsize
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf here: nothing to compare with
        return
    if nbytes > physical:
        raise ValueError(f"the output {list(out_shape)} would take {nbytes} bytes, more than this machine's "
                         f"memory ({physical} bytes)")


def _resize_eval(ctx: EvalContext, x, *params) -> list:
    positions = _input_positions(ctx)
    get = dict.fromkeys(("roi", "scales", "sizes"))
    for name, i in positions.items():
        get[name] = params[i - 1] if i - 1 < len(params) else None
    if "scales" not in positions:
        get["scales"] = np.asarray(ctx.attr("scales"), dtype=np.float32)
    return _run(ctx, x, get["roi"], get["scales"], get["sizes"])


define("Resize", infer=_resize_type, evaluate=_resize_eval, params=(1, 2, 3))
define("Upsample", infer=_resize_type, evaluate=_resize_eval, params=(1,))
