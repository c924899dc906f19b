"""MatMul and Gemm as calls of the packed GEMM kernel (kernels/gemm.py).

Every case is one ``ss_gemm`` call with strides: NumPy's batch broadcasting is a 0 batch
stride, a transposed operand is swapped strides. Two things make the common model
shapes fast:

- a constant 2-D right operand (a weight) is packed once at load
  (``LowerContext.packed_weight``) and, since the left operand is contiguous, all its
  batch dims fold into M: ``[batch, seq, 768] x [768, 3072]`` is one [batch*seq, 768] GEMM;
- epilogues: an ``Add`` of a per-column bias and a following ``Relu`` are absorbed into
  the GEMM's store (``bias``/``act``), so they cost no extra pass over the output.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import FLOAT
from ...ops.common import product
from ...symbolic import Dim, prove_eq
from . import lowers
from .context import LowerContext, Lowered, Unsupported, float_literal

MAX_BATCH_DIMS = 2


def _gemm_call(ctx: LowerContext, m: str, n: str, k: str, batch: Sequence[str], a: str, a_strides: Sequence[str],
               b: Optional[str], b_strides: Sequence[str], c: str, c_strides: Sequence[str],
               alpha: str = "1.0f", bias: str = "NULL", beta: str = "0.0f", bias_strides=("0", "0"), act: int = 0,
               packed_b: Optional[str] = None) -> str:
    batch0, batch1 = (list(batch) + ["1", "1"])[:2]
    sa0, sa1, rsa, csa = a_strides
    sc0, sc1, ldc = c_strides
    tail = f"{c}, {sc0}, {sc1}, {ldc}, {alpha}, {bias}, {beta}, {bias_strides[0]}, {bias_strides[1]}, {act}"
    if packed_b is not None:
        return f"ss_gemm_prepacked({m}, {n}, {k}, {batch0}, {batch1}, {a}, {sa0}, {sa1}, {rsa}, {csa}, {packed_b}, {tail});"
    sb0, sb1, rsb, csb = b_strides
    return (f"ss_gemm({m}, {n}, {k}, {batch0}, {batch1}, {a}, {sa0}, {sa1}, {rsa}, {csa}, "
            f"{b}, {sb0}, {sb1}, {rsb}, {csb}, {tail});")


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


def _same(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(prove_eq(x, y) for x, y in zip(a, b))


def _is_column_bias(const: np.ndarray, n_dim: Dim) -> bool:
    return isinstance(n_dim, int) and const.size == n_dim and const.ndim >= 1 and const.shape[-1] == n_dim


def _batch_strides(shape: Sequence[Dim], batch_shape: Sequence[Dim], matrix: Dim) -> list:
    """Per output batch dim, the operand's stride (0 where it broadcasts), in dims."""
    pad = len(batch_shape) - len(shape)
    strides: list = []
    step = matrix
    per_dim = []
    for d in reversed(list(shape)):
        per_dim.append(step)
        step = product([step, d])
    per_dim.reverse()
    for axis, od in enumerate(batch_shape):
        k = axis - pad
        if k < 0:
            strides.append(0)
        elif prove_eq(shape[k], od):
            strides.append(per_dim[k])
        elif shape[k] == 1:
            strides.append(0)
        else:
            raise Unsupported(f"cannot tell whether batch dim {shape[k]} broadcasts to {od}")
    return strides


