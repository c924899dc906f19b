"""bench/machine.py's core-to-core probe: a round trip of one cache line between two
threads, in nanoseconds, which the results' machine paragraph reports (2-thread results on
these VMs depend on it)."""

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
