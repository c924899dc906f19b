"""bench/tail_models.py: every model bench/tail.py builds runs natively with onnxruntime's
outputs at the feeds the bench measures (no timing), and bench/tail.py's target lines."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tail  # noqa: E402
import tail_models  # noqa: E402

import shapeshift  # noqa: E402


@pytest.mark.parametrize("name", sorted(tail_models.BUILDERS))
def test_built_model_runs_natively_like_onnxruntime(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    model = tail_models.BUILDERS[name]()
    expected_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = shapeshift.InferenceSession(model, backend="native")
    assert not session._executor.programs()[0].fallback_ops(), "the bench would time a fallback, not a kernel"
    for label, feed in tail_models.feeds(name, quick=True):
        expected = expected_session.run(None, feed)
        got = session.run(None, feed)
        for e, g in zip(expected, got):
            assert e.shape == g.shape, label
            assert np.isfinite(e).all() and np.abs(e).max() > 1e-3, f"{label}: a degenerate model"
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=label)


def _result(latency: dict, library_load_s: float = 1.0) -> dict:
    # Cold creation (the kernel library built too) is reported, not held to the target.
    return {"latency": latency, "load_s": 9.0, "library_load_s": library_load_s, "outputs": {}}


def test_targets_name_every_shape_above_onnxruntime_and_the_recurrent_geomean():
    args = type("Args", (), {"threads": [1]})()
    results = {(1, "lstm_seq", "native"): _result({"seq 1": 0.5, "seq 16": 2.0}),
               (1, "lstm_seq", "onnxruntime"): _result({"seq 1": 1.0, "seq 16": 1.0}),
               (1, "yolo", "native"): _result({"a": 1.0}, library_load_s=2.5),
               (1, "yolo", "onnxruntime"): _result({"a": 1.0})}
    lines = tail.targets(results, ["lstm_seq", "yolo"], args)
    assert "NOT met, 1 above: lstm_seq seq 16 1t (2.00)" in lines[2]
    assert "geomean over shapes and thread counts: 1.00 (target <= 0.8) NOT met" in lines[3]
    assert lines[4].endswith("NOT met: yolo 2.50 s")


def test_scaling_line_compares_each_feeds_speed_up_with_onnxruntimes():
    args = type("Args", (), {"threads": [1, 2]})()
    results = {(1, "yolo", "native"): _result({"a": 2.0, "b": 2.0}),
               (2, "yolo", "native"): _result({"a": 1.0, "b": 2.0}),
               (1, "yolo", "onnxruntime"): _result({"a": 2.0, "b": 2.0}),
               (2, "yolo", "onnxruntime"): _result({"a": 1.25, "b": 1.0}),
               (1, "lstm_seq", "native"): _result({"a": 9.0}), (2, "lstm_seq", "native"): _result({"a": 9.0}),
               (1, "lstm_seq", "onnxruntime"): _result({"a": 1.0}), (2, "lstm_seq", "onnxruntime"): _result({"a": 0.5})}
    (line,) = tail.scaling_targets(results, ["lstm_seq", "yolo"], args)
    # yolo a: 2.0 against 1.6 (1.25); b: 1.0 against 2.0 (0.50); lstm_seq is not a shared model.
    assert "NOT met, 1 under: yolo b (0.50)" in line and "(range 0.50-1.25)" in line
    assert tail.scaling_targets(results, ["yolo"], type("Args", (), {"threads": [1]})()) == []


def test_two_thread_figures_say_the_cores_state_each_tool_ran_in():
    """bench/e2e.py's measure probes the cores around each feed's timed runs at 2 threads;
    merge_rounds keeps the state of the round whose latency it keeps, and the target lines
    name each slow row's states and every row whose two tools ran in different ones."""
    import e2e

    near, far = [60.0, 70.0], [400.0, 350.0]
    rounds = [{("yolo", "native"): {**_result({"a": 1.2, "b": 1.0}), "cores_ns": {"a": far, "b": near}}},
              {("yolo", "native"): {**_result({"a": 0.9, "b": 1.1}), "cores_ns": {"a": near, "b": [60.0, 500.0]}}}]
    merged = e2e.merge_rounds(rounds)[("yolo", "native")]
    assert merged["latency"] == {"a": 0.9, "b": 1.0} and merged["cores_ns"] == {"a": near, "b": near}
    args = type("Args", (), {"threads": [2]})()
    results = {(2, "yolo", "native"): merged,
               (2, "yolo", "onnxruntime"): {**_result({"a": 0.5, "b": 2.0}), "cores_ns": {"a": far, "b": near}}}
    assert tail.cores(results, 2, "yolo", "a") == ("near", "far")
    assert tail.cores(results, 1, "yolo", "a") == (None, None)
    lines = tail.targets(results, ["yolo"], args)
    assert "NOT met, 1 above: yolo a 2t (1.80, near / far)" in lines[2]
    assert lines[3] == "- measured with the cores in different states for the two tools (1): yolo a 2t"
