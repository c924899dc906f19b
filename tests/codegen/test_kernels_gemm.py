"""ss_gemm, ss_gemm_prepacked (and their _add forms, with an addend laid out as C) and
ss_gemm_pack_b against a float64 NumPy reference.

Each case builds A, B, bias as NumPy views with the strides under test (transposed,
broadcast batch dims, strided attention-style views), writes C into a NaN-filled buffer
wider than the result, and checks both the result and that nothing outside it changed.
Three builds: the default schedule, a tiny schedule whose blocking loops all run several
times on small shapes, and the default schedule without AVX2 (the scalar fallback).
"""

from __future__ import annotations

import ctypes
import os
import random
from dataclasses import dataclass

import numpy as np
import pytest

from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.codegen.defaults import default_schedule
from shapeshift.codegen.kernels import gemm, gemm_tiles
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.target import named_target

from ..sample_targets import sample_target
from ..test_native_threads import _in_thread, _tasks

TINY = GemmSchedule(mr=4, nr=8, kc=5, mc=8, nc=16, one_block_nc=8, unroll_k=3, small_m=3, small_nc=16, prefetch_rows=2,
                    prefetch_min_m=2, parallel_min_flops=0)
# B-streaming path up to 20 rows: every m past 6 rows (nr 16) runs as row groups.
GROUPED = GemmSchedule(small_m=20)
# nr = 32 keeps at most 2 rows at full width, so groups of 1 and 2 rows.
GROUPED_WIDE = GemmSchedule(mr=2, nr=32, mc=64, nc=256, small_m=9, small_nc=64)
# nr = 24 (3 vectors) and small blocks: every edge tile shape (rows x vectors) of the packed
# path, and narrower B-streaming passes for partial panels.
EDGE_WIDE = GemmSchedule(mr=4, nr=24, kc=7, mc=8, nc=48, one_block_nc=24, unroll_k=2, small_m=5, small_nc=48)
# Several panels of a packed B at once: M = 1 three panels, M = 2 two; M = 3, 4 one. Small
# kc for several K blocks; every call parallel.
PANELS3 = GemmSchedule(kc=40, small_m=4, small_panels=3, parallel_min_flops=0)
# nr = 32: M = 1 reads three panels at once (four vectors each), M = 2 one.
PANELS_WIDE = GemmSchedule(mr=2, nr=32, mc=8, nc=64, small_m=2, small_nc=64, small_panels=8, parallel_min_flops=0)
# The untuned schedules of the two psABI levels: ymm 6x16 and the zmm tile of the AVX-512 class.
AVX2_DEFAULT = default_schedule(named_target("x86-64-v3"))
AVX512_DEFAULT = default_schedule(named_target("x86-64-v4"))
# The amd-zen4 class's own schedule (its 8 x 16 zmm tile, products of up to 10 rows on the
# B-streaming path), from the Zen 4 sample, whatever CPU runs the tests.
ZEN4_DEFAULT = default_schedule(sample_target("zen4"))
A_IN_L1 = GemmSchedule(mr=4, nr=24, kc=37, mc=12, nc=48, small_m=2, small_nc=48, a_in_l1=1)
SCALAR_FLAGS = tuple(f for f in DEFAULT_FLAGS if f != "-march=native")

i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_GEMM_ARGS = [i64] * 5 + [ptr, i64, i64, i64, i64]
_TAIL_ARGS = [ptr, i64, i64, i64, f32, ptr, f32, i64, i64, ctypes.c_int]


@dataclass
class Lib:
    cdll: ctypes.CDLL
    schedule: GemmSchedule


def _load(source: str, schedule: GemmSchedule, cache_dir, flags=None) -> Lib:
    cdll = compile_library(source, name_hint="gemm_test", flags=flags, cache_dir=cache_dir).cdll
    cdll.ss_gemm.argtypes = _GEMM_ARGS + [ptr, i64, i64, i64, i64] + _TAIL_ARGS
    cdll.ss_gemm.restype = None
    cdll.ss_gemm_prepacked.argtypes = _GEMM_ARGS + [ptr] + _TAIL_ARGS
    cdll.ss_gemm_prepacked.restype = None
    cdll.ss_gemm_add.argtypes = cdll.ss_gemm.argtypes + [ptr]
    cdll.ss_gemm_add.restype = None
    cdll.ss_gemm_prepacked_add.argtypes = cdll.ss_gemm_prepacked.argtypes + [ptr]
    cdll.ss_gemm_prepacked_add.restype = None
    cdll.ss_gemm_pack_b.argtypes = [i64, i64, ptr, i64, i64, ptr]
    cdll.ss_gemm_pack_b.restype = None
    cdll.ss_gemm_packed_b_size.argtypes = [i64, i64]
    cdll.ss_gemm_packed_b_size.restype = i64
    cdll.ss_set_num_threads.argtypes = [ctypes.c_int]
    return Lib(cdll, schedule)


