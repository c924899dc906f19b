"""Split outputs placed inside their input and Concat inputs inside their output
(codegen/placement.py): where the extent before the axis is 1 at run time, the producers
write each part where it belongs and the copies are skipped; elsewhere every part has its
own buffer and is copied. Both against onnxruntime, on odd channel counts and planes (so
that parts start at unaligned offsets), over batch 1 and 2 of one build."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen.placement import resolve

from . import test_native_ops_extra
from .test_native_backend import _input, _model, _output

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler
ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(7)


def _weight(name, shape):
    return numpy_helper.from_array(RNG.uniform(-0.5, 0.5, shape).astype(np.float32), name)


def c2f_model(batch="n"):
    """A C2f block and an SPPF block as yolov8 has them, with odd channel counts: t = Conv(x)
    split into a (3) and b (7); c = Conv(b); d = Relu(c); cat = [a, b, c, d]; y = Conv(cat);
    then [y, MaxPool(y), MaxPool(MaxPool(y))] into a last Conv."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["t"]),
        helper.make_node("Split", ["t", "split"], ["a", "b"], axis=1),
        helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Concat", ["a", "b", "c", "d"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w3"], ["y"]),
        helper.make_node("MaxPool", ["y"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["y", "p1", "p2"], ["sppf"], axis=-3),
        helper.make_node("Conv", ["sppf", "w4"], ["out"]),
    ]
    inits = [_weight("w1", (10, 6, 1, 1)), numpy_helper.from_array(np.array([3, 7], np.int64), "split"),
             _weight("w2", (5, 7, 3, 3)), _weight("w3", (5, 20, 1, 1)), _weight("w4", (4, 15, 1, 1))]
    return _model(nodes, [_input("x", [batch, 6, "h", "w"])], [_output("out")], inits)


def _edge_model():
    """Parts that must not move: a graph input, a constant, an input concatenated twice, a
    Split's parts concatenated out of order, a part that is a graph output, a Concat that is
    a graph output; and a Concat of a Concat, whose inner output moves into the outer one,
    and one on axis 0, where nothing comes before the axis whatever the batch."""
    nodes = [
        helper.make_node("Neg", ["x"], ["u"]),
        helper.make_node("Exp", ["x"], ["v"]),
        helper.make_node("Concat", ["u", "x", "u"], ["c1"], axis=1),
        helper.make_node("Split", ["v"], ["s0", "s1", "s2"], axis=1, num_outputs=3),
        helper.make_node("Concat", ["s1", "s0", "s2"], ["c2"], axis=1),
        helper.make_node("Concat", ["u", "v"], ["inner"], axis=1),
        helper.make_node("Sigmoid", ["x"], ["w"]),
        helper.make_node("Concat", ["inner", "w"], ["outer"], axis=1),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Relu", ["outer"], ["r2"]),
        helper.make_node("Abs", ["x"], ["q"]),
        helper.make_node("Concat", ["k", "q"], ["kq"], axis=0),
        helper.make_node("Relu", ["kq"], ["r3"]),
    ]
    inits = [numpy_helper.from_array(RNG.uniform(-1, 1, (1, 3, 5)).astype(np.float32), "k")]
    return _model(nodes, [_input("x", ["n", 3, 5])],
                  [_output("r1"), _output("r2"), _output("r3"), _output("s2"), _output("c2")], inits, opset=18)


def _check(model, shapes):
    session = shapeshift.InferenceSession(model, backend="native")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in shapes:
        feed = {"x": RNG.uniform(-1, 1, shape).astype(np.float32)}
        for _ in range(2):  # the second run on the plan the first made
            got = session.run(None, feed)
            for g, want in zip(got, reference.run(None, feed), strict=True):
                np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    return session


def _placed(session, binding):
    program = session._executor.program
    return {program.slots[index].value.name: host for index, (host, _) in resolve(program.slots, binding).items()}


