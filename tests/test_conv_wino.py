"""Winograd F(4x4, 3x3) convs (shapeshift/codegen/kernels/conv_wino.py) against onnxruntime.

The kernel on its own (ss_conv_wino_pack_b, then ss_conv2d_wino) at ragged channel counts
(not multiples of 8 or 16), odd planes that leave partial edge tiles, asymmetric and zero
pads, batch 2, every activation code and a fused residual; in the three vector widths a
build can have (zmm; ymm with -mno-avx512f; 4-lane SSE with -mno-avx2), on 1 and 2
threads, with blocks of many tiles and of a few (the per-thread and the shared-phase
schedules). Then the lowering: which convs take it, dynamic batch and image sizes through
one session, the ``SHAPESHIFT_WINOGRAD=off`` switch, and the tuner leaving its convs alone.
"""

from __future__ import annotations

import ctypes
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.cli.main import main
from shapeshift.codegen.build import DEFAULT_FLAGS
from shapeshift.codegen.kernels import conv, conv_wino

from .codegen.naive_gemm import build_with_gemm
from .codegen.test_kernels_conv import CONV_DEPS, F32P, I64, apply_act, run_ort

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

F = TensorProto.FLOAT
# Winograd's result differs from a direct sum in the last bits: about 1e-6 of the output's
# scale per hundred channels (outputs here are of scale 1).
RTOL, ATOL = 1e-4, 1e-4

# Builds: this machine's; without AVX-512 (8 lanes); without AVX2 (GCC's 4-lane vectors).
BUILDS = {"native": (), "ymm": ("-mno-avx512f",), "sse": ("-mno-avx512f", "-mno-avx2", "-mno-fma")}
# Block sizes (floats of V and Mo a block may take): 16384, so that the 16-channel 30 x 27
# case has 5 blocks of 12 tiles and 2 threads each run whole blocks, while the others,
# whose transformed weights U pass that size, share each block's phases; or the default
# (half of L2), whose blocks are few on these small planes.
BLOCKS = {"small-blocks": 16384, "l2-blocks": None}
# The tile sizes and their entry points: F(4x4, 3x3) and F(2x2, 3x3).
VARIANTS = {"f4": "wino", "f2": "wino2"}


@pytest.fixture(scope="module", params=[(b, k) for b in BUILDS for k in BLOCKS], ids=lambda p: f"{p[0]}-{p[1]}")
def lib(request, build_cache):
    build, blocks = request.param
    source = CONV_DEPS + conv.source() + conv_wino.source(block_floats=BLOCKS[blocks])
    cdll = build_with_gemm(source, build_cache, f"test_wino_{build}",
                           flags=(*DEFAULT_FLAGS, *BUILDS[build])).cdll
    for name in VARIANTS.values():
        getattr(cdll, f"ss_conv_{name}_packed_b_size").restype = I64
        getattr(cdll, f"ss_conv_{name}_packed_b_size").argtypes = [I64, I64]
        getattr(cdll, f"ss_conv_{name}_pack_b").restype = None
        getattr(cdll, f"ss_conv_{name}_pack_b").argtypes = [I64, I64, F32P, I64, I64, F32P]
        getattr(cdll, f"ss_conv2d_{name}").restype = None
        getattr(cdll, f"ss_conv2d_{name}").argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P, F32P,
                                                                                  F32P, ctypes.c_int]
    cdll.ss_set_num_threads.argtypes = [ctypes.c_int]
    return cdll


def _p(a):
    return a.ctypes.data_as(F32P) if a is not None else None


def _pack(lib, w, name):
    """w [M, C, 3, 3] transformed and packed as the lowering does (its [C*9, M] transpose)."""
    m = w.shape[0]
    b = np.ascontiguousarray(w.reshape(m, -1).T)
    packed = np.empty(max(int(getattr(lib, f"ss_conv_{name}_packed_b_size")(b.shape[0], m)), 1), dtype=np.float32)
    getattr(lib, f"ss_conv_{name}_pack_b")(b.shape[0], m, _p(b), m, 1, _p(packed))
    return packed


def _run(lib, x, w, bias, pads, strides=(1, 1), act=0, res=None, res_act=0, packed=True, scratch=True, variant="f4"):
    n, c, h, wd = x.shape
    m = w.shape[0]
    kh, kw = w.shape[2:]
    oh = (h + pads[0] + pads[2] - kh) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - kw) // strides[1] + 1
    y = np.full((n, m, oh, ow), np.nan, dtype=np.float32)
    # N x ss_conv2d_work_size floats, as the lowering gives (None: the kernel allocates its own).
    work = np.empty(max(int(n * c * kh * kw * oh * ow), 1), dtype=np.float32) if scratch else None
    name = VARIANTS[variant]
    getattr(lib, f"ss_conv2d_{name}")(_p(x), _p(w), _p(bias), _p(y), n, c, h, wd, m, kh, kw, oh, ow, strides[0],
                                      strides[1], pads[0], pads[1], 1, 1, 1, act, _p(work),
                                      _p(_pack(lib, w, name) if packed else None), None, _p(res), res_act)
    return y


