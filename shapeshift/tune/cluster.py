"""Measurements on a Ray cluster (``shapeshift tune --cluster ADDRESS``).

Tuning outgrows one machine; Ray, an existing distributed engine, runs the measurements
instead of an RPC layer of our own. The driver keeps everything else where it is: the
search, the cost model, the builds (one compiler per candidate, a few at a time) and the
SQLite database, which only it writes. A measurement becomes a Ray task:

- it carries the candidate's family and schedule (builder.CandidateSource), which the node
  writes out as C and compiles into its own cache (no shared filesystem to set up, and the
  driver neither writes nor compiles C: a round of candidates scales with the nodes), then runs the same worker process a local measurement runs
  (tune/runner.py);
- it asks for ``num_cpus`` = the thread count it measures with, so two measurements never
  share a core;
- it returns the node it ran on and that node's CPU (target key), which the database
  records with the measurement.

The interface is the one the search measures through (runner.LocalRunner has it too):
``submit`` a candidate and get a ticket; ``wait`` returns the results ready now (at least
one) so that the search draws the next candidates while the others run, and no slot waits
for the slowest candidate of a round; ``time_together`` times kernels together with the
Ms split into chunks, one task each, so that the joint timings also shrink with the nodes
(kernels are compared at one M, and each M is timed in one process).

Failures: a kernel that crashes or hangs its worker process is that candidate's error,
returned like any result and recorded once as failed (the task itself succeeded: it is not
retried elsewhere). A Ray worker process or node that dies mid-task (the task's process,
not the measurement's) makes Ray run the task again on another one (``MAX_RETRIES``), and
the candidate is not marked failed. A task that still cannot run (every worker lost) stops
the tune with a ShapeshiftError; what was measured before is in the database.

Every node must have one CPU model and flag set: candidates are compared only within one
CPU model, and the run's measurements and selection are recorded for it. A cluster of
mixed machines is refused, naming the models (tune each kind on a cluster of its own).

Addresses: ``auto`` (``RAY_ADDRESS``, or a cluster started on this machine), ``local`` or
``local:N`` (an in-process Ray with N CPUs, every core by default), or a Ray address
(``HOST:PORT``, ``ray://HOST:PORT``). Ray is optional: ``pip install 'shapeshift[cluster]'``.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import socket
import time
from typing import Collection, Optional, Sequence

from ..errors import ShapeshiftError
from ..target import Target
from ..target.description import host_target, target_from_json, target_to_json
from .builder import CandidateSource, build_source
from .runner import Result, RunnerConfig, measure, measure_together

INSTALL_HINT = "pip install 'shapeshift[cluster]'"
# Runs of a task whose Ray worker process or node died, before the tune stops.
MAX_RETRIES = 3
_LOCAL = re.compile(r"local(?::(\d+))?")


class ClusterError(ShapeshiftError):
    """The cluster cannot be reached, refuses us, or lost every worker."""


def _import_ray(local: bool = False):
    if local:
        # A cluster of this machine alone listens on the loopback address only: Ray otherwise
        # replaces 127.0.0.1 by the machine's routable address (services.resolve_ip_for_localhost)
        # unless multi-machine clusters are off, which this environment variable says (read
        # when Ray is imported: its processes inherit it) ...
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--cluster needs Ray, which is not installed: {INSTALL_HINT}") from None
    if local:
        try:  # ... and this constant, in a process that had imported Ray before
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
        except (ImportError, AttributeError):  # another Ray: its own default address
            pass
    return ray


# Seconds to wait for a TCP connection to a cluster's address before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """A ClusterError at once when nothing answers at HOST:PORT: ray.init waits minutes."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--cluster {address!r}: expected auto, local[:N] or a Ray address HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc} (start one with "
                           "`ray start --head`, or use --cluster local:N)") from None


def _node() -> tuple[str, dict]:
    """This process's Ray node id and CPU (run in a task: the node it ran on)."""
    import ray

    return ray.get_runtime_context().get_node_id(), target_to_json(host_target())


