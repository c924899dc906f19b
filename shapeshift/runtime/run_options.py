"""Per-run options: a deadline and a stop request for one ``InferenceSession.run`` call.

A model can ask for more work than any service would grant it: a Loop whose trip count is
2**31 - 1 runs for hours on either backend (onnxruntime's too). ``RunOptions(timeout_s=...)``
bounds a run: once the deadline passes, the next Loop or Scan iteration (or If branch) stops
the run with a ``RunStoppedError`` naming the node and how far it got. ``terminate = True``,
set from another thread while the run is under way, stops it the same way (onnxruntime's
``RunOptions.terminate``; an onnxruntime ``RunOptions`` object is accepted for it).

The check runs where the evaluator enters a subgraph, the only place where a valid model's
running time is not bounded by its shapes; a single kernel call is not interrupted. The
options live in a context variable, so threads sharing one session each see their own run's.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import RunStoppedError


@dataclass
class RunOptions:
    """``timeout_s``: wall seconds the run may take (None: no limit); ``terminate``: stop now."""

    timeout_s: Optional[float] = None
    terminate: bool = False

    def __post_init__(self):
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"RunOptions.timeout_s must be a positive number of seconds, got {self.timeout_s!r}")


_current: contextvars.ContextVar[Optional[tuple[Any, Optional[float], float]]] = \
    contextvars.ContextVar("shapeshift_run_options", default=None)


class active:
    """``with active(options):`` the options of the run under way in this thread."""

    def __init__(self, options: Any):
        self.options = options
        self.token = None

    def __enter__(self):
        if self.options is not None:
            start = time.monotonic()
            timeout = getattr(self.options, "timeout_s", None)
            self.token = _current.set((self.options, None if timeout is None else start + timeout, start))
        return self

    def __exit__(self, *exc):
        if self.token is not None:
            _current.reset(self.token)
        return False


def check(where: str) -> None:
    """Raise RunStoppedError if this thread's run is past its deadline or asked to stop."""
    state = _current.get()
    if state is None:
        return
    options, deadline, start = state
    if getattr(options, "terminate", False):
        raise RunStoppedError(f"the run was terminated (RunOptions.terminate) at {where}")
    if deadline is not None and time.monotonic() > deadline:
        raise RunStoppedError(f"the run passed its deadline (RunOptions.timeout_s={options.timeout_s:g}, "
                              f"{time.monotonic() - start:.1f} s elapsed) at {where}")
