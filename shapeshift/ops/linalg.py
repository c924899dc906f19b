"""Linear-algebra ops: MatMul, Gemm, Einsum, the softmax family, quantized matmuls, Det.

Type rules follow NumPy's matmul/einsum shape semantics on symbolic dims:
batch dims broadcast, contracted dims must agree (checked when provable),
and anything unknowable degrades to fresh dims or unknown rank.

Evaluators compute float16/bfloat16 in float32 and cast back, as onnxruntime
accumulates those in float32 too; every result keeps the ONNX output dtype.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.types import INT32, TensorType
from ..symbolic import Dim, Expr, bounds
from .common import Shape, broadcast_dim, broadcast_shapes, normalize_axis, same_as_input, tensor
from .context import EvalContext, InferContext
from .quantize import round_saturate
from .registry import define

# -- shared helpers ---------------------------------------------------------------


def _widen(x: np.ndarray) -> np.ndarray:
    """Low-precision floats computed in float32 (what onnxruntime does)."""
    if x.dtype == np.float16 or x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return x


def _check_same(ctx: InferContext, a: Dim, b: Dim, what: str) -> None:
    """Fail when two dims that must be equal provably differ."""
    if a is b:
        return
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        if a != b:
            ctx.fail(f"{what}: {a} != {b}")
        return
    lo_a, hi_a = bounds(a)
    lo_b, hi_b = bounds(b)
    if hi_a < lo_b or hi_b < lo_a:
        ctx.fail(f"{what}: {a} and {b} cannot be equal")


def matmul_shape(ctx: InferContext, a: Shape, b: Shape) -> Shape:
    """The shape of numpy.matmul(a, b), with 1-D operands promoted and dropped."""
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        ctx.fail("MatMul operands must have rank >= 1")
    a_mat = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b_mat = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    _check_same(ctx, a_mat[-1], b_mat[-2], "contracted dimensions differ")
    batch = broadcast_shapes([a_mat[:-2], b_mat[:-2]], ctx)
    rows = (a_mat[-2],) if len(a) > 1 else ()
    cols = (b_mat[-1],) if len(b) > 1 else ()
    return batch + rows + cols


def _matmul_type(ctx: InferContext) -> list:
    return [tensor(ctx.input_dtype(0), matmul_shape(ctx, ctx.input_shape(0), ctx.input_shape(1)))]


def _matmul(ctx: EvalContext, a: np.ndarray, b: np.ndarray) -> list:
    return [np.asarray(np.matmul(_widen(a), _widen(b))).astype(a.dtype, copy=False)]


define("MatMul", infer=_matmul_type, evaluate=_matmul)

# -- Gemm -------------------------------------------------------------------------


def _gemm_operand(ctx: InferContext, index: int, transposed: bool) -> tuple[Dim, Dim]:
    """(rows, cols) of a Gemm operand after its optional transpose."""
    shape = ctx.input_shape(index)
    if shape is None:
        return ctx.fresh_dim("gemm"), ctx.fresh_dim("gemm")
    if len(shape) != 2:
        ctx.fail(f"Gemm input {index} must be 2-D, got rank {len(shape)}")
    return (shape[1], shape[0]) if transposed else (shape[0], shape[1])


def _refine_with_c(ctx: InferContext, dim: Dim, c_dim: Optional[Dim]) -> Dim:
    """Check a Gemm output dim against C's (unidirectional broadcast into it)."""
    if c_dim is None or (not isinstance(c_dim, Expr) and c_dim == 1):
        return dim
    _check_same(ctx, dim, c_dim, "Gemm C does not broadcast to the output")
    # C's dim is the output's; a static one is worth more than a symbol
    # (which may be a fresh one standing for an input of unknown shape).
    if isinstance(dim, Expr) and not isinstance(c_dim, Expr):
        return c_dim
    return dim