def _measure_task(source: "str | CandidateSource", workload, ms: list[int], config: RunnerConfig
                  ) -> tuple[Result, str, dict, float]:
    """One candidate built and measured on whichever node runs it: the driver compiles
    nothing, so a round of candidates scales with the nodes, not with the driver's cores.
    Also returns the node, its CPU and the task's seconds on the node."""
    start = time.perf_counter()
    # Compiled on this node into its own cache (a compile error fails the candidate).
    result = measure(build_source(source), workload, ms, config)
    return (result, *_node(), time.perf_counter() - start)


def _together_task(sources: Sequence["str | CandidateSource"], workload, ms: list[int], config: RunnerConfig,
                   timeout_s: Optional[float]) -> tuple[list[Result], str, dict, float]:
    start = time.perf_counter()
    results = measure_together([build_source(s) for s in sources], workload, ms, config, timeout_s)
    return (results, *_node(), time.perf_counter() - start)


class RayCluster:
    """A connection to a Ray cluster that measures candidates (see the module docstring)."""

    def __init__(self, address: str):
        local = _LOCAL.fullmatch(address)
        ray = _import_ray(local=bool(local))
        self.ray = ray
        self.address = address
        kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            if local:
                cpus = int(local.group(1)) if local.group(1) else os.cpu_count()
                # Our own cluster on this machine only: nothing listens beyond 127.0.0.1. A new
                # one (address "local"): without it ray.init joins a Ray already running here
                # (or at RAY_ADDRESS), whose CPUs are not the N asked for.
                ray.init(address="local", num_cpus=cpus, **kwargs)
            else:
                if address != "auto":
                    _check_reachable(address)
                ray.init(address=None if address == "auto" else address, **kwargs)
        except ConnectionError as exc:
            raise ClusterError(f"cannot reach the Ray cluster at {address!r}: {exc} (start one with "
                               "`ray start --head`, or use --cluster local:N)") from None
        except (RuntimeError, ValueError) as exc:
            raise ClusterError(f"Ray cluster at {address!r} refused the connection: {str(exc).splitlines()[0]} "
                               f"(the cluster's Ray version must match this one, {ray.__version__})") from None
        self._measure = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_measure_task)
        self._together = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(_together_task)
        self.counts: collections.Counter = collections.Counter()  # measurements per node
        # Seconds each task took on its node: candidates (build + measurement), and each
        # joint timing's chunks as (Ms, seconds).
        self.task_seconds: list[float] = []
        self.joint_tasks: list[tuple[list[int], float]] = []
        self._refs: dict[int, object] = {}  # ticket -> the running task's ObjectRef
        self._tickets = itertools.count()
        self.target = self._cluster_target()

    # ---- the nodes ---------------------------------------------------------------------
    def nodes(self) -> list[tuple[str, str, int]]:
        """(node id, address, CPUs) of every live node."""
        return [(n["NodeID"], n.get("NodeManagerAddress", "?"), int(n.get("Resources", {}).get("CPU", 0)))
                for n in self.ray.nodes() if n.get("Alive")]

    def _cluster_target(self) -> Target:
        """The one CPU every node has (a probe task per node); a ClusterError naming the
        models when they differ."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = self.ray.remote(num_cpus=0)(_node)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
                for node, _, _ in self.nodes()]
        found = {}
        for node, data in self.ray.get(refs):
            target = target_from_json(data)
            found.setdefault(target.key, (target, []))[1].append(node[:8])
        if len(found) > 1:
            models = "; ".join(f"{t.cpu_model} (target key {key}) on {', '.join(nodes)}"
                               for key, (t, nodes) in sorted(found.items()))
            raise ClusterError(f"the cluster mixes CPU models, whose measurements do not compare: {models}; "
                               "tune on a cluster of one kind of machine")
        return next(iter(found.values()))[0]

    def describe(self) -> str:
        nodes = self.nodes()
        cpus = sum(c for _, _, c in nodes)
        lines = [f"cluster {self.address}: {len(nodes)} node(s), {cpus} CPU(s), {self.target.cpu_model} "
                 f"(target key {self.target.key})"]
        lines += [f"  node {node[:8]} at {addr}: {c} CPU(s)" for node, addr, c in nodes]
        return "\n".join(lines)

    # ---- measuring ---------------------------------------------------------------------
    def _get(self, ref, what: str):
        try:
            return self.ray.get(ref)
        except (self.ray.exceptions.WorkerCrashedError, self.ray.exceptions.NodeDiedError,
                self.ray.exceptions.RayTaskError, self.ray.exceptions.RaySystemError) as exc:
            raise ClusterError(f"the cluster could not run {what} after {MAX_RETRIES + 1} tries "
                               f"(every worker lost?): {str(exc).splitlines()[0]}") from None

    def slots(self, threads: int) -> int:
        """Measurements of ``threads`` threads the cluster runs at once."""
        return max(1, sum(c for _, _, c in self.nodes()) // max(1, threads))

    def submit(self, source: "str | CandidateSource", workload, ms: Sequence[int], config: RunnerConfig) -> int:
        """One candidate built and measured as a task of its own; a ticket for ``wait``."""
        ticket = next(self._tickets)
        self._refs[ticket] = self._measure.options(num_cpus=config.threads).remote(source, workload, list(ms),
                                                                                   config)
        return ticket

    def wait(self, tickets: Collection[int]) -> list[tuple[int, Result]]:
        """The results of ``tickets`` ready now, at least one (blocks until then), in the
        order they were submitted: with one worker, tasks finish in that order, and a search
        that takes them one by one is as reproducible as a synchronous one."""
        refs = {self._refs[t]: t for t in tickets}
        self.ray.wait(list(refs), num_returns=1)
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        out = []
        for ticket in sorted(refs[r] for r in ready):
            result, node, _, seconds = self._get(self._refs.pop(ticket), "a measurement")
            self.counts[node[:8]] += 1
            self.task_seconds.append(seconds)
            out.append((ticket, result))
        return out

    def cancel(self, tickets: Collection[int]) -> None:
        """Stop tasks whose results are no longer wanted (a tune that stopped)."""
        for ticket in tickets:
            ref = self._refs.pop(ticket, None)
            if ref is not None:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already finished, or its worker already gone: nothing to stop
                    pass

    def measure_many(self, jobs: Sequence[tuple[str, list[int]]], workload, config: RunnerConfig) -> list[Result]:
        """Every (candidate's measurement source, Ms) as its own task, all at once; the results
        in the order of ``jobs``."""
        tickets = [self.submit(source, workload, ms, config) for source, ms in jobs]
        results: dict[int, Result] = {}
        while len(results) < len(tickets):
            results.update(self.wait([t for t in tickets if t not in results]))
        return [results[t] for t in tickets]

    def time_together(self, sources: Sequence["str | CandidateSource"], workload, chunks: Sequence[Sequence[int]],
                      config: RunnerConfig,
                      timeouts: Sequence[float]) -> list[list[Result]]:
        """The kernels built and timed together (runner.measure_together), one task per chunk
        of Ms, all at once; per chunk, a Result per kernel."""
        refs = [self._together.options(num_cpus=config.threads).remote(list(sources), workload, list(ms), config, t)
                for ms, t in zip(chunks, timeouts)]
        out = []
        for ms, ref in zip(chunks, refs):
            results, node, _, seconds = self._get(ref, "a joint timing")
            self.counts[node[:8]] += 1
            self.joint_tasks.append((list(ms), seconds))
            out.append(results)
        return out

    def summary(self) -> str:
        return "measurements per node: " + (", ".join(f"{node} {n}" for node, n in sorted(self.counts.items()))
                                            or "none")

    def shutdown(self) -> None:
        self.ray.shutdown()
