"""Elementwise ops: unary math, broadcasting binary and variadic ops, Where, Clip,
Cast/CastLike, Identity and Dropout.

Type rules broadcast symbolic shapes (``common.broadcast_shapes``).  The ops
that commonly compute on small "shape tensors" (Add, Mul, Div, Equal, Where,
Cast, ...) also track their output contents as dimensions, so that e.g.
``Reshape(x, Concat(Div(Shape(x)[2:3], 12), ...))`` keeps a symbolic type.  The
element arithmetic behind that lives in ``shape_arith``.  The activation
functions (Relu, Gelu, ...) live in ``activations``.
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from ..ir.types import BOOL, INT_TYPES, STRING, TensorType, from_numpy_dtype, to_numpy_dtype
from ..symbolic import add, maximum, minimum, mul, sub

from . import shape_arith as sa
from .common import broadcast_shapes, same_as_input, tensor
from .context import EvalContext, InferContext
from .numeric import erf, truncating_divide, unary, widen
from .registry import define

# -- shared helpers ------------------------------------------------------------------


def _bool_of_shape(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    return [TensorType(BOOL, shape)] * ctx.num_outputs


def _first_known_dtype(ctx: InferContext, positions) -> int | None:
    for i in positions:
        dtype = ctx.input_dtype(i)
        if dtype is not None:
            return dtype
    return None


# -- unary math ----------------------------------------------------------------------

# op: (NumPy function, first opset of the op in the default domain).  Narrow
# floats are computed in float32; integers (Abs, Neg, Sign, BitwiseNot) as they are.
_UNARY = {
    "Abs": (np.abs, 1), "Neg": (np.negative, 1), "Sign": (np.sign, 9),
    "Acos": (np.arccos, 7), "Acosh": (np.arccosh, 9), "Asin": (np.arcsin, 7),
    "Asinh": (np.arcsinh, 9), "Atan": (np.arctan, 7), "Atanh": (np.arctanh, 9),
    "Cos": (np.cos, 7), "Cosh": (np.cosh, 9), "Sin": (np.sin, 7), "Sinh": (np.sinh, 9),
    "Tan": (np.tan, 7), "Tanh": (np.tanh, 1), "Ceil": (np.ceil, 1), "Floor": (np.floor, 1),
    # np.round rounds half to even, as ONNX Round does.
    "Round": (np.round, 11), "Sqrt": (np.sqrt, 1), "Exp": (np.exp, 1), "Log": (np.log, 1),
    "Reciprocal": (np.reciprocal, 1), "Erf": (erf, 9), "BitwiseNot": (np.invert, 18),
}
for _op, (_fn, _since) in _UNARY.items():
    define(_op, infer=same_as_input(), evaluate=unary(_fn), since=_since)


def _not(ctx: EvalContext, x: np.ndarray) -> list:
    return [np.asarray(np.logical_not(x), dtype=bool)]


def _not_type(ctx: InferContext) -> list:
    sa.track_elementwise(ctx, [0], sa.logical_not, (BOOL,))
    return [ctx.input_type(0)]


def _isnan(ctx: EvalContext, x: np.ndarray) -> list:
    return [np.asarray(np.isnan(widen(x)), dtype=bool)]


def _isinf(ctx: EvalContext, x: np.ndarray) -> list:
    x = widen(x)
    positive = np.isposinf(x) if ctx.attr("detect_positive", 1) else np.zeros(x.shape, bool)
    negative = np.isneginf(x) if ctx.attr("detect_negative", 1) else np.zeros(x.shape, bool)
    return [np.asarray(positive | negative, dtype=bool)]


define("Not", infer=_not_type, evaluate=_not)
define("IsNaN", infer=_bool_of_shape, evaluate=_isnan, since=9)
define("IsInf", infer=_bool_of_shape, evaluate=_isinf, since=10)

# -- binary ops with multidirectional broadcasting -------------------------------------


def _broadcast_rule(out_dtype: int | None = None, dtype_from=(0, 1), contents=None,
                    contents_dtypes=INT_TYPES):
    """The type rule of a broadcasting op over all its inputs.

    The output dtype is ``out_dtype``, or the first known dtype among the
    inputs at ``dtype_from`` (all inputs if None).  ``contents(ctx)`` returns
    an element function for ``shape_arith.track_elementwise``, or None when
    the output contents cannot be tracked.
    """

    def infer(ctx: InferContext) -> list:
        positions = range(ctx.num_inputs)
        shape = broadcast_shapes([ctx.input_shape(i) for i in positions], ctx)
        dtype = out_dtype if out_dtype is not None else _first_known_dtype(ctx, dtype_from or positions)
        if contents is not None:
            element = contents(ctx)
            if element is not None:
                sa.track_elementwise(ctx, list(positions), element, contents_dtypes)
        return [tensor(dtype, shape)]

    return infer


def _fixed(element):
    """A ``contents`` callback for element functions that take no attributes."""
    return lambda ctx: element


def _binary(fn, out_dtype=None):
    """An evaluator for ``fn(a, b)``; the result takes ``out_dtype`` or a's dtype."""

    def evaluate(ctx: EvalContext, a: np.ndarray, b: np.ndarray) -> list:
        with np.errstate(all="ignore"):
            y = fn(a, b)
        return [np.asarray(y, dtype=out_dtype if out_dtype is not None else a.dtype)]

    return evaluate


