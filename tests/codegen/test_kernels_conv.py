"""ss_conv2d and ss_conv_transpose2d (shapeshift/codegen/kernels/conv.py) against onnxruntime.

Each case runs a one-node Conv / ConvTranspose model in onnxruntime and the kernel at the
same attributes on the same random inputs; the output extents come from onnxruntime's
result, as the lowering would compute them. Covers the conv paths (implicit GEMM, direct
kernel, 1x1 gemm, depthwise, small planes, im2col), groups, strides, dilations, asymmetric pads, 1-D, every act code,
transposed convs with output_padding and groups, and empty batches.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.kernels import conv, conv_igemm, conv_panels, vmath

from .naive_gemm import build_with_gemm

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

RTOL, ATOL = 1e-4, 1e-4
#: The fragments conv depends on besides gemm (which build_with_gemm adds).
#: conv_panels up to its MAX_PLANE whatever the machine's GEMM tile (a narrow one's builds
#: never call it): its tiles are tested on every machine.
CONV_DEPS = vmath.source() + conv_igemm.source() + conv_panels.source(max_plane=conv_panels.MAX_PLANE)
I64, F32P = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def lib(build_cache):
    cdll = build_with_gemm(CONV_DEPS + conv.source(), build_cache, "test_conv").cdll
    cdll.ss_conv2d_work_size.restype = I64
    cdll.ss_conv2d_work_size.argtypes = [I64] * 6
    cdll.ss_conv2d.restype = None
    cdll.ss_conv2d.argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P]
    cdll.ss_gemm_packed_b_size.restype = I64
    cdll.ss_gemm_packed_b_size.argtypes = [I64, I64]
    cdll.ss_gemm_pack_b.restype = None
    cdll.ss_gemm_pack_b.argtypes = [I64, I64, F32P, I64, I64, F32P]
    cdll.ss_conv_transpose2d_work_size.restype = I64
    cdll.ss_conv_transpose2d_work_size.argtypes = [I64] * 7
    cdll.ss_conv_transpose2d.restype = None
    cdll.ss_conv_transpose2d.argtypes = [F32P] * 4 + [I64] * 16 + [F32P]
    return cdll


def ptr(a):
    return None if a is None else a.ctypes.data_as(F32P)


def run_ort(op, inputs, **attrs):
    names = ["x", "w", "b"][:len(inputs)]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


def apply_act(y, act):
    if act == 1:
        return np.maximum(y, 0)
    with np.errstate(over="ignore"):  # exp(-y) of a large negative y: inf, and the quotient 0 as it should
        if act == 2:
            return 1 / (1 + np.exp(-y))
        if act == 3:
            return y / (1 + np.exp(-y))
    return y


def as_2d(shape_1d_or_2d, fill):
    """1-D attributes become (fill, value): a 1-D conv is a 2-D conv with H = 1."""
    return tuple(shape_1d_or_2d) if len(shape_1d_or_2d) == 2 else (fill, *shape_1d_or_2d)


def packed_weights(lib, w):
    """w [M, C, KH, KW] as the GEMM's prepacked B of [C*KH*KW, M] (what the lowering packs)."""
    m, kc = w.shape[0], int(np.prod(w.shape[1:]))
    packed = np.full(lib.ss_gemm_packed_b_size(kc, m), np.nan, np.float32)
    lib.ss_gemm_pack_b(kc, m, ptr(np.ascontiguousarray(w)), 1, kc, ptr(packed))
    return packed


def call_conv(lib, x, w, b, y, strides, begin_pads, dilations, group, act, packed=None):
    xs, ws, ys = x.shape, w.shape, y.shape
    N, C, H, W = xs[0], xs[1], *as_2d(xs[2:], 1)
    M, KH, KW = ws[0], *as_2d(ws[2:], 1)
    OH, OW = as_2d(ys[2:], 1)
    sh, sw = as_2d(strides, 1)
    ph, pw = as_2d(begin_pads, 0)
    dh, dw = as_2d(dilations, 1)
    size = lib.ss_conv2d_work_size(C, KH, KW, OH, OW, group)
    work = np.full(max(size, 1), np.nan, np.float32)  # NaN: a read of unwritten scratch shows
    lib.ss_conv2d(ptr(x), ptr(w), ptr(b), ptr(y), N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw,
                  group, act, ptr(work), ptr(packed))


