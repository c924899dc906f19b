"""Whole-graph type inference: run every node's type rule in topological order.

Types flow into subgraphs (If branches, Loop and Scan bodies) through the
control-flow rules, which call back into :func:`infer_graph`.  A rule that
raises anything but ShapeInferenceError is a bug in that rule; rather than
crash the import, the node's outputs keep the types the model declared and a
warning is recorded in ``graph.metadata["inference_warnings"]``. A MemoryError
goes on up: it says the process is out of memory, not that the rule is wrong
(taken for a failed rule, a rule that ran away with the memory was reported as
an error of whatever came next, and the memory was still gone).
"""

from __future__ import annotations

from typing import Optional

from ..errors import ShapeInferenceError
from ..ir.graph import Graph, Node
from ..ir.types import TensorType, ValueType
from ..ops import lookup
from ..ops.context import InferContext
from ..symbolic.expr import DEFAULT_HI


def infer_types(graph: Graph) -> list[str]:
    """Type every value of ``graph`` (and its subgraphs); returns the warnings."""
    warnings: list[str] = graph.root.metadata.setdefault("inference_warnings", [])
    infer_graph(graph)
    return warnings


def infer_graph(graph: Graph, input_types: Optional[list] = None) -> list:
    """Type ``graph``'s nodes, with its inputs retyped first when given."""
    if input_types is not None:
        for value, t in zip(graph.inputs, input_types):
            if t is not None:
                value.type = t
    for node in graph.nodes:
        infer_node(node)
    return [v.type for v in graph.outputs]


def infer_node(node: Node, retype_bodies: bool = True) -> None:
    """Run ``node``'s type rule.  With ``retype_bodies`` False, a body is re-typed
    only when its input types change: the simplify worklist keeps body nodes
    typed itself, and re-typing whole bodies at each visit of their owner would
    make nested control flow quadratic."""
    graph = node.graph
    opset = graph.opset.get("" if node.domain == "ai.onnx" else node.domain, 1)
    rule = lookup(node.domain, node.op_type, opset)
    if rule is None:
        _keep_declared(node)
        return
    body_types = infer_graph if retype_bodies else _body_types_if_inputs_changed
    ctx = InferContext(node, opset, graph.symbols, infer_subgraph=body_types)
    try:
        types = list(rule.infer(ctx))
    except (ShapeInferenceError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - see module docstring
        graph.root.metadata.setdefault("inference_warnings", []).append(
            f"{node.describe()}: type rule failed ({type(exc).__name__}: {exc}); kept declared types")
        _keep_declared(node)
        return
    for index, out in enumerate(node.outputs):
        inferred = types[index] if index < len(types) else None
        if isinstance(inferred, TensorType) and inferred.shape is not None:
            _check_extents(node, index, inferred.shape)
        declared = out.type
        if out.declared is not None:  # first inference after import
            if inferred is None or (isinstance(inferred, TensorType) and inferred.shape is None):
                declared = out.declared()
            out.declared = None
        out.type = _prefer(inferred, declared)
        out.shape_contents = ctx.output_contents.get(index)


def _check_extents(node: Node, index: int, shape) -> None:
    """A static dim must lie in [0, DEFAULT_HI], the range of every symbolic one: a Range
    from INT64_MIN, or a Reshape to INT64_MAX, made dims that overflowed int64 later, in
    the exporter (ValueError) or the native plan (OverflowError)."""
    for axis, d in enumerate(shape):
        if isinstance(d, int) and not 0 <= d <= DEFAULT_HI:
            raise ShapeInferenceError(f"{node.describe()}: output {index} would have {d} elements along axis "
                                      f"{axis}; a dimension must be from 0 to {DEFAULT_HI}")


def _keep_declared(node: Node) -> None:
    """Give outputs the types the model declared for them (a node inference cannot type)."""
    for out in node.outputs:
        if out.declared is not None:
            out.type, out.declared = out.declared(), None


def _body_types_if_inputs_changed(graph: Graph, input_types: list) -> list:
    if any(t is not None and value.type != t for value, t in zip(graph.inputs, input_types)):
        return infer_graph(graph, input_types)
    return [v.type for v in graph.outputs]


def _prefer(inferred: Optional[ValueType], declared: Optional[ValueType]) -> Optional[ValueType]:
    """The inferred type, unless the model declared something strictly more precise."""
    if inferred is None:
        return declared
    if (isinstance(inferred, TensorType) and inferred.shape is None and isinstance(declared, TensorType)
            and declared.shape is not None and declared.dtype == inferred.dtype):
        return declared
    return inferred
