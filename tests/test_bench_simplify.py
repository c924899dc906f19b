"""bench/simplify.py: the order of the timed runs, with a stand-in for the process
that runs a tool (no model is simplified, nothing is timed)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import simplify as bench  # noqa: E402

CASE = bench.Case("encoder-48", Path("encoder-48.onnx"), "encoder", {})


def _recorder(seconds: dict[str, float], errors: frozenset = frozenset()):
    calls: list[str] = []

    def run(tool, path, want_stats, timeout):
        calls.append(tool if path == CASE.path else (path.stem, tool))
        if tool in errors:
            return {"error": f"{tool} broke"}
        return {"seconds": seconds[tool], "rss_kb": 1024, **({"stats": {"nodes": 1}} if want_stats else {})}

    return run, calls


def test_the_tools_runs_on_a_model_alternate_each_round_starting_with_another():
    run, calls = _recorder({"incremental": 0.05, "fixpoint": 0.1, "onnxsim": 0.2})
    tools = ["incremental", "fixpoint", "onnxsim"]
    measured = bench.measure_cases([CASE], tools, 3, 60.0, run=run)
    assert calls == ["incremental", "fixpoint", "onnxsim", "fixpoint", "onnxsim", "incremental",
                     "onnxsim", "incremental", "fixpoint"]
    assert [m.tool for m in measured] == tools
    assert all(len(m.seconds) == 3 and m.after == {"nodes": 1} for m in measured)


def test_a_single_run_tool_a_long_run_and_a_failure_stop_only_that_tools_runs():
    # per-op on encoder-48 runs once (SINGLE_RUN); fixpoint takes longer than LONG_RUN_S; onnxsim fails.
    run, calls = _recorder({"incremental": 0.05, "per-op": 0.5, "fixpoint": bench.LONG_RUN_S + 1},
                           errors=frozenset({"onnxsim"}))
    tools = ["incremental", "per-op", "fixpoint", "onnxsim"]
    measured = {m.tool: m for m in bench.measure_cases([CASE], tools, 3, 60.0, run=run)}
    assert calls.count("incremental") == 3
    assert calls.count("per-op") == 1 and calls.count("fixpoint") == 1 and calls.count("onnxsim") == 1
    assert measured["onnxsim"].error == "onnxsim broke" and not measured["onnxsim"].seconds
    assert measured["fixpoint"].seconds == [bench.LONG_RUN_S + 1]
    assert measured["incremental"].time == 0.05


def test_the_encoders_are_measured_together_round_by_round():
    """encoder-48 / encoder-12 is a ratio between cases: their runs alternate like the tools'."""
    small = bench.Case("encoder-12", Path("encoder-12.onnx"), "encoder", {})
    model = bench.Case("bert", Path("bert.onnx"), "shared", {})
    assert bench.case_groups([model, small, CASE]) == [[model], [small, CASE]]
    run, calls = _recorder({"incremental": 0.05, "per-op": 0.5})
    measured = bench.measure_cases([small, CASE], ["incremental", "per-op"], 2, 60.0, run=run)
    assert calls == [("encoder-12", "incremental"), ("encoder-12", "per-op"), "incremental", "per-op",
                     ("encoder-12", "per-op"), "incremental",  # per-op on encoder-48: a single run
                     ("encoder-12", "incremental")]
    assert [(m.case.name, m.tool, len(m.seconds)) for m in measured] == [
        ("encoder-12", "incremental", 2), ("encoder-12", "per-op", 2), ("encoder-48", "incremental", 2),
        ("encoder-48", "per-op", 1)]
