"""MatMul and Gemm as calls of the packed GEMM kernel (kernels/gemm.py).

Every case is one ``ss_gemm`` call with strides: NumPy's batch broadcasting is a 0 batch
stride, a transposed operand is swapped strides. Two things make the common model
shapes fast:

- a constant 2-D right operand (a weight) is packed once at load
  (``LowerContext.packed_weight``) and, since the left operand is contiguous, all its
  batch dims fold into M: ``[batch, seq, 768] x [768, 3072]`` is one [batch*seq, 768] GEMM;
  ``Gemm``'s B is packed as [K, N] whatever ``transB`` (transposed once, at load), and its
  ``transA`` is a swap of A's strides, so no transposition is left for run time;
- a product by a packed weight whose M may be 1..4 at run time (M is often a symbolic
  batch) calls ``ss_gemv_prepacked`` (kernels/gemv.py): the same packed copy, streamed
  at memory bandwidth for such M, handed on to the GEMM for larger M;
- epilogues: an ``Add`` of a per-column bias and a following ``Relu`` are absorbed into
  the GEMM's store (``bias``/``act``), so they cost no extra pass over the output.

A MatMul that starts an attention (Q K^T, scale, mask, Softmax, P V) is lowered with the
rest of it as one kernel call by attention_fusion.py.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import FLOAT
from ...ops.common import product
from ...symbolic import Dim, prove_eq
from ..kernels import gemv
from . import lowers
from .attention_fusion import fused_attention
from .context import LowerContext, Lowered, Unsupported, float_literal
from .layout import contiguous_strides
from .matmul_views import (MAX_BATCH_DIMS, as_matrix, batch_strides, broadcast_batch, merge_batch,
                           operand_view, output_view)


def _gemm_call(ctx: LowerContext, m: str, n: str, k: str, batch: Sequence[str], a: str, a_strides: Sequence[str],
               b: Optional[str], b_strides: Sequence[str], c: str, c_strides: Sequence[str],
               alpha: str = "1.0f", bias: str = "NULL", beta: str = "0.0f", bias_strides=("0", "0"), act: int = 0,
               packed_b: Optional[str] = None, prepacked_fn: str = "ss_gemm_prepacked", fn: str = "ss_gemm") -> str:
    batch0, batch1 = (list(batch) + ["1", "1"])[:2]
    sa0, sa1, rsa, csa = a_strides
    sc0, sc1, ldc = c_strides
    tail = f"{c}, {sc0}, {sc1}, {ldc}, {alpha}, {bias}, {beta}, {bias_strides[0]}, {bias_strides[1]}, {act}"
    if packed_b is not None:
        return f"{prepacked_fn}({m}, {n}, {k}, {batch0}, {batch1}, {a}, {sa0}, {sa1}, {rsa}, {csa}, {packed_b}, {tail});"
    sb0, sb1, rsb, csb = b_strides
    return (f"{fn}({m}, {n}, {k}, {batch0}, {batch1}, {a}, {sa0}, {sa1}, {rsa}, {csa}, "
            f"{b}, {sb0}, {sb1}, {rsb}, {csb}, {tail});")


def _prepacked_call(m: Dim, fn: str) -> tuple[str, tuple[str, ...]]:
    """The function multiplying by a weight packed for ``fn`` and the fragments it needs:
    the GEMV where M can be small and the weight has the default GEMM layout (a tuned
    dispatcher, which packs its own layout, keeps its calls)."""
    if fn == "ss_gemm_prepacked" and not (isinstance(m, int) and m > gemv.MAX_ROWS):
        return "ss_gemv_prepacked", ("gemm", "gemv")
    return fn, ("gemm",)


def _epilogue(node: Node, ctx: LowerContext, n_dim: Dim) -> tuple[list[Node], Optional[Value], int]:
    """Nodes after ``node`` that fold into the GEMM store: Add(per-column constant bias),
    then Relu. Returns (absorbed nodes, bias value, act)."""
    absorbed: list[Node] = []
    bias = None
    act = 0
    out = node.outputs[0]
    if ctx.single_use(out):
        user = out.users[0][0]
        if user.op_type == "Add" and user.domain in ("", "ai.onnx") and not user.attrs and len(user.inputs) == 2:
            other = user.inputs[1] if user.inputs[0] is out else user.inputs[0]
            const = ctx.const(other)
            if const is not None and const.dtype == np.float32 and _is_column_bias(const, n_dim) \
                    and _same(ctx.shape(user.outputs[0]), ctx.shape(out)):
                absorbed.append(user)
                bias = other
                out = user.outputs[0]
    if ctx.single_use(out):
        user = out.users[0][0]
        if user.op_type == "Relu" and user.domain in ("", "ai.onnx"):
            absorbed.append(user)
            act = 1
    return absorbed, bias, act


def _bias_stride(ctx: LowerContext, dim: Dim, out_dim: Dim, step: str) -> str:
    """The stride of Gemm's C along an axis of the output: 0 where it broadcasts (its dim is 1),
    ``step`` where it does not; decided when the code runs if only the run can tell (C [cn]
    with cn a symbol of its own: 1 or N, as the run-time agreement checks make sure)."""
    if prove_eq(dim, out_dim):
        return step
    if isinstance(dim, int):
        return "0" if dim == 1 else step
    return f"({ctx.dim(dim)} == 1 ? 0 : {step})"


def _same(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def _is_column_bias(const: np.ndarray, n_dim: Dim) -> bool:
    return isinstance(n_dim, int) and const.size == n_dim and const.ndim >= 1 and const.shape[-1] == n_dim


@lowers("MatMul")
def lower_matmul(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if ctx.dtype(a) != FLOAT or ctx.dtype(b) != FLOAT:
        raise Unsupported("MatMul on a dtype other than float32")
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if not a_shape or not b_shape:
        raise Unsupported("MatMul of a scalar")
    a_mat = a_shape if len(a_shape) >= 2 else (1, a_shape[0])
    b_mat = b_shape if len(b_shape) >= 2 else (b_shape[0], 1)
    k, n = a_mat[-1], b_mat[-1]
    b_const = ctx.const(b)
    if b_const is None:
        # Q K^T, then scale, mask, Softmax and P V: one kernel, the scores never stored.
        fused = fused_attention(node, ctx, opset)
        if fused is not None:
            return fused
    absorbed, bias, act = _epilogue(node, ctx, n)
    out = absorbed[-1].outputs[0] if absorbed else y
    bias_args = {}
    if bias is not None:
        bias_args = dict(bias=ctx.ptr(bias), beta="1.0f", bias_strides=("0", "1"))
    if b_const is not None and b_const.ndim == 2:
        # A weight: fold every batch dim of A into M and use the prepacked copy.
        rows = product(list(a_mat[:-1]))
        slot, fn = ctx.packed_weight(b_const)
        fn, fragments = _prepacked_call(rows, fn)
        code = _gemm_call(ctx, ctx.dim(rows), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), ["0", "0", ctx.dim(k), "1"],
                          None, (), ctx.ptr(out), ["0", "0", ctx.dim(n)], act=act, packed_b=f"(const float*)v[{slot}]",
                          prepacked_fn=fn, **bias_args)
        return Lowered(code, fragments=fragments, absorbed=tuple(absorbed))
    return _lower_batched(node, ctx, a, b, n, absorbed, act, bias_args)


def _lower_batched(node: Node, ctx: LowerContext, a: Value, b: Value, n: Dim, absorbed: list, act: int,
                   bias_args: dict) -> Lowered:
    """The general case: one ss_gemm call over up to two (merged) batch dims, operands
    and result addressed through strides."""
    va, vb = as_matrix(operand_view(a, ctx), True), as_matrix(operand_view(b, ctx), False)
    m, k = va.shape[-2], va.shape[-1]
    batch_shape = broadcast_batch(va.shape[:-2], vb.shape[:-2])
    out_shape = (*batch_shape, m, n)
    if absorbed:
        out, c_strides, moved = absorbed[-1].outputs[0], contiguous_strides(out_shape), ()
    else:
        out, c_strides, moved = output_view(node, out_shape, ctx)
    a_batch, b_batch = batch_strides(va, batch_shape), batch_strides(vb, batch_shape)
    batch, a_batch, b_batch, c_batch = merge_batch(list(batch_shape), a_batch, b_batch, c_strides[:-2])
    ones = [1] * (MAX_BATCH_DIMS - len(batch))
    zeros = [0] * (MAX_BATCH_DIMS - len(batch))
    dims = lambda xs: [ctx.dim(x) for x in xs]  # noqa: E731
    sa = dims(zeros + a_batch) + dims(va.strides[-2:])
    sb = dims(zeros + b_batch) + dims(vb.strides[-2:])
    sc = dims(zeros + c_batch) + [ctx.dim(c_strides[-2])]
    fn = ctx.batched_gemm_fn(m, n, k, batch, [*a_batch, *va.strides[-2:]], [*b_batch, *vb.strides[-2:]],
                             [*c_batch, c_strides[-2]])
    code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), dims(ones + batch), ctx.ptr(va.source), sa,
                      ctx.ptr(vb.source), sb, ctx.ptr(out), sc, act=act, fn=fn, **bias_args)
    return Lowered(code, fragments=("gemm",), absorbed=tuple(absorbed) + moved, cancels=va.cancels + vb.cancels,
                   reads=tuple(v.source for v in (va, vb) if v.cancels))


@lowers("Gemm")
def lower_gemm(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    y = node.outputs[0]
    if ctx.dtype(a) != FLOAT:
        raise Unsupported("Gemm on a dtype other than float32")
    trans_a, trans_b = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if len(a_shape) != 2 or len(b_shape) != 2:
        # Only in a branch that does not type-check (the If rule types the other one): it
        # cannot be the branch that runs, and the fallback refuses it if it does.
        raise Unsupported(f"Gemm of operands of rank {len(a_shape)} and {len(b_shape)}")
    m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    n = b_shape[0] if trans_b else b_shape[1]
    sa = ["0", "0", "1", ctx.dim(m)] if trans_a else ["0", "0", ctx.dim(k), "1"]
    bias_args = {}
    if c is not None:
        c_shape = ctx.shape(c)
        if len(c_shape) > 2:
            raise Unsupported("Gemm C of rank > 2")
        full = [1] * (2 - len(c_shape)) + list(c_shape)
        rs = _bias_stride(ctx, full[0], m, ctx.dim(full[1]))
        cs = _bias_stride(ctx, full[1], n, "1")
        bias_args = dict(bias=ctx.ptr(c), beta=float_literal(beta), bias_strides=(rs, cs))
    absorbed: list[Node] = []
    act = 0
    if ctx.single_use(y) and y.users[0][0].op_type == "Relu":
        absorbed.append(y.users[0][0])
        act = 1
    out = absorbed[-1].outputs[0] if absorbed else y
    b_const = ctx.const(b)
    common = dict(alpha=float_literal(alpha), act=act, **bias_args)
    fragments: tuple[str, ...] = ("gemm",)
    if b_const is not None:
        slot, fn = ctx.packed_weight(b_const.T if trans_b else b_const)
        fn, fragments = _prepacked_call(m, fn)
        code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), sa, None, (), ctx.ptr(out),
                          ["0", "0", ctx.dim(n)], packed_b=f"(const float*)v[{slot}]", prepacked_fn=fn, **common)
    else:
        sb = ["0", "0", "1", ctx.dim(k)] if trans_b else ["0", "0", ctx.dim(n), "1"]
        code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), sa, ctx.ptr(b), sb, ctx.ptr(out),
                          ["0", "0", ctx.dim(n)], **common)
    return Lowered(code, fragments=fragments, absorbed=tuple(absorbed))


@lowers("Det")
def lower_det(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """Determinants of the trailing [M, M] matrices: Gaussian elimination with partial
    pivoting, in double (as NumPy's LU), one matrix at a time."""
    x, y = node.inputs[0], node.outputs[0]
    if ctx.dtype(x) != FLOAT:
        raise Unsupported("Det on a dtype other than float32")
    shape = ctx.shape(x)
    if len(shape) < 2 or not prove_eq(shape[-1], shape[-2]):
        raise Unsupported("Det of matrices not provably square")
    m = ctx.dim(shape[-1])
    batch = ctx.numel(list(shape[:-2]))
    code = f"""const float* x = {ctx.ptr(x)};
float* y = {ctx.ptr(y)};
const int64_t M = {m}, B = {batch};
double* a = (double*)malloc(sizeof(double) * (M * M > 0 ? M * M : 1));
if (!a) return STEP_ERROR;
for (int64_t b = 0; b < B; b++) {{
    for (int64_t i = 0; i < M * M; i++) a[i] = x[b * M * M + i];
    double det = 1.0;
    for (int64_t c = 0; c < M && det != 0.0; c++) {{
        int64_t p = c;
        for (int64_t r = c + 1; r < M; r++) if (fabs(a[r * M + c]) > fabs(a[p * M + c])) p = r;
        if (a[p * M + c] == 0.0) {{ det = 0.0; break; }}
        if (p != c) {{
            for (int64_t k = 0; k < M; k++) {{ double t = a[c * M + k]; a[c * M + k] = a[p * M + k]; a[p * M + k] = t; }}
            det = -det;
        }}
        det *= a[c * M + c];
        for (int64_t r = c + 1; r < M; r++) {{
            const double f = a[r * M + c] / a[c * M + c];
            for (int64_t k = c; k < M; k++) a[r * M + k] -= f * a[c * M + k];
        }}
    }}
    y[b] = (float)det;
}}
free(a);"""
    return Lowered(code, can_fail=True)
