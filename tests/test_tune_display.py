"""The tune display (cli/tune_display.py): rich tables and a live status line on a terminal,
plain aligned lines elsewhere."""

from __future__ import annotations

import io
import time

from shapeshift.cli.tune_display import TuneDisplay

HEADER = ["task", "trials", "GFLOPS"]
ROWS = [["[768, 3072]", "32", "140.2"], ["bmm:12:...", "8", "61.0"]]


def test_plain_lines_off_a_terminal(capsys):
    display = TuneDisplay(terminal=False)
    display.table("2 task(s)", HEADER, ROWS, ["a note"])
    log = display.progress(0, 2, "[768, 3072]", time.monotonic(), lambda: 4, lambda: 32, lambda: 99.5)
    log(" round 1: trials 4")
    display.task_done()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 task(s)" and out[1].split() == HEADER
    assert out[2] == "  [768, 3072]     32  140.2"  # right-aligned in columns as wide as their widest cell
    assert out[4] == "  a note"
    assert out[5].startswith("  [1/2 ") and "task ETA" in out[5] and out[5].endswith("] round 1: trials 4")


def test_rich_tables_and_a_live_status_on_a_terminal():
    from rich.console import Console

    buffer = io.StringIO()
    display = TuneDisplay(Console(file=buffer, force_terminal=True, width=120, color_system=None), terminal=True)
    display.table("2 task(s)", HEADER, ROWS)
    log = display.progress(1, 2, "bmm:12:...", time.monotonic(), lambda: 8, lambda: 8, lambda: 61.0)
    log("  round 2: trials 8")
    display.task_done()
    text = buffer.getvalue()
    assert "┃ task" in text or "│ task" in text  # a drawn table, not spaced columns
    assert "[768, 3072]" in text and "140.2" in text
    assert "round 2: trials 8" in text
    assert "task 2/2 bmm:12:...: trials 8/8, best 61.0 GFLOPS" in text
