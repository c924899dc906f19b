"""Shape tensors and the ops they flow through: Shape, Size, Reshape, Concat, ...

Models build shapes at run time out of small integer tensors, e.g.
``Reshape(x, Concat(Shape(x)[0:2], [12, 64]))``.  Besides each output's type,
the type rules here record an output's *contents* as dimensions when they are
known (``ctx.set_contents``), so a shape assembled from ``Shape(x)`` keeps its
symbolic dims instead of turning unknown.  Contents are recorded flat, in
row-major order, whatever the output's rank.

``gather_shape_contents`` is the contents part of Gather, for the Gather rule
(in indexing.py) to call.  Slice, Pad and the layout ops live in
``layout_ops``; Constant, Range and other tensor makers in ``constant_ops``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..ir.types import INT64, TensorType
from ..symbolic import Dim, Expr, add_all, bounds, ceildiv, floordiv, mul, sub
from .common import MAX_RANK, broadcast_shapes, normalize_axes, normalize_axis, product, tensor
from .context import InferContext
from .registry import define

# -- helpers shared by the shape-tensor op modules --------------------------------


def int64_vector(length: Dim) -> TensorType:
    return TensorType(INT64, (length,))


def static_ints(dims: Optional[Sequence[Dim]]) -> Optional[list[int]]:
    """``dims`` as plain ints, or None when unknown or partly symbolic."""
    if dims is None or any(isinstance(d, Expr) for d in dims):
        return None
    return [int(d) for d in dims]


def fresh_shape(ctx: InferContext, rank: Optional[int], prefix: str) -> Optional[tuple]:
    """A shape of ``rank`` fresh dims (None when the rank is unknown too)."""
    if rank is None:
        return None
    if not 0 <= rank <= MAX_RANK:
        ctx.fail(f"its output would have rank {rank}; a tensor has 0 to {MAX_RANK} dimensions")
    return tuple(ctx.fresh_dim(prefix) for _ in range(rank))


def param_length(ctx: InferContext, index: int) -> Optional[int]:
    """The static length of 1-D parameter input ``index``, from its type: a shape, axes
    or starts list, one entry per dimension, so at most MAX_RANK."""
    shape = ctx.input_shape(index)
    if shape is None or len(shape) != 1 or isinstance(shape[0], Expr):
        return None
    if shape[0] > MAX_RANK:
        ctx.fail(f"input {index} is declared with {shape[0]} entries, one per dimension, and a tensor has at most "
                 f"{MAX_RANK} dimensions")
    return int(shape[0])


def vector_contents(ctx: InferContext, index: int) -> Optional[tuple]:
    """Known contents of input ``index`` when it is a 0-D or 1-D tensor."""
    shape = ctx.input_shape(index)
    if shape is not None and len(shape) > 1:
        return None
    return ctx.input_dims(index)


def axes_param(ctx: InferContext, input_index: int, input_since: int) -> tuple[Optional[list[int]], bool]:
    """An ``axes`` parameter read from the attribute (before ``input_since``) or the input.

    Returns (axes, known): axes None with known True means "not given".
    """
    if ctx.opset < input_since:
        axes = ctx.attr("axes")
        return (None if axes is None else [int(a) for a in axes]), True
    if not ctx.has_input(input_index):
        return None, True
    axes = static_ints(ctx.input_dims(input_index))
    return axes, axes is not None


def ints_of(array: Optional[np.ndarray]) -> Optional[list[int]]:
    """An evaluator's parameter array as a list of Python ints."""
    return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def _pass_contents(ctx: InferContext, out: Optional[TensorType]) -> None:
    """Ops that only re-view their data keep the (flat) contents of input 0."""
    contents = ctx.input_dims(0)
    if contents is not None and out is not None and out.shape is not None:
        ctx.set_contents(0, contents)


# -- Shape, Size -------------------------------------------------------------------


def _shape_window(ctx, rank: int) -> tuple[int, int]:
    if ctx.opset < 15:
        return 0, rank
    # Python slicing clamps exactly as the spec says: into [0, rank].
    start, end, _ = slice(ctx.attr("start", 0), ctx.attr("end", None)).indices(rank)
    return start, max(start, end)


