"""The sanitizer build mode (SHAPESHIFT_SANITIZE=1, shapeshift/sanitize.py) and a CI subset
of bench/sanitize.py: two shared models at one shape and 30 counted node cases run
natively under AddressSanitizer and UBSan, with zero reports.

The sanitized runs happen in subprocesses started through ``python -m shapeshift.sanitize``
(the ASan runtime must be preloaded; this pytest process has none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shapeshift import sanitize
from shapeshift.codegen import build
from shapeshift.errors import ShapeshiftError

from .conftest import ROOT, SHARED_MODELS

sys.path.insert(0, str(ROOT / "bench"))

import sanitize as bench  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="no C compiler on this machine")

#: Small models that between them cover attention, LSTM and If (silero), and convolutions.
CI_MODELS = ("distilbert.dynamo.onnx", "silero_vad.onnx")


def _has_asan() -> bool:
    try:
        sanitize.runtime_library()
    except ShapeshiftError:
        return False
    return True


needs_asan = pytest.mark.skipif(not _has_asan(), reason="the C compiler has no AddressSanitizer runtime")


def _run_sanitized(code: str, tmp_path: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SHAPESHIFT_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "shapeshift.sanitize", "--log-dir", str(tmp_path / "logs"), "--",
                           sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_sanitize_flags_are_part_of_the_flags_and_need_the_runtime(monkeypatch):
    plain = build.target_flags()
    monkeypatch.setenv("SHAPESHIFT_SANITIZE", "1")
    # This process has no ASan runtime: loading a sanitized library would end it.
    with pytest.raises(ShapeshiftError, match="python -m shapeshift.sanitize"):
        build.target_flags()
    monkeypatch.setattr(sanitize, "runtime_loaded", lambda: True)
    flags = build.target_flags()
    assert flags == (*plain, *build.SANITIZE_FLAGS)
    # Kernel objects take the library's flags less -shared: theirs differ too, so sanitized
    # and plain builds are separate cache entries all the way down.
    assert build._object_flags(flags) != build._object_flags(plain)
    assert build.cache_key("x", flags, "gcc") != build.cache_key("x", plain, "gcc")
    monkeypatch.setenv("SHAPESHIFT_SANITIZE", "0")
    assert build.target_flags() == plain


def test_sanitized_builds_are_compiled_at_o1_at_most(monkeypatch, tmp_path):
    """A sanitized library, its kernel objects and its own object are built at -O1 where
    they would be at -O2 or -O3 (-O0 stays); a plain build keeps its levels."""
    seen = []

    def fake_build(entry, source, name_hint, flags, cc, version, linked, cache_dir, own_flags):
        seen.append((flags, [unit.flags for unit in linked], own_flags))
        raise RuntimeError("not built")

    monkeypatch.setattr(build, "_build", fake_build)
    objects = [("hot", "int f(void) { return 1; }", ("-O3",)), ("glue", "int g(void) { return 2; }", ("-O0",))]
    for extra in (build.SANITIZE_FLAGS, ()):
        with pytest.raises(RuntimeError, match="not built"):
            build.compile_library("int f(void); int g(void);", flags=(*build.DEFAULT_FLAGS, *extra),
                                  cache_dir=tmp_path, objects=objects, source_opt=("-O2",))
    (lib, units, own), (plain_lib, plain_units, plain_own) = seen

    def opt(flags):
        return [f for f in flags if f.startswith("-O")]

    assert (opt(lib), [opt(u) for u in units], opt(own)) == (["-O1"], [["-O1"], ["-O0"]], ["-O1"])
    assert (opt(plain_lib), [opt(u) for u in plain_units], opt(plain_own)) == (["-O3"], [["-O3"], ["-O0"]], ["-O2"])
    assert all(f in lib for f in build.SANITIZE_FLAGS)


@needs_asan
def test_environment_preloads_the_runtime_first():
    env = sanitize.environment({"LD_PRELOAD": "/lib/other.so", "ASAN_OPTIONS": "detect_leaks=1"},
                               log_dir=Path("/tmp/x"))
    assert env["LD_PRELOAD"].split(":") == [str(sanitize.runtime_library()), "/lib/other.so"]
    assert env["SHAPESHIFT_SANITIZE"] == "1"
    # The user's options come last, and win.
    assert env["ASAN_OPTIONS"].endswith("detect_leaks=1")
    assert "log_path=/tmp/x/asan" in env["ASAN_OPTIONS"]


def test_fenced_offsets_leave_a_gap_after_every_buffer():
    from shapeshift.codegen.placement import Placement
    from shapeshift.codegen.slots import Slot
    from shapeshift.runtime import vm

    class Program:
        slots = [Slot(0, vm.ARENA, nbytes=100), Slot(1, vm.INPUT), Slot(2, vm.WORK, nbytes=64),
                 Slot(3, vm.ARENA, nbytes=0), Slot(4, vm.ARENA, nbytes=20, within=Placement(0, 40, 1))]

    offsets, total, gaps = vm._fenced_offsets(Program(), {})
    # The last lives inside the first (codegen/placement.py): no buffer or gap of its own.
    assert [int(o) for o in offsets] == [0, -1, 384, 704, 40]
    for (start, size), slot in zip(gaps, [0, 2, 3]):
        assert start == offsets[slot] + Program.slots[slot].nbytes and size >= vm.REDZONE
    assert total == gaps[-1][0] + gaps[-1][1]


OVERFLOW = r"""
import ctypes, numpy as np
from shapeshift.codegen.build import compile_library, target_flags
lib = compile_library('''
#include <stdlib.h>
int overflow(int n) { int* a = malloc(sizeof(int) * n); a[n] = 1; int r = a[0]; free(a); return r; }
''', flags=target_flags()).cdll
lib.overflow(4)
"""


@needs_asan
def test_a_planted_overflow_is_reported(tmp_path):
    proc = _run_sanitized(OVERFLOW, tmp_path, tmp_path / "cache")
    assert proc.returncode == sanitize.REPORT_EXIT_CODE, proc.stderr[-2000:]
    (report,) = sanitize.reports(tmp_path / "logs")
    assert "heap-buffer-overflow" in report.read_text()


FENCED_RUN = r"""
import ctypes, numpy as np, onnx
from onnx import helper, TensorProto
import shapeshift
nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"])]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
session = shapeshift.InferenceSession(model, backend="native")
for n in (5, 3, 40):
    x = np.linspace(-1, 1, n).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x, 0) + np.exp(np.maximum(x, 0)), rtol=1e-5)
