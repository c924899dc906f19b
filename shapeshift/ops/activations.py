"""Activation functions: Relu and its relatives, Sigmoid, Softplus, Gelu, PRelu, ...

All keep their input's type (shape and dtype, float16 and double included).
Each evaluator is a small function of the (widened) input and the node's
attributes, wrapped by ``activation`` which casts the result back.
"""

from __future__ import annotations

import numpy as np

from .common import broadcast_shapes, same_as_input, tensor
from .context import EvalContext, InferContext
from .numeric import erf, widen
from .registry import define


def activation(fn):
    """An evaluator for ``y = fn(ctx, x)``, computed in at least float32, in x's dtype."""

    def evaluate(ctx: EvalContext, x: np.ndarray) -> list:
        with np.errstate(all="ignore"):
            y = fn(ctx, widen(x))
        return [np.asarray(y, dtype=x.dtype)]

    return evaluate


# ONNX float attributes are float32: defaults are rounded the same way, so that a
# double input sees the alpha a model stating the default would carry.
_LEAKY_ALPHA = float(np.float32(0.01))
_HARD_SIGMOID_ALPHA = float(np.float32(0.2))
_ONE_SIXTH = float(np.float32(1 / 6))


def _relu(ctx, x):
    # Relu also takes integers (opset 14); a zero of x's own type keeps them integral.
    return np.maximum(x, x.dtype.type(0))


def _leaky_relu(ctx, x):
    return np.where(x < 0, ctx.attr("alpha", _LEAKY_ALPHA) * x, x)


def _elu(ctx, x):
    return np.where(x < 0, ctx.attr("alpha", 1.0) * np.expm1(x), x)


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214050292968750


def _selu(ctx, x):
    alpha = ctx.attr("alpha", _SELU_ALPHA)
    gamma = ctx.attr("gamma", _SELU_GAMMA)
    return gamma * np.where(x <= 0, alpha * np.expm1(x), x)


def _celu(ctx, x):
    alpha = ctx.attr("alpha", 1.0)
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))


def _hard_sigmoid_of(x, alpha: float, beta: float):
    return np.clip(alpha * x + beta, 0, 1)


def _hard_sigmoid(ctx, x):
    return _hard_sigmoid_of(x, ctx.attr("alpha", _HARD_SIGMOID_ALPHA), ctx.attr("beta", 0.5))


def _hard_swish(ctx, x):
    return x * _hard_sigmoid_of(x, _ONE_SIXTH, 0.5)


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow: exp only ever sees -|x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _sigmoid(ctx, x):
    return sigmoid(x)


def softplus(x):
    """log(1 + exp(x)) without overflow."""
    return np.logaddexp(0, x)


def _softplus(ctx, x):
    return softplus(x)


def _softsign(ctx, x):
    return x / (1 + np.abs(x))


def _mish(ctx, x):
    return x * np.tanh(softplus(x))


def _thresholded_relu(ctx, x):
    return np.where(x > ctx.attr("alpha", 1.0), x, 0)


def _shrink(ctx, x):
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    # Shrink also takes integers; compute in float64 so x - bias cannot wrap.
    wide = x.astype(np.float64) if x.dtype.kind in "iu" else x
    return np.where(wide < -lambd, wide + bias, np.where(wide > lambd, wide - bias, 0))


_SQRT_2_OVER_PI = float(np.sqrt(2 / np.pi))


def _gelu(ctx, x):
    if ctx.attr("approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


_ACTIVATIONS = {
    # op: (evaluator, first opset of the op in the default domain)
    "Relu": (_relu, 1),
    "LeakyRelu": (_leaky_relu, 1),
    "Elu": (_elu, 1),
    "Selu": (_selu, 1),
    "Celu": (_celu, 12),
    "HardSigmoid": (_hard_sigmoid, 1),
    "HardSwish": (_hard_swish, 14),
    "Sigmoid": (_sigmoid, 1),
    "Softplus": (_softplus, 1),
    "Softsign": (_softsign, 1),
    "Mish": (_mish, 18),
    "ThresholdedRelu": (_thresholded_relu, 10),
    "Shrink": (_shrink, 9),
    "Gelu": (_gelu, 20),
}
for _op, (_fn, _since) in _ACTIVATIONS.items():
    define(_op, infer=same_as_input(), evaluate=activation(_fn), since=_since)


def _prelu_type(ctx: InferContext) -> list:
    # The slope broadcasts to X (unidirectionally), so X's shape wins; the
    # broadcast still refines symbolic dims of X that the slope fixes.
    shape = broadcast_shapes([ctx.input_shape(0), ctx.input_shape(1)], ctx)
    x_shape = ctx.input_shape(0)
    if shape is not None and x_shape is not None and len(shape) != len(x_shape):
        ctx.fail(f"slope of rank {len(ctx.input_shape(1))} does not broadcast to X of rank {len(x_shape)}")
    return [tensor(ctx.input_dtype(0), shape if shape is not None else x_shape)]


def _prelu(ctx: EvalContext, x: np.ndarray, slope: np.ndarray) -> list:
    with np.errstate(all="ignore"):
        wide = widen(x)
        y = np.where(wide < 0, wide * widen(slope), wide)
    return [np.asarray(y, dtype=x.dtype)]


define("PRelu", infer=_prelu_type, evaluate=_prelu)
