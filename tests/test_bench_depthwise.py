"""bench/depthwise.py end to end on a small grid: the kernel, run in a C loop, computes what
onnxruntime does; the table, the verdict on issue 28's line and the results file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

pytest.importorskip("onnxruntime")

import depthwise  # noqa: E402


def _row(name: str, kernel: float, node: float) -> dict:
    c, k, s, p = 16, 3, 1, 7
    return {"case": depthwise.Case(name, c, c, p, p, k, s, group=c, act="relu"), "kernel": kernel,
            "ort_node": node, "ort_run": 2 * node, "ort_op": "Conv", "diff": 0.0, "ratio": kernel / node,
            "run_ratio": kernel / (2 * node)}


def test_the_verdict_names_every_conv_above_onnxruntimes_node():
    rows = [_row("a", 1e-6, 2e-6), _row("b", 3e-6, 2e-6), _row("c", 2e-6, 2e-6)]
    verdict = depthwise.verdict(rows)
    assert verdict.startswith("Issue 28's depthwise line") and "NOT met; 2 of 3 at or under 1.0" in verdict
    assert "worst b at 1.50" in verdict and "Above 1.0: b (1.50)" in verdict
    assert "met; 1 of 1" in depthwise.verdict(rows[:1])
    table = depthwise.table(rows, 16)
    assert "| a | 0.01 | 1.0 | 2.0 | 4.0 | 0.50 | 0.25 |" in table
    assert "| **geomean** | | | | | **0.91** | **0.45** |" in table  # (0.5 * 1.5 * 1.0) ** (1 / 3)


def test_a_small_grid_runs_checks_and_writes_its_table(tmp_path):
    out = tmp_path / "dw.md"
    # 40 channels: a last block of 8 lanes; 9x9 planes: a tile of 8 and one of 1 at stride 1.
    assert depthwise.main(["--channels", "40", "--planes", "9", "--kernels", "3", "5", "--strides", "1", "2",
                           "--repeats", "1", "--sample-ms", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<!-- configuration: `python bench/depthwise.py --channels 40")
    rows = [line for line in text.splitlines() if line.startswith("| dw ")]
    assert [r.split(" | ")[0] for r in rows] == ["| dw 40 k3s1 @9", "| dw 40 k3s2 @9", "| dw 40 k5s1 @9",
                                                 "| dw 40 k5s2 @9"]
    assert "Issue 28's depthwise line" in text and not out.with_suffix(".md.tmp").exists()
