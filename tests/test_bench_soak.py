"""bench/soak.py: the shared-session soak finds a wrong output and an error when there is one,
passes a real native session at a small size, and measures growth from after the warm-up."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import soak  # noqa: E402

from shapeshift.examples.encoder import build_encoder  # noqa: E402


class _FlakySession:
    """Right on every run but the 7th (a wrong value) and the 11th (an exception)."""

    def __init__(self):
        self.count = 0

    def run(self, _names, feed):
        self.count += 1
        if self.count == 11:
            raise RuntimeError("boom")
        value = feed["input_ids"].astype(np.float32) + (1.0 if self.count == 7 else 0.0)
        return [value]


def test_shared_session_counts_wrong_outputs_and_errors():
    feeds = soak.make_feeds(4)
    expected = [[f["input_ids"].astype(np.float32)] for f in feeds]
    state = soak.shared_session(_FlakySession(), feeds, expected, runs=30, threads=1)
    assert len(state["mismatches"]) == 1
    assert len(state["errors"]) == 1 and "boom" in state["errors"][0]


def test_growth_is_measured_from_the_first_sample_past_the_warm_up():
    samples = [(0, 100), (100, 1000), (200, 1010), (1000, 1020)]
    assert soak.growth(samples, 1000) == (1000, 1020, 0.02)


def test_a_native_session_shared_by_threads_matches_its_single_threaded_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "encoder.onnx")
    onnx.save(build_encoder(), path)
    session = soak.open_session(path, "native")
    feeds = soak.make_feeds(6)
    expected = [session.run(None, feed) for feed in feeds]
    state = soak.shared_session(session, feeds, expected, runs=200, threads=4)
    assert state["mismatches"] == [] and state["errors"] == []
    churn = soak.created_and_dropped(path, "native", feeds[0], expected[0], sessions=3)
    assert churn["mismatches"] == [] and churn["errors"] == []
