"""Where a native run spends its time: per-step timers and their summaries.

``InferenceSession(model, backend="native", profile=True)`` builds the program with a
timer around every native step, inside the generated C (codegen/program.py), and the VM
times each fallback step around its NumPy evaluator. ``session.profile()`` returns one
:class:`StepTime` per step, in program order; an If whose taken branch runs natively is a
row of kind ``"branch"`` whose time includes its branch's own rows, which follow it.

What the timers leave out is the VM's own work between steps (the plan lookup, the
pointer table, the output arrays): compare the rows' sum with a run's wall time to see it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

BRANCH = "branch"


@dataclass(frozen=True)
class StepTime:
    program: str  # "" for the model's graph, an If branch's program prefix otherwise
    step: int  # index in that program's steps
    op_type: str
    node: str  # its name, else its first output's
    kind: str  # "native", "fallback", "alias" (no work) or "branch"
    calls: int
    seconds: float  # over all calls


def exclusive(rows: Iterable[StepTime]) -> list[StepTime]:
    """The rows whose times do not contain other rows' (every kind but "branch")."""
    return [r for r in rows if r.kind != BRANCH]


def by_op_type(rows: Iterable[StepTime]) -> list[tuple[str, int, float]]:
    """(op type, steps, seconds) over the exclusive rows, slowest first."""
    seconds: dict[str, float] = defaultdict(float)
    steps: dict[str, int] = defaultdict(int)
    for row in exclusive(rows):
        if row.calls:
            seconds[row.op_type] += row.seconds
            steps[row.op_type] += 1
    return sorted(((op, steps[op], t) for op, t in seconds.items()), key=lambda item: -item[2])


def format_profile(rows: list[StepTime], runs: int, top: int = 12) -> str:
    """A plain-text report: time per run by op type, then the slowest steps."""
    timed = [r for r in exclusive(rows) if r.calls]
    total = sum(r.seconds for r in timed)
    if not timed or runs < 1:
        return "no step ran"
    share = (lambda t: 100.0 * t / total) if total > 0 else (lambda t: 0.0)
    lines = [f"time per run in the steps: {1e3 * total / runs:.3f} ms over {len(timed)} steps ({runs} run(s))",
             "", f"{'op type':<24} {'steps':>5} {'ms/run':>9} {'share':>6}"]
    for op, count, seconds in by_op_type(timed):
        lines.append(f"{op:<24} {count:>5} {1e3 * seconds / runs:>9.3f} {share(seconds):>5.1f}%")
    lines += ["", f"slowest {min(top, len(timed))} steps:", f"{'step':>6} {'op type':<20} {'kind':<8} "
              f"{'ms/run':>9} {'share':>6}  node"]
    for row in sorted(timed, key=lambda r: -r.seconds)[:top]:
        where = f"{row.program}:{row.step}" if row.program else str(row.step)
        lines.append(f"{where:>6} {row.op_type:<20} {row.kind:<8} {1e3 * row.seconds / runs:>9.3f} "
                     f"{share(row.seconds):>5.1f}%  {row.node}")
    return "\n".join(lines)
