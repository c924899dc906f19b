"""A fallback step whose NumPy result is a view of its input's buffer in the VM's arena
(Reshape, Transpose, Slice and the like return views) keeps its own copy: the plan frees
the input's buffer after its last reader, and a later step's output written there would
change the fallback's result while it is still read. Found by the fuzz campaign: a
distilbert export fed a rank-1 input_ids ran its attention reshapes as fallbacks and
gave attention scores of another tensor (1e-3 off at the output, ORT and the reference
backend agreeing)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift

from . import test_native_ops_extra
from .test_native_backend import _input, _model, _output

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler
ort = pytest.importorskip("onnxruntime")


def _reuse_model():
    """t1 = Neg(x) in the arena; t2 = Reshape(t1, shape), a fallback (its shape is data), a
    view of t1's buffer; t3 = Exp(x), the same size, planned after t1's last reader (the
    Reshape) and so into t1's freed buffer; y = t2 + t3, z = t3 * t3 (t3 read twice: its
    own buffer, not fused away)."""
    nodes = [
        helper.make_node("Neg", ["x"], ["t1"]),
        helper.make_node("Reshape", ["t1", "shape"], ["t2"]),
        helper.make_node("Exp", ["x"], ["t3"]),
        helper.make_node("Add", ["t2", "t3"], ["y"]),
        helper.make_node("Mul", ["t3", "t3"], ["z"]),
    ]
    return _model(nodes, [_input("x", ["n", 6]), _input("shape", [2], TensorProto.INT64)],
                  [_output("y"), _output("z")], [])


def test_a_fallback_view_of_a_freed_buffer_is_not_overwritten():
    model = _reuse_model()
    session = shapeshift.InferenceSession(model, backend="native")
    steps = {s.node.op_type: s.kind for s in session._executor.program.steps}
    assert steps["Reshape"] == "fallback" and steps["Exp"] == "native", steps
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 4, 7):
        x = np.random.default_rng(n).uniform(-1, 1, (n, 6)).astype(np.float32)
        feed = {"x": x, "shape": np.array([n, 6], np.int64)}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
