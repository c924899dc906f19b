"""Real models on the native backend: ../shared/models at three values of every dynamic
dim, and the onnx package's light CNNs, against onnxruntime, each from the builds of its session.

Besides the outputs, every model must keep its compute on generated code: a heavy op
(MatMul, Conv, LSTM, pooling, normalizations, Softmax) that RUNS on the reference fallback
during these runs fails the test, and so does an elementwise op or reduction run there for
any reason but a data-dependent shape (the small tensors after NonZero or a computed
Range, which no plan can size before the run). What ran is recorded, not what a program
holds: silero_vad is built in versions, one per outcome of its shape-decided Ifs
(runtime/versions.py), and the versions no feed selects may keep fallback steps.
"""

from __future__ import annotations

import numpy as np
import pytest

import shapeshift
from shapeshift.runtime import vm

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



@pytest.fixture
def _ran_on_fallback(monkeypatch):
    """Every fallback step the VMs run, as (op, reason), with the ops inside the branches of
    an If that runs on the fallback as a whole (If steps whose branches are programs run
    natively and are not counted)."""
    ran: list = []
    real = vm.NativeVM._run_fallback

    def recording(self, step, *args, **kwargs):
        if id(step.node) not in self._branches:
            ran.append((step.node.op_type, step.reason))
            for sub in step.node.subgraphs():
                ran.extend((inner.op_type, "inside a fallback If") for inner in sub.walk_nodes())
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(vm.NativeVM, "_run_fallback", recording)
    return ran


def _heavy(ran) -> dict:
    """Fallback runs that did real compute: heavy ops, and elementwise ops or reductions
    whose shapes were known (so nothing but a missing rule kept them off generated code)."""
    found: dict = {}
    for op, reason in ran:
        if op in HEAVY_OPS or (op in ELEMENTWISE_AND_REDUCTIONS and reason != DATA_DEPENDENT):
            found[f"{op} ({reason})"] = found.get(f"{op} ({reason})", 0) + 1
    return found


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(FEEDS))
def test_shared_model_native_matches_onnxruntime(name, compiler_calls, _ran_on_fallback):
    path = shared_model(name)
    session = shapeshift.InferenceSession(path, backend="native")
    versions = len(getattr(session._executor, "versions", ())) or 1
    assert len(compiler_calls) <= versions, "one build per program version"
    built = len(compiler_calls)
    reference = _ort_session(path)
    for index in (0, 1, 2, 0):  # three shapes per dynamic dim, then the first again
        feed = feeds(name, index)
        _assert_close(session.run(None, feed), reference.run(None, feed), f"{name} feed {index}")
    assert len(compiler_calls) == built, "no build while running: the session's builds serve every shape"
    assert not _heavy(_ran_on_fallback), f"compute run on the fallback: {_heavy(_ran_on_fallback)}"


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_native_matches_onnxruntime(name, compiler_calls):
    path = LIGHT_DIR / name
    session = shapeshift.InferenceSession(path, backend="native")
    (inp,) = session.get_inputs()
    x = np.random.default_rng(0).random(inp.shape).astype(np.float32)
    (got,) = session.run(None, {inp.name: x})
    (want,) = _ort_session(path).run(None, {inp.name: x})
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * scale)
    assert not session._executor.program.fallback_ops(), "light CNNs lower completely"
    assert len(compiler_calls) == 1
