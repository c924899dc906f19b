"""A small builder for writing graphs in a few lines, mainly in tests.

::

    b = GraphBuilder(opset=17, dynamic={"B": (1, 8), "T": (1, 512)})
    x = b.input("x", "float32", ("B", "T", 768))
    w = b.const(np.ones((768, 64), np.float32), name="w")
    y = b.MatMul(x, w)                       # any op; attributes as keywords
    top, idx = b.TopK(y, b.const(np.array([3])), axis=-1, outputs=2)
    b.output(y)
    graph = b.build()                        # verified

Dimensions are ints, symbol names, expressions in text (``"2*T"``), ``Expr``
objects, or ``None`` for a fresh unknown dimension.  Symbols come from the
graph's ``SymbolTable`` with the ranges given in ``dynamic``.  Element types
are ONNX codes, ONNX names (``"float"``, ``"int64"``), NumPy names or dtypes
(``"float32"``, ``np.int64``).

The builder does not infer types: a node's outputs have no type unless the
caller passes ``type=``.  ``b.subgraph()`` gives a builder for a nested graph
(an If branch, a Loop body) that may read the enclosing graph's values; pass
it, or its ``graph``, as the attribute.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
from onnx import TensorProto

from ..symbolic import Dim, Expr, free_symbols, parse_dim
from .graph import Graph, SymbolTable, Value
from .types import TensorType, ValueType, from_numpy_dtype
from .verifier import verify

DimSpec = Union[int, str, Expr, None]
TypeSpec = Union[ValueType, tuple]

_ONNX_NAMES = {name.lower(): code for name, code in TensorProto.DataType.items()}


def elem_type(dtype: Any) -> int:
    """The ONNX element-type code of ``dtype``: a code, a name or a NumPy dtype.

    ONNX names come first, so ``"float"`` is float32 (as in ONNX), while
    NumPy-only names such as ``"float32"`` or ``"float64"`` go through NumPy.
    """
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) not in _ONNX_NAMES.values():
            raise ValueError(f"unknown ONNX element type code {dtype}")
        return int(dtype)
    if isinstance(dtype, str) and dtype.lower() in _ONNX_NAMES:
        return _ONNX_NAMES[dtype.lower()]
    try:
        return from_numpy_dtype(np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"unknown element type {dtype!r}") from exc


class GraphBuilder:
    """Appends inputs, initializers and nodes to a Graph, in order."""

    def __init__(self, opset: Union[int, dict[str, int]] = 17,
                 dynamic: Optional[dict[str, tuple[int, int]]] = None, name: str = "graph",
                 *, graph: Optional[Graph] = None):
        if graph is None:
            opsets = {"": opset} if isinstance(opset, int) else dict(opset)
            graph = Graph(name, opset=opsets, symbols=SymbolTable(dynamic))
        elif dynamic:
            graph.symbols.ranges.update(dynamic)
        self.graph = graph

    # -- dimensions and types ------------------------------------------------
    def symbol(self, name: str) -> Expr:
        """The symbol ``name`` with its declared range."""
        return self.graph.symbols.get(name)

    def dim(self, spec: DimSpec) -> Dim:
        """One dimension from an int, a symbol name, an expression text or an Expr."""
        if spec is None:
            return self.graph.symbols.fresh("unk")
        if isinstance(spec, Expr):
            return spec
        if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
            return int(spec)
        if isinstance(spec, str):
            if spec.isidentifier():
                return self.symbol(spec)
            value = parse_dim(spec, self.graph.symbols.ranges)
            for name in free_symbols(value):
                self.symbol(name)  # record it in the table like any other symbol
            return value
        raise TypeError(f"not a dimension: {spec!r}")

    def tensor_type(self, dtype: Any, shape: Optional[Sequence[DimSpec]]) -> TensorType:
        """A TensorType; ``shape=None`` means unknown rank."""
        dims = None if shape is None else tuple(self.dim(d) for d in shape)
        return TensorType(elem_type(dtype), dims)

    def _type(self, spec: Optional[TypeSpec]) -> Optional[ValueType]:
        if spec is None or not isinstance(spec, tuple):
            return spec
        dtype, shape = spec
        return self.tensor_type(dtype, shape)

    # -- graph inputs, constants, outputs ----------------------------------
    def input(self, name: str, dtype: Any = None, shape: Optional[Sequence[DimSpec]] = None,
              type: Optional[ValueType] = None) -> Value:
        """A graph input of element type ``dtype`` and ``shape`` (None: unknown rank),
        or of any ``type`` (a sequence, an optional...)."""
        if type is None:
            if dtype is None:
                raise ValueError(f"input {name!r}: give a dtype or a type")
            type = self.tensor_type(dtype, shape)
        value = self.graph.add_input(name, type)
        if value.name != name:
            raise ValueError(f"input name {name!r} is already taken in this graph tree")
        return value

    def const(self, array: Any, name: str = "const") -> Value:
        """An initializer holding ``np.asarray(array)``."""
        return self.graph.add_initializer(name, np.asarray(array))

    def output(self, *values: Value) -> None:
        """Append ``values`` to the graph's outputs."""
        for value in values:
            if not isinstance(value, Value):
                raise TypeError(f"graph outputs must be Values, got {value!r}")
            self.graph.outputs.append(value)

    # -- nodes -----------------------------------------------------------------
    def op(self, op_type: str, *inputs: Optional[Value], outputs: int = 1, domain: str = "",
           name: str = "", type: Union[TypeSpec, Sequence[TypeSpec], None] = None,
           attrs: Optional[dict[str, Any]] = None, **attributes: Any) -> Union[Value, tuple[Value, ...]]:
        """Append one ``op_type`` node; returns its output, or a tuple when ``outputs != 1``.

        ``None`` stands for an omitted optional input; a NumPy array becomes an
        initializer.  ``type`` gives the output type(s): a ValueType or a
        ``(dtype, shape)`` pair, or a list of them, one per output.  An ONNX
        attribute named like one of this method's keywords goes in ``attrs``.
        """
        values = [self._as_value(x, op_type) for x in inputs]
        all_attrs = {key: self._attr(value) for key, value in {**(attrs or {}), **attributes}.items()}
        node = self.graph.add_node(op_type, values, outputs, all_attrs, domain=domain, name=name)
        if not node.name:
            node.name = node.outputs[0].name if node.outputs else self.graph._claim(op_type.lower())
        types = type if isinstance(type, list) else [type] * outputs
        if len(types) != outputs:
            raise ValueError(f"{node.describe()}: {len(types)} types for {outputs} outputs")
        for out, spec in zip(node.outputs, types):
            out.type = self._type(spec)
        if outputs == 1:
            return node.outputs[0]
        return tuple(node.outputs)

    def __getattr__(self, op_type: str):
        # b.MatMul(x, w) is b.op("MatMul", x, w); op types start with a capital.
        if not op_type[:1].isupper():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {op_type!r}")

        def make(*inputs, **kwargs):
            return self.op(op_type, *inputs, **kwargs)

        make.__name__ = op_type
        return make

    def _as_value(self, x: Any, op_type: str) -> Optional[Value]:
        if x is None or isinstance(x, Value):
            return x
        if isinstance(x, (np.ndarray, np.generic)):
            return self.const(x, name=f"{op_type.lower()}_const")
        raise TypeError(f"{op_type} input must be a Value, None or a NumPy array, got {x!r}")

    def _attr(self, value: Any) -> Any:
        # Attributes are plain values: lists, not tuples; ints, not bools;
        # Graphs, not builders.
        if isinstance(value, GraphBuilder):
            return value.graph
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, tuple):
            return [self._attr(v) for v in value]
        if isinstance(value, list):
            return [self._attr(v) for v in value]
        return value

    # -- nesting and finishing --------------------------------------------------
    def subgraph(self, name: str = "body") -> "GraphBuilder":
        """A builder for a graph nested in this one; value names stay unique across the tree."""
        return GraphBuilder(graph=Graph(name, parent=self.graph))

    def build(self, check: bool = True) -> Graph:
        """The graph, verified when it is a root graph (a subgraph is checked with its root)."""
        if check and self.graph.parent is None:
            verify(self.graph)
        return self.graph
