"""Convolutions in the tuner: the conv kernel under a prefix (kernels/conv_tuned.py), the
``conv`` family and its tasks (tune/conv_family.py, tune/conv_workload.py), the worker's
measurement, the dispatcher built from a grouped task, the records in the native lowering
and ``shapeshift tune`` on a CNN.

Every numeric check is against onnxruntime (one-node Conv models and whole models), at
ragged channel counts, odd planes, pads, strides and dilations, in both vector widths
(a ``-mno-avx512f`` build of the copies too).
"""

from __future__ import annotations

import ctypes
import logging
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift import InferenceSession
from shapeshift.cli.main import main
from shapeshift.codegen import fragments
from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.codegen.defaults import default_conv_schedule
from shapeshift.codegen.kernels.conv_tuned import ConvSchedule, unit_source
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.symbolic import symbol
from shapeshift.target import host_target
from shapeshift.tune import dispatch
from shapeshift.tune.builder import build_one
from shapeshift.tune.conv_family import CONV, PATHS, path
from shapeshift.tune.conv_workload import DIMS, ConvWorkload, conv_instance, output
from shapeshift.tune.database import Database
from shapeshift.tune.extract import ConvTask, model_tasks
from shapeshift.tune.records import GemmTuning, TunedConv
from shapeshift.tune.runner import RunnerConfig, measure

from .codegen.test_kernels_conv import F32P, I64, apply_act, run_ort

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")



@pytest.fixture(autouse=True)
def _direct_convs(monkeypatch):
    # These tests tune the direct conv kernels; with Winograd on, the lowering sends 3 x 3
    # stride-1 convs of 16+ channels to it instead (kernels/conv_wino.py), and the tuner
    # leaves them alone (tests/test_conv_wino.py checks that).
    monkeypatch.setenv("SHAPESHIFT_WINOGRAD", "off")


FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=60)
# Three schedules of one weight layout (nr 16, kc 256): the default GEMM tile and others,
# each sending some planes down other paths than the default's.
GEMM16 = GemmSchedule(mr=6, nr=16, kc=256, mc=144, nc=3072, small_nc=256, lanes=16 if host_target().avx512 else 8,
                      registers=32 if host_target().avx512 else 16)
KERNELS = (ConvSchedule(gemm=GEMM16),
           ConvSchedule(gemm=GemmSchedule(mr=4, nr=16, kc=256, mc=64, lanes=8, registers=16),
                        igemm_block=24, igemm_min_plane=64, small_plane=16, small_plane_max=64),
           ConvSchedule(gemm=GemmSchedule(mr=2, nr=16, kc=256, mc=16, small_m=0, lanes=8, registers=16),
                        igemm_block=96, igemm_min_plane=0, panels_max_plane=400, small_plane=144, small_plane_max=1024))
# C <= 8 -> kernel 2; else H <= 9 -> kernel 1; else kernel 0.
TREE = {"var": "C", "le": 8, "left": {"leaf": 2},
        "right": {"var": "H", "le": 9, "left": {"leaf": 1}, "right": {"leaf": 0}}}
# (x shape, M, kernel, strides, begin pads (end pads equal), dilations, act)
CASES = [
    ((1, 16, 13, 11), 24, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 5, 9, 10), 7, (3, 3), (2, 2), (1, 1), (1, 1), 3),  # C <= 8, ragged M, batch 2
    ((1, 33, 7, 7), 40, (3, 3), (1, 1), (1, 1), (1, 1), 0),  # small plane
    ((1, 20, 8, 9), 17, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # 1x1
    ((1, 12, 15, 14), 9, (1, 1), (2, 2), (0, 0), (1, 1), 1),  # 1x1 strided
    ((1, 6, 17, 16), 10, (5, 5), (1, 1), (4, 4), (2, 2), 3),  # dilated 5x5
    ((1, 11, 3, 40), 13, (1, 3), (1, 2), (0, 1), (1, 1), 1),  # 1x3 on a wide row
]


def _case_id(case) -> str:
    xs, m, k, s, p, d, act = case
    return f"{'x'.join(map(str, xs))}-M{m}-k{k[0]}{k[1]}-s{s[0]}{s[1]}-p{p[0]}{p[1]}-d{d[0]}{d[1]}-a{act}"


