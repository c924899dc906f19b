"""How a MatMul reads its operands and writes its product: strided views of buffers.

A Transpose feeding only the product is read through permuted strides instead of
being copied; batch dims are broadcast with 0 strides and merged where every operand
steps through them uniformly; the product may be written straight into the output
of a Transpose that reads it. Shared by the MatMul lowering (linalg.py) and the fused
attention (attention_fusion.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...ir.graph import Node, Value
from ...ops.common import product
from ...symbolic import Dim, prove_eq
from .context import LowerContext, Unsupported
from .layout import contiguous_strides

MAX_BATCH_DIMS = 2


@dataclass
class View:
    """How the GEMM reads an operand: the buffer of ``source`` through ``strides``."""

    source: Value
    shape: tuple
    strides: list
    cancels: tuple = ()


def operand_view(value: Value, ctx: LowerContext) -> View:
    """A Transpose feeding only this MatMul is read through permuted strides instead of
    being copied (its step is dropped); anything else is read as it is."""
    shape = tuple(ctx.shape(value))
    producer = value.producer
    if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx") \
            and ctx.cancellable(producer):
        source = producer.inputs[0]
        perm = list(producer.attrs.get("perm", range(len(shape) - 1, -1, -1)))
        base = contiguous_strides(ctx.shape(source))
        return View(source, shape, [base[p] for p in perm], (producer,))
    return View(value, shape, contiguous_strides(shape))


def as_matrix(view: View, left: bool) -> View:
    """1-D operands as NumPy sees them: [1, K] on the left, [K, 1] on the right."""
    if len(view.shape) >= 2:
        return view
    if left:
        return View(view.source, (1, *view.shape), [0, *view.strides], view.cancels)
    return View(view.source, (*view.shape, 1), [*view.strides, 0], view.cancels)


def batch_strides(view: View, batch_shape: Sequence[Dim]) -> list:
    """Per output batch dim, the operand's stride (0 where it broadcasts)."""
    return broadcast_strides(view.shape[:-2], view.strides[:-2], batch_shape)


def broadcast_strides(shape: Sequence[Dim], strides: Sequence[Dim], target: Sequence[Dim]) -> list:
    """Per dim of ``target``, the stride of a tensor of ``shape`` and ``strides``
    broadcast to it (0 where it repeats, NumPy's rules)."""
    pad = len(target) - len(shape)
    result: list = []
    for axis, od in enumerate(target):
        k = axis - pad
        if k < 0 or (shape[k] == 1 and not prove_eq(shape[k], od)):
            result.append(0)
        elif prove_eq(shape[k], od):
            result.append(strides[k])
        else:
            raise Unsupported(f"cannot tell whether dim {shape[k]} broadcasts to {od}")
    return result


def merge_batch(batch: list, *operands: list) -> tuple:
    """Drop batch dims of extent 1, then merge adjacent ones that every operand steps
    through uniformly, until at most MAX_BATCH_DIMS remain."""
    keep = [i for i, d in enumerate(batch) if not (isinstance(d, int) and d == 1)]
    batch = [batch[i] for i in keep]
    operands = [[op[i] for i in keep] for op in operands]
    i = len(batch) - 2
    while len(batch) > MAX_BATCH_DIMS and i >= 0:
        if all((op[i] == 0 and op[i + 1] == 0) or prove_eq(op[i], product([op[i + 1], batch[i + 1]]))
               for op in operands):
            batch[i:i + 2] = [product([batch[i], batch[i + 1]])]
            for op in operands:
                op[i:i + 2] = [op[i + 1]]
        i -= 1
    if len(batch) > MAX_BATCH_DIMS:
        raise Unsupported("more than two batch dims that do not merge")
    return (batch, *operands)


def output_view(node: Node, out_shape: tuple, ctx: LowerContext) -> tuple:
    """Where the product goes: its own buffer, or — when its only reader is a Transpose
    that keeps the last axis last — straight into that Transpose's output, through the
    inverse permutation (attention's [B,H,T,D] -> [B,T,H,D] costs no copy)."""
    y = node.outputs[0]
    if ctx.single_use(y) and len(out_shape) >= 2:
        user = y.users[0][0]
        if user.op_type == "Transpose" and user.domain in ("", "ai.onnx"):
            perm = list(user.attrs.get("perm", range(len(out_shape) - 1, -1, -1)))
            if perm[-1] == len(out_shape) - 1:
                target = contiguous_strides(ctx.shape(user.outputs[0]))
                return user.outputs[0], [target[perm.index(k)] for k in range(len(out_shape))], (user,)
    return y, contiguous_strides(out_shape), ()


def broadcast_batch(a: Sequence[Dim], b: Sequence[Dim]) -> list:
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
