"""The VM's own buffers (packed weights, the arena, late outputs): on cache-line boundaries
always, on transparent huge pages when large.

Every buffer starts on a multiple of ``ALIGNMENT`` (a cache line): numpy's and malloc's start
16 bytes past one as often as not, and then every 64-byte vector a kernel loads from the
buffer spans two lines: the depthwise conv kernel alone took 1.2-1.25x its time on 3-12 MB
planes so (AMD Zen 4). The graph's constants are read where they lie (runtime/vm.py says
why); ``aligned`` copies an array onto a line, for a bench that calls a kernel directly.

A kernel that streams a weight of several megabytes per call (a recurrent step's R, a
matrix-vector product) touches a new 4 KiB page every 1024 floats, and past the TLB's
reach (2048 entries, 8 MiB, on an AMD Zen 2) each one is a page walk. Linux backs memory
with 2 MiB pages only where the program asks (``madvise``) on most distributions' default
(``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise``), and glibc's malloc does
not ask. Measured on an AMD Zen 2, 1 thread, an LSTM's recurrent product at batch 4 over a
16 MiB packed R (hidden 1024) cycling through 64 MiB: 1.02 ms a step on 4 KiB pages,
0.76 ms on 2 MiB pages.

So buffers of at least ``MIN_BYTES`` come from an anonymous mapping whose 2 MiB-aligned
part is advised ``MADV_HUGEPAGE``; pages are still only backed once touched. Where the
kernel or Python lacks the advice (not Linux, THP off) the mapping is an ordinary one.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20
#: Where every buffer starts: a multiple of a cache line (and of a zmm vector).
ALIGNMENT = 64
#: Buffers below this stay on malloc's pages: a buffer's last huge page is backed whole
#: once touched, at most a third more memory from 4 MiB up.
MIN_BYTES = 4 << 20


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` itself where it is C-contiguous and starts at a multiple of ALIGNMENT, else
    such a copy of it (from ``empty``)."""
    array = np.asarray(array, order="C")
    if array.ctypes.data % ALIGNMENT == 0 or array.dtype.hasobject:
        return array
    copy = empty(array.size, array.dtype).reshape(array.shape)
    np.copyto(copy, array)
    return copy


def empty(count: int, dtype=np.uint8) -> np.ndarray:
    """An uninitialized 1-D array of ``count`` items starting at a multiple of ALIGNMENT,
    on huge pages where it is large enough (``MemoryError`` as ``np.empty`` raises it when
    the mapping cannot be made)."""
    dtype = np.dtype(dtype)
    nbytes = int(count) * dtype.itemsize
    if nbytes < MIN_BYTES:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        return _over(raw, -raw.ctypes.data % ALIGNMENT, nbytes, dtype)
    # One huge page more than rounded up, so that a 2 MiB-aligned run of that length fits;
    # the part before it is never touched, so never backed.
    length = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    try:
        memory = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as error:
        raise MemoryError(f"cannot map {length} bytes: {error}") from None
    raw = np.frombuffer(memory, dtype=np.uint8)
    skew = -raw.ctypes.data % HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            memory.madvise(advice, skew, length - skew)
        except OSError:  # THP compiled out of this kernel: ordinary pages
            pass
    # The array's base chain holds the mapping: it is unmapped when the last view goes.
    return _over(memory, skew, nbytes, dtype)


def _over(memory, skew: int, nbytes: int, dtype) -> np.ndarray:
    """An array over bytes [skew, skew + nbytes) of ``memory`` that every view of it holds:
    made from a memoryview, so numpy takes the array itself as its views' base. A slice of
    an array (``raw[skew:].view(dtype)``) would not be: numpy gives its views the array that
    owns the bytes as their base, and the VM, which reuses a late output's buffer when
    nothing holds it (sys.getrefcount), overwrote an output the caller still held."""
    return np.frombuffer(memoryview(memory)[skew:skew + nbytes], dtype=dtype)
