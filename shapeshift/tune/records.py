"""Tuning records as the native backend uses them: one tuned dispatcher per weight shape.

``GemmTuning.from_db(path, threads)`` reads, for every GEMM workload (K, N) in a tuning
database, the latest kernel set and decision tree chosen for that thread count. The
program builder asks it for ``get(k, n)`` when it lowers a MatMul or Gemm with a constant
[K, N] weight; a hit replaces ``ss_gemm_prepacked`` by the tuned dispatcher
``ss_tuned_<K>x<N>_prepacked`` (same arguments, kernels chosen by M at run time) and packs
the weight with the dispatcher's ``pack_b``. Without a record the hand-picked default
schedule runs, as before.

The kernels are shape-generic, so a selection tuned for one range of M serves any M; the
tree's outermost leaves cover M outside the tuned range. Records are matched on thread
count only: a selection made for 1 thread is not used by a 2-thread session.

``to_json``/``from_json`` let a compiled artifact carry the records it was built with, so
that loading rebuilds the same source without the database.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ..codegen.kernels.gemm import GemmSchedule
from ..errors import ShapeshiftError
from . import dispatch, space


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


class GemmTuning:
    """Read-only map (K, N) -> TunedGemm."""

    def __init__(self, entries: Optional[list[TunedGemm]] = None, source: str = ""):
        self._entries = {(e.k, e.n): e for e in entries or []}
        self.source = source  # where the records came from, for messages

    def get(self, k: int, n: int) -> Optional[TunedGemm]:
        return self._entries.get((k, n))

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[TunedGemm]:
        return iter(sorted(self._entries.values(), key=lambda e: (e.k, e.n)))

    def to_json(self) -> list:
        return [e.to_json() for e in self]

    @classmethod
    def from_json(cls, data: list, source: str = "") -> "GemmTuning":
        return cls([TunedGemm.from_json(d) for d in data], source)

    @classmethod
    def from_db(cls, path, threads: int) -> "GemmTuning":
        """The latest selection of every workload in the database at ``path`` for
        ``threads`` threads. The file must exist: a mistyped path is an error, not an
        empty database."""
        path = Path(path)
        if not path.is_file():
            raise ShapeshiftError(f"tuning database {path} does not exist (run `shapeshift tune` to make one)")
        try:
            # Read-only: loading a session never writes to (or creates) the database.
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
            try:
                rows = conn.execute(
                    "SELECT w.k, w.n, s.kernels, s.tree, s.threads, s.lo, s.hi, s.strategy FROM selections s "
                    "JOIN workloads w ON w.id = s.workload_id WHERE s.threads = ? ORDER BY s.id",
                    (threads,)).fetchall()
            finally:
                conn.close()
            entries = {}
            for k, n, kernels, tree, t, lo, hi, strategy in rows:  # later rows replace earlier ones
                schedules = tuple(space.from_json(kern["schedule"]) for kern in json.loads(kernels))
                entries[(k, n)] = TunedGemm(int(k), int(n), schedules, json.loads(tree), int(t), int(lo), int(hi),
                                            str(strategy))
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise ShapeshiftError(f"tuning database {path} cannot be read: {exc}") from None
        return cls(list(entries.values()), str(path))