def _shape_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is None:
        return [int64_vector(ctx.fresh_dim("rank"))]
    start, end = _shape_window(ctx, len(shape))
    dims = shape[start:end]
    ctx.set_contents(0, dims)
    return [int64_vector(len(dims))]


def _shape(ctx, x):
    start, end = _shape_window(ctx, x.ndim)
    return [np.array(x.shape[start:end], dtype=np.int64)]


def _size_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is not None:
        ctx.set_contents(0, (product(shape),))
    return [TensorType(INT64, ())]


def _size(ctx, x):
    return [np.array(x.size, dtype=np.int64)]


define("Shape", infer=_shape_type, evaluate=_shape)
define("Size", infer=_size_type, evaluate=_size)

# -- Reshape, Flatten ------------------------------------------------------------------


def _reshape_entry(ctx, value: Dim, position: int, in_shape, allowzero: bool) -> Optional[Dim]:
    """The output dim for one entry of the target shape; None stands for -1."""
    if isinstance(value, Expr):
        lo, hi = bounds(value)
        if lo >= 1 or (allowzero and lo >= 0):
            return value
        # It might be 0 ("copy the input dim") or -1 at run time.
        if in_shape is not None and position < len(in_shape) and in_shape[position] is value and lo >= 0:
            return value
        return ctx.fresh_dim("reshape")
    value = int(value)
    if value == -1:
        return None
    if value < -1:
        ctx.fail(f"invalid shape entry {value}")
    if value == 0 and not allowzero:
        if in_shape is None:
            return ctx.fresh_dim("reshape")
        if position >= len(in_shape):
            ctx.fail(f"shape entry {position} is 0 but the input has rank {len(in_shape)}")
        return in_shape[position]
    return value


def _divide_out(total: Dim, factor: Dim) -> Dim:
    """total // factor, dividing a symbolic factor's monomial and coefficient separately.

    floor(floor(a/b)/c) == floor(a/(b*c)) for positive b and c, and dividing
    by the bare monomial first lets exact division cancel symbols: (B*T*768) //
    (2*T) becomes 384*B rather than an opaque quotient.
    """
    if isinstance(factor, Expr) and len(factor.terms) == 1:
        coefficient = factor.terms[0][1]
        if coefficient > 0:
            return floordiv(floordiv(total, floordiv(factor, coefficient)), coefficient)
    return floordiv(total, factor)


def _infer_minus_one(ctx, in_shape, known: list[Dim]) -> Dim:
    if in_shape is None:
        return ctx.fresh_dim("reshape")
    total, rest = product(in_shape), product(known)
    if not isinstance(rest, Expr):
        if rest == 0:
            ctx.fail("cannot infer the -1 dimension next to a 0 dimension")
        if not isinstance(total, Expr) and total % rest:
            ctx.fail(f"cannot reshape {total} elements into blocks of {rest}")
    result = total
    for factor in known:
        result = _divide_out(result, factor)
    return result


def _reshape_dims(ctx, in_shape, target: Sequence[Dim]) -> tuple:
    allowzero = ctx.opset >= 14 and bool(ctx.attr("allowzero", 0))
    dims = [_reshape_entry(ctx, v, i, in_shape, allowzero) for i, v in enumerate(target)]
    holes = [i for i, d in enumerate(dims) if d is None]
    if len(holes) > 1:
        ctx.fail("the target shape has more than one -1")
    if holes:
        dims[holes[0]] = _infer_minus_one(ctx, in_shape, [d for d in dims if d is not None])
    elif in_shape is not None:
        before, after = product(in_shape), product(dims)
        if not isinstance(before, Expr) and not isinstance(after, Expr) and before != after:
            ctx.fail(f"cannot reshape {before} elements into {after}")
    return tuple(dims)


def _reshape_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    target = ctx.input_dims(1)
    if target is None:
        return [tensor(dtype, fresh_shape(ctx, param_length(ctx, 1), "reshape"))]
    out = tensor(dtype, _reshape_dims(ctx, ctx.input_shape(0), target))
    _pass_contents(ctx, out)
    return [out]


def _reshape(ctx, x, shape):
    target = ints_of(shape)
    if ctx.opset < 14 or not ctx.attr("allowzero", 0):
        target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
    return [np.reshape(x, target)]


