"""ONNX Attention (opset 23) as one generated C loop over the query rows.

Q, K and V are read in place through strides, whether 4-D ``[B, H, L, D]`` or 3-D
``[B, L, H * D]`` (heads from ``q_num_heads``/``kv_num_heads``); a key position below the
past length reads ``past_key``/``past_value`` and the others K/V, so the concatenation is
only materialized when ``present_key``/``present_value`` are outputs. Grouped KV heads map
query head ``h`` to KV head ``h / (Hq / Hkv)``, as the reference's ``np.repeat``.

Each query row (b, h, i) follows onnx.reference step by step, to match it within float32
rounding: the scores ``(q * s) . (k * s)`` with ``s = sqrt(scale)`` (dot products in
double), softcap ``c * tanh(x / c)``, the additive bias (the mask — bool as 0/-inf, padded
with -inf past its last dim — plus the bottom-right causal -inf, offset by the past
length), a softmax whose fully -inf rows give 0, the guard that zeroes a row whose bias is
all -inf, and ``P @ V``. ``qk_matmul_output`` is written at the stage its mode names.

Declined: dtypes other than float32/float64 (float16 has no native kernels), head counts
not known at build time or not dividing, ``nonpad_kv_seqlen`` (opset 24), a
``softmax_precision`` other than the input's, masks that broadcast in a way the strides
below cannot prove.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...ir.graph import Node, Value
from ...ir.types import BOOL, DOUBLE, FLOAT
from ...symbolic import Dim
from . import lowers
from .context import LowerContext, Lowered, Unsupported, float_literal
from .layout import contiguous_strides

FLOATS = (FLOAT, DOUBLE)
Q_IN, K_IN, V_IN, MASK_IN, PAST_K_IN, PAST_V_IN, NONPAD_IN = range(7)
QK_MODES = (0, 1, 2, 3)


@dataclass(frozen=True)
class _Layout:
    """Where element (b, h, l, 0) of a [B, H, L, D] view of a 3-D or 4-D tensor lies."""

    batch: Dim
    heads: int
    length: Dim
    head_size: Dim
    rank: int

    def strides(self) -> tuple[Dim, Dim, Dim]:
        """(batch, head, position) strides, in elements."""
        if self.rank == 4:
            return (self.heads * self.length * self.head_size, self.length * self.head_size, self.head_size)
        return (self.length * self.heads * self.head_size, self.head_size, self.heads * self.head_size)


def _input(node: Node, index: int) -> Optional[Value]:
    return node.inputs[index] if index < len(node.inputs) else None


def _output(node: Node, index: int, ctx: LowerContext) -> Optional[Value]:
    """An output the code must write: present and read by someone."""
    value = node.outputs[index] if index < len(node.outputs) else None
    return None if index > 0 and ctx.unused(value) else value


def _layout(ctx: LowerContext, value: Value, heads_attr: Optional[int]) -> _Layout:
    shape = ctx.shape(value)
    if len(shape) == 4:
        if heads_attr is not None:
            raise Unsupported("Attention head-count attributes with 4-D inputs")
        if not isinstance(shape[1], int):
            raise Unsupported("Attention head count not known at build time")
        return _Layout(shape[0], int(shape[1]), shape[2], shape[3], 4)
    if len(shape) == 3:
        if heads_attr is None or not isinstance(shape[2], int) or heads_attr <= 0 or shape[2] % heads_attr:
            raise Unsupported("Attention 3-D input without a head count dividing its hidden size")
        return _Layout(shape[0], heads_attr, shape[1], int(shape[2]) // heads_attr, 3)
    raise Unsupported("Attention inputs of rank other than 3 or 4")


def _opt_int(node: Node, name: str) -> Optional[int]:
    return int(node.attrs[name]) if name in node.attrs and node.attrs[name] is not None else None


def _check_dtypes(node: Node, ctx: LowerContext) -> None:
    dtype = ctx.dtype(node.inputs[Q_IN])
    if dtype not in FLOATS:
        raise Unsupported("Attention on a dtype other than float32/float64")
    for index in (K_IN, V_IN, PAST_K_IN, PAST_V_IN):
        value = _input(node, index)
        if value is not None and ctx.dtype(value) != dtype:
            raise Unsupported("Attention inputs of mixed dtypes")
    mask = _input(node, MASK_IN)
    if mask is not None and ctx.dtype(mask) not in (BOOL, dtype):
        raise Unsupported("Attention mask of a dtype other than bool or the input's")
    precision = _opt_int(node, "softmax_precision")
    if precision is not None and precision != dtype:
        raise Unsupported("Attention softmax_precision other than the input dtype")


def _mask_lines(ctx: LowerContext, mask: Value, target: Sequence[Dim], ctype: str) -> tuple[list[str], str]:
    """C lines declaring the mask's strides over (b, h, i) and its last dim ``M``, and the
    C expression of the mask's additive value at (b, h, i, j)."""
    shape = ctx.shape(mask)
    if not 1 <= len(shape) <= 4:
        raise Unsupported("Attention mask of rank other than 1..4")
    strides = contiguous_strides(shape)
    lead = [None] * (4 - len(shape)) + list(range(len(shape)))  # mask axis of each of (b, h, i, j)
    names = []
    for axis, want in zip(lead[:3], target[:3]):
        if axis is None or (isinstance(shape[axis], int) and shape[axis] == 1):
            names.append("0")
        elif _same(shape[axis], want):
            names.append(ctx.dim(strides[axis]))
        else:
            raise Unsupported("Attention mask that broadcasts in a way not provable at build time")
    lines = [f"const int64_t msb = {names[0]}, msh = {names[1]}, msi = {names[2]}, M = {ctx.dim(shape[-1])};",
             "if (M > L) return STEP_ERROR;  /* a mask longer than the keys does not broadcast */",
             f"const {ctx.ctype(mask)}* mp = {ctx.ptr(mask)};"]
    at = "mp[b * msb + h * msh + i * msi + j]"
    # Keys past the mask's last dim are masked: the reference pads with False / -inf.
    value = f"(j < M ? ({at} ? ({ctype})0 : ({ctype})(-INFINITY)) : ({ctype})(-INFINITY))" \
        if ctx.dtype(mask) == BOOL else f"(j < M ? {at} : ({ctype})(-INFINITY))"
    return lines, value


