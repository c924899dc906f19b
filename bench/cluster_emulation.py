"""A cluster of W workers emulated in real time, for the tuning driver to run against.

bench/cluster.py measures tuning on one and two real Ray workers; how the wall time falls
with 8, 32 or 128 workers, and when the driver (the one process every result passes
through) becomes the bottleneck, it finds out with this emulation: the real search
(shapeshift/tune/search.py: its draws, the cost model and its background fit, the SQLite
database) runs in this process against an object with the cluster's measuring interface
(submit, wait, cancel, time_together) whose W workers exist only as clocks:

- a candidate task submitted now starts on the first worker free (now, or when that one
  is), lasts the next duration of the measured 1-worker run's candidate tasks (build +
  measurement on the node, in the order they ran, cycled), plus Ray's measured round trip;
- ``wait`` sleeps until the first of the tasks asked for is done, then returns every one
  done by then, in the order submitted, as RayCluster.wait does;
- the driver side of Ray is paid as the driver would pay it: a busy wait of the measured
  seconds of a ``.remote()`` call per submit and of a ``ray.get`` per result;
- ``time_together`` splits like the real one (one task per chunk of Ms, at once): each
  chunk lasts the measured fixed cost of a joint task plus the chunk's estimated cost
  (the tuner's own estimate, ``Tuner.joint_costs``) scaled by the measured ratio of time
  taken to time estimated in the 1-worker run's joint timings.

The measured seconds are made up (a candidate's GFLOPS is a hash of its schedule): they
steer which candidates the search draws, not what the driver's work per draw costs. What
the emulation measures is the driver's own CPU time (``time.thread_time`` of this thread,
the background fit's child process excluded: it runs on another core of the driver's
machine) and the wall time.
"""

from __future__ import annotations

import itertools
import time
import zlib
from typing import Collection, Sequence

from shapeshift.target import host_target
from shapeshift.tune.builder import CandidateSource
from shapeshift.tune.runner import Result


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _gflops(source) -> float:
    text = source.schedule_json if isinstance(source, CandidateSource) else str(source)
    return 20.0 + zlib.crc32(text.encode()) % 200


class EmulatedCluster:
    def __init__(self, workers: int, trace: dict):
        self.target = host_target()
        self.workers = workers
        self.trace = trace
        self.free = [0.0] * workers  # perf_counter time at which each worker is next free
        self.durations = itertools.cycle(trace["task_seconds"])
        self.jobs: dict[int, tuple[float, object, list[int], object]] = {}  # ticket -> (end, source, Ms, workload)
        self.tickets = itertools.count()
        self.worker_s = 0.0  # seconds of work handed to the workers (what one worker would take)
        self.tuner = None  # set by the caller: time_together reads the tuner's estimate of its cost
        joint = [t for task in trace["joint"] for t in task]
        estimated = sum(sum(t["costs"].values()) for t in joint)
        variable = sum(max(0.0, t["seconds"] - trace["joint_fixed_s"]) for t in joint)
        self.joint_scale = variable / estimated if estimated else 1.0

    def slots(self, threads: int) -> int:
        return self.workers

    def _start(self, seconds: float) -> float:
        """A task of ``seconds`` on the first free worker; when it is done."""
        i = min(range(self.workers), key=self.free.__getitem__)
        end = max(time.perf_counter(), self.free[i]) + seconds + self.trace["overhead_s"]
        self.free[i] = end
        self.worker_s += seconds
        return end

    def submit(self, source, workload, ms: Sequence[int], config) -> int:
        _spin(self.trace["submit_s"])
        ticket = next(self.tickets)
        self.jobs[ticket] = (self._start(next(self.durations)), source, list(ms), workload)
        return ticket

    def wait(self, tickets: Collection[int]) -> list[tuple[int, Result]]:
        first = min(self.jobs[t][0] for t in tickets)
        delay = first - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        now = time.perf_counter()
        out = []
        for ticket in sorted(t for t in tickets if self.jobs[t][0] <= now):
            _, source, ms, workload = self.jobs.pop(ticket)
            _spin(self.trace["get_s"])
            g = _gflops(source)
            out.append((ticket, Result(seconds={m: workload.flops(m) / (g * 1e9) for m in ms})))
        return out

    def cancel(self, tickets: Collection[int]) -> None:
        for ticket in tickets:
            self.jobs.pop(ticket, None)

    def time_together(self, sources, workload, chunks, config, timeouts) -> list[list[Result]]:
        costs = self.tuner.joint_costs[-1]
        ends = []
        for chunk in chunks:
            _spin(self.trace["submit_s"])
            ends.append(self._start(self.trace["joint_fixed_s"] + self.joint_scale * sum(costs[m] for m in chunk)))
        delay = max(ends) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        out = []
        for chunk in chunks:
            _spin(self.trace["get_s"])
            out.append([Result(seconds={m: workload.flops(m) / (_gflops(s) * 1e9) for m in chunk}) for s in sources])
        return out