def _flatten_axis(ctx, rank: int) -> int:
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis <= rank:
        ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flatten_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    if shape is None:
        out = tensor(ctx.input_dtype(0), fresh_shape(ctx, 2, "flatten"))
    else:
        axis = _flatten_axis(ctx, len(shape))
        out = tensor(ctx.input_dtype(0), (product(shape[:axis]), product(shape[axis:])))
        _pass_contents(ctx, out)
    return [out]


def _flatten(ctx, x):
    axis = _flatten_axis(ctx, x.ndim)
    return [x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))]


define("Reshape", infer=_reshape_type, evaluate=_reshape, params=(1,))
define("Flatten", infer=_flatten_type, evaluate=_flatten)

# -- Squeeze, Unsqueeze, Transpose ------------------------------------------------------


def _squeeze_dims(ctx, shape: tuple, axes: Optional[list[int]]) -> Optional[tuple]:
    if axes is None:
        # Without axes every dim equal to 1 goes; a dim that may or may not be 1
        # leaves the rank unknown.
        if any(isinstance(d, Expr) and d.lo <= 1 <= d.hi for d in shape):
            return None
        return tuple(d for d in shape if isinstance(d, Expr) or d != 1)
    axes = normalize_axes(axes, len(shape), ctx)
    for a in axes:
        if not isinstance(shape[a], Expr) and shape[a] != 1:
            ctx.fail(f"cannot squeeze axis {a} of size {shape[a]}")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _squeeze_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    axes, known = axes_param(ctx, 1, 13)
    if shape is None:
        out = tensor(ctx.input_dtype(0), None)
    elif not known:
        length = param_length(ctx, 1)
        out = tensor(ctx.input_dtype(0), fresh_shape(ctx, None if length is None else len(shape) - length, "squeeze"))
    else:
        out = tensor(ctx.input_dtype(0), _squeeze_dims(ctx, shape, axes))
    _pass_contents(ctx, out)
    return [out]


def _squeeze(ctx, x, axes=None):
    axes = ctx.attr("axes") if ctx.opset < 13 else ints_of(axes)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(normalize_axes(axes, x.ndim)))]


def _unsqueeze_dims(ctx, shape: tuple, axes: list[int]) -> tuple:
    rank = len(shape) + len(axes)
    axes = normalize_axes(axes, rank, ctx, unique=True)
    rest = iter(shape)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


def _unsqueeze_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    axes, known = axes_param(ctx, 1, 13)
    if known and axes is None:
        ctx.fail("Unsqueeze needs axes")
    if shape is None:
        out = tensor(ctx.input_dtype(0), None)
    elif not known:
        length = param_length(ctx, 1)
        out = tensor(ctx.input_dtype(0), fresh_shape(ctx, None if length is None else len(shape) + length, "unsqueeze"))
    else:
        out = tensor(ctx.input_dtype(0), _unsqueeze_dims(ctx, shape, axes))
    _pass_contents(ctx, out)
    return [out]


def _unsqueeze(ctx, x, axes=None):
    axes = ctx.attr("axes") if ctx.opset < 13 else ints_of(axes)
    return [np.expand_dims(x, axis=tuple(int(a) for a in axes))]


def _perm(ctx, rank: int) -> list[int]:
    perm = ctx.attr("perm")
    if perm is None:
        return list(range(rank))[::-1]
    # Entries are 0 .. rank-1 as written: ONNX defines no negative ones (onnx's inference and
    # onnxruntime refuse them), and the lowering reads the attribute as given.
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm {perm} is not a permutation of 0..{rank - 1} (rank {rank})")
    return perm


def _transpose_type(ctx: InferContext) -> list:
    shape = ctx.input_shape(0)
    dtype = ctx.input_dtype(0)
    if shape is None:
        perm = ctx.attr("perm")
        return [tensor(dtype, fresh_shape(ctx, None if perm is None else len(perm), "transpose"))]
    out = tensor(dtype, tuple(shape[p] for p in _perm(ctx, len(shape))))
    if len(shape) <= 1:
        _pass_contents(ctx, out)
    return [out]


def _transpose(ctx, x):
    return [np.transpose(x, _perm(ctx, x.ndim))]


define("Squeeze", infer=_squeeze_type, evaluate=_squeeze, params=(1,))
define("Unsqueeze", infer=_unsqueeze_type, evaluate=_unsqueeze, params=(1,))
define("Transpose", infer=_transpose_type, evaluate=_transpose)

