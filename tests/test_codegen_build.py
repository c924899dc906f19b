"""The build cache: compile C into a loaded library, reuse it, survive corruption and races."""

from __future__ import annotations

import ctypes
import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shapeshift.codegen import build
from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.errors import CompileError, CompilerNotFoundError, ShapeshiftError

ADD_SOURCE = """
#include <stdint.h>
int64_t add(int64_t a, int64_t b) { return a + b; }
"""

OMP_SOURCE = """
#include <stdint.h>
double sum(const double* x, int64_t n) {
    double s = 0.0;
    #pragma omp parallel for reduction(+:s)
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}
"""

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("SHAPESHIFT_CC", raising=False)
    monkeypatch.delenv("SHAPESHIFT_CACHE_DIR", raising=False)


def call_add(lib, a: int, b: int) -> int:
    fn = lib.cdll.add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    return fn(a, b)


def so_files(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.so"))


def copy_cache(src: Path, dst: Path) -> None:
    """A second cache holding the same entries under new paths (never dlopen'ed in this process,
    so loading there really reads the file, not the handle glibc keeps per path)."""
    shutil.copytree(src, dst)


def test_compile_and_call(tmp_path, compiles):
    lib = compile_library(ADD_SOURCE, cache_dir=tmp_path)
    assert call_add(lib, 40, 2) == 42
    assert call_add(lib, -(2**40), 1) == -(2**40) + 1
    assert len(compiles) == 1
    assert lib.path == tmp_path / lib.key[:2] / f"{lib.key}.so"
    assert lib.source_path.read_text() == ADD_SOURCE
    meta = json.loads((lib.path.with_suffix(".json")).read_text())
    assert meta["key"] == lib.key
    assert meta["so_size"] == lib.path.stat().st_size
    assert meta["flags"] == list(DEFAULT_FLAGS)
    assert meta["compiler_version"] and meta["shapeshift_version"]
    assert not [p for p in lib.path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_second_compile_is_a_cache_hit(tmp_path, compiles):
    first = compile_library(ADD_SOURCE, cache_dir=tmp_path)
    stat = first.path.stat()
    second = compile_library(ADD_SOURCE, name_hint="other_name", cache_dir=tmp_path)
    assert len(compiles) == 1
    assert second.key == first.key and second.path == first.path
    assert (second.path.stat().st_ino, second.path.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert call_add(second, 1, 2) == 3


def test_cache_dir_from_environment(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "env_cache"))
    assert build.default_cache_dir() == tmp_path / "env_cache"
    lib = compile_library(ADD_SOURCE)
    assert lib.path.is_relative_to(tmp_path / "env_cache")
    monkeypatch.delenv("SHAPESHIFT_CACHE_DIR")
    assert build.default_cache_dir() == Path.home() / ".cache" / "shapeshift"


def test_a_cache_folder_that_cannot_be_used_is_named(tmp_path, monkeypatch):
    """A file where the cache folder should be (or a read-only home): an error naming the
    cache and SHAPESHIFT_CACHE_DIR, not a NotADirectoryError from deep in the build."""
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(blocker))
    with pytest.raises(ShapeshiftError, match=f"the build cache {blocker} cannot be used .*SHAPESHIFT_CACHE_DIR"):
        compile_library(ADD_SOURCE)


def test_flags_and_source_change_the_key(tmp_path, compiles):
    base = compile_library(ADD_SOURCE, cache_dir=tmp_path)
    flagged = compile_library(ADD_SOURCE, flags=[*DEFAULT_FLAGS, "-DUNUSED=1"], cache_dir=tmp_path)
    edited = compile_library(ADD_SOURCE + "\n// edited\n", cache_dir=tmp_path)
    assert len({base.key, flagged.key, edited.key}) == 3
    assert len(compiles) == 3
    assert len(so_files(tmp_path)) == 3
    assert call_add(flagged, 2, 3) == 5
    assert build.cache_key("x", DEFAULT_FLAGS, "gcc 1") != build.cache_key("x", DEFAULT_FLAGS, "gcc 2")
    # Parts are length-prefixed: moving text between flags and source changes the key.
    assert build.cache_key("b", ("a",), "v") != build.cache_key("", ("ab",), "v")


def test_what_native_means_here_is_part_of_the_key(monkeypatch):
    # A cache shared by two machines (NFS) must not give a Xeon's AMX code to a Zen 4.
    portable = ("-O3", "-march=x86-64-v3")
    keys = {}
    for cpu in ("AMD EPYC 9R14\0avx2 avx512f fma", "Intel Xeon Platinum 8488C\0amx_tile avx2 avx512f fma"):
        monkeypatch.setattr(build, "native_cpu", lambda cpu=cpu: cpu)
        keys[cpu] = (build.cache_key("x", DEFAULT_FLAGS, "gcc"), build.cache_key("x", portable, "gcc"))
    (zen_native, zen_v3), (xeon_native, xeon_v3) = keys.values()
    assert zen_native != xeon_native
    assert zen_v3 == xeon_v3, "code for a named target is the same whoever builds it"
    monkeypatch.undo()
    assert build.native_cpu() == build.native_cpu() and "avx2" in build.native_cpu()


@pytest.mark.parametrize("corruption", ["truncated", "garbage", "no_metadata", "bad_metadata"])
def test_corrupt_entry_is_rebuilt(tmp_path, compiles, corruption):
    good = compile_library(ADD_SOURCE, cache_dir=tmp_path / "a")
    copy_cache(tmp_path / "a", tmp_path / "b")
    so = tmp_path / "b" / good.key[:2] / f"{good.key}.so"
    meta = so.with_suffix(".json")
    data = so.read_bytes()
    if corruption == "truncated":
        so.write_bytes(data[: len(data) // 2])
    elif corruption == "garbage":
        so.write_bytes(os.urandom(len(data)))
    elif corruption == "no_metadata":
        meta.unlink()
    else:
        meta.write_text("{not json")

    lib = compile_library(ADD_SOURCE, cache_dir=tmp_path / "b")
    assert len(compiles) == 2  # rebuilt, not loaded
    assert lib.path == so
    assert so.read_bytes() == data  # the build is reproducible
    assert json.loads(meta.read_text())["so_size"] == len(data)
    assert call_add(lib, 20, 22) == 42


def test_unloadable_entry_with_matching_metadata_is_rebuilt(tmp_path, compiles):
    good = compile_library(ADD_SOURCE, cache_dir=tmp_path / "a")
    copy_cache(tmp_path / "a", tmp_path / "b")
    so = tmp_path / "b" / good.key[:2] / f"{good.key}.so"
    meta_path = so.with_suffix(".json")
    garbage = b"\x7fELF this is not a shared library" * 10
    so.write_bytes(garbage)
    meta = json.loads(meta_path.read_text())
    meta.update(so_size=len(garbage), so_sha256=hashlib.sha256(garbage).hexdigest())
    meta_path.write_text(json.dumps(meta))

    lib = compile_library(ADD_SOURCE, cache_dir=tmp_path / "b")
    assert len(compiles) == 2
    assert so.read_bytes() != garbage
    assert call_add(lib, 5, 6) == 11


def test_missing_compiler_from_environment(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv("SHAPESHIFT_CC", "/nonexistent/cc")
    with pytest.raises(CompilerNotFoundError, match="/nonexistent/cc") as info:
        compile_library(ADD_SOURCE, cache_dir=tmp_path)
    assert isinstance(info.value, ShapeshiftError)
    assert "no C compiler found" in str(info.value)
    assert compiles == []


def test_no_compiler_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CompilerNotFoundError, match="install gcc or set SHAPESHIFT_CC") as info:
        compile_library(ADD_SOURCE, cache_dir=tmp_path)
    assert "cc, gcc" in str(info.value)


def test_compile_error_keeps_the_source(tmp_path):
    source = ADD_SOURCE + "\nint broken( { return 0 }\n"
    with pytest.raises(CompileError) as info:
        compile_library(source, name_hint="broken_kernels", cache_dir=tmp_path)
    message = str(info.value)
    kept = [p for p in tmp_path.rglob("*.failed.c")]
    assert len(kept) == 1
    assert str(kept[0]) in message
    assert kept[0].read_text() == source
    assert "error" in message and "broken_kernels" in message
    assert so_files(tmp_path) == []
    assert not list(tmp_path.rglob("*.json"))


def _compile_in_child(source: str, cache_dir: str, barrier, results) -> None:
    from shapeshift.codegen import build as child_build

    calls = []
    real = child_build._run_compiler
    child_build._run_compiler = lambda cmd: (calls.append(cmd), real(cmd))[1]
    barrier.wait()
    lib = child_build.compile_library(source, cache_dir=Path(cache_dir))
    fn = lib.cdll.add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    results.put((fn(19, 23), len(calls), str(lib.path)))


def test_two_processes_compile_the_same_source(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    source = ADD_SOURCE + "\n// concurrent build\n"
    procs = [ctx.Process(target=_compile_in_child, args=(source, str(tmp_path), barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[0] for r in got] == [42, 42]
    assert sum(r[1] for r in got) == 1  # the lock made one of them wait and reuse the other's build
    assert got[0][2] == got[1][2]
    assert so_files(tmp_path) == [Path(got[0][2])]
    assert not [p for p in Path(got[0][2]).parent.iterdir() if p.name.startswith(".")]


def test_openmp_reduction(tmp_path):
    lib = compile_library(OMP_SOURCE, name_hint="omp_sum", cache_dir=tmp_path)
    fn = lib.cdll.sum
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_int64]
    x = np.random.default_rng(0).random(100_003)
    result = fn(x.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), x.size)
    assert result == pytest.approx(float(x.sum()), rel=1e-12)
    assert fn(x.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), 0) == 0.0


# --------------------------------------------------------------------------- libraries that link objects
TWICE_OBJECT = """
#include <stdint.h>
static int64_t twice_impl(int64_t a) { return 2 * a; }
int64_t twice(int64_t a) { return twice_impl(a); }
"""


def _caller(offset: int) -> str:
    return f"""
#include <stdint.h>
int64_t twice(int64_t a);
int64_t add(int64_t a, int64_t b) {{ return twice(a) + b + {offset}; }}
"""


def _objects(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.o"))


def test_a_library_links_its_objects_and_shares_them(tmp_path, compiles):
    first = compile_library(_caller(0), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT)])
    assert call_add(first, 20, 2) == 42
    # The object, the library's own object, the link.
    assert len(compiles) == 3 and sum("-shared" in c for c in compiles) == 1
    (obj,) = _objects(tmp_path)
    meta = json.loads(obj.with_suffix(".json").read_text())
    assert meta["so_sha256"] == hashlib.sha256(obj.read_bytes()).hexdigest()
    assert json.loads(first.path.with_suffix(".json").read_text())["linked"] == [meta["key"]]
    assert not [p for p in tmp_path.rglob(".*")]  # no scratch files left

    second = compile_library(_caller(100), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT)])
    assert call_add(second, 20, 2) == 142
    assert len(compiles) == 5, "the object came from the cache"
    assert _objects(tmp_path) == [obj]


