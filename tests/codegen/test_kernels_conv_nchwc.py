"""The NCHWc kernels (kernels/nchwc.py, conv_nchwc.py) against onnxruntime.

Each case runs a one-node Conv (or a Conv followed by its epilogue ops) in onnxruntime,
blocks the input and packs the weights as the lowering does, runs the kernel and unblocks
its output. Ragged channel counts (3, 5, 17, 24, 33, 100 against blocks of 8 and 16), odd
planes (7, 13, 31), pads, strides, dilations, groups, every epilogue; both widths, in the
native build and in one without AVX-512 (where the 16-lane vectors are two ymm halves).
The lanes past C in each output's last block must come back zero.

Each width's conv kernels are a library of their own: the 16-lane ones, where the build
emulates them (no AVX-512: GCC vector extensions over pairs of ymm), at a lower -O level
(``EMULATED_OPT``), since gcc -O3 took 150-175 s over them on an AMD Zen 3 (-O2 102 s,
-O1 31 s, -Og 5 s), the one slowest step of the test suite, for code no machine without
AVX-512 runs in a program (its layout pass blocks by 8 there). The same C at -O1 still checks
what the 16-lane kernels compute.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.codegen.kernels import conv_nchwc, nchwc
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.target import named_target

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

I64, F32P, INT, F32 = ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_float
#: Both widths on any machine, each width's conv kernels in a library of its own.
SOURCES = {lanes: PRELUDE + nchwc.source() + conv_nchwc.source(widths=(lanes,)) for lanes in nchwc.WIDTHS}
#: The -O level of emulated 16-lane kernels: the same C, compiled in seconds.
EMULATED_OPT = "-O1"


def _typed(cdll, widths):
    for lanes in widths:
        for name in ("ss_nchwc_block", "ss_nchwc_unblock"):
            fn = getattr(cdll, f"{name}_{lanes}")
            fn.restype, fn.argtypes = None, [F32P, F32P, I64, I64, I64]
        fn = getattr(cdll, f"ss_pool_nchwc_{lanes}")
        fn.restype, fn.argtypes = None, [F32P, F32P] + [I64] * 13 + [INT]
        fn = getattr(cdll, f"ss_gap_nchwc_{lanes}")
        fn.restype, fn.argtypes = None, [F32P, F32P, I64, I64]
        epi = [F32P, INT, F32, F32, INT, F32, F32]
        fn = getattr(cdll, f"ss_conv_nchwc_{lanes}")
        fn.restype, fn.argtypes = None, [F32P] * 4 + [I64] * 17 + epi
        fn = getattr(cdll, f"ss_dwconv_nchwc_{lanes}")
        fn.restype, fn.argtypes = None, [F32P] * 4 + [I64] * 14 + epi
    return cdll


class _ByWidth:
    """The kernels of both widths, each looked up in its width's library (names end in _8 or _16)."""

    def __init__(self, libraries: dict):
        self.libraries = libraries

    def __getattr__(self, name: str):
        return getattr(self.libraries[int(name.rsplit("_", 1)[1])], name)


def _build(name: str, flags: tuple, cache_dir) -> _ByWidth:
    emulated = "-mno-avx512f" in flags or not named_target("native").avx512
    libraries = {}
    for lanes, source in SOURCES.items():
        own = (*flags, EMULATED_OPT) if lanes == 16 and emulated else flags  # gcc takes the last -O
        libraries[lanes] = _typed(compile_library(source, f"{name}_{lanes}", flags=own, cache_dir=cache_dir).cdll,
                                  (lanes,))
    return _ByWidth(libraries)


@pytest.fixture(scope="module")
def lib(build_cache):
    return _build("test_nchwc", DEFAULT_FLAGS, build_cache)


@pytest.fixture(scope="module")
def ymm_lib(build_cache):
    """Built without AVX-512: the 8-lane kernels as an AVX2 machine runs them."""
    return _build("test_nchwc_ymm", (*DEFAULT_FLAGS, "-mno-avx512f"), build_cache)


def ptr(a):
    return None if a is None else a.ctypes.data_as(F32P)


def run_ort(nodes, inputs, opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def block(x, lanes):
    n, c = x.shape[:2]
    cb = -(-c // lanes)
    out = np.zeros((n, cb * lanes, *x.shape[2:]), np.float32)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, cb, lanes, *x.shape[2:]).transpose(0, 1, 3, 4, 2))


