"""Measurements on a Ray cluster (``shapeshift tune --cluster ADDRESS``).

Tuning outgrows one machine; Ray, an existing distributed engine, runs the measurements
instead of an RPC layer of our own. The driver keeps everything else where it is: the
search, the cost model, the builds (one compiler per candidate, a few at a time) and the
SQLite database, which only it writes. A measurement becomes a Ray task:

- it carries the candidate's family and schedule (builder.CandidateSource), which the node
  writes out as C and compiles into its own cache (no shared filesystem to set up, and the
  driver neither writes nor compiles C: a round of candidates scales with the nodes), then
  runs the same worker process a local measurement runs (tune/runner.py);
- it asks for ``num_cpus`` = the thread count it measures with, so two measurements never
  share a core;
- it returns the node it ran on and that node's CPU (target description), which the driver
  checks against the CPU model it sent the task to, under whose target key the database
  records the measurement.

The interface is the one the search measures through (runner.LocalRunner has it too):
``submit`` a candidate and get a ticket; ``wait`` returns the results ready now (at least
one) so that the search draws the next candidates while the others run, and no slot waits
for the slowest candidate of a round; ``time_together`` times kernels together with the
Ms split into chunks, one task each, so that the joint timings also shrink with the nodes
(kernels are compared at one M, and each M is timed in one process).

Failures: a kernel that crashes or hangs its worker process is that candidate's error,
returned like any result and recorded once as failed (the task itself succeeded: it is not
retried elsewhere). A Ray worker process or node that dies mid-task (the task's process,
not the measurement's) makes Ray run the task again on another one of the same CPU model
(``MAX_RETRIES``), and the candidate is not marked failed. A task that still cannot run
(every worker of its model lost) stops the tune with a ClusterError; what was measured
before is in the database.

CPU models: candidates are compared only within one CPU model (target key: model name and
flags). At connection a probe task on every node returns its CPU, and the nodes are grouped
by model, one ``ModelNodes`` each (``RayCluster.models``): the measuring interface above, on
that model's nodes only, whose CPUs alone its ``slots`` count. A tune (search.Tuner) runs on
one of them and records its measurements and selection under that model's key; ``shapeshift
tune --cluster`` tunes every task once per model, in turn (cli/tune_cmd.py), so a session
applies the selection made on its own CPU model (tune/records.py). Every result names the
node that made it and that node's CPU, checked against the model's: a measurement is never
recorded under another model's key.

- A cluster of one model measures on any node Ray picks (nodes that join later included),
  and ``RayCluster`` itself offers that model's interface (``target``, ``submit``, ...:
  ``ONE_MODEL_INTERFACE``).
- On a mixed cluster each task carries a Ray label selector on the node id (``ray.io/node-id``
  in the model's nodes): Ray still balances among them, and a task retried after its node
  died runs on another node of the same model. Ray holds a task whose model has no live node
  left (waiting for one to join), so a wait that sees no result for ``LIVENESS_S`` checks
  that one is alive, and stops the tune with a ClusterError when none is. Nodes that join
  later are not used (they were not probed). A Ray without label selectors refuses a mixed
  cluster, naming the fix.

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
from .machine import stamp
from .runner import Result, RunnerConfig, measure, measure_together

INSTALL_HINT = "pip install 'shapeshift[cluster]'"
# Runs of a task whose Ray worker process or node died, before the tune stops.
MAX_RETRIES = 3
# Seconds a wait sees no result before it checks that the model still has a live node.
LIVENESS_S = 10.0
# The label Ray gives every node, its node id: what keeps a task on one model's nodes.
NODE_ID_LABEL = "ray.io/node-id"
# What a cluster of one CPU model offers itself, as its ModelNodes does.
ONE_MODEL_INTERFACE = frozenset({"target", "slots", "submit", "wait", "cancel", "measure_many", "time_together",
                                 "counts", "task_seconds", "joint_tasks"})
_LOCAL = re.compile(r"local(?::(\d+))?")


class ClusterError(ShapeshiftError):
    """The cluster cannot be reached, refuses us, or lost every worker."""


def _loopback(address: str) -> bool:
    """Whether a Ray address (HOST:PORT, ray://HOST:PORT) names this machine's loopback."""
    host = address.split("://", 1)[-1].rpartition(":")[0]
    return host == "localhost" or host.startswith("127.")


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
    node, cpu = _node()
    stamp([result], node)  # this node's machine, measured peak included
    return (result, node, cpu, time.perf_counter() - start)


def _together_task(sources: Sequence["str | CandidateSource"], workload, ms: list[int], config: RunnerConfig,
                   timeout_s: Optional[float]) -> tuple[list[Result], str, dict, float]:
    start = time.perf_counter()
    results = measure_together([build_source(s) for s in sources], workload, ms, config, timeout_s)
    node, cpu = _node()
    stamp(results, node)
    return (results, node, cpu, time.perf_counter() - start)


def _node_lines(nodes: list[tuple[str, str, int]]) -> list[str]:
    return [f"  node {node[:8]} at {addr}: {cpus} CPU(s)" for node, addr, cpus in nodes]


class ModelNodes:
    """The nodes of one CPU model, measuring candidates (the module docstring): what
    search.Tuner measures through, and what ``shapeshift tune --cluster`` tunes on."""

    def __init__(self, cluster: "RayCluster", target: Target, node_ids: Optional[frozenset[str]] = None):
        self.cluster, self.ray, self.target = cluster, cluster.ray, target
        # None: every node (a cluster of one model). Else the label selector that keeps each
        # task, and each retry of it, on these nodes.
        self.node_ids = node_ids
        self._placement = {} if node_ids is None else {
            "label_selector": {NODE_ID_LABEL: f"in({','.join(sorted(node_ids))})"}}
        self.counts: collections.Counter = collections.Counter()  # measurements per node
        # Seconds each task took on its node: candidates (build + measurement), and each
        # joint timing's chunks as (Ms, seconds).
        self.task_seconds: list[float] = []
        self.joint_tasks: list[tuple[list[int], float]] = []
        self._refs: dict[int, object] = {}  # ticket -> the running task's ObjectRef
        self._tickets = itertools.count()

    def nodes(self) -> list[tuple[str, str, int]]:
        """(node id, address, CPUs) of this model's live nodes."""
        return [n for n in self.cluster.nodes() if self.node_ids is None or n[0] in self.node_ids]

    def describe(self) -> str:
        """The model, its nodes and CPUs (one line), then a line per node."""
        nodes = self.nodes()
        lines = [f"{self.target.cpu_model} (target key {self.target.key}): {len(nodes)} node(s), "
                 f"{sum(c for _, _, c in nodes)} CPU(s)"]
        return "\n".join(lines + _node_lines(nodes))

    # ---- measuring ---------------------------------------------------------------------
    def _ready(self, refs: list) -> list:
        """Those of ``refs`` that are done, at least one (blocks until then); a ClusterError
        once no node of this model is alive (Ray would hold its tasks for one to join)."""
        while not self.ray.wait(refs, num_returns=1, timeout=LIVENESS_S)[0]:
            if not self.nodes():
                raise ClusterError(f"every node of {self.target.cpu_model} (target key {self.target.key}) was lost: "
                                   "the tune stops (what was measured is in the database)")
        return self.ray.wait(refs, num_returns=len(refs), timeout=0)[0]

    def _get(self, ref, what: str):
        """A finished task's value and seconds on its node, counted for the node, which must
        be of this model."""
        try:
            value, node, cpu, seconds = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # workers or nodes lost, none left to place it on, ...
            raise ClusterError(f"the cluster could not run {what} on {self.target.cpu_model} (target key "
                               f"{self.target.key}) after {MAX_RETRIES + 1} tries (every worker lost?): "
                               f"{str(exc).splitlines()[0]}") from None
        made_on = target_from_json(cpu)
        if made_on.key != self.target.key:
            # A node that joined after the probe: its result is not recorded under our key.
            raise ClusterError(f"node {node[:8]} ran {what} on {made_on.cpu_model} (target key {made_on.key}), not "
                               f"{self.target.cpu_model} (target key {self.target.key}): a node of another CPU model "
                               "joined the cluster; run the tune again to measure on each model apart")
        self.counts[node[:8]] += 1
        return value, seconds

    def slots(self, threads: int) -> int:
        """Measurements of ``threads`` threads this model's nodes run at once."""
        return max(1, sum(c for _, _, c in self.nodes()) // max(1, threads))

    def submit(self, source: "str | CandidateSource", workload, ms: Sequence[int], config: RunnerConfig) -> int:
        """One candidate built and measured as a task of its own; a ticket for ``wait``."""
        ticket = next(self._tickets)
        self._refs[ticket] = self.cluster._measure.options(num_cpus=config.threads, **self._placement).remote(
            source, workload, list(ms), config)
        return ticket

    def wait(self, tickets: Collection[int]) -> list[tuple[int, Result]]:
        """The results of ``tickets`` ready now, at least one (blocks until then), in the
        order they were submitted: with one worker, tasks finish in that order, and a search
        that takes them one by one is as reproducible as a synchronous one."""
        refs = {self._refs[t]: t for t in tickets}
        out = []
        for ticket in sorted(refs[r] for r in self._ready(list(refs))):
            result, seconds = self._get(self._refs.pop(ticket), "a measurement")
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
        refs = [self.cluster._together.options(num_cpus=config.threads, **self._placement).remote(
            list(sources), workload, list(ms), config, t) for ms, t in zip(chunks, timeouts)]
        out = []
        for ms, ref in zip(chunks, refs):
            self._ready([ref])
            results, seconds = self._get(ref, "a joint timing")
            self.joint_tasks.append((list(ms), seconds))
            out.append(results)
        return out


class RayCluster:
    """A connection to a Ray cluster that measures candidates on its nodes, grouped by CPU
    model (``models``; see the module docstring)."""

    def __init__(self, address: str):
        local = _LOCAL.fullmatch(address)
        # A cluster at a loopback address is this machine's too (`ray start --head
        # --node-ip-address=127.0.0.1`): Ray must not swap 127.0.0.1 for the routable address,
        # where that cluster does not listen.
        ray = _import_ray(local=bool(local) or _loopback(address))
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
        self.models: list[ModelNodes] = self._probe()

    def __getattr__(self, name: str):
        # A cluster of one CPU model measures as that model's nodes do (what search.Tuner and
        # bench/cluster.py use); a mixed one only through ``models``, a Tuner each.
        if name in ONE_MODEL_INTERFACE:
            return getattr(self.one_model(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def one_model(self) -> ModelNodes:
        """The cluster's one CPU model; a ClusterError naming them when it has several."""
        if len(self.models) > 1:
            names = "; ".join(f"{m.target.cpu_model} (target key {m.target.key})" for m in self.models)
            raise ClusterError(f"the cluster has {len(self.models)} CPU models ({names}): measure on each "
                               "apart (RayCluster.models), a tune each")
        return self.models[0]

    # ---- the nodes ---------------------------------------------------------------------
    def nodes(self) -> list[tuple[str, str, int]]:
        """(node id, address, CPUs) of every live node."""
        return [(n["NodeID"], n.get("NodeManagerAddress", "?"), int(n.get("Resources", {}).get("CPU", 0)))
                for n in self.ray.nodes() if n.get("Alive")]

    def _probe(self) -> list[ModelNodes]:
        """The nodes grouped by CPU model (a probe task per node), the models sorted by name."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = self.ray.remote(num_cpus=0)(_node)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
                for node, _, _ in self.nodes()]
        found: dict[str, tuple[Target, list[str]]] = {}
        for node, data in self.ray.get(refs):
            target = target_from_json(data)
            found.setdefault(target.key, (target, []))[1].append(node)
        if len(found) == 1:
            (target, _), = found.values()
            return [ModelNodes(self, target)]
        self._check_label_selectors(found)
        return [ModelNodes(self, target, frozenset(nodes))
                for target, nodes in sorted(found.values(), key=lambda tn: (tn[0].cpu_model, tn[0].key))]

    def _check_label_selectors(self, found: dict) -> None:
        """A ClusterError unless this Ray can keep a task on a set of nodes (a label selector
        on ``ray.io/node-id``), what a cluster of several CPU models needs."""
        models = "; ".join(f"{t.cpu_model} (target key {key}) on {len(nodes)} node(s)"
                           for key, (t, nodes) in sorted(found.items()))
        try:
            self._measure.options(label_selector={NODE_ID_LABEL: "in(x)"})
            labelled = all(NODE_ID_LABEL in n.get("Labels", {}) for n in self.ray.nodes() if n.get("Alive"))
        except (TypeError, ValueError):  # "Invalid option keyword label_selector"
            labelled = False
        if not labelled:
            raise ClusterError(f"the cluster mixes CPU models ({models}), and this Ray ({self.ray.__version__}) "
                               f"cannot keep a task on one model's nodes: upgrade Ray on the driver and the "
                               f"cluster to one with label selectors on {NODE_ID_LABEL}, or tune each model on "
                               f"a cluster of its own")

    def describe(self) -> str:
        nodes = self.nodes()
        cpus = sum(c for _, _, c in nodes)
        if len(self.models) == 1:
            model = self.models[0].target
            lines = [f"cluster {self.address}: {len(nodes)} node(s), {cpus} CPU(s), {model.cpu_model} "
                     f"(target key {model.key})"]
            return "\n".join(lines + _node_lines(nodes))
        lines = [f"cluster {self.address}: {len(nodes)} node(s), {cpus} CPU(s), {len(self.models)} CPU models, "
                 f"each measured on its own nodes:"]
        return "\n".join(lines + ["  " + line for m in self.models for line in m.describe().splitlines()])

    def summary(self) -> str:
        counts = sum((m.counts for m in self.models), collections.Counter())
        return "measurements per node: " + (", ".join(f"{node} {n}" for node, n in sorted(counts.items()))
                                            or "none")

    def shutdown(self) -> None:
        self.ray.shutdown()
