"""ReduceMean over an empty axis (issue 30, item 6): ONNX leaves the mean of nothing
undefined; onnxruntime gives 0 (its sum divided by at least 1), at every opset and dtype,
and both backends follow it. Before, the native backend gave NaN (0 / 0) and the reference
backend 0. Static and dynamic (bound to 0 at run time) extents, kept and dropped dims."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift import InferenceSession

ort = pytest.importorskip("onnxruntime")

DTYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64}
# (input shape, reduced axes; None: all of them)
CASES = [((2, 0, 3), [1]), ((0, 5), [0]), ((3, 0), [1]), ((0,), None), ((2, 0, 3), [0, 1]), ((4, 0, 2), [1, 2])]


def _model(opset: int, dtype: int, rank: int, axes, keepdims: int) -> bytes:
    dims = [f"d{i}" for i in range(rank)]
    inputs, inits, attrs = ["x"], [], {"keepdims": keepdims}
    if axes is not None:
        if opset >= 18:
            inputs.append("axes")
            inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
        else:
            attrs["axes"] = axes
    node = helper.make_node("ReduceMean", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, dims)],
                              [helper.make_tensor_value_info("y", dtype, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape,axes", CASES)
@pytest.mark.parametrize("static,keepdims", [(True, 1), (False, 1), (False, 0)])
def test_reduce_mean_of_an_empty_axis_follows_onnxruntime(backend, opset, dtype, shape, axes, keepdims, static):
    model = _model(opset, dtype, len(shape), axes, keepdims)
    x = np.zeros(shape, DTYPES[dtype])
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # Static: every dim a constant; dynamic: each a symbol whose range includes 0.
    dynamic = {f"d{i}": (d, d) if static else (0, 8) for i, d in enumerate(shape)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = InferenceSession(model, dynamic, backend=backend).run(None, {"x": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if want.size:
        assert not np.isnan(got.astype(np.float64)).any()  # the native backend gave NaN here