@pytest.fixture(scope="module")
def libs(build_cache) -> dict[str, Lib]:
    cache = build_cache
    return {
        "default": _load(PRELUDE + gemm.source(), default_schedule(), cache),
        "tiny": _load(PRELUDE + gemm.source(TINY), TINY, cache),
        "scalar": _load(PRELUDE + gemm.source(), default_schedule(), cache, flags=SCALAR_FLAGS),
        # The AVX2 target's default, in a build without AVX-512 (an x86-64-v3 machine).
        "ymm": _load(PRELUDE + gemm.source(AVX2_DEFAULT), AVX2_DEFAULT, cache, flags=(*DEFAULT_FLAGS, "-mno-avx512f")),
        # A zmm schedule built without AVX-512: its tiles fall back to ymm vectors.
        "zmm_as_ymm": _load(PRELUDE + gemm.source(AVX512_DEFAULT), AVX512_DEFAULT, cache,
                            flags=(*DEFAULT_FLAGS, "-mno-avx512f")),
        "zmm": _load(PRELUDE + gemm.source(AVX512_DEFAULT), AVX512_DEFAULT, cache),
        "zen4": _load(PRELUDE + gemm.source(ZEN4_DEFAULT), ZEN4_DEFAULT, cache),
        # The other tile-loop order: an A micro-panel in L1, B's streaming from L2.
        "a_in_l1": _load(PRELUDE + gemm.source(A_IN_L1), A_IN_L1, cache),
        "grouped": _load(PRELUDE + gemm.source(GROUPED), GROUPED, cache),
        "grouped_wide": _load(PRELUDE + gemm.source(GROUPED_WIDE), GROUPED_WIDE, cache),
        "edge_wide": _load(PRELUDE + gemm.source(EDGE_WIDE), EDGE_WIDE, cache),
        "panels3": _load(PRELUDE + gemm.source(PANELS3), PANELS3, cache),
        "panels_wide": _load(PRELUDE + gemm.source(PANELS_WIDE), PANELS_WIDE, cache),
    }


