"""Classification losses as generated C loops: NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss.

Both read an input ``[N, C, d1, ...]`` (rank >= 2) as ``[N, C, D]`` with ``D`` the
product of the trailing dims, and an integer target ``[N, d1, ...]`` as ``[N, D]``. Each
(n, d) position contributes ``-w[t] * x[n, t, d]`` (with ``x`` the log-probabilities that
SoftmaxCrossEntropyLoss computes first), where ``w`` is the optional class weight; a target
equal to ``ignore_index`` contributes 0 with weight 0. Reduction ``none`` writes the
``[N, d1, ...]`` losses, ``sum`` their sum and ``mean`` their sum over the sum of the
weights. Sums are accumulated in double.

A target outside ``[0, C)`` that is not ``ignore_index`` makes the step fail
(``return STEP_ERROR``) instead of reading out of bounds.
"""

from __future__ import annotations

from typing import Optional

from ...ir.graph import Node, Value
from ...ir.types import DOUBLE, FLOAT, INT32, INT64
from . import lowers
from .context import LowerContext, Lowered, Unsupported

FLOATS = (FLOAT, DOUBLE)
REDUCTIONS = ("none", "sum", "mean")


def _text(node: Node, name: str, default: str) -> str:
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(node: Node, index: int) -> Optional[Value]:
    return node.inputs[index] if index < len(node.inputs) else None


def _check(node: Node, ctx: LowerContext) -> tuple[Value, Value, Optional[Value], str]:
    """The input, target, weight and reduction, after checking what the loops support."""
    x, target, weight = node.inputs[0], node.inputs[1], _optional(node, 2)
    if ctx.dtype(x) not in FLOATS:
        raise Unsupported(f"{node.op_type} on a dtype other than float32/float64")
    if ctx.dtype(target) not in (INT64, INT32):
        raise Unsupported(f"{node.op_type} target of a dtype other than int64/int32")
    if weight is not None and ctx.dtype(weight) != ctx.dtype(x):
        raise Unsupported(f"{node.op_type} weight of another dtype than the input")
    if len(ctx.shape(x)) < 2:
        raise Unsupported(f"{node.op_type} input of rank < 2")
    reduction = _text(node, "reduction", "mean")
    if reduction not in REDUCTIONS:
        raise Unsupported(f"{node.op_type} reduction {reduction!r}")
    return x, target, weight, reduction


def _loss_loop(ctx: LowerContext, node: Node, target: Value, weight: Optional[Value], reduction: str,
               ctype: str, prepare: list[str], log_prob: str) -> list[str]:
    """The shared loop over the (n, d) positions.

    ``prepare`` are C lines run first at each position (they may declare locals that
    ``log_prob``, a C expression of the class ``t``, reads)."""
    ignore = node.attrs.get("ignore_index")
    ignored = f"tgt == (int64_t)({int(ignore)})" if ignore is not None else "0"
    wt = "(double)wp[tgt]" if weight is not None else "1.0"
    out = ctx.ptr(node.outputs[0])
    store = f"{out}[n * D + d] = ({ctype})loss;" if reduction == "none" else ""
    lines = [
        f"const {ctx.ctype(target)}* tp = {ctx.ptr(target)};",
        f"const {ctype}* wp = {ctx.ptr(weight) if weight is not None else 'NULL'}; (void)wp;",
        "double num = 0.0, den = 0.0;",
        "for (int64_t n = 0; n < N; n++) for (int64_t d = 0; d < D; d++) {",
        "    const int64_t tgt = (int64_t)tp[n * D + d];",
        "    double loss = 0.0, wgt = 0.0;",
        f"    if (!({ignored})) {{",
        "        if (tgt < 0 || tgt >= C) return STEP_ERROR;",
        *("        " + line for line in prepare),
        f"        wgt = {wt};",
        # The reference multiplies the float loss by the float weight: round like it.
        f"        loss = (double)(({ctype})(-({log_prob})) * ({ctype})wgt);",
        "    }",
        f"    {store}",
        "    num += loss; den += wgt;",
        "}",
    ]
    if reduction == "sum":
        lines.append(f"{out}[0] = ({ctype})num;")
    elif reduction == "mean":
        lines.append(f"{out}[0] = ({ctype})(num / den);")
    return lines