def _gemm_type(ctx: InferContext) -> list:
    m, k_a = _gemm_operand(ctx, 0, bool(ctx.attr("transA", 0)))
    k_b, n = _gemm_operand(ctx, 1, bool(ctx.attr("transB", 0)))
    _check_same(ctx, k_a, k_b, "Gemm contracted dimensions differ")
    c_shape = ctx.input_shape(2)
    if c_shape is not None:
        if len(c_shape) > 2:
            ctx.fail(f"Gemm C must have rank <= 2, got {len(c_shape)}")
        padded = (None,) * (2 - len(c_shape)) + tuple(c_shape)
        m, n = _refine_with_c(ctx, m, padded[0]), _refine_with_c(ctx, n, padded[1])
    dtype = ctx.input_dtype(0)
    if dtype is None:
        dtype = ctx.input_dtype(1)
    return [tensor(dtype, (m, n))]


def _scaled(x: np.ndarray, factor: float) -> np.ndarray:
    """x * factor without promoting x; the identity factor costs nothing."""
    if factor == 1.0:
        return x
    if x.dtype.kind in "iu":
        return (x * factor).astype(x.dtype)
    return x * x.dtype.type(factor)


def _gemm(ctx: EvalContext, a: np.ndarray, b: np.ndarray, c: Optional[np.ndarray] = None) -> list:
    wa, wb = _widen(a), _widen(b)
    if ctx.attr("transA", 0):
        wa = wa.T
    if ctx.attr("transB", 0):
        wb = wb.T
    y = _scaled(np.matmul(wa, wb), float(ctx.attr("alpha", 1.0)))
    beta = float(ctx.attr("beta", 1.0))
    if c is not None and beta != 0.0:
        y = y + _scaled(_widen(c), beta)
    return [np.asarray(y).astype(a.dtype, copy=False)]


define("Gemm", infer=_gemm_type, evaluate=_gemm)

# -- Einsum -----------------------------------------------------------------------

_ELLIPSIS = "..."


def _parse_term(term: str) -> list[str]:
    """Labels of one einsum term; "..." stays one token."""
    tokens: list[str] = []
    rest = term
    while rest:
        if rest.startswith(_ELLIPSIS):
            tokens.append(_ELLIPSIS)
            rest = rest[3:]
            continue
        if not rest[0].isalpha():
            raise ValueError(f"bad einsum label {rest[0]!r}")
        tokens.append(rest[0])
        rest = rest[1:]
    if tokens.count(_ELLIPSIS) > 1:
        raise ValueError("an einsum term may hold one ellipsis only")
    return tokens