def _wide_binary(fn):
    """Like ``_binary`` but narrow floats are computed in float32."""
    return _binary(lambda a, b: fn(widen(a), widen(b)))


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return truncating_divide(a, b) if a.dtype.kind in "iu" else np.divide(a, b)


def _refuse_integer_zero(ctx: EvalContext, b: np.ndarray) -> None:
    """An integer Div or Mod by zero fails the run (onnxruntime refuses it too; C traps)."""
    if b.dtype.kind in "iu" and not np.all(b):
        ctx.fail("integer division by zero (onnxruntime refuses it too)")


def _div(ctx: EvalContext, a: np.ndarray, b: np.ndarray) -> list:
    _refuse_integer_zero(ctx, b)
    return _wide_binary(_divide)(ctx, a, b)


def _mod(ctx: EvalContext, a: np.ndarray, b: np.ndarray) -> list:
    _refuse_integer_zero(ctx, b)
    # fmod=0 on floats is only valid from opset 28 on, with Python semantics too.
    fn = np.fmod if ctx.attr("fmod", 0) else np.mod
    with np.errstate(all="ignore"):
        y = fn(widen(a), widen(b))
    return [np.asarray(y, dtype=a.dtype)]


def _pow(ctx: EvalContext, base: np.ndarray, exponent: np.ndarray) -> list:
    """base ** exponent in the base's dtype.

    Integers raised to negative (or float) powers go through float64 and are
    truncated, as onnxruntime's std::pow followed by a cast does.
    """
    with np.errstate(all="ignore"):
        if base.dtype.kind in "iu" and (exponent.dtype.kind not in "iu" or np.any(exponent < 0)):
            y = np.trunc(np.power(base.astype(np.float64), exponent.astype(np.float64)))
        elif base.dtype.kind in "iu":
            y = np.power(base, exponent.astype(base.dtype))
        else:
            wide = widen(base)
            y = np.power(wide, widen(exponent).astype(wide.dtype))
        return [np.asarray(y, dtype=base.dtype)]


def _bitshift(ctx: EvalContext, x: np.ndarray, shift: np.ndarray) -> list:
    fn = np.left_shift if ctx.attr("direction", "LEFT") == "LEFT" else np.right_shift
    return [np.asarray(fn(x, shift.astype(x.dtype)), dtype=x.dtype)]


def _mod_contents(ctx: InferContext):
    return sa.fmod if ctx.attr("fmod", 0) else sa.floor_mod


_ARITHMETIC = {
    "Add": (np.add, add),
    "Sub": (np.subtract, sub),
    "Mul": (np.multiply, mul),
}
for _op, (_fn, _element) in _ARITHMETIC.items():
    define(_op, infer=_broadcast_rule(contents=_fixed(_element)), evaluate=_wide_binary(_fn))
define("Div", infer=_broadcast_rule(contents=_fixed(sa.truncating_div)), evaluate=_div)