def _expected(case, rng):
    xs, m, kernel, strides, pads, dil, act = case
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((m, xs[1], *kernel)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    y = run_ort("Conv", [x, w, b], kernel_shape=list(kernel), strides=list(strides), pads=[*pads, *pads],
                dilations=list(dil))
    return x, w, b, apply_act(y, act)


def _typed(lib, names):
    for name in names:
        fn = getattr(lib, f"{name}conv2d")
        fn.restype = None
        fn.argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P]
    return lib


def _pack(lib, name: str, w) -> np.ndarray:
    m, k = w.shape[0], int(np.prod(w.shape[1:]))
    getattr(lib, f"{name}packed_b_size").restype = I64
    packed = np.full(getattr(lib, f"{name}packed_b_size")(I64(k), I64(m)), np.nan, np.float32)
    getattr(lib, f"{name}pack_b")(I64(k), I64(m), w.ctypes.data_as(F32P), I64(1), I64(k), packed.ctypes.data_as(F32P))
    return packed


def _run(lib, fn: str, packer: str, case, rng, residual: bool = False) -> None:
    """``fn`` (a ``conv2d``) on ``case`` against onnxruntime; ``residual``: ``fn`` is a
    ``conv2d_residual``, given a residual and a ReLU after it (ResNet's Conv -> Add -> Relu)."""
    xs, m, kernel, strides, pads, dil, act = case
    x, w, b, expected = _expected(case, rng)
    res = rng.standard_normal(expected.shape).astype(np.float32)
    tail = ()
    if residual:
        getattr(lib, fn).argtypes = [F32P] * 4 + [I64] * 16 + [ctypes.c_int, F32P, F32P, F32P, ctypes.c_int]
        expected, tail = np.maximum(expected + res, 0), (res.ctypes.data_as(F32P), 1)
    y = np.full(expected.shape, np.nan, np.float32)
    n, c, h, wd = xs
    oh, ow = expected.shape[2:]
    work = np.full(max(1, c * kernel[0] * kernel[1] * oh * ow), np.nan, np.float32)
    packed = _pack(lib, packer, w)
    getattr(lib, fn)(x.ctypes.data_as(F32P), w.ctypes.data_as(F32P), b.ctypes.data_as(F32P), y.ctypes.data_as(F32P),
                     n, c, h, wd, m, *kernel, oh, ow, *strides, *pads, *dil, 1, act, work.ctypes.data_as(F32P),
                     packed.ctypes.data_as(F32P), *tail)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


# ---- the kernel copies -----------------------------------------------------------------

@pytest.fixture(scope="module", params=["native", "no-avx512"])
def copies(request, build_cache):
    """Each schedule of KERNELS under its own prefix, next to the default fragments'
    declarations (as in a model's unit), in one library; and the same without AVX-512."""
    flags = None if request.param == "native" else (*DEFAULT_FLAGS, "-mno-avx512f")
    source = PRELUDE + fragments.declarations(["vmath", "gemm", "conv"]) + "".join(
        unit_source(s, prefix=f"ss_cp{i}_") for i, s in enumerate(KERNELS))
    lib = compile_library(source, name_hint="conv_copies", cache_dir=build_cache, flags=flags)
    return _typed(lib.cdll, [f"ss_cp{i}_" for i in range(len(KERNELS))])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("kernel", range(len(KERNELS)))
def test_prefixed_copies_compute_every_path_right(copies, kernel, case):
    _run(copies, f"ss_cp{kernel}_conv2d", f"ss_cp{kernel}_gemm_", case, np.random.default_rng(7))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("kernel", range(len(KERNELS)))
def test_prefixed_copies_add_a_residual_on_every_path(copies, kernel, case):
    _run(copies, f"ss_cp{kernel}_conv2d_residual", f"ss_cp{kernel}_gemm_", case, np.random.default_rng(8), True)


def test_the_default_prefix_keeps_the_names_and_a_bad_prefix_is_refused():
    text = unit_source(default_conv_schedule())
    assert "void ss_conv2d(" in text and "ss_cp0_" not in text
    with pytest.raises(ValueError, match="prefix"):
        unit_source(default_conv_schedule(), prefix="0bad")
    with pytest.raises(ValueError, match="igemm_block"):
        ConvSchedule(igemm_block=30)


# ---- the family and the task ----------------------------------------------------------

