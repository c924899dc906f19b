"""Golden before/after tests of the clean-up rewrite rules (passes/simplify/rules.py).

Each graph is typed, run through the rules alone by a small local driver (the
rules plus dead-node removal, no folding or re-inference), verified, and
compared op by op with what is expected; the outputs are checked against the
graph before the rewrite on random inputs, at several values of the symbolic
dims.  Negative cases pin down rewrites that must not happen.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pytest

from shapeshift.ir import Graph, GraphBuilder, verify
from shapeshift.ir.graph import StaticParam, Value
from shapeshift.codegen.lower.contracts import agreements
from shapeshift.ir.types import TensorType, to_numpy_dtype
from shapeshift.passes.infer_types import infer_types
from shapeshift.passes.simplify.rewriter import Rewriter
from shapeshift.passes.simplify.rules import RULES
from shapeshift.runtime.reference import ReferenceExecutor
from shapeshift.symbolic import evaluate, mul

DYNAMIC = {"B": (1, 8), "T": (1, 64)}
BINDINGS = [{"B": 1, "T": 1}, {"B": 2, "T": 5}, {"B": 3, "T": 16}]


# -- the driver -------------------------------------------------------------------------


def _graphs(graph: Graph):
    yield graph
    for node in graph.nodes:
        if node.graph is graph:
            for sub in node.subgraphs():
                yield from _graphs(sub)


def _is_read(value: Value, root: Graph) -> bool:
    return bool(value.users) or any(any(v is value for v in g.outputs) for g in _graphs(root))


def run_rules(graph: Graph) -> int:
    """Apply RULES (and drop dead nodes) to a fixpoint; returns how many rules fired."""
    rw = Rewriter(graph)
    rw.enqueue_all(list(graph.walk_nodes()))
    fired = 0
    for _ in range(10_000):
        node = rw.pop()
        if node is None:
            break
        if not any(_is_read(out, graph) for out in node.outputs):
            rw.remove_node(node)
            continue
        for rule in RULES.get(node.op_type, []):
            if node.graph is not None and rule(node, rw):
                fired += 1
                break
    else:
        raise AssertionError("the rules did not reach a fixpoint")
    rw.compact()
    verify(graph)
    return fired


def ops(graph: Graph) -> list[str]:
    return [node.op_type for node in graph.nodes]


def _random(t: TensorType, binding: dict, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(evaluate(d, binding) for d in t.shape)
    dtype = to_numpy_dtype(t.dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check(build: Callable[[GraphBuilder], None], expected: list[str], opset: int = 17,
          bindings: Optional[list[dict]] = None) -> Graph:
    """Build, type, rewrite and compare: the op sequence and the outputs, before and after."""
    b = GraphBuilder(opset=opset, dynamic=DYNAMIC)
    build(b)
    graph = b.build()
    infer_types(graph)
    assert not graph.metadata.get("inference_warnings")
    rng = np.random.default_rng(0)
    cases = []
    for binding in bindings or BINDINGS:
        feeds = {v: _random(v.type, binding, rng) for v in graph.inputs}
        cases.append((feeds, binding, ReferenceExecutor(graph).run(feeds, binding)))
    run_rules(graph)
    assert ops(graph) == expected, str(graph)
    for feeds, binding, before in cases:
        after = ReferenceExecutor(graph).run(feeds, binding)
        assert len(after) == len(before)
        for x, y in zip(before, after):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
    return graph


def only(graph: Graph, op_type: str):
    nodes = [n for n in graph.nodes if n.op_type == op_type]
    assert len(nodes) == 1, str(graph)
    return nodes[0]


# -- Identity, Dropout, Constant -----------------------------------------------------------


def test_identity_chain_goes_even_at_the_output():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        b.output(b.Identity(b.Relu(b.Identity(x))))

    graph = check(build, ["Relu"])
    assert graph.outputs[0].producer is graph.nodes[0]


def test_identity_of_an_input_straight_to_the_output():
    def build(b):
        x = b.input("x", "float32", ("B", 4))
        b.output(b.Identity(x))

    graph = check(build, [])
    assert graph.outputs == graph.inputs


def test_identity_of_another_domain_stays():
    b = GraphBuilder(opset={"": 17, "custom": 1})
    x = b.input("x", "float32", (4,))
    b.output(b.Identity(x, domain="custom", type=("float32", (4,))))
    graph = b.build()
    assert run_rules(graph) == 0
    assert ops(graph) == ["Identity"]


@pytest.mark.parametrize("opset", [10, 13])
def test_inference_dropout_goes(opset):
    def build(b):
        x = b.input("x", "float32", ("B", "T", 8))
        b.output(b.Relu(b.Dropout(x, ratio=0.3) if opset < 12 else b.Dropout(x, np.array(0.3, np.float32))))

    check(build, ["Relu"], opset=opset)


def test_dropout_with_training_mode_false_goes():
    def build(b):
        x = b.input("x", "float32", ("B", 8))
        b.output(b.Dropout(x, np.array(0.5, np.float32), np.array(False)))

    check(build, [])


def test_dropout_in_training_mode_stays():
    b = GraphBuilder(opset=17)
    x = b.input("x", "float32", (4, 8))
    b.output(b.Dropout(x, np.array(0.5, np.float32), np.array(True), seed=0))
    graph = b.build()
    infer_types(graph)
    assert run_rules(graph) == 0 and ops(graph) == ["Dropout"]


def test_dropout_with_unknown_training_mode_stays():
    b = GraphBuilder(opset=17)
    x = b.input("x", "float32", (4, 8))
    mode = b.input("mode", "bool", ())
    b.output(b.Dropout(x, None, mode))
    graph = b.build()
    infer_types(graph)
    assert run_rules(graph) == 0 and ops(graph) == ["Dropout"]


def test_dropout_whose_mask_is_used_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 8))
        y, mask = b.Dropout(x, outputs=2)
        b.output(y, mask)

    check(build, ["Dropout"])


def test_dropout_whose_mask_is_unused_goes():
    def build(b):
        x = b.input("x", "float32", ("B", 8))
        y, _ = b.Dropout(x, outputs=2)
        b.output(b.Relu(y))

    check(build, ["Relu"])


def test_a_dead_chain_goes_in_one_removal():
    """Removing the unread Exp leaves Abs, then Neg, unread: each goes at once."""
    def build(b):
        x = b.input("x", "float32", ("B", 8))
        b.Exp(b.Abs(b.Neg(x)))
        b.output(b.Relu(x))

    check(build, ["Relu"])


def test_a_producer_with_another_output_still_read_stays():
    """Split's first output loses its only reader; its second is still read."""
    def build(b):
        x = b.input("x", "float32", ("B", 8))
        first, second = b.Split(x, axis=1, num_outputs=2, outputs=2)
        b.Neg(first)
        b.output(b.Relu(second))

    check(build, ["Split", "Relu"], opset=18)


