"""bench/machine.py: the core-to-core probe (a round trip of one cache line between two
threads, in nanoseconds, which the results' machine paragraph reports: 2-thread results on
these VMs depend on it), and the geomean and plot helpers every bench shares."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import machine  # noqa: E402


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the probe needs two CPUs")
def test_the_round_trip_is_measured_and_reported():
    start = time.monotonic()
    ns = machine.core_to_core_ns(rounds=20_000)
    # A round trip is two cache-line transfers: tens of ns between cores that share a cache,
    # hundreds across a socket, milliseconds when a busy machine deschedules a spinning
    # thread (the tests' other worker); the probe stops at its time budget then.
    assert ns is not None and math.isfinite(ns) and ns > 10
    assert time.monotonic() - start < 30
    assert "Core-to-core round trip when this was written:" in machine.describe()


def test_geomean_leaves_out_what_is_not_a_ratio():
    assert machine.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert machine.geomean(v for v in (0.5, 2.0, float("nan"), None, 0.0, -1.0, float("inf"))) == pytest.approx(1.0)
    assert math.isnan(machine.geomean([])) and math.isnan(machine.geomean([float("nan")]))


def test_pyplot_is_none_without_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert machine.pyplot() is None
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_installed_env_reads_compiled_bytecode_like_an_installed_package():
    """The child's environment lets Python read and write bytecode (these machines set
    PYTHONDONTWRITEBYTECODE=1), the rest kept; the package is compiled beside its sources."""
    import importlib.util

    env = machine.installed_env({"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "2"})
    assert env == {"OMP_NUM_THREADS": "2"}
    package = Path(machine.__file__).resolve().parent.parent / "shapeshift"
    for module in (package / "__init__.py", package / "codegen" / "program.py"):
        assert Path(importlib.util.cache_from_source(str(module))).is_file(), module
