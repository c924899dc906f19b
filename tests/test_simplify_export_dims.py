"""Golden tests of how simplify writes the dims of the graph inputs that its symbolic
parameters read (frontend/param_export.py).

A dim read only as a scalar (torchvision's ``Cast(Gather(Shape(images), 2))``
before a Div: SSDlite's anchor generator) is one Gather with a scalar index from
one ``Shape(input)`` shared by every dim of that input: no Reshape to a scalar,
and one Shape op per input.  Dims read only as ``[1]`` tensors stay
``Shape(x, start, end)`` slices, one node each, fewer nodes than a shared Shape
and a Gather per dim; so does a dim read both ways (its slice, reshaped for the
scalar).  Before opset 15 (no start/end) the Shape is always shared.  Every exported model computes what onnxruntime computes on the original
at three sizes of each dim.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift.passes.simplify import simplify_model

SIZES = ((3, 5, 7), (3, 8, 4), (3, 11, 13))


def _model(nodes, outputs, initializers, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, "h", "w"])],
                              outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _index(name: str, value, scalar: bool) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value if scalar else [value], np.int64), name)


def _scaled_dims(opset: int = 17) -> onnx.ModelProto:
    """Shape(x)[1] / 320 and Shape(x)[2] / 320 as floats, as torchvision writes them."""
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    outputs = []
    for axis, name in ((1, "h"), (2, "w")):
        nodes += [helper.make_node("Gather", ["s", f"i{axis}"], [f"{name}_int"], axis=0),
                  helper.make_node("Cast", [f"{name}_int"], [f"{name}_f"], to=TensorProto.FLOAT),
                  helper.make_node("Div", [f"{name}_f", "size"], [f"{name}_scale"])]
        outputs.append(helper.make_tensor_value_info(f"{name}_scale", TensorProto.FLOAT, []))
    initializers = [_index("i1", 1, True), _index("i2", 2, True),
                    numpy_helper.from_array(np.array(320, np.float32), "size")]
    return _model(nodes, outputs, initializers, opset)


def _filled(scalar_axis=None, opset: int = 17, vectors=("w", "h")) -> onnx.ModelProto:
    """ConstantOfShape of [w, h] (or of ``vectors``: dims read as [1] tensors), and optionally
    Shape(x)[scalar_axis] as a float (a scalar read)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i2"], ["w"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["h"], axis=0),
             helper.make_node("Concat", list(vectors), ["wh"], axis=0),
             helper.make_node("ConstantOfShape", ["wh"], ["filled"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32), "v"))]
    outputs = [helper.make_tensor_value_info("filled", TensorProto.FLOAT, list(vectors))]
    initializers = [_index("i1", 1, False), _index("i2", 2, False)]
    if scalar_axis is not None:
        nodes += [helper.make_node("Gather", ["s", "k"], ["d_int"], axis=0),
                  helper.make_node("Cast", ["d_int"], ["d_f"], to=TensorProto.FLOAT)]
        outputs.append(helper.make_tensor_value_info("d_f", TensorProto.FLOAT, []))
        initializers.append(_index("k", scalar_axis, True))
    return _model(nodes, outputs, initializers, opset)


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _shape_reads(model: onnx.ModelProto) -> list[tuple]:
    """(input, start, end) of each Shape op."""
    reads = []
    for node in model.graph.node:
        if node.op_type == "Shape":
            attrs = {a.name: a.i for a in node.attribute}
            reads.append((node.input[0], attrs.get("start"), attrs.get("end")))
    return sorted(reads, key=str)


def _same_outputs(original: onnx.ModelProto, simplified: onnx.ModelProto) -> None:
    want = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in SIZES:
        feed = {"x": np.random.default_rng(0).random(size, dtype=np.float32)}
        for a, b in zip(want.run(None, feed), got.run(None, feed)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(b, a)


def _simplified(model: onnx.ModelProto) -> onnx.ModelProto:
    out = simplify_model(model, check=True)[0]
    onnx.checker.check_model(out, full_check=True)
    _same_outputs(model, out)
    return out


@pytest.mark.parametrize("opset", [13, 17])
def test_dims_read_as_scalars_share_one_shape_and_need_no_reshape(opset):
    out = _simplified(_scaled_dims(opset))
    assert _shape_reads(out) == [("x", None, None)]
    assert _ops(out) == {"Shape": 1, "Gather": 2, "Cast": 2, "Div": 2}
    indices = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    gathers = [n for n in out.graph.node if n.op_type == "Gather"]
    assert sorted(int(indices[n.input[1]]) for n in gathers) == [1, 2]
    assert all(indices[n.input[1]].shape == () for n in gathers)


def test_dims_read_as_vectors_stay_one_shape_slice_each():
    out = _simplified(_filled())
    assert _shape_reads(out) == [("x", 1, 2), ("x", 2, 3)]
    assert _ops(out) == {"Shape": 2, "Concat": 1, "ConstantOfShape": 1}


def test_before_opset_15_vector_reads_share_one_shape():
    out = _simplified(_filled(opset=13))
    assert _shape_reads(out) == [("x", None, None)]
    assert _ops(out) == {"Shape": 1, "Gather": 2, "Concat": 1, "ConstantOfShape": 1}


def test_a_dim_read_only_as_a_scalar_makes_the_input_share_one_shape():
    # h as a scalar, w as a vector: Shape(x) + Gather 1 + Gather [2] (3 nodes) against a
    # slice each and a Reshape (3 nodes): as few nodes, one Shape op less.
    out = _simplified(_filled(scalar_axis=1, vectors=("w",)))
    assert _shape_reads(out) == [("x", None, None)]
    assert _ops(out) == {"Shape": 1, "Gather": 2, "ConstantOfShape": 1, "Cast": 1}


def test_a_dim_read_both_ways_keeps_its_slice_and_reshapes_it():
    # h read as a scalar and as a vector, w as a vector: two slices and a Reshape (3 nodes)
    # against Shape(x) and three Gathers (4).
    out = _simplified(_filled(scalar_axis=1))
    assert _shape_reads(out) == [("x", 1, 2), ("x", 2, 3)]
    assert _ops(out) == {"Shape": 2, "Reshape": 1, "Concat": 1, "ConstantOfShape": 1, "Cast": 1}
