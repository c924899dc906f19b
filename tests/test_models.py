"""Real models from ../shared/models: import, export, run on the reference backend.

Outputs must equal onnxruntime's on the original model at three values of
every dynamic dimension, from one session (no re-import between shapes); the
exported model must pass the full ONNX checker and give the same outputs in
onnxruntime.  Skipped with a reason when ../shared/models is absent.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import shapeshift
from shapeshift.cli.main import main as cli_main

from .conftest import shared_model
from .shared_models import DECLARED_INPUTS, FEEDS, feeds

pytestmark = pytest.mark.models


def _ort_session(model):
    import onnxruntime as ort

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _assert_close(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} output {i}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if w.dtype.kind == "f":
            scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=2e-4 * scale, err_msg=f"{what} output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")


@pytest.mark.parametrize("name", sorted(FEEDS))
def test_reference_backend_matches_onnxruntime(name):
    path = shared_model(name)
    session = shapeshift.InferenceSession(path, backend="reference")
    reference = _ort_session(path)
    for index in range(3):
        feed = feeds(name, index)
        _assert_close(session.run(None, feed), reference.run(None, feed), f"{name} size {index}")


@pytest.mark.parametrize("name", sorted(FEEDS))
def test_export_passes_checker_and_matches(name):
    path = shared_model(name)
    exported = shapeshift.to_onnx(shapeshift.load(path))
    onnx.checker.check_model(exported, full_check=True)
    original, roundtrip = _ort_session(path), _ort_session(exported)
    for index in range(3):
        feed = feeds(name, index)
        _assert_close(roundtrip.run(None, feed), original.run(None, feed), f"exported {name} size {index}")


@pytest.mark.parametrize("name", sorted(DECLARED_INPUTS))
def test_info_shows_symbolic_inputs_by_model_names(name, capsys):
    path = shared_model(name)
    assert cli_main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    for input_name, shape in DECLARED_INPUTS[name].items():
        assert f"  {input_name}: {shape}" in out, out
    assert "unsupported ops: none" in out
