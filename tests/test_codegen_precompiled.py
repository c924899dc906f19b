"""Precompiled headers (codegen/precompiled.py): made once per flag set, used by every unit
that starts with the prelude's includes, never changing what is compiled, and thrown away
when damaged or stale."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest

from shapeshift.codegen import build, precompiled
from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels.prelude import HEADER, PRELUDE

pytestmark = pytest.mark.skipif(
    "Free Software Foundation" not in build.compiler_version(build.find_compiler()),
    reason="precompiled headers are made with gcc only; this compiler is another")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("SHAPESHIFT_CC", raising=False)
    monkeypatch.delenv("SHAPESHIFT_PRECOMPILED_HEADER", raising=False)


def unit(k: int) -> str:
    # Uses the header's intrinsics: a unit that compiled without its includes would fail.
    return HEADER + f"""
float ss_unit_{k}(const float* x) {{
#ifdef __AVX2__
    __m256 v = _mm256_loadu_ps(x);
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(v, _mm256_set1_ps({k}.0f)));
    return out[0] + out[7];
#else
    return x[0] + x[7] + 2 * {k};
#endif
}}
"""


def library(cache: Path, count: int = 3, opt: tuple = ("-O0",), start: int = 0):
    """A library of ``count`` units at ``opt`` and its own source at -O3, from ``cache``."""
    names = range(start, start + count)
    declarations = "".join(f"float ss_unit_{k}(const float* x);\n" for k in names)
    total = "float ss_total(const float* x) { return " + " + ".join(f"ss_unit_{k}(x)" for k in names) + "; }\n"
    return compile_library(PRELUDE + declarations + total, name_hint="units", cache_dir=cache,
                           objects=[(f"unit {k}", unit(k), opt) for k in names], source_opt=("-O3",))


def call_total(lib) -> float:
    import ctypes

    x = (ctypes.c_float * 8)(*range(8))
    lib.cdll.ss_total.restype = ctypes.c_float
    lib.cdll.ss_total.argtypes = [ctypes.c_void_p]
    return lib.cdll.ss_total(x)


def expected_total(count: int = 3, start: int = 0) -> float:
    return sum(0 + 7 + 2 * k for k in range(start, start + count))


def included(cmd: list[str]) -> Path | None:
    return Path(cmd[cmd.index("-include") + 1]) if "-include" in cmd else None


def opt_of(cmd: list[str]) -> str:
    return next(f for f in cmd if f.startswith("-O"))


def header_folders(cache: Path) -> list[Path]:
    return sorted(p.parent for p in (cache / "headers").glob(f"*/{precompiled.HEADER_FILE}.gch"))


def test_enough_units_make_a_header_that_each_unit_at_those_flags_uses(tmp_path, compiles):
    cache = tmp_path / "cache"
    lib = library(cache, count=3)
    assert call_total(lib) == expected_total()
    folders = header_folders(cache)
    assert len(folders) == 1, "three -O0 units make one header; the lone -O3 unit does not"
    compiles = [c for c in compiles if "-c" in c]
    assert len(compiles) == 4
    for cmd in compiles:
        if opt_of(cmd) == "-O0":
            assert included(cmd) == folders[0] / precompiled.HEADER_FILE
        else:
            assert included(cmd) is None, "no -O3 header exists, and one unit is not worth making it"
    # The header was made with the units' own flags: the -O0 compile's, less -c.
    deps = json.loads((folders[0] / "deps.json").read_text())
    assert any(path.endswith("immintrin.h") for path, _, _ in deps) or "__AVX2__" not in HEADER


def test_a_precompiled_header_changes_no_object(tmp_path, monkeypatch):
    with_header, without = tmp_path / "with", tmp_path / "without"
    library(with_header, count=3)
    assert header_folders(with_header)
    monkeypatch.setenv("SHAPESHIFT_PRECOMPILED_HEADER", "0")
    library(without, count=3)
    assert not (without / "headers").exists() or not header_folders(without)
    objects = {p.name: p.read_bytes() for p in with_header.rglob("*.o")}
    others = {p.name: p.read_bytes() for p in without.rglob("*.o")}
    assert objects.keys() == others.keys() and len(objects) == 3
    assert objects == others


def test_each_optimization_level_gets_its_own_header(tmp_path, compiles):
    # A header made at one -O level and used at another can crash gcc (cc1 segfaulted on an
    # -O3 unit given the -O1 header on gcc 12): a header is only ever used at its own level.
    cache = tmp_path / "cache"
    lib_a = library(cache, count=3, opt=("-O0",))
    lib_b = library(cache, count=3, opt=("-O1",), start=10)
    assert call_total(lib_a) == expected_total() and call_total(lib_b) == expected_total(start=10)
    folders = header_folders(cache)
    assert len(folders) == 2
    by_level = {}
    for cmd in compiles:
        if included(cmd) is not None:
            by_level.setdefault(opt_of(cmd), set()).add(included(cmd).parent)
    assert set(by_level) == {"-O0", "-O1"}
    assert by_level["-O0"].isdisjoint(by_level["-O1"])
    assert all(len(folders) == 1 for folders in by_level.values())


def test_a_later_build_uses_the_header_even_for_one_unit(tmp_path, compiles):
    cache = tmp_path / "cache"
    library(cache, count=3)
    compiles.clear()
    lib = library(cache, count=1, start=20)
    assert call_total(lib) == expected_total(count=1, start=20)
    unit_compiles = [c for c in compiles if "-c" in c and opt_of(c) == "-O0"]
    assert len(unit_compiles) == 1 and included(unit_compiles[0]) is not None


def test_a_file_that_is_no_precompiled_header_is_not_used(tmp_path, compiles):
    cache = tmp_path / "cache"
    library(cache, count=3)
    (folder,) = header_folders(cache)
    (folder / f"{precompiled.HEADER_FILE}.gch").write_bytes(b"not a header" * 100)
    assert precompiled.find(folder) is None
    compiles.clear()
    lib = library(cache, count=1, start=90)
    assert call_total(lib) == expected_total(count=1, start=90)
    assert all(included(c) is None for c in compiles)
    library(cache, count=3, start=95)
    assert precompiled.find(folder) is not None, "remade by the next build worth it"


def test_a_damaged_header_is_discarded_and_the_build_goes_on(tmp_path, compiles, caplog):
    # gcc fails a unit over a truncated one (cc1: "while reading precompiled header").
    cache = tmp_path / "cache"
    library(cache, count=3)
    (folder,) = header_folders(cache)
    gch = folder / f"{precompiled.HEADER_FILE}.gch"
    data = gch.read_bytes()
    gch.write_bytes(data[: len(data) // 3])
    compiles.clear()
    with caplog.at_level(logging.WARNING, logger="shapeshift.codegen.build"):
        lib = library(cache, count=1, start=30)
    assert call_total(lib) == expected_total(count=1, start=30)
    assert "discarding the precompiled header" in caplog.text
    assert not gch.exists() and precompiled.find(folder) is None
    # Made again by the next build worth it, and used.
    compiles.clear()
    library(cache, count=3, start=40)
    assert precompiled.find(folder) is not None
    assert all(included(c) is not None for c in compiles if "-c" in c and opt_of(c) == "-O0")


def test_a_header_made_from_files_changed_since_is_not_used(tmp_path, compiles):
    cache = tmp_path / "cache"
    library(cache, count=3)
    (folder,) = header_folders(cache)
    deps_file = folder / "deps.json"
    deps = json.loads(deps_file.read_text())
    deps[-1][2] += 1  # one system header's mtime, as if it were updated after
    deps_file.write_text(json.dumps(deps))
    assert precompiled.find(folder) is None
    compiles.clear()
    library(cache, count=1, start=50)
    assert all(included(c) is None for c in compiles), "a stale header is not used by a build not worth remaking it"
    library(cache, count=3, start=60)
    assert precompiled.find(folder) is not None


def test_a_compiler_that_cannot_make_one_is_asked_once(tmp_path, monkeypatch):
    # A wrapper that is gcc (same --version) but refuses to precompile a header.
    real = build.find_compiler()
    wrapper = tmp_path / "cc-no-pch"
    wrapper.write_text("#!/bin/sh\n"
                       'for a in "$@"; do [ "$a" = c-header ] && { echo "no headers here" >&2; exit 1; }; done\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SHAPESHIFT_CC", str(wrapper))
    made = []
    real_make = precompiled._make
    monkeypatch.setattr(precompiled, "_make", lambda *a: made.append(a) or real_make(*a))
    cache = tmp_path / "cache"
    lib = library(cache, count=3)
    assert call_total(lib) == expected_total()
    assert len(made) == 1 and not header_folders(cache)
    (unusable,) = (cache / "headers").glob("*/unusable")
    assert "no headers here" in unusable.read_text()
    library(cache, count=3, start=70)
    assert len(made) == 1, "the refusal is remembered, not asked again per build"


def test_only_gcc_and_only_units_that_start_with_the_header():
    gcc = "gcc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc."
    clang = "Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu"
    assert precompiled.applies(HEADER + "int x;", gcc)
    assert not precompiled.applies(HEADER + "int x;", clang)
    assert not precompiled.applies("#include <stdint.h>\n" + HEADER, gcc)
    assert precompiled.header_flags(("-O0", "-march=native", "-c")) == ("-O0", "-march=native")
    assert precompiled.header_flags(("-O3", "-shared", "-fPIC")) == ("-O3", "-fPIC")


def test_the_warm_up_makes_the_header_a_build_then_uses(tmp_path, compiles):
    cache = tmp_path / "cache"
    flags = build.with_opt(build.target_flags(), ("-O1",))
    header = build.precompile_header(flags, cache_dir=cache)
    assert header is not None and precompiled.find(header.parent) == header
    library(cache, count=1, opt=("-O1",), start=80)
    (cmd,) = [c for c in compiles if "-c" in c and opt_of(c) == "-O1"]
    assert included(cmd) == header


def test_a_cache_that_cannot_hold_the_header_only_costs_the_time(tmp_path, monkeypatch, caplog):
    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(precompiled, "_make", full_disk)
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING, logger="shapeshift.codegen.precompiled"):
        lib = library(cache, count=3)
    assert call_total(lib) == expected_total()
    assert "No space left on device" in caplog.text and not header_folders(cache)


def _build_in_child(cache: str, start: int, results) -> None:
    try:
        results.put(call_total(library(Path(cache), count=3, start=start)))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put(repr(exc))


def test_two_processes_make_one_header_and_both_build(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    cache = str(tmp_path / "cache")
    children = [context.Process(target=_build_in_child, args=(cache, start, results)) for start in (100, 200)]
    for child in children:
        child.start()
    got = sorted(results.get(timeout=300) for _ in children)
    for child in children:
        child.join(timeout=60)
    assert got == sorted([expected_total(start=100), expected_total(start=200)])
    (folder,) = header_folders(Path(cache))
    assert precompiled.find(folder) is not None
    assert not list(folder.glob(".make.*")), "no scratch folder left behind"
