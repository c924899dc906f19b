"""The C writer (codegen/cwriter.py): prototypes generated from function descriptors, a
fragment's declared view assembled from its parts, strict templates, blocks and guards."""

from __future__ import annotations

import pytest

from shapeshift.codegen.cwriter import CWriter, Fragment, Function, Private, Shared, fill
from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels.prelude import PRELUDE

ADD = Function("int64_t", "ss_test_add", ("int64_t a", "int64_t b"), "    return ss_test_twice(a) + b;")
TWICE = Function("int64_t", "ss_test_twice", ("int64_t a",), "    return 2 * a;", linkage="static")
SHARED_INLINE = Function("int64_t", "ss_test_inc", ("int64_t a",), "    return a + 1;", linkage="inline", shared=True)


def test_a_prototype_is_generated_from_the_definition():
    assert ADD.prototype() == "int64_t ss_test_add(int64_t a, int64_t b);\n"
    assert ADD.definition().startswith("int64_t ss_test_add(int64_t a, int64_t b)\n{\n")
    assert TWICE.head() == "static int64_t ss_test_twice(int64_t a)"
    assert Function("void", "f", (), "").prototype() == "void f(void);\n"
    with pytest.raises(ValueError, match="linkage 'extern'"):
        Function("void", "f", (), "", linkage="extern")
    with pytest.raises(ValueError, match="only an inline helper can be shared"):
        Function("void", "f", (), "", linkage="static", shared=True)


def test_declared_shows_shared_parts_and_prototypes_only():
    frag = Fragment([Shared("#define SS_TEST 3"), Private("typedef int ss_private_t;"), SHARED_INLINE, TWICE, ADD])
    declared = frag.declared()
    assert declared == ("#define SS_TEST 3\n" + SHARED_INLINE.definition() + ADD.prototype())
    assert "ss_private_t" not in declared and "ss_test_twice" not in declared
    assert [f.name for f in frag.entries] == ["ss_test_add"]
    assert frag.text().index("ss_test_twice") < frag.text().index("int64_t ss_test_add(")


def test_an_object_and_a_unit_that_includes_its_declared_view_link(tmp_path):
    """The declared view is enough to call the entry point; the object defines it once."""
    import ctypes

    frag = Fragment([Shared("#define SS_TEST 3"), SHARED_INLINE, TWICE, ADD])
    caller = Function("int64_t", "ss_test_call", ("int64_t a",), "    return ss_test_add(ss_test_inc(a), SS_TEST);")
    lib = compile_library(PRELUDE + frag.text() + "\n/* the caller's unit */\n" + caller.definition(),
                          name_hint="cwriter", cache_dir=tmp_path)
    # One translation unit holds both here; what matters is that the declared view compiles
    # beside a definition of the same entry point (prototype and definition agree).
    both = compile_library(PRELUDE + frag.declared() + frag.text().replace(SHARED_INLINE.definition(), "")
                           + caller.definition(), name_hint="cwriter2", cache_dir=tmp_path)
    for path in (lib.path, both.path):
        f = ctypes.CDLL(str(path)).ss_test_call
        f.restype, f.argtypes = ctypes.c_int64, [ctypes.c_int64]
        assert f(4) == 2 * 5 + 3


def test_fill_names_every_marker_and_uses_every_value():
    assert fill("x[@OFF_IN1@] + x[@OFF_IN10@]", OFF_IN1="i", OFF_IN10="j") == "x[i] + x[j]"
    with pytest.raises(KeyError, match="@B@ has no value"):
        fill("@A@ @B@", A=1)
    with pytest.raises(KeyError, match="no marker for C"):
        fill("@A@", A=1, C=2)


def test_the_writer_indents_blocks_and_writes_guards():
    w = CWriter()
    with w.guard("__AVX2__"):
        with w.block("for (int i = 0; i < n; ++i)"):
            w.line("x[i] = 0;")
            with w.block("if (y)"):
                w.line("y[i] = 1;")
        w.orelse()
        w.line("memset(x, 0, n);")
    with w.guard("defined(A) && B > 2"):
        w.comment("only then")
    assert w.text() == ("#ifdef __AVX2__\nfor (int i = 0; i < n; ++i) {\n    x[i] = 0;\n    if (y) {\n"
                        "        y[i] = 1;\n    }\n}\n#else\nmemset(x, 0, n);\n#endif\n"
                        "#if defined(A) && B > 2\n/* only then */\n#endif\n")
