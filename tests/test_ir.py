"""Tests of the graph IR: the builder, the verifier, def-use upkeep and the printer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from shapeshift.errors import InvalidGraphError
from shapeshift.ir import Graph, GraphBuilder, SequenceType, TensorType, verify
from shapeshift.ir.builder import elem_type
from shapeshift.symbolic import Expr, bounds, symbol


def attention_like() -> GraphBuilder:
    """A few lines of a transformer block, with symbolic batch and sequence."""
    b = GraphBuilder(opset=17, dynamic={"B": (1, 8), "T": (1, 512)})
    x = b.input("x", "float32", ("B", "T", 768))
    w = b.const(np.ones((768, 64), np.float32), name="w")
    y = b.MatMul(x, w)
    shape = b.Shape(x)
    batch = b.Gather(shape, b.const(np.array(0)), axis=0)
    new_shape = b.Concat(b.Unsqueeze(batch, b.const(np.array([0]))), b.const(np.array([-1, 64])), axis=0)
    z = b.Reshape(y, new_shape)
    b.output(z, y)
    return b


# -- the builder ----------------------------------------------------------------------


def test_builder_builds_a_verified_graph():
    b = attention_like()
    graph = b.build()
    assert isinstance(graph, Graph)
    verify(graph)
    assert [n.op_type for n in graph.nodes] == ["MatMul", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    assert [v.name for v in graph.inputs] == ["x"]
    assert [v.name for v in graph.outputs] == ["reshape", "matmul"]
    assert graph.opset == {"": 17}


def test_builder_names_come_from_op_types_and_stay_unique():
    b = GraphBuilder()
    x = b.input("x", "float", (2,))
    first, second = b.Relu(x), b.Relu(x)
    assert first.name == "relu" and second.name != "relu" and second.name.startswith("relu")
    assert first.producer.name == "relu"
    named = b.Relu(x, name="act")
    assert named.name == "act" and named.producer.name == "act"
    with pytest.raises(ValueError, match="'x'"):
        b.input("x", "float", (2,))


def test_builder_symbols_come_from_the_symbol_table():
    b = GraphBuilder(dynamic={"B": (1, 8), "T": (1, 512)})
    x = b.input("x", "float32", ("B", "T", 768))
    graph = b.graph
    B, T = graph.symbols.get("B"), graph.symbols.get("T")
    assert x.type == TensorType(TensorProto.FLOAT, (B, T, 768))
    assert x.type.shape[0] is B and bounds(B) == (1, 8) and bounds(T) == (1, 512)
    # Expressions in text, Expr objects, and undeclared symbols.
    y = b.input("y", "int64", ("2*T", "T + 1", B * 4, "S"))
    assert y.type.shape == (2 * T, T + 1, 4 * B, symbol("S"))
    assert "S" in graph.symbols.created
    # None is a fresh unknown dimension; shape=None an unknown rank.
    u = b.input("u", "float", (None, None))
    d0, d1 = u.type.shape
    assert isinstance(d0, Expr) and d0 is not d1
    assert b.input("r", "float", None).type == TensorType(TensorProto.FLOAT, None)
    assert b.input("s", type=SequenceType(TensorType(TensorProto.FLOAT, (B,)))).type.elem.shape == (B,)


@pytest.mark.parametrize("spec, code", [
    ("float32", TensorProto.FLOAT), ("float", TensorProto.FLOAT), (TensorProto.FLOAT, TensorProto.FLOAT),
    (np.float32, TensorProto.FLOAT), (np.dtype("float32"), TensorProto.FLOAT),
    ("float64", TensorProto.DOUBLE), ("double", TensorProto.DOUBLE), ("float16", TensorProto.FLOAT16),
    ("bfloat16", TensorProto.BFLOAT16), ("int64", TensorProto.INT64), ("int32", TensorProto.INT32),
    ("uint8", TensorProto.UINT8), ("bool", TensorProto.BOOL), (np.bool_, TensorProto.BOOL),
    ("string", TensorProto.STRING), ("INT8", TensorProto.INT8),
])
def test_dtypes(spec, code):
    assert elem_type(spec) == code


@pytest.mark.parametrize("spec", ["floaty", 999, "", True])
def test_bad_dtypes(spec):
    with pytest.raises(ValueError):
        elem_type(spec)


def test_builder_ops_attributes_and_outputs():
    b = GraphBuilder(dynamic={"N": (1, 100)})
    x = b.input("x", "float", ("N", 4))
    out = b.Relu(x)
    assert out.type is None, "the builder does not infer types"
    typed = b.Relu(x, type=("float", ("N", 4)))
    assert typed.type == TensorType(TensorProto.FLOAT, (b.symbol("N"), 4))
    values, indices = b.TopK(x, np.array([2]), axis=-1, largest=True, outputs=2,
                             type=[("float", ("N", 2)), ("int64", ("N", 2))])
    node = values.producer
    assert node is indices.producer and node.outputs == [values, indices]
    assert node.attrs == {"axis": -1, "largest": 1}
    assert type(node.attrs["largest"]) is int
    assert node.inputs[1].is_initializer and node.inputs[1].const.tolist() == [2]
    assert indices.type.dtype == TensorProto.INT64
    transposed = b.Transpose(x, perm=(1, 0))
    assert transposed.producer.attrs["perm"] == [1, 0]
    clip = b.Clip(x, None, b.const(np.float32(6)))
    assert clip.producer.inputs[1] is None
    assert [u for u, _ in x.users].count(clip.producer) == 1
    custom = b.op("FusedMatMul", x, x, domain="com.microsoft", attrs={"name": "kept", "alpha": 1.0})
    assert custom.producer.domain == "com.microsoft"
    assert custom.producer.attrs == {"name": "kept", "alpha": 1.0}
    none = b.op("Dropout", x, outputs=0)
    assert none == ()
    b.output(out)
    verify(b.build())
    with pytest.raises(AttributeError):
        b.matmul  # noqa: B018 -- op types start with a capital
    with pytest.raises(TypeError):
        b.Relu([1, 2])
    with pytest.raises(ValueError, match="types for 2 outputs"):
        b.TopK(x, np.array([2]), outputs=2, type=[("float", None)])


def test_builder_subgraphs():
    b = GraphBuilder(dynamic={"N": (1, 16)})
    x = b.input("x", "float", ("N",))
    cond = b.input("cond", "bool", ())
    then = b.subgraph("then")
    then.output(then.Relu(x))
    other = b.subgraph("else")
    other.output(other.Neg(x))
    result = b.If(cond, then_branch=then, else_branch=other)
    b.output(result)
    graph = b.build()
    node = result.producer
    assert node.attrs["then_branch"] is then.graph and node.attrs["else_branch"] is other.graph
    assert then.graph.parent is graph and then.graph.root is graph
    assert then.graph.symbols is graph.symbols
    # Inner nodes read the outer value, which lists them among its users.
    inner = then.graph.nodes[0]
    assert (inner, 0) in x.users
    # Names stay unique across the whole tree.
    names = [v.name for g in (graph, then.graph, other.graph) for n in g.nodes for v in n.outputs]
    assert len(names) == len(set(names))
    assert list(node.subgraphs()) == [then.graph, other.graph]
    # A Loop body with its own inputs, nested one more level.
    body = b.subgraph("body")
    i = body.input("i", "int64", ())
    keep = body.input("keep", "bool", ())
    acc = body.input("acc", "float", ("N",))
    deeper = body.subgraph("inner")
    deeper.output(deeper.Add(acc, x))
    body.output(keep, body.If(keep, then_branch=deeper, else_branch=deeper))
    loop_out = b.Loop(b.const(np.array(3)), None, x, body=body)
    b.output(loop_out)
    verify(b.build())
    assert deeper.graph.parent is body.graph and i.graph is body.graph


# -- the verifier ------------------------------------------------------------------------


def small_graph():
    """x -> Relu -> Neg -> Add(neg, x) -> output."""
    b = GraphBuilder()
    x = b.input("x", "float", (4,))
    relu = b.Relu(x)
    neg = b.Neg(relu)
    total = b.Add(neg, x)
    b.output(total)
    return b.build(), x, relu, neg, total


def test_verifier_rejects_reading_a_later_value():
    graph, x, relu, neg, total = small_graph()
    graph.nodes[0], graph.nodes[1] = graph.nodes[1], graph.nodes[0]
    with pytest.raises(InvalidGraphError, match=r"node 'neg' \(Neg\) reads 'relu' before it is defined"):
        verify(graph)


def test_verifier_rejects_a_missing_user():
    graph, x, relu, neg, total = small_graph()
    x.users.remove((total.producer, 1))
    with pytest.raises(InvalidGraphError, match=r"'x' does not list node 'add' \(Add\) as a user"):
        verify(graph)


def test_verifier_rejects_a_stale_user():
    graph, x, relu, neg, total = small_graph()
    relu.users.append((total.producer, 1))
    with pytest.raises(InvalidGraphError, match=r"'relu' lists node 'add' \(Add\) as a user, but it reads"):
        verify(graph)


def test_verifier_rejects_a_wrong_producer():
    graph, x, relu, neg, total = small_graph()
    neg.producer = relu.producer
    with pytest.raises(InvalidGraphError, match=r"output 'neg' of node 'neg' \(Neg\) names another producer"):
        verify(graph)


def test_verifier_rejects_an_undefined_output():
    graph, x, relu, neg, total = small_graph()
    stray = Graph("other").add_input("stray", TensorType(TensorProto.FLOAT, (4,)))
    graph.outputs.append(stray)
    with pytest.raises(InvalidGraphError, match=r"graph 'graph' returns 'stray', which it never defines"):
        verify(graph)


def test_verifier_rejects_a_subgraph_with_the_wrong_parent():
    b = GraphBuilder()
    x = b.input("x", "float", (4,))
    cond = b.input("cond", "bool", ())
    then, other = b.subgraph("then"), b.subgraph("else")
    then.output(then.Relu(x))
    other.output(other.Neg(x))
    b.output(b.If(cond, then_branch=then, else_branch=other))
    graph = b.build()
    then.graph.parent = Graph("stranger")
    with pytest.raises(InvalidGraphError, match=r"subgraph 'then' of node 'if' \(If\) has the wrong parent"):
        verify(graph)


def test_verifier_rejects_reading_an_inner_value_from_outside():
    b = GraphBuilder()
    x = b.input("x", "float", (4,))
    cond = b.input("cond", "bool", ())
    then = b.subgraph("then")
    hidden = then.Relu(x)
    then.output(hidden)
    b.output(b.If(cond, then_branch=then, else_branch=then))
    leak = b.Neg(hidden)  # an outer node reading a value of the branch
    b.output(leak)
    with pytest.raises(InvalidGraphError, match=r"node 'neg' \(Neg\) reads 'relu' before it is defined"):
        b.build()


def test_verifier_rejects_a_node_of_another_graph_and_empty_initializers():
    graph, x, relu, neg, total = small_graph()
    relu.producer.graph = Graph("elsewhere")
    with pytest.raises(InvalidGraphError, match=r"node 'relu' \(Relu\) does not belong to graph 'graph'"):
        verify(graph)
    graph, *_ = small_graph()
    w = graph.add_initializer("w", np.zeros(4, np.float32))
    w.const = None
    with pytest.raises(InvalidGraphError, match="initializer 'w' has no contents"):
        verify(graph)


def test_verifier_can_require_types():
    graph, *_ = small_graph()
    verify(graph)
    with pytest.raises(InvalidGraphError, match=r"output 'relu' of node 'relu' \(Relu\) has no type"):
        verify(graph, require_types=True)


# -- def-use upkeep -------------------------------------------------------------------------


def test_replace_all_uses_then_remove_node():
    graph, x, relu, neg, total = small_graph()
    graph.replace_all_uses(relu, x)  # Relu(x) -> x
    verify(graph)
    assert relu.users == []
    assert (neg.producer, 0) in x.users and neg.producer.inputs == [x]
    graph.remove_node(relu.producer)
    verify(graph)
    assert [n.op_type for n in graph.nodes] == ["Neg", "Add"]
    assert sorted(i for _, i in x.users) == [0, 1]
    assert all(user.graph is graph for user, _ in x.users)


def test_replace_all_uses_updates_outputs_and_subgraphs():
    b = GraphBuilder()
    x = b.input("x", "float", (4,))
    cond = b.input("cond", "bool", ())
    relu = b.Relu(x)
    then = b.subgraph("then")
    then.output(relu, then.Neg(relu))  # the branch returns and reads an outer value
    other = b.subgraph("else")
    other.output(other.Identity(relu), x)
    first, second = b.If(cond, then_branch=then, else_branch=other, outputs=2)
    b.output(relu, first, second)
    graph = b.build()
    inner_users = [user for user, _ in relu.users if user.graph is not graph]
    assert len(inner_users) == 2
    graph.replace_all_uses(relu, x)
    verify(graph)
    assert relu.users == []
    assert graph.outputs[0] is x and then.graph.outputs[0] is x
    assert all(user.inputs[i] is x for user, i in x.users)
    graph.remove_node(relu.producer)
    verify(graph)


def test_remove_node_refuses_while_used():
    graph, x, relu, neg, total = small_graph()
    with pytest.raises(ValueError, match="'relu' still used"):
        graph.remove_node(relu.producer)
    verify(graph)


def test_set_input_keeps_users():
    graph, x, relu, neg, total = small_graph()
    add = total.producer
    add.set_input(1, relu)
    verify(graph)
    assert (add, 1) in relu.users and (add, 1) not in x.users
    add.set_input(1, None)
    verify(graph)
    assert add.inputs[1] is None


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_rewrites_keep_def_use_consistent(data):
    """Random chains, then random replace-and-remove rewrites; verify after each."""
    b = GraphBuilder()
    values = [b.input("x", "float", (3,)), b.input("y", "float", (3,))]
    for _ in range(data.draw(st.integers(1, 10), label="nodes")):
        if data.draw(st.booleans()):
            values.append(b.Relu(data.draw(st.sampled_from(values))))
        else:
            values.append(b.Add(data.draw(st.sampled_from(values)), data.draw(st.sampled_from(values))))
    b.output(values[-1])
    graph = b.build()
    for _ in range(data.draw(st.integers(1, 6), label="rewrites")):
        produced = [v for v in values if v.producer is not None and v.producer.graph is graph]
        if not produced:
            break
        old = data.draw(st.sampled_from(produced))
        position = graph.nodes.index(old.producer)
        earlier = [v for v in graph.inputs] + [n.outputs[0] for n in graph.nodes[:position]]
        graph.replace_all_uses(old, data.draw(st.sampled_from(earlier)))
        verify(graph)
        assert old.users == [] and old not in graph.outputs
        graph.remove_node(old.producer)
        verify(graph)
        for node in graph.nodes:
            for index, value in enumerate(node.inputs):
                assert (node, index) in value.users


# -- the printer ------------------------------------------------------------------------------


def test_printer_shows_ops_and_symbolic_shapes():
    b = attention_like()
    x = b.graph.inputs[0]
    b.Relu(x, type=("float32", ("B", "T", 768)))
    text = str(b.build())
    assert "%x: float[B, T, 768]" in text
    assert "%w: float[768, 64] = initializer" in text
    for op in ("MatMul", "Shape", "Gather", "Concat", "Reshape"):
        assert f"= {op}(" in text
    assert "Gather(%shape, %const; axis=0)" in text
    assert "%relu: float[B, T, 768] = Relu(%x)" in text
    assert text.rstrip().endswith("return %reshape, %matmul\n}")


def test_printer_shows_subgraphs_and_expressions():
    b = GraphBuilder(dynamic={"T": (1, 64)})
    x = b.input("x", "float", ("2*T + 1",))
    cond = b.input("cond", "bool", ())
    then = b.subgraph("then")
    then.output(then.Relu(x))
    b.output(b.If(cond, then_branch=then, else_branch=then, type=("float", ("2*T + 1",))))
    text = str(b.build())
    assert "%x: float[2*T + 1]" in text
    assert "then_branch:" in text and "graph then(" in text
    assert "%if: float[2*T + 1] = If(%cond)" in text
    assert "        %relu: None = Relu(%x)" in text  # indented under its node
