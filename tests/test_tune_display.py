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


def test_the_estimate_counts_a_tasks_instances(capsys):
    """A task over instances times its shortlist at each of them: 110 instances are
    estimated longer than 6 at the same trials, and the total is the tasks' sum."""
    import argparse

    from shapeshift.cli.tune_cmd import SECONDS_PER_INSTANCE, SECONDS_PER_TRIAL, print_tasks
    from shapeshift.tune.extract import ConvTask

    tasks = [ConvTask((1, 1, 1, 1, 1, 1), {(1, 8, 1, 64 + i, 8, 0, 0, 0): 1.0 for i in range(n)}, (False, 8))
             for n in (110, 6)]
    args = argparse.Namespace(model="m", threads=1, strategy="dietcode", measure=None, trials=6, time_budget=None)
    print_tasks(tasks, args, TuneDisplay(terminal=False))
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "instance(s)" in line]
    minutes = [float(row[-1]) for row in rows]
    want = [(6 * SECONDS_PER_TRIAL + n * SECONDS_PER_INSTANCE) / 60 for n in (110, 6)]
    assert minutes == [round(w, 1) for w in want] and minutes[0] > minutes[1]
