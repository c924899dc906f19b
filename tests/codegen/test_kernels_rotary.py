"""ss_rotary_embedding (shapeshift/codegen/kernels/rotary.py) against onnx's reference
RotaryEmbedding-23.

4-D [B, H, S, D] and 3-D [B, S, H * D] inputs, interleaved or split halves, full and partial
rotation, with and without position ids (negative ones count from the end, as Gather's);
out-of-range ids and inconsistent shapes are reported, not read.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.build import compile_library
from shapeshift.codegen.kernels import rotary
from shapeshift.codegen.kernels.prelude import PRELUDE

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P, I64P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64)


@pytest.fixture(scope="module")
def lib(build_cache):
    source = PRELUDE + rotary.source(par_min=64)  # small: the test sizes run the OpenMP loop too
    cdll = compile_library(source, name_hint="test_rotary", cache_dir=build_cache).cdll
    cdll.ss_rotary_embedding.restype = ctypes.c_int
    cdll.ss_rotary_embedding.argtypes = [F32P] * 3 + [I64P, F32P] + [I64] * 10 + [ctypes.c_int]
    return cdll


def run_kernel(lib, x, cos, sin, ids, heads, rot, interleaved):
    """(return code, y) of the kernel on a 4-D or 3-D input; ``heads`` for 3-D."""
    if x.ndim == 4:
        b, h, s, d = x.shape
        strides = (h * s * d, d, s * d)
    else:
        b, s, hidden = x.shape
        h, d = heads, hidden // heads
        strides = (s * hidden, hidden, d)
    y = np.full_like(x, np.nan)
    ids_ptr = ids.ctypes.data_as(I64P) if ids is not None else None
    max_pos = cos.shape[0] if ids is not None else 0
    rc = lib.ss_rotary_embedding(x.ctypes.data_as(F32P), cos.ctypes.data_as(F32P), sin.ctypes.data_as(F32P), ids_ptr,
                                 y.ctypes.data_as(F32P), b, s, h, d, rot or d, cos.shape[-1], max_pos, *strides,
                                 interleaved)
    return rc, y


def reference(x, cos, sin, ids, heads, rot, interleaved):
    from onnx.reference import ReferenceEvaluator

    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if x.ndim == 3:
        attrs["num_heads"] = heads
    names = ["x", "cos", "sin"] + (["ids"] if ids is not None else [])
    node = helper.make_node("RotaryEmbedding", names, ["y"], **attrs)
    arrays = [x, cos, sin] + ([ids] if ids is not None else [])
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64 if a.dtype == np.int64 else TensorProto.FLOAT, a.shape)
              for n, a in zip(names, arrays)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, arrays)))[0]


def _case(rng, rank, b, h, s, d, rot, with_ids, max_pos=20):
    shape = (b, h, s, d) if rank == 4 else (b, s, h * d)
    x = rng.standard_normal(shape).astype(np.float32)
    half = (rot or d) // 2
    cache_shape = (max_pos, half) if with_ids else (b, s, half)
    angles = rng.uniform(0, 2 * np.pi, cache_shape)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    ids = rng.integers(0, max_pos, (b, s)).astype(np.int64) if with_ids else None
    return x, cos, sin, ids


CASES = list(itertools.product((4, 3), (0, 1), (0, 4), (True, False)))


@pytest.mark.parametrize("rank,interleaved,rot,with_ids", CASES,
                         ids=[f"{r}d-il{i}-rot{d}-{'ids' if p else 'noids'}" for r, i, d, p in CASES])
def test_against_reference(lib, rank, interleaved, rot, with_ids):
    rng = np.random.default_rng(rank * 100 + interleaved * 10 + rot + with_ids)
    for b, h, s, d in [(2, 3, 5, 8), (1, 1, 1, 6), (3, 2, 7, 10)]:
        if rot > d:
            continue
        x, cos, sin, ids = _case(rng, rank, b, h, s, d, rot, with_ids)
        rc, got = run_kernel(lib, x, cos, sin, ids, h, rot, interleaved)
        assert rc == 0
        np.testing.assert_array_equal(got, reference(x, cos, sin, ids, h, rot, interleaved))


def test_negative_position_ids_count_from_the_end(lib):
    rng = np.random.default_rng(1)
    x, cos, sin, ids = _case(rng, 4, 2, 2, 3, 8, 0, True, max_pos=6)
    ids[0, 0], ids[1, 2] = -1, -6
    rc, got = run_kernel(lib, x, cos, sin, ids, 2, 0, 0)
    assert rc == 0
    wrapped = np.where(ids < 0, ids + 6, ids)
    rc, want = run_kernel(lib, x, cos, sin, wrapped, 2, 0, 0)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [6, -7, 100])
def test_out_of_range_position_id_is_an_error(lib, bad):
    rng = np.random.default_rng(2)
    x, cos, sin, ids = _case(rng, 4, 2, 2, 3, 8, 0, True, max_pos=6)
    ids[1, 1] = bad
    rc, y = run_kernel(lib, x, cos, sin, ids, 2, 0, 0)
    assert rc == 1 and np.isnan(y).all()  # nothing written


def test_inconsistent_shapes_are_an_error(lib):
    rng = np.random.default_rng(3)
    x, cos, sin, ids = _case(rng, 4, 1, 2, 3, 8, 0, True)
    assert run_kernel(lib, x, cos, sin, ids, 2, 6, 0)[0] == 2  # cache of 4 columns for rot 6
    assert run_kernel(lib, x, cos, sin, ids, 2, 10, 0)[0] == 2  # rot above the head size


def test_empty_extents(lib):
    rng = np.random.default_rng(4)
    for b, s in [(0, 3), (2, 0)]:
        x, cos, sin, ids = _case(rng, 4, b, 2, s, 8, 0, True)
        rc, y = run_kernel(lib, x, cos, sin, ids, 2, 0, 0)
        assert rc == 0 and y.size == 0
