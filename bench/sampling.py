"""Timing helpers shared by the bench scripts."""

from __future__ import annotations

import time
from typing import Callable

Sampler = Callable[[int], float]  # calls -> seconds per call


def python_loop(fn: Callable[[], object]) -> Sampler:
    """A sampler timing ``fn`` in a Python loop (so the call overhead counts, as it would
    in a Python program)."""
    def sample(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls
    return sample
