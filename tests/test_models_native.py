"""Real models on the native backend: ../shared/models at three values of every dynamic
dim, and the onnx package's light CNNs, against onnxruntime, each from ONE build.

Besides the outputs, every model must keep its compute on generated code: a heavy op
(MatMul, Conv, LSTM, pooling, normalizations, Softmax) left to the reference fallback
fails the test, and so does an elementwise op or reduction left there for any reason
but a data-dependent shape (the small tensors after NonZero or a computed Range, which
no plan can size before the run). silero_vad is the known exception (SILERO_REASON).
"""

from __future__ import annotations

import numpy as np
import pytest

import shapeshift
from shapeshift.codegen import build

from .conftest import shared_model
from .shared_models import FEEDS, feeds
from .test_light_models import LIGHT_DIR, MODELS as LIGHT_MODELS
from .test_models import _assert_close, _ort_session

HEAVY_OPS = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "LayerNormalization", "BatchNormalization", "InstanceNormalization",
    "GroupNormalization", "LRN", "Softmax", "LogSoftmax", "Resize"})
ELEMENTWISE_AND_REDUCTIONS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "Add", "Sub", "Mul", "Div", "Relu",
    "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Pow", "Where", "Neg", "Abs", "Clip", "Max", "Min"})
DATA_DEPENDENT = "shape or dtype not plannable"

# silero_vad's whole network sits in the branches of Ifs on the sample rate, and inner
# Ifs join branch types of different ranks: downstream shapes are unknown until the
# run, so the native program cannot size their buffers and leaves them to the fallback.
SILERO_REASON = "If branches with outputs of data-dependent rank keep the network on the fallback"


@pytest.fixture
def _count_builds(monkeypatch, tmp_path):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    calls: list = []
    real = build._run_compiler
    monkeypatch.setattr(build, "_run_compiler", lambda cmd: calls.append(cmd) or real(cmd))
    return calls


def _heavy_fallback(session) -> dict:
    """Fallback steps that do real compute: heavy ops, and elementwise ops or reductions
    whose shapes were known (so nothing but a missing rule kept them off generated code)."""
    found: dict = {}
    for program in session._executor.program.all_programs():
        for step in program.steps:
            if step.kind != "fallback" or id(step.node) in program.branches:
                continue
            op = step.node.op_type
            if op in HEAVY_OPS or (op in ELEMENTWISE_AND_REDUCTIONS and step.reason != DATA_DEPENDENT):
                found[f"{op} ({step.reason})"] = found.get(f"{op} ({step.reason})", 0) + 1
    return found


@pytest.mark.models
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=SILERO_REASON)) if n.startswith("silero") else n
    for n in sorted(FEEDS)])
def test_shared_model_native_matches_onnxruntime(name, _count_builds):
    path = shared_model(name)
    session = shapeshift.InferenceSession(path, backend="native")
    reference = _ort_session(path)
    for index in (0, 1, 2, 0):  # three shapes per dynamic dim, then the first again
        feed = feeds(name, index)
        _assert_close(session.run(None, feed), reference.run(None, feed), f"{name} feed {index}")
    assert len(_count_builds) <= 1, "one build must serve every shape"
    assert not _heavy_fallback(session), f"compute left to the fallback: {_heavy_fallback(session)}"


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_native_matches_onnxruntime(name, _count_builds):
    path = LIGHT_DIR / name
    session = shapeshift.InferenceSession(path, backend="native")
    (inp,) = session.get_inputs()
    x = np.random.default_rng(0).random(inp.shape).astype(np.float32)
    (got,) = session.run(None, {inp.name: x})
    (want,) = _ort_session(path).run(None, {inp.name: x})
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * scale)
    assert not session._executor.program.fallback_ops(), "light CNNs lower completely"
    assert len(_count_builds) == 1
