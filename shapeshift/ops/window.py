"""Sliding-window geometry shared by convolutions and pooling.

A :class:`Window` holds the attributes every windowed op reads (kernel,
strides, dilations, pads, auto_pad, ceil_mode).  From it come

* the output size of one spatial axis, as a symbolic dimension, used by the
  type rules: ``floor((H + pads - dilated_kernel) / stride) + 1``, its ceiling
  in ceil mode, ``ceildiv(H, stride)`` for SAME_* padding.  Each is built as a
  single ``floordiv(H + offset, stride)`` so that the same length reached by
  different ops is the same interned expression;
* the concrete begin padding and output length of each axis, used by the
  evaluators together with :func:`fit_spatial` and :func:`window_view`, which
  turn a tensor into a strided view of its windows without copying.

Pools in ceil mode follow onnxruntime and the ONNX reference: a last window
that would start inside the end padding is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..symbolic import Dim, Expr, ceildiv, floordiv, minimum
from .context import InferContext

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """Window attributes of one node, for ``len(strides)`` spatial axes.

    ``kernel`` is None when the kernel size cannot be known (no
    ``kernel_shape`` attribute and a weight of unknown shape).
    """

    kernel: Optional[tuple[Dim, ...]]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False

    @property
    def rank(self) -> int:
        return len(self.strides)

    def dilated(self, axis: int) -> Optional[Dim]:
        """The extent of the dilated kernel along ``axis``."""
        if self.kernel is None:
            return None
        return (self.kernel[axis] - 1) * self.dilations[axis] + 1

    def explicit_pads(self, axis: int) -> tuple[int, int]:
        if self.auto_pad == "VALID":
            return 0, 0
        return self.pads[axis], self.pads[axis + self.rank]


def _int_list(ctx, name: str, default: list[int], length: int) -> tuple[int, ...]:
    values = ctx.attr(name)
    if values is None:
        return tuple(default)
    values = tuple(int(v) for v in values)
    if len(values) != length:
        ctx.fail(f"attribute {name} has {len(values)} values, expected {length}")
    return values


def read_window(ctx, rank: int, kernel: Optional[Sequence[Dim]], pool: bool = False) -> Window:
    """The window of a node with ``rank`` spatial axes (works for infer and eval contexts).

    ``kernel`` comes from the ``kernel_shape`` attribute when it is present,
    else from the caller (a convolution's weight shape).  ``pool`` enables
    ``ceil_mode``.
    """
    attr_kernel = ctx.attr("kernel_shape")
    if attr_kernel is not None:
        attr_kernel = [int(k) for k in attr_kernel]
        if kernel is not None:
            _check_kernel_fits_weight(ctx, attr_kernel, kernel)
        kernel = attr_kernel
    if kernel is not None and len(kernel) != rank:
        ctx.fail(f"kernel has {len(kernel)} spatial dims, the input has {rank}")
    auto_pad = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        ctx.fail(f"unknown auto_pad {auto_pad!r}")
    strides = _int_list(ctx, "strides", [1] * rank, rank)
    dilations = _int_list(ctx, "dilations", [1] * rank, rank)
    pads = _int_list(ctx, "pads", [0] * (2 * rank), 2 * rank)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        ctx.fail("strides and dilations must be positive")
    if any(p < 0 for p in pads):  # kernels index the padded input with them: never below its start
        ctx.fail(f"pads must not be negative, got {list(pads)}")
    ceil_mode = bool(pool and ctx.attr("ceil_mode", 0))
    return Window(None if kernel is None else tuple(kernel), strides, dilations, pads, auto_pad, ceil_mode)


def _check_kernel_fits_weight(ctx, kernel: list[int], weight: Sequence[Dim]) -> None:
    """A ``kernel_shape`` that is not the weight's spatial size made the native kernel read
    past the weight; the import check sees constant weights, this one any weight whose
    dims are known when typed (or, evaluating, its real shape)."""
    if len(weight) == len(kernel) and any(isinstance(w, int) and w != k for w, k in zip(weight, kernel)):
        ctx.fail(f"kernel_shape {kernel} differs from the weight's spatial dims {list(weight)}")


def output_dim(window: Window, axis: int, size: Dim) -> Optional[Dim]:
    """Output length along ``axis`` for an input of length ``size``; None if unknowable.

    Always built as one ``floordiv(size + offset, stride)``, so that equal
    lengths reached by different ops (SAME padding, explicit pads, ceil mode)
    come out as the same interned expression.
    """
    stride = window.strides[axis]
    if window.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return ceildiv(size, stride)
    extent = window.dilated(axis)
    if extent is None:
        return None
    begin, end = window.explicit_pads(axis)
    # floor((size + pads - extent) / stride) + 1
    offset = begin + end - extent + stride
    if not window.ceil_mode:
        return floordiv(size + offset, stride)
    # ceil((size + pads - extent) / stride) + 1, less a last window that would
    # start in the end padding (windows must start before size + begin).
    offset = offset + stride - 1
    if isinstance(size, Expr) or isinstance(offset, Expr):
        return floordiv(size + minimum(offset, begin + stride - 1), stride)
    out = (size + offset) // stride
    return out - 1 if (out - 1) * stride >= size + begin else out


def check_output_dim(ctx: InferContext, dim: Optional[Dim], least: int = 0) -> Dim:
    """The output dim, a fresh one when unknowable; fails when static and below ``least``.

    Convolutions need at least one output position (onnxruntime rejects
    less); pools accept an empty output.
    """
    if dim is None:
        return ctx.fresh_dim("win")
    if not isinstance(dim, Expr) and dim < least:
        ctx.fail(f"output size {dim}: the input is smaller than the (dilated, padded) kernel")
    return dim


# -- evaluation ---------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Concrete geometry of one evaluation: per axis, begin padding and output length."""

    begins: tuple[int, ...]
    outs: tuple[int, ...]
    extents: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]

    @property
    def needed(self) -> tuple[int, ...]:
        """Length of the padded input the windows exactly cover."""
        return tuple(max(0, (o - 1) * s + e) for o, s, e in zip(self.outs, self.strides, self.extents))