def _reference(x, w, bias, pads, strides=(1, 1), act=0, res=None, res_act=0):
    inputs = [x, w] + ([bias] if bias is not None else [])
    y = apply_act(run_ort("Conv", inputs, pads=list(pads), strides=list(strides)), act)
    return y if res is None else apply_act(y + res, res_act)


def _data(seed, n, c, h, w, m):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weights = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    return x, weights, rng.standard_normal(m).astype(np.float32)


# (batch, C, H, W, M, pads (top, left, bottom, right)): ragged channels, planes whose last
# tile row and column are partial (OH, OW not multiples of 4), one tile, asymmetric pads.
CASES = [
    (1, 16, 8, 8, 16, (1, 1, 1, 1)),
    (2, 19, 9, 11, 37, (1, 1, 1, 1)),
    (1, 33, 13, 6, 20, (0, 0, 0, 0)),
    (2, 7, 17, 23, 9, (1, 0, 2, 1)),
    (1, 130, 14, 14, 70, (1, 1, 1, 1)),
    (1, 24, 3, 5, 17, (2, 1, 0, 2)),
    (2, 64, 30, 29, 64, (1, 1, 1, 1)),
    (1, 16, 30, 27, 16, (1, 1, 1, 1)),
]


def _id(case):
    n, c, h, w, m, pads = case
    return f"n{n}c{c}_{h}x{w}m{m}p{''.join(map(str, pads))}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", [0, 1, 2, 3])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matches_onnxruntime(lib, case, act, threads, variant):
    n, c, h, w, m, pads = case
    x, weights, bias = _data(sum(case[:5]), n, c, h, w, m)
    lib.ss_set_num_threads(threads)
    try:
        got = _run(lib, x, weights, bias if act != 2 else None, pads, act=act, variant=variant)
    finally:
        lib.ss_set_num_threads(os.cpu_count() or 1)
    np.testing.assert_allclose(got, _reference(x, weights, bias if act != 2 else None, pads, act=act),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("acts", [(0, 1), (3, 0), (1, 3)], ids=["add-relu", "silu-add", "relu-add-silu"])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[6]], ids=_id)
def test_residual_is_added_in_the_store(lib, case, acts, variant):
    """y = res_act(act(conv + bias) + res), each image's residual at its own place."""
    n, c, h, w, m, pads = case
    x, weights, bias = _data(7, n, c, h, w, m)
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    res = np.random.default_rng(8).standard_normal((n, m, oh, ow)).astype(np.float32)
    got = _run(lib, x, weights, bias, pads, act=acts[0], res=res, res_act=acts[1], variant=variant)
    np.testing.assert_allclose(got, _reference(x, weights, bias, pads, act=acts[0], res=res, res_act=acts[1]),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_what_it_cannot_run_falls_back_to_the_direct_kernels(lib, variant):
    """A strided conv, or no packed weights, through ss_conv2d_wino: ss_conv2d_residual's result."""
    x, weights, bias = _data(3, 2, 12, 11, 13, 18)
    got = _run(lib, x, weights, bias, (1, 1, 1, 1), strides=(2, 2), act=1, packed=False, variant=variant)
    np.testing.assert_allclose(got, _reference(x, weights, bias, (1, 1, 1, 1), strides=(2, 2), act=1),
                               rtol=RTOL, atol=ATOL)
    got = _run(lib, x, weights, bias, (1, 1, 1, 1), act=3, packed=False, variant=variant)
    np.testing.assert_allclose(got, _reference(x, weights, bias, (1, 1, 1, 1), act=3), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[7]], ids=_id)