CONV_CASES = [
    # x shape, M, kernel, strides, pads (begin..., end...), dilations, group
    ((2, 5, 7, 9), 6, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 1x1: gemm on NCHW
    ((3, 6, 5, 3), 4, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),  # 1x1 grouped
    ((2, 5, 7, 9), 3, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # 1x1 strided: im2col
    ((1, 5, 7, 9), 3, (1, 1), (1, 1), (1, 0, 0, 2), (1, 1), 1),  # 1x1 padded: im2col
    ((1, 3, 11, 13), 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 3, 11, 13), 5, (3, 3), (2, 2), (0, 1, 2, 1), (1, 1), 1),  # asymmetric pads
    ((1, 4, 13, 12), 3, (3, 2), (1, 3), (2, 0, 1, 1), (2, 3), 1),  # dilations
    ((2, 6, 9, 10), 4, (3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 2),  # 2 groups
    ((1, 9, 8, 7), 6, (2, 3), (2, 1), (1, 0, 0, 1), (1, 2), 3),  # 3 groups
    ((2, 7, 10, 11), 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 7),  # depthwise
    ((1, 5, 10, 11), 5, (5, 5), (2, 2), (2, 1, 2, 3), (1, 1), 5),  # depthwise strided
    ((1, 4, 12, 9), 8, (3, 3), (1, 3), (2, 2, 2, 2), (2, 1), 4),  # depthwise, multiplier 2, dilated
    ((1, 3, 1, 1), 2, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 1x1 image, 3x3 kernel
    ((1, 3, 2, 2), 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),  # tiny depthwise, all borders
    ((1, 16, 31, 29), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # large enough for OpenMP
    ((1, 32, 23, 25), 32, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 32),  # depthwise, OpenMP
    ((2, 4, 17), 6, (3,), (2,), (1, 2), (2,), 1),  # 1-D
    ((1, 6, 15), 6, (5,), (1,), (2, 2), (1,), 6),  # 1-D depthwise
    ((3, 4, 9), 5, (1,), (1,), (0, 0), (1,), 1),  # 1-D 1x1
    # Depthwise register tiles (4 rows x 2 vectors): wide rows with a masked last vector,
    # a last row block recomputed overlapping, planes shorter than a row block.
    ((1, 3, 13, 37), 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 3),
    ((2, 4, 21, 40), 4, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 4),  # stride 2: vector deinterleave
    ((1, 2, 30, 50), 2, (3, 3), (3, 3), (1, 1, 1, 1), (1, 1), 2),  # stride 3: scalar phases
    ((1, 2, 9, 35), 4, (3, 3), (2, 1), (0, 2, 3, 1), (2, 3), 2),  # multiplier 2, dilated, asymmetric
    ((1, 3, 2, 17), 3, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 3),  # OH < row block, pads > half the kernel
    ((1, 2, 6, 7), 2, (7, 1), (1, 2), (3, 0, 3, 0), (1, 1), 2),  # KH != KW: the generic tap loops
    ((1, 2, 8, 16), 2, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 2),  # no padding, whole vectors
    # Small planes (<= conv.SMALL_PLANE pixels), which take the prepacked-weights path when packed:
    ((2, 40, 2, 3), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # a late stage: 6 pixels, many taps
    ((2, 16, 3, 4), 20, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 1x1 read in place
    ((1, 8, 9, 7), 12, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1),  # strided, asymmetric pads
    ((1, 6, 8, 8), 9, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilated
    ((1, 1, 1, 640), 258, (1, 256), (1, 128), (0, 0, 0, 0), (1, 1), 1),  # an STFT: one channel, 4 frames
    ((3, 1, 700), 33, (64,), (32,), (0, 0), (1,), 1),  # the same in 1-D, 3 signals
    # A batch of small planes is one batched GEMM call: large enough here for its threads,
    # and for the images' im2col and untransposes to run in parallel.
    ((4, 128, 3, 3), 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # Larger planes with at least as many channels as pixels (<= conv.SMALL_PLANE_MAX): 90
    # pixels, 96 channels, so the transposed result leaves partial 8 x 8 blocks both ways.
    ((1, 5, 9, 10), 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 3, 10, 10), 70, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 100 pixels, 70 channels: direct
    # The direct kernel (k x k, AVX2): 16-pixel tiles that run across output rows (OW < 16,
    # OW a multiple of 16, neither), stride 2 through its vector deinterleave (W >= 16, odd
    # and even pads), channel counts that leave a partial 6-channel block, many taps.
    ((1, 3, 9, 5), 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 5, 16, 32), 13, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 4, 21, 43), 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    ((1, 3, 20, 50), 5, (3, 3), (2, 2), (0, 2, 1, 0), (1, 1), 1),
    ((1, 2, 17, 37), 4, (5, 5), (2, 2), (2, 3, 2, 1), (2, 2), 1),  # stride and dilation 2
    ((1, 40, 12, 18), 20, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 360 taps
    ((1, 6, 30, 9), 8, (3, 3), (3, 2), (1, 1, 1, 1), (1, 1), 2),  # stride 3 x 2, groups
    ((1, 8, 1, 70), 12, (1, 7), (1, 2), (0, 3, 0, 3), (1, 1), 1),  # a 1-D k7 stride-2 row
    # The implicit GEMM (dense k x k; conv_igemm.py): 6-pixel tiles in 48-pixel blocks
    # (110 pixels: two blocks and a part one ending in a part tile), 16-channel panels, in
    # pairs on AVX-512 (33: a pair and a last panel of one channel; 20: a pair whose second
    # panel holds 4 channels; 16: one panel alone), taps in slices of the GEMM's kc (630 taps: 256, 256,
    # 118, read from the prepacked B's k blocks when packed), any stride, dilation and pads.
    ((3, 24, 11, 10), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 70, 9, 13), 20, (3, 3), (2, 1), (2, 1, 0, 2), (1, 2), 1),
    ((2, 17, 5, 40), 16, (5, 3), (1, 2), (2, 1, 2, 1), (1, 1), 1),
    ((2, 30, 100), 40, (3,), (2,), (1, 1), (1,), 1),  # 1-D, stride 2
    # Planes of at most conv_panels.MAX_PLANE pixels with packed weights run the GEMM's own
    # tile (conv_panels.py; 8 pixels x 48 channels in zmm, 6 x 16 in ymm): every tile height
    # (1 to 9 pixels, 17), channel counts that end a panel on each vector count and ragged
    # (1, 16, 17, 33, 47, 48, 49, 100), taps past one k block of the prepacked weights (450,
    # 640: the last block ragged), images read in place (unpadded) or staged. 1 x 1 convs
    # take the small-plane GEMM instead (kernels/conv.py), as the cases above test.
    ((1, 3, 1, 1), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 5, 1, 2), 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 7, 1, 3), 17, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),
    ((1, 4, 2, 2), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((3, 9, 1, 5), 47, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),
    ((1, 50, 2, 3), 48, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 6, 7, 1), 49, (3, 1), (1, 1), (1, 0, 1, 0), (1, 1), 1),
    ((1, 8, 4, 2), 100, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 2, 3, 3), 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 320, 1, 17), 20, (1, 2), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 11, 9, 9), 30, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # unpadded: in place, strided
    ((1, 13, 12, 10), 40, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilated
    ((2, 64, 8, 8), 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # enough work for its threads
    ((1, 16, 20, 20), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 400 pixels: the last plane it takes
    ((1, 16, 19, 21), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 399
    ((1, 16, 1, 401), 24, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1),  # 401: the implicit GEMM
    # Either side of conv_igemm.MIN_PLANE (9 pixels) with packed weights: small plane, igemm.
    ((2, 12, 3, 3), 20, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 12, 2, 5), 20, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
]


def _case_id(c) -> str:
    return f"{c[0]}-M{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}"


# Every case as the lowering passes it without packed weights, and each group-1 case with them.
CONV_RUNS = [pytest.param(case, packed, id=f"{_case_id(case)}-{'packed' if packed else 'plain'}")
             for case in CONV_CASES for packed in (False, True) if not packed or case[6] == 1]


@pytest.mark.parametrize("act", [0, 1, 2, 3])
@pytest.mark.parametrize("case,packed", CONV_RUNS)
def test_conv2d(lib, case, act, packed):
    xshape, M, kernel, strides, pads, dilations, group = case
    rng = np.random.default_rng(hash((case, act)) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal((M, xshape[1] // group, *kernel), dtype=np.float32)
    with_bias = act != 0 or len(xshape) == 3
    inputs = [x, w] + ([rng.standard_normal(M, dtype=np.float32)] if with_bias else [])
    expected = apply_act(run_ort("Conv", inputs, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                                 dilations=list(dilations), group=group), act)
    y = np.full(expected.shape, np.nan, np.float32)
    call_conv(lib, x, w, inputs[2] if with_bias else None, y, strides, pads[:len(kernel)], dilations, group, act,
              packed_weights(lib, w) if packed else None)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("batch", [8, 6, 5, 2])
def test_implicit_gemm_batch_in_groups_on_two_threads(lib, batch, packed):
    """1-D k5 convs (450 columns: past the planes conv_panels takes) whose scratch stages 4 of
    the batch's images at a time (two groups of 8, a short last group of 6 and 5, one group
    of 2), split between two threads: every output matches onnxruntime and the one-thread
    result bit for bit."""
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 32, 450), dtype=np.float32)
    w = rng.standard_normal((40, 32, 5), dtype=np.float32)
    b = rng.standard_normal(40, dtype=np.float32)
    expected = run_ort("Conv", [x, w, b], kernel_shape=[5], pads=[2, 2])
    outs = []
    try:
        for threads in (1, 2):
            lib.ss_set_num_threads(threads)
            y = np.full(expected.shape, np.nan, np.float32)
            call_conv(lib, x, w, b, y, (1,), (2,), (1,), 1, 0, packed_weights(lib, w) if packed else None)
            np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)
            outs.append(y)
    finally:
        lib.ss_set_num_threads(os.cpu_count() or 1)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("group,M", [(1, 4), (2, 4), (4, 4)])
def test_conv2d_empty_batch_writes_nothing(lib, group, M):
    x = np.zeros((0, 4, 5, 5), np.float32)
    w = np.ones((M, 4 // group, 3, 3), np.float32)
    y = np.zeros((0, M, 5, 5), np.float32)
    sentinel = np.full(8, 7.0, np.float32)
    call_conv(lib, x, w, None, y, (1, 1), (1, 1), (1, 1), group, 0)
    lib.ss_conv2d(ptr(x), ptr(w), None, ptr(sentinel), 1, 4, 5, 5, M, 3, 3, 0, 5, 1, 1, 1, 1, 1, 1, group, 0,
                  None, None)
    assert (sentinel == 7.0).all()


def call_conv_transpose(lib, x, w, b, y, strides, begin_pads, dilations, group):
    xs, ws, ys = x.shape, w.shape, y.shape
    N, C, H, W = xs[0], xs[1], *as_2d(xs[2:], 1)
    KH, KW = as_2d(ws[2:], 1)
    M = ws[1] * group
    OH, OW = as_2d(ys[2:], 1)
    sh, sw = as_2d(strides, 1)
    ph, pw = as_2d(begin_pads, 0)
    dh, dw = as_2d(dilations, 1)
    size = lib.ss_conv_transpose2d_work_size(C, M, KH, KW, H, W, group)
    work = np.full(max(size, 1), np.nan, np.float32)
    lib.ss_conv_transpose2d(ptr(x), ptr(w), ptr(b), ptr(y), N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw,
                            group, ptr(work))


TRANSPOSE_CASES = [
    # x shape, M, kernel, strides, pads, output_padding, dilations, group
    ((1, 3, 5, 7), 4, (3, 3), (1, 1), (0, 0, 0, 0), (0, 0), (1, 1), 1),
    ((2, 3, 5, 7), 4, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 6, 5), 3, (3, 2), (2, 3), (0, 1, 1, 2), (1, 0), (1, 2), 1),  # asymmetric, dilated
    ((2, 4, 5, 6), 6, (3, 3), (2, 1), (1, 0, 1, 0), (0, 0), (2, 1), 2),  # 2 groups
    ((1, 6, 4, 5), 6, (4, 4), (2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 6),  # depthwise-like groups
    ((1, 5, 7, 9), 3, (1, 1), (1, 1), (0, 0, 0, 0), (0, 0), (1, 1), 1),  # 1x1
    ((1, 8, 13, 11), 16, (4, 4), (2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1),  # OpenMP col2im
    ((2, 3, 9), 5, (4,), (3,), (1, 2), (2,), (1,), 1),  # 1-D
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=lambda c: f"{c[0]}-M{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-op{c[5]}-d{c[6]}-g{c[7]}")
def test_conv_transpose2d(lib, case, bias):
    xshape, M, kernel, strides, pads, out_pad, dilations, group = case
    rng = np.random.default_rng(hash((case, bias)) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal((xshape[1], M // group, *kernel), dtype=np.float32)
    inputs = [x, w] + ([rng.standard_normal(M, dtype=np.float32)] if bias else [])
    expected = run_ort("ConvTranspose", inputs, kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       output_padding=list(out_pad), dilations=list(dilations), group=group)
    y = np.full(expected.shape, np.nan, np.float32)
    call_conv_transpose(lib, x, w, inputs[2] if bias else None, y, strides, pads[:len(kernel)], dilations, group)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def check_with_bias(lib, case, act, packed=False):
    """One case with a bias and act through ``lib``'s ss_conv2d against onnxruntime
    (``packed``: with the weights prepacked, as the lowering passes constant ones)."""
    xshape, M, kernel, strides, pads, dilations, group = case
    rng = np.random.default_rng(hash((case, act)) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal((M, xshape[1] // group, *kernel), dtype=np.float32)
    b = rng.standard_normal(M, dtype=np.float32)
    expected = apply_act(run_ort("Conv", [x, w, b], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                                 dilations=list(dilations), group=group), act)
    y = np.full(expected.shape, np.nan, np.float32)
    call_conv(lib, x, w, b, y, strides, pads[:len(kernel)], dilations, group, act,
              packed_weights(lib, w) if packed else None)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)


def typed_conv(cdll):
    """``cdll`` with ss_conv2d and its work size typed (a variant build of the fragment)."""
    cdll.ss_conv2d_work_size.restype = I64
    cdll.ss_conv2d_work_size.argtypes = [I64] * 6
    cdll.ss_conv2d.restype = None
    cdll.ss_conv2d.argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P]
    cdll.ss_gemm_packed_b_size.restype = I64
    cdll.ss_gemm_packed_b_size.argtypes = [I64, I64]
    cdll.ss_gemm_pack_b.restype = None
    cdll.ss_gemm_pack_b.argtypes = [I64, I64, F32P, I64, I64, F32P]
    return cdll


@pytest.fixture(scope="module")
def small_chunk_lib(tmp_path_factory):
    """The fragment with the im2col path for every k x k conv (not the implicit GEMM nor the direct kernel) and a
    tiny column chunk: many packed chunks per GEMM (in parallel where OpenMP has threads), a
    last chunk narrower than the rest, then the partial panel."""
    return typed_conv(build_with_gemm(CONV_DEPS + conv.source(chunk_floats=600, direct=False, igemm=False),
                                      tmp_path_factory.mktemp("conv_chunk"), "test_conv_chunk").cdll)


CHUNK_CASES = [
    ((1, 16, 31, 29), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 6, 19, 23), 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2),  # stride 2, groups, batch
    ((1, 5, 7, 9), 3, (1, 1), (1, 1), (1, 0, 0, 2), (1, 1), 1),  # padded 1x1
    ((1, 8, 40, 3), 6, (3, 2), (1, 1), (2, 0, 1, 1), (2, 3), 1),  # OW < NR: runs cross output rows
    ((1, 7, 1, 300), 9, (1, 5), (1, 2), (0, 2, 0, 2), (1, 1), 1),  # 1-D, Kc * NR > chunk
]


@pytest.mark.parametrize("act", [0, 3])
@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: f"{c[0]}-M{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}")
def test_conv2d_chunked_im2col(small_chunk_lib, case, act):
    check_with_bias(small_chunk_lib, case, act)


@pytest.fixture(scope="module")
def sliced_direct_lib(tmp_path_factory):
    """The direct kernel (dense convs too: no implicit GEMM) taking 18 taps at a time (partial
    sums carried between slices) and 540 floats of packed weights at a time: 1 to 4 blocks
    of 6 channels, so the tiles pass over the input several times."""
    return typed_conv(build_with_gemm(CONV_DEPS + conv.source(direct_taps=18, direct_block=540, igemm=False),
                                      tmp_path_factory.mktemp("conv_direct"), "test_conv_direct").cdll)


SLICED_CASES = [
    ((1, 5, 13, 21), 17, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 45 taps: 3 slices; 3 blocks, 2 at a time
    ((2, 7, 19, 23), 14, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # stride 2, batch 2
    ((1, 4, 6, 40), 10, (2, 5), (1, 1), (0, 2, 1, 2), (1, 1), 2),  # groups, KH != KW
]


@pytest.mark.parametrize("act", [0, 3])
@pytest.mark.parametrize("case", SLICED_CASES, ids=lambda c: f"{c[0]}-M{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}")
def test_conv2d_direct_in_slices(sliced_direct_lib, case, act):
    check_with_bias(sliced_direct_lib, case, act)


@pytest.fixture(scope="module")
def direct_lib(tmp_path_factory):
    """The fragment without the implicit GEMM: dense k x k convs take the direct kernel, as
    grouped ones do (and as SS_CONV_USE_IGEMM 0 builds run them)."""
    return typed_conv(build_with_gemm(CONV_DEPS + conv.source(igemm=False),
                                      tmp_path_factory.mktemp("conv_no_igemm"), "test_conv_no_igemm").cdll)


DENSE_KXK = [c for c in CONV_CASES if c[6] == 1 and np.prod(c[2]) > 1]


@pytest.mark.parametrize("act", [0, 3])
@pytest.mark.parametrize("case", DENSE_KXK, ids=_case_id)
def test_conv2d_dense_without_the_implicit_gemm(direct_lib, case, act):
    check_with_bias(direct_lib, case, act)


@pytest.fixture(scope="module")
def ymm_lib(build_cache):
    """The fragment built without AVX-512 (on a machine that has it; elsewhere the default
    build is this one already): the implicit GEMM's ymm 6 x 16 tile instead of its zmm tiles."""
    from shapeshift.codegen.build import DEFAULT_FLAGS

    return typed_conv(build_with_gemm(CONV_DEPS + conv.source(), build_cache, "test_conv_ymm",
                                      flags=(*DEFAULT_FLAGS, "-mno-avx512f")).cdll)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("act", [0, 3])
@pytest.mark.parametrize("case", DENSE_KXK, ids=_case_id)
def test_conv2d_implicit_gemm_without_avx512(ymm_lib, case, act, packed):
    check_with_bias(ymm_lib, case, act, packed)


# -- a fused residual: ss_conv2d_residual ----------------------------------------------------------


def typed_residual(cdll):
    """``cdll``'s ss_conv2d_residual typed (ss_conv2d's arguments, then res and res_act)."""
    cdll.ss_conv2d_residual.restype = None
    cdll.ss_conv2d_residual.argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P, F32P, ctypes.c_int]
    return cdll


# Every path of ss_conv2d at ragged channel counts (not multiples of 8 or 16) and odd planes,
# batch 2 (the residual of each image at its own place):
RESIDUAL_CASES = [
    ((2, 37, 9, 11), 45, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 1x1: the GEMM on NCHW, addend in its epilogue
    ((2, 20, 7, 9), 6, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # M <= the GEMM's small_m: its B-streaming path
    ((2, 6, 5, 3), 4, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),  # 1x1 grouped: each group's addend
    ((2, 19, 15, 17), 23, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # 1x1 strided: the im2col GEMM (72 pixels)
    ((2, 13, 7, 9), 21, (1, 1), (1, 1), (1, 0, 0, 2), (1, 1), 1),  # 1x1 padded (80 pixels)
    ((2, 5, 1, 7), 3, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # a plane narrower than a GEMM panel
    ((2, 40, 7, 7), 70, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # small plane (49 pixels): 8x8 blocks and edges
    ((2, 33, 13, 13), 50, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),  # small plane, strided (ResNet's downsample)
    ((2, 17, 15, 13), 200, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 195 pixels, more channels: small plane
    ((2, 13, 11, 10), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 3x3: implicit GEMM (conv_panels packed)
    ((2, 21, 13, 17), 20, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1),  # 3x3 stride 2, asymmetric pads
    ((2, 8, 21, 23), 19, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 483 pixels: implicit GEMM when packed too
    ((2, 24, 3, 3), 19, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # 9 pixels: small plane when packed
    ((2, 7, 10, 11), 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 7),  # depthwise: a pass after the conv
    ((2, 6, 9, 10), 4, (3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 2),  # grouped: the direct kernel, then a pass
]
RESIDUAL_RUNS = [pytest.param(case, packed, id=f"{_case_id(case)}-{'packed' if packed else 'plain'}")
                 for case in RESIDUAL_CASES for packed in (False, True) if not packed or case[6] == 1]
# (act, res_act): y = res_act(act(conv + bias) + res). ResNet's Conv -> Add -> Relu is (0, 1),
# YOLO's Conv -> SiLU -> Add (3, 0); (1, 2) has an activation on both sides.
ACT_PAIRS = [(0, 0), (0, 1), (3, 0), (1, 2)]


def check_residual(lib, case, act, res_act, packed):
    """ss_conv2d_residual against onnxruntime's Conv, the activations and the Add after it."""
    xshape, M, kernel, strides, pads, dilations, group = case
    rng = np.random.default_rng(hash((case, act, res_act, "res")) % 2**32)
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal((M, xshape[1] // group, *kernel), dtype=np.float32)
    b = rng.standard_normal(M, dtype=np.float32)
    conv_out = run_ort("Conv", [x, w, b], kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                       dilations=list(dilations), group=group)
    res = rng.standard_normal(conv_out.shape, dtype=np.float32)
    expected = apply_act(apply_act(conv_out, act) + res, res_act)
    y = np.full(expected.shape, np.nan, np.float32)
    xs, ys = x.shape, y.shape
    N, C, H, W = xs[0], xs[1], *as_2d(xs[2:], 1)
    KH, KW = as_2d(kernel, 1)
    OH, OW = as_2d(ys[2:], 1)
    size = lib.ss_conv2d_work_size(C, KH, KW, OH, OW, group)
    work = np.full(max(size, 1), np.nan, np.float32)
    kept = res.copy()
    lib.ss_conv2d_residual(ptr(x), ptr(w), ptr(b), ptr(y), N, C, H, W, M, KH, KW, OH, OW, *as_2d(strides, 1),
                           *as_2d(pads[:len(kernel)], 0), *as_2d(dilations, 1), group, act, ptr(work),
                           ptr(packed_weights(lib, w) if packed else None), ptr(res), res_act)
    np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(res, kept)  # read, never written


@pytest.mark.parametrize("act,res_act", ACT_PAIRS, ids=lambda p: str(p))
@pytest.mark.parametrize("case,packed", RESIDUAL_RUNS)
def test_conv2d_residual(lib, case, packed, act, res_act):
    check_residual(typed_residual(lib), case, act, res_act, packed)


@pytest.mark.parametrize("act,res_act", [(0, 1), (3, 0)])
@pytest.mark.parametrize("case,packed", RESIDUAL_RUNS)
def test_conv2d_residual_without_avx512(ymm_lib, case, packed, act, res_act):
    check_residual(typed_residual(ymm_lib), case, act, res_act, packed)


@pytest.mark.parametrize("act,res_act", [(0, 1), (3, 0)])
@pytest.mark.parametrize("case", CHUNK_CASES + RESIDUAL_CASES[:5],
                         ids=lambda c: f"{c[0]}-M{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}")
def test_conv2d_residual_chunked_im2col(small_chunk_lib, case, act, res_act):
    # Every k x k conv through the im2col GEMM too, in chunks: the addend at each chunk's
    # columns, and at the partial last panel that overlaps the chunk before it.
    check_residual(typed_residual(small_chunk_lib), case, act, res_act, False)


@pytest.mark.parametrize("act,res_act", [(0, 1), (3, 0)])
@pytest.mark.parametrize("case", DENSE_KXK[::3], ids=_case_id)
def test_conv2d_residual_dense_without_the_implicit_gemm(direct_lib, case, act, res_act):
    check_residual(typed_residual(direct_lib), case, act, res_act, False)


def test_conv2d_is_the_residual_form_without_one(lib):
    # ss_conv2d is ss_conv2d_residual with no residual: the same bits.
    case = RESIDUAL_CASES[0]
    xshape, M = case[0], case[1]
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xshape, dtype=np.float32)
    w = rng.standard_normal((M, xshape[1], 1, 1), dtype=np.float32)
    b = rng.standard_normal(M, dtype=np.float32)
    y1, y2 = (np.full((xshape[0], M, *xshape[2:]), np.nan, np.float32) for _ in range(2))
    args = (xshape[0], xshape[1], *xshape[2:], M, 1, 1, *xshape[2:], 1, 1, 0, 0, 1, 1, 1, 3, None, None)
    lib.ss_conv2d(ptr(x), ptr(w), ptr(b), ptr(y1), *args)
    typed_residual(lib).ss_conv2d_residual(ptr(x), ptr(w), ptr(b), ptr(y2), *args, None, 1)
    np.testing.assert_array_equal(y1, y2)
