"""Golden before/after tests of the graph fusions (passes/simplify/fusions.py).

Each model is built with onnx.helper (random weights, symbolic dims), simplified,
checked by op histogram (subgraphs included), and run with onnxruntime against the
original at three ragged values of each dynamic dim.  Negative cases pin down the
fusions that must not happen: a weight or an intermediate read elsewhere, a Pad of
a nonzero value, a MatMul of a 3-D input into Gemm...
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift.cli.main import main
from shapeshift.passes.simplify import SimplifyOptions, simplify_graph, simplify_model
from shapeshift.frontend.onnx_import import import_model

F32 = TensorProto.FLOAT
#: Ragged values of every dynamic dim: one run per value, all dims at once.
SIZES = (1, 7, 33)
RNG = np.random.default_rng(31)


# -- building -------------------------------------------------------------------------


def _weight(name: str, *shape: int, low: Optional[float] = None) -> onnx.TensorProto:
    array = RNG.standard_normal(shape).astype(np.float32) if low is None else \
        RNG.uniform(low, 1.5, shape).astype(np.float32)
    return numpy_helper.from_array(array, name)


def _int64(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """Inputs: (name, dims) with symbolic dims as strings; outputs: names (types inferred)."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, dims) for n, dims in inputs],
                              [helper.make_tensor_value_info(n, F32, None) for n in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _batch_norm(name: str, x: str, out: str, channels: int, **attrs) -> tuple[onnx.NodeProto, list]:
    params = [_weight(f"{name}_scale", channels), _weight(f"{name}_bias", channels),
              _weight(f"{name}_mean", channels), _weight(f"{name}_var", channels, low=0.5)]
    node = helper.make_node("BatchNormalization", [x] + [p.name for p in params], [out], epsilon=1e-3, **attrs)
    return node, params


# -- running and checking ----------------------------------------------------------------


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def histogram(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in _all_nodes(model.graph))


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # The reference must not run ORT's own fusions: they would hide a wrong rewrite of ours.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feed(model: onnx.ModelProto, size: int) -> dict:
    feed = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else size for d in vi.type.tensor_type.shape.dim]
        feed[vi.name] = RNG.standard_normal(dims).astype(np.float32)
    return feed


def simplified(model: onnx.ModelProto, sizes: Sequence[int] = SIZES, **options) -> onnx.ModelProto:
    """Simplify (verifier on), then check the outputs against onnxruntime on the original
    at each of ``sizes`` (every dynamic dim takes the size)."""
    result, _, _ = simplify_model(model, check=True, **options)
    onnx.checker.check_model(result, full_check=True)
    assert [o.name for o in result.graph.output] == [o.name for o in model.graph.output]
    reference, candidate = _session(model), _session(result)
    for size in sizes:
        feed = _feed(model, size)
        for want, got in zip(reference.run(None, feed), candidate.run(None, feed)):
            assert want.shape == got.shape, (size, want.shape, got.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max(initial=0))))
    return result


# -- BatchNormalization ---------------------------------------------------------------------


@pytest.mark.parametrize("bias,group", [(True, 1), (False, 1), (True, 2)])
def test_batch_norm_folds_into_conv(bias, group):
    conv_inputs = ["x", "w"] + (["b"] if bias else [])
    inits = [_weight("w", 8, 4 // group, 3, 3)] + ([_weight("b", 8)] if bias else [])
    bn, params = _batch_norm("bn", "c", "y", 8)
    model = _model([helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], group=group), bn,
                    helper.make_node("Relu", ["y"], ["z"])],
                   [("x", ["batch", 4, "h", "w"])], ["z"], inits + params)
    assert histogram(simplified(model)) == {"Conv": 1, "Relu": 1}


def test_batch_norm_folds_into_conv_1d_and_the_old_opset():
    bn, params = _batch_norm("bn", "c", "y", 6, spatial=1)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3]), bn],
                   [("x", ["batch", 3, "t"])], ["y"], [_weight("w", 6, 3, 3)] + params, opset=7)
    assert histogram(simplified(model, sizes=(3, 7, 33))) == {"Conv": 1}


