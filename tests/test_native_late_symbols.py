"""Late symbols: a dim that only the data fixes (NonZero's count, a Range over computed
bounds, a TopK's computed k, an If whose branches disagree) is bound by the VM at run
time, so the nodes after it still run natively. NonZero, Range, ConstantOfShape and
elementwise broadcasts compute such dims natively (a size step); other producers
(Unique, If) fall back and the VM reads the dims off their results.

Each model is compared with onnxruntime over several input sizes in one session (the
late dims change from run to run); the expected fallback steps are named.
"""

from __future__ import annotations

import weakref

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.codegen.program import LATE

from . import test_native_ops_extra
from .test_native_ops_extra import _input, _model, _output

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _scalar(name, value, dtype=F):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, [], [value]))


def _compare(model, feeds_list, only_fallback):
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert dict(program.fallback_ops()) == only_fallback, [(s.node.op_type, s.reason) for s in program.steps
                                                         if s.reason]
    assert program.late_symbols
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        for got, want in zip(session.run(None, feeds), reference.run(None, feeds)):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return program


def test_nonzero_count_feeds_native_gather_and_elementwise():
    nodes = [_scalar("zero_f", 0.0), helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             _scalar("zero_i", 0, I64), helper.make_node("Gather", ["where", "zero_i"], ["index"], axis=0),
             helper.make_node("Gather", ["x", "index"], ["picked"], axis=0),
             _scalar("two", 2.0), helper.make_node("Mul", ["picked", "two"], ["doubled"]),
             helper.make_node("Exp", ["doubled"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
    model = _model(nodes, [_input("x", ["n"])], [_output("y"), _output("total")])
    rng = np.random.default_rng(0)
    # Sizes up and down (late buffers are sized per run), an empty selection included.
    feeds = [{"x": rng.standard_normal(n).astype(np.float32)} for n in (5, 40, 1, 17, 3)]
    feeds.append({"x": -np.ones(6, dtype=np.float32)})
    program = _compare(model, feeds, {})
    assert any(slot.kind == LATE for slot in program.slots)
    assert [s.node.op_type for s in program.steps if s.binds] == ["NonZero"]  # its size step


def test_range_over_computed_bounds():
    # limit = ReduceMax(int input): the Range's length is data; its consumers go native.
    nodes = [helper.make_node("ReduceMax", ["k"], ["limit"], keepdims=0),
             _scalar("start", 0, I64), _scalar("step", 1, I64),
             helper.make_node("Range", ["start", "limit", "step"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F),
             helper.make_node("Unsqueeze", ["rf", "axis1"], ["col"]),
             helper.make_node("Mul", ["col", "x"], ["outer"]),
             helper.make_node("Softmax", ["outer"], ["y"], axis=0)]
    axis1 = helper.make_tensor("axis1", I64, [1], [1])
    model = _model(nodes, [_input("k", ["m"], I64), _input("x", [1, "n"])], [_output("y")], [axis1])
    rng = np.random.default_rng(1)
    feeds = [{"k": rng.integers(1, limit + 1, 4).astype(np.int64) * 0 + limit,
              "x": rng.standard_normal((1, n)).astype(np.float32)} for limit, n in ((3, 2), (9, 5), (1, 1), (6, 8))]
    _compare(model, feeds, {})


def test_constant_of_shape_from_data():
    nodes = [helper.make_node("Abs", ["s"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("v", F, [1], [1.5])),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Mul", ["ones", "total"], ["y"])]
    model = _model(nodes, [_input("s", [2], I64), _input("x", ["n"])], [_output("y")])
    rng = np.random.default_rng(3)
    feeds = [{"s": np.array(shape, dtype=np.int64), "x": rng.standard_normal(n).astype(np.float32)}
             for shape, n in (((3, 4), 4), ((1, 2), 2), ((5, 1), 7), ((0, 3), 3))]
    _compare(model, feeds, {})


def _unique_model():
    # Unique has no native rule: it falls back, and binds its output length for the Mul.
    nodes = [helper.make_node("Unique", ["x"], ["values", "indices", "inverse", "counts"]),
             _scalar("two", 2.0), helper.make_node("Mul", ["values", "two"], ["y"])]
    return _model(nodes, [_input("x", ["n"])], [_output("y"), _output("counts", I64)])


def test_fallback_producer_binds_for_native_consumers():
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.integers(0, k, n).astype(np.float32)} for n, k in ((6, 2), (9, 9), (3, 1), (12, 5))]
    program = _compare(_unique_model(), feeds, {"Unique": 1})
    assert [s.kind for s in program.steps if s.binds] == ["fallback"]


def test_if_whose_branches_disagree_on_a_dim():
    # then: x[:2]; else: x (n rows): the If's output dim is late; a native Relu follows.
    starts, ends, axes = (helper.make_tensor(name, I64, [1], [v]) for name, v in (("s", 0), ("e", 2), ("a", 0)))
    then_graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", F, None)], [starts, ends, axes])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["u"])], "else", [],
                                   [helper.make_tensor_value_info("u", F, None)])
    nodes = [helper.make_node("If", ["c"], ["picked"], then_branch=then_graph, else_branch=else_graph),
             helper.make_node("Relu", ["picked"], ["y"])]
    model = _model(nodes, [_input("x", ["n", 3]), _input("c", [], TensorProto.BOOL)], [_output("y")])
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((n, 3)).astype(np.float32), "c": np.array(c)}
             for n, c in ((4, True), (4, False), (7, False), (2, True), (9, False))]
    program = _compare(model, feeds, {})
    assert any(step.binds for step in program.steps)


def test_late_symbols_survive_a_compiled_artifact(tmp_path):
    nodes = [_scalar("zero_f", 0.0), helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]), helper.make_node("Neg", ["where"], ["y"])]
    model = _model(nodes, [_input("x", ["n"])], [_output("y", I64)])
    path = tmp_path / "late.ssa"
    shapeshift.compile(model, path)
    session = shapeshift.InferenceSession(str(path))
    x = np.array([1.0, -1.0, 2.0, 0.0, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -np.array([[0, 2, 4]]))
    x = np.array([-1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -np.array([[1]]))


@pytest.mark.parametrize("wrong", ["rank", "dtype"])
def test_fallback_result_that_contradicts_its_type_is_an_error(monkeypatch, wrong):
    """A late-bound result is still checked: a wrong rank or dtype is a clear error."""
    from shapeshift.errors import ExecutionError
    from shapeshift.runtime import vm

    session = shapeshift.InferenceSession(_unique_model(), backend="native")
    real = vm.NativeVM._evaluate

    def broken(self, node, env, binding):
        values, *rest = real(self, node, env, binding)
        return [values.reshape(1, -1) if wrong == "rank" else values.astype(np.float64), *rest]

    monkeypatch.setattr(vm.NativeVM, "_evaluate", broken)
    with pytest.raises(ExecutionError, match="Unique"):
        session.run(None, {"x": np.array([1.0, -2.0, 3.0], dtype=np.float32)})


def test_broadcast_of_late_dims_is_sized_natively():
    # ones [s0, s1] + x [1, n]: whether s1 or n gives the output dim is known only at run time.
    nodes = [helper.make_node("Abs", ["s"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=helper.make_tensor("v", F, [1], [1.5])),
             helper.make_node("Add", ["ones", "x"], ["sum"]), helper.make_node("Relu", ["sum"], ["y"])]
    model = _model(nodes, [_input("s", [2], I64), _input("x", [1, "n"])], [_output("y")])
    rng = np.random.default_rng(6)
    feeds = [{"s": np.array(shape, dtype=np.int64), "x": rng.standard_normal((1, n)).astype(np.float32)}
             for shape, n in (((3, 4), 4), ((2, 1), 5), ((1, 6), 6), ((4, 1), 1))]
    program = _compare(model, feeds, {})
    assert [s.node.op_type for s in program.steps if s.binds] == ["ConstantOfShape", "Add"]


def test_broadcast_of_late_dims_that_disagree_is_an_error():
    from shapeshift.errors import ExecutionError

    nodes = [helper.make_node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("v", F, [1], [1.0])),
             helper.make_node("Add", ["ones", "x"], ["y"])]
    model = _model(nodes, [_input("s", [1], I64), _input("x", ["n"])], [_output("y")])
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    with pytest.raises(ExecutionError, match="broadcast"):
        session.run(None, {"s": np.array([3], dtype=np.int64), "x": np.ones(4, dtype=np.float32)})


@pytest.mark.parametrize("op,feed,pattern", [
    ("ConstantOfShape", {"s": np.array([-1], np.int64)}, "'cs' \\(ConstantOfShape\\): .*negative"),
    ("Range", {"a": np.float32(0), "b": np.float32(10), "c": np.float32(0)}, "'cs' \\(Range\\): .*not a number"),
    ("Range", {"a": np.float32(0), "b": np.float32(np.nan), "c": np.float32(1)}, "not a number"),
    ("Range", {"a": np.float32(0), "b": np.float32(1e15), "c": np.float32(1)}, "more than this machine('s memory| can allocate)"),
], ids=["negative dim", "zero delta", "NaN limit", "too large"])
def test_sizes_from_data_that_make_no_tensor_are_errors(op, feed, pattern):
    """They came out as empty arrays (a negative dim, a NaN bound) or as a raw MemoryError."""
    from shapeshift.errors import ExecutionError

    if op == "ConstantOfShape":
        model = _model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="cs")], [_input("s", [1], I64)],
                       [_output("y")])
    else:
        model = _model([helper.make_node("Range", ["a", "b", "c"], ["y"], name="cs")],
                       [_input(n, []) for n in "abc"], [_output("y")])
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    with pytest.raises(ExecutionError, match=pattern):
        session.run(None, feed)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_functions_of_a_size_given_at_run_time(op, periodic):
    nodes = [helper.make_node(op, ["size"], ["w"], periodic=periodic), helper.make_node("Mul", ["w", "w"], ["y"])]
    # onnx's shape inference gives no rank for a window of run-time size: the outputs
    # declare it, with a length symbol of their own (a late symbol for the program).
    outputs = [helper.make_tensor_value_info(name, F, ["length"]) for name in ("w", "y")]
    model = _model(nodes, [_input("size", [], I64)], outputs, opset=17)
    # Size 1 in symmetric mode divides 0 by 0: NaN in both.
    feeds = [{"size": np.array(n, dtype=np.int64)} for n in (8, 3, 17, 2)]
    _compare(model, feeds, {})


