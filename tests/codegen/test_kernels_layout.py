"""ss_copy and ss_fill (shapeshift/codegen/kernels/layout.py) against NumPy views.

Every case builds the source (and often the destination) as a NumPy view of a larger
buffer, so that transposes, negative steps, broadcasts and offsets come from NumPy itself,
then checks the destination view equals the source view and the rest of the destination
buffer is untouched.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import layout
from shapeshift.codegen.kernels.prelude import PRELUDE

ELEM_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SENTINEL = 0xA5


# The default build, and one whose tiny tile and threshold put small cases on the tiled
# and threaded paths too.
@pytest.fixture(scope="module", params=[{}, {"tile": 8, "parallel_bytes": 64, "chunk_bytes": 24}], ids=["default", "small"])
def lib(request, build_cache):
    cdll = compile_library(PRELUDE + layout.source(**request.param), name_hint="layout",
                           cache_dir=build_cache).cdll
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    p64 = ctypes.POINTER(ctypes.c_int64)
    cdll.ss_copy.argtypes = [i64, i64, p64, vp, p64, vp, p64]
    cdll.ss_copy.restype = None
    cdll.ss_fill.argtypes = [i64, vp, i64, vp]
    cdll.ss_fill.restype = None
    return cdll


def _i64s(values):
    values = list(values)
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def _elem_strides(view: np.ndarray) -> list[int]:
    for s in view.strides:
        assert s % view.itemsize == 0
    return [s // view.itemsize for s in view.strides]


def copy_into(lib, src: np.ndarray, dst: np.ndarray) -> None:
    """ss_copy of the view src into the view dst (same shape and dtype)."""
    assert src.shape == dst.shape and src.dtype == dst.dtype
    lib.ss_copy(src.itemsize, src.ndim, _i64s(src.shape), src.ctypes.data, _i64s(_elem_strides(src)),
                dst.ctypes.data, _i64s(_elem_strides(dst)))


def random_buffer(rng, elem_size: int, n: int) -> np.ndarray:
    info = np.iinfo(ELEM_DTYPES[elem_size])
    return rng.integers(0, info.max, size=n, dtype=ELEM_DTYPES[elem_size], endpoint=True)


def check_copy(lib, src: np.ndarray, dst_base: np.ndarray | None = None, dst_view=None) -> None:
    """Copy src into dst_view(dst_base) (a fresh contiguous array by default) and check."""
    if dst_base is None:
        dst_base = np.empty(src.shape, src.dtype)
        dst_view = lambda b: b  # noqa: E731
    dst_base.reshape(-1).view(np.uint8)[:] = SENTINEL
    before = dst_base.copy()
    dst = dst_view(dst_base)
    copy_into(lib, src, dst)
    np.testing.assert_array_equal(dst, src)
    # Everything outside the destination view keeps its sentinel.
    mask = np.ones(dst_base.shape, bool)
    dst_view(mask)[...] = False
    np.testing.assert_array_equal(dst_base[mask], before[mask])


def permuted(rng, elem_size, shape, perm):
    base = random_buffer(rng, elem_size, int(np.prod(shape))).reshape(shape)
    return base.transpose(perm)


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_every_transpose(lib, elem_size, rank):
    rng = np.random.default_rng(rank * 10 + elem_size)
    shapes = [tuple(rng.integers(1, 12, size=rank)) for _ in range(3)]
    shapes.append((1,) * (rank - 1) + (9,))
    shapes.append(tuple([17, 33, 5, 3][:rank]))
    for shape in shapes:
        for perm in itertools.permutations(range(rank)):
            check_copy(lib, permuted(rng, elem_size, shape, perm))


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
@pytest.mark.parametrize("shape,perm", [
    ((128, 12, 64), (1, 0, 2)),     # attention heads split: rows stay contiguous
    ((128, 12, 64), (1, 2, 0)),     # K transposed: blocked path
    ((512, 512), (1, 0)),           # matrix transpose, parallel blocked path
    ((257, 131), (1, 0)),           # sizes off every tile and vector width
    ((3, 1000), (1, 0)),            # long rows, a short transposed dim
    ((7, 45, 3, 37), (3, 1, 2, 0)),
    ((2, 9, 300, 40), (0, 3, 1, 2)),
])
def test_large_transposes(lib, elem_size, shape, perm):
    rng = np.random.default_rng(len(shape) * 7 + elem_size)
    check_copy(lib, permuted(rng, elem_size, shape, perm))


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_negative_steps(lib, elem_size):
    rng = np.random.default_rng(elem_size)
    base = random_buffer(rng, elem_size, 6 * 7 * 40).reshape(6, 7, 40)
    views = [base[::-1], base[:, ::-1], base[..., ::-1], base[::-2, 1::3, ::-5],
             base[::-1, ::-1, ::-1], base[..., ::-1].transpose(2, 0, 1), base[4:1:-1, :, 30:2:-2]]
    for v in views:
        check_copy(lib, v)


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_broadcast_and_tile(lib, elem_size):
    rng = np.random.default_rng(elem_size + 100)
    base = random_buffer(rng, elem_size, 5 * 6).reshape(5, 1, 6)
    check_copy(lib, np.broadcast_to(base, (5, 4, 6)))        # Expand a middle axis
    check_copy(lib, np.broadcast_to(base[:, :, :1], (5, 4, 9)))  # Expand the innermost axis
    check_copy(lib, np.broadcast_to(base[0, 0, 0], (3, 2, 4)))   # a scalar broadcast
    check_copy(lib, np.broadcast_to(base[::-1], (2, 5, 3, 6)))  # new leading axis + reversed
    # Tile(x, reps) as the rank-doubled view [r0, d0, r1, d1] with 0 strides on the reps.
    x = base.reshape(5, 6)
    reps = (3, 2)
    it = x.itemsize
    view = np.lib.stride_tricks.as_strided(x, shape=(reps[0], 5, reps[1], 6), strides=(0, 6 * it, 0, it))
    dst = np.empty((reps[0] * 5, reps[1] * 6), x.dtype)
    copy_into(lib, view, dst.reshape(reps[0], 5, reps[1], 6))
    np.testing.assert_array_equal(dst, np.tile(x, reps))


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_concat_split_pad_pieces(lib, elem_size):
    rng = np.random.default_rng(elem_size + 200)
    a = random_buffer(rng, elem_size, 4 * 3 * 5).reshape(4, 3, 5)
    b = random_buffer(rng, elem_size, 4 * 7 * 5).reshape(4, 7, 5)
    # Concat along axis 1: each piece lands at an offset of the big tensor.
    big = np.empty((4, 10, 5), a.dtype)
    copy_into(lib, a, big[:, :3])
    copy_into(lib, b, big[:, 3:])
    np.testing.assert_array_equal(big, np.concatenate([a, b], axis=1))
    # Split: pieces read out of an offset of the big tensor.
    check_copy(lib, big[:, 2:9])
    check_copy(lib, big[..., 4:])
    # Pad: the destination is an interior window (the rest keeps its fill).
    check_copy(lib, a, np.empty((6, 5, 9), a.dtype), lambda t: t[1:5, 2:5, 3:8])
    # A transposed source into a strided destination window.
    check_copy(lib, b.transpose(2, 0, 1), np.empty((7, 6, 9), a.dtype), lambda t: t[1:6, 1:5, 1:8])
    # A destination written in a permuted order (scatter-style strides).
    check_copy(lib, b, np.empty((5, 4, 7), a.dtype), lambda t: t.transpose(1, 2, 0))


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_rank0_and_empty(lib, elem_size):
    rng = np.random.default_rng(elem_size + 300)
    base = random_buffer(rng, elem_size, 4)
    check_copy(lib, base[2:3].reshape(()))
    lib.ss_copy(elem_size, 0, None, base.ctypes.data, None, base[3:].ctypes.data, None)
    assert base[3] == base[0]
    for shape in [(0,), (3, 0), (0, 4, 5), (2, 3, 0, 1)]:
        src = random_buffer(rng, elem_size, 1)
        dst = np.full(1, SENTINEL, src.dtype)
        zeros = _i64s([0] * len(shape))
        lib.ss_copy(elem_size, len(shape), _i64s(shape), src.ctypes.data, zeros, dst.ctypes.data, zeros)
        assert dst[0] == SENTINEL


def random_view(rng, elem_size):
    """A random view of rank 0..5: extents 0..5, reversed or stepped axes, broadcasts, a permutation."""
    rank = int(rng.integers(0, 6))
    shape = [int(rng.integers(0, 6)) if rng.random() < 0.1 else int(rng.integers(1, 6)) for _ in range(rank)]
    steps = [int(rng.choice([1, 1, -1, 2, -2])) for _ in range(rank)]
    base_shape = [max(n * abs(s), 1) for n, s in zip(shape, steps)]
    base = random_buffer(rng, elem_size, int(np.prod(base_shape))).reshape(base_shape)
    view = base[(*(slice(None, None, s) for s in steps), Ellipsis)]
    view = view[(*(slice(0, n) for n in shape), Ellipsis)]
    broadcast = [d for d in range(rank) if view.shape[d] == 1 and rng.random() < 0.3]
    if broadcast:
        target = list(view.shape)
        for d in broadcast:
            target[d] = int(rng.integers(2, 5))
        view = np.broadcast_to(view, target)
    return view.transpose(rng.permutation(rank)) if rank else view


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_random_views(lib, elem_size):
    rng = np.random.default_rng(elem_size + 400)
    for _ in range(300):
        src = random_view(rng, elem_size)
        if rng.random() < 0.5 or src.ndim == 0:
            check_copy(lib, src)
        else:
            # Into a window of a bigger, possibly permuted destination.
            perm = rng.permutation(src.ndim)
            inv = np.argsort(perm)
            big = tuple(src.shape[p] + 2 for p in perm)
            window = lambda t: t[tuple(slice(1, 1 + src.shape[p]) for p in perm)].transpose(inv)  # noqa: E731
            check_copy(lib, src, np.empty(big, src.dtype), window)


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
def test_large_contiguous_and_strided(lib, elem_size):
    rng = np.random.default_rng(elem_size + 500)
    n = 300_001  # threaded for 4- and 8-byte elements by default; not a multiple of the chunk
    flat = random_buffer(rng, elem_size, n)
    check_copy(lib, flat)
    check_copy(lib, flat[::-1])
    check_copy(lib, flat[: n - 1].reshape(1000, 300)[:, ::3])
    check_copy(lib, np.broadcast_to(flat[:1000], (400, 1000)))
    check_copy(lib, random_buffer(rng, elem_size, 1 << 20))  # divides the parallel chunk evenly
    check_copy(lib, random_buffer(rng, elem_size, 11))  # shorter than one chunk of the small build


def test_odd_elem_size(lib):
    """Sizes other than 1, 2, 4, 8 go through the bytewise fallback."""
    rng = np.random.default_rng(600)
    base = rng.integers(0, 255, size=(4, 5, 3), dtype=np.uint8)
    src = base.transpose(1, 0, 2)  # elements of 3 bytes laid out [4, 5]
    dst = np.zeros((5, 4, 3), np.uint8)
    lib.ss_copy(3, 2, _i64s([5, 4]), src.ctypes.data, _i64s([1, 5]), dst.ctypes.data, _i64s([4, 1]))
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("elem_size", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 7, 33, 1000, 200_003])
def test_fill(lib, elem_size, n):
    rng = np.random.default_rng(n + elem_size)
    value = random_buffer(rng, elem_size, 1)
    buf = np.full(n + 3, SENTINEL, value.dtype)
    lib.ss_fill(elem_size, buf.ctypes.data, n, value.ctypes.data)
    np.testing.assert_array_equal(buf[:n], np.full(n, value[0]))
    np.testing.assert_array_equal(buf[n:], np.full(3, SENTINEL, value.dtype))
