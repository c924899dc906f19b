"""Runs measurements in worker processes, one process per candidate, one at a time.

One at a time because measurements share the cores; one process each because a kernel
that crashes or hangs must fail only its candidate: a non-zero exit, unreadable output or
a run past ``timeout_s`` is recorded as that candidate's error and tuning goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .builder import Built


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


def measure(built: Built, workload, ms: Sequence[int], config: RunnerConfig = RunnerConfig()) -> Result:
    """Times ``built`` at each of ``ms`` (the workload's dynamic dim: M, or T for a batched
    GEMM); ``workload`` is a GemmWorkload or BatchedGemmWorkload (workload.py)."""
    if built.library is None:
        return Result(error=built.error or "not built")
    req = {"library": str(built.library), "workload": workload.request(), "ms": list(ms), "threads": config.threads,
           "repeats": config.repeats, "sample_s": config.sample_s, "cold_bytes": config.cold_bytes}
    # The same thread count for OpenMP and for numpy's BLAS (used by the correctness check).
    env = dict(os.environ, OMP_NUM_THREADS=str(config.threads), OPENBLAS_NUM_THREADS=str(config.threads))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, "-m", "shapeshift.tune.worker"], input=json.dumps(req),
                              capture_output=True, text=True, timeout=config.timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Result(error=f"timeout after {config.timeout_s:g} s")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return Result(error=f"worker crashed (exit status {proc.returncode}) {tail[0]}".strip())
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Result(error="worker wrote no result")
    if "error" in out:
        return Result(error=out["error"])
    return Result(seconds={int(m): float(s) for m, s in out["seconds"].items()})