def parse_einsum(equation: str, num_inputs: int) -> tuple[list[list[str]], list[str]]:
    """Input terms and output term of an equation; the implicit output made explicit."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    inputs = [_parse_term(t) for t in lhs.split(",")]
    if len(inputs) != num_inputs:
        raise ValueError(f"equation has {len(inputs)} terms for {num_inputs} inputs")
    if arrow:
        return inputs, _parse_term(rhs)
    labels = [t for term in inputs for t in term if t != _ELLIPSIS]
    once = sorted((t for t in set(labels) if labels.count(t) == 1), key=ord)
    has_ellipsis = any(_ELLIPSIS in term for term in inputs)
    return inputs, ([_ELLIPSIS] if has_ellipsis else []) + once


def _bind_term(ctx: InferContext, term: list[str], shape: Shape, sizes: dict[str, Dim],
               ellipses: list[Shape]) -> None:
    """Record the dims an input gives its labels and its ellipsis."""
    if shape is None:
        if _ELLIPSIS in term:
            ellipses.append(None)
        return
    letters = len(term) - (1 if _ELLIPSIS in term else 0)
    if len(shape) < letters or (_ELLIPSIS not in term and len(shape) != letters):
        ctx.fail(f"einsum term {''.join(term)!r} does not fit rank {len(shape)}")
    split = term.index(_ELLIPSIS) if _ELLIPSIS in term else len(term)
    ellipsis_rank = len(shape) - letters
    if _ELLIPSIS in term:
        ellipses.append(tuple(shape[split:split + ellipsis_rank]))
    label_dims = list(shape[:split]) + list(shape[split + ellipsis_rank:])
    for label, dim in zip((t for t in term if t != _ELLIPSIS), label_dims):
        sizes[label] = broadcast_dim(sizes[label], dim, ctx) if label in sizes else dim


def _einsum_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    try:
        terms, output = parse_einsum(str(ctx.attr("equation", "")), ctx.num_inputs)
    except ValueError as exc:
        ctx.fail(f"equation {ctx.attr('equation')!r}: {exc}")
    sizes: dict[str, Dim] = {}
    ellipses: list[Shape] = []
    for i, term in enumerate(terms):
        _bind_term(ctx, term, ctx.input_shape(i), sizes, ellipses)
    shape: list[Dim] = []
    for label in output:
        if label == _ELLIPSIS:
            ellipsis = broadcast_shapes(ellipses, ctx)
            if ellipsis is None:
                return [tensor(dtype, None)]
            shape.extend(ellipsis)
        elif label in sizes:
            shape.append(sizes[label])
        elif any(label in term for term in terms):
            shape.append(ctx.fresh_dim("einsum"))  # only inputs of unknown rank carry it
        else:
            ctx.fail(f"output label {label!r} appears in no input term")
    return [tensor(dtype, shape)]


def _einsum(ctx: EvalContext, *inputs: np.ndarray) -> list:
    equation = str(ctx.attr("equation", "")).replace(" ", "")
    result = np.einsum(equation, *[_widen(x) for x in inputs], optimize=len(inputs) > 2)
    return [np.asarray(result).astype(inputs[0].dtype, copy=False)]


define("Einsum", infer=_einsum_type, evaluate=_einsum)

# -- Softmax, LogSoftmax, Hardmax --------------------------------------------------
# Before opset 13 these flatten the input to 2-D at `axis` (default 1) and work
# on the whole trailing block; from 13 on they work along the one axis (default -1).


def _softmax_axis_check(ctx: InferContext) -> list:
    t = ctx.input_type(0)
    if isinstance(t, TensorType) and t.shape is not None and len(t.shape) > 0:
        normalize_axis(int(ctx.attr("axis", _default_axis(ctx.opset))), len(t.shape), ctx)
    return same_as_input()(ctx)


def _default_axis(opset: int) -> int:
    return -1 if opset >= 13 else 1


def _along_axis(ctx: EvalContext, x: np.ndarray, fn) -> np.ndarray:
    """Apply ``fn(x2, axis)`` the way this opset defines the softmax family."""
    if x.ndim == 0 or x.size == 0:
        return fn(x.reshape(1, -1) if x.ndim == 0 else x, -1).reshape(x.shape)
    axis = normalize_axis(int(ctx.attr("axis", _default_axis(ctx.opset))), x.ndim)
    if ctx.opset >= 13:
        return fn(x, axis)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    cols = int(np.prod(x.shape[axis:], dtype=np.int64))
    return fn(x.reshape(rows, cols), 1).reshape(x.shape)


def _stable_shift(x: np.ndarray, axis: int) -> np.ndarray:
    if x.size == 0:
        return x
    peak = np.max(x, axis=axis, keepdims=True)
    # Rows that are all -inf stay -inf rather than turning into NaN here (their softmax is
    # 0 / 0 either way). A row holding +inf is shifted by it, as onnxruntime and the native
    # kernels do: every element NaN, where not shifting gave 0 for its finite ones.
    return x - np.where(np.isneginf(peak), 0, peak)


def _softmax_rows(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(_stable_shift(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax_rows(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = _stable_shift(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _hardmax_rows(x: np.ndarray, axis: int) -> np.ndarray:
    if x.size == 0:
        return np.zeros_like(x)
    first_max = np.argmax(x, axis=axis)
    positions = np.arange(x.shape[axis]).reshape([-1 if d == axis % x.ndim else 1 for d in range(x.ndim)])
    return (positions == np.expand_dims(first_max, axis)).astype(x.dtype)


def _softmax(ctx: EvalContext, x: np.ndarray) -> list:
    with np.errstate(all="ignore"):
        return [_along_axis(ctx, _widen(x), _softmax_rows).astype(x.dtype, copy=False)]


def _log_softmax(ctx: EvalContext, x: np.ndarray) -> list:
    with np.errstate(all="ignore"):
        return [_along_axis(ctx, _widen(x), _log_softmax_rows).astype(x.dtype, copy=False)]


def _hardmax(ctx: EvalContext, x: np.ndarray) -> list:
    return [_along_axis(ctx, x, _hardmax_rows).astype(x.dtype, copy=False)]


define("Softmax", infer=_softmax_axis_check, evaluate=_softmax)
define("LogSoftmax", infer=_softmax_axis_check, evaluate=_log_softmax)
define("Hardmax", infer=_softmax_axis_check, evaluate=_hardmax)

# -- quantized matmuls ------------------------------------------------------------


def _matmul_integer_type(ctx: InferContext) -> list:
    return [TensorType(INT32, matmul_shape(ctx, ctx.input_shape(0), ctx.input_shape(1)))]


def _per_row(param: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A 1-D per-row quantization parameter of a matrix A, shaped to broadcast over its rows."""
    if param.ndim == 1 and a.ndim >= 2 and param.size == a.shape[-2] and param.size != 1:
        return param.reshape(-1, 1)
    return param