def test_an_edited_object_changes_the_library_key(tmp_path, compiles):
    first = compile_library(_caller(0), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT)])
    tripled = TWICE_OBJECT.replace("2 * a", "3 * a")
    second = compile_library(_caller(0), cache_dir=tmp_path, objects=[("twice", tripled)])
    assert first.key != second.key
    assert call_add(second, 10, 2) == 32


@pytest.mark.parametrize("corruption", ["truncated", "no_metadata"])
def test_a_corrupt_object_is_rebuilt(tmp_path, compiles, corruption):
    compile_library(_caller(0), cache_dir=tmp_path / "a", objects=[("twice", TWICE_OBJECT)])
    (obj,) = _objects(tmp_path / "a")
    data = obj.read_bytes()
    # A new caller, so that its library is built and links the object again.
    if corruption == "truncated":
        obj.write_bytes(data[: len(data) // 2])
    else:
        obj.with_suffix(".json").unlink()
    lib = compile_library(_caller(7), cache_dir=tmp_path / "a", objects=[("twice", TWICE_OBJECT)])
    assert len(compiles) == 6  # the object is compiled again
    assert obj.read_bytes() == data
    assert call_add(lib, 1, 1) == 10


def test_an_object_that_does_not_compile_is_named(tmp_path):
    with pytest.raises(CompileError) as info:
        compile_library(_caller(0), name_hint="model", cache_dir=tmp_path,
                        objects=[("kernels.broken", TWICE_OBJECT + "int broken( {\n")])
    message = str(info.value)
    (kept,) = tmp_path.rglob("*.failed.c")
    assert "kernels.broken" in message and str(kept) in message
    assert so_files(tmp_path) == [] and _objects(tmp_path) == []


def test_a_library_that_does_not_load_says_why(tmp_path):
    # Declared, never defined, no object linked: the loader refuses the library.
    with pytest.raises(CompileError, match=r"does not load \(.*undefined symbol: twice"):
        compile_library(_caller(0), name_hint="model", cache_dir=tmp_path)


def _link_in_child(offset: int, cache_dir: str, barrier, results) -> None:
    from shapeshift.codegen import build as child_build

    calls = []
    real = child_build._run_compiler
    child_build._run_compiler = lambda cmd: (calls.append(cmd), real(cmd))[1]
    barrier.wait()
    lib = child_build.compile_library(_caller(offset), cache_dir=Path(cache_dir), objects=[("twice", TWICE_OBJECT)])
    results.put((call_add(lib, 20, 2), len(calls)))


def test_two_processes_share_an_object_they_both_lack(tmp_path):
    # Two different libraries, built at once from an empty cache, link the same object:
    # one process compiles it under its lock, the other waits and links that one.
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_link_in_child, args=(offset, str(tmp_path), barrier, results))
             for offset in (0, 100)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r[0] for r in got] == [42, 142]
    assert sum(r[1] for r in got) == 5  # two own objects, two links, one shared object
    assert len(_objects(tmp_path)) == 1
    assert not [p for p in tmp_path.rglob(".*")]