def test_without_the_callers_scratch(lib, case, variant):
    """work NULL: the kernel allocates its staged image and blocks itself, same result."""
    n, c, h, w, m, pads = case
    x, weights, bias = _data(9, n, c, h, w, m)
    got = _run(lib, x, weights, bias, pads, act=1, scratch=False, variant=variant)
    np.testing.assert_allclose(got, _reference(x, weights, bias, pads, act=1), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_wide_channels_stay_accurate(lib, variant):
    """512 channels in: the error grows with C; still well inside the tolerance."""
    x, weights, bias = _data(5, 1, 512, 10, 10, 32)
    got = _run(lib, x, weights, bias, (1, 1, 1, 1), variant=variant)
    want = _reference(x, weights, bias, (1, 1, 1, 1))
    assert np.abs(got - want).max() < 2e-5 * max(1.0, float(np.abs(want).max())) * 10
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


# -- the lowering ---------------------------------------------------------------------------------


def _model(c, m, pads=(1, 1, 1, 1), strides=(1, 1), dims=("N", None, "H", "W"), residual=True):
    """Conv(3x3) -> Relu -> Conv(3x3) -> Add(first Relu) -> Relu, symbolic batch and plane."""
    rng = np.random.default_rng(c * 100 + m)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32), name)
             for name, s in (("w0", (m, c, 3, 3)), ("w1", (m, m, 3, 3)), ("b0", (m,)))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=list(pads), strides=list(strides)),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1])]
    nodes += [helper.make_node("Add", ["c1", "r0"], ["a1"]), helper.make_node("Relu", ["a1"], ["y"])] if residual \
        else [helper.make_node("Relu", ["c1"], ["y"])]
    shape = [d if d is not None else c for d in dims]
    graph = helper.make_graph(nodes, "wino", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(autouse=False)
def nchw(monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_NCHWC", "0")
    return monkeypatch


def _check(model, shapes, session=None):
    session = session or shapeshift.InferenceSession(model, backend="native")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for shape in shapes:
        feed = {"x": rng.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feed)[0], reference.run(None, feed)[0], rtol=RTOL, atol=ATOL)
    return session


def _wino_calls(session, name="wino"):
    return sum(f"ss_conv2d_{name}(" in s.lowered.code for s in session._executor.program.steps if s.lowered)


def test_one_session_runs_every_batch_and_image_size(nchw):
    """Both convs (the second with its residual fused) take Winograd; batch 1 and 3, planes
    from one partial tile to many, square and not."""
    model = _model(20, 24)
    session = _check(model, [(1, 20, 5, 7), (3, 20, 16, 16), (1, 20, 33, 18), (2, 20, 64, 41)])
    assert _wino_calls(session) == 2
    steps = [s.node.op_type for s in session._executor.program.steps]
    assert steps.count("Conv") == 2 and "Add" not in steps


def test_a_plane_left_open_keeps_the_direct_weights_too(nchw):
    """A symbolic plane: the call gets the direct kernels' packed weights beside the
    transformed ones, and planes under MIN_PLANE pixels (2x3, 5x7) run on them; a known
    plane gets none (NULL)."""
    def direct_args(session):  # what each Winograd call passes after its transformed weights
        calls = [s.lowered.code for s in session._executor.program.steps
                 if s.lowered and "ss_conv2d_wino(" in s.lowered.code]
        return [c[c.index("(") + 1:c.rindex(")")].split(", ")[-3] for c in calls]  # ..., direct, res, res_act

    open_plane = direct_args(_check(_model(24, 32), [(1, 24, 2, 3), (2, 24, 5, 7), (1, 24, 9, 9)]))
    assert len(open_plane) == 2 and all(a.startswith("(const float*)v[") for a in open_plane), open_plane
    assert direct_args(_check(_model(24, 32, dims=(1, None, 8, 8)), [(1, 24, 8, 8)])) == ["NULL", "NULL"]


def test_which_convs_take_it(nchw):
    """Not: strided convs, fewer than 16 channels in or out, known planes under 6 x 6 pixels;
    F(2x2) on a 7 x 7 plane with 384 channels in and out; none with SHAPESHIFT_WINOGRAD=off."""
    assert _wino_calls(_check(_model(16, 16, strides=(2, 2), dims=(1, None, 20, 20)), [(1, 16, 20, 20)])) == 1
    assert _wino_calls(_check(_model(8, 32), [(1, 8, 12, 12)])) == 1  # the first conv has 8 inputs
    assert _wino_calls(_check(_model(32, 32, dims=(1, None, 5, 5)), [(1, 32, 5, 5)])) == 0
    assert _wino_calls(_check(_model(32, 32, dims=(1, None, 7, 7)), [(1, 32, 7, 7)])) == 2
    wide = _check(_model(384, 384, dims=(2, None, 7, 7)), [(2, 384, 7, 7)])
    assert _wino_calls(wide, "wino2") == 2 and _wino_calls(wide) == 0
    nchw.setenv("SHAPESHIFT_WINOGRAD", "off")
    assert _wino_calls(_check(_model(32, 32), [(1, 32, 12, 12)])) == 0


def test_the_tuner_leaves_winograd_convs_alone(tmp_path, nchw, capsys):
    """Its stride-1 3 x 3 convs are no tuning task: only the strided class is."""
    model = _model(16, 32, strides=(2, 2), dims=(1, None, 30, 26), residual=False)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["tune", str(path), "--trials", "1", "--db", str(tmp_path / "t.db")]) == 0
    out = capsys.readouterr().out
    assert "1 task(s)" in out and "conv 3x3/2" in out and "3x3/1" not in out
    session = shapeshift.InferenceSession(model, backend="native", num_threads=1, tuning_db=tmp_path / "t.db")
    assert _wino_calls(session) == 1
    _check(model, [(1, 16, 30, 26)], session)