def unblock(y, c):
    n, cb, h, w, lanes = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * lanes, h, w)[:, :c]


def padding_lanes(y, c):
    """The lanes past channel c of a blocked tensor."""
    n, cb, h, w, lanes = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * lanes, h, w)[:, c:]


# Epilogues: (ONNX nodes after the conv "t" -> "y", kernel act code, a0, a1, with residual, act2)
EPILOGUES = {
    "none": ([helper.make_node("Identity", ["t"], ["y"])], 0, 0.0, 0.0, False, 0),
    "relu": ([helper.make_node("Relu", ["t"], ["y"])], 1, 0.0, 0.0, False, 0),
    "clip": ([helper.make_node("Clip", ["t", "lo", "hi"], ["y"])], 2, -0.5, 0.75, False, 0),
    "hardswish": ([helper.make_node("HardSwish", ["t"], ["y"])], 3, 0.0, 0.0, False, 0),
    "hardsigmoid": ([helper.make_node("HardSigmoid", ["t"], ["y"], alpha=0.3, beta=0.4)], 4, 0.3, 0.4, False, 0),
    "sigmoid": ([helper.make_node("Sigmoid", ["t"], ["y"])], 5, 0.0, 0.0, False, 0),
    "silu": ([helper.make_node("Sigmoid", ["t"], ["s"]), helper.make_node("Mul", ["t", "s"], ["y"])],
             6, 0.0, 0.0, False, 0),
    "leaky": ([helper.make_node("LeakyRelu", ["t"], ["y"], alpha=0.1)], 7, 0.1, 0.0, False, 0),
    "add": ([helper.make_node("Add", ["t", "r"], ["y"])], 0, 0.0, 0.0, True, 0),
    "add_relu": ([helper.make_node("Add", ["t", "r"], ["u"]), helper.make_node("Relu", ["u"], ["y"])],
                 0, 0.0, 0.0, True, 1),
    "silu_add": ([helper.make_node("Sigmoid", ["t"], ["s"]), helper.make_node("Mul", ["t", "s"], ["u"]),
                  helper.make_node("Add", ["u", "r"], ["y"])], 6, 0.0, 0.0, True, 0),
}


def reference(x, w, b, kernel_attrs, epilogue, r):
    nodes, *_ = EPILOGUES[epilogue]
    inputs = {"x": x, "w": w, "b": b}
    conv = helper.make_node("Conv", ["x", "w", "b"], ["t"], **kernel_attrs)
    if epilogue == "clip":
        inputs.update(lo=np.array(-0.5, np.float32), hi=np.array(0.75, np.float32))
    if r is not None:
        inputs["r"] = r
    return run_ort([conv, *nodes], inputs)