def test_conv_family_space_is_valid_and_round_trips():
    target, rng = host_target(), random.Random(3)
    default = CONV.default(target)
    assert default == default_conv_schedule(target) and CONV.from_json(CONV.to_json(default)) == default
    schedules = [CONV.random(rng, target) for _ in range(40)]
    schedules += [CONV.mutate(s, rng, target) for s in schedules]
    w = ConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 16, 13, 11, 24, 1, 1, 1), (1, 64, 5, 5, 64, 1, 1, 0)])
    lengths = set()
    for s in schedules:
        assert CONV.from_json(CONV.to_json(s)) == s
        for v in (1, 2):
            row, work = CONV.features(s, w, v, 1)
            lengths.add(len(row))
            assert work >= 1.0 and np.isfinite(row).all() and np.isfinite(CONV.prior(s, w, v))
    assert len(lengths) == 1
    # The path mirror: the default sends a 3x3 on 5x5 (25 pixels) to the implicit GEMM only
    # where its switch says so, and a 1x1 on a large plane to the NCHW GEMM.
    assert path(ConvSchedule(igemm_min_plane=9), 3, 3, 1, 1, 1, 1, 25, 64, True) == "igemm"
    assert path(ConvSchedule(igemm_min_plane=36), 3, 3, 1, 1, 1, 1, 25, 64, True) == "small_plane"
    assert path(ConvSchedule(), 1, 1, 1, 1, 0, 0, 400, 64, True) == "gemm_1x1" and "gemm_1x1" in PATHS


def test_conv_workload_round_trips_and_refuses_what_it_cannot_run():
    w = ConvWorkload.of((3, 3, 2, 2, 1, 1), [(1, 32, 19, 15, 32, 1, 1, 0), (1, 3, 37, 30, 16, 1, 1, 1)])
    assert ConvWorkload.from_key(w.key) == w and w.hi == 2 and w.instance(1)[1] == 3  # sorted
    cold = ConvWorkload.of(w.conv_class, w.instances, cold=True)
    assert ConvWorkload.from_key(cold.key) == cold and cold.key != w.key and cold.class_key == w.class_key
    assert output(w.conv_class, w.instance(1)) == (19, 15)
    assert w.point(2) == {"N": 1, "C": 32, "M": 32, "H": 19, "W": 15} and tuple(w.point(2)) == DIMS
    assert w.flops(1) == 2.0 * 19 * 15 * 3 * 9 * 16
    for bad in [((3, 3, 1, 1, 1, 1), [(1, 3, 2, 2, 4, 0, 0, 0)]),  # empty output
                ((3, 3, 1, 1, 1, 1), [(1, 3, 8, 8, 4, 1, 1, 7)]),  # unknown activation
                ((3, 3, 0, 1, 1, 1), [(1, 3, 8, 8, 4, 1, 1, 0)])]:
        with pytest.raises(ValueError):
            ConvWorkload.of(*bad)
    with pytest.raises(ValueError, match="not a conv workload key"):
        ConvWorkload.from_key("conv:3,3")
    # Only static convs whose output is what equal end pads give are instances.
    assert conv_instance((3, 3), (2, 2), (1, 1), (1, 1), (1, 3, 37, 30, 16), (19, 15), 1) is not None
    assert conv_instance((3, 3), (2, 2), (1, 1), (0, 0), (1, 3, 37, 30, 16), (19, 15), 1) is None  # asymmetric
    assert conv_instance((3, 3), (1, 1), (1, 1), ("p", 1), (1, 3, 8, 8, 4), (8, 8), 0) is None  # symbolic
    pinned, free = symbol("b", 1, 1), symbol("h", 8, 64)  # a dim declared with one value is that value
    assert conv_instance((3, 3), (2, 2), (1, 1), (1, 1), (pinned, 3, 37, 30, 16), (19, 15), 1)[1][0] == 1
    assert conv_instance((3, 3), (1, 1), (1, 1), (1, 1), (1, 3, free, 8, 4), (free, 8), 0) is None


def test_worker_checks_and_times_every_instance(tmp_path):
    w = ConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 16, 13, 11, 24, 1, 1, 1), (2, 5, 9, 10, 7, 0, 0, 3)])
    for cold in (False, True):  # cold: every timed call after a flush of the caches
        w = ConvWorkload.of(w.conv_class, w.instances, cold)
        good = measure(build_one(KERNELS[1], tmp_path, family=CONV), w, [1, 2], FAST)
        assert good.error is None and sorted(good.seconds) == [1, 2] and min(good.seconds.values()) > 0
    doubled = build_one(KERNELS[0], tmp_path, family=CONV, source_fn=lambda s: unit_source(s).replace(
        "int64_t Cg = C / group, Mg = M / group, P = OH * OW, Kc = Cg * KH * KW;",
        "int64_t Cg = C / group, Mg = M / group, P = OH * OW, Kc = Cg * KH * KW; N = N > 1 ? 1 : N;"))
    bad = measure(doubled, w, [1, 2], FAST)  # batch 2 computes only its first image
    assert bad.error and "instance" in bad.error and "(2, 5, 9, 10, 7, 0, 0, 3)" in bad.error