def place(window: Window, sizes: Sequence[int]) -> Placement:
    """Resolve a window against concrete spatial input sizes."""
    begins, outs, extents = [], [], []
    for axis, size in enumerate(sizes):
        out = int(output_dim(window, axis, int(size)))
        extent = int(window.dilated(axis))
        if window.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max(0, (out - 1) * window.strides[axis] + extent - int(size))
            begin = total // 2 if window.auto_pad == "SAME_UPPER" else total - total // 2
        else:
            begin = window.explicit_pads(axis)[0]
        begins.append(begin)
        outs.append(max(out, 0))
        extents.append(extent)
    return Placement(tuple(begins), tuple(outs), tuple(extents), window.strides, window.dilations)


def fit_spatial(x: np.ndarray, begins: Sequence[int], lengths: Sequence[int], fill) -> np.ndarray:
    """Shift and resize the trailing spatial axes of ``x``.

    Along each axis the result is ``lengths[i]`` long and holds ``x[j - begins[i]]``
    at position ``j`` where that index exists, else ``fill``: a positive begin
    pads, a negative one crops, and the end is padded or cropped to length.
    """
    lead = x.ndim - len(begins)
    slices = [slice(None)] * lead
    widths = [(0, 0)] * lead
    for size, begin, length in zip(x.shape[lead:], begins, lengths):
        lo = max(0, -begin)
        hi = max(lo, min(size, length - begin))
        front = min(max(0, begin), length)
        slices.append(slice(lo, hi))
        widths.append((front, length - front - (hi - lo)))
    part = x[tuple(slices)]
    if all(w == (0, 0) for w in widths):
        return part
    return np.pad(part, widths, mode="constant", constant_values=fill)


def window_view(x: np.ndarray, placement: Placement, fill) -> np.ndarray:
    """A view of ``x`` (N, C, *spatial) as (N, C, *out, *kernel) windows; padding is ``fill``."""
    padded = fit_spatial(x, placement.begins, placement.needed, fill)
    rank = len(placement.outs)
    axes = tuple(range(x.ndim - rank, x.ndim))
    view = sliding_window_view(padded, placement.extents, axis=axes)
    index = (
        (slice(None),) * (x.ndim - rank)
        + tuple(slice(None, None, s) for s in placement.strides)
        + tuple(slice(None, None, d) for d in placement.dilations)
    )
    return view[index]


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to accumulate in: float32 for halves and bfloat16, else the input's."""
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64):
        return dtype
    return np.dtype(np.float32)