@pytest.mark.parametrize("group", [1, 2])
def test_batch_norm_folds_into_conv_transpose(group):
    bn, params = _batch_norm("bn", "c", "y", 6)
    model = _model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2], group=group), bn],
                   [("x", ["batch", 4, "h", "w"])], ["y"],
                   [_weight("w", 4, 6 // group, 3, 3), _weight("b", 6)] + params)
    assert histogram(simplified(model)) == {"ConvTranspose": 1}


def test_batch_norm_after_matmul_of_a_2d_input_becomes_one_gemm():
    bn, params = _batch_norm("bn", "m", "y", 12)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), bn], [("x", ["batch", 16])], ["y"],
                   [_weight("w", 16, 12)] + params)
    assert histogram(simplified(model)) == {"Gemm": 1}


@pytest.mark.parametrize("trans_b,c_shape", [(1, (12,)), (0, (1, 12)), (1, None)])
def test_batch_norm_folds_into_gemm(trans_b, c_shape):
    inits = [_weight("w", *((12, 16) if trans_b else (16, 12)))] + ([_weight("c", *c_shape)] if c_shape else [])
    bn, params = _batch_norm("bn", "g", "y", 12)
    gemm = helper.make_node("Gemm", ["x", "w"] + (["c"] if c_shape else []), ["g"], transB=trans_b, alpha=0.5,
                            beta=2.0)
    model = _model([gemm, bn], [("x", ["batch", 16])], ["y"], inits + params)
    assert histogram(simplified(model)) == {"Gemm": 1}


def test_batch_norm_stays_when_the_conv_output_has_another_reader():
    bn, params = _batch_norm("bn", "c", "y", 8)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"]), bn, helper.make_node("Add", ["y", "c"], ["z"])],
                   [("x", ["batch", 4, "h", "w"])], ["z"], [_weight("w", 8, 4, 1, 1)] + params)
    assert histogram(simplified(model)) == {"Conv": 1, "BatchNormalization": 1, "Add": 1}


def test_batch_norm_with_two_readers_folds_once():
    """Two readers of the BN output are fine: the Conv feeds the BN alone."""
    bn, params = _batch_norm("bn", "c", "y", 8)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"]), bn, helper.make_node("Relu", ["y"], ["r"]),
                    helper.make_node("Sigmoid", ["y"], ["s"])],
                   [("x", ["batch", 4, "h", "w"])], ["r", "s"], [_weight("w", 8, 4, 1, 1)] + params)
    assert histogram(simplified(model)) == {"Conv": 1, "Relu": 1, "Sigmoid": 1}


def test_batch_norm_after_a_3d_matmul_stays():
    """BN's channel axis is 1; a MatMul of [b, c, k] makes columns on axis 2."""
    bn, params = _batch_norm("bn", "m", "y", 5)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), bn], [("x", ["batch", 5, 16])], ["y"],
                   [_weight("w", 16, 12)] + params)
    assert histogram(simplified(model)) == {"MatMul": 1, "BatchNormalization": 1}


# -- MatMuls of one input ------------------------------------------------------------------------


def _projections(widths=(16, 16, 8), biased=(True, True, True), opset=17, shared_weight=False):
    """x [batch, seq, 16] projected by one MatMul (+ bias Add) per width; the results are the outputs."""
    nodes, inits, outputs = [], [], []
    for i, (width, bias) in enumerate(zip(widths, biased)):
        inits.append(_weight(f"w{i}", 16, width))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]))
        out = f"m{i}"
        if bias:
            inits.append(_weight(f"b{i}", width))
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"] if i % 2 else [f"b{i}", f"m{i}"], [f"p{i}"]))
            out = f"p{i}"
        nodes.append(helper.make_node("Tanh", [out], [f"y{i}"]))
        outputs.append(f"y{i}")
    if shared_weight:  # w0 also read elsewhere
        nodes.append(helper.make_node("MatMul", ["z", "w0"], ["shared"]))
        outputs.append("shared")
    inputs = [("x", ["batch", "seq", 16])] + ([("z", ["batch", 16])] if shared_weight else [])
    return _model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 17])
