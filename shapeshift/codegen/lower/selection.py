"""Ops whose output size depends on the data: NonZero.

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
