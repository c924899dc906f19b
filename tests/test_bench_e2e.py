"""bench/e2e.py: merging rounds of workers into one result per (model, tool), as pure
functions on made-up results (no sessions, no timing)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import e2e  # noqa: E402


def _result(latency: dict, load_s: float = 1.0) -> dict:
    return {"latency": latency, "load_s": load_s, "outputs": {k: f"{k}.npz" for k in latency}, "peak_mb": 10.0}


def test_merge_keeps_each_shapes_fastest_round_and_the_first_rounds_other_fields():
    first = {("m", "native"): _result({"seq 1": 0.010, "seq 8": 0.050}, load_s=2.0)}
    second = {("m", "native"): _result({"seq 1": 0.012, "seq 8": 0.030}, load_s=3.0)}
    merged = e2e.merge_rounds([first, second])[("m", "native")]
    assert merged["latency"] == {"seq 1": 0.010, "seq 8": 0.030}
    assert merged["load_s"] == 2.0
    assert merged["round_latency"] == [first[("m", "native")]["latency"], second[("m", "native")]["latency"]]


def test_merge_skips_failed_rounds_and_keeps_an_error_when_every_round_failed():
    ok = _result({"seq 1": 0.02})
    rounds = [{("m", "native"): {"error": "boom"}, ("m", "reference"): {"error": "first"}},
              {("m", "native"): ok, ("m", "reference"): {"error": "second"}}]
    merged = e2e.merge_rounds(rounds)
    assert merged[("m", "native")]["latency"] == {"seq 1": 0.02}
    assert merged[("m", "native")]["round_latency"] == [ok["latency"]]
    assert merged[("m", "reference")] == {"error": "first"}


def test_round_geomeans_compare_each_round_with_the_same_rounds_reference():
    tool = e2e.merge_rounds([{"t": _result({"a": 2.0, "b": 8.0})}, {"t": _result({"a": 1.0, "b": 1.0})}])["t"]
    ref = e2e.merge_rounds([{"t": _result({"a": 1.0, "b": 2.0})}, {"t": _result({"a": 1.0, "b": 4.0})}])["t"]
    # Round 1: ratios 2 and 4 (geomean sqrt 8); round 2: 1 and 1/4 (geomean 1/2).
    assert e2e.round_geomeans(tool, ref, ["a", "b"]) == pytest.approx([8 ** 0.5, 0.5])
    # The merged latencies mix rounds: a 1.0/1.0, b 1.0/2.0.
    assert e2e.machine.geomean(tool["latency"][k] / ref["latency"][k] for k in "ab") == pytest.approx(0.5 ** 0.5)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_warm_cache_timing_rebuilds_what_the_session_built(encoder_path, compiler_calls):
    # It once called compile_library on a program's first unit alone, a library without the
    # kernel objects that cannot load: every native worker of the bench failed.
    session = e2e._session("native", str(encoder_path), 1)
    built = len(compiler_calls)
    result: dict = {}
    e2e._time_warm_cache(result, session, str(encoder_path), 1, "native", None, None)
    assert len(compiler_calls) == built, "the second session and the build step come from the cache"
    assert result["cache_load_s"] > 0 and result["cache_compile_s"] >= 0


def test_library_warm_load_is_timed_in_a_process_of_its_own(encoder_path, build_cache, tmp_path):
    """The session is made in a new process from the cache given (here the run's, so nothing
    compiles); a model that cannot load is an error that says so, not a time."""
    import os

    before = os.environ.get("SHAPESHIFT_CACHE_DIR")
    seconds = e2e._fresh_process_load_s("native", str(encoder_path), 1, None, {"batch": (1, 2), "seq": (1, 8)},
                                        build_cache)
    assert 0 < seconds < 120
    with pytest.raises(RuntimeError, match="session creation from .* failed"):
        e2e._fresh_process_load_s("native", str(tmp_path / "missing.onnx"), 1, None, None, tmp_path)
    assert os.environ.get("SHAPESHIFT_CACHE_DIR") == before  # this process's cache is left alone
