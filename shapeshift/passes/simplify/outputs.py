"""Keeping the graph's output names through rewrites.

Rewrites replace values, so a graph output may end up being some other value
(an input, an initializer, another node's output).  ONNX users look outputs up
by name, so each one gets its original name back: by renaming the value when
that is safe, else through an Identity node.
"""

from __future__ import annotations

from ...ir.graph import Graph


def restore_output_names(graph: Graph) -> None:
    original = graph.metadata.get("output_names")
    if not original:
        return
    for index, (value, name) in enumerate(zip(list(graph.outputs), original)):
        if value.name == name:
            continue
        # The value that had this name was replaced and is gone, so the name is free.
        graph._names.discard(name)
        renamable = value.producer is not None and sum(v is value for v in graph.outputs) == 1
        if renamable and value.name not in original:
            graph._names.discard(value.name)
            value.name = name
            graph._names.add(name)
            continue
        node = graph.add_node("Identity", [value], output_names=[name])
        node.outputs[0].type = value.type
        node.outputs[0].shape_contents = value.shape_contents
        graph.outputs[index] = node.outputs[0]


def materialize_subgraph_outputs(graph: Graph) -> None:
    """ONNX wants a body's outputs produced inside the body: after rewrites one may be
    an outer value or an initializer, which then goes through an Identity."""
    for node in graph.walk_nodes():
        for sub in node.subgraphs():
            for index, value in enumerate(list(sub.outputs)):
                if value.producer is not None and value.producer.graph is sub:
                    continue
                identity = sub.add_node("Identity", [value], output_names=[sub.fresh_name(f"{value.name}_out")])
                identity.outputs[0].type = value.type
                identity.outputs[0].shape_contents = value.shape_contents
                sub.outputs[index] = identity.outputs[0]