@pytest.mark.parametrize("attr, value", [
    ("value", np.arange(8, dtype=np.float32).reshape(1, 1, 8)),
    ("value_float", 2.5),
    ("value_floats", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
    ("value_int", 3),
])
def test_constant_becomes_an_initializer(attr, value):
    def build(b):
        x = b.input("x", "float32", ("B", "T", 8))
        c = b.Constant(attrs={attr: value})
        if attr == "value_int":
            c = b.Cast(c, to=1)
        b.output(b.Add(x, c))

    graph = check(build, ["Cast", "Add"] if attr == "value_int" else ["Add"])
    (init,) = graph.initializers.values()
    np.testing.assert_array_equal(init.const, np.asarray(value))
    assert init.users


def test_constant_in_a_branch_becomes_an_initializer_of_the_branch():
    def build(b):
        x = b.input("x", "float32", ("B", 4))
        cond = b.input("cond", "bool", ())
        then = b.subgraph("then")
        then.output(then.Add(x, then.Constant(value=np.full((1, 4), 2, np.float32))))
        other = b.subgraph("else")
        other.output(other.Identity(x))
        b.output(b.If(cond, then_branch=then, else_branch=other))

    graph = check(build, ["If"])
    node = graph.nodes[0]
    then, other = node.attrs["then_branch"], node.attrs["else_branch"]
    assert ops(then) == ["Add"] and len(then.initializers) == 1
    # A branch does not return an outer value directly: its Identity stays.
    assert ops(other) == ["Identity"]


def test_branches_keep_the_identity_that_returns_an_outer_value():
    def build(b):
        x = b.input("x", "float32", ("B", 4))
        cond = b.input("cond", "bool", ())
        y = b.Relu(x)
        branches = []
        for name in ("then", "else"):
            branch = b.subgraph(name)
            inner = branch.Transpose(branch.Transpose(y, perm=[1, 0]), perm=[1, 0])
            branch.output(branch.Identity(branch.Cast(inner, to=1)))
            branches.append(branch)
        b.output(b.If(cond, then_branch=branches[0], else_branch=branches[1]))

    graph = check(build, ["Relu", "If"])
    for name in ("then_branch", "else_branch"):
        body = graph.nodes[1].attrs[name]
        assert len(body.nodes) == 1 and body.outputs[0].producer is body.nodes[0]
        assert body.nodes[0].inputs[0] is graph.nodes[0].outputs[0]


# -- Cast ---------------------------------------------------------------------------------


def test_cast_to_the_same_type_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T"))
        b.output(b.Relu(b.Cast(x, to=1)))

    check(build, ["Relu"])


def test_castlike_of_the_same_type_goes():
    def build(b):
        x = b.input("x", "int64", ("B",))
        b.output(b.CastLike(x, np.array([1], np.int64)))

    check(build, [])


def test_widening_cast_and_back_goes():
    def build(b):
        x = b.input("x", "int32", ("B", "T"))
        b.output(b.Cast(b.Cast(x, to=7), to=6))  # int32 -> int64 -> int32

    check(build, [])


def test_cast_through_an_exact_widening_becomes_one_cast():
    def build(b):
        x = b.input("x", "float16", ("B", 3))
        b.output(b.Cast(b.Cast(x, to=1), to=11))  # float16 -> float32 -> float64

    graph = check(build, ["Cast"])
    assert graph.nodes[0].attrs["to"] == 11 and graph.nodes[0].inputs[0] is graph.inputs[0]


def test_cast_through_a_shared_widening_keeps_the_other_reader():
    def build(b):
        x = b.input("x", "int8", ("B",))
        wide = b.Cast(x, to=6)  # int8 -> int32
        b.output(b.Cast(wide, to=1), b.Neg(wide))

    graph = check(build, ["Cast", "Cast", "Neg"])
    assert all(n.inputs[0] is graph.inputs[0] for n in graph.nodes if n.op_type == "Cast")


@pytest.mark.parametrize("source, middle, target", [
    ("int64", 6, 7),   # int64 -> int32 -> int64 truncates
    ("float32", 10, 1),  # float32 -> float16 -> float32 rounds
    ("float32", 6, 1),  # float32 -> int32 -> float32 truncates
    ("int32", 1, 6),   # int32 -> float32 -> int32 rounds large values
    ("uint8", 3, 2),   # uint8 -> int8 -> uint8 wraps
])
def test_narrowing_cast_pairs_stay(source, middle, target):
    def build(b):
        x = b.input("x", source, ("B", "T"))
        b.output(b.Cast(b.Cast(x, to=middle), to=target))

    check(build, ["Cast", "Cast"])


# -- Reshape, Flatten, Expand, Squeeze, Unsqueeze with the same shape -------------------------


def test_reshape_to_its_own_symbolic_shape_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        head = b.Slice(b.Shape(x), np.array([0]), np.array([2]))
        shape = b.Concat(head, np.array([64]), axis=0)
        b.output(b.Relu(b.Reshape(x, shape)))

    check(build, ["Relu"])


def test_reshape_with_a_static_param_to_its_own_shape_goes():
    b = GraphBuilder(opset=17, dynamic=DYNAMIC)
    x = b.input("x", "float32", ("B", "T", 64))
    out = b.Reshape(x, None)
    out.producer.params[1] = StaticParam((b.symbol("B"), b.symbol("T"), 64), (3,), 7)
    b.output(b.Relu(out))
    graph = b.build()
    infer_types(graph)
    run_rules(graph)
    assert ops(graph) == ["Relu"]


def test_reshape_that_changes_the_shape_stays():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        b.output(b.Reshape(x, np.array([0, 0, 4, 16])))

    check(build, ["Reshape"])


def test_flatten_of_a_matrix_goes_and_of_a_cube_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 16))
        y = b.input("y", "float32", ("B", "T", 4))
        b.output(b.Flatten(x, axis=1), b.Flatten(y, axis=1))

    graph = check(build, ["Flatten"])
    assert graph.outputs[0] is graph.inputs[0]


