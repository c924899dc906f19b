"""Memory for the arrays ``run`` returns, recycled once the caller has dropped them.

Every run copies its outputs out of the arena (the arena is reused by the next run). A
fresh NumPy array per output made glibc hand large blocks back to the kernel when the
previous run's results were dropped, and take them again, page-faulting, for the next:
a GPT-2 decoding step with its 24 [4, 2, 501, 32] key/value outputs spent 10 of its 10.4
ms on that (1,400 page faults a run), against 3.9 ms for onnxruntime, whose outputs are
views of its own allocator's memory.

So outputs of at least ``MIN_BYTES`` are copied into buffers this pool owns. A buffer is
free again when nothing but the pool refers to it: every array made from it, views
included, holds a reference to it through its ``base`` chain. Sizes are rounded up to
one of four classes per power of two, so that a key/value cache growing by one token a
step still finds the buffers of two steps before. Free buffers unused for ``KEEP_RUNS``
runs are let go.

Most large outputs are not even copied: the VM gives the kernel that makes one a buffer of
this pool to write into (``aligned``) and returns that memory as it is (vm.py,
``_direct_output_roots``); the copy is left for outputs that share a buffer with another
output or that a fallback step makes. At batch 4 that took a GPT-2 decoding step from
1.0x onnxruntime's time to 0.73x.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

#: Outputs smaller than this are plain copies (malloc keeps small blocks anyway).
MIN_BYTES = 1 << 16
#: A free buffer not taken for this many runs is released.
KEEP_RUNS = 2


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of a quarter of its power of two."""
    step = 1 << max(0, nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


class OutputBuffers:
    """Recycled memory for output copies (one per VM; runs hold the VM's lock)."""

    def __init__(self) -> None:
        self._buffers: list[bytearray] = []
        self._last_used: list[int] = []
        self._run = 0

    def start_run(self) -> None:
        """Count a run; release free buffers that no recent run took."""
        self._run += 1
        if not self._buffers:  # models whose outputs are all small never make one
            return
        keep = [i for i in range(len(self._buffers))
                if not self._is_free(i) or self._run - self._last_used[i] <= KEEP_RUNS]
        if len(keep) != len(self._buffers):
            self._buffers = [self._buffers[i] for i in keep]
            self._last_used = [self._last_used[i] for i in keep]

    def copy(self, array: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of ``array`` that the caller owns."""
        if array.nbytes < MIN_BYTES or array.dtype.hasobject:
            # ndarray.copy is np.array's C-order copy at half its call cost (a small model's
            # run is mostly such fixed costs); a subclass is made an ndarray as before.
            return array.copy() if type(array) is np.ndarray else np.array(array, copy=True, order="C")
        buffer = self._take(size_class(array.nbytes))
        out = np.frombuffer(buffer, dtype=array.dtype, count=array.size).reshape(array.shape)
        np.copyto(out, array)
        return out

    def aligned(self, nbytes: int, alignment: int) -> np.ndarray:
        """``nbytes`` bytes of a free buffer, starting at a multiple of ``alignment``: where a
        kernel writes an output that the caller then receives without a copy."""
        memory = self._take(size_class(nbytes + alignment))
        # Its address through a ctypes view: ``ndarray.ctypes`` costs about 1 us more, at
        # every run, for every output written in place.
        skew = -ctypes.addressof(ctypes.c_char.from_buffer(memory)) % alignment
        return np.frombuffer(memory, dtype=np.uint8)[skew:skew + nbytes]

    def _is_free(self, index: int) -> bool:
        # References: the list's and getrefcount's argument; any array from it adds one.
        return sys.getrefcount(self._buffers[index]) == 2

    def _take(self, nbytes: int) -> bytearray:
        for i in range(len(self._buffers)):
            if len(self._buffers[i]) == nbytes and self._is_free(i):
                self._last_used[i] = self._run
                return self._buffers[i]
        self._buffers.append(bytearray(nbytes))
        self._last_used.append(self._run)
        return self._buffers[-1]