# ---- the dispatcher of a grouped task ------------------------------------------------------

@pytest.fixture(scope="module")
def dispatcher(build_cache):
    source = PRELUDE + dispatch.tuned_conv_c(KERNELS, TREE, "ss_tc_", DIMS)
    lib = compile_library(source, name_hint="conv_dispatch", cache_dir=build_cache).cdll
    lib.ss_tc_choice.argtypes = [I64] * 5
    return _typed(lib, ["ss_tc_"])


@pytest.mark.parametrize("case", CASES + [((1, 9, 9, 9), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),
                                          ((1, 9, 10, 9), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1)], ids=_case_id)
def test_conv_dispatcher_picks_the_trees_kernel_and_computes_right(dispatcher, case):
    """At the instances and at shapes between them (either side of each split)."""
    (n, c, h, wd), m = case[0], case[1]
    assert dispatcher.ss_tc_choice(n, c, m, h, wd) == dispatch.choose(TREE, {"N": n, "C": c, "M": m, "H": h, "W": wd})
    _run(dispatcher, "ss_tc_conv2d", "ss_tc_", case, np.random.default_rng(11))
    _run(dispatcher, "ss_tc_conv2d_residual", "ss_tc_", case, np.random.default_rng(12), residual=True)


# ---- records, the lowering, the CLI ------------------------------------------------------