def test_expand_that_broadcasts_nothing_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        b.output(b.Relu(b.Expand(x, np.array([1, 1, 64]))), b.Expand(x, b.Shape(x)))

    check(build, ["Relu"])


def test_expand_that_broadcasts_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 1, 64))
        b.output(b.Expand(x, np.array([1, 4, 64])))

    check(build, ["Expand"])


# -- Reshape chains ---------------------------------------------------------------------------


def test_reshape_of_reshape_becomes_one_reshape():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        heads = b.Reshape(x, np.array([0, 0, 4, 16]))
        b.output(b.Reshape(heads, np.array([0, -1])))

    graph = check(build, ["Reshape"])
    node = graph.nodes[0]
    assert node.inputs[0] is graph.inputs[0]
    assert node.inputs[1].const.tolist() == [0, -1]


def test_reshape_of_reshape_back_to_the_input_shape_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        heads = b.Reshape(x, np.array([0, 0, 4, 16]))
        b.output(b.Relu(b.Reshape(heads, np.array([0, 0, 64]))))

    check(build, ["Relu"])


def test_reshape_of_flatten_and_unsqueeze_reads_the_source():
    def build(b):
        x = b.input("x", "float32", ("B", 4, 6))
        flat = b.Flatten(b.Unsqueeze(x, np.array([1])), axis=2)
        b.output(b.Reshape(flat, np.array([-1, 3, 8])))

    graph = check(build, ["Reshape"])
    assert graph.nodes[0].inputs[0] is graph.inputs[0]