# -- Concat, Split -----------------------------------------------------------------------


def _merge_dims(ctx, dims: list[Dim], axis: int) -> Dim:
    """The common size of one non-concatenated axis: a static size wins."""
    static = {int(d) for d in dims if not isinstance(d, Expr)}
    if len(static) > 1:
        ctx.fail(f"inputs disagree on axis {axis}: sizes {sorted(static)}")
    return static.pop() if static else dims[0]


def _concat_type(ctx: InferContext) -> list:
    indices = [i for i in range(ctx.num_inputs) if ctx.has_input(i)]
    dtype = next((ctx.input_dtype(i) for i in indices if ctx.input_dtype(i) is not None), None)
    shapes = [ctx.input_shape(i) for i in indices]
    known = [s for s in shapes if s is not None]
    if not known:
        return [tensor(dtype, None)]
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        ctx.fail(f"inputs have different ranks {[len(s) for s in known]}")
    if rank == 0:
        ctx.fail("inputs are scalars: Concat joins tensors of rank >= 1 along an axis")
    axis = normalize_axis(int(ctx.attr("axis", 0)), rank, ctx)
    out = []
    for k in range(rank):
        if k == axis:
            out.append(_sum_dims(ctx, shapes, k))
        else:
            out.append(_merge_dims(ctx, [s[k] for s in known], k))
    parts = [vector_contents(ctx, i) for i in indices]
    if rank == 1 and all(p is not None for p in parts):
        ctx.set_contents(0, tuple(d for p in parts for d in p))
    return [tensor(dtype, tuple(out))]


def _sum_dims(ctx, shapes, axis: int) -> Dim:
    if any(s is None for s in shapes):
        return ctx.fresh_dim("concat")
    return add_all(s[axis] for s in shapes)


def _concat(ctx, *inputs):
    present = [x for x in inputs if x is not None]
    return [np.concatenate(present, axis=int(ctx.attr("axis", 0)))]


def _split_sizes(ctx, dim: Optional[Dim], count: int) -> Optional[list[Dim]]:
    """The size of each output along the split axis; None entries are unknown."""
    if ctx.opset < 13:
        split = ctx.attr("split")
    elif ctx.has_input(1):
        split = ctx.input_dims(1)
        if split is None:
            return None
    else:
        split = None
    if split is not None:
        split = list(split)
        if len(split) != count:
            ctx.fail(f"split has {len(split)} entries for {count} outputs")
        total = add_all(split)
        if dim is not None and not isinstance(dim, Expr) and not isinstance(total, Expr) and total != dim:
            ctx.fail(f"split sizes add up to {total}, not the axis size {dim}")
        return split
    if dim is None:
        return None
    if ctx.opset >= 18 and ctx.has_attr("num_outputs"):
        # Chunks of ceil(dim / n); the last one takes what is left.
        chunk = ceildiv(dim, count)
        last = sub(dim, mul(chunk, count - 1))
        if not isinstance(last, Expr) and last < 0:
            ctx.fail(f"cannot split {dim} into {count} chunks")
        return [chunk] * (count - 1) + [last]
    if not isinstance(dim, Expr) and dim % count:
        ctx.fail(f"cannot split {dim} evenly into {count} outputs")
    return [floordiv(dim, count)] * count


def _split_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    count = ctx.num_outputs
    if shape is None:
        _split_sizes(ctx, None, count)
        return [tensor(dtype, None)] * count
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape), ctx)
    sizes = _split_sizes(ctx, shape[axis], count)
    if sizes is None:
        sizes = [ctx.fresh_dim("split") for _ in range(count)]
    outs = [tensor(dtype, shape[:axis] + (s,) + shape[axis + 1:]) for s in sizes]
    contents = vector_contents(ctx, 0)
    offsets = static_ints(sizes)
    if len(shape) == 1 and contents is not None and offsets is not None:
        start = 0
        for i, size in enumerate(offsets):
            ctx.set_contents(i, contents[start:start + size])
            start += size
    return outs


