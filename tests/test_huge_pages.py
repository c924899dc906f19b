"""runtime/huge_pages.py: large buffers on 2 MiB-aligned, huge-page-advised memory; small
ones as np.empty gives them; and the VM's packed weights and arena taken from it."""

import re

import numpy as np
import pytest

from shapeshift.runtime import huge_pages


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return ""
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else ""


def _smaps_entry(address: int) -> str:
    """The /proc/self/smaps block of the mapping holding ``address``."""
    text = open("/proc/self/smaps").read()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if lo <= address < hi:
            return block
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("count", [1, 3, 1000, 4097])
def test_small_buffers_stay_on_malloc_on_a_cache_line(count):
    for _ in range(8):  # malloc's addresses vary: 16 bytes past a line as often as not
        a = huge_pages.empty(count, np.float32)
        assert a.shape == (count,) and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % huge_pages.ALIGNMENT == 0
        a[:] = 1.0


def test_aligned_copies_only_what_is_off_a_cache_line():
    raw = np.arange(40, dtype=np.float32)
    skew = -raw.ctypes.data % huge_pages.ALIGNMENT // 4
    on, off = raw[skew:skew + 16].reshape(4, 4), raw[skew + 1:skew + 17].reshape(4, 4)
    assert huge_pages.aligned(on) is on
    copy = huge_pages.aligned(off)
    assert copy.ctypes.data % huge_pages.ALIGNMENT == 0 and copy.shape == (4, 4)
    np.testing.assert_array_equal(copy, off)
    strided = huge_pages.aligned(raw[::2])
    assert strided.flags.c_contiguous and strided.ctypes.data % huge_pages.ALIGNMENT == 0
    np.testing.assert_array_equal(strided, raw[::2])


@pytest.mark.parametrize("count", [huge_pages.MIN_BYTES // 4, huge_pages.MIN_BYTES // 4 + 12345])
def test_large_buffers_are_aligned_usable_and_kept_alive_by_their_views(count):
    a = huge_pages.empty(count, np.float32)
    assert a.shape == (count,) and a.dtype == np.float32 and a.flags.writeable
    assert a.ctypes.data % huge_pages.HUGE_PAGE == 0
    a[:] = np.arange(count, dtype=np.float32)
    tail = a[-5:]
    del a  # the view's base chain holds the mapping
    np.testing.assert_array_equal(tail, np.arange(count - 5, count, dtype=np.float32))


def test_large_buffers_are_advised_for_huge_pages_where_the_kernel_takes_advice():
    """Where THP is 'madvise' or 'always', the mapping is eligible (the kernel's own word,
    smaps' THPeligible); where it is 'never', the buffer is still an ordinary one."""
    a = huge_pages.empty(huge_pages.MIN_BYTES, np.uint8)
    a[:] = 1
    block = _smaps_entry(a.ctypes.data)
    mode = _thp_mode()
    if mode in ("madvise", "always") and "THPeligible" in block:
        assert re.search(r"THPeligible:\s+1", block), block
        assert re.search(r"^VmFlags:.*\bhg\b", block, re.M), block  # MADV_HUGEPAGE recorded
    assert int(a.sum()) == huge_pages.MIN_BYTES


def test_vm_packs_large_weights_on_huge_pages():
    """An LSTM whose packed R is past MIN_BYTES: the VM's packed copy is 2 MiB-aligned (from
    huge_pages), and the model still agrees with onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from shapeshift.runtime.session import InferenceSession

    H, T, B = 640, 3, 2  # 4 * 640 * 640 floats = 6.25 MiB of R
    rng = np.random.default_rng(3)
    W = (rng.standard_normal((1, 4 * H, 8)) / 3).astype(np.float32)
    R = (rng.standard_normal((1, 4 * H, H)) / np.sqrt(H)).astype(np.float32)
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=H)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", B, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    session = InferenceSession(data, backend="native")
    vm = session._executor.vm
    x = rng.standard_normal((T, B, 8)).astype(np.float32)
    got = session.run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    large = [a for a in vm._keep_alive if a.nbytes >= huge_pages.MIN_BYTES]
    assert large and all(a.ctypes.data % huge_pages.HUGE_PAGE == 0 for a in large)


@pytest.mark.parametrize("count", [1000, huge_pages.MIN_BYTES // 4 + 3])
def test_views_hold_the_buffer_itself(count):
    """The VM reuses a late output's buffer only when nothing but itself holds it
    (sys.getrefcount): every view of a buffer must hold the buffer, not the memory under it."""
    import sys

    a = huge_pages.empty(count, np.float32)
    before = sys.getrefcount(a)
    view = a[3:]
    inner = view[1:]
    held = sys.getrefcount(a)  # outside the asserts: pytest's rewriting keeps their operands
    assert held == before + 2
    assert view.base is a and inner.base is a
    del view, inner
    released = sys.getrefcount(a)
    assert released == before