def test_matmuls_of_one_input_merge_with_their_biases(opset):
    result = simplified(_projections(opset=opset))
    assert histogram(result) == {"MatMul": 1, "Add": 1, "Split": 1, "Tanh": 3}


def test_a_matmul_without_bias_merges_with_zeros():
    result = simplified(_projections(biased=(True, False, True)))
    assert histogram(result) == {"MatMul": 1, "Add": 1, "Split": 1, "Tanh": 3}


def test_matmuls_of_a_2d_input_merge_into_one_gemm():
    nodes, inits = [], []
    for i in range(3):
        inits += [_weight(f"w{i}", 16, 8), _weight(f"b{i}", 8)]
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
    model = _model(nodes, [("x", ["batch", 16])], ["y0", "y1", "y2"], inits)
    assert histogram(simplified(model)) == {"Gemm": 1, "Split": 1}


def test_merge_matmuls_can_be_turned_off():
    result = simplified(_projections(), merge_matmuls=False)
    assert histogram(result) == {"MatMul": 3, "Add": 3, "Tanh": 3}


def test_a_shared_weight_keeps_its_matmul_apart():
    result = simplified(_projections(shared_weight=True))
    # w1 and w2 merge; w0, also read by the MatMul of z, stays with its own MatMul.
    assert histogram(result) == {"MatMul": 3, "Add": 2, "Split": 1, "Tanh": 3}


def test_two_matmuls_with_one_weight_shared_do_not_merge():
    result = simplified(_projections(widths=(16, 8), biased=(True, True), shared_weight=True))
    assert histogram(result) == {"MatMul": 3, "Add": 2, "Tanh": 2}


def test_two_matmuls_without_biases_stay_apart():
    """MatMul + Split would be as many nodes, and a copy more."""
    model = _model([helper.make_node("MatMul", ["x", "w0"], ["y0"]), helper.make_node("MatMul", ["x", "w1"], ["y1"])],
                   [("x", ["batch", 16])], ["y0", "y1"], [_weight("w0", 16, 4), _weight("w1", 16, 8)])
    assert histogram(simplified(model)) == {"MatMul": 2}


def test_a_batched_weight_does_not_merge():
    model = _model([helper.make_node("MatMul", ["x", "w0"], ["y0"]), helper.make_node("MatMul", ["x", "w1"], ["y1"])],
                   [("x", ["batch", 16, 16])], ["y0", "y1"], [_weight("w0", 16, 4), _weight("w1", 1, 16, 4)])
    assert histogram(simplified(model)) == {"MatMul": 2}


# -- MatMul + Add into Gemm ---------------------------------------------------------------------------


@pytest.mark.parametrize("bias_shape,bias_first", [((12,), False), ((1, 12), True), ((), False)])
def test_matmul_add_of_a_2d_input_becomes_gemm(bias_shape, bias_first):
    bias = numpy_helper.from_array(RNG.standard_normal(bias_shape).astype(np.float32), "b")
    add = helper.make_node("Add", ["b", "m"] if bias_first else ["m", "b"], ["y"])
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), add], [("x", ["batch", 16])], ["y"],
                   [_weight("w", 16, 12), bias])
    assert histogram(simplified(model)) == {"Gemm": 1}


def test_matmul_add_of_a_3d_input_stays():
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                   [("x", ["batch", "seq", 16])], ["y"], [_weight("w", 16, 12), _weight("b", 12)])
    assert histogram(simplified(model)) == {"MatMul": 1, "Add": 1}


def test_matmul_add_that_broadcasts_the_output_stays():
    """A bias of [2, 1, 12] would make the [b, 12] product 3-D: Gemm cannot."""
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                   [("x", ["batch", 16])], ["y"], [_weight("w", 16, 12), _weight("b", 2, 1, 12)])
    assert histogram(simplified(model)) == {"MatMul": 1, "Add": 1}


