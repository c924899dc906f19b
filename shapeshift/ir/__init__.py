"""The graph IR: values, nodes, graphs, types, a builder, a printer and a verifier."""

from .builder import GraphBuilder
from .graph import Graph, Node, SymbolTable, Value
from .types import OptionalType, SequenceType, TensorType, ValueType
from .verifier import verify

__all__ = ["Graph", "GraphBuilder", "Node", "OptionalType", "SequenceType", "SymbolTable", "TensorType", "Value", "ValueType", "verify"]