def test_openmp_wait_policy_defaults_only_where_the_user_set_none(monkeypatch):
    """libgomp's spin count is lowered before a library loads, unless the user chose a wait
    policy or a spin count of their own."""
    from shapeshift.codegen.build import OPENMP_SPINCOUNT, use_openmp_defaults

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    use_openmp_defaults()
    assert os.environ["GOMP_SPINCOUNT"] == OPENMP_SPINCOUNT
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    use_openmp_defaults()
    assert os.environ["GOMP_SPINCOUNT"] == "5"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    use_openmp_defaults()
    assert "GOMP_SPINCOUNT" not in os.environ


def _opt_of(cmd: list[str]) -> list[str]:
    return [flag for flag in cmd if flag.startswith("-O")]


def test_with_opt_replaces_the_optimization_level():
    assert build.with_opt(("-O3", "-march=native", "-c"), ("-O0",)) == ("-O0", "-march=native", "-c")
    assert build.with_opt(("-O3", "-fPIC"), ()) == ("-O3", "-fPIC")


def test_objects_and_the_source_compile_at_their_own_level(tmp_path, compiles):
    lib = compile_library(_caller(0), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT, ("-O0",))],
                          source_opt=("-O1",))
    assert call_add(lib, 20, 2) == 42
    levels = sorted(_opt_of(c)[0] for c in compiles if "-shared" not in c)
    assert levels == ["-O0", "-O1"], compiles
    (link,) = [c for c in compiles if "-shared" in c]
    assert _opt_of(link) == ["-O3"]  # the library's flags, untouched
    meta = json.loads(next(tmp_path.rglob("*.o")).with_suffix(".json").read_text())
    assert meta["flags"][0] == "-O0"