define("Mod", infer=_broadcast_rule(contents=_mod_contents), evaluate=_mod, since=10)
define("Pow", infer=_broadcast_rule(dtype_from=(0,)), evaluate=_pow)
define("BitShift", infer=_broadcast_rule(), evaluate=_bitshift, since=11)

_BITWISE = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}
for _op, _fn in _BITWISE.items():
    define(_op, infer=_broadcast_rule(), evaluate=_binary(_fn), since=18)

_LOGICAL = {
    "And": (np.logical_and, sa.logical_and),
    "Or": (np.logical_or, sa.logical_or),
    "Xor": (np.logical_xor, sa.logical_xor),
}
for _op, (_fn, _element) in _LOGICAL.items():
    define(_op, infer=_broadcast_rule(BOOL, contents=_fixed(_element), contents_dtypes=(BOOL,)),
           evaluate=_binary(_fn, bool))

_COMPARISONS = {
    "Equal": (np.equal, sa.equal, 1),
    "Greater": (np.greater, sa.greater, 1),
    "Less": (np.less, sa.less, 1),
    "GreaterOrEqual": (np.greater_equal, sa.greater_equal, 12),
    "LessOrEqual": (np.less_equal, sa.less_equal, 12),
}
for _op, (_fn, _element, _since) in _COMPARISONS.items():
    define(_op, infer=_broadcast_rule(BOOL, contents=_fixed(_element),
                                      contents_dtypes=INT_TYPES | {BOOL}),
           evaluate=_binary(_fn, bool), since=_since)

# -- variadic ops --------------------------------------------------------------------


def _variadic(fn, average: bool = False):
    """An evaluator folding ``fn`` over all inputs (with broadcasting)."""

    def evaluate(ctx: EvalContext, *inputs: np.ndarray) -> list:
        dtype = inputs[0].dtype
        wide = [widen(x) for x in inputs]
        with np.errstate(all="ignore"):
            y = functools.reduce(fn, wide)
            if average:
                y = y / len(inputs)
            # A single input still has to come back as a fresh array.
            y = np.broadcast_to(y, np.broadcast_shapes(*(x.shape for x in inputs)))
        return [np.array(y, dtype=dtype)]

    return evaluate


define("Max", infer=_broadcast_rule(dtype_from=None, contents=_fixed(sa.fold(maximum))),
       evaluate=_variadic(np.maximum))
define("Min", infer=_broadcast_rule(dtype_from=None, contents=_fixed(sa.fold(minimum))),
       evaluate=_variadic(np.minimum))
define("Sum", infer=_broadcast_rule(dtype_from=None), evaluate=_variadic(np.add))
define("Mean", infer=_broadcast_rule(dtype_from=None), evaluate=_variadic(np.add, average=True))

# -- Where, Clip, Identity -------------------------------------------------------------


