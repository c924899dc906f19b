"""MaxPool, AveragePool and MaxUnpool on the native backend (lower/pooling.py), end to end.

Small ONNX models against onnxruntime at three values of the symbolic dims (a batch dim and
a spatial dim): 1-D to 3-D pools with strides, pads, dilations and ceil_mode, AveragePool
with count_include_pad and auto_pad SAME_*, MaxPool's Indices in both storage orders and
on integer inputs, and MaxUnpool with and without output_shape. Every case asserts that no
node fell back to the reference evaluator; the cases the rules decline check that they do
fall back, with their reason, and still give the right answer.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.errors import ExecutionError

from .test_native_backend import _const, _input, _output
from .test_native_ops_extra import _model, _run_both

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F, D, I64, U8, I8 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.UINT8, TensorProto.INT8
NP_TYPES = {F: np.float32, D: np.float64, U8: np.uint8, I8: np.int8}
# (batch, spatial) bindings of the symbolic dims n and s
BINDINGS = ((1, 7), (2, 9), (3, 12))
OPSET = 19  # AveragePool's dilations


def _feeds(shape, dtype=F, seed=0):
    """One feed per binding, ``shape`` holding "n" and "s" where the dims are symbolic."""
    rng = np.random.default_rng(seed)
    feeds = []
    for n, s in BINDINGS:
        concrete = [n if d == "n" else s if d == "s" else d for d in shape]
        if np.issubdtype(NP_TYPES[dtype], np.integer):
            info = np.iinfo(NP_TYPES[dtype])
            x = rng.integers(info.min, int(info.max) + 1, concrete)  # the whole range, extremes included
        else:
            x = rng.standard_normal(concrete)
        feeds.append({"x": x.astype(NP_TYPES[dtype])})
    return feeds


def _pool_model(op, shape, dtype=F, outputs=1, **attrs):
    node = helper.make_node(op, ["x"], ["y", "indices"][:outputs], **attrs)
    outs = [_output("y", dtype)] + [_output("indices", I64)][: outputs - 1]
    return _model([node], [_input("x", shape, dtype)], outs, opset=OPSET)


# -- 3-D pools -------------------------------------------------------------------------------

THREE_D = [  # attributes of a pool over [n, 2, s, 6, 7]
    dict(kernel_shape=[2, 2, 2]),
    dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]),
    dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2, 2], strides=[1, 2, 2], dilations=[2, 2, 2]),
    dict(kernel_shape=[3, 2, 2], strides=[3, 2, 2], pads=[1, 1, 0, 1, 0, 1], dilations=[2, 1, 2], ceil_mode=1),
]


@pytest.mark.parametrize("attrs", THREE_D, ids=str)
def test_maxpool_3d(attrs):
    _run_both(_pool_model("MaxPool", ["n", 2, "s", 6, 7], **attrs), _feeds(["n", 2, "s", 6, 7]))


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", THREE_D, ids=str)
def test_averagepool_3d(attrs, count_include_pad):
    model = _pool_model("AveragePool", ["n", 2, "s", 6, 7], count_include_pad=count_include_pad, **attrs)
    _run_both(model, _feeds(["n", 2, "s", 6, 7]))


# -- AveragePool: SAME padding, dilations ----------------------------------------------------


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("shape,kernel,strides", [
    (["n", 3, "s", 8], [3, 2], [2, 1]),
    (["n", 2, "s"], [4], [3]),
    (["n", 1, 5, "s", 4], [2, 3, 2], [1, 2, 2]),
], ids=["2d", "1d", "3d"])
def test_averagepool_same(shape, kernel, strides, auto_pad, count_include_pad):
    model = _pool_model("AveragePool", shape, kernel_shape=kernel, strides=strides, auto_pad=auto_pad,
                        count_include_pad=count_include_pad)
    _run_both(model, _feeds(shape))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_maxpool_auto_pad(auto_pad):
    model = _pool_model("MaxPool", ["n", 2, "s", "s"], kernel_shape=[3, 3], strides=[2, 2], auto_pad=auto_pad)
    _run_both(model, _feeds(["n", 2, "s", "s"]))


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_averagepool_dilations(ceil_mode, count_include_pad):
    model = _pool_model("AveragePool", ["n", 3, "s", 10], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 1, 0],
                        dilations=[2, 3], ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    _run_both(model, _feeds(["n", 3, "s", 10]))


# -- MaxPool: Indices, element types ---------------------------------------------------------


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("shape,attrs", [
    (["n", 3, "s", 9], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    (["n", 2, "s", 5, 6], dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], ceil_mode=1)),
    (["n", 2, "s"], dict(kernel_shape=[3], strides=[2], pads=[1, 0], dilations=[2])),
], ids=["2d", "3d", "1d"])
def test_maxpool_indices(shape, attrs, storage_order):
    model = _pool_model("MaxPool", shape, outputs=2, storage_order=storage_order, **attrs)
    _run_both(model, _feeds(shape), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [U8, I8, D], ids=["uint8", "int8", "double"])
@pytest.mark.parametrize("outputs", [1, 2])
def test_maxpool_other_types(dtype, outputs):
    shape = ["n", 2, "s", 8]
    model = _pool_model("MaxPool", shape, dtype, outputs, kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 0, 1])
    _run_both(model, _feeds(shape, dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [U8, I8, D, F], ids=["uint8", "int8", "double", "float"])
@pytest.mark.parametrize("kernel", [2, 3])
def test_maxpool_1d_stride_2(dtype, kernel):
    """The stride-2 windows reduced straight from x's rows (kernels/pool.py), s = 7, 9, 12."""
    shape = ["n", 3, "s"]
    model = _pool_model("MaxPool", shape, dtype, kernel_shape=[kernel], strides=[2])
    _run_both(model, _feeds(shape, dtype), rtol=0, atol=0)