def test_the_optimization_level_is_part_of_the_keys(tmp_path, compiles):
    keys = set()
    for opt, source_opt in (((), ()), (("-O0",), ()), (("-O1",), ()), (("-O1",), ("-O0",))):
        objects = [("twice", TWICE_OBJECT, opt)] if opt else [("twice", TWICE_OBJECT)]
        lib = compile_library(_caller(0), cache_dir=tmp_path, objects=objects, source_opt=source_opt)
        assert call_add(lib, 1, 2) == 4
        keys.add(lib.key)
    assert len(keys) == 4
    assert len(_objects(tmp_path)) == 3  # one object per level; the library's own are scratch


def test_units_compile_at_most_one_per_core_largest_first(tmp_path, monkeypatch):
    import threading
    import time

    running, peak, started = [0], [0], []
    lock = threading.Lock()
    real = build._run_compiler

    def tracking(cmd):
        if "-shared" in cmd:
            return real(cmd)
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            started.append(Path(cmd[cmd.index("-o") - 1]).read_text())
        try:
            time.sleep(0.2)  # long enough that the pool's other workers start meanwhile
            return real(cmd)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(build, "_run_compiler", tracking)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    units = [(f"unit{i}", f"int unit{i}(void) {{ return {i}; }}\n" + "/* padding */\n" * (10 * i), ("-O0",))
             for i in range(6)]
    caller = "int unit5(void);\nint five(void) { return unit5(); }\n"
    lib = compile_library(caller, cache_dir=tmp_path, objects=units)
    lib.cdll.five.restype = ctypes.c_int
    assert lib.cdll.five() == 5
    assert peak[0] == 2
    sizes = [len(text) for text in started]
    # The two largest went first (in either order: the pool's two workers start together).
    assert sorted(sizes[:2], reverse=True) == sorted(sizes, reverse=True)[:2]


