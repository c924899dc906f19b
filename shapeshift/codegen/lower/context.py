"""What a lowering rule sees of the program being built, and what it hands back.

A lowering rule turns one node (or a fused group led by one node) into C statements
that call kernels. It never sees buffers or concrete sizes: it asks the
``LowerContext`` for C expressions that stand for them —

- ``ptr(value)``: the value's data pointer, cast to its C element type;
- ``dim(d)``: a dimension (an int, or a symbolic ``Expr`` that the VM evaluates once per
  binding into the extents table ``e[]``);
- ``const(value)``: the value's contents when they are known at build time;

and returns the statements, the kernel fragments they call, and any scratch space they
need. Returning ``None`` (or raising ``Unsupported``) leaves the node to the reference
fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import (BOOL, DOUBLE, FLOAT, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, TensorType,
                         to_numpy_dtype)
from ...symbolic import Dim, Expr

# ONNX element type -> C type, for the dtypes the native backend computes on.
C_TYPES: dict[int, str] = {
    FLOAT: "float",
    DOUBLE: "double",
    INT64: "int64_t",
    INT32: "int32_t",
    INT8: "int8_t",
    UINT8: "uint8_t",
    BOOL: "uint8_t",
    # Less common integer widths: elementwise ops, comparisons and layout ops handle them
    # generically; kernels that exist for particular dtypes check them themselves.
    INT16: "int16_t",
    UINT16: "uint16_t",
    UINT32: "uint32_t",
    UINT64: "uint64_t",
}


class Unsupported(Exception):
    """Raised by a lowering rule for a case it does not cover (the node falls back)."""


@dataclass
class Lowered:
    """A lowering rule's result for one node."""

    code: str  # C statements; may declare locals (each step is wrapped in braces)
    fragments: tuple[str, ...] = ()  # kernel modules the code calls (shapeshift.codegen.kernels.<name>)
    # Nodes whose work this code also does (fused into it); they get no step of their own.
    absorbed: tuple[Node, ...] = ()
    # Earlier nodes whose work this code makes unnecessary (a Transpose read through
    # strides instead): their steps are dropped. ``reads`` lists what the code reads
    # instead, so that those buffers stay alive until this step.
    cancels: tuple[Node, ...] = ()
    reads: tuple[Value, ...] = ()
    # The C code reports errors: it contains ``return STEP_ERROR;`` statements.
    can_fail: bool = False
    # What the code's own checks of the inputs' values refuse, said when one fails (else the
    # VM names the shape agreement broken, or says the kernel rejected the inputs).
    rejects: str = ""
    # Scratch space, in bytes, as a dim expression, reachable as ``WORK`` in the code.
    work_bytes: Dim = 0
    # For outputs whose size depends on data (``ctx.late_dims``): C statements that compute
    # those dims into the lvalues ``late_dims`` named, from the inputs alone. They run in a
    # step of their own, before the outputs exist; ``code`` runs once the VM has bound them.
    size_code: str = ""
    # The code's loops only call kernels, a few times each (a Concat's parts): compiled as
    # glue, at -O0, whatever its loops (codegen/emit.py). gcc -O1 took 0.25 s over the
    # table of a 90-part Concat, -O0 next to nothing.
    glue: bool = False


@dataclass
class PackRequest:
    """A constant weight to pack once at load into the layout a GEMM kernel reads."""

    slot: int  # the pointer slot the packed copy goes into
    # Contiguous float32 matrix [K, N] (after any transposition); None once the VM that
    # packed it released the original.
    source: Optional[np.ndarray]
    # Names the packing functions ``<prefix>packed_b_size`` and ``<prefix>pack_b``: the
    # default kernel's ``ss_gemm_``, or a tuned dispatcher's (shapeshift/tune/records.py).
    prefix: str = "ss_gemm_"
    # What the matrix was made from, as the rule passed it: (prefix, address, shape,
    # strides, dtype), equal for two requests of one weight (the same constant, or views
    # of it alike), which then share one packed copy; and that array itself, held so that
    # its memory is not reused for another matrix while requests are made.
    key: tuple = ()
    origin: Optional[np.ndarray] = None


