"""The ONNX "light" models shipped inside the onnx package, on the reference backend.

Each is a classic CNN (AlexNet, ResNet-50, Inception, ...) with its weights
replaced by ConstantOfShape nodes; its expected output ships beside it.  Every
one must import, export (full checker) and give that output, as onnxruntime does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import shapeshift

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.name for p in LIGHT_DIR.glob("light_*.onnx"))

# squeezenet's weights are all equal, so its 1000 logits are all ~1.0456e10 and equal
# in exact arithmetic; float32 GEMM rounds rows differently by a few ulps (1 ulp = 1024
# there), and the final Softmax turns that into one-hot instead of 0.001 everywhere. Which
# class wins depends on each library's summation order on the CPU at hand: the outputs
# differed on the AVX2 machines this test was written on and agree on an AVX-512 one, so
# neither outcome can be asserted. Their probabilities are checked to be a distribution;
# test_squeezenet_logits checks the logits themselves.
ILL_CONDITIONED = {"light_squeezenet.onnx": "softmax of equal ~1e10 logits amplifies float32 rounding"}


def _expected_output(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.with_name(path.stem + "_output_0.pb").read_bytes())
    return numpy_helper.to_array(tensor)


def test_light_models_are_present():
    assert len(MODELS) >= 9, f"expected the onnx package's light models in {LIGHT_DIR}"


@pytest.mark.parametrize("name", MODELS)
def test_light_model_runs_and_round_trips(name):
    import onnxruntime as ort

    path = LIGHT_DIR / name
    session = shapeshift.InferenceSession(path, backend="reference")
    (inp,) = session.get_inputs()
    x = np.random.default_rng(0).random(inp.shape).astype(np.float32)
    (got,) = session.run(None, {inp.name: x})
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[0]
    if name in ILL_CONDITIONED:
        # [1, 1000, 1, 1]: a distribution over axis 1.
        assert np.all(got >= 0) and np.allclose(got.sum(axis=1), 1.0, rtol=1e-5), ILL_CONDITIONED[name]
    else:
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    expected = _expected_output(path)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    exported = shapeshift.to_onnx(shapeshift.load(path))
    onnx.checker.check_model(exported, full_check=True)
    (again,) = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {inp.name: x})
    np.testing.assert_allclose(again, want, rtol=1e-5, atol=1e-6)


def test_squeezenet_logits():
    """The logits before squeezenet's final Softmax agree with onnxruntime's to float32 precision."""
    import onnxruntime as ort

    model = onnx.load(str(LIGHT_DIR / "light_squeezenet.onnx"))
    softmax = model.graph.node[-1]
    assert softmax.op_type == "Softmax"
    model.graph.node.remove(softmax)
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(softmax.input[0]))
    x = np.random.default_rng(0).random((1, 3, 224, 224)).astype(np.float32)
    initializers = {t.name for t in model.graph.initializer}
    name = next(i.name for i in model.graph.input if i.name not in initializers)
    (got,) = shapeshift.InferenceSession(model, backend="reference").run(None, {name: x})
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {name: x})
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_simplifies_to_the_same_function(name):
    """Light models build their weights with ConstantOfShape: simplify folds the small ones
    (above the fold limit they stay computed), outputs unchanged."""
    import onnxruntime as ort

    from shapeshift.passes.simplify import simplify_model

    path = LIGHT_DIR / name
    simplified = simplify_model(path, check=True)[0]
    onnx.checker.check_model(simplified, full_check=True)
    before = sum(n.op_type == "ConstantOfShape" for n in onnx.load(str(path)).graph.node)
    after = sum(n.op_type == "ConstantOfShape" for n in simplified.graph.node)
    assert after < before
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = [i for i in session.get_inputs()]
    x = np.random.default_rng(1).random(inp.shape).astype(np.float32)
    want = session.run(None, {inp.name: x})[0]
    got = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {inp.name: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
