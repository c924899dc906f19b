"""Register tiles of the tuner's space against NumPy, in both widths, at ragged M, N, K.

The space (tune/space.py) offers every (mr, nr, width) whose accumulators fit a target's
register file: for x86-64-v4's 32 registers, zmm tiles up to 30x16, 14x32, 9x48, 6x64 and
ymm ones up to 30x8, 14x16, ... Each tile generates its own full-tile and edge kernels, so
each is a different program. Compiling all ~120 would cost minutes, so this checks, per
width and tile width (nr / lanes = 1..4), the shortest, a middle and the tallest tile mr,
with blocking small enough (kc 37, mc 2 panels, nc 2 panels) that every K block, M block
and N block has a ragged last one. Several schedules share one library under their own
prefixes (gemm.source(schedule, prefix)). On a machine without AVX-512 the zmm schedules
run their ymm form: still checked.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import gemm
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.target import named_target
from shapeshift.tune import space

from .test_kernels_gemm import _GEMM_ARGS, _TAIL_ARGS, Case, Lib, run_case

i64, ptr = ctypes.c_int64, ctypes.c_void_p


def _tiles() -> list[GemmSchedule]:
    target = named_target("x86-64-v4")
    by_shape: dict = {}
    for mr, nr, lanes in space.tile_choices(target):
        by_shape.setdefault((lanes, nr), []).append(mr)
    chosen = []
    for (lanes, nr), mrs in sorted(by_shape.items()):
        for mr in sorted({min(mrs), mrs[len(mrs) // 2], max(mrs)}):
            chosen.append(GemmSchedule(mr=mr, nr=nr, lanes=lanes, registers=target.vector_registers, kc=37,
                                       mc=2 * mr, nc=2 * nr, small_m=0, small_nc=nr, prefetch_c=mr % 2,
                                       a_in_l1=(mr // 2) % 2))
    return chosen


TILES = _tiles()
GROUP = 6  # schedules per library: one build each, a few seconds of gcc
GROUPS = [TILES[i:i + GROUP] for i in range(0, len(TILES), GROUP)]
# Ragged against every tile: 1, a prime, one past a power of two, and sizes around nr.
SIZES = [(1, 1, 1), (7, 15, 16), (17, 31, 33), (33, 17, 7), (50, 97, 75)]


def _prefixed(cdll, prefix: str) -> SimpleNamespace:
    """The four entry points of one schedule in a shared library, under ss_ names."""
    def typed(name, argtypes, restype=None):
        fn = getattr(cdll, prefix + name)
        fn.argtypes, fn.restype = argtypes, restype
        return fn

    return SimpleNamespace(
        ss_gemm=typed("gemm", _GEMM_ARGS + [ptr, i64, i64, i64, i64] + _TAIL_ARGS),
        ss_gemm_prepacked=typed("gemm_prepacked", _GEMM_ARGS + [ptr] + _TAIL_ARGS),
        ss_gemm_pack_b=typed("gemm_pack_b", [i64, i64, ptr, i64, i64, ptr]),
        ss_gemm_packed_b_size=typed("gemm_packed_b_size", [i64, i64], i64))


@pytest.fixture(scope="module")
def group_libs(tmp_path_factory) -> dict:
    return {"cache": tmp_path_factory.mktemp("gemm_tiles_cache"), "built": {}}


def _libs(group_libs, index: int) -> list[Lib]:
    built = group_libs["built"]
    if index not in built:
        schedules = GROUPS[index]
        source = PRELUDE + "".join(gemm.source(s, prefix=f"t{i}_") for i, s in enumerate(schedules))
        cdll = compile_library(source, name_hint="gemm_tiles", cache_dir=group_libs["cache"]).cdll
        built[index] = [Lib(_prefixed(cdll, f"t{i}_"), s) for i, s in enumerate(schedules)]
    return built[index]


def test_the_tiles_cover_both_widths_and_every_tile_width():
    assert {(s.lanes, s.nr // s.lanes) for s in TILES} == {(lanes, v) for lanes in (8, 16) for v in (1, 2, 3, 4)}
    assert max(s.mr for s in TILES if s.lanes == 16 and s.nr == 32) == 14


@pytest.mark.parametrize("index", range(len(GROUPS)))
def test_every_sampled_tile_matches_numpy(group_libs, index):
    for lib in _libs(group_libs, index):
        for m, n, k in SIZES:
            run_case(lib, Case(m, n, k, bias="col", alpha=0.5, beta=2.0, act=1), seed=m)
            run_case(lib, Case(m, n, k, b_t=True, batch0=2, prepacked=False), seed=n)
            run_case(lib, Case(m, n, k, a_t=True, prepacked=True), seed=k)
