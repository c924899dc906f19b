"""bench/tune_dynamic.py: a short run on a small MobileNet-style net of dynamic image size
(one trial per task, one held-out size, one round) in a process of its own: the range's
tuning and the size's run, every session's output matches onnxruntime (checked inside: the
bench exits non-zero otherwise), and the file names the machine, the wall times and a row
per held-out size with both ratios; the held-out sizes are multiples of 32 in the range
and none of them a sampled size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import tune_dynamic  # noqa: E402

from .test_tune_conv_nchwc import _mobile  # noqa: E402


def test_held_out_sizes_are_in_the_range_and_never_sampled():
    taken = {(96, 96), (128, 160)}
    sizes = tune_dynamic.held_out(96, 320, 8, taken)
    assert len(set(sizes)) == 8 and not set(sizes) & taken
    assert all(96 <= v <= 320 and v % 32 == 0 for s in sizes for v in s)
    assert sizes[0][0] == 96 and sizes[1][0] == 320  # the range's ends


def test_a_range_tuning_and_a_per_size_one_are_compared_and_written(tmp_path):
    model = onnx.load(_mobile(tmp_path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"  # the bench wants a named batch dim
    path = tmp_path / "mobile_b.onnx"
    onnx.save(model, path)
    out = tmp_path / "dyn.md"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tune_dynamic.py"), "--model", str(path),
                           "--range", "64:128", "--trials", "1", "--held-out", "1", "--runs", "2", "--rounds", "1",
                           "--workdir", str(tmp_path / "work"), "--output", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    assert "measured FMA peak" in text and "Tuning wall time: range" in text
    rows = [line for line in text.splitlines() if line.startswith("| 64x")]
    assert len(rows) == 1 and len(rows[0].split("|")) == 9
    assert "per-size / range: min" in text and not out.with_suffix(".tmp").exists()
