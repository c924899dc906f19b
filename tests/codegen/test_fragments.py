"""Kernel fragments split into objects (codegen/fragments.py): what a model's unit declares
of them, and that their objects, linked together, define each entry point once."""

from __future__ import annotations

import ctypes
import importlib
import re
import shutil
import subprocess

import pytest

from shapeshift.codegen import fragments
from shapeshift.codegen.build import compile_library, find_compiler, target_flags
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


def test_every_fragment_is_written_with_the_c_writer():
    # No declared view is cut out of text any more: every module assembles its fragment.
    for name in fragments.names():
        module = importlib.import_module(f"shapeshift.codegen.kernels.{name}")
        assert hasattr(module, "fragment"), name
        if name != "gemm":
            assert module.source() == module.fragment().text() == fragments.text(name), name


def test_a_fragment_declares_its_entry_points_and_what_other_units_use():
    layout = fragments.declared("layout")
    # Generated Pad loops inline ss_pad_fold: shared; the copy's plan and loops are private.
    assert "static inline int64_t ss_pad_fold" in layout
    assert re.search(r"void ss_copy\([^;{}]*\);", layout) and re.search(r"void ss_fill\([^;{}]*\);", layout)
    assert "ss_copy_canon" in fragments.text("layout") and "ss_copy_canon" not in layout and "SS_COPY_TILE" not in layout
    # Private helpers that only private inline helpers call stay out (the regex path kept
    # them: it kept every static inline helper, and with it what those call, even a helper
    # a comment named): dropout's generator, rnn's activations, GridSample's reflection,
    # conv's activation pass, im2col and staging.
    assert fragments.declared("dropout").count("ss_") == 2 and "ss_mt_refill" in fragments.text("dropout")
    for name, helper in (("rnn", "ss_recur_activate"), ("sample", "ss_grid_reflect"), ("conv", "ss_conv_act_run"),
                         ("conv", "ss_conv_im2col"), ("conv", "ss_conv_direct_stage")):
        assert helper in fragments.text(name) and helper not in fragments.declared(name), (name, helper)
    assert "__attribute__" not in fragments.declared("conv")


def test_indexing_declares_its_53_entry_points_and_nothing_private():
    declared = fragments.declared("indexing")
    text = fragments.text("indexing")
    assert len(re.findall(r"^\w[\w \t*]*\bss_\w+\([^;{}]*\);$", declared, re.M)) == 53
    assert "ss_gather_check_i64" in text and "ss_gather_check" not in declared
    assert "ss_topk_sift" in text and "ss_topk_sift" not in declared and "#define" not in declared


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.parametrize("name", ALL)
def test_each_declared_view_compiles_on_its_own(name, tmp_path):
    # What a unit that calls only this fragment includes: a shared inline helper that calls
    # a private one, or a shared part that needs a private macro, fails here.
    unit = tmp_path / "unit.c"
    unit.write_text(PRELUDE + fragments.declarations(fragments.dependency_order([name])))
    flags = [f for f in target_flags() if f not in ("-shared", "-fPIC", "-O3")]
    # -Wno-psabi: without AVX-512 the 16-lane NCHWc helpers pass 64-byte vectors by value,
    # which GCC notes changes the ABI; they are static inline (no call crosses a unit), so
    # the note is no defect, and the pragmas that could silence it miss GCC's IPA clones.
    proc = subprocess.run([find_compiler(), *flags, "-Wno-psabi", "-fsyntax-only", "-Werror", str(unit)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]


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