def _elem_strides(view: np.ndarray) -> tuple[int, ...]:
    return tuple(s // view.itemsize for s in view.strides)


def _operand(rng, batch0, batch1, rows, cols, transposed, bcast0, bcast1):
    """A (batch0, batch1, rows, cols) float32 view: stored transposed or not, batch dims broadcast or not."""
    b0, b1 = (1 if bcast0 else batch0), (1 if bcast1 else batch1)
    if transposed:
        base = rng.standard_normal((b0, b1, cols, rows)).astype(np.float32).transpose(0, 1, 3, 2)
    else:
        base = rng.standard_normal((b0, b1, rows, cols)).astype(np.float32)
    return np.broadcast_to(base, (batch0, batch1, rows, cols))


def _bias(rng, kind, m, n):
    """(bias array, rs, cs) as ss_gemm takes them, and its (m, n) broadcast value."""
    if kind == "none":
        return None, 0, 0, np.zeros((m, n))
    if kind == "full_t":  # stored column-major: a column stride other than 0 or 1
        b = rng.standard_normal((n, m)).astype(np.float32)
        return b, 1, m, np.ascontiguousarray(b.T.astype(np.float64))
    shape = {"scalar": (1, 1), "col": (1, n), "row": (m, 1), "full": (m, n)}[kind]
    b = rng.standard_normal(shape).astype(np.float32)
    rs = n if kind == "full" else (1 if kind == "row" else 0)
    cs = 1 if kind in ("full", "col") else 0
    return b, rs, cs, np.broadcast_to(b.astype(np.float64), (m, n))


@dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    batch0: int = 1
    batch1: int = 1
    a_t: bool = False
    b_t: bool = False
    a_bcast: tuple[bool, bool] = (False, False)
    b_bcast: tuple[bool, bool] = (False, False)
    bias: str = "none"
    alpha: float = 1.0
    beta: float = 1.0
    act: int = 0
    prepacked: bool = False
    addend: bool = False  # ss_gemm_add / ss_gemm_prepacked_add, with D laid out as C

    def __str__(self) -> str:
        return (f"{self.m}x{self.n}x{self.k}_b{self.batch0}x{self.batch1}_{'At' if self.a_t else 'A'}"
                f"{'Bt' if self.b_t else 'B'}_ab{int(self.a_bcast[0])}{int(self.a_bcast[1])}"
                f"_bb{int(self.b_bcast[0])}{int(self.b_bcast[1])}_{self.bias}_al{self.alpha}_be{self.beta}"
                f"_act{self.act}{'_pre' if self.prepacked else ''}{'_add' if self.addend else ''}")


def run_case(lib: Lib, case: Case, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    m, n, k, b0, b1 = case.m, case.n, case.k, case.batch0, case.batch1
    a = _operand(rng, b0, b1, m, k, case.a_t, *case.a_bcast)
    # A prepacked B is one matrix for every batch.
    b_bcast = (True, True) if case.prepacked else case.b_bcast
    b = _operand(rng, b0, b1, k, n, case.b_t, *b_bcast)
    bias, rs_bias, cs_bias, bias_full = _bias(rng, case.bias, m, n)
    ldc = n + 3
    c_buf = np.full((b0, b1 + 1, m, ldc), np.nan, dtype=np.float32)
    c_view = c_buf[:, :b1, :, :n]
    sc0, sc1 = _elem_strides(c_buf)[:2]
    sa0, sa1, rsa, csa = _elem_strides(a)
    sb0, sb1, rsb, csb = _elem_strides(b)
    bias_ptr = bias.ctypes.data if bias is not None else None
    tail = (c_buf.ctypes.data, sc0, sc1, ldc, case.alpha, bias_ptr, case.beta, rs_bias, cs_bias, case.act)
    # The addend has C's layout (its buffer C's shape, past the view NaN: never read).
    d_buf = np.full(c_buf.shape, np.nan, dtype=np.float32)
    d_buf[:, :b1, :, :n] = rng.standard_normal((b0, b1, m, n))
    add = (d_buf.ctypes.data,) if case.addend else ()
    if case.prepacked:
        size = lib.cdll.ss_gemm_packed_b_size(k, n)
        assert size == gemm.packed_b_size(k, n, lib.schedule)
        packed = np.full(max(size, 1), np.nan, dtype=np.float32)
        lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, rsb, csb, packed.ctypes.data)
        fn = lib.cdll.ss_gemm_prepacked_add if case.addend else lib.cdll.ss_gemm_prepacked
        fn(m, n, k, b0, b1, a.ctypes.data, sa0, sa1, rsa, csa, packed.ctypes.data, *tail, *add)
    else:
        fn = lib.cdll.ss_gemm_add if case.addend else lib.cdll.ss_gemm
        fn(m, n, k, b0, b1, a.ctypes.data, sa0, sa1, rsa, csa, b.ctypes.data, sb0, sb1, rsb, csb, *tail, *add)
    product = np.matmul(a.astype(np.float64), b.astype(np.float64))
    expected = case.alpha * product + case.beta * bias_full
    if case.addend:
        expected = expected + d_buf[:, :b1, :, :n].astype(np.float64)
    if case.act == 1:
        expected = np.maximum(expected, 0.0)
    magnitude = abs(case.alpha) * np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))) \
        + abs(case.beta) * np.abs(bias_full) + (np.abs(d_buf[:, :b1, :, :n]) if case.addend else 0.0)
    err = np.abs(c_view - expected)
    assert np.all(err <= 1e-4 * magnitude + 1e-6), f"{case}: max error {np.nanmax(err)}"
    untouched = np.ones(c_buf.shape, dtype=bool)
    untouched[:, :b1, :, :n] = False
    assert np.all(np.isnan(c_buf[untouched])), f"{case}: wrote outside C"


