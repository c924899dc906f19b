"""The Rewriter's lazy placement: nodes added before others land where eager insertion put them."""

import pytest

from shapeshift.ir.graph import Graph
from shapeshift.passes.simplify.rewriter import Rewriter


def _chain():
    graph = Graph()
    x = graph.add_input("x")
    first = graph.add_node("Relu", [x], name="first")
    second = graph.add_node("Relu", [first.outputs[0]], name="second")
    graph.outputs.append(second.outputs[0])
    return graph, x, first, second


def _names(graph):
    return [node.name for node in graph.nodes]


def test_added_nodes_take_their_places_at_compaction():
    graph, x, first, second = _chain()
    rw = Rewriter(graph)
    a = rw.add_node(graph, "Neg", [x], before=second, name="a")
    rw.add_node(graph, "Abs", [x], before=second, name="b")
    rw.add_node(graph, "Exp", [x], before=a, name="c")
    rw.add_node(graph, "Sin", [x], name="end")
    # Appended until the sweep, so a scan of the list still finds them.
    assert set(_names(graph)) == {"first", "second", "a", "b", "c", "end"}
    rw.compact()
    # Inserting each before its anchor at once gives: first, c, a, b, second, end.
    assert _names(graph) == ["first", "c", "a", "b", "second", "end"]


def test_nodes_placed_before_a_removed_anchor_keep_its_place():
    graph, x, first, second = _chain()
    rw = Rewriter(graph)
    neg = rw.add_node(graph, "Neg", [first.outputs[0]], before=second, name="neg")
    rw.replace_value(second.outputs[0], neg.outputs[0])
    rw.remove_node(second)
    rw.add_node(graph, "Abs", [x], before=neg, name="abs")
    rw.compact()
    assert _names(graph) == ["first", "abs", "neg"]


def test_an_anchor_already_swept_away_is_refused():
    graph, x, first, second = _chain()
    rw = Rewriter(graph)
    neg = rw.add_node(graph, "Neg", [first.outputs[0]], name="neg")
    rw.replace_value(second.outputs[0], neg.outputs[0])
    rw.remove_node(second)
    rw.compact()
    with pytest.raises(ValueError):
        rw.add_node(graph, "Abs", [x], before=second)