def _split(ctx, x, split=None):
    axis = int(ctx.attr("axis", 0))
    sizes = ctx.attr("split") if ctx.opset < 13 else ints_of(split)
    count = ctx.num_outputs
    if sizes is None:
        dim = x.shape[axis]
        if ctx.opset >= 18 and ctx.has_attr("num_outputs"):
            chunk = -(-dim // count)
            sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        else:
            sizes = [dim // count] * count
    else:
        # Sizes given at run time: np.split would give the last part whatever is left.
        if len(sizes) != count or any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
            ctx.fail(f"split sizes {list(sizes)} do not cut axis {axis} of size {x.shape[axis]} into {count} "
                     "parts")
    cuts = np.cumsum(sizes)[:-1]
    return [part.copy() for part in np.split(x, cuts, axis=axis)]


define("Concat", infer=_concat_type, evaluate=_concat)
define("Split", infer=_split_type, evaluate=_split, params=(1,))

# -- Expand, Tile ------------------------------------------------------------------------


def _broadcast_contents(contents: tuple, shape: tuple) -> Optional[tuple]:
    """Flat contents of a 0-D/1-D tensor broadcast to a static 0-D/1-D shape."""
    size = static_ints(shape)
    if size is None or len(size) > 1:
        return None
    n = size[0] if size else 1
    if len(contents) == 1:
        return contents * n
    return contents if len(contents) == n else None


def _expand_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    target = ctx.input_dims(1)
    if target is None:
        length = param_length(ctx, 1)
        rank = None if shape is None or length is None else max(len(shape), length)
        return [tensor(dtype, fresh_shape(ctx, rank, "expand"))]
    out_shape = broadcast_shapes([shape, tuple(target)], ctx)
    contents = vector_contents(ctx, 0)
    if contents is not None and out_shape is not None:
        ctx.set_contents(0, _broadcast_contents(contents, out_shape))
    return [tensor(dtype, out_shape)]


def _expand(ctx, x, shape):
    out_shape = np.broadcast_shapes(x.shape, tuple(ints_of(shape)))
    return [np.array(np.broadcast_to(x, out_shape))]


def _tile_type(ctx: InferContext) -> list:
    dtype = ctx.input_dtype(0)
    shape = ctx.input_shape(0)
    repeats = ctx.input_dims(1)
    if shape is None:
        return [tensor(dtype, fresh_shape(ctx, param_length(ctx, 1), "tile"))]
    if repeats is None:
        return [tensor(dtype, fresh_shape(ctx, len(shape), "tile"))]
    if len(repeats) != len(shape):
        ctx.fail(f"{len(repeats)} repeats for an input of rank {len(shape)}")
    negative = [r for r in repeats if isinstance(r, int) and r < 0]
    if negative:  # a symbolic dim times it is negative: the native plan sized buffers with it
        ctx.fail(f"Tile repeats must be >= 0, got {list(repeats)}")
    out = tensor(dtype, tuple(mul(d, r) for d, r in zip(shape, repeats)))
    contents = vector_contents(ctx, 0)
    times = static_ints(repeats)
    if len(shape) == 1 and contents is not None and times is not None:
        ctx.set_contents(0, tuple(contents) * times[0])
    return [out]


def _tile(ctx, x, repeats):
    return [np.tile(x, ints_of(repeats))]


define("Expand", infer=_expand_type, evaluate=_expand, params=(1,))
define("Tile", infer=_tile_type, evaluate=_tile, params=(1,))

# -- Gather's contents -----------------------------------------------------------------


def gather_shape_contents(ctx: InferContext) -> Optional[tuple]:
    """The contents of Gather(data, indices) when data is a known 1-D shape tensor.

    Indices must be known ints (0-D or 1-D) and the axis 0.  For a scalar index
    the result is a 1-tuple, as for any scalar's contents.  The Gather type
    rule calls this and records the result with ``ctx.set_contents(0, ...)``.
    """
    shape = ctx.input_shape(0)
    data = ctx.input_dims(0)
    indices = static_ints(vector_contents(ctx, 1))
    if shape is None or len(shape) != 1 or data is None or indices is None:
        return None
    if int(ctx.attr("axis", 0)) not in (0, -1):
        return None
    picked = []
    for i in indices:
        i = i + len(data) if i < 0 else i
        if not 0 <= i < len(data):
            return None
        picked.append(data[i])
    return tuple(picked)
