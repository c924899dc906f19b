"""The target description: parsed from fixed samples of other machines, named levels, the
measured FMA facts and their cache, and ``shapeshift info --machine``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shapeshift.cli.main import main
from shapeshift.codegen.defaults import default_schedule
from shapeshift.codegen.kernels.gemm import tile_registers
from shapeshift.errors import ShapeshiftError
from shapeshift.target import host_target, measure_fma, named_target
from shapeshift.target.calibrate import FmaCalibration, WidthFacts
from shapeshift.target.cpu import Caches, parse_cpuinfo, parse_size, read_caches
from shapeshift.target.microarch import width_rate_mismatch
from shapeshift.target.report import describe
from shapeshift.target.description import X86_64_V3, X86_64_V4, target_from_cpu

SAMPLES = Path(__file__).parent / "target_samples"


def _sysfs(root: Path, levels: dict) -> Path:
    """A cpu0/cache folder as sysfs lays it out: index<i>/{level,type,size}."""
    for i, (level, kind, size) in enumerate(levels):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    return root


SPR_CACHES = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "107520K")]
ZEN4_CACHES = [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]
ZEN5_CACHES = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]
SKL_CACHES = [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "256K"), (3, "Unified", "8192K")]


def _target(name: str, caches, tmp_path: Path):
    cpu = parse_cpuinfo((SAMPLES / f"{name}.cpuinfo").read_text())
    return target_from_cpu(cpu, read_caches(_sysfs(tmp_path / name, caches)))


def test_sapphire_rapids(tmp_path):
    t = _target("sapphire_rapids", SPR_CACHES, tmp_path)
    assert (t.cpu.vendor, t.cpu.family, t.cpu.model, t.cpu.logical_cpus) == ("GenuineIntel", 6, 143, 4)
    assert t.cpu_model == "Intel(R) Xeon(R) Platinum 8488C"
    assert t.avx512 and t.vnni and t.amx and t.vector_registers == 32 and t.widths == (256, 512)
    assert t.caches == Caches(l1d=48 << 10, l2=2 << 20, l3=107520 << 10)
    assert t.microarch.name == "intel-avx512"
    assert "AMX" in t.isa and "AVX-512-FP16" in t.isa
    s = default_schedule(t)
    assert (s.lanes, s.registers) == (16, 32) and (s.mr, s.nr) == t.microarch.tile
    assert tile_registers(s.mr, s.nr, s.lanes) <= 32
    # kc: A and B micro-panels within 3/4 of the 48 KiB L1d.
    assert s.kc * (s.mr + s.nr) * 4 <= 48 * 1024 * 3 // 4 < (s.kc + 32) * (s.mr + s.nr) * 4


def test_zen4(tmp_path):
    t = _target("zen4", ZEN4_CACHES, tmp_path)
    assert t.cpu.vendor == "AuthenticAMD" and t.avx512 and t.vnni and not t.amx
    assert t.microarch.name == "amd-zen4"
    s = default_schedule(t)
    assert (s.mr, s.nr, s.lanes, s.registers) == (8, 16, 16, 32)
    # The cache rule's blocking (the class measures none of its own): 3/4 of the 32 KiB L1d
    # over 8 + 16 floats a k gives kc 256; a quarter of the 1 MiB L2 caps mc at 24 panels.
    assert (s.kc, s.mc) == (256, 192) and t.microarch.blocking is None
    # The class's measured small-M bound (9 and 10 rows: one 8-row panel and an edge).
    assert s.small_m == t.microarch.small_m == 10


def test_zen5(tmp_path):
    t = _target("zen5", ZEN5_CACHES, tmp_path)
    assert (t.cpu.vendor, t.cpu.family, t.cpu.model) == ("AuthenticAMD", 26, 2)
    assert t.avx512 and t.vnni and not t.amx and t.widths == (256, 512)
    assert t.microarch.name == "amd-zen5" and t.microarch.zmm_full_rate
    s = default_schedule(t)
    assert (s.mr, s.nr, s.lanes, s.registers) == (8, 48, 16, 32)
    assert tile_registers(s.mr, s.nr, s.lanes) <= 32
    # The class's measured blocking over the cache rule (which gives kc 160 on a 48 KiB L1d).
    assert (s.kc, s.mc) == t.microarch.blocking == (384, 96) and s.mc % s.mr == 0


def _calibration(zmm_gflops: float, ymm_gflops: float) -> FmaCalibration:
    def facts(bits, gflops):
        lanes = bits // 32
        return WidthFacts(bits=bits, lanes=lanes, fma_per_ns=gflops / lanes / 2, latency_ns=1.0, peak_gflops=gflops)
    return FmaCalibration(target_key="k", cpu_model="m", widths=(facts(256, ymm_gflops), facts(512, zmm_gflops)))


@pytest.mark.parametrize("sample,caches", [("zen4", ZEN4_CACHES), ("zen5", ZEN5_CACHES),
                                           ("sapphire_rapids", SPR_CACHES)])
def test_measured_width_rate_checks_the_class(sample, caches, tmp_path):
    """A class's assumption about the 512-bit FMA rate is checked against the calibration:
    silent where they agree, a warning naming the measured ratio where they do not (a Zen 5
    laptop core issues zmm FMAs as two halves, though its family says Zen 5)."""
    target = _target(sample, caches, tmp_path)
    klass = target.microarch
    full, halves = _calibration(250.0, 125.0), _calibration(112.0, 112.0)
    agreeing, contradicting = (full, halves) if klass.zmm_full_rate else (halves, full)
    assert width_rate_mismatch(klass, agreeing) is None
    message = width_rate_mismatch(klass, contradicting)
    assert message is not None and klass.name in message
    assert ("2.00" if contradicting is full else "1.00") in message
    assert any(line.startswith("warning:") and klass.name in line for line in describe(target, contradicting))
    assert not any(line.startswith("warning:") for line in describe(target, agreeing))


def test_avx2_only_cpu(tmp_path):
    t = _target("skylake_client", SKL_CACHES, tmp_path)
    assert not t.avx512 and not t.amx and t.has("avx2", "fma")
    assert t.vector_registers == 16 and t.widths == (256,) and t.microarch.name == "avx2"
    s = default_schedule(t)
    assert (s.mr, s.nr, s.lanes, s.registers) == (6, 16, 8, 16)
    assert "AVX-512F" not in t.isa


def test_named_levels():
    v3, v4 = named_target("x86-64-v3"), named_target("x86-64-v4")
    assert v3.march == "x86-64-v3" and v3.has("avx2", "fma") and not v3.has("avx512f")
    assert v4.avx512 and v4.flags == X86_64_V4 and X86_64_V3 < X86_64_V4
    assert default_schedule(v3).lanes == 8 and default_schedule(v4).lanes == 16
    assert named_target("native") is host_target()
    with pytest.raises(ShapeshiftError, match="unknown target 'x86-64-v9'.*x86-64-v3, x86-64-v4"):
        named_target("x86-64-v9")


def test_parsers_degrade():
    assert parse_size("48K") == 48 << 10 and parse_size("1M") == 1 << 20 and parse_size("junk") == 0
    assert read_caches(Path("/nonexistent")) == Caches(0, 0, 0)
    empty = parse_cpuinfo("")
    assert empty.flags == frozenset() and empty.model_name == "" and empty.logical_cpus == 1
    t = target_from_cpu(empty, Caches(0, 0, 0))
    assert t.caches.l1d > 0 and t.microarch.name == "avx2"  # unknown sizes: generic ones


def test_key_changes_with_model_or_flags(tmp_path):
    spr = _target("sapphire_rapids", SPR_CACHES, tmp_path)
    text = (SAMPLES / "sapphire_rapids.cpuinfo").read_text()
    fewer = target_from_cpu(parse_cpuinfo(text.replace(" amx_tile", "")), spr.caches)
    other = target_from_cpu(parse_cpuinfo(text.replace("8488C", "8480+")), spr.caches)
    assert len({spr.key, fewer.key, other.key}) == 3


def test_fma_calibration_measures_then_caches(tmp_path):
    """Measured on this machine: a plausible peak per width (AVX2 always, AVX-512 where
    present), cached under the cache dir by the target's key, reused, and measured again
    when the file is damaged."""
    target = host_target()
    first = measure_fma(target, cache_dir=tmp_path)
    widths = {w.bits: w for w in first.widths}
    assert set(widths) == set(target.widths)
    for w in first.widths:
        assert w.lanes == w.bits // 32 and 0.05 < w.latency_ns < 20 and w.fma_per_ns > 0
        assert w.peak_gflops == pytest.approx(w.fma_per_ns * w.lanes * 2, rel=1e-3)
        assert 2 <= w.chains <= 24
    path = tmp_path / "target" / f"fma-{target.key}.json"
    assert json.loads(path.read_text())["target_key"] == target.key
    path.write_text(json.dumps({**json.loads(path.read_text()), "cpu_model": "from the cache"}))
    assert measure_fma(target, cache_dir=tmp_path).cpu_model == "from the cache"
    path.write_text("{ damaged")
    again = measure_fma(target, cache_dir=tmp_path)
    assert again.cpu_model == target.cpu_model and json.loads(path.read_text())["target_key"] == target.key
    with pytest.raises(ValueError, match="only the host"):
        measure_fma(named_target("x86-64-v3"), cache_dir=tmp_path)


def test_info_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    assert main(["info", "--machine"]) == 0
    out = capsys.readouterr().out
    target = host_target()
    assert f"cpu:        {target.cpu_model}" in out and "fma 256:" in out and "untuned tile" in out
    assert ("fma 512:" in out) == target.has("avx512f")
    assert main(["info"]) == 2
    assert "info needs a MODEL" in capsys.readouterr().err


def test_conv_paths_follow_the_gemm_tile(tmp_path):
    # The wide zmm tiles (Zen 5, Xeon: 8x48) run small-plane dense convs in the GEMM's own
    # tile up to conv_panels.MAX_PLANE pixels and the small-plane GEMM up to 64; the narrow
    # 16-column tiles (Zen 4's 8x16 zmm, AVX2's 6x16 ymm) take neither switch of theirs: no
    # conv_panels, 9 pixels.
    from shapeshift.codegen.defaults import conv_igemm_min_plane, conv_panels_max_plane
    from shapeshift.codegen.kernels import conv_panels

    wide = [_target("zen5", ZEN5_CACHES, tmp_path), _target("sapphire_rapids", SPR_CACHES, tmp_path)]
    narrow = [_target("zen4", ZEN4_CACHES, tmp_path), _target("skylake_client", SKL_CACHES, tmp_path)]
    for t in wide:
        assert default_schedule(t).nr >= 32
        assert (conv_panels_max_plane(t), conv_igemm_min_plane(t)) == (conv_panels.MAX_PLANE, 64)
        assert f"#define SS_CONV_PANELS_MAX_PLANE {conv_panels.MAX_PLANE}\n" in conv_panels.source(t)
    for t in narrow:
        assert default_schedule(t).nr == 16
        assert (conv_panels_max_plane(t), conv_igemm_min_plane(t)) == (0, 9)
        assert "#define SS_CONV_PANELS_MAX_PLANE 0\n" in conv_panels.source(t)
