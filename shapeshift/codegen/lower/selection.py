"""Ops whose output size can depend on the data: NonZero, NonMaxSuppression, TopK and the
window functions.

Such a rule computes the data-dependent dims in ``Lowered.size_code`` (a step of its own,
run before the outputs exist); the VM binds them as late symbols, allocates the outputs,
and then runs ``code`` (program.py, docs/native.md).
"""

from __future__ import annotations

from typing import Optional

from ...ir.graph import Node
from ...ir.types import FLOAT, INT64
from . import lowers
from .context import LowerContext, Lowered, Unsupported, attr_axis, float_literal


@lowers("NonZero")
def lower_nonzero(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    late = ctx.late_dims(y)
    if set(late) - {1}:
        raise Unsupported("NonZero with an unexpected output shape")
    ctype = ctx.ctype(x)
    total = ctx.numel(shape)
    test = f"(({ctype}*){ctx.raw_ptr(x)})[i] != 0"
    # Count in the size step (only when the count is late: a known count needs none).
    size = (f"int64_t count = 0;\nfor (int64_t i = 0; i < {total}; i++) count += {test};\n"
            f"{late[1]} = count;") if late else ""
    # Row r of the [rank, count] output holds the r-th coordinate of each non-zero, in
    # row-major order: unravel the flat index by the dims, last first.
    rank = len(shape)
    dims = [ctx.dim(d) for d in shape]
    lines = [f"int64_t* out = {ctx.ptr(y, 'int64_t')};",
             f"const int64_t count = {ctx.dim(ctx.shape(y)[1])};",
             "int64_t j = 0;",
             f"for (int64_t i = 0; i < {total} && j < count; i++) {{",
             f"    if (!({test})) continue;",
             "    int64_t rest = i;"]
    for axis in reversed(range(rank)):
        lines.append(f"    out[{axis} * count + j] = rest % {dims[axis]}; rest /= {dims[axis]};")
    if rank == 0:
        # A scalar's output is [1, count] (as onnxruntime's), its one coordinate 0: with no
        # axis to unravel, the row was left unwritten.
        lines.append("    out[j] = 0; (void)rest;")
    lines += ["    j++;", "}"]
    return Lowered("\n".join(lines), size_code=size)


# w[n] = a0 - a1 cos(2 pi n / N') + a2 cos(4 pi n / N'), N' = size (periodic) or size - 1.
WINDOWS = {"HannWindow": (0.5, 0.5, 0.0), "HammingWindow": (25.0 / 46.0, 21.0 / 46.0, 0.0),
           "BlackmanWindow": (0.42, 0.5, 0.08)}


@lowers(*WINDOWS)
def lower_window(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    size, y = node.inputs[0], node.outputs[0]
    ctype = ctx.ctype(y)
    if ctype not in ("float", "double"):
        raise Unsupported(f"{node.op_type} with a non-float output_datatype")
    a0, a1, a2 = WINDOWS[node.op_type]
    late = ctx.late_dims(y)
    # The length is the size input's value: a size step when it is data.
    size_code = f"{late[0]} = {ctx.ptr(size)}[0] > 0 ? (int64_t){ctx.ptr(size)}[0] : 0;" if late else ""
    periodic = int(node.attrs.get("periodic", 1))
    n = ctx.numel(ctx.shape(y))
    # In double, like the reference's float64 constants; N' = 0 (one symmetric point) gives
    # NaN there too.
    code = "\n".join([
        f"{ctype}* out = {ctx.ptr(y)};",
        f"const double denom = (double)({n}{'' if periodic else ' - 1'});",
        f"for (int64_t i = 0; i < {n}; i++) {{",
        "    const double x = 6.283185307179586476925 * (double)i / denom;  /* 2 pi */",
        f"    out[i] = ({ctype})({a0!r} - {a1!r} * cos(x) + {a2!r} * cos(2.0 * x));",
        "}"])
    return Lowered(code, size_code=size_code)


def _scalar_input(node: Node, ctx: LowerContext, index: int, cast: str) -> Optional[str]:
    """A C expression for an optional scalar input: its constant value, or a read of its
    first element at run time; None when absent."""
    if index >= len(node.inputs) or node.inputs[index] is None:
        return None
    value = node.inputs[index]
    const = ctx.const(value)
    if const is not None:
        if const.size == 0:
            return None
        item = const.reshape(-1)[0].item()
        return f"({cast})({float_literal(item) if cast == 'float' else int(item)})"
    return f"({cast}){ctx.ptr(value)}[0]"


@lowers("NonMaxSuppression")
def lower_nms(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    boxes, scores, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if node.params:
        raise Unsupported("NonMaxSuppression parameters computed from input dims")
    if ctx.dtype(boxes) != FLOAT or ctx.dtype(scores) != FLOAT:
        raise Unsupported("NonMaxSuppression on a dtype other than float32")
    box_shape, score_shape = ctx.shape(boxes), ctx.shape(scores)
    if len(box_shape) != 3 or len(score_shape) != 3:
        raise Unsupported("NonMaxSuppression inputs of the wrong rank")
    max_out = _scalar_input(node, ctx, 2, "int64_t") or "0"
    iou = _scalar_input(node, ctx, 3, "float") or "0.0f"
    score = _scalar_input(node, ctx, 4, "float")
    center = int(node.attrs.get("center_point_box", 0))
    b, c, n = ctx.dim(score_shape[0]), ctx.dim(score_shape[1]), ctx.dim(score_shape[2])
    checks = (f"if ({ctx.dim(box_shape[0])} != {b} || {ctx.dim(box_shape[1])} != {n} "
              f"|| {ctx.dim(box_shape[2])} != 4) return STEP_ERROR;")

    def call(out: str) -> str:
        return (f"ss_nms({ctx.ptr(boxes)}, {ctx.ptr(scores)}, {b}, {c}, {n}, {max_out}, {iou}, "
                f"{0 if score is None else 1}, {score or '0.0f'}, {center}, {out})")

    late = ctx.late_dims(y)
    rows = ctx.dim(ctx.shape(y)[0])
    size_code = ""
    if late:
        # The selection runs once to count (this size step) and once to write: both cheap
        # next to the model, and nothing has to live between the two steps.
        size_code = f"{checks}\nconst int64_t count = {call('NULL')};\nif (count < 0) return STEP_ERROR;\n{late[0]} = count;"
        code = f"if ({call(ctx.ptr(y, 'int64_t'))} != {rows}) return STEP_ERROR;"
    else:
        # A declared row count: check it before writing that many rows.
        code = (f"{checks}\nif ({call('NULL')} != {rows}) return STEP_ERROR;\n"
                f"{call(ctx.ptr(y, 'int64_t'))};")
    return Lowered(code, fragments=("nms",), can_fail=True, size_code=size_code)


@lowers("TopK")
def lower_topk(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, values, indices = node.inputs[0], node.outputs[0], node.outputs[1]
    if opset < 10:
        raise Unsupported("TopK-1 (k as an attribute)")
    if ctx.dtype(x) != FLOAT:
        raise Unsupported("TopK on a dtype other than float32")
    shape = ctx.shape(x)
    axis = attr_axis(node, len(shape), default=-1)
    outer = ctx.numel(list(shape[:axis]))
    n = ctx.dim(shape[axis])
    inner = ctx.numel(list(shape[axis + 1:]))
    k = ctx.dim(ctx.shape(values)[axis])
    largest = 1 if int(node.attrs.get("largest", 1)) else 0
    # Both outputs share the k dim: the first one that carries it as a late dim names it.
    late = ctx.late_dims(values) or ctx.late_dims(indices)
    k_input = node.inputs[1] if len(node.inputs) > 1 and 1 not in node.params else None
    if k_input is not None and ctx.dtype(k_input) != INT64:
        raise Unsupported("TopK with a k that is not int64")
    if late and (set(late) != {axis} or k_input is None):
        raise Unsupported("TopK with an unexpected data-dependent output shape")
    size_code, check = "", ""
    if late:
        read = f"{ctx.ptr(k_input, 'int64_t')}[0]"
        size_code = f"if ({read} < 0 || {read} > {n}) return STEP_ERROR;\n{late[axis]} = {read};"
    elif k_input is not None:
        check = f"if ({ctx.ptr(k_input, 'int64_t')}[0] != {k}) return STEP_ERROR;\n"
    code = (f"{check}if ({k} > {n}) return STEP_ERROR;\n"
            f"ss_topk({ctx.ptr(x)}, {ctx.ptr(values)}, {ctx.ptr(indices, 'int64_t')}, {outer}, {n}, {inner}, {k}, "
            f"{largest});")
    return Lowered(code, fragments=("indexing",), can_fail=True, size_code=size_code)