def _same(a: Dim, b: Dim) -> bool:
    from ...symbolic import prove_eq

    return prove_eq(a, b)


def _scale_expr(node: Node) -> str:
    """sqrt(scale) as the reference rounds it: computed in double, then cast."""
    scale = node.attrs.get("scale")
    if scale is None:
        return "sqrt(1.0 / sqrt((double)Dh))"
    return f"sqrt({float(scale)!r})"


def _dims_lines(ctx: LowerContext, q: _Layout, k: _Layout, v: _Layout, past: Dim, y_rank: int) -> list[str]:
    qs, ks, vs = (tuple(ctx.dim(s) for s in lay.strides()) for lay in (q, k, v))
    y = _Layout(q.batch, q.heads, q.length, v.head_size, y_rank)
    ys = tuple(ctx.dim(s) for s in y.strides())
    return [
        f"const int64_t B = {ctx.dim(q.batch)}, Hq = {q.heads}, Hkv = {k.heads}, reps = {q.heads // k.heads};",
        f"const int64_t Lq = {ctx.dim(q.length)}, Lk = {ctx.dim(k.length)}, Lp = {ctx.dim(past)}, L = Lp + Lk;",
        f"const int64_t Dh = {ctx.dim(q.head_size)}, Dv = {ctx.dim(v.head_size)};",
        f"const int64_t qsb = {qs[0]}, qsh = {qs[1]}, qsi = {qs[2]};",
        f"const int64_t ksb = {ks[0]}, ksh = {ks[1]}, ksi = {ks[2]};",
        f"const int64_t vsb = {vs[0]}, vsh = {vs[1]}, vsi = {vs[2]};",
        f"const int64_t ysb = {ys[0]}, ysh = {ys[1]}, ysi = {ys[2]};",
        "(void)Hq;",
    ]


