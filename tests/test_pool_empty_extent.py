"""Pooling over an empty spatial extent: onnxruntime refuses it at run time ("Only N can be
zero"); both backends refuse it too, naming the node and dim, where they used to answer NaN
(reference) and 0 or -inf (native) for the same input. Non-empty inputs of the same session
still run, and agree with onnxruntime. A pool reading an extent computed as 0 (a MaxPool of
stride 2 over one row) is refused the same way."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import ExecutionError

POOLS = {
    "GlobalAveragePool": {}, "GlobalMaxPool": {}, "GlobalLpPool": {},
    "MaxPool": {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
    "AveragePool": {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
    "LpPool": {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]},
}


def _model(op: str):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="pool", **POOLS[op])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend", ("reference", "native"))
@pytest.mark.parametrize("op", sorted(POOLS))
def test_an_empty_spatial_extent_is_refused_like_onnxruntime(op, backend):
    model = _model(op)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # h may be 0 (the default range of a symbol starts at 1, which refuses the feed itself).
    session = shapeshift.InferenceSession(model, {"h": (0, 64)}, backend=backend)
    empty = np.zeros((2, 3, 0, 4), np.float32)
    with pytest.raises(Exception):
        expected.run(None, {"x": empty})
    with pytest.raises(ExecutionError, match=r"pool.*dimension 2.*(empty extent|at least 1)"):
        session.run(None, {"x": empty})
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ("reference", "native"))
def test_a_computed_empty_extent_is_refused_at_the_pool_that_reads_it(backend):
    nodes = [helper.make_node("MaxPool", ["x"], ["half"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["half"], ["y"], name="gap")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = shapeshift.InferenceSession(model, backend=backend)
    with pytest.raises(ExecutionError, match=r"gap.*(empty extent|at least 1)"):
        session.run(None, {"x": np.ones((1, 3, 1, 8), np.float32)})
    np.testing.assert_allclose(session.run(None, {"x": np.ones((1, 3, 4, 8), np.float32)})[0], 1.0)