def _merge_batch(batch: list, a: list, b: list) -> tuple[list, list, list]:
    """Merge adjacent batch dims that both operands (and the contiguous output) step
    through uniformly, until at most MAX_BATCH_DIMS remain."""
    batch, a, b = list(batch), list(a), list(b)
    i = len(batch) - 2
    while len(batch) > MAX_BATCH_DIMS and i >= 0:
        ok_a = (a[i] == 0 and a[i + 1] == 0) or prove_eq(a[i], product([a[i + 1], batch[i + 1]]))
        ok_b = (b[i] == 0 and b[i + 1] == 0) or prove_eq(b[i], product([b[i + 1], batch[i + 1]]))
        if ok_a and ok_b:
            batch[i:i + 2] = [product([batch[i], batch[i + 1]])]
            a[i:i + 2] = [a[i + 1]]
            b[i:i + 2] = [b[i + 1]]
        i -= 1
    if len(batch) > MAX_BATCH_DIMS:
        raise Unsupported("more than two batch dims that do not merge")
    return batch, a, b


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
    m, k, n = a_mat[-2], a_mat[-1], b_mat[-1]
    absorbed, bias, act = _epilogue(node, ctx, n)
    out = absorbed[-1].outputs[0] if absorbed else y
    bias_args = {}
    if bias is not None:
        bias_args = dict(bias=ctx.ptr(bias), beta="1.0f", bias_strides=("0", "1"))
    b_const = ctx.const(b)
    if b_const is not None and b_const.ndim == 2:
        # A weight: fold every batch dim of A into M and use the prepacked copy.
        rows = product(list(a_mat[:-1]))
        slot = ctx.packed_weight(b_const)
        code = _gemm_call(ctx, ctx.dim(rows), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), ["0", "0", ctx.dim(k), "1"],
                          None, (), ctx.ptr(out), ["0", "0", ctx.dim(n)], act=act, packed_b=f"(const float*)v[{slot}]",
                          **bias_args)
        return Lowered(code, fragments=("gemm",), absorbed=tuple(absorbed))
    batch_shape = _broadcast_batch(a_mat[:-2], b_mat[:-2])
    a_batch = _batch_strides(a_mat[:-2], batch_shape, product([m, k]))
    b_batch = _batch_strides(b_mat[:-2], batch_shape, product([k, n]))
    batch, a_batch, b_batch = _merge_batch(list(batch_shape), a_batch, b_batch)
    c_batch = []
    step = product([m, n])
    for d in reversed(batch):
        c_batch.append(step)
        step = product([step, d])
    c_batch.reverse()
    pad = lambda xs: ([0] * (2 - len(xs)) + list(xs)) if len(xs) < 2 else list(xs)  # noqa: E731
    batch_args = [ctx.dim(d) for d in ([1] * (2 - len(batch)) + list(batch))]
    sa = [ctx.dim(s) for s in pad(a_batch)] + [ctx.dim(k), "1"]
    sb = [ctx.dim(s) for s in pad(b_batch)] + [ctx.dim(n), "1"]
    sc = [ctx.dim(s) for s in pad(c_batch)] + [ctx.dim(n)]
    code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), batch_args, ctx.ptr(a), sa, ctx.ptr(b), sb,
                      ctx.ptr(out), sc, act=act, **bias_args)
    return Lowered(code, fragments=("gemm",), absorbed=tuple(absorbed))


def _broadcast_batch(a: Sequence[Dim], b: Sequence[Dim]) -> list:
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if prove_eq(x, y) or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise Unsupported(f"cannot broadcast batch dims {x} and {y}")
    return out


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
    m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    n = b_shape[0] if trans_b else b_shape[1]
    sa = ["0", "0", "1", ctx.dim(m)] if trans_a else ["0", "0", ctx.dim(k), "1"]
    bias_args = {}
    if c is not None:
        c_shape = ctx.shape(c)
        if len(c_shape) > 2:
            raise Unsupported("Gemm C of rank > 2")
        full = [1] * (2 - len(c_shape)) + list(c_shape)
        rs = "0" if full[0] == 1 and not prove_eq(m, 1) else ctx.dim(full[1])
        cs = "0" if full[1] == 1 and not prove_eq(n, 1) else "1"
        bias_args = dict(bias=ctx.ptr(c), beta=float_literal(beta), bias_strides=(rs, cs))
    absorbed: list[Node] = []
    act = 0
    if ctx.single_use(y) and y.users[0][0].op_type == "Relu":
        absorbed.append(y.users[0][0])
        act = 1
    out = absorbed[-1].outputs[0] if absorbed else y
    b_const = ctx.const(b)
    common = dict(alpha=float_literal(alpha), act=act, **bias_args)
    if b_const is not None:
        slot = ctx.packed_weight(b_const.T if trans_b else b_const)
        code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), sa, None, (), ctx.ptr(out),
                          ["0", "0", ctx.dim(n)], packed_b=f"(const float*)v[{slot}]", **common)
    else:
        sb = ["0", "0", "1", ctx.dim(k)] if trans_b else ["0", "0", ctx.dim(n), "1"]
        code = _gemm_call(ctx, ctx.dim(m), ctx.dim(n), ctx.dim(k), [], ctx.ptr(a), sa, ctx.ptr(b), sb, ctx.ptr(out),
                          ["0", "0", ctx.dim(n)], **common)
    return Lowered(code, fragments=("gemm",), absorbed=tuple(absorbed))
