"""Products by one shared constant weight stacked into one (passes/simplify/shared_weight.py).

The main model is an LSTM unrolled as the TorchScript exporter writes it: per step
``Gather(X, t)`` next to the step, ``Gemm(x_t, W_ih, b_ih, transB=1)`` +
``Gemm(h, W_hh, b_hh, transB=1)``, Add, Split into four gates, Sigmoid/Tanh, Mul, Add.
The input-side Gemms must become one Gemm over the stacked steps, the recurrent ones
must stay per step (each reads the previous step's product), and the outputs must equal
onnxruntime's on the original, through simplify (exported, golden op counts) and through
the native backend, at ragged batches. Negative cases: a chain of dependent products, a
different alpha, rows of unrelated symbolic sizes, the option off.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.passes.simplify import simplify_model

from .test_simplify_fusions import histogram, simplified

ort = pytest.importorskip("onnxruntime")
F32 = TensorProto.FLOAT
RNG = np.random.default_rng(32)


def _w(name, *shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, d) for n, d in inputs],
                              [helper.make_tensor_value_info(n, F32, None) for n in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def unrolled_lstm(steps=5, inputs=12, hidden=7, gather_per_step=True, opset=17):
    """TorchScript's unrolled LSTM cell over X [steps, batch, inputs]; outputs h and c of
    the last step and Y [batch, steps * hidden] (every step's h)."""
    inits = [_w("W_ih", 4 * hidden, inputs), _w("W_hh", 4 * hidden, hidden), _w("b_ih", 4 * hidden),
             _w("b_hh", 4 * hidden), _i64("gate_sizes", [hidden] * 4)]
    nodes = []
    if not gather_per_step:
        inits.append(_i64("ones", [1] * steps))
        nodes.append(helper.make_node("Split", ["X", "ones"], [f"xs{t}" for t in range(steps)], axis=0))
    h, c, hs = "h0", "c0", []
    for t in range(steps):
        if gather_per_step:
            inits.append(_i64(f"t{t}", t))  # a scalar index: Gather drops the axis
            nodes.append(helper.make_node("Gather", ["X", f"t{t}"], [f"x{t}"], axis=0))
        else:
            inits.append(_i64(f"ax{t}", [0]))
            nodes.append(helper.make_node("Squeeze", [f"xs{t}", f"ax{t}"], [f"x{t}"]))
        nodes += [
            helper.make_node("Gemm", [f"x{t}", "W_ih", "b_ih"], [f"gi{t}"], transB=1),
            helper.make_node("Gemm", [h, "W_hh", "b_hh"], [f"gh{t}"], transB=1),
            helper.make_node("Add", [f"gi{t}", f"gh{t}"], [f"g{t}"]),
            helper.make_node("Split", [f"g{t}", "gate_sizes"], [f"i{t}", f"f{t}", f"z{t}", f"o{t}"], axis=1),
            helper.make_node("Sigmoid", [f"i{t}"], [f"si{t}"]),
            helper.make_node("Sigmoid", [f"f{t}"], [f"sf{t}"]),
            helper.make_node("Tanh", [f"z{t}"], [f"tz{t}"]),
            helper.make_node("Sigmoid", [f"o{t}"], [f"so{t}"]),
            helper.make_node("Mul", [f"sf{t}", c], [f"fc{t}"]),
            helper.make_node("Mul", [f"si{t}", f"tz{t}"], [f"iz{t}"]),
            helper.make_node("Add", [f"fc{t}", f"iz{t}"], [f"c{t + 1}"]),
            helper.make_node("Tanh", [f"c{t + 1}"], [f"tc{t}"]),
            helper.make_node("Mul", [f"so{t}", f"tc{t}"], [f"h{t + 1}"]),
        ]
        h, c = f"h{t + 1}", f"c{t + 1}"
        hs.append(h)
    nodes.append(helper.make_node("Concat", hs, ["Y"], axis=1))
    nodes += [helper.make_node("Identity", [h], ["h_last"]), helper.make_node("Identity", [c], ["c_last"])]
    return _model(nodes, [("X", [steps, "batch", inputs]), ("h0", ["batch", hidden]), ("c0", ["batch", hidden])],
                  ["Y", "h_last", "c_last"], inits, opset)


def _gemm_inputs(model) -> collections.Counter:
    """For each Gemm, which weight it reads: {weight name: Gemm count}."""
    return collections.Counter(n.input[1] for n in model.graph.node if n.op_type == "Gemm")


@pytest.mark.parametrize("gather_per_step", [True, False])
def test_unrolled_lstm_input_gemms_merge_and_recurrent_ones_stay(gather_per_step):
    steps = 5
    model = unrolled_lstm(steps, gather_per_step=gather_per_step)
    result = simplified(model, shared_weights=True)
    assert _gemm_inputs(result) == {"W_ih": 1, "W_hh": steps}
    counts = histogram(result)
    assert counts["Concat"] == histogram(model)["Concat"] + 1
    assert counts["Split"] == histogram(model)["Split"] + 1
    # Without the option nothing changes (simplify's default).
    assert _gemm_inputs(simplified(model)) == {"W_ih": steps, "W_hh": steps}


def test_dependent_chain_falls_back():
    # h_{t+1} = tanh(Gemm(h_t, W)): every product reads the previous one's output.
    nodes = []
    h = "h0"
    for t in range(4):
        nodes += [helper.make_node("Gemm", [h, "W"], [f"p{t}"], transB=1),
                  helper.make_node("Tanh", [f"p{t}"], [f"h{t + 1}"])]
        h = f"h{t + 1}"
    model = _model(nodes + [helper.make_node("Identity", [h], ["y"])], [("h0", ["batch", 9])], ["y"], [_w("W", 9, 9)])
    assert _gemm_inputs(simplified(model, shared_weights=True)) == {"W": 4}


def test_only_the_independent_products_merge():
    # p0 = x0 W, p1 = x1 W, p2 = relu(p0) W (depends on p0), p3 = x2 W: p0, p1, p3 merge.
    nodes = [helper.make_node("MatMul", ["x0", "W"], ["p0"]), helper.make_node("MatMul", ["x1", "W"], ["p1"]),
             helper.make_node("Relu", ["p0"], ["r0"]), helper.make_node("MatMul", ["r0", "W"], ["p2"]),
             helper.make_node("Neg", ["x1"], ["x2"]), helper.make_node("MatMul", ["x2", "W"], ["p3"]),
             helper.make_node("Sum", ["p1", "p2", "p3"], ["y"])]
    model = _model(nodes, [("x0", ["n", 10]), ("x1", ["n", 10])], ["y"], [_w("W", 10, 10)])
    result = simplified(model, shared_weights=True)
    assert histogram(result)["MatMul"] == 2
    concat = next(n for n in result.graph.node if n.op_type == "Concat")
    assert len(concat.input) == 3


def test_static_rows_of_different_sizes_and_transposed_a():
    # Gemm with transA: A is [K, M], stacked along axis 1; rows 2, 3, 5 split back by size.
    nodes = [helper.make_node("Gemm", [f"x{i}", "W", "c"], [f"p{i}"], transA=1, alpha=0.5, beta=2.0)
             for i in range(3)]
    nodes.append(helper.make_node("Concat", ["p0", "p1", "p2"], ["y"], axis=0))
    model = _model(nodes, [("x0", [6, 2]), ("x1", [6, 3]), ("x2", [6, 5])], ["y"], [_w("W", 6, 11), _w("c", 11)])
    result = simplified(model, shared_weights=True)
    assert histogram(result)["Gemm"] == 1


def test_different_attributes_or_unrelated_symbolic_rows_do_not_merge():
    nodes = [helper.make_node("Gemm", ["x0", "W"], ["p0"], alpha=0.5), helper.make_node("Gemm", ["x1", "W"], ["p1"]),
             helper.make_node("MatMul", ["x2", "V"], ["p2"]), helper.make_node("MatMul", ["x3", "V"], ["p3"])]
    model = _model(nodes, [("x0", ["a", 4]), ("x1", ["a", 4]), ("x2", ["a", 4]), ("x3", ["b", 4])],
                   ["p0", "p1", "p2", "p3"], [_w("W", 4, 3), _w("V", 4, 3)])
    result = simplified(model, shared_weights=True)
    assert histogram(result)["Gemm"] == 2 and histogram(result)["MatMul"] == 2


def test_opset_18_even_split_of_symbolic_rows():
    nodes = [helper.make_node("MatMul", [f"x{i}", "W"], [f"p{i}"]) for i in range(3)]
    nodes.append(helper.make_node("Sum", ["p0", "p1", "p2"], ["y"]))
    model = _model(nodes, [(f"x{i}", ["n", 3, 8]) for i in range(3)], ["y"], [_w("W", 8, 5)], opset=18)
    result = simplified(model, shared_weights=True)
    assert histogram(result)["MatMul"] == 1
    split = next(n for n in result.graph.node if n.op_type == "Split")
    assert any(a.name == "num_outputs" and a.i == 3 for a in split.attribute)


@pytest.mark.parametrize("gather_per_step", [True, False])
def test_native_backend_runs_the_merged_lstm(monkeypatch, gather_per_step):
    steps, inputs, hidden = 6, 20, 9
    model = unrolled_lstm(steps, inputs, hidden, gather_per_step=gather_per_step)
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops()
    gemms = [s for s in program.steps if s.node.op_type == "Gemm"]
    assert len(gemms) == steps + 1, "the input-side Gemms run as one"
    merged = [s for s in gemms if s.node.inputs[1].name == "W_ih"]
    assert len(merged) == 1
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 7):
        feed = {"X": RNG.standard_normal((steps, batch, inputs)).astype(np.float32),
                "h0": RNG.standard_normal((batch, hidden)).astype(np.float32),
                "c0": RNG.standard_normal((batch, hidden)).astype(np.float32)}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_simplify_model_keeps_it_off_by_default():
    model = unrolled_lstm(3)
    result, _, _ = simplify_model(model)
    assert _gemm_inputs(result) == {"W_ih": 3, "W_hh": 3}
    onnx.checker.check_model(result)