def test_matmul_read_twice_stays_beside_its_add():
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"]),
                    helper.make_node("Relu", ["m"], ["r"])],
                   [("x", ["batch", 16])], ["y", "r"], [_weight("w", 16, 12), _weight("b", 12)])
    assert histogram(simplified(model)) == {"MatMul": 1, "Add": 1, "Relu": 1}


# -- Pad into Conv / AveragePool -----------------------------------------------------------------


def _pad_model(consumer: onnx.NodeProto, pads=(0, 0, 1, 2, 0, 0, 2, 1), value=None, mode="constant",
               opset=17, axes=None, extra=()):
    inputs = ["x", "pads"] + ([""] if value is None and axes else []) + (["value"] if value is not None else []) \
        + (["axes"] if axes else [])
    inits = [_int64("pads", pads), _weight("w", 4, 3, 3, 3)]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
    if axes:
        inits.append(_int64("axes", axes))
    nodes = [helper.make_node("Pad", inputs, ["p"], mode=mode), consumer, *extra]
    return _model(nodes, [("x", ["batch", 3, "h", "w"])], [consumer.output[0]], inits, opset=opset)


def test_zero_pad_folds_into_conv_pads():
    conv = helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 1])
    result = simplified(_pad_model(conv))
    assert histogram(result) == {"Conv": 1}
    [node] = result.graph.node
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "pads")) == [2, 2, 2, 2]


def test_zero_pad_with_axes_folds_into_conv():
    conv = helper.make_node("Conv", ["p", "w"], ["y"])
    assert histogram(simplified(_pad_model(conv, pads=(1, 2, 3, 0), axes=[2, -1], opset=18))) == {"Conv": 1}


def test_zero_pad_folds_into_conv_of_the_old_opset():
    model = _model([helper.make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1]),
                    helper.make_node("Conv", ["p", "w"], ["y"])],
                   [("x", ["batch", 3, "h", "w"])], ["y"], [_weight("w", 4, 3, 3, 3)], opset=9)
    assert histogram(simplified(model)) == {"Conv": 1}


@pytest.mark.parametrize("count_include_pad,own_pads", [(1, [1, 1, 0, 0]), (0, [0, 0, 0, 0])])
def test_zero_pad_folds_into_an_average_pool_that_counts_padding(count_include_pad, own_pads):
    pool = helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], pads=own_pads,
                            count_include_pad=count_include_pad)
    assert histogram(simplified(_pad_model(pool, pads=(0, 0, 1, 0, 0, 0, 0, 1)))) == {"AveragePool": 1}


@pytest.mark.parametrize("case", ["nonzero value", "reflect", "max pool", "pool not counting its pads",
                                  "pool pads past its window", "channel pad", "pad read twice"])
def test_pad_that_must_stay(case):
    conv = helper.make_node("Conv", ["p", "w"], ["y"])
    if case == "nonzero value":
        model = _pad_model(conv, value=0.5)
    elif case == "reflect":
        model = _pad_model(conv, mode="reflect")
    elif case == "max pool":
        model = _pad_model(helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3]))
    elif case == "pool not counting its pads":
        model = _pad_model(helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    elif case == "pool pads past its window":  # onnxruntime refuses a pad as wide as the window
        model = _pad_model(helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2, 2], count_include_pad=1))
    elif case == "channel pad":
        model = _pad_model(helper.make_node("Conv", ["p", "w5"], ["y"]), pads=(0, 1, 1, 1, 0, 1, 1, 1))
        model.graph.initializer.append(_weight("w5", 4, 5, 3, 3))
    else:
        model = _pad_model(helper.make_node("Conv", ["p", "w"], ["c"]),
                           extra=[helper.make_node("ReduceSum", ["p"], ["s"]),
                                  helper.make_node("Add", ["c", "s"], ["y"])])
        model.graph.output[0].name = "y"
    before = histogram(model)
    assert histogram(simplified(model, sizes=(3, 7, 33))) == before


# -- chains of arithmetic by constants ---------------------------------------------------------------