def _present_lines(ctype: str, out: str, past: str, cur: str, size: str, s: str) -> list[str]:
    """present = concat(past, current) along the sequence axis, [B, Hkv, L, size]."""
    return ["for (int64_t b = 0; b < B; b++) for (int64_t hk = 0; hk < Hkv; hk++) for (int64_t j = 0; j < L; j++) {",
            f"    {ctype}* dst = {out} + ((b * Hkv + hk) * L + j) * {size};",
            f"    const {ctype}* src = j < Lp ? {past} + ((b * Hkv + hk) * Lp + j) * {size} "
            f": {cur} + b * {s}sb + hk * {s}sh + (j - Lp) * {s}si;",
            f"    for (int64_t d = 0; d < {size}; d++) dst[d] = src[d];", "}"]


def _row_lines(ctype: str, softcap: float, mask_value: Optional[str], causal: bool, mode: int,
               qk_out: Optional[str]) -> list[str]:
    """The body of the loop over query rows (b, h, i)."""
    exp, tanh = ("expf", "tanhf") if ctype == "float" else ("exp", "tanh")
    bias_terms = [mask_value] if mask_value is not None else []
    if causal:
        bias_terms.append(f"(j <= i + Lp ? ({ctype})0 : ({ctype})(-INFINITY))")
    bias = " + ".join(bias_terms) if bias_terms else f"({ctype})0"
    cap = float_literal(softcap) if ctype == "float" else repr(float(softcap))
    qk_at = "qk[((b * Hq + h) * Lq + i) * L + j]"
    lines = [
        "const int64_t hk = h / reps;",
        f"const {ctype}* qr = qp + b * qsb + h * qsh + i * qsi;",
        f"{ctype} bmax = ({ctype})(-INFINITY), smax = ({ctype})(-INFINITY);",
        "for (int64_t j = 0; j < L; j++) {",
        f"    const {ctype}* kr = j < Lp ? pk + ((b * Hkv + hk) * Lp + j) * Dh : kp + b * ksb + hk * ksh + (j - Lp) * ksi;",
        "    double acc = 0.0;",
        f"    for (int64_t d = 0; d < Dh; d++) acc += (double)(({ctype})(qr[d] * sc) * ({ctype})(kr[d] * sc));",
        f"    {ctype} s = ({ctype})acc;",
    ]
    if softcap > 0:
        lines.append(f"    s = {tanh}(s / {cap}) * {cap};")
    if qk_out is not None and mode in (0, 1):
        lines.append(f"    {qk_at} = s;")
    lines += [f"    const {ctype} bias = {bias};", "    s = s + bias;"]
    if qk_out is not None and mode == 2:
        lines.append(f"    {qk_at} = s;")
    lines += [
        "    row[j] = s;",
        "    if (bias > bmax) bmax = bias;",
        "    if (s > smax || s != s) smax = (smax != smax) ? smax : s;  /* NaN propagates, as np.max */",
        "}",
        # A row that is all -inf softmaxes to 0 (the reference's safe max and 0/0 guard).
        f"const {ctype} safe = (smax == ({ctype})(-INFINITY)) ? ({ctype})0 : smax;",
        f"{ctype} sum = 0;",
        f"for (int64_t j = 0; j < L; j++) {{ row[j] = {exp}(row[j] - safe); sum += row[j]; }}",
        f"if (sum == ({ctype})0) sum = ({ctype})1;",
        "const int masked = (bmax == -INFINITY);  /* every key disallowed: the row is 0 */",
        f"for (int64_t j = 0; j < L; j++) row[j] = masked ? ({ctype})0 : row[j] / sum;",
    ]
    if qk_out is not None and mode == 3:
        lines.append(f"for (int64_t j = 0; j < L; j++) {qk_at} = row[j];")
    lines += [
        f"{ctype}* yr = yp + b * ysb + h * ysh + i * ysi;",
        "for (int64_t d = 0; d < Dv; d++) {",
        "    double acc = 0.0;",
        "    for (int64_t j = 0; j < L; j++) {",
        f"        const {ctype}* vr = j < Lp ? pv + ((b * Hkv + hk) * Lp + j) * Dv : vp + b * vsb + hk * vsh + (j - Lp) * vsi;",
        "        acc += (double)row[j] * (double)vr[d];",
        "    }",
        f"    yr[d] = ({ctype})acc;",
        "}",
    ]
    return lines