def _cnn(path, batch: int = 1, dynamic: bool = False) -> str:
    """A stem 3->16 stride 2, 3x3 16->32, 3x3 stride 2 32->32 with SiLU, 1x1 32->24: three
    conv classes, ragged planes (37x30 input)."""
    rng = np.random.default_rng(0)

    def weight(shape, name):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    inits = [weight((16, 3, 3, 3), "w0"), weight((16,), "b0"), weight((32, 16, 3, 3), "w1"),
             weight((32, 32, 3, 3), "w2"), weight((24, 32, 1, 1), "w3"), weight((24,), "b3")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Sigmoid", ["c2"], ["s2"]), helper.make_node("Mul", ["c2", "s2"], ["m2"]),
             helper.make_node("Conv", ["m2", "w3", "b3"], ["y"])]
    dims = [batch, 3, "h", "w"] if dynamic else [batch, 3, 37, 30]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    out = str(path / f"cnn{'_dynamic' if dynamic else ''}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def _check(session, model_path, hw=(37, 30)) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, *hw)).astype(np.float32)
    ref = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def test_records_route_each_conv_to_its_dispatcher(tmp_path):
    """A class record (two instances) serves both stride-2 convs; an instance's own record
    serves the 3x3 stride-1 conv; the 1x1 conv has none and keeps ss_conv2d."""
    model = _cnn(tmp_path)
    strided = ConvWorkload.of((3, 3, 2, 2, 1, 1), [(1, 3, 37, 30, 16, 1, 1, 1), (1, 32, 19, 15, 32, 1, 1, 3)])
    alone = ConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 16, 19, 15, 32, 1, 1, 1)])
    db = tmp_path / "convs.db"
    with Database(db) as d:
        for w in (strided, alone):
            d.add_selection(d.workload_id(w), 1, w.hi, 1, "dietcode",
                            [{"candidate": i, "schedule": CONV.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    tuning = GemmTuning.from_db(db, 1)
    assert len(tuning) == 2 and all(isinstance(r, TunedConv) for r in tuning)
    assert GemmTuning.from_json(tuning.to_json()).to_json() == tuning.to_json()
    session = InferenceSession(model, backend="native", num_threads=1, tuning_db=db)
    prefixes = {p.prefix for p in session._executor.program.packs}
    names = {TunedConv(w.key, KERNELS, TREE, 1, "dietcode").name for w in (strided, alone)}
    assert names <= prefixes
    _check(session, model)


def test_cli_tunes_each_conv_class_and_the_session_matches(tmp_path, capsys):
    model = _cnn(tmp_path)
    db = tmp_path / "tuned.db"
    assert main(["tune", model, "--trials", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "3 task(s)" in out and "conv 3x3/2: 2 instance(s)" in out
    session = InferenceSession(model, backend="native", num_threads=1, tuning_db=db)
    assert sum(p.prefix.startswith("ss_tuned_conv_") for p in session._executor.program.packs) == 4
    _check(session, model)
    assert main(["tune", model, "--no-group", "--trials", "1", "--db", str(tmp_path / "per.db")]) == 0
    assert "4 task(s)" in capsys.readouterr().out


def test_convs_sized_by_undeclared_dims_are_named_not_left_out_silently(tmp_path, caplog):
    """A conv whose plane depends on a dim the tuning does not declare has no instance to
    measure: it is not tuned, and model_tasks says which dims to declare."""
    model = _cnn(tmp_path, dynamic=True)

    def warned(dynamic):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shapeshift.tune.extract"):
            tasks = model_tasks(model, dynamic)
        return [r.getMessage() for r in caplog.records if "not declared" in r.getMessage()], tasks

    messages, tasks = warned({"h": (64, 64)})  # w left out
    assert len(messages) == 1 and "(w)" in messages[0] and "--dynamic SYM=LO:HI" in messages[0]
    assert not [t for t in tasks if isinstance(t, ConvTask)]
    messages, tasks = warned({"h": (64, 64), "w": (64, 96)})
    assert not messages and [t for t in tasks if isinstance(t, ConvTask)]


def test_dynamic_image_sizes_are_sampled_and_dispatched_at_held_out_sizes(tmp_path, capsys):
    """--dynamic h and w (multiples of 32): one tuning run over sampled sizes; the session
    runs the class dispatchers at sizes none was tuned at (odd ones too) and matches
    onnxruntime."""
    from shapeshift.tune.extract import sampled_bindings

    bindings = sampled_bindings({"h": (64, 160), "w": (64, 160)})
    assert all(b["h"] % 32 == 0 and b["w"] % 32 == 0 for b in bindings)
    assert sorted({b["h"] for b in bindings}) == sorted({b["w"] for b in bindings})  # every value of each dim
    model = _cnn(tmp_path, dynamic=True)
    db = tmp_path / "dyn.db"
    assert main(["tune", model, "--dynamic", "h=64:160", "--dynamic", "w=64:160", "--trials", "1",
                 "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "conv 3x3/2: " in out and "conv 1x1/1: " in out  # classes over the sampled sizes
    dynamic = {"h": (64, 160), "w": (64, 160)}
    session = InferenceSession(model, dynamic, backend="native", num_threads=1, tuning_db=db)
    assert sum(p.prefix.startswith("ss_tuned_conv_") for p in session._executor.program.packs) == 4
    for hw in ((64, 64), (96, 160), (81, 130), (160, 65)):
        _check(session, model, hw)


def test_records_serve_a_conv_with_a_fused_residual(tmp_path):
    """A conv whose Add and Relu the lowering fused (Conv -> Add(identity) -> Relu, both Add
    operand orders) keeps its tuned dispatcher: it calls the dispatcher's conv2d_residual."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / 6).astype(np.float32), n)
             for n, s in (("w0", (13, 5, 3, 3)), ("w1", (13, 13, 3, 3)), ("b1", (13,)), ("w2", (13, 13, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["a1"]), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r1", "c2"], ["a2"]), helper.make_node("Relu", ["a2"], ["y"])]
    graph = helper.make_graph(nodes, "res", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 11, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = str(tmp_path / "res.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    w = ConvWorkload.of((3, 3, 1, 1, 1, 1), [(2, 5, 11, 9, 13, 1, 1, 1), (2, 13, 11, 9, 13, 1, 1, 0)])
    db = tmp_path / "res.db"
    with Database(db) as d:
        d.add_selection(d.workload_id(w), 1, w.hi, 1, "dietcode",
                        [{"candidate": i, "schedule": CONV.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    session = InferenceSession(model, backend="native", num_threads=1, tuning_db=db)
    name = TunedConv(w.key, KERNELS, TREE, 1, "dietcode").name
    steps = session._executor.program.steps
    assert [s.node.op_type for s in steps] == ["Conv"] * 3
    assert sum(f"{name}conv2d_residual(" in s.lowered.code for s in steps) == 2
    x = np.random.default_rng(1).standard_normal((2, 5, 11, 9)).astype(np.float32)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
