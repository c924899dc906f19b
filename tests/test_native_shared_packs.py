"""One packed copy per constant weight: products by the same weight share it, whatever node
they are in (a recurrence the exporter unrolled multiplies every step by one weight), and
products by different weights, or by one weight read another way, do not."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import shapeshift

from . import test_native_ops_extra
from .test_native_backend import _const, _input, _model, _output

pytestmark = test_native_ops_extra.pytestmark  # skipped without a C compiler
ort = pytest.importorskip("onnxruntime")

H = 40  # a square weight, so that it can be read transposed or not


def _chain_model(rng):
    """h1 = tanh(x W^T + b), h2 = tanh(h1 W^T + b), h3 = tanh(h2 W^T + b) (one weight, as an
    unrolled recurrence), then h3 V^T (V: another weight of the same shape and contents
    pattern) and h3 W (W read untransposed: another matrix)."""
    w = rng.uniform(-0.3, 0.3, (H, H)).astype(np.float32)
    v = rng.uniform(-0.3, 0.3, (H, H)).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, (H,)).astype(np.float32)
    nodes, h = [], "x"
    for t in range(3):
        nodes.append(helper.make_node("Gemm", [h, "w", "b"], [f"g{t}"], transB=1))
        nodes.append(helper.make_node("Tanh", [f"g{t}"], [f"h{t}"]))
        h = f"h{t}"
    nodes.append(helper.make_node("Gemm", [h, "v"], ["y_other"], transB=1))
    nodes.append(helper.make_node("Gemm", [h, "w"], ["y_plain"]))
    return _model(nodes, [_input("x", ["batch", H])], [_output("y_other"), _output("y_plain"), _output(h)],
                  [_const("w", w), _const("v", v), _const("b", b)])


def test_one_weight_one_packed_copy():
    model = _chain_model(np.random.default_rng(0))
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops()
    # W^T (three nodes), V^T, and W itself: three distinct matrices, three copies.
    assert len(program.packs) == 3, [p.source.shape for p in program.packs]
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 17):
        feed = {"x": np.random.default_rng(batch).uniform(-1, 1, (batch, H)).astype(np.float32)}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