def test_reshape_chain_with_static_params_over_symbols():
    b = GraphBuilder(opset=17, dynamic=DYNAMIC)
    B, T = b.symbol("B"), b.symbol("T")
    x = b.input("x", "float32", ("B", "T", 64))
    rows = b.Reshape(x, None)
    rows.producer.params[1] = StaticParam((mul(B, T), 64), (2,), 7)
    heads = b.Reshape(rows, None)
    heads.producer.params[1] = StaticParam((B, T, 8, 8), (4,), 7)
    b.output(heads)
    graph = b.build()
    infer_types(graph)
    binding = {"B": 2, "T": 3}
    data = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    before = ReferenceExecutor(graph).run({x: data}, binding)
    run_rules(graph)
    assert ops(graph) == ["Reshape"]
    node = graph.nodes[0]
    assert node.inputs[0] is x and node.params[1].dims == (B, T, 8, 8)
    np.testing.assert_array_equal(ReferenceExecutor(graph).run({x: data}, binding)[0], before[0])


def test_reshape_whose_zero_copies_an_intermediate_dim_stays():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        rows = b.Reshape(x, np.array([-1, 64]))  # (B*T, 64)
        b.output(b.Reshape(rows, np.array([0, 8, 8])))  # the 0 is B*T, not B

    check(build, ["Reshape", "Reshape"])


def test_reshape_whose_zero_copies_a_shared_dim_reads_the_source():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        heads = b.Reshape(x, np.array([0, 0, 8, 8]))
        b.output(b.Reshape(heads, np.array([0, 0, 2, 32])))

    graph = check(build, ["Reshape"])
    assert graph.nodes[0].inputs[0] is graph.inputs[0]


