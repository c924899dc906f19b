"""bench/rnn.py's table: the ratios less the per-run floor, where a time is not above its floor."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import rnn  # noqa: E402


def _row(op: str, native_s: float, ort_s: float) -> dict:
    return {"case": rnn.Case(op, 1, 64, 1), "threads": 2, "native": native_s, "onnxruntime": ort_s, "diff": 0.0}


def test_rows_at_or_under_the_floor_have_no_net_ratio_and_leave_the_geomean():
    floors = {2: {"native": 7e-6, "onnxruntime": 8e-6}}
    rows = [_row("LSTM", 6.9e-6, 10e-6),   # native under its floor: no net ratio
            _row("LSTM", 17e-6, 18e-6),    # (17 - 7) / (18 - 8) = 1.0
            _row("LSTM", 11e-6, 24e-6),    # 4 / 16 = 0.25
            _row("GRU", 12e-6, 13e-6)]     # 5 / 5 = 1.0
    assert rnn._net_ratio(rows[0], floors) is None
    assert abs(rnn._net_ratio(rows[2], floors) - 0.25) < 1e-12
    text = rnn.table(rows, floors)
    assert "| LSTM b1 h64 t1 | 2 | 0.0069 | 0.0100 | 0.69 | below the floor |" in text
    # LSTM's geomean over the two rows above the floor, sqrt(1.0 * 0.25), saying what it left out.
    assert "| **geomean LSTM** | 2 | | | " in text and "**0.50** (1 of 3 below the floor)" in text
    assert "| **geomean GRU** | 2 | | | **0.92** | **1.00** | | |" in text  # 12 / 13; 5 / 5
    assert "nan" not in text


def test_the_target_is_judged_on_the_unrounded_geomean():
    """A geomean of 0.8046 prints as 0.80 in the table; the verdict line says NOT met (the
    Zen 3 run, bench/results/rnn_zen3.md), and 0.79 is met."""
    floors = {2: {"native": 1e-6, "onnxruntime": 1e-6}}
    over = rnn.table([_row("LSTM", 0.8046e-3, 1e-3), _row("GRU", 0.8046e-3, 1e-3)], floors)
    assert "**geomean all** | 2 | | | **0.80**" in over
    assert "geomean <= 0.8: 0.8046, NOT met." in over
    under = rnn.table([_row("LSTM", 0.79e-3, 1e-3)], floors)
    assert "geomean <= 0.8: 0.7900, met." in under