def _centered(x: np.ndarray, zero_point: Optional[np.ndarray], per_row: bool) -> np.ndarray:
    """x - zero_point in int32 (products of int8/uint8 never overflow there)."""
    wide = x.astype(np.int32)
    if zero_point is None:
        return wide
    zp = zero_point.astype(np.int32)
    return wide - (_per_row(zp, x) if per_row else zp)


def _matmul_integer(ctx: EvalContext, a: np.ndarray, b: np.ndarray,
                    a_zero_point: Optional[np.ndarray] = None,
                    b_zero_point: Optional[np.ndarray] = None) -> list:
    product_ = np.matmul(_centered(a, a_zero_point, True), _centered(b, b_zero_point, False))
    return [np.asarray(product_, dtype=np.int32)]


define("MatMulInteger", infer=_matmul_integer_type, evaluate=_matmul_integer)


def _qlinear_matmul_type(ctx: InferContext) -> list:
    shape = matmul_shape(ctx, ctx.input_shape(0), ctx.input_shape(3))
    return [tensor(ctx.input_dtype(7), shape)]


def _qlinear_matmul(ctx: EvalContext, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray,
                    b: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray,
                    y_scale: np.ndarray, y_zero_point: np.ndarray) -> list:
    if y_zero_point.dtype.kind not in "iu":
        ctx.fail(f"QLinearMatMul output type {y_zero_point.dtype} is not supported")
    accumulated = np.matmul(_centered(a, a_zero_point, True), _centered(b, b_zero_point, False))
    # Requantize as onnxruntime does: one float32 multiplier per output element,
    # round half to even, then add the zero point and saturate.
    a_scale, b_scale, y_scale = (s.astype(np.float32) for s in (a_scale, b_scale, y_scale))
    multiplier = _per_row(a_scale, a) * b_scale / y_scale
    y = np.rint(accumulated.astype(np.float32) * multiplier) + y_zero_point.astype(np.float32)
    return [round_saturate(y, y_zero_point.dtype)]


define("QLinearMatMul", infer=_qlinear_matmul_type, evaluate=_qlinear_matmul)

# -- Det --------------------------------------------------------------------------


def _det_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    dtype = ctx.input_dtype(0)
    if shape is None:
        return [tensor(dtype, None)]
    if len(shape) < 2:
        ctx.fail(f"Det needs rank >= 2, got {len(shape)}")
    _check_same(ctx, shape[-1], shape[-2], "Det needs square matrices")
    return [tensor(dtype, shape[:-2])]


def _det(ctx: EvalContext, x: np.ndarray) -> list:
    return [np.asarray(np.linalg.det(_widen(x))).astype(x.dtype, copy=False)]


define("Det", infer=_det_type, evaluate=_det)