def test_reshape_of_a_shared_reshape_keeps_the_other_reader():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        heads = b.Reshape(x, np.array([0, 0, 4, 16]))
        b.output(b.Reshape(heads, np.array([0, -1])), b.Relu(heads))

    graph = check(build, ["Reshape", "Reshape", "Relu"])
    assert all(n.inputs[0] is graph.inputs[0] for n in graph.nodes if n.op_type == "Reshape")


# -- Transpose ----------------------------------------------------------------------------


def test_identity_transpose_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 4))
        y = b.input("y", "float32", ("B",))
        b.output(b.Relu(b.Transpose(x, perm=[0, 1, 2])), b.Transpose(y))

    check(build, ["Relu"])


def test_inverse_transposes_go():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 4, 16))
        there = b.Transpose(x, perm=[0, 2, 1, 3])
        back = b.Transpose(there, perm=[0, 2, 1, 3])
        b.output(b.Relu(back))

    check(build, ["Relu"])


def test_default_perm_twice_goes():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 4))
        b.output(b.Relu(b.Transpose(b.Transpose(x))))

    check(build, ["Relu"])


def test_transpose_pair_that_is_not_inverse_becomes_one_composed_transpose():
    p, q = [1, 0, 2], [0, 2, 1]

    def build(b):
        x = b.input("x", "float32", ("B", "T", 4))
        b.output(b.Transpose(b.Transpose(x, perm=p), perm=q))

    graph = check(build, ["Transpose"])
    node = graph.nodes[0]
    assert node.inputs[0] is graph.inputs[0]
    data = np.arange(24).reshape(2, 3, 4)
    np.testing.assert_array_equal(np.transpose(data, node.attrs["perm"]), np.transpose(np.transpose(data, p), q))
    assert node.outputs[0].type == graph.outputs[0].type


def test_transpose_of_unknown_rank_without_perm_stays():
    b = GraphBuilder(opset=17)
    x = b.input("x", "float32", None)
    b.output(b.Transpose(x))
    graph = b.build()
    infer_types(graph)
    assert run_rules(graph) == 0 and ops(graph) == ["Transpose"]


# -- Squeeze / Unsqueeze -------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("added, removed", [([1], [1]), ([-1], [3]), ([0, 2], [2, 0])])
def test_squeeze_of_unsqueeze_goes(opset, added, removed):
    def build(b):
        x = b.input("x", "float32", ("B", "T", 8))
        if opset < 13:
            y = b.Squeeze(b.Unsqueeze(x, axes=added), axes=removed)
        else:
            y = b.Squeeze(b.Unsqueeze(x, np.array(added)), np.array(removed))
        b.output(b.Relu(y))

    check(build, ["Relu"], opset=opset)


def test_squeeze_without_axes_of_unsqueeze_goes_when_no_other_dim_can_be_one():
    def build(b):
        x = b.input("x", "float32", (2, 3))
        b.output(b.Relu(b.Squeeze(b.Unsqueeze(x, np.array([0, 2])))))

    check(build, ["Relu"])


def test_squeeze_of_unsqueeze_of_other_axes_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 1, 8))
        b.output(b.Squeeze(b.Unsqueeze(x, np.array([0])), np.array([2])))

    check(build, ["Unsqueeze", "Squeeze"])


def test_squeeze_without_axes_over_a_symbolic_dim_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 8))  # B may be 1
        b.output(b.Squeeze(b.Unsqueeze(x, np.array([0])), type=("float32", None)))

    check(build, ["Unsqueeze", "Squeeze"], bindings=[{"B": 2}, {"B": 3}])


def test_unsqueeze_of_squeeze_goes():
    def build(b):
        x = b.input("x", "float32", ("B", 1, "T", 1))
        b.output(b.Relu(b.Unsqueeze(b.Squeeze(x, np.array([1, -1])), np.array([3, 1]))))

    check(build, ["Relu"])