@pytest.mark.parametrize("ops,expected", [
    (["Mul", "Mul", "Mul"], "Mul"), (["Add", "Sub", "Add"], "Add"), (["Sub", "Sub"], "Sub"),
    (["Div", "Div"], "Div"), (["Mul", "Div"], "Mul"), (["Div", "Mul"], "Mul"),
])
def test_constant_chains_merge(ops, expected):
    nodes, inits, current = [], [], "x"
    shapes = [(), (16,), (1, 1, 16)]
    for i, op in enumerate(ops):
        inits.append(_weight(f"c{i}", *shapes[i % len(shapes)], low=0.5))
        operands = [current, f"c{i}"] if op in ("Sub", "Div") or i % 2 == 0 else [f"c{i}", current]
        nodes.append(helper.make_node(op, operands, [f"t{i}"]))
        current = f"t{i}"
    model = _model(nodes, [("x", ["batch", "seq", 16])], [current], inits)
    assert histogram(simplified(model)) == {expected: 1}


def test_constant_chain_with_a_shared_intermediate_stays():
    model = _model([helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Mul", ["t", "b"], ["y"]),
                    helper.make_node("Relu", ["t"], ["r"])],
                   [("x", ["batch", 16])], ["y", "r"], [_weight("a", 16), _weight("b", 16)])
    assert histogram(simplified(model)) == {"Mul": 2, "Relu": 1}


def test_constant_chain_across_families_and_by_a_constant_on_the_left_of_sub_stays():
    model = _model([helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
                    helper.make_node("Sub", ["c", "u"], ["v"]), helper.make_node("Sub", ["v", "d"], ["y"])],
                   [("x", ["batch", 16])], ["y"], [_weight("a", 16), _weight("b", 16), _weight("c", 16),
                                                   _weight("d", 16)])
    assert histogram(simplified(model)) == {"Mul": 1, "Add": 1, "Sub": 2}


# -- ops that leave their input as it is --------------------------------------------------------


def test_adding_zeros_and_multiplying_by_ones_go():
    inits = [numpy_helper.from_array(np.zeros(16, np.float32), "zeros"),
             numpy_helper.from_array(np.ones((1, 16), np.float32), "ones"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1], np.float32), "one")]
    model = _model([helper.make_node("Add", ["zeros", "x"], ["a"]), helper.make_node("Mul", ["a", "ones"], ["m"]),
                    helper.make_node("Sub", ["m", "zero"], ["s"]), helper.make_node("Div", ["s", "one"], ["d"]),
                    helper.make_node("Relu", ["d"], ["y"])], [("x", ["batch", 16])], ["y"], inits)
    assert histogram(simplified(model)) == {"Relu": 1}


def test_zeros_that_broadcast_the_input_stay():
    model = _model([helper.make_node("Add", ["x", "zeros"], ["y"])], [("x", ["batch", 16])], ["y"],
                   [numpy_helper.from_array(np.zeros((2, 1, 16), np.float32), "zeros")])
    assert histogram(simplified(model)) == {"Add": 1}


@pytest.mark.parametrize("indices,stays", [(list(range(5)), False), ([4, 3, 2, 1, 0], True), ([0, 1, 2, 3], True)])
def test_gather_of_a_whole_axis_in_order_goes(indices, stays):
    model = _model([helper.make_node("Gather", ["x", "idx"], ["g"], axis=1), helper.make_node("Relu", ["g"], ["y"])],
                   [("x", ["batch", 5, 8])], ["y"], [_int64("idx", indices)])
    assert histogram(simplified(model)) == ({"Gather": 1, "Relu": 1} if stays else {"Relu": 1})


# -- Squeeze / Unsqueeze chains --------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 17])
def test_unsqueeze_of_unsqueeze_and_squeeze_of_squeeze_merge(opset):
    def axes_node(op, x, out, axes):
        if opset >= 13:
            return [helper.make_node(op, [x, f"{out}_axes"], [out])], [_int64(f"{out}_axes", axes)]
        return [helper.make_node(op, [x], [out], axes=axes)], []

    nodes, inits = [], []
    for op, x, out, axes in [("Unsqueeze", "x", "u1", [0, -1]), ("Unsqueeze", "u1", "u2", [2]),
                             ("Relu", "u2", "r", None),
                             ("Squeeze", "r", "s1", [0]), ("Squeeze", "s1", "s2", [-1, 1])]:
        if axes is None:
            nodes.append(helper.make_node(op, [x], [out]))
            continue
        n, i = axes_node(op, x, out, axes)
        nodes += n
        inits += i
    model = _model(nodes, [("x", ["batch", 16])], ["u2", "s2"], inits, opset=opset)
    assert histogram(simplified(model)) == {"Unsqueeze": 1, "Relu": 1, "Squeeze": 1}


