"""Runs measurements in worker processes, one process per candidate, one at a time.

One at a time because measurements share the cores; one process each because a kernel
that crashes or hangs must fail only its candidate: a non-zero exit, unreadable output or
a run past ``timeout_s`` is recorded as that candidate's error and tuning goes on.
``measure_together`` is the exception: kernels already measured alone, timed in one
process so that their times compare (worker.py).

``LocalRunner`` puts this machine behind the interface the search measures through, which
a Ray cluster (tune/cluster.py) also has: ``submit`` a candidate's source and Ms, ``wait``
for results as they come, ``time_together`` kernels in chunks of M (one process each).
Here a ``wait`` builds everything submitted (a few compiles at a time) and measures it one
candidate after another: the search's synchronous round, as before there was a cluster.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Optional, Sequence

from .builder import Built, build_source
from .machine import stamp


# Bytes of B copies a cold measurement cycles through: several times any last-level cache.
COLD_BYTES = 256 << 20


@dataclass(frozen=True)
class RunnerConfig:
    threads: int = 1
    repeats: int = 5  # rounds of one timed sample per M; the fastest sample is kept (worker.py)
    sample_s: float = 0.002  # each sample runs enough calls to last about this long
    timeout_s: float = 60.0
    # > 0: each call reads its own packed copy of B, cycling through copies totalling at
    # least this many bytes (well past the last-level cache): weights cold, as in a model.
    cold_bytes: int = 0


@dataclass
class Result:
    seconds: dict[int, float] = field(default_factory=dict)
    error: Optional[str] = None
    # The machine that made it (tune/machine.py), recorded with it; None: not said.
    machine: Optional[dict] = None


def measure(built: Built, workload, ms: Sequence[int], config: RunnerConfig = RunnerConfig()) -> Result:
    """Times ``built`` at each of ``ms`` (the workload's dynamic dim: M, or T for a batched
    GEMM); ``workload`` is a GemmWorkload or BatchedGemmWorkload (workload.py)."""
    if built.library is None:
        return Result(error=built.error or "not built")
    out = _run_worker({"library": str(built.library)}, workload, ms, config)
    if isinstance(out, Result):
        return out
    return _seconds(out)


def measure_together(builts: Sequence[Built], workload, ms: Sequence[int], config: RunnerConfig = RunnerConfig(),
                     timeout_s: Optional[float] = None) -> list[Result]:
    """Times every one of ``builts`` at each of ``ms`` in one worker process, on the same
    buffers, samples interleaved (worker.py): comparable with each other as separate
    processes are not. One failing library fails them all (one process); the tuner uses
    this for kernels already measured alone."""
    failed = next((b for b in builts if b.library is None), None)
    if failed is not None:
        return [Result(error=failed.error or "not built")] * len(builts)
    out = _run_worker({"libraries": [str(b.library) for b in builts]}, workload, ms, config, timeout_s)
    if isinstance(out, Result):
        return [out] * len(builts)
    return [_seconds(lib) for lib in out["libraries"]]


def _seconds(reply: dict) -> Result:
    """A Result from one library's part of the worker's reply ({"seconds": {M: s}})."""
    return Result(seconds={int(m): float(s) for m, s in reply["seconds"].items()})


def _run_worker(libraries: dict, workload, ms: Sequence[int], config: RunnerConfig,
                timeout_s: Optional[float] = None) -> dict | Result:
    """The worker's reply, or a Result holding its error."""
    req = {**libraries, "workload": workload.request(), "ms": list(ms), "threads": config.threads,
           "repeats": config.repeats, "sample_s": config.sample_s, "cold_bytes": config.cold_bytes}
    # The same thread count for OpenMP and for numpy's BLAS (used by the correctness check).
    env = dict(os.environ, OMP_NUM_THREADS=str(config.threads), OPENBLAS_NUM_THREADS=str(config.threads))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    timeout = timeout_s or config.timeout_s
    try:
        proc = subprocess.run([sys.executable, "-m", "shapeshift.tune.worker"], input=json.dumps(req),
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Result(error=f"timeout after {timeout:g} s")
    if proc.returncode == -signal.SIGINT:
        # Ctrl-C reaches the worker too (one process group), and may end it before the tuner
        # sees it: the user's interrupt, not a broken candidate, which would be stored as
        # failed and never measured again by a resumed run.
        raise KeyboardInterrupt
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return Result(error=f"worker crashed (exit status {proc.returncode}) {tail[0]}".strip())
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Result(error="worker wrote no result")
    if "error" in out:
        return Result(error=out["error"])
    return out


class LocalRunner:
    """This machine as the search's measurer (module docstring). One slot: measurements share
    the cores. ``measure_fn`` and ``together_fn`` are what times a built library (by default
    this module's; the tuner passes the ones it imported, which tests replace to count the
    worker processes)."""

    def __init__(self, cache_dir: Path, jobs: int = 2, measure_fn: Callable = measure,
                 together_fn: Callable = measure_together):
        self.cache_dir, self.jobs = cache_dir, max(1, jobs)
        self.measure_fn, self.together_fn = measure_fn, together_fn
        self._queue: dict[int, tuple] = {}  # ticket -> (source, workload, ms, config), in submission order
        self._tickets = itertools.count()

    def slots(self, threads: int) -> int:
        return 1

    def _build(self, sources: Sequence[str]) -> list[Built]:
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return list(pool.map(lambda s: build_source(s, self.cache_dir), sources))

    def submit(self, source: str, workload, ms: Sequence[int], config: RunnerConfig) -> int:
        ticket = next(self._tickets)
        self._queue[ticket] = (source, workload, list(ms), config)
        return ticket

    def wait(self, tickets: Collection[int]) -> list[tuple[int, Result]]:
        """Every queued candidate built, then measured one at a time: all of them, in order."""
        queued, self._queue = self._queue, {}
        built = self._build([source for source, *_ in queued.values()])
        done = [(ticket, self.measure_fn(b, workload, ms, config))
                for (ticket, (_, workload, ms, config)), b in zip(queued.items(), built)]
        stamp(result for _, result in done)
        return done

    def cancel(self, tickets: Collection[int]) -> None:
        for ticket in tickets:
            self._queue.pop(ticket, None)

    def time_together(self, sources: Sequence[str], workload, chunks: Sequence[Sequence[int]], config: RunnerConfig,
                      timeouts: Sequence[float]) -> list[list[Result]]:
        """The kernels timed together, one worker process per chunk of Ms, one after another."""
        built = self._build(sources)
        parts = [self.together_fn(built, workload, list(ms), config, timeout_s=t) for ms, t in zip(chunks, timeouts)]
        stamp(result for results in parts for result in results)
        return parts