@lowers("Attention")
def lower_attention(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    _check_dtypes(node, ctx)
    if _input(node, NONPAD_IN) is not None:
        raise Unsupported("Attention with nonpad_kv_seqlen")
    q_in, k_in, v_in = node.inputs[Q_IN], node.inputs[K_IN], node.inputs[V_IN]
    past_k, past_v = _input(node, PAST_K_IN), _input(node, PAST_V_IN)
    if (past_k is None) != (past_v is None):
        raise Unsupported("Attention with only one of past_key and past_value")
    q = _layout(ctx, q_in, _opt_int(node, "q_num_heads"))
    k = _layout(ctx, k_in, _opt_int(node, "kv_num_heads"))
    v = _layout(ctx, v_in, _opt_int(node, "kv_num_heads"))
    if k.rank != q.rank or v.rank != q.rank or k.heads != v.heads or q.heads % k.heads:
        raise Unsupported("Attention head counts that do not group")
    if not _same(q.head_size, k.head_size) or not _same(k.length, v.length):
        raise Unsupported("Attention Q/K head sizes or K/V lengths not provably equal")
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    if mode not in QK_MODES:
        raise Unsupported(f"Attention qk_matmul_output_mode {mode}")
    past_len: Dim = ctx.shape(past_k)[2] if past_k is not None else 0
    if past_k is not None and (len(ctx.shape(past_k)) != 4 or len(ctx.shape(past_v)) != 4):
        raise Unsupported("Attention past of rank other than 4")
    ctype = ctx.ctype(q_in)
    total: Dim = past_len + k.length
    lines = [*_dims_lines(ctx, q, k, v, past_len, q.rank),
             f"const {ctype}* qp = {ctx.ptr(q_in)}; const {ctype}* kp = {ctx.ptr(k_in)}; const {ctype}* vp = {ctx.ptr(v_in)};",
             f"const {ctype}* pk = {ctx.ptr(past_k) if past_k is not None else 'NULL'};",
             f"const {ctype}* pv = {ctx.ptr(past_v) if past_v is not None else 'NULL'};",
             f"{ctype}* yp = {ctx.ptr(node.outputs[0])};",
             f"{ctype}* row = ({ctype}*)WORK;",
             f"const {ctype} sc = ({ctype}){_scale_expr(node)};"]
    for index, cur, size, s in ((1, "kp", "Dh", "k"), (2, "vp", "Dv", "v")):
        present = _output(node, index, ctx)
        if present is not None:
            lines += _present_lines(ctype, ctx.ptr(present), "pk" if index == 1 else "pv", cur, size, s)
    mask = _input(node, MASK_IN)
    mask_value = None
    if mask is not None:
        mask_lines, mask_value = _mask_lines(ctx, mask, (q.batch, q.heads, q.length, total), ctype)
        lines += mask_lines
    qk_out = _output(node, 3, ctx)
    if qk_out is not None:
        lines.append(f"{ctype}* qk = {ctx.ptr(qk_out)};")
    body = _row_lines(ctype, float(node.attrs.get("softcap", 0.0)), mask_value, bool(int(node.attrs.get("is_causal", 0))),
                      mode, "qk" if qk_out is not None else None)
    lines += ["for (int64_t b = 0; b < B; b++) for (int64_t h = 0; h < Hq; h++) for (int64_t i = 0; i < Lq; i++) {",
              *("    " + line for line in body), "}"]
    return Lowered("\n".join(lines), can_fail=mask is not None, work_bytes=total * ctx.elem_size(q_in))
