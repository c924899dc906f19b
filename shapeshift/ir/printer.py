"""A readable text form of a graph, one node per line, subgraphs indented."""

from __future__ import annotations

import numpy as np

from .graph import Graph, Node


def _format_attr(value) -> str:
    if isinstance(value, Graph):
        return f"<graph {value.name}>"
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"tensor({value.tolist()})"
        return f"tensor<{value.dtype}{list(value.shape)}>"
    if isinstance(value, list) and len(value) > 16:
        return f"[{', '.join(map(str, value[:16]))}, ...]"
    return repr(value)


def format_node(node: Node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
    ins = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
    attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in node.attrs.items() if not isinstance(v, Graph))
    op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    return f"{outs} = {op}({ins}{'; ' + attrs if attrs else ''})"


def format_graph(graph: Graph, indent: str = "") -> str:
    lines = [f"{indent}graph {graph.name}("]
    for value in graph.inputs:
        lines.append(f"{indent}    %{value.name}: {value.type}")
    lines.append(f"{indent}) {{")
    for value in graph.initializers.values():
        lines.append(f"{indent}  %{value.name}: {value.type} = initializer")
    for node in graph.nodes:
        lines.append(f"{indent}  {format_node(node)}")
        for key, value in node.attrs.items():
            subs = value if isinstance(value, list) else [value]
            for sub in subs:
                if isinstance(sub, Graph):
                    lines.append(f"{indent}    {key}:")
                    lines.append(format_graph(sub, indent + "      "))
    lines.append(f"{indent}  return {', '.join('%' + v.name for v in graph.outputs)}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)