def test_returned_products_and_gemm_c_per_row():
    # Products returned as graph outputs still merge (their names kept); a Gemm C with a row
    # per output row ([M, N]) would need stacking too, so those stay; a C of [1, N] merges.
    nodes = [helper.make_node("MatMul", ["x0", "W"], ["p0"]), helper.make_node("MatMul", ["x1", "W"], ["p1"]),
             helper.make_node("Relu", ["p1"], ["r1"])]
    model = _model(nodes, [("x0", ["n", 10]), ("x1", ["n", 10])], ["p0", "p1", "r1"], [_w("W", 10, 6)])
    result = simplified(model, shared_weights=True)
    assert histogram(result)["MatMul"] == 1 and [o.name for o in result.graph.output] == ["p0", "p1", "r1"]
    gemms = [helper.make_node("Gemm", ["x0", "W", "C"], ["p0"]), helper.make_node("Gemm", ["x1", "W", "C"], ["p1"])]
    inputs = [("x0", [3, 10]), ("x1", [3, 10])]
    per_row = _model(gemms, inputs, ["p0", "p1"], [_w("W", 10, 6), _w("C", 3, 6)])
    assert histogram(simplified(per_row, shared_weights=True))["Gemm"] == 2
    one_row = _model(gemms, inputs, ["p0", "p1"], [_w("W", 10, 6), _w("C", 1, 6)])
    assert histogram(simplified(one_row, shared_weights=True))["Gemm"] == 1
