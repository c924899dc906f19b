"""bench/build_time.py: the table from made-up measurements (no sessions, no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import build_time as build_bench  # noqa: E402


def test_report_gives_medians_and_ratios_to_onnxruntime(monkeypatch, tmp_path):
    # The report names the machine and its measured peak: measured into a cache of the test's own.
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    times = {("m", "empty cache"): [9.0, 7.0, 8.0], ("m", "fragments cached"): [2.0, 3.0, 2.5],
             ("m", "cache hit"): [0.5, 0.6, 0.4], ("m", "onnxruntime"): [0.5, 0.4, 0.6],
             ("m", "hit: build"): [0.03, 0.05, 0.04], ("m", "import"): [1.0, 1.2, 1.1]}
    overhead = {("native", "wall"): 12e-6, ("native", "cpu"): 11e-6, ("onnxruntime", "wall"): 6e-6,
                ("onnxruntime", "cpu"): 5.5e-6}
    text = build_bench.report(times, ["m"], runs=3, overhead=overhead)
    row = next(line for line in text.splitlines() if line.startswith("| m |"))
    assert row == "| m | 8.00 | 2.50 | 0.50 | 0.50 | 0.04 | 1.10 | 16.0x | 5.0x | 1.0x |"
    assert "| native / onnxruntime | 2.00x | 2.00x |" in text
    assert "median of 3" in text
    assert "measured FMA peak" in text


def test_report_names_the_command_as_it_ran(monkeypatch, tmp_path):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    times = {("m", state): [1.0] for state in ("empty cache", "fragments cached", "cache hit", "onnxruntime",
                                               "hit: build", "import")}
    overhead = {(tool, kind): 1e-6 for tool in ("native", "onnxruntime") for kind in ("wall", "cpu")}
    text = build_bench.report(times, ["m"], runs=1, overhead=overhead, command="--no-bert --runs 1")
    assert "`python bench/build_time.py --no-bert --runs 1` on " in text
