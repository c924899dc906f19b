"""What a rule sees of the node it runs on: attributes, input types and contents.

``InferContext`` is handed to type rules, ``EvalContext`` to evaluators.  Both
are thin views over a Node; neither holds state shared between nodes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import ExecutionError, ShapeInferenceError
from ..ir.graph import Graph, Node, SymbolTable
from ..ir.types import BOOL, INT_TYPES, TensorType, ValueType
from ..runtime.run_options import check as check_run_options
from ..symbolic import DEFAULT_HI, Dim, Expr

#: Integer tensors with at most this many elements get their contents tracked.
MAX_CONTENTS = 64
#: Element types whose 0-D/1-D tensors can have contents known as dimensions.
_CONTENT_DTYPES = INT_TYPES | {BOOL}


class _NodeView:
    def __init__(self, node: Node, opset: int):
        self.node = node
        self.opset = opset

    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def has_input(self, index: int) -> bool:
        return index < len(self.node.inputs) and (self.node.inputs[index] is not None or index in self.node.params)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def has_attr(self, name: str) -> bool:
        return name in self.node.attrs

    def describe(self) -> str:
        return self.node.describe()


class InferContext(_NodeView):
    """The view of a node that a type rule gets."""

    def __init__(self, node: Node, opset: int, symbols: SymbolTable,
                 input_types: Optional[Sequence[Optional[ValueType]]] = None,
                 infer_subgraph: Optional[Callable[[Graph, list], list]] = None):
        # _NodeView.__init__ spelled out: a context is made for every node inferred.
        self.node = node
        self.opset = opset
        self.symbols = symbols
        self._input_types = input_types
        self._infer_subgraph = infer_subgraph
        self.output_contents: dict[int, tuple] = {}

    def infer_subgraph(self, graph: Graph, input_types: list) -> list:
        """Type the body ``graph`` given its input types; returns its output types."""
        if self._infer_subgraph is None:
            return [v.type for v in graph.outputs]
        return self._infer_subgraph(graph, input_types)

    def input_type(self, index: int) -> Optional[ValueType]:
        """The type of input ``index``; None if the input is absent or untyped."""
        # has_input() spelled out: type rules ask this of every input at every visit.
        inputs = self.node.inputs
        if index >= len(inputs):
            return None
        param = self.node.params.get(index) if self.node.params else None
        if param is not None:
            return TensorType(param.dtype, param.shape)
        if inputs[index] is None:
            return None
        if self._input_types is not None:
            return self._input_types[index]
        return inputs[index].type

    def input_shape(self, index: int) -> Optional[tuple[Dim, ...]]:
        """The shape of tensor input ``index``; None if absent or of unknown rank."""
        t = self.input_type(index)
        return t.shape if isinstance(t, TensorType) else None

    def input_dtype(self, index: int) -> Optional[int]:
        t = self.input_type(index)
        return t.dtype if isinstance(t, TensorType) else None

    def input_const(self, index: int) -> Optional[np.ndarray]:
        """The input's contents when they are a known constant."""
        if not self.has_input(index) or index in self.node.params:
            return None
        return self.node.inputs[index].const

    def input_dims(self, index: int) -> Optional[tuple[Dim, ...]]:
        """The contents of a 0-D/1-D integer input as dimensions, if known.

        Known either as a constant or symbolically (e.g. the output of
        ``Shape(x)`` for a symbolic ``x``).  A scalar gives a 1-tuple.
        """
        if not self.has_input(index):
            return None
        param = self.node.params.get(index)
        if param is not None:
            return param.dims
        value = self.node.inputs[index]
        t = value.type
        if isinstance(t, TensorType) and t.dtype not in _CONTENT_DTYPES:
            # A constant's array is read only for an integer or bool type (asked first: a
            # weight read lazily would be made for nothing, a Gather's embedding table).
            return value.shape_contents
        if value.const is not None:
            array = value.const
            if array.ndim <= 1 and array.dtype.kind in "iu":
                return tuple(array.reshape(-1).tolist())  # Python ints, in one call
            if array.ndim <= 1 and array.dtype.kind == "b":
                return tuple(int(v) for v in array.reshape(-1))
            return None
        return value.shape_contents

    def set_contents(self, index: int, dims: Optional[Sequence[Dim]]) -> None:
        """Record the (possibly symbolic) contents of integer output ``index``."""
        if dims is not None and len(dims) <= MAX_CONTENTS:
            self.output_contents[index] = tuple(dims)

    def fresh_dim(self, prefix: str = "unk", lo: int = 0, hi: int = DEFAULT_HI) -> Expr:
        """A new symbol for a dimension nobody can know before run time."""
        return self.symbols.fresh(prefix, lo, hi)

    def fail(self, message: str) -> None:
        raise ShapeInferenceError(f"{self.describe()}: {message}")


class EvalContext(_NodeView):
    """The view of a node that an evaluator gets.

    ``run_subgraph(graph, inputs)`` runs a body graph (If/Loop/Scan) with the
    given inputs in the current scope and returns its outputs.
    """

    def __init__(self, node: Node, opset: int,
                 run_subgraph: Optional[Callable[[Graph, list], list]] = None):
        super().__init__(node, opset)
        self._run_subgraph = run_subgraph

    def run_subgraph(self, graph: Graph, inputs: list) -> list:
        if self._run_subgraph is None:
            raise ExecutionError(f"{self.describe()}: this executor cannot run subgraphs")
        # A Loop's or Scan's iterations are where a run's time is not bounded by its shapes.
        check_run_options(self.describe())
        return self._run_subgraph(graph, inputs)

    def fail(self, message: str) -> None:
        raise ExecutionError(f"{self.describe()}: {message}")

