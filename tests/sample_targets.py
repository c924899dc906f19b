"""Target descriptions of the CPUs whose /proc/cpuinfo is in tests/target_samples/, for the
tests that need another machine's description (its microarchitecture class, its schedules,
its key) whatever CPU runs them."""

from __future__ import annotations

from pathlib import Path

from shapeshift.target.cpu import Caches, parse_cpuinfo
from shapeshift.target.description import Target, target_from_cpu

SAMPLES = Path(__file__).parent / "target_samples"
#: An AMD Zen 4's caches: L1d 32 KiB, L2 1 MiB, L3 32 MiB.
ZEN4_CACHES = Caches(32768, 1 << 20, 32 << 20)


def sample_target(name: str, caches: Caches = ZEN4_CACHES) -> Target:
    """The description of ``target_samples/<name>.cpuinfo``'s CPU with ``caches``."""
    return target_from_cpu(parse_cpuinfo((SAMPLES / f"{name}.cpuinfo").read_text()), caches)
