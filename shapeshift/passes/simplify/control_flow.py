"""Inlining an If whose condition is known: its taken branch replaces it."""

from __future__ import annotations

from typing import Optional

from ...ir.graph import Node
from ...symbolic import Expr
from .rewriter import Rewriter


def known_condition(node: Node) -> Optional[bool]:
    """The If's condition when it is a known constant (or known contents)."""
    value = node.inputs[0] if node.inputs else None
    if value is None:
        return None
    if value.const is not None and value.const.size == 1:
        return bool(value.const.reshape(-1)[0])
    contents = value.shape_contents
    if contents is not None and len(contents) == 1 and not isinstance(contents[0], Expr):
        return bool(contents[0])
    return None


def inline_if(node: Node, condition: bool, rw: Rewriter) -> list[Node]:
    """Move the taken branch's nodes before ``node``, rewire its outputs, drop it.

    Returns the moved nodes.  Names are unique across the graph tree, so the
    branch's values keep theirs.
    """
    branch = node.attrs["then_branch" if condition else "else_branch"]
    # The branch stops returning its outputs; they stay marked as returned only where
    # the If's own outputs are (replace_value below carries that over).
    returned = list(branch.outputs)
    branch.outputs = []
    rw.forget_returned(returned, branch)
    parent = node.graph
    rw.compact_graph(parent)
    rw.compact_graph(branch)  # nodes of the branch removed before must not come back
    position = parent.nodes.index(node)
    moved = list(branch.nodes)
    for value in branch.initializers.values():
        value.graph = parent
        parent.initializers[value.name] = value
    for inner in moved:
        inner.graph = parent
        for out in inner.outputs:
            out.graph = parent
        for sub in inner.subgraphs():
            sub.parent = parent
    parent.nodes[position:position] = moved
    branch.nodes = []
    branch.initializers = {}
    anchor = rw.order(node)
    for offset, inner in enumerate(moved):
        rw._order[id(inner)] = anchor - 1.0 + (offset + 1) / (len(moved) + 1)
    for if_out, branch_out in zip(node.outputs, returned):
        rw.replace_value(if_out, branch_out)
    rw.remove_node(node)
    rw.enqueue_all(moved)
    return moved