vm = session._executor.vm
poisoned = ctypes.CDLL(None).__asan_address_is_poisoned
poisoned.argtypes = [ctypes.c_void_p]
plan = vm._fenced_for[1]
assert plan.gaps, "the arena holds buffers"
for offset, size in plan.gaps:
    assert poisoned(vm._arena_base + offset) and poisoned(vm._arena_base + offset + size - 1)
    assert not poisoned(vm._arena_base + offset - 1)
print("fenced", len(plan.gaps))
"""


def _clean_sanitized_stdout(code: str, tmp_path: Path, cache: Path) -> str:
    """The stdout of ``code`` run sanitized (with the build cache ``cache``: the run's, whose
    sanitized kernel objects the other tests here build too), which must end well and leave
    no report."""
    proc = _run_sanitized(code, tmp_path, cache)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-3000:]
    assert not sanitize.reports(tmp_path / "logs")
    return proc.stdout


@needs_asan
def test_a_sanitized_session_fences_its_arena(tmp_path, build_cache):
    assert "fenced" in _clean_sanitized_stdout(FENCED_RUN, tmp_path, build_cache)


def _ci_cases() -> list[str]:
    from .test_conformance_native import FULLY_NATIVE, WITH_FALLBACK

    return FULLY_NATIVE[::2] + WITH_FALLBACK + ["test_nonzero_example", "test_scatternd"]


def _assert_clean(items: list[str], cache: Path) -> None:
    summary = bench.run(items, shapes=(0,), jobs=2, cache_dir=cache, timeout=600)
    assert [o.item for o in summary.outcomes] == items, "every item has an outcome"
    assert not summary.reports, bench.report(summary, (0,))
    errors = [o for o in summary.outcomes if o.status == "error"]
    assert not errors, [(o.item, o.detail) for o in errors]


@needs_asan
def test_ci_node_cases_have_no_sanitizer_reports(build_cache):
    """bench/sanitize.py on 30 counted node cases: every case ends, with no report."""
    _assert_clean([f"case:{name}" for name in dict.fromkeys(_ci_cases())],
                  build_cache)


@needs_asan
@pytest.mark.models
def test_ci_shared_models_have_no_sanitizer_reports(build_cache):
    """bench/sanitize.py on two shared models at their first shape."""
    missing = [m for m in CI_MODELS if not (SHARED_MODELS / m).exists()]
    if missing:
        pytest.skip(f"{SHARED_MODELS} lacks {missing} (../shared/models is absent on this machine)")
    _assert_clean([f"model:{m}" for m in CI_MODELS], build_cache)


PLACED_PARTS = r"""
import numpy as np, onnxruntime as ort
import shapeshift
from tests.test_native_placement import c2f_model
model = c2f_model()
session = shapeshift.InferenceSession(model, backend="native")
reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
for shape in ((1, 6, 5, 7), (2, 6, 3, 3), (1, 6, 1, 1)):
    x = {"x": np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)}
    np.testing.assert_allclose(session.run(None, x)[0], reference.run(None, x)[0], rtol=1e-5, atol=1e-5)
print("placed", len(session._executor.vm._plan({"n": 1, "h": 1, "w": 1}).offsets))
"""


@needs_asan
def test_parts_placed_inside_other_buffers_stay_inside(tmp_path, build_cache):
    """A C2f and an SPPF block at batch 1, its Split and Concat parts placed inside their
    hosts (codegen/placement.py), and at batch 2, copied: no report."""
    assert "placed" in _clean_sanitized_stdout(PLACED_PARTS, tmp_path, build_cache)


SMALL_PLANE_CONV = r"""
import numpy as np
from onnx import helper, numpy_helper, TensorProto
import shapeshift
# 16 x 5 x 1 outputs and 1 x 3 x 5 taps: the small-plane path's scratch holds an odd number
# of floats ahead of its int64 offset table (found misaligned by a fuzz campaign).
w = np.random.default_rng(0).standard_normal((16, 1, 3, 5)).astype(np.float32)
node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 5], strides=[1, 3], pads=[1, 2, 1, 2])
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
(y,) = shapeshift.InferenceSession(model, backend="native").run(
    None, {"x": np.random.default_rng(1).standard_normal((1, 1, 5, 3)).astype(np.float32)})
print("shape", y.shape)
"""


@needs_asan
def test_the_small_plane_conv_offset_table_is_aligned(tmp_path, build_cache):
    assert "shape (1, 16, 5, 1)" in _clean_sanitized_stdout(SMALL_PLANE_CONV, tmp_path, build_cache)