def test_averagepool_double():
    shape = ["n", 2, "s", 6, 5]
    model = _pool_model("AveragePool", shape, D, kernel_shape=[2, 2, 3], pads=[1, 0, 1, 1, 1, 0], ceil_mode=1)
    _run_both(model, _feeds(shape, D), rtol=1e-12, atol=1e-12)


def test_unread_indices_are_not_computed():
    """An Indices output nobody reads lowers like a plain MaxPool (any storage_order)."""
    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[2, 2], storage_order=1)
    model = _model([node, helper.make_node("Relu", ["y"], ["z"])], [_input("x", ["n", 2, "s", 6])],
                   [_output("z")], opset=OPSET)
    session = _run_both(model, _feeds(["n", 2, "s", 6]))
    code = next(s.lowered.code for s in session._executor.program.steps if s.node.op_type == "MaxPool")
    assert "ss_maxpool3d_f32(" in code and "argmax" not in code


# -- MaxUnpool -------------------------------------------------------------------------------


def test_maxunpool_default_shape():
    """MaxPool's values and Indices unpooled to the default size ((in - 1) * stride + kernel)."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["y", "i"], ["z"], kernel_shape=[2, 2], strides=[2, 2])]
    model = _model(nodes, [_input("x", ["n", 2, "s", 8])], [_output("z")], opset=OPSET)
    feeds = [{"x": x["x"]} for x in _feeds(["n", 2, "s", 8]) if x["x"].shape[2] % 2 == 0]
    feeds += [{"x": np.random.default_rng(1).standard_normal((2, 2, 10, 8)).astype(np.float32)}]
    _run_both(model, feeds)


def test_maxunpool_with_output_shape():
    """output_shape = Shape(x) restores odd extents the default size would lose."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 3]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("MaxUnpool", ["y", "i", "shape"], ["z"], kernel_shape=[2, 3], strides=[2, 3])]
    model = _model(nodes, [_input("x", ["n", 3, "s", 7])], [_output("z")], opset=OPSET)
    session = _run_both(model, _feeds(["n", 3, "s", 7]))
    assert session._executor.program.steps[-1].node.op_type == "MaxUnpool"


def test_maxunpool_constant_output_shape_3d():
    shape = [1, 2, 5, 6, 7]
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
             helper.make_node("MaxUnpool", ["y", "i", "shape"], ["z"], kernel_shape=[2, 2, 2], strides=[2, 2, 2])]
    model = _model(nodes, [_input("x", shape)], [_output("z")], [_const("shape", np.array(shape, np.int64))],
                   opset=OPSET)
    _run_both(model, [{"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}])


def test_maxunpool_rejects_an_index_out_of_range():
    node = helper.make_node("MaxUnpool", ["x", "i"], ["z"], kernel_shape=[2], strides=[2])
    model = _model([node], [_input("x", [1, 1, 2]), _input("i", [1, 1, 2], I64)], [_output("z")], opset=OPSET)
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.program.fallback_ops()
    x = np.ones((1, 1, 2), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x, "i": np.array([[[0, 3]]])})[0], [[[1, 0, 0, 1]]])
    with pytest.raises(ExecutionError, match="rejected"):
        session.run(None, {"x": x, "i": np.array([[[0, 4]]])})


# -- what the rules decline ------------------------------------------------------------------


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_4d_pools_fall_back_with_their_reason(op):
    shape = ["n", 1, 3, 4, 3, "s"]
    model = _pool_model(op, shape, kernel_shape=[2, 2, 2, 2])
    session = shapeshift.InferenceSession(model, backend="native")
    assert [s.reason for s in session._executor.program.steps if s.reason] == [f"{op} with 4 spatial axes"]
    reference = shapeshift.InferenceSession(model, backend="reference")
    for feed in _feeds(shape):
        np.testing.assert_array_equal(session.run(None, feed)[0], reference.run(None, feed)[0])
