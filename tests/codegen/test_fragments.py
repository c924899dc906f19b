"""Kernel fragments split into objects (codegen/fragments.py): what a model's unit declares
of them, and that their objects, linked together, define each entry point once."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from shapeshift.codegen import fragments
from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels.prelude import PRELUDE

ALL = fragments.dependency_order(fragments.names())


def _entry_points(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{}]*\)\s*\{", text, re.M)}


def test_declared_cuts_every_entry_point_body_and_keeps_the_rest():
    gemm = fragments.text("gemm")
    points = _entry_points(gemm)
    assert {"ss_gemm", "ss_gemm_prepacked"} <= points
    declared = fragments.declared("gemm")
    assert _entry_points(declared) == set()
    for name in points:
        assert re.search(rf"\b{name}\s*\([^;{{}}]*\);", declared), name
    # The GEMM is written with the C writer: what it shares (its #defines and the 8x8
    # transpose the convolutions use) stays; its private parts, inline ones included, go.
    assert "static inline void ss_gemm_transpose8" in declared and "#define SS_GEMM_NR" in declared
    assert "static inline int64_t ss_gemm_min" in gemm and "ss_gemm_min" not in declared
    assert "static inline void ss_gemm_ukernel" in gemm and "ss_gemm_ukernel" not in declared
    assert "static void ss_gemm_pack_a" in gemm and "ss_gemm_pack_a" not in declared
    # Defined several times (zmm, ymm and scalar twins under #if/#else): all go.
    assert gemm.count("static void ss_gemm_edge_tile(") >= 2 and "ss_gemm_edge_tile" not in declared


def test_names_lists_every_kernel_module():
    assert {"gemm", "conv", "vmath", "layout"} <= set(fragments.names()) and "prelude" not in fragments.names()


def test_a_private_helper_that_an_inline_helper_calls_stays():
    # dropout's static inline generator step calls the static ss_mt_refill.
    assert re.search(r"static inline[^{]*\{[^}]*ss_mt_refill", fragments.text("dropout"))
    assert "static void ss_mt_refill" in fragments.declared("dropout")


def test_a_fragment_without_entry_points_is_header_only():
    assert not fragments.has_object("vmath") and fragments.declared("vmath") == fragments.text("vmath")
    assert fragments.has_object("gemm") and fragments.has_object("layout")
    assert [name for name, _ in fragments.object_sources(["vmath", "gemm"])] == ["kernels.gemm"]


def test_dependencies_come_first():
    order = fragments.dependency_order(["conv"])
    assert order.index("gemm") < order.index("conv") and order.index("vmath") < order.index("conv")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_every_object_links_into_one_library_with_each_entry_point_once(tmp_path):
    # A unit that declares every fragment, linked with every object: a duplicate definition
    # or a missing one fails the link or the load.
    lib = compile_library(PRELUDE + fragments.declarations(ALL), name_hint="all fragments",
                          cache_dir=tmp_path, objects=fragments.object_sources(ALL))
    defined = subprocess.run(["nm", "-D", "--defined-only", str(lib.path)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in defined.splitlines() if " T " in line}
    expected = set().union(*(_entry_points(fragments.text(name)) for name in ALL)) | {"ss_set_num_threads"}
    assert expected <= exported
    assert isinstance(lib.cdll.ss_gemm, ctypes._CFuncPtr)
