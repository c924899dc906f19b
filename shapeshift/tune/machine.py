"""What machine made a measurement: the description every measurement is recorded with.

A tuning database compares candidates only within one CPU model (target key: model name
and flags), but a cluster's nodes of one model can still differ: one throttled, one on
another BIOS setting. So each measurement also names the machine that made it, as the
database's ``machines`` table keeps it: the target description (target/description.py's
``target_to_json``: CPU model, family, flags, caches), the node (a Ray node id, or
"local"), and the measured FMA peak of that machine per vector width
(target/calibrate.py: cached per CPU in the cache folder, so a machine calibrates once, a
second or two, before its first measurement). A machine that cannot calibrate (no C
compiler where the description is made, say) is described without its peak rather than
failing the measurement.
"""

from __future__ import annotations

import functools
import json
from typing import Optional

from ..errors import ShapeshiftError
from ..target import host_target
from ..target.description import target_to_json


@functools.cache
def this_machine(node: str = "local") -> dict:
    """This process's machine as a measurement records it (computed once per process)."""
    from ..target.calibrate import measure_fma

    target = host_target()
    try:
        calibration = measure_fma(target)
        peak: Optional[list[dict]] = [{"bits": w.bits, "peak_gflops": w.peak_gflops, "latency_ns": w.latency_ns}
                                      for w in calibration.widths]
    except (ShapeshiftError, OSError, ValueError):
        peak = None
    return {"node": node, "target_key": target.key, "target": target_to_json(target), "fma": peak}


def stamp(results, node: str = "local") -> None:
    """Name this process's machine (as ``node``) on each of ``results`` it made: a failure
    names none (its error is the record), and a result that names one keeps it."""
    for result in results:
        if result.machine is None and not result.error:
            result.machine = this_machine(node)


def machine_text(machine: dict) -> str:
    """Canonical JSON of a machine: its identity in the database."""
    return json.dumps(machine, sort_keys=True)


def peak_gflops(machine: Optional[dict]) -> Optional[float]:
    """The best per-core float32 peak a machine measured, None if it did not."""
    if not machine or not machine.get("fma"):
        return None
    return max(w["peak_gflops"] for w in machine["fma"])
