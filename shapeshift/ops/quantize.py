"""QuantizeLinear and DequantizeLinear: the QDQ pairs of quantized models.

onnx.reference implements them only from opset 19, and onnxruntime's quantizer
writes them at opset 10 to 13 as often as later, so they have rules of their own
for every opset: per-tensor, per-axis (opset 13) and blocked (opset 21) scales,
``output_dtype`` (opset 21), integer types of 8, 16 (opset 21) and 32 bits.  The
float8 and 4-bit types go to onnx.reference where it has them (opset 19 on) and
are refused with a clear error before.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.types import FLOAT, INT8, INT16, UINT8, UINT16, from_numpy_dtype, to_numpy_dtype
from .common import normalize_axis, tensor
from .context import EvalContext, InferContext
from .registry import define

#: Quantized types with rules here: QuantizeLinear's outputs, DequantizeLinear's inputs (int32 too).
_QUANTIZED = frozenset(np.dtype(to_numpy_dtype(t)) for t in (INT8, UINT8, INT16, UINT16))
_DEQUANTIZED_FROM = _QUANTIZED | {np.dtype(np.int32)}


def round_saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x`` rounded half to even, clipped to the integer ``dtype``'s range, as that type."""
    info = np.iinfo(dtype)
    return np.clip(np.rint(x), info.min, info.max).astype(dtype)


def _quantized_type(ctx, zero_point_type: Optional[int]) -> int:
    """QuantizeLinear's output type: its zero point's, else output_dtype (opset 21), else uint8."""
    if zero_point_type is not None:
        return zero_point_type
    return (ctx.attr("output_dtype", 0) if ctx.opset >= 21 else 0) or UINT8


def _dequantized_type(ctx, scale_type: int) -> int:
    """DequantizeLinear's output type: output_dtype (opset 23), else the scale's (opset 19:
    float16 and bfloat16 too), else float32."""
    if ctx.opset >= 23 and ctx.attr("output_dtype", 0):
        return ctx.attr("output_dtype")
    return scale_type if ctx.opset >= 19 else FLOAT


def _quantize_type(ctx: InferContext) -> list:
    dtype = _quantized_type(ctx, ctx.input_dtype(2) if ctx.has_input(2) else None)
    return [tensor(dtype, ctx.input_shape(0))]


def _dequantize_type(ctx: InferContext) -> list:
    return [tensor(_dequantized_type(ctx, ctx.input_dtype(1)), ctx.input_shape(0))]


def _broadcast_param(ctx: EvalContext, param: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A scale or zero point shaped to broadcast over ``x``: a scalar, one value per slice
    along ``axis`` (opset 13), or one per block of ``block_size`` along it (opset 21)."""
    if param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    axis = normalize_axis(ctx.attr("axis", 1), x.ndim)
    block_size = ctx.attr("block_size", 0) if ctx.opset >= 21 else 0
    if block_size:
        if param.ndim != x.ndim:
            ctx.fail(f"a blocked scale must have x's rank {x.ndim}, not {param.ndim}")
        expected = -(-x.shape[axis] // block_size)
        if param.shape[axis] != expected:
            ctx.fail(f"a scale with block_size {block_size} has {expected} entries along axis {axis}, "
                     f"not {param.shape[axis]}")
        return np.repeat(param, block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
    if param.ndim != 1 or param.size != x.shape[axis]:
        ctx.fail(f"a per-axis scale must be 1-D with x's {x.shape[axis]} entries along axis {axis}, "
                 f"not of shape {list(param.shape)}")
    shape = [1] * x.ndim
    shape[axis] = param.size
    return param.reshape(shape)


def _delegated(ctx: EvalContext, dtype: np.dtype, what: str, *inputs) -> list:
    """onnx.reference's evaluation, for the types our rules do not have."""
    from .delegated import delegated_rule

    rule = delegated_rule("", ctx.node.op_type, ctx.opset) if ctx.opset >= 19 else None
    if rule is None:
        ctx.fail(f"{what} of type {dtype} is not supported (int8, uint8, int16, uint16, and int32 inputs)")
    return rule.evaluate(ctx, *inputs)


def _quantize(ctx: EvalContext, x: np.ndarray, y_scale: np.ndarray,
              y_zero_point: Optional[np.ndarray] = None) -> list:
    zero_point_type = None if y_zero_point is None else from_numpy_dtype(y_zero_point.dtype)
    dtype = np.dtype(to_numpy_dtype(_quantized_type(ctx, zero_point_type)))
    if dtype not in _QUANTIZED:
        return _delegated(ctx, dtype, "QuantizeLinear output", x, y_scale, y_zero_point)
    scale = _broadcast_param(ctx, y_scale, x).astype(np.float32)
    # Round half to even, as the spec (and onnxruntime) do, then add the zero point and saturate.
    y = np.rint(x.astype(np.float32) / scale)
    if y_zero_point is not None:
        y = y + _broadcast_param(ctx, y_zero_point, x).astype(np.float32)
    return [round_saturate(y, dtype)]


def _dequantize(ctx: EvalContext, x: np.ndarray, x_scale: np.ndarray,
                x_zero_point: Optional[np.ndarray] = None) -> list:
    if x.dtype not in _DEQUANTIZED_FROM:
        return _delegated(ctx, x.dtype, "DequantizeLinear input", x, x_scale, x_zero_point)
    out_dtype = np.dtype(to_numpy_dtype(_dequantized_type(ctx, from_numpy_dtype(x_scale.dtype))))
    centered = x.astype(np.int64)
    if x_zero_point is not None:
        centered = centered - _broadcast_param(ctx, x_zero_point, x).astype(np.int64)
    scale = _broadcast_param(ctx, x_scale, x).astype(np.float32)
    return [(centered.astype(np.float32) * scale).astype(out_dtype)]


define("QuantizeLinear", infer=_quantize_type, evaluate=_quantize, since=10)
define("DequantizeLinear", infer=_dequantize_type, evaluate=_dequantize, since=10)
