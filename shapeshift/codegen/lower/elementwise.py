"""Elementwise ops and their fusion into one generated loop nest.

A chain of elementwise nodes — each the only reader of the previous one's output, all
of the same output shape — becomes one loop over the output: GELU's five nodes, a
bias-add-residual-add pair, ``x * sigmoid(x)``, a mask computation. The leader is the
first node of the chain; its rule absorbs the rest (``Lowered.absorbed``).

Inputs from outside the chain are read through strides, 0 along broadcast axes;
single-element constants are inlined as literals. Adjacent axes that every input reads
the same way (all contiguous, or all broadcast) are merged, so the common cases are one
flat loop or a row loop with an inner contiguous loop that gcc vectorizes.

Op semantics are C expressions per op (``_EXPRESSIONS``), over the operands' C
expressions; a rule may decline an attribute or dtype it does not cover.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import BOOL, DOUBLE, FLOAT, INT32, INT64, UINT8, UINT16, UINT32, UINT64, TensorType
from ...symbolic import Dim, prove_eq
from ..kernels.scalar import MINMAX_TYPES
from . import lowers
from .context import C_TYPES, LowerContext, Lowered, Unsupported, float_literal

FLOATS = (FLOAT, DOUBLE)
UNSIGNED_BITS = {UINT8: 8, UINT16: 16, UINT32: 32, UINT64: 64}
# Below this many elements a parallel region costs more than it saves.
PARALLEL_ELEMENTS = 1 << 15

Expr = Callable[[Node, Sequence[str], Sequence[int]], str]


def _f(template: str) -> Expr:
    """A float-only op written with {0}, {1}... for the operands and {f} for the 'f' suffix
    of float math functions (empty for double)."""

    def build(node: Node, args: Sequence[str], dtypes: Sequence[int]) -> str:
        if dtypes[0] not in FLOATS:
            raise Unsupported(f"{node.op_type} on a non-float dtype")
        return template.format(*args, f="f" if dtypes[0] == FLOAT else "")

    return build


def _any(template: str) -> Expr:
    """An op valid for every numeric dtype (C's arithmetic matches ONNX's there)."""
    return lambda node, args, dtypes: template.format(*args)


def _attr_float(node: Node, name: str, default: float) -> str:
    return float_literal(node.attrs.get(name, default))


def _leaky_relu(node, args, dtypes):
    _require_float(node, dtypes)
    return f"({args[0]} >= 0 ? {args[0]} : {_attr_float(node, 'alpha', 0.01)} * {args[0]})"


def _elu(node, args, dtypes):
    _require_float(node, dtypes)
    return f"({args[0]} >= 0 ? {args[0]} : {_attr_float(node, 'alpha', 1.0)} * (expf({args[0]}) - 1.0f))"


def _selu(node, args, dtypes):
    _require_float(node, dtypes)
    alpha = _attr_float(node, "alpha", 1.67326319217681884765625)
    gamma = _attr_float(node, "gamma", 1.05070102214813232421875)
    x = args[0]
    return f"({gamma} * ({x} > 0 ? {x} : {alpha} * (expf({x}) - 1.0f)))"


def _hard_sigmoid(node, args, dtypes):
    _require_float(node, dtypes)
    if dtypes[0] == FLOAT:  # NaN stays NaN, as in onnxruntime (fminf would clamp it to 1)
        return f"ss_hard_sigmoidf({args[0]}, {_hard_sigmoid_params(node)})"
    alpha, beta = _attr_float(node, "alpha", 0.2), _attr_float(node, "beta", 0.5)
    return f"fmaxf(0.0f, fminf(1.0f, {alpha} * {args[0]} + {beta}))"


def _gelu(node, args, dtypes):
    _require_float(node, dtypes)
    x = args[0]
    if _gelu_suffix(node):
        return f"(0.5f * {x} * (1.0f + tanhf(0.7978845608028654f * ({x} + 0.044715f * {x} * {x} * {x}))))"
    return f"(0.5f * {x} * (1.0f + erff({x} * 0.7071067811865476f)))"


# Integer bases ONNX allows for Pow, and the suffix of their kernels/intpow.py helpers.
_INT_POW_SUFFIX = {INT32: "i32", INT64: "i64"}


#: Constant exponents a float Pow computes by multiplying (as onnxruntime does for 2 and 3):
#: libm's pow is a call per element, and a chain holding one did not vectorize.
_POW_BY_PRODUCT = (2, 3, 4)


def _pow_exponent(node: Node) -> Optional[int]:
    """The exponent of a float Pow when it is a constant in _POW_BY_PRODUCT, else None."""
    exponent = node.inputs[1] if len(node.inputs) > 1 else None
    const = None if exponent is None or exponent.const is None else np.asarray(exponent.const)
    if const is None or const.size != 1 or const.dtype.kind not in "fiu":
        return None
    value = const.reshape(()).item()
    return int(value) if value in _POW_BY_PRODUCT else None


def _power_product(x: str, k: int, mul: Callable[[str, str], str]) -> str:
    square = mul(x, x)
    return {2: square, 3: mul(square, x), 4: mul(square, square)}[k]


def _pow(node, args, dtypes):
    base, exponent = args[0], args[1]
    k = _pow_exponent(node) if dtypes[0] in FLOATS else None
    if k is not None:
        return _power_product(base, k, lambda a, b: f"({a} * {b})")
    if dtypes[0] in FLOATS:
        # An integer exponent converts to the base's type, as the reference evaluator does.
        return f"pow{'f' if dtypes[0] == FLOAT else ''}({base}, {exponent})"
    suffix = _INT_POW_SUFFIX.get(dtypes[0])
    if suffix is None:
        raise Unsupported(f"Pow on a base of dtype {dtypes[0]}")
    if dtypes[1] in FLOATS:
        return f"ss_ipow_real_{suffix}((double){base}, (double){exponent})"
    if dtypes[1] not in C_TYPES or dtypes[1] == BOOL:
        raise Unsupported(f"Pow with an exponent of dtype {dtypes[1]}")
    # The exponent's sign, then its bits (conversion to uint64_t keeps the parity).
    negative = "0" if dtypes[1] in UNSIGNED_BITS else f"({exponent} < 0)"
    return f"ss_ipow_{suffix}({base}, {negative}, (uint64_t)({exponent}))"


# An integer Div or Mod by zero: the loop marks it in this local (``_refuse_zero_divisors``
# declares it and fails the step after the loop), as onnxruntime refuses the run. Atomic:
# the loop may run on several threads.
ZERO_DIVISOR = "ss_zero_divisor"
_MARK_ZERO = f"__atomic_store_n(&{ZERO_DIVISOR}, 1, __ATOMIC_RELAXED)"


def _mod(node, args, dtypes):
    if node.attrs.get("fmod", 0):
        if dtypes[0] not in FLOATS:
            # C traps on x % 0 and on MIN % -1 (whose remainder is 0 anyway): 0 is marked,
            # MIN % -1 gives 0.
            a, b, ctype = args[0], args[1], C_TYPES[dtypes[0]]
            wrap = "" if dtypes[0] in UNSIGNED_BITS else f"{b} == -1 ? ({ctype})0 : "
            return f"({b} == 0 ? ({_MARK_ZERO}, ({ctype})0) : {wrap}({ctype})({a} % {b}))"
        return f"fmod{'f' if dtypes[0] == FLOAT else ''}({args[0]}, {args[1]})"
    if dtypes[0] in FLOATS:
        raise Unsupported("float Mod with fmod=0")
    # Python-style modulo: the result takes the divisor's sign.
    ctype = C_TYPES[dtypes[0]]
    return (f"({args[1]} == 0 ? ({_MARK_ZERO}, ({ctype})0) : "
            f"ss_pymod_{ctype.replace('_t', '')}({args[0]}, {args[1]}))")


def _div(node, args, dtypes):
    if dtypes[0] in FLOATS:
        return f"({args[0]} / {args[1]})"
    if dtypes[0] == BOOL:
        raise Unsupported("Div on bool")
    # Integer Div truncates toward zero in ONNX (onnxruntime, onnx.reference), as C's / does.
    # C traps on x / 0 and on MIN / -1: a zero is marked (the step fails, ZERO_DIVISOR),
    # MIN / -1 gives the wrapped negation.
    a, b, ctype = args[0], args[1], C_TYPES[dtypes[0]]
    if dtypes[0] in UNSIGNED_BITS:
        return f"({b} == 0 ? ({_MARK_ZERO}, ({ctype})0) : ({ctype})({a} / {b}))"
    return (f"({b} == 0 ? ({_MARK_ZERO}, ({ctype})0) : ({b} == -1 ? ({ctype})(0 - (uint64_t){a}) : "
            f"({ctype})({a} / {b})))")


def _refuse_zero_divisors(code: str) -> tuple[str, str]:
    """The step's code with the zero-divisor mark declared before its loop and checked after
    it, and what the step then refuses (``Lowered.rejects``); as it was where it has no
    integer Div or Mod."""
    if ZERO_DIVISOR not in code:
        return code, ""
    return (f"int {ZERO_DIVISOR} = 0;\n{code}\nif ({ZERO_DIVISOR}) return STEP_ERROR;",
            "integer division by zero (onnxruntime refuses it too)")


def _clip_bounds(node: Node, args: Sequence[str], dtype: int, constant=lambda text: text) -> tuple:
    """Clip's (lo, hi): its inputs, or (before opset 11) its attributes, ``constant`` making
    a literal an operand; an omitted bound of a float type is that type's largest finite
    value (ONNX's default: it clamps inf), of an integer type None (no clamp)."""
    lo = args[1] if len(args) > 1 and args[1] else None
    hi = args[2] if len(args) > 2 and args[2] else None
    if "min" in node.attrs:
        lo = constant(_attr_float(node, "min", 0.0))
    if "max" in node.attrs:
        hi = constant(_attr_float(node, "max", 0.0))
    limit = {FLOAT: "FLT_MAX", DOUBLE: "DBL_MAX"}.get(dtype)
    if limit is not None:
        lo = constant(f"(-{limit})") if lo is None else lo
        hi = constant(limit) if hi is None else hi
    return lo, hi


def _clip(node, args, dtypes):
    x = args[0]
    lo, hi = _clip_bounds(node, args, dtypes[0])
    out = x
    if lo is not None:
        out = f"({out} < {lo} ? {lo} : {out})"
    if hi is not None:
        out = f"({out} > {hi} ? {hi} : {out})"
    return out


def _minmax(op: str) -> Expr:
    sign = ">" if op == "Max" else "<"

    def build(node, args, dtypes):
        ctype = C_TYPES[dtypes[0]]
        out = args[0]
        for arg in args[1:]:
            if ctype in MINMAX_TYPES:  # a call per fold keeps the expression linear in the inputs
                out = f"ss_{op.lower()}_{ctype.replace('_t', '')}({out}, {arg})"
            else:
                # NaN wins, as in onnxruntime and NumPy.
                nan = f"isnan({out}) || " if dtypes[0] in FLOATS else ""
                out = f"(({nan}{out} {sign} {arg}) ? {out} : {arg})"
        return out

    return build


def _thresholded_relu(node, args, dtypes):
    _require_float(node, dtypes)
    return f"({args[0]} > {_attr_float(node, 'alpha', 1.0)} ? {args[0]} : 0)"


def _shrink(node, args, dtypes):
    # Integer Shrink compares against float attributes after promotion: left to the reference.
    _require_float(node, dtypes)
    x, lambd, bias = args[0], _attr_float(node, "lambd", 0.5), _attr_float(node, "bias", 0.0)
    return f"({x} < -{lambd} ? {x} + {bias} : ({x} > {lambd} ? {x} - {bias} : 0))"


def _celu(node, args, dtypes):
    if dtypes[0] != FLOAT:
        raise Unsupported("Celu on a dtype other than float32")
    x, alpha = args[0], _attr_float(node, "alpha", 1.0)
    return f"(fmaxf(0.0f, {x}) + fminf(0.0f, {alpha} * (expf({x} / {alpha}) - 1.0f)))"


def _is_inf(node, args, dtypes):
    _require_float(node, dtypes)
    x = args[0]
    positive, negative = int(node.attrs.get("detect_positive", 1)), int(node.attrs.get("detect_negative", 1))
    return f"(uint8_t)(isinf({x}) && (({x} > 0 && {positive}) || ({x} < 0 && {negative})))"


def _integers_only(template: str) -> Expr:
    """A bitwise op: integers only (C's operators match ONNX's on every integer width)."""

    def build(node, args, dtypes):
        if dtypes[0] in FLOATS or dtypes[0] == BOOL:
            raise Unsupported(f"{node.op_type} on a non-integer dtype")
        return f"({C_TYPES[dtypes[0]]})" + template.format(*args)

    return build


def _bit_shift(node, args, dtypes):
    # ONNX defines BitShift on unsigned types only.
    bits = UNSIGNED_BITS.get(dtypes[0])
    if bits is None:
        raise Unsupported("BitShift on a signed or non-integer dtype")
    op = "<<" if node.attrs.get("direction") == "LEFT" else ">>"
    ctype = C_TYPES[dtypes[0]]
    # A shift by the width or more is 0 (NumPy, onnxruntime), undefined in C.
    return f"({ctype})({args[1]} >= {bits} ? 0 : ((uint64_t){args[0]} {op} {args[1]}))"


def _mul(node, args, dtypes):
    if dtypes[0] == UINT16:
        # uint16 operands promote to (signed) int, where 65535 * 65535 overflows: undefined.
        return f"(uint16_t)((uint32_t){args[0]} * {args[1]})"
    return f"({args[0]} * {args[1]})"


def _sum(node, args, dtypes):
    return "(" + " + ".join(args) + ")"


def _mean(node, args, dtypes):
    _require_float(node, dtypes)
    return f"(({' + '.join(args)}) / {len(args)})"


def _require_float(node: Node, dtypes: Sequence[int]) -> None:
    if dtypes[0] not in FLOATS:
        raise Unsupported(f"{node.op_type} on a non-float dtype")


_EXPRESSIONS: dict[str, Expr] = {
    "Add": _any("({0} + {1})"),
    "Sub": _any("({0} - {1})"),
    "Mul": _mul,
    "Div": _div,
    "Neg": _any("(-{0})"),
    "Abs": lambda node, a, d: f"fabs{'f' if d[0] == FLOAT else ''}({a[0]})" if d[0] in FLOATS
    else f"({a[0]} < 0 ? -{a[0]} : {a[0]})",
    "Relu": _any("({0} < 0 ? 0 : {0})"),  # NaN stays NaN, as in onnxruntime
    "Sigmoid": _f("(1 / (1 + exp{f}(-{0})))"),
    "Tanh": _f("tanh{f}({0})"),
    "Exp": _f("exp{f}({0})"),
    "Log": _f("log{f}({0})"),
    "Sqrt": _f("sqrt{f}({0})"),
    "Erf": _f("erf{f}({0})"),
    "Reciprocal": _f("(1 / {0})"),
    "Floor": _f("floor{f}({0})"),
    "Ceil": _f("ceil{f}({0})"),
    "Round": _f("nearbyint{f}({0})"),
    "Sin": _f("sin{f}({0})"),
    "Cos": _f("cos{f}({0})"),
    "Tan": _f("tan{f}({0})"),
    "Asin": _f("asin{f}({0})"),
    "Acos": _f("acos{f}({0})"),
    "Atan": _f("atan{f}({0})"),
    "Sinh": _f("sinh{f}({0})"),
    "Cosh": _f("cosh{f}({0})"),
    "Asinh": _f("asinh{f}({0})"),
    "Acosh": _f("acosh{f}({0})"),
    "Atanh": _f("atanh{f}({0})"),
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink,
    "Celu": _celu,
    "IsInf": _is_inf,
    "BitwiseAnd": _integers_only("({0} & {1})"),
    "BitwiseOr": _integers_only("({0} | {1})"),
    "BitwiseXor": _integers_only("({0} ^ {1})"),
    "BitwiseNot": _integers_only("(~{0})"),
    "BitShift": _bit_shift,
    "Sum": _sum,
    "Mean": _mean,
    "Softplus": _f("log1p{f}(exp{f}({0}))"),
    "Softsign": _f("({0} / (1 + fabs{f}({0})))"),
    "HardSwish": _f("({0} * fmax{f}(0, fmin{f}(1, {0} / 6 + 0.5)))"),
    "Mish": _f("({0} * tanh{f}(log1p{f}(exp{f}({0}))))"),
    "Sign": _any("(({0} > 0) - ({0} < 0))"),
    "IsNaN": _f("(uint8_t)isnan({0})"),
    "Pow": _pow,
    "Mod": _mod,
    "Max": _minmax("Max"),
    "Min": _minmax("Min"),
    "LeakyRelu": _leaky_relu,
    "Elu": _elu,
    "Selu": _selu,
    "HardSigmoid": _hard_sigmoid,
    "Gelu": _gelu,
    "Clip": _clip,
    "PRelu": lambda node, a, d: f"({a[0]} < 0 ? {a[1]} * {a[0]} : {a[0]})",
    "Equal": _any("(uint8_t)({0} == {1})"),
    "Less": _any("(uint8_t)({0} < {1})"),
    "LessOrEqual": _any("(uint8_t)({0} <= {1})"),
    "Greater": _any("(uint8_t)({0} > {1})"),
    "GreaterOrEqual": _any("(uint8_t)({0} >= {1})"),
    "And": _any("(uint8_t)({0} && {1})"),
    "Or": _any("(uint8_t)({0} || {1})"),
    "Xor": _any("(uint8_t)(!{0} != !{1})"),
    "Not": _any("(uint8_t)(!{0})"),
    "Where": _any("({0} ? {1} : {2})"),
    "Cast": lambda node, a, d: _cast(node, a[0], d[0]),
    "Identity": _any("{0}"),
}

ELEMENTWISE_OPS = frozenset(_EXPRESSIONS)

# float32 ops with an AVX2 form, over __m256 operand expressions. A chain vectorizes when
# every node in it has one; vmath's scalar twins (``ss_expf``...) then compute the tail,
# so the vector body and the scalar tail agree bit for bit.
_VECTOR: dict[str, Callable[[Node, Sequence[str]], str]] = {
    "Add": lambda n, a: f"_mm256_add_ps({a[0]}, {a[1]})",
    "Sub": lambda n, a: f"_mm256_sub_ps({a[0]}, {a[1]})",
    "Mul": lambda n, a: f"_mm256_mul_ps({a[0]}, {a[1]})",
    "Div": lambda n, a: f"_mm256_div_ps({a[0]}, {a[1]})",
    "Neg": lambda n, a: f"_mm256_xor_ps({a[0]}, _mm256_set1_ps(-0.0f))",
    "Abs": lambda n, a: f"ss_abs8({a[0]})",
    # max_ps returns its second operand where either is NaN: x second keeps NaN, as Relu must.
    "Relu": lambda n, a: f"_mm256_max_ps(_mm256_setzero_ps(), {a[0]})",
    "Sqrt": lambda n, a: f"_mm256_sqrt_ps({a[0]})",
    "Reciprocal": lambda n, a: f"_mm256_div_ps(_mm256_set1_ps(1.0f), {a[0]})",
    "Exp": lambda n, a: f"ss_exp8({a[0]})",
    "Log": lambda n, a: f"ss_log8({a[0]})",
    "Tanh": lambda n, a: f"ss_tanh8({a[0]})",
    "Erf": lambda n, a: f"ss_erf8({a[0]})",
    "Sigmoid": lambda n, a: f"ss_sigmoid8({a[0]})",
    "Gelu": lambda n, a: f"ss_gelu{_gelu_suffix(n)}8({a[0]})",
    "Pow": lambda n, a: _power_product(a[0], _pow_exponent(n), lambda x, y: f"_mm256_mul_ps({x}, {y})"),
    "HardSwish": lambda n, a: f"ss_hard_swish8({a[0]})",
    "HardSigmoid": lambda n, a: f"ss_hard_sigmoid8({a[0]}, {_hard_sigmoid_params(n)})",
    "LeakyRelu": lambda n, a: f"ss_leaky_relu8({a[0]}, {_attr_float(n, 'alpha', 0.01)})",
    "Softsign": lambda n, a: f"ss_softsign8({a[0]})",
    "Max": lambda n, a: _fold(a, "ss_max8"),
    "Min": lambda n, a: _fold(a, "ss_min8"),
    "Clip": lambda n, a: _vector_clip(n, a),
    "Floor": lambda n, a: f"_mm256_round_ps({a[0]}, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)",
    "Ceil": lambda n, a: f"_mm256_round_ps({a[0]}, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)",
    "Round": lambda n, a: f"_mm256_round_ps({a[0]}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)",
}
# Ops with an AVX2 form only in some cases: the test for the case.
_VECTOR_WHEN: dict[str, Callable[[Node], bool]] = {"Pow": lambda n: _pow_exponent(n) is not None}
# The float32 scalar forms that match the vector ones above, where _EXPRESSIONS' differ
# (Max, Min, Clip, Floor, Ceil and Round already compute the same thing).
_SCALAR_TWINS: dict[str, Callable[[Node, Sequence[str]], str]] = {
    "Exp": lambda n, a: f"ss_expf({a[0]})",
    "Log": lambda n, a: f"ss_logf({a[0]})",
    "Tanh": lambda n, a: f"ss_tanhf({a[0]})",
    "Erf": lambda n, a: f"ss_erff({a[0]})",
    "Sigmoid": lambda n, a: f"ss_sigmoidf({a[0]})",
    "Gelu": lambda n, a: f"ss_gelu{_gelu_suffix(n)}f({a[0]})",
    "HardSwish": lambda n, a: f"ss_hard_swishf({a[0]})",
    "HardSigmoid": lambda n, a: f"ss_hard_sigmoidf({a[0]}, {_hard_sigmoid_params(n)})",
    "LeakyRelu": lambda n, a: f"ss_leaky_reluf({a[0]}, {_attr_float(n, 'alpha', 0.01)})",
    "Softsign": lambda n, a: f"ss_softsignf({a[0]})",
}


def _scalar_twin(node: Node, args: Sequence[str]) -> Optional[str]:
    """The scalar form matching a node's vector one, where it differs from _EXPRESSIONS'."""
    twin = _SCALAR_TWINS.get(node.op_type)
    return None if twin is None else twin(node, args)


def _hard_sigmoid_params(node: Node) -> str:
    return f"{_attr_float(node, 'alpha', 0.2)}, {_attr_float(node, 'beta', 0.5)}"


def _fold(args: Sequence[str], helper: str) -> str:
    """Max or Min of any number of operands, pairwise from the first (as _minmax)."""
    out = args[0]
    for arg in args[1:]:
        out = f"{helper}({out}, {arg})"
    return out


def _vector_clip(node: Node, args: Sequence[str]) -> str:
    """Clip of float32 vectors: max_ps(lo, x) and min_ps(hi, x) are _clip's ternaries, NaN
    and zeros included."""
    lo, hi = _clip_bounds(node, args, FLOAT, lambda text: f"_mm256_set1_ps({text})")
    return f"_mm256_min_ps({hi}, _mm256_max_ps({lo}, {args[0]}))"


def _gelu_suffix(node: Node) -> str:
    """The suffix of vmath's Gelu helpers for the node's ``approximate`` ("" or "_tanh")."""
    return "_tanh" if node.attrs.get("approximate", "none") == "tanh" else ""


_INT_DTYPES = (INT64, INT32)


def _cast(node: Node, x: str, src: int) -> str:
    to = node.attrs.get("to")
    if to not in C_TYPES:
        raise Unsupported(f"Cast to dtype {to}")
    if to == BOOL:
        return f"(uint8_t)({x} != 0)"
    return f"({C_TYPES[to]})({x})"


# -- fusion ----------------------------------------------------------------------------------


def _output_shape(node: Node) -> tuple:
    out = node.outputs[0]
    if out is None or not isinstance(out.type, TensorType) or out.type.shape is None:
        raise Unsupported("output of unknown shape")
    return tuple(out.type.shape)


def _same_shape(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def _is_elementwise(node: Node) -> bool:
    return (node.op_type in ELEMENTWISE_OPS and node.domain in ("", "ai.onnx") and len(node.outputs) == 1
            and not node.params and not node.has_subgraphs())


def _chain(leader: Node, ctx: LowerContext) -> list[Node]:
    """The leader and the single-reader elementwise nodes after it, same output shape."""
    shape = _output_shape(leader)
    chain = [leader]
    while True:
        out = chain[-1].outputs[0]
        if not ctx.single_use(out):
            return chain
        user = out.users[0][0]
        if not _is_elementwise(user) or user.graph is not leader.graph:
            return chain
        try:
            if not _same_shape(_output_shape(user), shape):
                return chain
            ctx.shape(user.outputs[0]) and ctx.ctype(user.outputs[0])
        except Unsupported:
            return chain
        others = [v for v in user.inputs if v is not None and v is not out]
        if any(v is out for v in others) or not all(ctx.defined_before(v) for v in others):
            return chain
        if sum(1 for v in user.inputs if v is out) != 1:
            return chain
        chain.append(user)


@dataclass
class _Operand:
    value: Value
    name: str  # C local holding its base pointer, or a literal
    literal: bool
    strides: list  # per output axis: "contiguous" (product of later dims) or 0


def _broadcast_axes(value: Value, out_shape: tuple, ctx: LowerContext) -> list[Optional[bool]]:
    """Per output axis, whether ``value`` is broadcast along it: True, False, or None when
    only the run can tell (``min(seq, 512)`` against ``seq``: the generated code then picks
    the stride from the extents and rejects a shape that does not broadcast)."""
    shape = ctx.shape(value)
    if len(shape) > len(out_shape):
        raise Unsupported("input of higher rank than the output")
    pad = len(out_shape) - len(shape)
    flags = [True] * pad
    for d, od in zip(shape, out_shape[pad:]):
        if prove_eq(d, od):
            flags.append(False)
        elif isinstance(d, int) and d == 1:
            flags.append(True)
        else:
            flags.append(None)
    return flags


def _merge_axes(out_shape: tuple, patterns: list[list[bool]]) -> list[tuple[list[int], list[bool]]]:
    """Groups of adjacent output axes that every input reads the same way, as
    (axes, broadcast flag per input)."""
    groups: list[tuple[list[int], list[bool]]] = []
    for axis in range(len(out_shape)):
        flags = [p[axis] for p in patterns]
        # An axis decided at run time stays on its own: its stride is not a product.
        if groups and groups[-1][1] == flags and None not in flags:
            groups[-1][0].append(axis)
        else:
            groups.append(([axis], flags))
    return groups


@lowers(*sorted(ELEMENTWISE_OPS))
def lower_elementwise(node: Node, ctx: LowerContext, opset: int) -> Optional[Lowered]:
    if not _is_elementwise(node):
        return None
    if node.op_type in ("Max", "Min") and len(node.inputs) < 1:
        return None
    chain = _chain(node, ctx)
    out_value = chain[-1].outputs[0]
    out_shape = _output_shape(chain[-1])
    internal = {id(n.outputs[0]) for n in chain[:-1]}
    operands: dict[int, _Operand] = {}
    decls: list[str] = []
    for n in chain:
        for value in n.inputs:
            if value is None or id(value) in internal or id(value) in operands:
                continue
            operands[id(value)] = _operand(value, len(operands), out_shape, ctx, decls)
    # Scalar (and, where every node has one, AVX2) expression of each chain node, in order.
    exprs: dict[int, str] = {}
    vexprs: Optional[dict[int, str]] = {} if _vectorizable(chain, operands, ctx) else None
    for n in chain:
        args, dtypes = [], []
        for value in n.inputs:
            if value is None:
                args.append("")
                dtypes.append(0)
                continue
            dtypes.append(ctx.dtype(value))
            args.append(exprs[id(value)] if id(value) in internal else _read(operands[id(value)]))
        if n.op_type in ("Where",):
            dtypes = dtypes[1:]
        if vexprs is not None:
            vargs = [vexprs[id(v)] if id(v) in internal else _vread(operands[id(v)]) for v in n.inputs]
            vexprs[id(n.outputs[0])] = _VECTOR[n.op_type](n, vargs)
            exprs[id(n.outputs[0])] = _scalar_twin(n, args) or _EXPRESSIONS[n.op_type](n, args, dtypes)
        else:
            exprs[id(n.outputs[0])] = _EXPRESSIONS[n.op_type](n, args, dtypes)
    vector = vexprs[id(out_value)] if vexprs is not None else None
    code, rejects = _refuse_zero_divisors(_loop_nest(out_shape, list(operands.values()), exprs[id(out_value)],
                                                     ctx.ctype(out_value), ctx.ptr(out_value), ctx, decls, vector))
    fragments = ("scalar",) if re.search(r"\bss_(pymod|max|min)_", code) else ()
    if "ss_ipow_" in code:
        fragments += ("intpow",)
    if any(name in code for name in ("_mm256", "ss_expf", "ss_logf", "ss_tanhf", "ss_erff", "ss_sigmoidf", "ss_gelu",
                                     "ss_hard_sigmoidf")):
        fragments += ("vmath",)
    return Lowered(code, fragments=fragments, absorbed=tuple(chain[1:]), can_fail="STEP_ERROR" in code,
                   size_code=_broadcast_size_code(node, ctx), rejects=rejects)


def _broadcast_size_code(node: Node, ctx: LowerContext) -> str:
    """Output dims that only the data fixes (inputs whose dims are late symbols of their
    own): each is the one input dim that is not 1, as ONNX broadcasting has it. Inputs
    that disagree are caught by the loop's run-time broadcast check."""
    late = ctx.late_dims(node.outputs[0])
    if not late:
        return ""
    rank = len(ctx.shape(node.outputs[0]))
    lines = []
    for axis, lvalue in late.items():
        lines.append("{ int64_t d = 1;")
        for value in node.inputs:
            if value is None:
                continue
            shape = ctx.shape(value)
            own = axis - (rank - len(shape))
            if own >= 0:
                lines.append(f"  if ({ctx.dim(shape[own])} != 1) d = {ctx.dim(shape[own])};")
        lines.append(f"  {lvalue} = d; }}")
    return "\n".join(lines)


def _operand(value: Value, index: int, out_shape: tuple, ctx: LowerContext, decls: list[str]) -> _Operand:
    const = ctx.const(value)
    ctype = ctx.ctype(value)
    if const is not None and const.size == 1:
        literal = _literal(const.reshape(()).item(), ctx.dtype(value))
        _broadcast_axes(value, out_shape, ctx)  # still checks that it broadcasts
        return _Operand(value, literal, True, [0] * len(out_shape))
    name = f"in{index}"
    decls.append(f"const {ctype}* {name} = {ctx.ptr(value)};")
    flags = _broadcast_axes(value, out_shape, ctx)
    return _Operand(value, name, False, flags)


def _literal(x, dtype: int) -> str:
    if dtype == FLOAT:
        return float_literal(x)
    if dtype == DOUBLE:
        return repr(float(x)) if np.isfinite(x) else ("NAN" if np.isnan(x) else ("INFINITY" if x > 0 else "(-INFINITY)"))
    if dtype == BOOL:
        return "1" if x else "0"
    return f"(({C_TYPES[dtype]}){int(x)}LL)"


def _read(op: _Operand) -> str:
    return op.name if op.literal else f"{op.name}[OFF_{op.name}]"


def _vread(op: _Operand) -> str:
    """An operand as a vector of 8 lanes: a load, or one value in every lane."""
    if op.literal:
        return f"_mm256_set1_ps({op.name})"
    return f"VLOAD_{op.name}"


def _vectorizable(chain: list[Node], operands: dict, ctx: LowerContext) -> bool:
    values = [op.value for op in operands.values()] + [n.outputs[0] for n in chain]
    return all(_has_vector_form(n) and len([v for v in n.inputs if v is not None]) == len(n.inputs)
               for n in chain) and all(ctx.dtype(v) == FLOAT for v in values)


def _has_vector_form(node: Node) -> bool:
    when = _VECTOR_WHEN.get(node.op_type)
    return node.op_type in _VECTOR and (when is None or when(node))


def _loop_nest(out_shape: tuple, operands: list[_Operand], expr: str, out_ctype: str, out_ptr: str,
               ctx: LowerContext, decls: list[str], vector: Optional[str] = None) -> str:
    """out[i] = expr over the output's index space, inputs read through their strides;
    with ``vector``, the innermost loop runs 8 lanes at a time and ``expr`` does the tail."""
    arrays = [op for op in operands if not op.literal]
    lines = [*decls, f"{out_ctype}* out = {out_ptr};"]
    if not out_shape:  # rank 0: one element
        expr = _fill(expr, "OFF", {op.name: "0" for op in arrays})
        return "\n".join([*lines, f"out[0] = {expr};"])
    groups = _merge_axes(out_shape, [op.strides for op in arrays])
    rank = len(groups)
    for g, (axes, _) in enumerate(groups):
        lines.append(f"const int64_t n{g} = {ctx.numel([out_shape[a] for a in axes])};")
    # An input's stride along merged group g: 0 where it is broadcast, else the product of
    # its own dims after the group (every input is contiguous).
    for k, op in enumerate(arrays):
        shape = ctx.shape(op.value)
        pad = len(out_shape) - len(shape)
        for g, (axes, flags) in enumerate(groups):
            stride = ctx.numel(shape[max(axes[-1] - pad + 1, 0):])
            if flags[k] is None:
                d = ctx.dim(shape[axes[0] - pad])
                lines.append(f"if ({d} != 1 && {d} != n{g}) return STEP_ERROR;  /* does not broadcast */")
                stride = f"({d} == 1 ? 0 : {stride})"
            lines.append(f"const int64_t s_{op.name}_{g} = {'0' if flags[k] else stride};")
    inner = rank - 1
    if vector is not None and any(flag is None for flag in groups[inner][1]):
        vector = None  # lanes need one stride known to be 0 or 1
    if vector is not None:
        # In the innermost merged group an input is either broadcast (one value for all
        # lanes) or contiguous (a plain load).
        loads = {}
        for k, op in enumerate(arrays):
            base = "0" if rank == 1 else f"b_{op.name}"
            loads[op.name] = (f"_mm256_set1_ps({op.name}[{base}])" if groups[inner][1][k]
                              else f"_mm256_loadu_ps({op.name} + {base} + j)")
        vector = _fill(vector, "VLOAD", loads)
    if rank == 1:
        expr = _fill(expr, "OFF", {op.name: f"j * s_{op.name}_0" for op in arrays})
        if vector is None:
            lines.append(f"#pragma omp parallel for if(n0 >= {PARALLEL_ELEMENTS})")
            lines.append(f"for (int64_t j = 0; j < n0; j++) out[j] = {expr};")
            return "\n".join(lines)
        lines.append("const int64_t blocks = n0 / 8;")
        lines.append(f"#pragma omp parallel for if(n0 >= {PARALLEL_ELEMENTS})")
        lines.append(f"for (int64_t blk = 0; blk < blocks; blk++) {{ const int64_t j = blk * 8; "
                     f"_mm256_storeu_ps(out + j, {vector}); }}")
        lines.append(f"for (int64_t j = blocks * 8; j < n0; j++) out[j] = {expr};")
        return "\n".join(["#ifdef __AVX2__", *lines, "#else", *_scalar_flat(lines, expr), "#endif"])
    expr = _fill(expr, "OFF", {op.name: f"b_{op.name} + j * s_{op.name}_{inner}" for op in arrays})
    rows = " * ".join(f"n{g}" for g in range(inner))
    lines.append(f"const int64_t rows = {rows};")
    # One loop per outer group, collapsed for OpenMP: GCC splits the collapsed space into
    # chunks and steps the indices with carries, where recovering them from a flat row
    # index took two divisions a row (a blocked-layout Mul over 8-float rows ran 5x slower).
    collapse = f" collapse({inner})" if inner > 1 else ""
    lines.append(f"#pragma omp parallel for{collapse} if(rows > 1 && rows * n{inner} >= {PARALLEL_ELEMENTS})")
    lines.extend(f"for (int64_t i{g} = 0; i{g} < n{g}; i{g}++)" for g in range(inner))
    lines.append("{")
    row = "i0"
    for g in range(1, inner):
        row = f"({row}) * n{g} + i{g}"
    for op in arrays:
        lines.append(f"    const int64_t b_{op.name} = " + " + ".join(f"i{g} * s_{op.name}_{g}" for g in range(inner)) + ";")
    lines.append(f"    {out_ctype}* o = out + ({row}) * n{inner};")
    lines.append("    int64_t j = 0;")
    if vector is not None:
        lines.append("#ifdef __AVX2__")
        lines.append(f"    for (; j + 8 <= n{inner}; j += 8) _mm256_storeu_ps(o + j, {vector});")
        lines.append("#endif")
    lines.append(f"    for (; j < n{inner}; j++) o[j] = {expr};")
    lines.append("}")
    return "\n".join(lines)


def _fill(template: str, kind: str, values: dict[str, str]) -> str:
    """``template`` with every whole placeholder ``<kind>_<name>`` replaced by values[name]
    in one pass. Replacing one name at a time as plain text also rewrote the names it
    begins (OFF_in1 inside OFF_in10: a Sum of 12 inputs did not compile)."""
    def one(match: re.Match) -> str:
        return values.get(match.group(1), match.group(0))

    return re.sub(rf"\b{kind}_(\w+)\b", one, template)


def _scalar_flat(lines: list[str], expr: str) -> list[str]:
    """The flat loop without AVX2: the declarations, then one scalar loop."""
    declarations = [line for line in lines if not line.startswith(("#pragma", "for ", "const int64_t blocks"))]
    return [*declarations, "for (int64_t j = 0; j < n0; j++) out[j] = " + expr + ";"]