class LowerContext:
    """The program under construction, as one lowering rule sees it."""

    def __init__(self, slot_of: Callable[[Value], int], extent_of: Callable[[Dim], str],
                 new_slot: Callable[[], int], packs: list[PackRequest], is_live_after: Callable[[Value], bool],
                 defined_before: Callable[[Optional[Value]], bool], cancellable: Callable[[Node], bool],
                 late: Optional[dict[int, list[tuple[int, int]]]] = None, tuning=None,
                 tuned_calls: Optional[list[str]] = None):
        self._slot_of = slot_of
        # Tuned GEMM dispatchers (shapeshift/tune/records.py: ``get(k, n)`` by weight shape,
        # ``find_batched(...)`` by a batched call's structure, each giving an object with
        # ``name``), or None: the default schedule everywhere.
        self._tuning = tuning
        # Where the names of the batched dispatchers the rules call are recorded.
        self._tuned_calls = tuned_calls if tuned_calls is not None else []
        # id(output) -> [(axis, j)]: the output's dims that only the data fixes, each to be
        # computed by Lowered.size_code into DIMS[j].
        self._late = late or {}
        self.defined_before = defined_before  # whether a value exists before this node runs
        # Whether an earlier node is a native step a rule may drop (see Lowered.cancels).
        self.cancellable = cancellable
        self._extent_of = extent_of
        self._new_slot = new_slot
        self._packs = packs
        self._is_live_after = is_live_after

    # -- values ----------------------------------------------------------------------

    def late_dims(self, value: Value) -> dict[int, str]:
        """{axis: C lvalue} for each dim of this output that depends on the data: the rule
        must compute each in ``Lowered.size_code`` (or decline)."""
        return {axis: f"DIMS[{j}]" for axis, j in self._late.get(id(value), ())}

    def has_late_dims(self) -> bool:
        return bool(self._late)

    @staticmethod
    def tensor_type(value: Optional[Value]) -> TensorType:
        if value is None or not isinstance(value.type, TensorType) or value.type.shape is None:
            raise Unsupported("not a tensor of known rank")
        return value.type

    def shape(self, value: Value) -> tuple:
        return tuple(self.tensor_type(value).shape)

    def dtype(self, value: Value) -> int:
        return self.tensor_type(value).dtype

    def ctype(self, value: Value) -> str:
        dtype = self.dtype(value)
        if dtype not in C_TYPES:
            raise Unsupported(f"dtype {dtype} has no native kernels")
        return C_TYPES[dtype]

    def elem_size(self, value: Value) -> int:
        return to_numpy_dtype(self.dtype(value)).itemsize

    def ptr(self, value: Value, ctype: Optional[str] = None) -> str:
        """C expression for the value's data pointer."""
        return f"(({ctype or self.ctype(value)}*)v[{self._slot_of(value)}])"

    def raw_ptr(self, value: Value) -> str:
        return f"v[{self._slot_of(value)}]"

    @staticmethod
    def const(value: Optional[Value]) -> Optional[np.ndarray]:
        """The value's contents if known at build time (initializers, folded constants)."""
        if value is None or value.const is None:
            return None
        return np.asarray(value.const)

    def unused(self, value: Optional[Value]) -> bool:
        """Whether nothing reads ``value`` (an optional output nobody asked for); the
        builder gives such an output storage only if its shape is plannable."""
        return value is None or (not value.users and not self._is_live_after(value))

    def escapes(self, value: Value) -> bool:
        """Whether ``value`` is read after the program (a graph output)."""
        return self._is_live_after(value)

    def single_use(self, value: Value) -> bool:
        """Whether ``value`` is read by exactly one node and is not a graph output."""
        return len(value.users) == 1 and not self._is_live_after(value)

    # -- extents ---------------------------------------------------------------------

    def dim(self, d: Dim) -> str:
        """C expression for a dimension (a literal, or an entry of the extents table)."""
        if isinstance(d, Expr):
            return self._extent_of(d)
        return str(int(d))

    def numel(self, shape: Sequence[Dim]) -> str:
        from ...ops.common import product

        return self.dim(product(list(shape)))

    # -- build-time work -------------------------------------------------------------

    def packed_weight(self, matrix: np.ndarray, default_layout: bool = False) -> tuple[int, str]:
        """Slot of a prepacked copy of the constant [K, N] float32 ``matrix``, and the
        function that multiplies by it: ``ss_gemm_prepacked`` or, where the tuning records
        have this weight shape (and ``default_layout`` is false), its tuned dispatcher
        (same arguments)."""
        tuned = self._tuning.get(*matrix.shape) if self._tuning is not None and not default_layout else None
        prefix = tuned.name if tuned is not None else "ss_gemm_"
        return self.packed_constant(matrix, prefix), f"{prefix}prepacked"

    def packed_constant(self, matrix: np.ndarray, prefix: str) -> int:
        """Slot of a copy of the constant 2-D float32 ``matrix`` packed once at load by the
        library's ``<prefix>packed_b_size`` and ``<prefix>pack_b`` (a kernel's own packed
        layout, as the recurrent kernels' R: kernels/rnn_step.py)."""
        # One copy per weight: a recurrence the exporter unrolled multiplies by the same
        # weight at every step (40 Gemm nodes of one 16 MB weight: 40 packed copies, each
        # streamed from DRAM, where one stays in L3).
        key = (prefix, matrix.__array_interface__["data"][0], matrix.shape, matrix.strides, matrix.dtype.str)
        for request in self._packs:
            if request.key == key:
                return request.slot
        slot = self._new_slot()
        self._packs.append(PackRequest(slot, np.ascontiguousarray(matrix, dtype=np.float32), prefix, key, matrix))
        return slot

    def tuned_conv(self, kernel, strides, dilations, pads, dims, out_hw, act: int):
        """The tuning records' dispatcher for a dense 2-D conv (``find_conv``: kernel,
        strides, dilations and begin pads as ints, ``dims`` (N, C, H, W, M) and ``out_hw``
        as Dims), or None; its packed weights come from ``packed_constant`` with its name."""
        find = getattr(self._tuning, "find_conv", None)
        return find(kernel, strides, dilations, pads, dims, out_hw, act) if find is not None else None

    def tuned_conv_nchwc(self, depthwise: bool, lanes: int, kernel, strides, dilations, pads, dims, out_hw
                         ) -> Optional[str]:
        """The prefix of the tuning records' dispatcher for a blocked conv (``find_conv_nchwc``:
        ``dims`` (N, C, H, W, M) as the kernel takes them), or None; its kernels read the
        weights as the untuned one does."""
        find = getattr(self._tuning, "find_conv_nchwc", None)
        tuned = find(depthwise, lanes, kernel, strides, dilations, pads, dims, out_hw) if find is not None else None
        if tuned is None:
            return None
        self._tuned_calls.append(tuned.name)
        return tuned.name

    def batched_gemm_fn(self, m: Dim, n: Dim, k: Dim, batch: Sequence[Dim], a_strides: Sequence[Dim],
                        b_strides: Sequence[Dim], c_strides: Sequence[Dim]) -> str:
        """The function for an ``ss_gemm`` call of these sizes and strides (per batch dim,
        then rows and columns; C's columns are contiguous): ``ss_gemm`` or, where the
        tuning records have a call of this structure, its tuned dispatcher (same
        arguments)."""
        find = getattr(self._tuning, "find_batched", None)
        tuned = find(m, n, k, batch, a_strides, b_strides, c_strides) if find is not None else None
        if tuned is None:
            return "ss_gemm"
        self._tuned_calls.append(tuned.name)
        return tuned.function


def attr_axis(node: Node, rank: int, default: int = 0, name: str = "axis") -> int:
    """The node's axis attribute, made non-negative; a rule declines an axis outside
    [0, rank) rather than emit code that indexes past the shape."""
    axis = int(node.attrs.get(name, default))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise Unsupported(f"{node.op_type} axis {axis} out of range")
    return axis


def c_array(name: str, items: Sequence[str], ctype: str = "int64_t") -> str:
    """A local C array declaration (at least one element: C forbids empty arrays)."""
    body = ", ".join(items) if items else "0"
    return f"const {ctype} {name}[{max(len(items), 1)}] = {{{body}}};"


def float_literal(x: float) -> str:
    """A C float literal that round-trips ``x`` exactly (inf and nan included)."""
    x = float(np.float32(x))
    if np.isnan(x):
        return "NAN"
    if np.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0f"