def test_c2f_and_sppf_parts_are_placed_at_batch_1_and_copied_at_batch_2():
    session = _check(c2f_model(), [(1, 6, 5, 7), (2, 6, 5, 7), (1, 6, 9, 4), (3, 6, 1, 1), (1, 6, 1, 1)])
    program = session._executor.program
    slot = {s.value.name: s for s in program.slots if s.value is not None}
    placed = _placed(session, {"n": 1, "h": 5, "w": 7})
    # a and b inside t, t inside cat with c and d; y, p1 and p2 inside sppf.
    assert placed == {"a": slot["cat"].index, "b": slot["cat"].index, "t": slot["cat"].index,
                      "c": slot["cat"].index, "d": slot["cat"].index, "y": slot["sppf"].index,
                      "p1": slot["sppf"].index, "p2": slot["sppf"].index}, placed
    assert _placed(session, {"n": 2, "h": 5, "w": 7}) == {}
    plan = session._executor.vm._plan({"n": 1, "h": 5, "w": 7})
    offsets = plan.offsets
    # Unaligned where the channels are odd: b starts 3 planes of 5x7 floats into t.
    assert offsets[slot["b"].index] - offsets[slot["t"].index] == 3 * 35 * 4
    assert offsets[slot["c"].index] - offsets[slot["cat"].index] == 10 * 35 * 4


def test_a_static_batch_1_model_places_its_parts():
    session = _check(c2f_model(batch=1), [(1, 6, 5, 7), (1, 6, 2, 3)])
    assert len(_placed(session, {"h": 2, "w": 3})) == 8


def test_parts_that_cannot_move_are_copied():
    session = _check(_edge_model(), [(1, 3, 5), (2, 3, 5)])
    placed = _placed(session, {"n": 1})
    # The first u moves into c1 (the second is copied from there), x is copied. s0 and
    # s1 live inside v, which does not move into c2 (its parts are out of order there), s2
    # and c2 are graph outputs. u being inside c1 already, inner copies it and takes v; inner
    # and w move into outer, so s0, s1 and v end there too. The constant k is copied into kq,
    # and q moves there at any batch.
    slot = {s.value.name: s.index for s in session._executor.program.slots if s.value is not None}
    outer = slot["outer"]
    assert placed == {"u": slot["c1"], "s0": outer, "s1": outer, "v": outer, "inner": outer, "w": outer,
                      "q": slot["kq"]}, placed
    assert _placed(session, {"n": 2}) == {"q": slot["kq"]}


def _many_parts_model():
    """A Split into five parts and Concats of six and four, which copy their parts in one loop
    (lower/layout.py ``LOOPED_PARTS``): sizes 1 to 5 along the last axis (unaligned offsets),
    a part concatenated twice, a graph input, parts out of order, and a Concat whose parts
    its producers can write in place at batch 1."""
    nodes = [
        helper.make_node("Exp", ["x"], ["v"]),
        helper.make_node("Split", ["v", "sizes"], ["s0", "s1", "s2", "s3", "s4"], axis=2),
        helper.make_node("Concat", ["s4", "x", "s0", "s2", "s0", "s1"], ["c6"], axis=-1),
        helper.make_node("Neg", ["x"], ["a"]),
        helper.make_node("Abs", ["x"], ["b"]),
        helper.make_node("Relu", ["x"], ["c"]),
        helper.make_node("Sigmoid", ["x"], ["d"]),
        helper.make_node("Concat", ["a", "b", "c", "d"], ["c4"], axis=1),
        helper.make_node("Relu", ["c4"], ["r4"]),
    ]
    inits = [numpy_helper.from_array(np.array([1, 2, 3, 4, 5], np.int64), "sizes")]
    return _model(nodes, [_input("x", ["n", 3, 15])], [_output("c6"), _output("s3"), _output("r4")], inits)


def test_many_parts_are_copied_in_a_loop():
    session = _check(_many_parts_model(), [(1, 3, 15), (2, 3, 15), (5, 3, 15)])
    source = session._executor.program.full_source()
    for count in (4, 5, 6):
        assert f"for (int k = 0; k < {count}; k++)" in source, count
    # Loops that only call the copy kernel: glue, built at -O0 in a split program.
    from shapeshift.codegen import emit
    steps = [s for s in session._executor.program.steps if s.node.op_type in ("Concat", "Split")]
    assert len(steps) == 3 and all(emit.block_kind(s.lowered.code, s.node.outputs, s.lowered.glue) == emit.GLUE
                                   for s in steps)
    # At batch 1, a, b, c and d are written into c4 where they belong: their copies are skipped.
    slot = {s.value.name: s.index for s in session._executor.program.slots if s.value is not None}
    placed = _placed(session, {"n": 1})
    assert {name: placed.get(name) for name in "abcd"} == dict.fromkeys("abcd", slot["c4"]), placed
