"""Shape-rule building blocks shared by the op families.

Pure functions over symbolic dimensions: broadcasting, axis normalization,
products, and small type-rule factories (``same_as_input``).  They never crash
on partial information; they return None (unknown) instead.
"""

from __future__ import annotations

from typing import Optional, Sequence


from ..ir.types import TensorType
from ..symbolic import Dim, Expr, bounds, maximum, mul
from .context import InferContext

Shape = Optional[tuple[Dim, ...]]

#: The most dimensions a tensor may have: numpy's own limit (``np.empty((1,) * 65)`` is
#: refused), so neither backend could hold more. A shape or axes input has one entry per
#: dimension, so at most this many: a mutated model whose Unsqueeze axes were declared
#: int64[2147483648] had inference make that many fresh dims, for minutes and gigabytes
#: (``python -m shapeshift.fuzz --reproduce 1351:5196``).
MAX_RANK = 64


def broadcast_dim(a: Dim, b: Dim, ctx: Optional[InferContext] = None) -> Dim:
    """The multidirectional (NumPy) broadcast of two dimensions."""
    if a is b or (not isinstance(a, Expr) and not isinstance(b, Expr) and a == b):
        return a
    if not isinstance(a, Expr) and a == 1:
        return b
    if not isinstance(b, Expr) and b == 1:
        return a
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        if ctx is not None:
            ctx.fail(f"cannot broadcast dimensions {a} and {b}")
        raise ValueError(f"cannot broadcast dimensions {a} and {b}")
    # One side symbolic: in a valid model it is either 1 or equal to the other.
    if not isinstance(a, Expr):
        return a
    if not isinstance(b, Expr):
        return b
    # Both symbolic: max() is exact as long as neither can be 0.
    if bounds(a)[0] >= 1 and bounds(b)[0] >= 1:
        return maximum(a, b)
    if ctx is not None:
        return ctx.fresh_dim("bcast")
    return maximum(a, b)


def broadcast_shapes(shapes: Sequence[Shape], ctx: Optional[InferContext] = None) -> Shape:
    """Broadcast several shapes; None if any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    # Broadcasting the first shape against all-ones gives it back, and an equal
    # shape changes nothing (equal dims are identical: Exprs are interned), so
    # only differing shapes go dim by dim: most ops read equal shapes.
    result: Optional[tuple] = None
    for shape in shapes:
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        if result is None:
            result = padded
        elif padded != result:
            result = tuple([broadcast_dim(r, d, ctx) for r, d in zip(result, padded)])
    return result if result is not None else ()


def normalize_axis(axis: int, rank: int, ctx: Optional[InferContext] = None) -> int:
    if not -rank <= axis < max(rank, 1) + (1 if rank == 0 else 0):
        if ctx is not None:
            ctx.fail(f"axis {axis} is out of range for rank {rank}")
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Sequence[int], rank: int, ctx: Optional[InferContext] = None,
                   unique: bool = False) -> list[int]:
    """Axes made non-negative; with ``unique``, an axis named twice is an error."""
    normalized = [normalize_axis(int(a), rank, ctx) for a in axes]
    if unique and len(set(normalized)) != len(normalized):
        if ctx is not None:
            ctx.fail(f"repeated axes {normalized}")
        raise ValueError(f"repeated axes {normalized}")
    return normalized


def product(dims: Sequence[Dim]) -> Dim:
    total: Dim = 1
    for d in dims:
        total = mul(total, d)
    return total


def same_as_input(index: int = 0):
    """A type rule: every output has the type of input ``index``."""

    def infer(ctx: InferContext) -> list:
        return [ctx.input_type(index)] * ctx.num_outputs

    return infer


def tensor(dtype: Optional[int], shape: Shape) -> Optional[TensorType]:
    """A TensorType, or None when even the dtype is unknown."""
    if dtype is None:
        return None
    return TensorType(dtype, None if shape is None else tuple(shape))