def run_case(lib, lanes, xshape, m, kernel, strides, pads, dilations, group, epilogue, plain_input=False, seed=0):
    rng = np.random.default_rng(seed)
    n, c, h, wd = xshape
    x = rng.standard_normal(xshape).astype(np.float32)
    w = (rng.standard_normal((m, c // group, *kernel)) / np.sqrt(c // group * kernel[0] * kernel[1])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=list(pads), dilations=list(dilations),
                 group=group)
    oh = (h + pads[0] + pads[2] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    _, act, a0, a1, with_res, act2 = EPILOGUES[epilogue]
    r = rng.standard_normal((n, m, oh, ow)).astype(np.float32) if with_res else None
    expect = reference(x, w, b, attrs, epilogue, r)
    mb = -(-m // lanes)
    y = np.full((n, mb, oh, ow, lanes), np.nan, np.float32)
    rb = block(r, lanes) if r is not None else None
    bias = conv_nchwc.pad_channels(b, lanes)
    depthwise = group == c == m and not plain_input
    if depthwise:
        wp = conv_nchwc.pack_depthwise(w, lanes)
        getattr(lib, f"ss_dwconv_nchwc_{lanes}")(
            ptr(block(x, lanes)), ptr(wp), ptr(bias), ptr(y), n, c, h, wd, kernel[0], kernel[1], oh, ow,
            strides[0], strides[1], pads[0], pads[1], dilations[0], dilations[1], ptr(rb), act, a0, a1, act2, 0.0, 0.0)
    else:
        xblk = 1 if plain_input else lanes
        xin = np.ascontiguousarray(x) if plain_input else block(x, lanes)
        wp = conv_nchwc.pack_dense(w, group, lanes, xblk)
        getattr(lib, f"ss_conv_nchwc_{lanes}")(
            ptr(xin), ptr(wp), ptr(bias), ptr(y), n, c, h, wd, m, kernel[0], kernel[1], oh, ow, strides[0],
            strides[1], pads[0], pads[1], dilations[0], dilations[1], group, xblk, ptr(rb), act, a0, a1, act2,
            0.0, 0.0)
    np.testing.assert_allclose(unblock(y, m), expect, rtol=2e-4, atol=2e-4)
    assert not np.any(padding_lanes(y, m)), "lanes past M must stay zero"


# x shape, M, kernel, strides, pads (begin..., end...), dilations, group
DENSE = [
    ((1, 3, 7, 7), 5, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 17, 13, 13), 24, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 33, 7, 31), 17, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((1, 24, 13, 7), 100, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 5, 13, 13), 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 17, 31, 13), 24, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    ((1, 24, 13, 13), 17, (3, 3), (2, 1), (0, 1, 2, 1), (1, 1), 1),
    ((1, 33, 13, 31), 5, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),
    ((1, 17, 7, 13), 24, (5, 5), (1, 2), (2, 2, 2, 2), (1, 1), 1),
    ((1, 100, 7, 7), 33, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 1),
    ((1, 3, 31, 13), 24, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    ((1, 5, 2, 3), 17, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # plane smaller than a tile, all edges
    # The pointwise kernel with input channels in several chunks in 16-lane blocks on any L1 up to
    # 64 KB (10 blocks; test_nchwc_pointwise.py covers 8-lane blocks through sessions).
    ((1, 150, 9, 11), 37, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 150, 9, 11), 37, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
]
GROUPED = [  # C/group and M/group multiples of both widths
    ((1, 32, 13, 7), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    ((2, 64, 7, 13), 48 * 2, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),
    ((1, 64, 13, 13), 64, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 4),
]
DEPTHWISE = [
    ((1, c, h, wd), c, (k, k), (s, s), (k // 2,) * 4, (1, 1), c)
    for c, h, wd, k, s in [(3, 7, 7, 3, 1), (5, 13, 13, 3, 2), (17, 31, 13, 5, 1), (24, 13, 31, 5, 2),
                           (33, 7, 13, 7, 1), (100, 13, 13, 7, 2), (24, 31, 31, 3, 1), (17, 7, 7, 5, 2),
                           # wide planes: tiles read x itself (no staged copy), the borders checked
                           (16, 40, 40, 3, 2), (9, 20, 67, 3, 1)]
] + [((2, 33, 13, 7), 33, (3, 3), (1, 2), (0, 1, 2, 1), (2, 1), 33),
     ((1, 100, 5, 9), 100, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 100),
     # dilated along a row: the generic tile, rows staged (narrow plane) or read in place (wide)
     ((1, 24, 13, 17), 24, (3, 3), (1, 1), (2, 2, 2, 2), (1, 2), 24),
     ((1, 17, 9, 45), 17, (3, 3), (2, 2), (1, 2, 1, 2), (2, 2), 17)]


def _id(case):
    xs, m, k, s, p, d, g = case
    return f"x{'x'.join(map(str, xs))}_m{m}_k{k[0]}{k[1]}_s{s[0]}{s[1]}_p{''.join(map(str, p))}_d{d[0]}{d[1]}_g{g}"


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("case", DENSE + GROUPED + DEPTHWISE, ids=_id)
def test_conv_nchwc(lib, lanes, case):
    run_case(lib, lanes, *case, epilogue="relu")


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("case", [DENSE[4], DENSE[1], DEPTHWISE[3], GROUPED[0]], ids=_id)
def test_conv_nchwc_epilogues(lib, lanes, case, epilogue):
    run_case(lib, lanes, *case, epilogue=epilogue, seed=1)


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("case", [c for c in DENSE if c[6] == 1], ids=_id)
def test_conv_nchwc_plain_input(lib, lanes, case):
    """A first conv reads the image plain (xblk 1) and writes blocks."""
    run_case(lib, lanes, *case, epilogue="hardswish", plain_input=True, seed=2)


@pytest.mark.parametrize("case", DENSE[:6] + GROUPED[:1] + DEPTHWISE[:4], ids=_id)
@pytest.mark.parametrize("epilogue", ["silu_add", "hardsigmoid"])
def test_conv_nchwc_without_avx512(ymm_lib, case, epilogue):
    run_case(ymm_lib, 8, *case, epilogue=epilogue, seed=3)
    run_case(ymm_lib, 16, *case, epilogue=epilogue, seed=3)


# Row tilings: kernel, stride, pads, depthwise. The dense conv tiles a row's pixels whose
# taps fall inside it by RX (12 in zmm, 6 in ymm), the rest of them by one RX tile
# overlapping the last, else by 4 (the same overlap) and 1; the border pixels are checked
# tiles of 4 and 1. The depthwise conv's 3-, 5- and 7-wide taps at stride 1 and 2 take tiles
# of 8 and the rest in one of 7, 6, 4, 2, 1 (overlapping where wider), those at a row's ends
# skipping the input columns in the pads (on the left, the right or both, by one to three
# columns: symmetric and uneven pads); its other taps (dilated along a row) tile by 8, the
# same overlap, 2 and 1 (or, staged, by 8, 2 and 1) with checked border tiles of 4 and 1, as
# do the 3- and 5-wide ones whose pads reach a tap's width (the fixed tiles' border code
# assumes fewer padded columns; pads of KW - 1 are the widest the fixed tiles take).
# Rows of every width 1..31 hit each of those cases at every width of tile.
ROW_TILINGS = [((3, 3), (1, 1), (1, 1, 1, 1), False), ((3, 3), (2, 2), (1, 1, 1, 1), False),
               ((1, 1), (1, 1), (0, 0, 0, 0), False), ((1, 5), (1, 1), (0, 2, 0, 1), False),
               ((3, 3), (1, 1), (1, 1, 1, 1), True), ((3, 3), (2, 2), (1, 1, 1, 1), True),
               ((5, 5), (1, 1), (2, 2, 2, 2), True), ((5, 5), (2, 2), (2, 2, 2, 2), True),
               ((3, 3), (1, 1), (0, 0, 0, 0), True), ((3, 3), (2, 2), (0, 0, 1, 1), True),
               ((5, 5), (2, 2), (1, 2, 2, 1), True), ((3, 5), (1, 1), (1, 0, 1, 2), True),
               ((1, 7), (1, 1), (0, 3, 0, 3), True), ((7, 7), (1, 1), (3, 3, 3, 3), True),
               ((7, 7), (1, 1), (3, 1, 3, 2), True), ((7, 7), (2, 2), (3, 3, 3, 3), True),
               ((1, 3), (1, 1), (0, 1, 0, 1), True),  # read in place, not staged, from 12 pixels on
               ((3, 3), (1, 1), (2, 2, 2, 2), True), ((5, 5), (2, 2), (4, 4, 4, 4), True),
               ((3, 3), (1, 1), (3, 1, 3, 4), True), ((5, 5), (2, 2), (2, 5, 2, 7), True)]


def _tiling_id(tiling):
    kernel, strides, pads, depthwise = tiling
    return f"{'dw' if depthwise else 'dense'}_k{kernel[0]}{kernel[1]}_s{strides[0]}_p{''.join(map(str, pads))}"


@pytest.mark.parametrize("build", ["native", "no-avx512"])
@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("tiling", ROW_TILINGS, ids=_tiling_id)
def test_conv_nchwc_every_row_width(request, build, lanes, tiling):
    kernel, strides, pads, depthwise = tiling
    built = request.getfixturevalue("lib" if build == "native" else "ymm_lib")
    m, group = (17, 17) if depthwise else (24, 1)
    for width in range(max(1, kernel[1] - pads[1] - pads[3]), 32):  # every width with an output pixel
        try:
            run_case(built, lanes, (1, 17, kernel[0], width), m, kernel, strides, pads, (1, 1), group, "add_relu",
                     seed=width)
        except AssertionError as failure:
            raise AssertionError(f"row of {width} pixels: {failure}") from None


@pytest.mark.parametrize("build", ["native", "no-avx512"])
@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("tiling", ROW_TILINGS[:4], ids=_tiling_id)
def test_conv_nchwc_wide_rows_split_into_runs(request, build, lanes, tiling):
    """Fewer rows than 4 items a thread (a 1x1 conv's plane comes as one row): each row is cut
    into runs of whole tiles, every run with its own borders, inside and overlapping tail."""
    kernel, strides, pads, _ = tiling
    built = request.getfixturevalue("lib" if build == "native" else "ymm_lib")
    for width in (48, 49, 95, 97, 131, 200, 257, 784):
        try:
            run_case(built, lanes, (1, 17, kernel[0], width), 24, kernel, strides, pads, (1, 1), 1, "add_relu",
                     seed=width)
        except AssertionError as failure:
            raise AssertionError(f"row of {width} pixels: {failure}") from None


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("shape", [(1, 3, 7, 7), (2, 17, 13, 5), (1, 33, 31, 13), (1, 100, 1, 1), (0, 5, 3, 3)])
def test_block_roundtrip(lib, lanes, shape):
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    n, c, h, w = shape
    cb = -(-c // lanes)
    y = np.full((n, cb, h, w, lanes), np.nan, np.float32)
    getattr(lib, f"ss_nchwc_block_{lanes}")(ptr(x), ptr(y), n, c, h * w)
    np.testing.assert_array_equal(y, block(x, lanes))
    back = np.full_like(x, np.nan)
    getattr(lib, f"ss_nchwc_unblock_{lanes}")(ptr(y), ptr(back), n, c, h * w)
    np.testing.assert_array_equal(back, x)


POOLS = [  # op, attrs, x shape
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 17, 13, 13)),
    ("MaxPool", dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]), (2, 24, 7, 31)),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), (1, 33, 13, 7)),
    ("MaxPool", dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]), (1, 5, 13, 13)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 17, 13, 13)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
     (1, 100, 7, 7)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2]), (2, 3, 31, 13)),
]


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("op,attrs,shape", POOLS)
def test_pool_nchwc(lib, lanes, op, attrs, shape):
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    expect = run_ort([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x})
    n, c, h, w = shape
    oh, ow = expect.shape[2:]
    k = attrs["kernel_shape"]
    s = attrs.get("strides", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    d = attrs.get("dilations", [1, 1])
    mode = 0 if op == "MaxPool" else (1 if attrs.get("count_include_pad", 0) else 2)
    cb = -(-c // lanes)
    y = np.full((n, cb, oh, ow, lanes), np.nan, np.float32)
    getattr(lib, f"ss_pool_nchwc_{lanes}")(ptr(block(x, lanes)), ptr(y), n * cb, h, w, oh, ow, k[0], k[1], s[0], s[1],
                                           p[0], p[1], d[0], d[1], mode)
    np.testing.assert_allclose(unblock(y, c), expect, rtol=1e-5, atol=1e-6)
    assert not np.any(padding_lanes(y, c))


@pytest.mark.parametrize("lanes", nchwc.WIDTHS)
@pytest.mark.parametrize("shape", [(1, 17, 13, 13), (2, 100, 7, 7), (1, 3, 1, 31)])
def test_gap_nchwc(lib, lanes, shape):
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    n, c, h, w = shape
    cb = -(-c // lanes)
    y = np.full((n, cb, 1, 1, lanes), np.nan, np.float32)
    getattr(lib, f"ss_gap_nchwc_{lanes}")(ptr(block(x, lanes)), ptr(y), n * cb, h * w)
    np.testing.assert_allclose(unblock(y, c), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    assert not np.any(padding_lanes(y, c))


@pytest.mark.parametrize("march, lanes", [("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_a_programs_fragment_has_its_targets_width_only(march, lanes):
    """A program's conv_nchwc object holds the kernels of the width its layout pass blocks by
    (8 without AVX-512, 16 with): the other width's took gcc most of a minute for nothing."""
    text = conv_nchwc.source(named_target(march))
    assert nchwc.block_width(named_target(march)) == lanes
    other = 16 if lanes == 8 else 8
    for name in ("ss_conv_nchwc", "ss_dwconv_nchwc", "ss_cnc_pointwise"):
        assert f"{name}_{lanes}(" in text
        assert f"{name}_{other}(" not in text
