"""Describing another machine (target/description.py, ``SHAPESHIFT_DESCRIBE_CPU``): the host
target, its key and the calibration cache follow the described CPU; a description that could
not stand for this machine is an error, never a silent fall back to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shapeshift.errors import ShapeshiftError
from shapeshift.target import host_target
from shapeshift.target.calibrate import FmaCalibration, WidthFacts, measure_fma
from shapeshift.target.cpu import parse_cpuinfo
from shapeshift.target.description import DESCRIBE_CPU_ENV, GENERIC_CACHES, described_target, target_from_cpu
from shapeshift.target.report import describe

SAMPLES = Path(__file__).parent / "target_samples"
SKYLAKE = SAMPLES / "skylake_client.cpuinfo"  # AVX2 and FMA only: any machine that runs the kernels has them


@pytest.fixture
def described(monkeypatch):
    """Makes this process describe the CPU in a cpuinfo file (host_target is read once per
    process: its cache is cleared on the way in and out)."""
    def describe_as(path: Path) -> None:
        monkeypatch.setenv(DESCRIBE_CPU_ENV, str(path))
        host_target.cache_clear()

    yield describe_as
    monkeypatch.undo()
    host_target.cache_clear()


def _calibration(target_key: str, peak: float) -> dict:
    facts = WidthFacts(bits=256, lanes=8, fma_per_ns=peak / 16, latency_ns=1.0, peak_gflops=peak)
    return FmaCalibration(target_key=target_key, cpu_model="?", widths=(facts,)).to_json()


def test_the_host_target_is_the_described_cpu(described):
    real = host_target()
    described(SKYLAKE)
    target = host_target()
    sample = parse_cpuinfo(SKYLAKE.read_text())
    assert target.cpu_model == sample.model_name and target.flags == sample.flags
    assert target.key == target_from_cpu(sample, GENERIC_CACHES).key != real.key
    assert target.caches == GENERIC_CACHES and target.march == "native"
    assert any(DESCRIBE_CPU_ENV in line and line.startswith("warning:") for line in describe(target))


def test_the_calibration_cache_follows_the_described_key(described, tmp_path):
    """What is measured under a description is cached (and looked up) under the described
    key, never this CPU's own: the cached entry of the described key is the one read."""
    real = host_target()
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / f"fma-{real.key}.json").write_text(json.dumps(_calibration(real.key, 100.0)))
    described(SKYLAKE)
    key = host_target().key
    (folder / f"fma-{key}.json").write_text(json.dumps(_calibration(key, 42.0)))
    result = measure_fma(cache_dir=tmp_path)
    assert result.target_key == key and result.peak_gflops == 42.0


def test_a_description_claiming_what_this_cpu_lacks_is_refused(tmp_path):
    """Kernels built for the described CPU run on this one: an AVX2-only machine may not stand
    for a Sapphire Rapids (AVX-512, AMX)."""
    avx2_only = parse_cpuinfo(SKYLAKE.read_text())
    with pytest.raises(ShapeshiftError, match=f"{DESCRIBE_CPU_ENV}=.*sapphire_rapids.cpuinfo.*amx_tile.*"
                                              "avx512f.*which this CPU lacks"):
        described_target(SAMPLES / "sapphire_rapids.cpuinfo", avx2_only)
    # The same description stands for a CPU that has it all (its own).
    spr = parse_cpuinfo((SAMPLES / "sapphire_rapids.cpuinfo").read_text())
    assert described_target(SAMPLES / "sapphire_rapids.cpuinfo", spr).cpu_model == spr.model_name


@pytest.mark.parametrize("content", [None, "", "processor\t: 0\nvendor_id\t: GenuineIntel\n"])
def test_an_unreadable_or_empty_description_is_an_error_not_this_machine(described, tmp_path, content):
    path = tmp_path / "cpuinfo"
    if content is not None:
        path.write_text(content)
    described(path)
    with pytest.raises(ShapeshiftError, match=f"{DESCRIBE_CPU_ENV}={path}"):
        host_target()

