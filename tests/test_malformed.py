"""Property tests: corrupted models and feeds fail with a ShapeshiftError, never anything else."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shapeshift
from shapeshift.errors import ShapeshiftError
from shapeshift.examples.encoder import build_encoder

MODEL_BYTES = build_encoder(layers=1, hidden=16, heads=2, vocab=50, max_positions=64).SerializeToString()


def test_an_op_type_that_is_not_utf8_is_named():
    """protobuf hands a string field that is not valid UTF-8 over as bytes: one such op
    type among str ones made the unsupported-op list unsortable (a TypeError; found by
    the property test below)."""
    data = bytearray(MODEL_BYTES)
    index = data.index(b"Gather")
    data[index] ^= 0x80  # 'G' -> 0xc7: not UTF-8 on its own
    with pytest.raises(shapeshift.errors.UnsupportedModelError, match=r"b'\\xc7ather' \(not UTF-8\)"):
        shapeshift.InferenceSession(bytes(data), backend="reference")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, len(MODEL_BYTES) - 1), flips=st.lists(
    st.tuples(st.integers(0, len(MODEL_BYTES) - 1), st.integers(1, 255)), max_size=4))
def test_corrupted_model_bytes_raise_only_shapeshift_errors(cut, flips):
    data = bytearray(MODEL_BYTES[:cut] if cut else MODEL_BYTES)
    for position, xor in flips:
        if position < len(data):
            data[position] ^= xor
    try:
        session = shapeshift.InferenceSession(bytes(data), backend="reference")
    except ShapeshiftError:
        return
    # A mutation that still parses must still be checked or run cleanly.
    feed = {"input_ids": np.zeros((1, 3), np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    try:
        session.run(None, feed)
    except ShapeshiftError:
        pass


@pytest.fixture(scope="module")
def session():
    return shapeshift.InferenceSession(MODEL_BYTES, dynamic={"seq": (1, 64), "batch": (1, 4)},
                                       backend="reference")


@settings(max_examples=100, deadline=None)
@given(shape_a=st.lists(st.integers(0, 70), min_size=0, max_size=3),
       shape_b=st.lists(st.integers(0, 70), min_size=0, max_size=3),
       dtype=st.sampled_from([np.int64, np.int32, np.float32, np.bool_]))
def test_random_feeds_run_or_raise_clear_errors(session, shape_a, shape_b, dtype):
    feed = {"input_ids": np.zeros(shape_a, dtype), "attention_mask": np.ones(shape_b, dtype)}
    valid = (dtype is np.int64 and len(shape_a) == 2 and shape_a == shape_b
             and 1 <= shape_a[0] <= 4 and 1 <= shape_a[1] <= 64)
    if valid:
        assert session.run(None, feed)[0].shape == (*shape_a, 16)
    else:
        with pytest.raises(ShapeshiftError):
            session.run(None, feed)


def _tiny_model(dim_param: str = "n") -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(np.ones(2, np.float32), "w")
    weight.ClearField("raw_data")
    weight.float_data.extend([1.0, 1.0])  # not raw: read through numpy_helper
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [dim_param, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [dim_param, 2])], [weight])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_unknown_element_types_and_non_utf8_dims_are_named():
    """Each of these raised a bare KeyError or AttributeError (found by fuzzing the bytes)."""
    model = _tiny_model()
    model.graph.input[0].type.tensor_type.elem_type = 35
    with pytest.raises(ShapeshiftError, match="'x': element type 35 is not an ONNX type"):
        shapeshift.InferenceSession(model, backend="reference")

    model = _tiny_model()
    model.graph.initializer[0].data_type = 61
    with pytest.raises(ShapeshiftError, match="initializer 'w'"):
        shapeshift.InferenceSession(model, backend="reference")

    data = _tiny_model("zq").SerializeToString().replace(b"zq", b"\xc7q")
    with pytest.raises(ShapeshiftError, match=r"'x': dim_param b'\\xc7q' of axis 0 is not valid UTF-8"):
        shapeshift.InferenceSession(data, backend="reference")


def test_simplify_of_a_name_that_is_not_utf8_is_a_clear_error():
    """Import reads it (as bytes); export cannot write it: a ModelLoadError, not a
    UnicodeDecodeError from protobuf."""
    model = _tiny_model()
    model.graph.node[0].name = "zq_node"
    data = model.SerializeToString().replace(b"zq_node", b"\xc7q_node")
    with pytest.raises(ShapeshiftError, match=r"not valid UTF-8 \(b'\\xc7q_node'\) cannot be written back"):
        shapeshift.simplify(data)
