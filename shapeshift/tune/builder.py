"""C sources and compiled libraries for candidates, for any kernel family (tune/task.py).

A measurement library holds one schedule under the default ``ss_`` names (the family's
``source``) plus the family's C loops that time it (``bench_source``): through ctypes a call
costs microseconds, more than the smallest kernels. Libraries are built with
``compile_library`` into the tuning's cache directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..codegen.build import DEFAULT_FLAGS, compile_library, precompile_header
from ..codegen.kernels.prelude import PRELUDE
from ..errors import ShapeshiftError
from .gemm_family import GEMM
from .task import KernelFamily

# Makes the fragment of one schedule in place of the family's own; tests swap in broken ones.
SourceFn = Callable[[Any], str]


@dataclass(frozen=True)
class Built:
    schedule: Any
    library: Optional[Path]  # the .so, None when the build failed
    error: Optional[str] = None


def measurement_source(schedule, family: KernelFamily = GEMM, source_fn: Optional[SourceFn] = None) -> str:
    return PRELUDE + (source_fn or family.source)(schedule) + family.bench_source()


@dataclass(frozen=True)
class CandidateSource:
    """A candidate's measurement library as its family's name and its schedule's JSON, for
    the process that builds it to write out (``text``): on a cluster the driver sends this
    instead of the C, whose writing (about 170 KB for a GEMM schedule, 7.6 ms) was most of
    the driver's time per candidate."""

    family: str
    schedule_json: str

    def text(self) -> str:
        from .task import family_named

        family = family_named(self.family)
        return measurement_source(family.from_json(self.schedule_json), family)


def source_text(source: "str | CandidateSource") -> str:
    """The C of a measurement library given as text or as a CandidateSource."""
    return source if isinstance(source, str) else source.text()


def build_source(source: "str | CandidateSource", cache_dir: Optional[Path] = None) -> Built:
    """A candidate's measurement library compiled from its source (``measurement_source``,
    or a CandidateSource written out here) into ``cache_dir`` (None: the default cache, a
    cluster node's own); a compile error fails the candidate only."""
    try:
        # Every candidate starts with the prelude: its includes precompiled once per cache
        # took a GEMM candidate's build from 3.0-3.1 s to 2.1-2.5 s on a Zen 4.
        precompile_header(DEFAULT_FLAGS, cache_dir)
        return Built(None, compile_library(source_text(source), name_hint="tune_candidate", cache_dir=cache_dir).path)
    except ShapeshiftError as exc:
        return Built(None, None, f"build failed: {str(exc).splitlines()[0]}")


def build_one(schedule, cache_dir: Path, source_fn: Optional[SourceFn] = None, family: KernelFamily = GEMM) -> Built:
    """``build_source`` of one schedule's measurement library, the schedule recorded."""
    built = build_source(measurement_source(schedule, family, source_fn), cache_dir)
    return Built(schedule, built.library, built.error)
