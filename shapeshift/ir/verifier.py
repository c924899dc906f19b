"""Checks the invariants every pass must keep: def-use lists, order, types."""

from __future__ import annotations

from ..errors import InvalidGraphError
from .graph import Graph


def verify(graph: Graph, require_types: bool = False) -> None:
    """Raise InvalidGraphError on the first broken invariant, naming the node."""
    _verify(graph, visible=set(), require_types=require_types)


def _verify(graph: Graph, visible: set, require_types: bool) -> None:
    defined = set(visible)
    for value in graph.inputs:
        defined.add(id(value))
    for value in graph.initializers.values():
        if value.const is None:
            raise InvalidGraphError(f"initializer {value.name!r} has no contents")
        defined.add(id(value))
    for node in graph.nodes:
        if node.graph is not graph:
            raise InvalidGraphError(f"{node.describe()} does not belong to graph {graph.name!r}")
        for index in node.params:
            if index >= len(node.inputs) or node.inputs[index] is not None:
                raise InvalidGraphError(f"{node.describe()}: static parameter {index} also has an input edge")
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if id(value) not in defined:
                raise InvalidGraphError(
                    f"{node.describe()} reads {value.name!r} before it is defined (or from outside its scope)")
            if (node, index) not in value.users:
                raise InvalidGraphError(f"{value.name!r} does not list {node.describe()} as a user (input {index})")
        for sub in node.subgraphs():
            if sub.parent is not graph:
                raise InvalidGraphError(f"subgraph {sub.name!r} of {node.describe()} has the wrong parent")
            _verify(sub, defined, require_types)
        for out in node.outputs:
            if out.producer is not node:
                raise InvalidGraphError(f"output {out.name!r} of {node.describe()} names another producer")
            if require_types and out.type is None:
                raise InvalidGraphError(f"output {out.name!r} of {node.describe()} has no type")
            defined.add(id(out))
    for value in list(graph.values()):
        for user, index in value.users:
            if index >= len(user.inputs) or user.inputs[index] is not value:
                raise InvalidGraphError(f"{value.name!r} lists {user.describe()} as a user, but it reads something else")
    for value in graph.outputs:
        if id(value) not in defined:
            raise InvalidGraphError(f"graph {graph.name!r} returns {value.name!r}, which it never defines")