# A loop gcc vectorizes at the widest width it may use: any ISA flag that mattered would show.
SCALE_SOURCE = """
void scale(float* x, long n, float a) { for (long i = 0; i < n; ++i) x[i] = x[i] * a + 1.0f; }
"""


def test_a_disabled_feature_the_cpu_lacks_is_the_same_build(tmp_path):
    """With -march=native, `-mno-avx512f` on a CPU without AVX-512 makes the same object, so it
    is the same cache entry (one compile, not two); on a CPU with it, two entries."""
    cc = build.find_compiler()
    macros = build.native_macros(cc)
    assert "__x86_64__" in macros or "__aarch64__" in macros  # the compiler answered
    lacks = "__AVX512F__" not in macros
    no512 = (*DEFAULT_FLAGS, "-mno-avx512f")
    (tmp_path / "s.c").write_text(SCALE_SOURCE)
    objects = []
    for i, flags in enumerate((DEFAULT_FLAGS, no512)):
        out = tmp_path / f"s{i}.o"
        subprocess.run([cc, *[f for f in flags if f != "-shared"], "-c", str(tmp_path / "s.c"), "-o", str(out)],
                       check=True)
        objects.append(out.read_bytes())
    if lacks:
        assert objects[0] == objects[1]  # the premise: the flag changes nothing here
    a = compile_library(SCALE_SOURCE, flags=DEFAULT_FLAGS, cache_dir=tmp_path / "cache")
    b = compile_library(SCALE_SOURCE, flags=no512, cache_dir=tmp_path / "cache")
    assert (a.path == b.path) == lacks
    assert len(so_files(tmp_path / "cache")) == (1 if lacks else 2)


def test_key_flags_leave_out_only_disables_of_absent_features(monkeypatch):
    avx2_only = frozenset({"__x86_64__", "__AVX2__", "__FMA__"})
    monkeypatch.setattr(build, "native_macros", lambda cc: avx2_only)
    flags = (*DEFAULT_FLAGS, "-mno-avx512f", "-mno-avx512vl", "-mno-fma", "-mno-sse4.2")
    assert build.key_flags(flags, "cc") == (*DEFAULT_FLAGS, "-mno-fma", "-mno-sse4.2")
    # A feature turned on again: the order of the flags matters, they are kept whole.
    assert build.key_flags((*flags, "-mavx512f"), "cc") == (*flags, "-mavx512f")
    # Not for this CPU: nothing is left out.
    other = ("-O3", "-march=x86-64-v3", "-mno-avx512f")
    assert build.key_flags(other, "cc") == other
    monkeypatch.setattr(build, "native_macros", lambda cc: avx2_only | {"__AVX512F__", "__AVX512VL__"})
    assert build.key_flags(flags, "cc") == flags
    monkeypatch.setattr(build, "native_macros", lambda cc: frozenset())  # the compiler could not say
    assert build.key_flags(flags, "cc") == flags
    # Nothing to leave out: the compiler is not asked at all.
    monkeypatch.setattr(build, "native_macros", lambda cc: pytest.fail("asked the compiler for nothing"))
    assert build.key_flags(DEFAULT_FLAGS, "cc") == DEFAULT_FLAGS


def test_units_start_by_expected_compile_time_not_size():
    # SSDlite's 60 KB -O3 unit took longer than its 150 KB -O0 ones: started last, it ended
    # after all of them. The order follows the -O level's cost per character.
    hot, glue = "x" * 60_000, "x" * 150_000
    assert build._expected_cost(hot, ("-O3", "-fPIC")) > build._expected_cost(glue, ("-O0", "-fPIC"))
    assert build._expected_cost(glue, ("-O0",)) > build._expected_cost(hot, ("-O0",))
    assert build._expected_cost(glue, ("-fPIC",)) == build._expected_cost(glue, ("-O0",))  # gcc's default
