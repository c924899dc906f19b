"""Tuning records as the native backend uses them: one tuned dispatcher per weight shape,
one per batched GEMM structure, one per group of dense GEMMs, and one per conv task.

``GemmTuning.from_db(path, threads)`` reads, for every GEMM workload (K, N) in a tuning
database, the latest kernel set and decision tree chosen for that thread count. The
program builder asks it for ``get(k, n)`` when it lowers a MatMul or Gemm with a constant
[K, N] weight; a hit replaces ``ss_gemm_prepacked`` by the tuned dispatcher
``ss_tuned_<K>x<N>_prepacked`` (same arguments, kernels chosen by M at run time) and packs
the weight with the dispatcher's ``pack_b``. Without a record the hand-picked default
schedule runs, as before.

A group (tune/gemm_group.py: a model's dense GEMMs tuned as one task) serves every weight
shape it holds with one dispatcher, ``ss_tuned_group_<hash>_prepacked``, whose tree picks
a kernel by (M, N, K); a weight shape with a selection of its own takes that one.

A conv (tune/conv_workload.py) is looked up by its class and instance (``find_conv``): its
own record, tuned alone, else its class's, tuned over a model's instances; a hit calls
``ss_tuned_conv_<hash>_conv2d`` (``ss_conv2d``'s arguments), or its ``_conv2d_residual`` for a
conv with a fused residual Add (``ss_conv2d_residual``'s), with the weights packed by its
``pack_b``. A blocked-layout conv (an ``NCHWcConv`` node: ``find_conv_nchwc``, the same way,
its class also naming dense or depthwise and the block) calls ``ss_tuned_cnc_<hash>_conv_nchwc_L``
or ``_dwconv_nchwc_L`` (``ss_conv_nchwc_L``'s or ``ss_dwconv_nchwc_L``'s arguments) on the
weights as the untuned kernels read them.

A batched GEMM (no constant operand, such as attention's Q K^T) is looked up by its
workload key (``get_batched``): the lowering computes the key of each ``ss_gemm`` call it
emits from the call's symbolic sizes and strides, and a hit calls the tuned dispatcher
``ss_tuned_bmm_<hash>_gemm`` (``ss_gemm``'s arguments, kernels chosen by T) instead.

The kernels are shape-generic, so a selection tuned for one range of M serves any M; the
tree's outermost leaves cover M outside the tuned range. Records are matched on thread
count (a selection made for 1 thread is not used by a 2-thread session) and on the CPU they
were tuned on (its target key, ``_for_this_cpu``): a database tuned on a cluster of several
CPU models holds a selection per model, and each machine applies its own model's.

``to_json``/``from_json`` let a compiled artifact carry the records it was built with, so
that loading rebuilds the same source without the database.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ..codegen.kernels.gemm import GemmSchedule
from ..errors import ShapeshiftError
from ..target import host_target
from . import dispatch, space
from .database import check_database_path, has_target_column, read_only
from .conv_workload import DIMS as CONV_DIMS, ConvWorkload, NchwcConvWorkload, conv_instance, workload_from_key
from .gemm_group import DIMS, GemmGroupWorkload
from .workload import BatchedGemmWorkload, GemmWorkload, batched_workload, poly_str


@dataclass(frozen=True, eq=False)
class TunedGemm:
    """The chosen kernels and dispatch tree of one weight shape [K, N]."""

    k: int
    n: int
    kernels: tuple[GemmSchedule, ...]
    tree: dict
    threads: int
    lo: int  # the range of M it was tuned for (informative: any M runs)
    hi: int
    strategy: str

    @property
    def name(self) -> str:
        """Prefix of the dispatcher's C functions."""
        return f"ss_tuned_{self.k}x{self.n}_"

    def source(self) -> str:
        return dispatch.tuned_gemm_c(self.kernels, self.tree, self.name)

    def to_json(self) -> dict:
        return {"k": self.k, "n": self.n, "kernels": [json.loads(space.to_json(s)) for s in self.kernels],
                "tree": self.tree, "threads": self.threads, "lo": self.lo, "hi": self.hi, "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: dict) -> "TunedGemm":
        return cls(int(data["k"]), int(data["n"]), tuple(space.from_json(json.dumps(s)) for s in data["kernels"]),
                   data["tree"], int(data["threads"]), int(data["lo"]), int(data["hi"]), str(data["strategy"]))

    def describe(self) -> str:
        return (f"[{self.k}, {self.n}]: {len(self.kernels)} kernel(s), tuned by {self.strategy} for M in "
                f"[{self.lo}, {self.hi}] on {self.threads} thread(s)")


@dataclass(frozen=True, eq=False)
class TunedBatchedGemm:
    """The chosen kernels and dispatch tree (on T) of one batched GEMM structure."""

    key: str  # BatchedGemmWorkload.key
    kernels: tuple[GemmSchedule, ...]
    tree: dict
    threads: int
    lo: int  # the range of T it was tuned for (informative: any T runs)
    hi: int
    strategy: str

    @property
    def workload(self) -> BatchedGemmWorkload:
        return BatchedGemmWorkload.from_key(self.key, self.lo, self.hi)

    @property
    def name(self) -> str:
        """Prefix of the dispatcher's C functions."""
        return f"ss_tuned_bmm_{self.workload.hash[:12]}_"

    @property
    def function(self) -> str:
        return f"{self.name}gemm"

    def source(self) -> str:
        return dispatch.tuned_batched_c(self.kernels, self.tree, self.name, self.workload.t_arg)

    def to_json(self) -> dict:
        return {"key": self.key, "kernels": [json.loads(space.to_json(s)) for s in self.kernels], "tree": self.tree,
                "threads": self.threads, "lo": self.lo, "hi": self.hi, "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: dict) -> "TunedBatchedGemm":
        return cls(str(data["key"]), tuple(space.from_json(json.dumps(s)) for s in data["kernels"]), data["tree"],
                   int(data["threads"]), int(data["lo"]), int(data["hi"]), str(data["strategy"]))

    def describe(self) -> str:
        w = self.workload
        a, b = ", ".join(map(poly_str, (w.m, w.k))), ", ".join(map(poly_str, (w.k, w.n)))
        return (f"batched {w.batch} x [{a}] x [{b}]: {len(self.kernels)} kernel(s), tuned by {self.strategy} "
                f"for T in [{self.lo}, {self.hi}] on {self.threads} thread(s)")


@dataclass(frozen=True, eq=False)
class TunedGemmGroup:
    """The chosen kernels and dispatch tree (on M, N, K) of a group of dense GEMMs
    (tune/gemm_group.py): one dispatcher serves every weight shape of the group."""

    key: str  # GemmGroupWorkload.key
    kernels: tuple[GemmSchedule, ...]
    tree: dict
    threads: int
    strategy: str

    @property
    def workload(self) -> GemmGroupWorkload:
        return GemmGroupWorkload.from_key(self.key)

    @property
    def name(self) -> str:
        """Prefix of the dispatcher's C functions (``ss_gemm_prepacked``'s as ``<name>prepacked``)."""
        return f"ss_tuned_group_{self.workload.hash[:12]}_"

    def source(self) -> str:
        return dispatch.tuned_gemm_c(self.kernels, self.tree, self.name, tree_args=DIMS)

    def to_json(self) -> dict:
        return {"group": self.key, "kernels": [json.loads(space.to_json(s)) for s in self.kernels],
                "tree": self.tree, "threads": self.threads, "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: dict) -> "TunedGemmGroup":
        return cls(str(data["group"]), tuple(space.from_json(json.dumps(s)) for s in data["kernels"]), data["tree"],
                   int(data["threads"]), str(data["strategy"]))

    def describe(self) -> str:
        w = self.workload
        shapes = ", ".join(f"[{k}, {n}]" for k, n in sorted(w.weights()))
        return (f"group of {len(w.instances)} GEMM instance(s) (weights {shapes}): {len(self.kernels)} kernel(s), "
                f"tuned by {self.strategy} on {self.threads} thread(s)")


@dataclass(frozen=True, eq=False)
class TunedConv:
    """The chosen conv kernels and dispatch tree (on N, C, M, H, W) of one conv task
    (tune/conv_workload.py): a class's instances, or one of them; plain (``ss_conv2d``'s
    ConvSchedules) or blocked (an NchwcConvWorkload: NchwcSchedules)."""

    key: str  # ConvWorkload.key or NchwcConvWorkload.key
    kernels: tuple
    tree: dict
    threads: int
    strategy: str

    @property
    def workload(self) -> ConvWorkload:
        return workload_from_key(self.key)

    @property
    def blocked(self) -> bool:
        return isinstance(self.workload, NchwcConvWorkload)

    @property
    def name(self) -> str:
        """Prefix of the dispatcher's C functions (``ss_conv2d`` as ``<name>conv2d``,
        ``ss_conv_nchwc_L`` as ``<name>conv_nchwc_L``)."""
        return f"ss_tuned_{'cnc' if self.blocked else 'conv'}_{self.workload.hash[:12]}_"

    def source(self) -> str:
        w = self.workload
        if isinstance(w, NchwcConvWorkload):
            return dispatch.tuned_conv_nchwc_c(self.kernels, self.tree, self.name, CONV_DIMS, w.lanes, w.depthwise)
        return dispatch.tuned_conv_c(self.kernels, self.tree, self.name, CONV_DIMS)

    def to_json(self) -> dict:
        family = self.workload.family
        return {"conv": self.key, "kernels": [json.loads(family.to_json(s)) for s in self.kernels],
                "tree": self.tree, "threads": self.threads, "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: dict) -> "TunedConv":
        family = workload_from_key(str(data["conv"])).family
        return cls(str(data["conv"]), tuple(family.from_json(json.dumps(s)) for s in data["kernels"]), data["tree"],
                   int(data["threads"]), str(data["strategy"]))

    def describe(self) -> str:
        return f"{self.workload.describe()}: {len(self.kernels)} kernel(s), tuned by {self.strategy} on " \
               f"{self.threads} thread(s)"


Record = TunedGemm | TunedBatchedGemm | TunedGemmGroup | TunedConv


def _for_this_cpu(rows: list, path: Path) -> list:
    """The selections measured on this machine's CPU model and flags (or on an unknown CPU,
    from before selections recorded theirs); the others are not applied. A database tuned on
    a cluster of several CPU models holds a selection per model for each workload, and each
    machine takes its own, silently; a workload with selections from other CPUs only is the
    one a warning names (with the CPUs they were tuned on): it runs its default here."""
    here = host_target()
    kept, unknown = [], 0
    foreign: dict[str, dict] = {}  # workload key -> target key -> CPU model
    for row in rows:
        measured_on = json.loads(row[-1]) if row[-1] else None
        if measured_on is None:
            unknown += 1
            kept.append(row)
        elif measured_on.get("key") == here.key:
            kept.append(row)
        else:
            foreign.setdefault(row[0], {})[measured_on.get("key")] = measured_on.get("cpu_model", "?")
    ours = {row[0] for row in kept}
    foreign = {key: model for workload, cpus in foreign.items() if workload not in ours
               for key, model in cpus.items()}
    if foreign:
        cpus = "; ".join(f"{model} (target key {key})" for key, model in sorted(foreign.items()))
        warnings.warn(f"tuning database {path}: selections tuned on another CPU are not used: {cpus}; this "
                      f"machine is {here.cpu_model} (target key {here.key}): run `shapeshift tune` here",
                      stacklevel=4)
    if unknown:
        warnings.warn(f"tuning database {path}: {unknown} selection(s) recorded before tuning records named "
                      "their CPU are used as they are; retune to record this machine", stacklevel=4)
    return kept


class GemmTuning:
    """Read-only map (K, N) -> TunedGemm, and batched workload key -> TunedBatchedGemm."""

    def __init__(self, entries: Optional[list[Record]] = None, source: str = ""):
        entries = entries or []
        self._entries = {(e.k, e.n): e for e in entries if isinstance(e, TunedGemm)}
        self._batched = {e.key: e for e in entries if isinstance(e, TunedBatchedGemm)}
        self._groups = {e.key: e for e in entries if isinstance(e, TunedGemmGroup)}
        self._convs = {e.key: e for e in entries if isinstance(e, TunedConv)}
        # Conv class -> the record tuned over that class's instances (later ones win).
        self._conv_class = {e.workload.class_key: e for e in self._convs.values() if len(e.workload.instances) > 1}
        # Weight shape -> the group that holds it; a later group takes a shape from an earlier one.
        self._group_of = {shape: e for e in self._groups.values() for shape in e.workload.weights()}
        self.source = source  # where the records came from, for messages

    def get(self, k: int, n: int) -> Optional[TunedGemm | TunedGemmGroup]:
        """The dispatcher for a [K, N] weight: its own shape's selection, else its group's
        (both take ``ss_gemm_prepacked``'s arguments)."""
        return self._entries.get((k, n)) or self._group_of.get((k, n))

    def find_conv(self, kernel, strides, dilations, pads, dims, out_hw, act: int) -> Optional[TunedConv]:
        """The dispatcher for a dense 2-D conv the lowering is about to emit (sizes as ints
        where static; ``dims`` (N, C, H, W, M)): its instance's own record (tuned alone),
        else its class's, tuned over a model's instances (their kernels take any size)."""
        if not self._convs:
            return None
        klass = tuple(kernel) + tuple(strides) + tuple(dilations)
        return self._find(lambda c, i, cold: ConvWorkload(c, (i,), cold).key, ConvWorkload.class_key_of(klass),
                          conv_instance(kernel, strides, dilations, pads, dims, out_hw, act))

    def find_conv_nchwc(self, depthwise: bool, lanes: int, kernel, strides, dilations, pads, dims, out_hw
                        ) -> Optional[TunedConv]:
        """``find_conv`` for a blocked conv (an ``NCHWcConv`` node, dense with a blocked input
        or depthwise; ``dims`` (N, C, H, W, M) as the kernel takes them)."""
        if not self._convs:
            return None
        klass = tuple(kernel) + tuple(strides) + tuple(dilations)
        return self._find(lambda c, i, cold: NchwcConvWorkload(c, (i,), cold, depthwise, lanes).key,
                          NchwcConvWorkload.class_key_of(klass, depthwise, lanes),
                          conv_instance(kernel, strides, dilations, pads, dims, out_hw, 0))

    def _find(self, key_of, class_key: str, found) -> Optional[TunedConv]:
        """The record of ``found`` (a conv_instance: (class, instance), or None) alone, measured
        cold or warm (``key_of(class, instance, cold)``: its workload's key), else its class's."""
        if found is not None:
            for cold in (True, False):
                own = self._convs.get(key_of(*found, cold))
                if own is not None:
                    return own
        return self._conv_class.get(class_key)

    def get_batched(self, key: str) -> Optional[TunedBatchedGemm]:
        return self._batched.get(key)

    def find_batched(self, m, n, k, batch, a_strides, b_strides, c_strides) -> Optional[TunedBatchedGemm]:
        """The record for an ``ss_gemm`` call the lowering is about to emit (symbolic sizes
        and strides, see ``workload.batched_workload``), if one was tuned."""
        if not self._batched:
            return None
        workload = batched_workload(m, n, k, batch, a_strides, b_strides, c_strides)
        return self._batched.get(workload.key) if workload is not None else None

    def __len__(self) -> int:
        return len(self._entries) + len(self._batched) + len(self._groups) + len(self._convs)

    def __iter__(self) -> Iterator[Record]:
        dense = sorted(self._entries.values(), key=lambda e: (e.k, e.n))
        return iter([*dense, *sorted(self._batched.values(), key=lambda e: e.key),
                     *sorted(self._groups.values(), key=lambda e: e.key),
                     *sorted(self._convs.values(), key=lambda e: e.key)])

    def to_json(self) -> list:
        return [e.to_json() for e in self]

    @classmethod
    def from_json(cls, data: list, source: str = "") -> "GemmTuning":
        def entry(d: dict) -> Record:
            if "conv" in d:
                return TunedConv.from_json(d)
            if "group" in d:
                return TunedGemmGroup.from_json(d)
            return TunedBatchedGemm.from_json(d) if "key" in d else TunedGemm.from_json(d)

        return cls([entry(d) for d in data], source)

    @classmethod
    def from_db(cls, path, threads: int) -> "GemmTuning":
        """The latest selection of every workload in the database at ``path`` for
        ``threads`` threads. The file must exist: a mistyped path is an error, not an
        empty database."""
        path = Path(path)
        check_database_path(path)
        if not path.is_file():
            raise ShapeshiftError(f"tuning database {path} does not exist (run `shapeshift tune` to make one)")

        def query(conn: sqlite3.Connection) -> tuple[list, list]:
            target_column = "s.target" if has_target_column(conn) else "NULL"
            rows = conn.execute(
                "SELECT w.key, s.kernels, s.tree, s.threads, s.lo, s.hi, s.strategy, "
                f"{target_column} FROM selections s "
                "JOIN workloads w ON w.id = s.workload_id WHERE s.threads = ? ORDER BY s.id",
                (threads,)).fetchall()
            others = [] if rows else [t for (t,) in conn.execute(
                "SELECT DISTINCT threads FROM selections ORDER BY threads")]
            return rows, others

        try:
            # Read-only: loading a session never writes to (or creates) the database, nor
            # any file beside it (database.read_only).
            rows, others = read_only(path, query)
            if others:
                # Records that exist but go unused were dropped without a word: tune defaults
                # to one thread, sessions to every core. Still not an error: the defaults run.
                counts = ", ".join(map(str, others))
                warnings.warn(f"tuning database {path} holds selections for {counts} thread(s), none for "
                              f"{threads}: its records are not used (run on {counts} thread(s) with num_threads= "
                              f"or --threads, or tune with --threads {threads})", stacklevel=3)
            rows = _for_this_cpu(rows, path)
            entries: dict = {}
            for key, kernels, tree, t, lo, hi, strategy, _ in rows:  # later rows replace earlier ones
                if str(key).startswith(("conv:", "conv-cold:", *NchwcConvWorkload.kinds)):
                    family = workload_from_key(str(key)).family
                    convs = tuple(family.from_json(kern["schedule"]) for kern in json.loads(kernels))
                    entries[key] = TunedConv(str(key), convs, json.loads(tree), int(t), str(strategy))
                    continue
                schedules = tuple(space.from_json(kern["schedule"]) for kern in json.loads(kernels))
                common = (schedules, json.loads(tree), int(t), int(lo), int(hi), str(strategy))
                if str(key).startswith("bmm:"):
                    entries[key] = TunedBatchedGemm(str(key), *common)
                elif str(key).startswith("gemm-group"):
                    entries[key] = TunedGemmGroup(str(key), schedules, json.loads(tree), int(t), str(strategy))
                else:
                    dense = GemmWorkload.from_key(str(key), 1, 1)  # its K and N
                    entries[(dense.k, dense.n)] = TunedGemm(dense.k, dense.n, *common)
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise ShapeshiftError(f"tuning database {path} cannot be read: {exc}") from None
        return cls(list(entries.values()), str(path))
