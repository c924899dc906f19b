"""Data movement: views, Transpose, Slice, Concat, Split, Expand, Tile, Pad, Gather, and
the small shape-producing ops.

Reshape-like ops (``VIEW_OPS``) cost nothing: the program builder makes their output a
view of their input's buffer. Everything else that only moves elements is one or more
calls of the strided copy ``ss_copy`` (kernels/layout.py), with strides written as C
expressions over the extents table, so a Transpose of a [batch, seq, 12, 64] tensor is
one call whatever seq is.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import INT32, INT64
from ...ops.common import product
from ...ops.layout_ops import step_within
from ...symbolic import Dim
from . import lowers
from .context import LowerContext, Lowered, Unsupported, c_array

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
#: A Concat or Split of at least this many parts copies them in a loop (``_parts_loop``).
LOOPED_PARTS = 4


def param_values(node: Node, index: int, ctx: LowerContext) -> Optional[list]:
    """The contents of a parameter input as dims: a static parameter, a constant, or None
    when the input is absent."""
    if index in node.params:
        return list(node.params[index].dims)
    if index >= len(node.inputs) or node.inputs[index] is None:
        return None
    const = ctx.const(node.inputs[index])
    if const is None:
        raise Unsupported(f"input {index} is computed at run time")
    return [x.item() for x in const.reshape(-1)]


def contiguous_strides(shape: Sequence[Dim]) -> list[Dim]:
    strides: list[Dim] = []
    step: Dim = 1
    for d in reversed(list(shape)):
        strides.append(step)
        step = product([step, d])
    return strides[::-1]


def copy_call(ctx: LowerContext, elem: int, shape: Sequence[str], src: str, src_strides: Sequence[str],
              dst: str, dst_strides: Sequence[str], tag: str = "") -> str:
    """A block calling ss_copy; extents and strides are C expressions."""
    rank = len(shape)
    return "\n".join([
        "{",
        "    " + c_array(f"shape{tag}", list(shape)),
        "    " + c_array(f"src_strides{tag}", list(src_strides)),
        "    " + c_array(f"dst_strides{tag}", list(dst_strides)),
        f"    ss_copy({elem}, {rank}, shape{tag}, {src}, src_strides{tag}, {dst}, dst_strides{tag});",
        "}",
    ])


def _dims(ctx: LowerContext, dims: Sequence[Dim]) -> list[str]:
    return [ctx.dim(d) for d in dims]


@lowers("Transpose")
def lower_transpose(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    in_shape = ctx.shape(x)
    perm = list(node.attrs.get("perm", range(len(in_shape) - 1, -1, -1)))
    in_strides = contiguous_strides(in_shape)
    out_shape = ctx.shape(y)
    code = copy_call(ctx, ctx.elem_size(x), _dims(ctx, out_shape), ctx.raw_ptr(x),
                     _dims(ctx, [in_strides[p] for p in perm]), ctx.raw_ptr(y),
                     _dims(ctx, contiguous_strides(out_shape)))
    return Lowered(code, fragments=("layout",))


@lowers("Slice")
def lower_slice(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    # The ends are not needed: the output's (planned) shape gives every extent.
    if opset < 10:
        starts, axes, steps = node.attrs.get("starts"), node.attrs.get("axes"), None
    else:
        starts = param_values(node, 1, ctx)
        param_values(node, 2, ctx)  # still declined when computed at run time, as before
        axes, steps = param_values(node, 3, ctx), param_values(node, 4, ctx)
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    rank = len(in_shape)
    if starts is None:
        raise Unsupported("Slice without starts")
    if axes is not None and not all(isinstance(a, (int, np.integer)) for a in axes):
        raise Unsupported("Slice axes computed at run time")
    axes = list(range(len(starts))) if axes is None else [int(a) + rank if int(a) < 0 else int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not all(isinstance(s, (int, np.integer)) and s != 0 for s in steps):
        raise Unsupported("Slice steps computed at run time")
    # Checked here too, as a mutated or hand-made model can reach the lowering with them wrong
    # (the fuzz campaign: a Range turned Slice of a scalar; symbolic axes).
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise Unsupported(f"Slice with {len(starts)} starts, {len(axes)} axes and {len(steps)} steps")
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise Unsupported(f"Slice axes {axes} for an input of rank {rank}")
    in_strides = contiguous_strides(in_shape)
    src_strides = _dims(ctx, in_strides)
    lines = ["int64_t offset = 0;"]
    for k, (axis, start, step) in enumerate(zip(axes, starts, steps)):
        d = ctx.dim(in_shape[axis])
        lines.append(f"{{ int64_t st = {ctx.dim(start)}; const int64_t d = {d};")
        lines.append("  if (st < 0) st += d;")
        if step > 0:
            lines.append("  st = st < 0 ? 0 : (st > d ? d : st);")
        else:
            lines.append("  st = st < 0 ? -1 : (st > d - 1 ? d - 1 : st);")
        lines.append(f"  offset += st * {src_strides[axis]}; }}")
        # Capped as the extent's rule caps it (no int64 overflow in the product; a step past
        # the axis takes one element at most, so its stride is never walked).
        src_strides[axis] = f"({src_strides[axis]}) * ({step_within(int(step), in_shape[axis])})"
    elem = ctx.elem_size(x)
    src = f"(const char*){ctx.raw_ptr(x)} + offset * {elem}"
    lines.append(copy_call(ctx, elem, _dims(ctx, out_shape), src, src_strides, ctx.raw_ptr(y),
                           _dims(ctx, contiguous_strides(out_shape))))
    return Lowered("\n".join(lines), fragments=("layout",))


def _axis(node: Node, rank: int, default: int = 0) -> int:
    axis = int(node.attrs.get("axis", default))
    return axis + rank if axis < 0 else axis


@lowers("Concat")
def lower_concat(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    y = node.outputs[0]
    out_shape = ctx.shape(y)
    axis = _axis(node, len(out_shape))
    outer = product(list(out_shape[:axis]))
    inner = product(list(out_shape[axis + 1:]))
    row = product([out_shape[axis], inner])
    elem = ctx.elem_size(y)
    parts = [v for v in node.inputs if v is not None]
    if len(parts) >= LOOPED_PARTS:
        return Lowered(_parts_loop(ctx, elem, outer, row, [product([ctx.shape(x)[axis], inner]) for x in parts],
                                   ctx.raw_ptr(y), [ctx.raw_ptr(x) for x in parts], concat=True),
                       fragments=("layout",), glue=True)
    lines = ["int64_t offset = 0;"]
    for k, x in enumerate(parts):
        piece = product([ctx.shape(x)[axis], inner])
        dst = f"(char*){ctx.raw_ptr(y)} + offset * {elem}"
        lines.append(_unless_placed(ctx.raw_ptr(x), dst, copy_call(
            ctx, elem, [ctx.dim(outer), ctx.dim(piece)], ctx.raw_ptr(x), [ctx.dim(piece), "1"], dst,
            [ctx.dim(row), "1"], tag=str(k))))
        lines.append(f"offset += {ctx.dim(piece)};")
    return Lowered("\n".join(lines), fragments=("layout",))


@lowers("Split")
def lower_split(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x = node.inputs[0]
    in_shape = ctx.shape(x)
    axis = _axis(node, len(in_shape))
    outer = product(list(in_shape[:axis]))
    inner = product(list(in_shape[axis + 1:]))
    row = product([in_shape[axis], inner])
    elem = ctx.elem_size(x)
    if any(y is None for y in node.outputs):
        raise Unsupported("Split with an absent output")
    if len(node.outputs) >= LOOPED_PARTS:
        return Lowered(_parts_loop(ctx, elem, outer, row, [product([ctx.shape(y)[axis], inner]) for y in node.outputs],
                                   ctx.raw_ptr(x), [ctx.raw_ptr(y) for y in node.outputs], concat=False),
                       fragments=("layout",), glue=True)
    lines = ["int64_t offset = 0;"]
    for k, y in enumerate(node.outputs):
        piece = product([ctx.shape(y)[axis], inner])
        src = f"(const char*){ctx.raw_ptr(x)} + offset * {elem}"
        lines.append(_unless_placed(src, ctx.raw_ptr(y), copy_call(
            ctx, elem, [ctx.dim(outer), ctx.dim(piece)], src, [ctx.dim(row), "1"], ctx.raw_ptr(y),
            [ctx.dim(piece), "1"], tag=str(k))))
        lines.append(f"offset += {ctx.dim(piece)};")
    return Lowered("\n".join(lines), fragments=("layout",))


def _parts_loop(ctx: LowerContext, elem: int, outer: Dim, row: Dim, pieces: Sequence[Dim], whole: str,
                parts: Sequence[str], concat: bool) -> str:
    """A Concat's inputs copied into ``whole`` (or a Split's outputs out of it) by one loop
    over tables of the parts' pointers and sizes: unrolled, SSDlite's 90-input Concats were
    two thirds of the gcc time of the unit that held them."""
    n = len(parts)
    part_type = "const void*" if concat else "void*"
    src, dst = ("parts[k]", "at") if concat else ("at", "parts[k]")
    src_strides, dst_strides = ("part_strides", "whole_strides") if concat else ("whole_strides", "part_strides")
    return "\n".join([
        f"{part_type} const parts[{n}] = {{{', '.join(parts)}}};",
        c_array("pieces", [ctx.dim(d) for d in pieces]),
        "int64_t offset = 0;",
        f"for (int k = 0; k < {n}; k++) {{",
        f"    char* const at = (char*){whole} + offset * {elem};",
        "    if ((const void*)parts[k] != (const void*)at) {",
        f"        const int64_t shape[2] = {{{ctx.dim(outer)}, pieces[k]}};",
        "        const int64_t part_strides[2] = {pieces[k], 1};",
        f"        const int64_t whole_strides[2] = {{{ctx.dim(row)}, 1}};",
        f"        ss_copy({elem}, 2, shape, {src}, {src_strides}, {dst}, {dst_strides});",
        "    }",
        "    offset += pieces[k];",
        "}"])


def _unless_placed(src: str, dst: str, copy: str) -> str:
    """A part's copy, skipped where the arena plan placed the part at its destination
    already (codegen/placement.py)."""
    return f"if ((const void*)({src}) != (const void*)({dst}))\n{copy}"


def _broadcast_strides(ctx: LowerContext, in_shape: Sequence[Dim], out_shape: Sequence[Dim]) -> list[str]:
    from ...symbolic import prove_eq

    strides = contiguous_strides(in_shape)
    pad = len(out_shape) - len(in_shape)
    if pad < 0:
        raise Unsupported("input of higher rank than the output")
    result = ["0"] * pad
    for d, od, s in zip(in_shape, out_shape[pad:], strides):
        if prove_eq(d, od):
            result.append(ctx.dim(s))
        elif d == 1:
            result.append("0")
        else:
            raise Unsupported(f"cannot tell whether {d} broadcasts to {od}")
    return result


@lowers("Expand")
def lower_expand(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    out_shape = ctx.shape(y)
    code = copy_call(ctx, ctx.elem_size(x), _dims(ctx, out_shape), ctx.raw_ptr(x),
                     _broadcast_strides(ctx, ctx.shape(x), out_shape), ctx.raw_ptr(y),
                     _dims(ctx, contiguous_strides(out_shape)))
    return Lowered(code, fragments=("layout",))


@lowers("Tile")
def lower_tile(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    x, y = node.inputs[0], node.outputs[0]
    in_shape = ctx.shape(x)
    repeats = param_values(node, 1, ctx)
    if repeats is None or len(repeats) != len(in_shape) or len(in_shape) > 4:
        raise Unsupported("Tile repeats")
    in_strides = contiguous_strides(in_shape)
    out_strides = contiguous_strides(ctx.shape(y))
    # Output axis k viewed as [repeat, in_dim]: the copy repeats the input along the first.
    shape, src, dst = [], [], []
    for k, d in enumerate(in_shape):
        shape += [ctx.dim(repeats[k]), ctx.dim(d)]
        src += ["0", ctx.dim(in_strides[k])]
        dst += [ctx.dim(product([d, out_strides[k]])), ctx.dim(out_strides[k])]
    code = copy_call(ctx, ctx.elem_size(x), shape, ctx.raw_ptr(x), src, ctx.raw_ptr(y), dst)
    return Lowered(code, fragments=("layout",))


# Pad modes that read the input at a mapped index: i, the output index minus the axis's
# begin pad, taken back into [0, n) (n > 0) as C code over i and n.
PAD_INDEX_MAPS = {
    "edge": "(i < 0 ? 0 : (i >= n ? n - 1 : i))",
    "wrap": "(((i % n) + n) % n)",
    # Mirror without repeating the edge, period 2 (n - 1); one element mirrors onto itself.
    "reflect": "(n == 1 ? 0 : ss_pad_fold((((i % (2 * n - 2)) + (2 * n - 2)) % (2 * n - 2)), n))",
}


@lowers("Pad")
def lower_pad(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    mode = node.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant" and mode not in PAD_INDEX_MAPS:
        raise Unsupported(f"Pad mode {mode!r}")
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    rank = len(in_shape)
    if opset < 11:
        pads, value = node.attrs.get("pads"), node.attrs.get("value", 0.0)
        axes = None
    else:
        pads = param_values(node, 1, ctx)
        constant = param_values(node, 2, ctx)
        value = constant[0] if constant else 0
        axes = param_values(node, 3, ctx)
    axes = list(range(rank)) if axes is None else [int(a) + rank if int(a) < 0 else int(a) for a in axes]
    if pads is None or len(pads) != 2 * len(axes) or not all(0 <= a < rank for a in axes):
        raise Unsupported("pads that do not match the axes")  # the reference evaluator names the error
    begins: list[Dim] = [0] * rank
    for k, axis in enumerate(axes):
        begins[axis] = pads[k]
    if any(isinstance(p, (int, np.integer)) and p < 0 for p in pads):
        raise Unsupported("negative pads")
    if mode != "constant":
        return _pad_by_index_map(ctx, x, y, begins, PAD_INDEX_MAPS[mode])
    ctype = ctx.ctype(y)
    out_strides = contiguous_strides(out_shape)
    offset = " + ".join(f"({ctx.dim(b)}) * {ctx.dim(s)}" for b, s in zip(begins, out_strides)) or "0"
    elem = ctx.elem_size(y)
    lines = [f"const {ctype} value = ({ctype}){_number(value)};",
             f"ss_fill({elem}, {ctx.raw_ptr(y)}, {ctx.numel(out_shape)}, &value);",
             copy_call(ctx, elem, _dims(ctx, in_shape), ctx.raw_ptr(x), _dims(ctx, contiguous_strides(in_shape)),
                       f"(char*){ctx.raw_ptr(y)} + ({offset}) * {elem}", _dims(ctx, out_strides))]
    return Lowered("\n".join(lines), fragments=("layout",))


def _pad_by_index_map(ctx: LowerContext, x: Value, y: Value, begins: Sequence[Dim], index_map: str) -> Lowered:
    """Every output element reads the input at its index mapped back per axis (edge,
    wrap, reflect). An empty input axis under a non-empty output one is an error.

    Row by row of the last axis: the outer axes' source offset is mapped once a row, the
    row's middle (the input row itself) is one memcpy, and only its pads map each index.
    Mapping every element through every axis took 22 us of silero_vad's 90 (a reflect pad
    of 3 x 576 samples: a division and a modulo per axis and element)."""
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    ctype = ctx.ctype(y)
    rank = len(in_shape)
    lines = [f"const {ctype}* in = {ctx.ptr(x)};", f"{ctype}* out = {ctx.ptr(y)};",
             f"if ({ctx.numel(out_shape)} > 0 && {ctx.numel(in_shape)} == 0) return STEP_ERROR;"]
    if rank == 0:
        lines.append("out[0] = in[0];")
        return Lowered("\n".join(lines), fragments=("layout",), can_fail=True)
    last = rank - 1
    width, length, begin = ctx.dim(out_shape[last]), ctx.dim(in_shape[last]), ctx.dim(begins[last])
    lines += [f"const int64_t ow = {width}, iw = {length}, b = {begin};",
              "if (ow > 0) {",
              # Output columns [lo, hi) read input columns [lo - b, hi - b) as they are.
              "    int64_t lo = b < 0 ? 0 : (b > ow ? ow : b), hi = b + iw < ow ? b + iw : ow;",
              "    if (hi < lo) hi = lo;",
              f"    for (int64_t r = 0; r < {ctx.numel(out_shape)} / ow; r++) {{",
              "        int64_t rest = r, src = 0, stride = iw;"]
    for axis in reversed(range(last)):
        lines += [f"        {{ const int64_t n = {ctx.dim(in_shape[axis])};",
                  f"          const int64_t i = rest % {ctx.dim(out_shape[axis])} - ({ctx.dim(begins[axis])});",
                  f"          rest /= {ctx.dim(out_shape[axis])};",
                  f"          src += {index_map} * stride; stride *= n; }}"]
    lines += [f"        const {ctype}* irow = in + src;",
              f"        {ctype}* orow = out + r * ow;",
              "        const int64_t n = iw;",
              f"        for (int64_t j = 0; j < lo; j++) {{ const int64_t i = j - b; orow[j] = irow[{index_map}]; }}",
              f"        if (hi > lo) memcpy(orow + lo, irow + (lo - b), (size_t)(hi - lo) * sizeof({ctype}));",
              f"        for (int64_t j = hi; j < ow; j++) {{ const int64_t i = j - b; orow[j] = irow[{index_map}]; }}",
              "    }",
              "}"]
    return Lowered("\n".join(lines), fragments=("layout",), can_fail=True)


def _number(x) -> str:
    x = float(x)
    if np.isnan(x):
        return "NAN"
    if np.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return repr(x)


@lowers("Gather")
def lower_gather(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    data, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape = ctx.shape(data)
    axis = _axis(node, len(shape))
    index_dtype = ctx.dtype(indices)
    if index_dtype not in (INT64, INT32):
        raise Unsupported("Gather indices dtype")
    fn = "ss_gather" if index_dtype == INT64 else "ss_gather_i32"
    outer = ctx.dim(product(list(shape[:axis])))
    inner = ctx.dim(product(list(shape[axis + 1:])))
    code = (f"if ({fn}({ctx.elem_size(data)}, {ctx.raw_ptr(data)}, {outer}, {ctx.dim(shape[axis])}, {inner}, "
            f"{ctx.ptr(indices)}, {ctx.numel(ctx.shape(indices))}, {ctx.raw_ptr(y)})) return STEP_ERROR;")
    return Lowered(code, fragments=("indexing",), can_fail=True)


@lowers("Shape")
def lower_shape(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", rank))
    start, end = (max(0, min(rank, s + rank if s < 0 else s)) for s in (start, end))
    out = ctx.ptr(node.outputs[0], "int64_t")
    code = "\n".join(f"{out}[{k}] = {ctx.dim(d)};" for k, d in enumerate(shape[start:end])) or "(void)0;"
    return Lowered(code)


@lowers("SymbolicTensor", domain="ai.shapeshift")
def lower_symbolic_tensor(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    """Simplify's stand-in for a Shape computation: its contents are dims of the inputs,
    which the extents table already holds."""
    y = node.outputs[0]
    ctype = ctx.ctype(y)
    out = ctx.ptr(y)
    code = "\n".join(f"{out}[{k}] = ({ctype}){ctx.dim(d)};" for k, d in enumerate(node.params[0].dims))
    return Lowered(code or "(void)0;")


@lowers("Size")
def lower_size(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    return Lowered(f"{ctx.ptr(node.outputs[0], 'int64_t')}[0] = {ctx.numel(ctx.shape(node.inputs[0]))};")


@lowers("ConstantOfShape")
def lower_constant_of_shape(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    y = node.outputs[0]
    value = node.attrs.get("value")
    scalar = 0 if value is None else np.asarray(value).reshape(-1)[0].item()
    ctype = ctx.ctype(y)
    code = (f"const {ctype} value = ({ctype}){_number(scalar)};\n"
            f"ss_fill({ctx.elem_size(y)}, {ctx.raw_ptr(y)}, {ctx.numel(ctx.shape(y))}, &value);")
    # A shape computed from data: the output's dims are the shape tensor's contents.
    shape = ctx.ptr(node.inputs[0], "int64_t") if ctx.has_late_dims() else ""
    # A negative dim is no shape (the reference backend refuses it too).
    size = "\n".join(f"if ({shape}[{axis}] < 0) return STEP_ERROR;\n{lvalue} = {shape}[{axis}];"
                      for axis, lvalue in ctx.late_dims(y).items())
    return Lowered(code, fragments=("layout",), size_code=size, can_fail=bool(size))


@lowers("Range")
def lower_range(node: Node, ctx: LowerContext, opset: int) -> Lowered:
    y = node.outputs[0]
    ctype = ctx.ctype(y)
    start, delta = node.inputs[0], node.inputs[2]
    code = (f"const {ctype} start = {ctx.ptr(start)}[0], delta = {ctx.ptr(delta)}[0];\n"
            f"{ctype}* out = {ctx.ptr(y)};\n"
            f"for (int64_t i = 0; i < {ctx.numel(ctx.shape(y))}; i++) out[i] = start + ({ctype})i * delta;")
    size = ""
    late = ctx.late_dims(y)
    if late:
        # Bounds computed from data: max(ceil((limit - start) / delta), 0) elements, as ONNX
        # defines it (in double: exact for every float32 and for integers up to 2^53).
        limit = node.inputs[1]
        # A zero delta, or a NaN bound, makes no count of elements (numpy refuses them too);
        # a count past int64 is refused here rather than cast into a negative one.
        size = (f"if ({ctx.ptr(delta)}[0] == 0) return STEP_ERROR;\n"
                f"const double span = ((double){ctx.ptr(limit)}[0] - (double){ctx.ptr(start)}[0])"
                f" / (double){ctx.ptr(delta)}[0];\n"
                f"if (span != span || span > 9.0e18) return STEP_ERROR;\n"
                f"{late[0]} = span > 0 ? (int64_t)ceil(span) : 0;")
    return Lowered(code, size_code=size, can_fail=bool(size))