def test_tile_size_rule():
    """F(2x2) where F(4x4) would give the batch at most 16 tiles and C x M is at least 256 x 256
    (ResNet-50's 14x14 stage at batch 1, its 7x7 one at batch 4); F(4x4) with more tiles
    or narrower channels; both, picked per call, where a symbolic plane or batch of a wide
    conv leaves it open; none below the plane and channel minimums."""
    from shapeshift.codegen.kernels.conv_wino import winograd_tiles

    def tiles(channels, outputs, hw, batch=1):
        return winograd_tiles([3, 3], [1, 1], [1, 1], 1, channels, outputs, hw, batch)

    assert tiles(256, 256, (14, 14)) == (2,) and tiles(512, 512, (7, 7), 4) == (2,)
    assert tiles(256, 256, (16, 16)) == (2,)
    assert tiles(256, 256, (17, 16)) == (4,) and tiles(256, 256, (14, 14), 2) == (4,)
    assert tiles(128, 256, (14, 14)) == (4,) and tiles(128, 128, (7, 7)) == (4,) and tiles(64, 64, (56, 56)) == (4,)
    assert tiles(256, 256, ("h", "w")) == (4, 2) and tiles(512, 512, (7, 7), "n") == (4, 2)
    assert tiles(256, 256, (20, 20), "n") == (4,) and tiles(128, 128, ("h", "w")) == (4,)
    assert tiles(256, 256, (5, 5)) == () and tiles(8, 256, (14, 14)) == () and tiles(256, 256, (5, 5), "n") == ()


def test_a_wide_conv_of_open_sizes_picks_its_tile_per_call(nchw):
    """A 256 -> 256 conv pair of symbolic batch and plane gets both transformed weights and
    takes F(2x2) where F(4x4) would give fewer than 17 tiles, F(4x4) elsewhere: bit for bit
    what a session whose sizes are known (and whose lowering chose the tile) gives."""
    model = _model(256, 256)
    session = _check(model, [(1, 256, 14, 14), (1, 256, 20, 20), (2, 256, 7, 7), (5, 256, 7, 7)])
    assert _wino_calls(session, "wino_pick") == 2 and _wino_calls(session) == 0
    rng = np.random.default_rng(5)
    for shape, tile in (((1, 256, 14, 14), "wino2"), ((1, 256, 17, 17), "wino"), ((2, 256, 7, 7), "wino2"),
                        ((5, 256, 7, 7), "wino")):
        known = shapeshift.InferenceSession(_model(256, 256, dims=shape), backend="native")
        assert _wino_calls(known, tile) == 2, (shape, tile)
        feed = {"x": rng.standard_normal(shape).astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feed)[0], known.run(None, feed)[0], err_msg=str(shape))


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiles_wider_than_the_block_budget(tmp_path, variant):
    """Blocks of 64 floats, so that one tile's V and Mo (36 or 16 x their channels) pass even
    SS_WINO_BIG_BLOCK times the budget (no other case here does): blocks of whole row tiles
    still cover every tile, on the smallest plane the kernel takes (6 x 6, batch 1) and on
    a ragged batch of two."""
    source = CONV_DEPS + conv.source() + conv_wino.source(block_floats=64)
    cdll = build_with_gemm(source, tmp_path, f"test_wino_tiny_{variant}", flags=DEFAULT_FLAGS).cdll
    name = VARIANTS[variant]
    getattr(cdll, f"ss_conv_{name}_packed_b_size").restype = I64
    getattr(cdll, f"ss_conv_{name}_packed_b_size").argtypes = [I64, I64]
    getattr(cdll, f"ss_conv_{name}_pack_b").restype = None
    getattr(cdll, f"ss_conv_{name}_pack_b").argtypes = [I64, I64, F32P, I64, I64, F32P]
    getattr(cdll, f"ss_conv2d_{name}").restype = None
    getattr(cdll, f"ss_conv2d_{name}").argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P, F32P, F32P,
                                                                          ctypes.c_int]
    for n, c, h, w, m in ((1, 16, 6, 6, 16), (2, 20, 9, 7, 24)):
        x, weights, bias = _data(c, n, c, h, w, m)
        got = _run(cdll, x, weights, bias, (1, 1, 1, 1), act=1, variant=variant)
        np.testing.assert_allclose(got, _reference(x, weights, bias, (1, 1, 1, 1), act=1), rtol=RTOL, atol=ATOL)
