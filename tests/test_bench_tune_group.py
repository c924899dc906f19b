"""bench/tune_group.py: a short run (a 1-layer encoder, one trial per task, one round) in a
process of its own: both tunings run, the sessions with their records match onnxruntime
(checked inside: the bench exits non-zero otherwise), and the file names the machine, both
tunings' rows and every tool's latency row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_grouped_and_per_instance_tunings_are_compared_and_written(tmp_path):
    out = tmp_path / "group.md"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tune_group.py"), "--layers", "1", "--hidden", "64",
                           "--seq", "8", "--trials", "1", "--runs", "2", "--rounds", "1", "--workdir",
                           str(tmp_path / "work"), "--output", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "measured FMA peak" in text
    assert "| grouped | 1 |" in text and "| per-instance | 3 |" in text  # 3 weight shapes: one group
    for tool in ("native default", "native grouped", "native per-instance", "onnxruntime"):
        assert f"| {tool} |" in text
    assert "less wall time than per-instance" in text and not out.with_suffix(".tmp").exists()
