"""How `shapeshift tune` shows a model's tuning: the task list, progress per task, the summary.

On a terminal they are drawn with rich: tables, and while a task runs a live status line
under its log (task, trials measured of those to measure, the best GFLOPS so far and the
task's ETA). Anywhere else (a pipe, a log file, CI) plain lines, one per event, which logs
and grep want: the same columns, aligned with spaces, and each progress line prefixed with
the task, the elapsed time and the ETA.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, Sequence


class TuneDisplay:
    def __init__(self, console=None, terminal: Optional[bool] = None):
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self.console = console
        if self.terminal and console is None:
            from rich.console import Console

            self.console = Console()
        self._live = None

    # ---- tables ------------------------------------------------------------------------
    def table(self, title: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()
              ) -> None:
        """A table: the first column left-aligned (names), the others right-aligned (numbers)."""
        if not self.terminal:
            if title:
                print(title)
            widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
            print("  " + " ".join(f"{h:>{w}}" for h, w in zip(header, widths)))
            for r in rows:
                print("  " + " ".join(f"{c:>{w}}" for c, w in zip(r, widths)))
            for note in notes:
                print("  " + note)
            return
        from rich.table import Table

        t = Table(title=title or None, title_justify="left")
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i == 0 else "right")
        for r in rows:
            t.add_row(*r)
        self.console.print(t)
        for note in notes:
            self.console.print(note, style="dim")

    def line(self, text: str) -> None:
        if self.terminal:
            self.console.print(text, highlight=False)
        else:
            print(text, flush=True)

    # ---- one task's progress -------------------------------------------------------------
    def progress(self, i: int, count: int, label: str, start: float, done: Callable[[], int],
                 trials: Callable[[], int], best: Callable[[], Optional[float]]) -> Callable[[str], None]:
        """The tuner's log function for task ``i`` of ``count``: each line, with (plain) or
        under (terminal) the task's trials ``done()`` of ``trials()``, the best GFLOPS so
        far and an ETA from the rate so far."""
        task_start = time.monotonic()

        def status() -> str:
            now = time.monotonic()
            eta = ""
            if done():
                left = max(trials() - done(), 0) * (now - task_start) / done()
                eta = f", task ETA {left:.0f} s"
            gflops = best()
            return (f"[{i + 1}/{count} {now - start:.0f} s{eta}]" if not self.terminal else
                    f"task {i + 1}/{count} {label}: trials {done()}/{trials()}"
                    + (f", best {gflops:.1f} GFLOPS" if gflops else "") + eta + f", {now - start:.0f} s in all")

        if not self.terminal:
            return lambda line: print(f"  {status()}{line}", flush=True)
        from rich.live import Live

        if self._live is not None:
            self._live.stop()
        self._live = Live(status(), console=self.console, refresh_per_second=4, transient=True)
        self._live.start()

        def log(line: str) -> None:
            self.console.print(line, highlight=False)
            self._live.update(status())

        return log

    def task_done(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
