"""bench/gemm_tiles.py: a short run (two tiles, one small M, one sample) in a process of its
own (the script pins its threads and OpenBLAS's kernel before anything loads): every tile's
result is checked against NumPy inside, and the file names the machine and each tile's row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_tiles_are_checked_timed_and_written(tmp_path):
    # Two ymm tiles every AVX2 CPU holds in its 16 registers (3x32 needed 17: it ran only
    # where AVX-512 gives ymm 32 registers, and failed on an AVX2-only AMD Zen 2).
    out = tmp_path / "tiles.md"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gemm_tiles.py"), "--tiles", "6x16y", "4x16y",
                           "--ms", "5", "--rounds", "1", "--sample-ms", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "measured FMA peak" in text and "NumPy's OpenBLAS ran" in text
    rows = [line for line in text.splitlines() if line.startswith("M=")]
    assert len(rows) == 4  # the four BERT-base weight shapes at M = 5
    for row in rows:
        assert row.startswith("M=   5 ") and "6x16 ymm" in row and "4x16 ymm" in row
    assert sum(line.startswith("- ") and "NumPy's speed geomean" in line for line in text.splitlines()) == 2
    assert not out.with_suffix(".tmp").exists()
