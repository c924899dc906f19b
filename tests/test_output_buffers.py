"""Recycled memory for the arrays a native run returns (runtime/output_buffers.py)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import shapeshift
from shapeshift.runtime.output_buffers import KEEP_RUNS, MIN_BYTES, OutputBuffers, size_class


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_size_classes_round_up_by_at_most_a_quarter():
    for n in [1, 7, 8, 9, 1000, MIN_BYTES, MIN_BYTES + 1, 525_312, 10**7 + 3]:
        c = size_class(n)
        assert n <= c <= max(n + 7, int(n * 1.25) + 1), (n, c)
        assert size_class(c) == c
    # A cache growing by one token a step stays in one class for a while.
    assert size_class(4 * 2 * 500 * 32 * 4) == size_class(4 * 2 * 501 * 32 * 4)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float64])
def test_copies_are_equal_owned_and_writable(dtype):
    pool = OutputBuffers()
    pool.start_run()
    source = (np.arange(3 * 128 * 65) % 7).astype(dtype).reshape(3, 128, 65)
    view = source[:, ::2]  # not contiguous
    for array in (source, view, source[:1, :1]):
        out = pool.copy(array)
        assert out.dtype == array.dtype and out.shape == array.shape and out.flags.c_contiguous
        assert out.flags.writeable and not np.shares_memory(out, source)
        np.testing.assert_array_equal(out, array)


def test_object_arrays_are_plain_copies():
    pool = OutputBuffers()
    pool.start_run()
    strings = np.array([b"x" * 10] * 20000, dtype=object)
    out = pool.copy(strings)
    assert out.dtype == object and list(out) == list(strings)


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    pool = OutputBuffers()
    source = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    pool.start_run()
    first = pool.copy(source)
    addresses = {_address(first)}
    pool.start_run()
    held_view = first[3:5]
    del first
    second = pool.copy(source)  # the view still holds the first buffer
    assert not np.shares_memory(second, held_view)
    np.testing.assert_array_equal(held_view, source[3:5])
    addresses.add(_address(second))
    del held_view, second
    pool.start_run()
    third = pool.copy(source[:, :1000])  # smaller, same size class: one of those buffers
    assert _address(third) in addresses and len(pool._buffers) == 2
    np.testing.assert_array_equal(third, source[:, :1000])


def test_unused_free_buffers_are_released():
    pool = OutputBuffers()
    pool.start_run()
    out = pool.copy(np.ones((MIN_BYTES // 4 * 3,), np.float32))
    del out
    for _ in range(KEEP_RUNS):
        pool.start_run()
    assert len(pool._buffers) == 1
    pool.start_run()
    assert len(pool._buffers) == 0


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
                    reason="no C compiler on this machine")
def test_native_outputs_survive_later_runs_and_recycle_their_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 128, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = shapeshift.InferenceSession(model, backend="native")
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal((n, 128, 256)).astype(np.float32) for n in (2, 2, 3, 2)]
    results = [session.run(None, {"x": x})[0] for x in feeds]  # all held: four buffers
    assert all(np.array_equal(y, np.maximum(x, 0)) for x, y in zip(feeds, results))
    assert len({_address(y) for y in results}) == 4
    last = _address(results[-1])
    del results
    # The last run's buffer (kept: its run is recent) is free again, and the same size.
    again = session.run(None, {"x": feeds[0]})[0]
    assert _address(again) == last
    np.testing.assert_array_equal(again, np.maximum(feeds[0], 0))


def _native_session(nodes, outputs, tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    graph = helper.make_graph(nodes, "direct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 128, 256])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return shapeshift.InferenceSession(model, backend="native")


def _pool_owned(array: np.ndarray, session) -> bool:
    """Whether ``array`` lies in one of the native VM's pool buffers."""
    buffers = session._executor.vm._outputs._buffers
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    if isinstance(array, memoryview):  # what np.frombuffer keeps of a bytearray
        array = array.obj
    return any(array is b for b in buffers)


def test_kernels_write_large_outputs_in_place(tmp_path, monkeypatch):
    # A native step's output goes straight into a pool buffer, which the caller gets as it is
    # (no copy out of the arena); held results keep their memory, dropped ones come back.
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"]),
             helper.make_node("Neg", ["x"], ["z"])]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 256])
    nodes.insert(0, helper.make_node("Constant", [], ["shape"], value=shape))
    session = _native_session(nodes, ["y", "z"], tmp_path, monkeypatch)
    direct = session._executor.vm._direct_roots
    assert len(direct) == 2
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((n, 128, 256)).astype(np.float32) for n in (2, 3, 2)]
    results = [session.run(None, {"x": x}) for x in xs]
    for x, (y, z) in zip(xs, results):
        np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(-1, 256))
        np.testing.assert_array_equal(z, -x)
        assert _pool_owned(y, session) and _pool_owned(z, session) and not np.shares_memory(y, z)
        assert y.flags.writeable and y.flags.c_contiguous and _address(y) % 64 == 0
    assert len({_address(a) for pair in results for a in pair}) == 6
    kept = _address(results[-1][1])
    del results, y, z
    again = session.run(None, {"x": xs[0]})
    assert kept in {_address(a) for a in again}
    np.testing.assert_array_equal(again[1], -xs[0])


def test_outputs_sharing_a_buffer_are_copied(tmp_path, monkeypatch):
    # y and Identity(y) are one buffer in the program: written in place, the two results
    # would be one memory. Both are copied out, as every output was before.
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["y"], ["y2"])]
    session = _native_session(nodes, ["y", "y2"], tmp_path, monkeypatch)
    assert session._executor.vm._direct_roots == []
    x = np.random.default_rng(3).standard_normal((2, 128, 256)).astype(np.float32)
    a, b = session.run(None, {"x": x})
    assert not np.shares_memory(a, b) and _pool_owned(a, session) and _pool_owned(b, session)
    np.testing.assert_array_equal(a, np.maximum(x, 0))
    np.testing.assert_array_equal(b, np.maximum(x, 0))