def test_a_viewed_late_buffer_past_the_huge_page_size_is_not_reused():
    # A late buffer of at least huge_pages.MIN_BYTES lies on a mapping of its own: a view of
    # it (a fallback's result over it, an output handed back without a copy; here one taken
    # by hand) must keep it from the next run as it does a small one. It did not: the
    # view's base was the mapping's array, not the buffer, and the next run of the same
    # count wrote over it.
    from shapeshift.runtime.huge_pages import MIN_BYTES

    nodes = [_scalar("zero_f", 0.0), helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             _scalar("zero_i", 0, I64), helper.make_node("Gather", ["where", "zero_i"], ["index"], axis=0),
             helper.make_node("Gather", ["x", "index"], ["y"], axis=0)]
    session = shapeshift.InferenceSession(_model(nodes, [_input("x", ["n"])], [_output("y")]), backend="native")
    n = MIN_BYTES // 4 + 1000
    first = np.arange(1, n + 1, dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": first})[0], first)
    vm = session._executor.vm
    large = [(index, entry[0]) for index, entry in vm._late_buffers.items() if entry[0].nbytes >= MIN_BYTES]
    assert large
    views = [(index, buffer[:]) for index, buffer in large]
    before = [view.copy() for _, view in views]
    del large
    again = first[::-1].copy()
    np.testing.assert_array_equal(session.run(None, {"x": again})[0], again)
    for (index, view), was in zip(views, before):
        assert vm._late_buffers[index][0] is not view.base
        np.testing.assert_array_equal(view, was)


def test_late_buffers_are_reused_only_when_nothing_holds_them():
    # A late buffer is kept for the next run and its sizes remembered per late value: the
    # same input length with a different NonZero count must size it anew, an output the
    # caller still holds must keep its values through later runs, and a run whose outputs
    # were dropped must take the same buffer again instead of a new one.
    nodes = [_scalar("zero_f", 0.0), helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
             helper.make_node("NonZero", ["positive"], ["where"]),
             _scalar("zero_i", 0, I64), helper.make_node("Gather", ["where", "zero_i"], ["index"], axis=0),
             helper.make_node("Gather", ["x", "index"], ["picked"], axis=0),
             helper.make_node("Exp", ["picked"], ["y"])]
    model = _model(nodes, [_input("x", ["n"])], [_output("y")])
    session = shapeshift.InferenceSession(model, backend="native")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal(16).astype(np.float32)} for _ in range(6)]
    feeds += [{"x": np.abs(feeds[0]["x"])}, {"x": -np.abs(feeds[0]["x"])}, feeds[0]]  # 16, 0 and again
    held = [session.run(None, f)[0] for f in feeds]  # all held while the later runs go
    assert len({h.shape for h in held}) > 2  # the late count changed at one input length
    for got, f in zip(held, feeds):
        np.testing.assert_allclose(got, reference.run(None, f)[0], rtol=1e-6)
    vm = session._executor.vm
    del held, got
    session.run(None, feeds[1])
    first = {index: weakref.ref(entry[0]) for index, entry in vm._late_buffers.items()}  # not holding them
    assert first
    for _ in range(3):
        out = session.run(None, feeds[1])[0]
        np.testing.assert_allclose(out, reference.run(None, feeds[1])[0], rtol=1e-6)
        del out
        assert all(vm._late_buffers[index][0] is buffer() for index, buffer in first.items())
    # Anything that still views a late buffer (here a view taken by hand; in a run, a
    # fallback's result over it) keeps it from the next run: that run takes a new buffer
    # and the view's bytes stay as they were.
    index, entry = next(iter(vm._late_buffers.items()))
    view = entry[0][:]
    before = view.copy()
    del entry
    session.run(None, feeds[2])
    assert vm._late_buffers[index][0] is not view.base
    np.testing.assert_array_equal(view, before)
