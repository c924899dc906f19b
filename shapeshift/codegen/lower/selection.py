"""Ops whose output size depends on the data: NonZero and the window functions.

Such a rule computes the data-dependent dims in ``Lowered.size_code`` (a step of its own,
run before the outputs exist); the VM binds them as late symbols, allocates the outputs,
and then runs ``code`` (program.py, docs/native.md).
"""

from __future__ import annotations

from ...ir.graph import Node
from . import lowers
from .context import LowerContext, Lowered, Unsupported


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