def test_unsqueeze_of_squeeze_at_another_axis_stays():
    def build(b):
        x = b.input("x", "float32", ("B", 1, 64))
        b.output(b.Unsqueeze(b.Squeeze(x, np.array([1])), np.array([2])))

    check(build, ["Squeeze", "Unsqueeze"])


# -- a mix, in a loop body ---------------------------------------------------------------------


def test_rules_reach_into_loop_bodies():
    def build(b):
        x = b.input("x", "float32", ("B", "T", 64))
        body = b.subgraph("body")
        body.input("i", "int64", ())
        cond = body.input("cond_in", "bool", ())
        acc = body.input("acc", "float32", ("B", "T", 64))
        moved = body.Transpose(body.Transpose(acc, perm=[1, 0, 2]), perm=[1, 0, 2])
        step = body.Reshape(body.Reshape(x, np.array([0, 0, 8, 8])), np.array([0, 0, 64]))
        body.output(body.Identity(cond), body.Add(moved, body.Cast(step, to=1)))
        b.output(b.Loop(np.array(3, np.int64), np.array(True), x, body=body))

    graph = check(build, ["Loop"])
    assert ops(graph.nodes[0].attrs["body"]) == ["Add"]


# -- Range over a cast integer -------------------------------------------------------------


def _anchor_range(b, start: float, delta: float, axis: int = 1, x=None):
    """Range(start, Cast<float>(Gather(Shape(x), axis)), delta) + 0.5, as exporters write anchors."""
    x = x if x is not None else b.input("x", "float32", ("B", "T"))
    n = b.Gather(b.Shape(x), np.array(axis, np.int64), axis=0)
    r = b.Range(np.array(start, np.float32), b.Cast(n, to=1), np.array(delta, np.float32))
    b.output(b.Add(r, np.array(0.5, np.float32)))


@pytest.mark.parametrize("start, delta", [(0.0, 1.0), (2.0, 3.0), (7.0, -2.0), (-3.0, 1.0)])
def test_float_range_over_a_cast_dim_takes_the_dim_as_its_limit(start, delta):
    graph = check(lambda b: _anchor_range(b, start, delta), ["Range", "Add"])
    r = only(graph, "Range")
    assert r.inputs[1] is None and r.params[1].dtype == 1 and r.params[1].shape == ()
    assert [str(d) for d in r.params[1].dims] == ["T"], "the dim itself, a float parameter"
    infer_types(graph)
    (length,) = r.outputs[0].type.shape
    for t in (1, 2, 5, 64):
        assert evaluate(length, {"B": 1, "T": t}) == len(np.arange(start, t, delta))
    assert not agreements(r), "T's range (1..64) proves the values whole numbers float32 holds"


@pytest.mark.parametrize("start, delta", [(0.5, 1.0), (0.0, 0.25)])
def test_float_range_with_fractional_ends_stays(start, delta):
    check(lambda b: _anchor_range(b, start, delta), ["Shape", "Gather", "Cast", "Range", "Add"])


def test_float_range_over_a_dim_float32_cannot_hold_exactly_is_checked_at_run_time():
    # T up to 2^30: past 2^24 float32 rounds the limit and the values, and onnxruntime's
    # float Range then differs from the integer length the type gives, so the native
    # program checks the limit ahead of the Range's kernel (codegen/lower/contracts.py).
    b = GraphBuilder(opset=17, dynamic={"B": (1, 8), "T": (1, 1 << 30)})
    _anchor_range(b, 0.0, 1.0)
    graph = b.build()
    infer_types(graph)
    run_rules(graph)
    assert ops(graph) == ["Range", "Add"]
    (guard,) = agreements(only(graph, "Range"))  # T >= -(2^24 - 2) is proven: T >= 1
    assert guard.at_least and guard.lhs == (1 << 24) - 2 and str(guard.rhs) == "T"
    assert guard.holds((1 << 24) - 2, (1 << 24) - 2) and not guard.holds((1 << 24) - 2, (1 << 24) - 1)
