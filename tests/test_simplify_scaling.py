"""Simplify's work grows with what changes, not with the model times the changes.

Counted, not timed: a branch output that folds to a constant is a value some
graph returns, and replacing it once walked every graph of the tree; with one
such If per output that made the whole job quadratic (1,600 Ifs: 25 s)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.passes.simplify import rewriter


def _ifs_returning_folded_sums(count: int) -> onnx.ModelProto:
    """``count`` Ifs on an input condition; each branch returns c1 + c2 of its own weights."""
    nodes, outputs = [], []
    for i in range(count):
        branches = {}
        for tag, (a, b) in (("then", (1, 2)), ("else", (10, 20))):
            weights = [numpy_helper.from_array(np.full(3, k + i, np.float32), f"{tag}{i}_c{k}") for k in (a, b)]
            body = [helper.make_node("Add", [w.name for w in weights], [f"{tag}{i}_sum"])]
            branches[f"{tag}_branch"] = helper.make_graph(
                body, f"{tag}{i}", [], [helper.make_tensor_value_info(f"{tag}{i}_sum", TensorProto.FLOAT, [3])],
                weights)
        nodes.append(helper.make_node("If", ["cond"], [f"out{i}"], **branches))
        outputs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [3]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _tree_walks_during_simplify(model: onnx.ModelProto, monkeypatch) -> int:
    walks = []
    original = rewriter._graphs

    def counted(root):
        if root.parent is None:
            walks.append(root)
        return original(root)

    monkeypatch.setattr(rewriter, "_graphs", counted)
    shapeshift.simplify(model)
    monkeypatch.setattr(rewriter, "_graphs", original)
    return len(walks)


def test_replacing_returned_values_does_not_walk_the_tree_each_time(monkeypatch):
    small, large = _ifs_returning_folded_sums(4), _ifs_returning_folded_sums(32)
    assert _tree_walks_during_simplify(small, monkeypatch) == _tree_walks_during_simplify(large, monkeypatch)


def test_folded_branch_outputs_still_compute_the_same():
    model = _ifs_returning_folded_sums(6)
    simplified = shapeshift.simplify(model)
    assert not any(n.op_type == "Add" for n in simplified.graph.node)
    bodies = [a.g for n in simplified.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    assert bodies and not any(node.op_type == "Add" for body in bodies for node in body.node)
    for cond in (True, False):
        feed = {"cond": np.array(cond)}
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