# -- Identity and Dropout in subgraphs -------------------------------------------------------------


def test_identity_and_dropout_go_inside_if_and_loop_bodies():
    """The engine walks every body: Identity and inference Dropout go there too. One
    Identity is written back on export: the Loop body returns its own input ``cond``,
    which ONNX wants computed by a node (outputs.materialize_subgraph_outputs)."""
    def branch(name, op):
        nodes = [helper.make_node("Identity", ["x"], [f"{name}_i"]),
                 helper.make_node("Dropout", [f"{name}_i"], [f"{name}_d"]),
                 helper.make_node(op, [f"{name}_d"], [f"{name}_out"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", F32, None)])

    body = helper.make_graph(
        [helper.make_node("Identity", ["acc"], ["acc_i"]), helper.make_node("Dropout", ["acc_i"], ["acc_d"]),
         helper.make_node("Add", ["acc_d", "x"], ["acc_out"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F32, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["branched"], then_branch=branch("then", "Relu"),
                              else_branch=branch("else", "Neg")),
             helper.make_node("Loop", ["trips", "", "branched"], ["looped"], body=body)]
    model = _model(nodes, [("x", ["batch", 16])], ["looped"],
                   [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                    numpy_helper.from_array(np.array(3, np.int64), "trips")])
    result = simplified(model)
    ops = histogram(result)
    assert ops["Dropout"] == 0 and ops["Identity"] == 1, ops
    assert ops["If"] == 1 and ops["Loop"] == 1 and ops["Relu"] == 1 and ops["Neg"] == 1 and ops["Add"] == 1


# -- options and strategies -------------------------------------------------------------------------


def _conv_bn_net() -> onnx.ModelProto:
    nodes, inits, current = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 8), (8, 8)]):
        inits.append(_weight(f"w{i}", cout, cin, 3, 3))
        nodes.append(helper.make_node("Conv", [current, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        bn, params = _batch_norm(f"bn{i}", f"c{i}", f"n{i}", cout)
        nodes += [bn, helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
        inits += params
        current = f"r{i}"
    return _model(nodes, [("x", ["batch", 3, "h", "w"])], [current], inits)


@pytest.mark.parametrize("strategy", ["fixpoint", "per-op"])
def test_strategies_reach_the_same_fusions(strategy):
    for model in (_conv_bn_net(), _projections()):
        assert histogram(simplified(model, strategy=strategy, sizes=(7,))) == histogram(simplified(model, sizes=(7,)))


def test_simplify_graph_fuses_only_when_asked():
    """The compiler's own callers (native lowering, tuning) keep the graph unless they opt in."""
    graph = import_model(_conv_bn_net())
    simplify_graph(graph)
    assert sum(n.op_type == "BatchNormalization" for n in graph.walk_nodes()) == 2
    graph = import_model(_conv_bn_net())
    simplify_graph(graph, SimplifyOptions(fusions=True))
    assert sum(n.op_type == "BatchNormalization" for n in graph.walk_nodes()) == 0


def test_cli_no_merge_matmuls(tmp_path, capsys):
    source = tmp_path / "proj.onnx"
    onnx.save(_projections(), str(source))
    assert main(["simplify", str(source), str(tmp_path / "merged.onnx")]) == 0
    assert main(["simplify", str(source), str(tmp_path / "apart.onnx"), "--no-merge-matmuls"]) == 0
    assert histogram(onnx.load(str(tmp_path / "merged.onnx")))["MatMul"] == 1
    assert histogram(onnx.load(str(tmp_path / "apart.onnx")))["MatMul"] == 3