def _where(ctx: EvalContext, condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> list:
    return [np.asarray(np.where(condition, x, y), dtype=x.dtype)]


def _where_contents(ctx: InferContext):
    if ctx.input_dtype(0) != BOOL or ctx.input_dtype(1) not in INT_TYPES:
        return None
    return sa.select


define("Where", infer=_broadcast_rule(dtype_from=(1, 2), contents=_where_contents,
                                      contents_dtypes=INT_TYPES | {BOOL}),
       evaluate=_where, since=9)


def _clip_bounds(ctx: EvalContext, x: np.ndarray, low, high) -> tuple:
    """The (low, high) bounds as x's dtype, or None where a bound is absent."""
    if ctx.opset < 11:
        low = ctx.attr("min") if ctx.has_attr("min") else None
        high = ctx.attr("max") if ctx.has_attr("max") else None
    cast = [None if b is None else np.asarray(b).astype(x.dtype).reshape(()) for b in (low, high)]
    return cast[0], cast[1]


def _clip(ctx: EvalContext, x: np.ndarray, low=None, high=None) -> list:
    low, high = _clip_bounds(ctx, x, low, high)
    y = x
    # Max first, then Min: when low > high every element becomes high.
    if low is not None:
        y = np.maximum(y, low)
    if high is not None:
        y = np.minimum(y, high)
    return [np.array(y, dtype=x.dtype)]


def _identity(ctx: EvalContext, x) -> list:
    return [x]


def _identity_type(ctx: InferContext) -> list:
    ctx.set_contents(0, ctx.input_dims(0))
    return [ctx.input_type(0)]


define("Clip", infer=same_as_input(), evaluate=_clip, single=(1, 2))
define("Identity", infer=_identity_type, evaluate=_identity)

# -- Cast and CastLike ---------------------------------------------------------------

_FLOAT8 = frozenset({17, 18, 19, 20})  # FLOAT8E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ


def _format_number(value) -> str:
    """A number as onnxruntime writes it when casting to string."""
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return f"{value:.8g}"


def _parse_number(text, target: np.dtype):
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    text = str(text).strip()
    if target.kind in "iu":
        try:
            return int(text)
        except ValueError:
            return int(float(text))
    if target.kind == "b":
        return float(text) != 0
    return float(text)


def cast_array(x: np.ndarray, to: int, saturate: int = 1) -> np.ndarray:
    """``x`` cast to the ONNX type ``to`` following the Cast spec."""
    target = to_numpy_dtype(to)
    if to == STRING and x.dtype == object:
        return x.copy()
    if to == STRING:
        flat = [_format_number(v) for v in x.reshape(-1)]
        return np.array(flat, dtype=object).reshape(x.shape)
    if x.dtype == object:
        flat = [_parse_number(v, target) for v in x.reshape(-1)]
        # Floats go through float64 so that the narrow float types round only once.
        parsed = np.array(flat, dtype=None if target.kind in "iub" else np.float64)
        return parsed.astype(target).reshape(x.shape)
    with np.errstate(all="ignore"):
        if to in _FLOAT8 and saturate and x.dtype.kind != "b":
            # Saturation: out-of-range values (infinities included) clamp to the largest finite value.
            info = ml_dtypes.finfo(target)
            x = np.clip(widen(x), float(info.min), float(info.max))
        return x.astype(target)


def _cast_rule(target_of):
    def infer(ctx: InferContext) -> list:
        to = target_of(ctx)
        source = ctx.input_dtype(0)
        if to is not None and source is not None:
            element = sa.cast_element(source, to)
            if element is not None:
                sa.track_elementwise(ctx, [0], element, INT_TYPES | {BOOL})
        return [tensor(to, ctx.input_shape(0))]

    return infer


def _cast(ctx: EvalContext, x: np.ndarray) -> list:
    return [cast_array(x, int(ctx.attr("to")), ctx.attr("saturate", 1))]


def _cast_like(ctx: EvalContext, x: np.ndarray, like: np.ndarray) -> list:
    return [cast_array(x, from_numpy_dtype(like.dtype), ctx.attr("saturate", 1))]


define("Cast", infer=_cast_rule(lambda ctx: ctx.attr("to")), evaluate=_cast)
define("CastLike", infer=_cast_rule(lambda ctx: ctx.input_dtype(1)), evaluate=_cast_like, since=15)

# -- Dropout -------------------------------------------------------------------------


def _dropout_type(ctx: InferContext) -> list:
    x = ctx.input_type(0)
    mask_dtype = BOOL if ctx.opset >= 10 else ctx.input_dtype(0)
    mask = tensor(mask_dtype, ctx.input_shape(0))
    return [x, mask][: ctx.num_outputs]


def _dropout(ctx: EvalContext, x: np.ndarray, ratio=None, training_mode=None) -> list:
    ratio_value = float(ratio) if ratio is not None else ctx.attr("ratio", 0.5)
    training = ctx.opset >= 12 and training_mode is not None and bool(training_mode)
    if training and ratio_value > 0:
        # Legacy RandomState with the seed: the same draws as the ONNX reference.
        seed = ctx.attr("seed")
        rng = np.random.RandomState(None if seed is None else seed % 2**32)
        keep = rng.uniform(0.0, 1.0, x.shape) >= ratio_value
        scale = 1.0 / (1.0 - ratio_value) if ratio_value < 1 else 0.0
        y = np.asarray(widen(x) * keep * scale, dtype=x.dtype)
    else:
        keep, y = np.ones(x.shape, dtype=bool), x
    mask = keep if ctx.opset >= 10 else keep.astype(x.dtype)
    return [y, mask][: ctx.num_outputs]


define("Dropout", infer=_dropout_type, evaluate=_dropout)
