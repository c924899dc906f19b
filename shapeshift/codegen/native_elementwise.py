"""Run a graph's float32 elementwise nodes through compiled C kernels.

``NativeElementwise(graph)`` picks the nodes of the root graph it can run (see
``handles``), emits one C source with a kernel per op type among them, and builds it once
with the build cache. ``run_node`` then works for any input shapes: the output shape
comes from NumPy's broadcasting rule and the strides from the actual arrays, so nothing
is recompiled when a symbolic dimension takes a new value.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Sequence

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.types import FLOAT, TensorType
from .build import CompiledLibrary, compile_library
from .elementwise import BINARY, ELEMENTWISE_OPS, emit_source, kernel_name

_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]


def handles(node: Node) -> bool:
    """Whether ``node`` is a float32 elementwise op this module compiles."""
    if node.op_type not in ELEMENTWISE_OPS or node.domain not in ("", "ai.onnx"):
        return False
    # Attributes (the pre-opset-7 ``broadcast``/``axis``, ``consumed_inputs``) change the semantics.
    if node.attrs or node.params or len(node.outputs) != 1:
        return False
    arity = 2 if node.op_type in BINARY else 1
    if len(node.inputs) != arity or any(v is None for v in node.inputs):
        return False
    return all(isinstance(v.type, TensorType) and v.type.dtype == FLOAT for v in [*node.inputs, *node.outputs])


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape`` read at ``out_shape``'s indices
    (right-aligned, 0 along broadcast axes)."""
    strides = np.zeros(len(out_shape), dtype=np.int64)
    step = 1
    offset = len(out_shape) - len(shape)
    for d in range(len(shape) - 1, -1, -1):
        if shape[d] != 1:
            strides[offset + d] = step
        step *= shape[d]
    return strides


class NativeElementwise:
    """The compiled elementwise kernels of one graph."""

    def __init__(self, graph: Graph, cache_dir=None):
        self.nodes = {id(node): node for node in graph.nodes if handles(node)}
        self.op_types = sorted({node.op_type for node in self.nodes.values()})
        self.source = emit_source(self.op_types)
        self.library: Optional[CompiledLibrary] = None
        self._kernels: dict[str, ctypes._CFuncPtr] = {}
        if self.op_types:
            self.library = compile_library(self.source, name_hint=f"{graph.name} elementwise", cache_dir=cache_dir)
            for op in self.op_types:
                fn = getattr(self.library.cdll, kernel_name(op))
                fn.argtypes = _ARGTYPES
                fn.restype = None
                self._kernels[op] = fn

    def __contains__(self, node: Node) -> bool:
        return id(node) in self.nodes

    def accepts(self, node: Node, inputs: Sequence) -> bool:
        """Whether ``run_node`` can take these actual inputs (float32 arrays) for ``node``."""
        return node in self and all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in inputs)

    def run_node(self, node: Node, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The node's output for these inputs (of any shapes that broadcast)."""
        # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
        arrays = [np.asarray(x, order="C") for x in inputs]
        a = arrays[0]
        b = arrays[1] if len(arrays) == 2 else a
        out_shape = tuple(np.broadcast_shapes(*(x.shape for x in arrays)))
        out = np.empty(out_shape, dtype=np.float32)
        contiguous = all(x.shape == out_shape for x in arrays)
        shape = np.array(out_shape, dtype=np.int64)
        strides_a = broadcast_strides(a.shape, out_shape)
        strides_b = broadcast_strides(b.shape, out_shape)
        self._kernels[node.op_type](a.ctypes.data, b.ctypes.data, out.ctypes.data, len(out_shape),
                                    shape.ctypes.data, strides_a.ctypes.data, strides_b.ctypes.data,
                                    int(contiguous))
        return [out]