def _extents(ctx: LowerContext, x: Value) -> list[str]:
    shape = ctx.shape(x)
    return [f"const int64_t N = {ctx.dim(shape[0])}, C = {ctx.dim(shape[1])}, D = {ctx.numel(shape[2:])};"]


def _mean_without_weight_quirk(node: Node, weight: Optional[Value], reduction: str) -> bool:
    """onnx.reference averages over every position, ignored ones included, when
    NegativeLogLikelihoodLoss has ignore_index = -1 and no weight; the spec divides by the
    count of the others. The two disagree, so the rule declines that case."""
    return weight is None and reduction == "mean" and node.attrs.get("ignore_index") is not None \
        and int(node.attrs["ignore_index"]) == -1


@lowers("NegativeLogLikelihoodLoss")
def lower_nll_loss(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, target, weight, reduction = _check(node, ctx)
    if _mean_without_weight_quirk(node, weight, reduction):
        raise Unsupported("NegativeLogLikelihoodLoss mean with ignore_index -1 and no weight")
    ctype = ctx.ctype(x)
    lines = [*_extents(ctx, x), f"const {ctype}* xp = {ctx.ptr(x)};",
             *_loss_loop(ctx, node, target, weight, reduction, ctype, [], "xp[(n * C + tgt) * D + d]")]
    return Lowered("\n".join(lines), can_fail=True)


def _log_softmax_lines(ctype: str, log_prob_out: Optional[str]) -> list[str]:
    """C lines computing the softmax column at (n, d): ``mx`` its max and ``sm`` the sum of
    ``exp(x - mx)``; and, when the log_prob output is wanted, writing all of it.

    log(p) is computed as the reference does, ``log(exp(x - max) / sum)``, so that a
    probability that underflows gives -inf there too."""
    exp, log = ("expf", "logf") if ctype == "float" else ("exp", "log")
    lines = [f"{ctype} mx = xp[(n * C) * D + d];",
             "for (int64_t c = 1; c < C; c++) { const int64_t at = (n * C + c) * D + d; if (xp[at] > mx) mx = xp[at]; }",
             f"{ctype} sm = 0;",
             f"for (int64_t c = 0; c < C; c++) sm += {exp}(xp[(n * C + c) * D + d] - mx);"]
    if log_prob_out is not None:
        lines.append(f"for (int64_t c = 0; c < C; c++) {{ const int64_t at = (n * C + c) * D + d; "
                     f"{log_prob_out}[at] = {log}({exp}(xp[at] - mx) / sm); }}")
    return lines


@lowers("SoftmaxCrossEntropyLoss")
def lower_softmax_cross_entropy(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, target, weight, reduction = _check(node, ctx)
    ctype = ctx.ctype(x)
    exp, log = ("expf", "logf") if ctype == "float" else ("exp", "log")
    log_prob = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] is not None else None
    if log_prob is not None and ctx.dtype(log_prob) != ctx.dtype(x):
        raise Unsupported("SoftmaxCrossEntropyLoss log_prob of another dtype than the input")
    lp_ptr = ctx.ptr(log_prob) if log_prob is not None else None
    # The columns of positions whose target is ignored still belong in log_prob: those are
    # written first, in a pass of their own, so that the loss loop may skip them.
    lines = [*_extents(ctx, x), f"const {ctype}* xp = {ctx.ptr(x)};"]
    if lp_ptr is not None:
        lines += ["if (C > 0) for (int64_t n = 0; n < N; n++) for (int64_t d = 0; d < D; d++) {",
                  *("    " + line for line in _log_softmax_lines(ctype, lp_ptr)), "}"]
    prepare = _log_softmax_lines(ctype, None)
    at = "(n * C + tgt) * D + d"
    lines += _loss_loop(ctx, node, target, weight, reduction, ctype, prepare, f"{log}({exp}(xp[{at}] - mx) / sm)")
    return Lowered("\n".join(lines), can_fail=True)