def _cases() -> list[Case]:
    """Hand-picked cases for every feature, then random combinations of the rest."""
    sizes = [0, 1, 2, 5, 6, 7, 8, 9, 15, 16, 17, 33, 100, 257]
    cases = [
        Case(0, 5, 3), Case(4, 0, 3), Case(3, 4, 0), Case(3, 4, 0, bias="col", beta=0.5, act=1),
        Case(3, 4, 0, bias="full", beta=-2.0), Case(1, 1, 1), Case(6, 16, 4), Case(7, 17, 9),
        Case(100, 257, 33), Case(257, 33, 300), Case(16, 16, 16, batch0=0),
        Case(33, 100, 520, a_t=True, b_t=True),
        # BERT-like: dense with a constant weight, and attention on strided views
        Case(17, 96, 300, bias="col", prepacked=True), Case(1, 3072 // 4, 768 // 2, bias="col", prepacked=True),
        Case(5, 2304 // 8, 768 // 4, bias="col", act=1, prepacked=True),
        Case(40, 40, 64, batch0=3, batch1=4, b_t=True), Case(40, 64, 40, batch0=12),
        # Rows of one block of A (M <= mc) take B in blocks of one_block_nc columns, more rows in
        # blocks of nc: N past both, with a partial last block (a 1 x 1 conv's pixels).
        Case(64, 1100, 40, bias="row", act=1), Case(64, 1100, 300, b_t=True), Case(200, 1100, 40, bias="col"),
    ]
    for kind in ("none", "scalar", "col", "row", "full", "full_t"):
        for m in (3, 20):
            cases.append(Case(m, 19, 11, bias=kind, alpha=-0.75, beta=1.5, act=1))
            cases.append(Case(m, 19, 11, batch0=2, bias=kind, alpha=2.0, beta=-0.5, prepacked=True))
    rng = random.Random(1234)
    for _ in range(70):
        cases.append(Case(
            m=rng.choice(sizes), n=rng.choice(sizes), k=rng.choice(sizes),
            batch0=rng.choice([1, 1, 2, 3]), batch1=rng.choice([1, 1, 2]),
            a_t=rng.random() < 0.4, b_t=rng.random() < 0.4,
            a_bcast=(rng.random() < 0.3, rng.random() < 0.3), b_bcast=(rng.random() < 0.3, rng.random() < 0.3),
            bias=rng.choice(["none", "scalar", "col", "row", "full", "full_t"]),
            alpha=rng.choice([1.0, 0.5, -1.25]), beta=rng.choice([1.0, 0.0, -0.5, 3.0]),
            act=rng.choice([0, 1]), prepacked=rng.random() < 0.3))
    # An addend laid out as C (a conv's residual, kernels/conv.py): full tiles (in registers),
    # edge tiles, the B-streaming path (M <= small_m), batches, K == 0, with bias and relu.
    for m, n, k, b0, b1, bias, act, pre in ((12, 32, 20, 1, 1, "row", 1, False), (13, 37, 9, 2, 1, "row", 1, True),
                                            (3, 40, 17, 1, 2, "none", 0, False), (5, 19, 300, 2, 2, "col", 1, True),
                                            (257, 33, 300, 1, 1, "full_t", 1, False), (3, 4, 0, 1, 1, "col", 1, False),
                                            (40, 100, 64, 3, 1, "scalar", 0, True)):
        cases.append(Case(m, n, k, batch0=b0, batch1=b1, bias=bias, alpha=0.5, act=act, prepacked=pre, addend=True))
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("build", ["default", "tiny", "ymm", "zmm", "zmm_as_ymm", "a_in_l1"])
def test_gemm_matches_numpy(libs, build, case):
    run_case(libs[build], case)


@pytest.mark.parametrize("build", ["grouped", "grouped_wide", "zen4"])
@pytest.mark.parametrize("m", range(1, 21))
@pytest.mark.parametrize("prepacked,b_t", [(True, False), (False, False), (False, True)])
def test_small_path_row_groups(libs, build, m, prepacked, b_t):
    """Every row count of the B-streaming path, including those split into row groups."""
    run_case(libs[build], Case(m, 70, 300, b_t=b_t, bias="col", act=1, prepacked=prepacked))


@pytest.mark.parametrize("build", ["edge_wide", "default", "ymm", "zmm", "zmm_as_ymm", "tiny", "a_in_l1", "zen4"])
@pytest.mark.parametrize("m", [13, 14, 15, 16, 17, 20])
def test_edge_rows_over_groups_of_panels(libs, build, m):
    """The last rows of M (fewer than MR) run several B panels at once (gemm_tiles.edge_group):
    columns that end a group, part of one (the panels left run one by one) and a partial last
    panel; K past one kc block (the groups add to C), with every epilogue: bias by columns and
    by rows, alpha, Relu, the addend."""
    lib = libs[build]
    nr, kc = lib.schedule.nr, lib.schedule.kc
    for i, n in enumerate((8 * nr, 9 * nr + 5, 3 * nr - 1)):
        run_case(lib, Case(m, n, kc + 9, bias="col", alpha=0.5, act=1, prepacked=i % 2 == 0), seed=n)
        run_case(lib, Case(m, n, 2 * kc + 3, bias="row", beta=0.25, addend=True), seed=n + 1)
        run_case(lib, Case(m, n, 11, b_t=True, batch0=2), seed=n + 2)


def test_edge_groups_per_row_count():
    zmm = GemmSchedule(mr=6, nr=16, lanes=16, registers=32)
    assert [gemm_tiles.edge_group(zmm, rows, 16) for rows in range(1, 6)] == [8, 4, 3, 2, 2]
    ymm = GemmSchedule(mr=6, nr=16)  # 2 vectors a panel, 16 registers: (rows + 1) x 2 x group + 1 <= 16
    assert [gemm_tiles.edge_group(ymm, rows, 8) for rows in range(1, 6)] == [3, 2, 1, 1, 1]
    text = gemm.source(zmm)
    assert "static void ss_gemm_edge_rows_2(" in text and "case 2: return 4;" in text


@pytest.mark.parametrize("build", ["edge_wide", "grouped_wide", "default", "ymm", "zmm", "zmm_as_ymm"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 9, 13])
def test_edge_tiles_every_width(libs, build, m):
    """Every N remainder of the last panel, at M remainders of both paths: the edge kernels
    compute only the valid rows and whole vectors, and the epilogue still covers the tile."""
    nr = libs[build].schedule.nr
    for n in range(1, 2 * nr + 2):
        run_case(libs[build], Case(m, n, 19, bias="col", alpha=0.5, act=1), seed=n)
        run_case(libs[build], Case(m, n, 10, b_t=True, batch0=2), seed=n)


@pytest.mark.parametrize("build", ["default", "tiny", "panels3", "panels_wide"])
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("prepacked,b_t", [(True, False), (False, True)])
def test_small_path_several_panels_at_once(libs, build, m, prepacked, b_t):
    """Packed B read several panels at once: panel counts below, at and past a multiple of
    the panels in flight (the rest one at a time), with and without a partial last panel,
    over several K blocks, with the epilogue."""
    nr = libs[build].schedule.nr
    for panels in (1, 2, 3, 4, 5, 7, 8, 9, 13, 40):
        for extra in (0, 5):
            run_case(libs[build], Case(m, panels * nr + extra, 90, b_t=b_t, bias="col", act=1, prepacked=prepacked),
                     seed=panels)


@pytest.mark.parametrize("build", ["default", "tiny", "panels3", "zmm"])
@pytest.mark.parametrize("m", [1, 2, 3, 13, 20])
@pytest.mark.parametrize("prepacked,b_t", [(True, False), (False, True), (False, False)])
def test_equal_columns_of_b_give_equal_results(libs, build, m, prepacked, b_t):
    """Every column is summed in the same order, full panels, the ones left over and the
    partial last panel alike, on the B-streaming path (M = 1..3) and in the packed path's
    full and edge tiles (M = 13, 20: rows past whole tiles): equal columns of B give bitwise
    equal columns of C (a Softmax over the huge, equal logits of a constant-weight
    classifier depends on it)."""
    lib = libs[build]
    k, n = 300, 13 * lib.schedule.nr + 5
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k)).astype(np.float32)
    column = rng.standard_normal((k, 1)).astype(np.float32)
    b = np.repeat(column, n, axis=1)
    if b_t:
        b = np.ascontiguousarray(b.T).T
    c = np.full((m, n), np.nan, dtype=np.float32)
    rsb, csb = _elem_strides(b)
    if prepacked:
        packed = np.empty(lib.cdll.ss_gemm_packed_b_size(k, n), dtype=np.float32)
        lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, rsb, csb, packed.ctypes.data)
        lib.cdll.ss_gemm_prepacked(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data,
                                   c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
    else:
        lib.cdll.ss_gemm(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, b.ctypes.data, 0, 0, rsb, csb,
                         c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
    np.testing.assert_allclose(c[:, 0], (a.astype(np.float64) @ column)[:, 0], rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(c, np.repeat(c[:, :1], n, axis=1))


@pytest.mark.parametrize("build", ["default", "tiny", "zmm", "ymm"])
@pytest.mark.parametrize("m", [13, 20, 47])
@pytest.mark.parametrize("prepacked", [True, False])
def test_equal_rows_of_a_give_equal_results(libs, build, m, prepacked):
    """Rows in whole tiles and rows past them (the edge tiles) are summed in one order:
    equal rows of A give bitwise equal rows of C. A conv as W x im2col has the output
    channels as rows: squeezenet's constant weights make its 1000 logits equal in exact
    arithmetic, and a Softmax turns a one-ulp difference between rows into 0 against 0.001."""
    lib = libs[build]
    k, n = 300, 2 * lib.schedule.nr + 5
    rng = np.random.default_rng(3)
    row = rng.standard_normal((1, k)).astype(np.float32)
    a = np.ascontiguousarray(np.repeat(row, m, axis=0))
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, dtype=np.float32)
    if prepacked:
        packed = np.empty(lib.cdll.ss_gemm_packed_b_size(k, n), dtype=np.float32)
        lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
        lib.cdll.ss_gemm_prepacked(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data,
                                   c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
    else:
        lib.cdll.ss_gemm(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, b.ctypes.data, 0, 0, n, 1,
                         c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
    np.testing.assert_allclose(c[0], (row.astype(np.float64) @ b)[0], rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(c, np.repeat(c[:1], m, axis=0))


def test_small_panels_per_row_count():
    """Panels in flight: as many as small_panels allows where the accumulators fit; one for
    prefetching kernels and for row counts that need narrower passes."""
    panels = gemm_tiles.small_panels
    assert [panels(GemmSchedule(), m, False) for m in (1, 2, 3, 6)] == [4, 2, 1, 1]
    assert panels(GemmSchedule(small_panels=1), 1, False) == 1
    assert panels(GemmSchedule(), 1, True) == 1
    assert [panels(PANELS3, m, False) for m in (1, 2, 3)] == [3, 2, 1]
    assert [panels(PANELS_WIDE, m, False) for m in (1, 2)] == [3, 1]
    assert panels(GemmSchedule(mr=4, nr=8, small_panels=8), 4, False) == 3  # 12 + 3 + 1 registers


@pytest.mark.parametrize("build", ["tiny", "panels3"])
@pytest.mark.parametrize("m", [1, 2])
def test_several_panels_threads_agree(libs, build, m):
    """Two threads split N, so other panels are left over to the one-panel kernel than with
    one thread; each column is still summed in the same order: bitwise equal."""
    lib = libs[build]
    k, n = 130, 20 * lib.schedule.nr + 3
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = np.empty(lib.cdll.ss_gemm_packed_b_size(k, n), dtype=np.float32)
    lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
    outs = []
    try:
        for threads in (1, 2):
            lib.cdll.ss_set_num_threads(threads)
            c = np.full((m, n), np.nan, dtype=np.float32)
            lib.cdll.ss_gemm_prepacked(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data,
                                       c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
            outs.append(c)
    finally:
        lib.cdll.ss_set_num_threads(1)
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(outs[0], outs[1])


def _starts_workers(lib, m: int, k: int, n: int) -> bool:
    """Whether ss_gemm_prepacked of m rows by a k x n weight, 2 threads, opens a parallel
    region: run in a new thread, whose first region makes OpenMP start a worker of its own."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    packed = np.empty(lib.cdll.ss_gemm_packed_b_size(k, n), dtype=np.float32)
    lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
    c = np.full((m, n), np.nan, dtype=np.float32)

    def call() -> int:
        before = _tasks()
        lib.cdll.ss_set_num_threads(2)
        lib.cdll.ss_gemm_prepacked(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data,
                                   c.ctypes.data, 0, 0, n, 1.0, None, 0.0, 0, 0, 0)
        return len(_tasks() - before)

    try:
        workers = _in_thread(call)
    finally:
        lib.cdll.ss_set_num_threads(1)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    return workers > 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="needs Linux's /proc/self/task and two CPUs")
def test_one_row_by_a_large_weight_streams_it_on_two_threads(libs):
    """A product of one row takes the time of streaming its weight: 1 MB of weight (0.5 Mflop,
    under the 1 Mflop threshold as flops) runs on two threads, a quarter of it on one."""
    lib = libs["default"]
    assert lib.schedule.parallel_min_flops == 1 << 20
    assert _starts_workers(lib, 1, 256, 1024)
    assert not _starts_workers(lib, 1, 128, 512)


def test_edge_tile_shapes():
    assert gemm_tiles.edge_shapes(GemmSchedule(mr=2, nr=16), 8) == [(1, 1), (1, 2), (2, 1)]
    assert len(gemm_tiles.edge_shapes(EDGE_WIDE, 8)) == 4 * 3 - 1
    assert gemm_tiles.edge_shapes(AVX512_DEFAULT, 16) == [(r, v) for r in range(1, 9) for v in (1, 2, 3) if (r, v) != (8, 3)]


def test_small_row_groups_keep_full_width():
    groups = gemm_tiles.small_row_groups
    assert groups(GemmSchedule(), 6) == [6]
    assert groups(GemmSchedule(), 8) == [4, 4]
    assert groups(GemmSchedule(), 13) == [5, 4, 4]
    assert groups(GROUPED_WIDE, 5) == [2, 2, 1]
    for schedule in (GemmSchedule(), GROUPED, GROUPED_WIDE):
        for m in range(1, schedule.small_m + 1):
            assert sum(groups(schedule, m)) == m


@pytest.mark.parametrize("case", CASES[::7] + [c for c in CASES if c.addend], ids=str)
def test_scalar_fallback_matches_numpy(libs, case):
    run_case(libs["scalar"], case)


@pytest.mark.parametrize("build", ["default", "tiny"])
@pytest.mark.parametrize("k,n,b_t", [(0, 5, False), (1, 1, False), (7, 9, True), (300, 40, False), (520, 33, True)])
def test_pack_b_layout(libs, build, k, n, b_t):
    lib = libs[build]
    rng = np.random.default_rng(3)
    b = rng.standard_normal((n, k)).astype(np.float32).T if b_t else rng.standard_normal((k, n)).astype(np.float32)
    rsb, csb = _elem_strides(b)
    size = lib.cdll.ss_gemm_packed_b_size(k, n)
    packed = np.full(size + 4, np.nan, dtype=np.float32)
    lib.cdll.ss_gemm_pack_b(k, n, b.ctypes.data, rsb, csb, packed.ctypes.data)
    np.testing.assert_array_equal(packed[:size], gemm.pack_b_reference(b, lib.schedule))
    assert np.all(np.isnan(packed[size:]))


@pytest.mark.parametrize("t", [1, 2, 3, 8, 9, 37])
def test_attention_views(libs, t):
    """Q K^T and P V of one [T, 12, 64] layout, read per head through strides; short T
    makes every B panel a partial one."""
    lib = libs["default"]
    rng = np.random.default_rng(5)
    heads, d = 12, 64
    q = rng.standard_normal((t, heads, d)).astype(np.float32)
    kk = rng.standard_normal((t, heads, d)).astype(np.float32)
    scores = np.full((heads, t, t), np.nan, dtype=np.float32)
    # A(m,k) = q[m, h, k]: sa0 = d, rsa = heads*d; B(k,n) = kk[n, h, k]: rsb = 1, csb = heads*d
    lib.cdll.ss_gemm(t, t, d, heads, 1, q.ctypes.data, d, 0, heads * d, 1, kk.ctypes.data, d, 0, 1, heads * d,
                     scores.ctypes.data, t * t, 0, t, 0.125, None, 0.0, 0, 0, 0)
    expected = np.einsum("mhk,nhk->hmn", q.astype(np.float64), kk.astype(np.float64)) * 0.125
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    out = np.full((t, heads, d), np.nan, dtype=np.float32)
    # C(m,n) = out[m, h, n]: sc0 = d, ldc = heads*d
    lib.cdll.ss_gemm(t, d, t, heads, 1, scores.ctypes.data, t * t, 0, t, 1, q.ctypes.data, d, 0, heads * d, 1,
                     out.ctypes.data, d, 0, heads * d, 1.0, None, 0.0, 0, 0, 0)
    expected_out = np.einsum("hmk,khn->mhn", scores.astype(np.float64), q.astype(np.float64))
    np.testing.assert_allclose(out, expected_out, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", [Case(300, 200, 150, bias="col", alpha=0.5, act=1),
                                  Case(3, 1400, 600, prepacked=True), Case(200, 5, 300, b_t=True),
                                  Case(50, 40, 30, batch0=3, batch1=1), Case(8, 100, 200, batch0=3)], ids=str)
@pytest.mark.parametrize("build", ["default", "tiny"])
def test_threads_agree(libs, build, case):
    """Two threads split batches, N or M; every element is summed in the same order, so bitwise equal.

    The default build runs the first two cases in parallel (over parallel_min_flops), the
    tiny build all of them."""
    lib = libs[build]
    rng = np.random.default_rng(9)
    a = rng.standard_normal((case.batch0, case.m, case.k)).astype(np.float32)
    b = rng.standard_normal((case.k, case.n)).astype(np.float32)
    if case.b_t:
        b = np.ascontiguousarray(b.T).T
    bias = rng.standard_normal(case.n).astype(np.float32)
    outs = []
    try:
        for threads in (1, 2):
            lib.cdll.ss_set_num_threads(threads)
            c = np.full((case.batch0, case.m, case.n), np.nan, dtype=np.float32)
            rsb, csb = _elem_strides(b)
            lib.cdll.ss_gemm(case.m, case.n, case.k, case.batch0, 1, a.ctypes.data, case.m * case.k, 0, case.k, 1,
                             b.ctypes.data, 0, 0, rsb, csb, c.ctypes.data, case.m * case.n, 0, case.n,
                             case.alpha, bias.ctypes.data if case.bias != "none" else None, 1.0, 0, 1, case.act)
            outs.append(c)
    finally:
        lib.cdll.ss_set_num_threads(1)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64)) * case.alpha
    if case.bias != "none":
        expected += bias
    if case.act:
        expected = np.maximum(expected, 0)
    np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kwargs,message", [
    (dict(nr=12), "multiple of lanes=8"),
    (dict(nr=24, lanes=16, registers=32), "multiple of lanes=16"),
    (dict(lanes=16), "needs registers=32"),
    (dict(lanes=4), "lanes must be 8"),
    (dict(registers=24), "registers must be 16"),
    (dict(mr=15, nr=32, lanes=16, registers=32), "needs 33 zmm registers"),
    (dict(mr=7, nr=16), "ymm registers"),
    (dict(mr=2, nr=48), "ymm registers"),
    (dict(mc=70), "multiple of mr"),
    (dict(nc=3000), "multiple of nr"),
    (dict(small_nc=100), "multiple of nr"),
    (dict(one_block_nc=100), "multiple of nr"),
    (dict(one_block_nc=-16), "one_block_nc must be >= 0"),
    (dict(prefetch_rows=-1), "prefetch_rows"),
    (dict(prefetch_min_m=-1), "prefetch_min_m"),
    (dict(kc=0), ">= 1"),
    (dict(unroll_k=0), ">= 1"),
    (dict(unroll_k=17), "over 16"),
    (dict(small_m=33), "small_m"),
    (dict(small_m=-1), "small_m"),
    (dict(parallel_min_flops=-1), "parallel_min_flops"),
    (dict(small_panels=0), "small_panels"),
    (dict(small_panels=9), "small_panels"),
])
def test_schedule_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GemmSchedule(**kwargs)


def test_schedule_types():
    with pytest.raises(TypeError):
        GemmSchedule(mr=6.0)
    with pytest.raises(TypeError):
        GemmSchedule(small_m=True)


def test_source_reflects_schedule():
    text = gemm.source(TINY)
    for line in ("#define SS_GEMM_MR 4", "#define SS_GEMM_NR 8", "#define SS_GEMM_KC 5",
                 "#define SS_GEMM_MC 8", "#define SS_GEMM_NC 16", "#define SS_GEMM_SMALL_NC 16",
                 "#pragma GCC unroll 3"):
        assert line in text
    # TINY prefetches from 2 rows on: the 2- and 3-row kernels exist in both variants.
    assert "ss_gemm_small_3_pf(" in text and "ss_gemm_small_1(" in text and "ss_gemm_small_4" not in text
    assert "ss_gemm_small_1_pf(" not in text and "_mm_prefetch" in text
    assert "_mm_prefetch" not in gemm.source(GemmSchedule(prefetch_rows=0, prefetch_c=0))


def test_packed_b_size_python_matches_c(libs):
    for build in ("default", "tiny"):
        lib = libs[build]
        for k, n in [(0, 0), (0, 7), (5, 0), (1, 1), (768, 768), (100, 17)]:
            assert lib.cdll.ss_gemm_packed_b_size(k, n) == gemm.packed_b_size(k, n, lib.schedule)


# sha256 of gemm.source() for the x86-64-v3 target's default schedule (the host's depends on
# the machine): the prefix parameter must leave the default text alone. Update it
# deliberately when the generated kernels change (last: kernels by width, lanes and
# registers fields, the C-tile prefetch, the x86-64-v3 default's mc from its caches, and
# the tile loops as one block for either order, a_in_l1; then the fragment written with the
# C writer, token for token the same C as before, laid out and commented by the writer; then a
# fused Relu that keeps NaN: max_ps(zero, acc); then the B-streaming path drawn per width, its
# dispatchers with its kernels, B vectors pinned with "+v"; then the epilogue's addend D and
# the ss_gemm_add / ss_gemm_prepacked_add entries, for a conv's fused residual, its lines
# prefetched a tile ahead; then the last rows of M over groups of B panels, ss_gemm_edge_rows;
# then SS_GEMM_PAR_MIN_FLOPS 2 -> 1 Mflop; then a prepacked B's next panel prefetched into L2
# over the tiles of the one before; then one thread's plan inside another kernel's parallel region;
# then B blocks of one_block_nc columns for the rows of one block of A; then SS_GEMM_NC_MAX for the
# size of B's packing buffer).
DEFAULT_SOURCE_SHA256 = "9c575afca192ad106e869b54c8e2350eee07eddad93d12a23f876180c6baedcb"


def test_default_prefix_source_unchanged():
    import hashlib

    assert gemm.source() == gemm.source(default_schedule(), prefix="ss_")
    assert hashlib.sha256(gemm.source(AVX2_DEFAULT).encode()).hexdigest() == DEFAULT_SOURCE_SHA256


def test_prefix_renames_everything():
    text = gemm.source(TINY, prefix="k1_")
    assert "ss_gemm" not in text and "SS_GEMM" not in text
    assert "void k1_gemm_prepacked(" in text and "#define K1_GEMM_MR 4" in text


@pytest.mark.parametrize("prefix", ["", "1x_", "a-b_", "k1"])
def test_bad_prefix(prefix):
    with pytest.raises(ValueError, match="prefix"):
        gemm.source(prefix=prefix)


def test_two_prefixed_schedules_in_one_library(tmp_path):
    """Two schedules side by side in one library, each numpy-correct through its own names."""
    schedules = {"ka_": GemmSchedule(), "kb_": TINY}
    text = PRELUDE + "".join(gemm.source(s, prefix=p) for p, s in schedules.items())
    cdll = compile_library(text, name_hint="gemm_prefix_test", cache_dir=tmp_path).cdll
    rng = np.random.default_rng(0)
    m, k, n = 13, 37, 29
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    for prefix, schedule in schedules.items():
        size = getattr(cdll, f"{prefix}gemm_packed_b_size")
        size.argtypes, size.restype = [i64, i64], i64
        assert size(k, n) == gemm.packed_b_size(k, n, schedule)
        packed = np.empty(size(k, n), dtype=np.float32)
        pack = getattr(cdll, f"{prefix}gemm_pack_b")
        pack.argtypes = [i64, i64, ptr, i64, i64, ptr]
        pack(k, n, b.ctypes.data, n, 1, packed.ctypes.data)
        np.testing.assert_array_equal(packed, gemm.pack_b_reference(b, schedule))
        run = getattr(cdll, f"{prefix}gemm_prepacked")
        run.argtypes = _GEMM_ARGS + [ptr] + _TAIL_ARGS
        c = np.full((m, n), np.nan, dtype=np.float32)
        run(m, n, k, 1, 1, a.ctypes.data, 0, 0, k, 1, packed.ctypes.data, c.ctypes.data, 0, 0, n,
            1.0, None, 0.0, 0, 0, 0)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
