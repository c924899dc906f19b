"""Blocked-layout convolutions in the tuner: the NCHWc conv kernels under a prefix
(kernels/conv_nchwc_tuned.py), the ``conv-nchwc`` family and its tasks
(tune/conv_nchwc_family.py, tune/conv_workload.py's NchwcConvWorkload), the worker's
measurement, the dispatcher of a class, the records in the lowering of ``NCHWcConv`` nodes
and ``shapeshift tune`` on a CNN with dynamic image sizes.

Every numeric check is against onnxruntime (one-conv models with their epilogues, whole
models at sampled and held-out image sizes), at ragged channel counts, odd planes, pads,
strides and dilations, in the target's block width, and in a ``-mno-avx512f`` build too.
"""

from __future__ import annotations

import ctypes
import dataclasses
import random
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from shapeshift import InferenceSession
from shapeshift.cli.main import main
from shapeshift.codegen import fragments
from shapeshift.codegen.build import DEFAULT_FLAGS, compile_library
from shapeshift.codegen.defaults import default_nchwc_schedule
from shapeshift.codegen.kernels import nchwc
from shapeshift.codegen.kernels.conv_nchwc_tuned import NchwcSchedule, unit_source
from shapeshift.codegen.kernels.prelude import PRELUDE
from shapeshift.target import host_target
from shapeshift.tune import dispatch
from shapeshift.tune.builder import build_one
from shapeshift.tune.conv_nchwc_family import CONV_NCHWC, CONV_NCHWC_DW, DENSE_FIELDS, DEPTHWISE_FIELDS, PATHS, path
from shapeshift.tune.conv_workload import DIMS, NchwcConvWorkload, workload_from_key
from shapeshift.tune.database import Database
from shapeshift.tune.records import GemmTuning, TunedConv
from shapeshift.tune.runner import RunnerConfig, measure

from .codegen.test_kernels_conv_nchwc import DENSE, DEPTHWISE, GROUPED, _id, run_case

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

LANES = nchwc.block_width(host_target())
DEFAULT = default_nchwc_schedule()
FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=60)
# The default, the smallest tiles with the finest blocking and threads from the first
# multiply-add, and tiles past the register file with the coarsest blocking.
KERNELS = (DEFAULT,
           NchwcSchedule(rx=4, dw_pixels=4, l1_share=8, l2_share=8, par_min=0),
           NchwcSchedule(rx=DEFAULT.rx + 2, dw_pixels=12, l1_share=1, l2_share=2, par_min=1 << 19))
# C <= 16 -> kernel 1; else W <= 13 -> kernel 2; else kernel 0.
TREE = {"var": "C", "le": 16, "left": {"leaf": 1},
        "right": {"var": "W", "le": 13, "left": {"leaf": 2}, "right": {"leaf": 0}}}
EPI = [F32P := ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int,
       ctypes.c_float, ctypes.c_float]
I64 = ctypes.c_int64


class _Named:
    """A library whose ``ss_conv_nchwc_L`` and ``ss_dwconv_nchwc_L`` are another prefix's
    (what run_case calls)."""

    def __init__(self, cdll, prefix: str):
        self.cdll, self.prefix = cdll, prefix
        for name, extents in ((f"conv_nchwc_{LANES}", 17), (f"dwconv_nchwc_{LANES}", 14)):
            if hasattr(cdll, prefix + name):  # a dispatcher has one of them
                fn = getattr(cdll, prefix + name)
                fn.restype, fn.argtypes = None, [F32P] * 4 + [I64] * extents + EPI

    def __getattr__(self, name: str):
        return getattr(self.cdll, self.prefix + name[len("ss_"):])


@pytest.fixture(scope="module", params=["native", "no-avx512"])
def copies(request, build_cache):
    """Each schedule of KERNELS under its own prefix after the declarations a model's unit
    starts with, in one library; and the same without AVX-512."""
    flags = None if request.param == "native" else (*DEFAULT_FLAGS, "-mno-avx512f")
    source = PRELUDE + fragments.declarations(["nchwc", "conv_nchwc"]) + "".join(
        unit_source(s, prefix=f"ss_cp{i}_") for i, s in enumerate(KERNELS))
    return compile_library(source, name_hint="cnc_copies", cache_dir=build_cache, flags=flags).cdll


CASES = DENSE + GROUPED + DEPTHWISE


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("kernel", range(len(KERNELS)))
def test_prefixed_copies_compute_every_path_right(copies, kernel, case):
    xs, m, k, s, p, d, g = case
    run_case(_Named(copies, f"ss_cp{kernel}_"), LANES, xs, m, k, s, p, d, g, "relu", seed=3)
    run_case(_Named(copies, f"ss_cp{kernel}_"), LANES, xs, m, k, s, p, d, g, "add_relu", seed=4)


def test_the_default_prefix_is_the_untuned_fragment_and_bad_schedules_are_refused():
    text = unit_source(DEFAULT)
    assert fragments.text("conv_nchwc") in text and f"void ss_conv_nchwc_{LANES}(" in text
    renamed = unit_source(KERNELS[1], prefix="ss_cp1_")
    assert "ss_cnc_" not in renamed and "SS_CNC_" not in renamed and "ss_dwc_" not in renamed
    assert f"void ss_cp1_dwconv_nchwc_{LANES}(" in renamed
    with pytest.raises(ValueError, match="prefix"):
        unit_source(DEFAULT, prefix="0bad")
    for bad in (dict(rx=3), dict(rx=15), dict(dw_pixels=2), dict(l1_share=0), dict(par_min=-1)):
        with pytest.raises(ValueError):
            dataclasses.replace(DEFAULT, **bad)


# ---- the family and the task ----------------------------------------------------------

@pytest.mark.parametrize("family", [CONV_NCHWC, CONV_NCHWC_DW], ids=lambda f: f.name)
def test_each_family_draws_only_the_fields_its_kernel_reads(family):
    target, rng = host_target(), random.Random(3)
    assert family.default(target) == DEFAULT and family.from_json(family.to_json(DEFAULT)) == DEFAULT
    schedules = [family.random(rng, target) for _ in range(40)]
    schedules += [family.mutate(s, rng, target) for s in schedules]
    assert len(set(schedules)) > 5
    own = DEPTHWISE_FIELDS if family is CONV_NCHWC_DW else DENSE_FIELDS
    for s in schedules:
        assert family.from_json(family.to_json(s)) == s
        assert all(getattr(s, f) == getattr(DEFAULT, f) for f in ("rx", "dw_pixels", "l1_share", "l2_share")
                   if f not in own)
    for f in own:
        assert len({getattr(s, f) for s in schedules}) > 1
    other = CONV_NCHWC if family is CONV_NCHWC_DW else CONV_NCHWC_DW
    assert family.to_json(DEFAULT) != other.to_json(DEFAULT)
    with pytest.raises(ValueError, match="schedule"):
        family.from_json(other.to_json(DEFAULT))


def test_features_are_finite_and_mirror_the_kernels_paths():
    target, rng = host_target(), random.Random(3)
    schedules = [f.random(rng, target) for f in (CONV_NCHWC, CONV_NCHWC_DW) for _ in range(20)]
    # Rows 37 wide take the row tiles and 5 wide the narrow path whatever the tile (6 pixels
    # with 16 registers, 12 with 32): 17 was narrow on an AVX-512 machine.
    dense = NchwcConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 20, 13, 37, 36, 1, 1, 0), (2, 16, 5, 5, 24, 1, 1, 0)],
                                 lanes=LANES)
    pointwise = NchwcConvWorkload.of((1, 1, 1, 1, 1, 1), [(1, 40, 1, 169, 30, 0, 0, 0)], lanes=LANES)
    depthwise = NchwcConvWorkload.of((5, 5, 2, 2, 1, 1), [(1, 72, 28, 28, 72, 2, 2, 0)], depthwise=True, lanes=LANES)
    lengths = set()
    for s in schedules:
        for w in (dense, pointwise, depthwise):
            for v in range(1, w.hi + 1):
                row, work = CONV_NCHWC.features(s, w, v, 1)
                lengths.add(len(row))
                assert work >= 1.0 and np.isfinite(row).all() and np.isfinite(CONV_NCHWC.prior(s, w, v))
    assert len(lengths) == 1
    # The path mirror: ss_conv_nchwc_L's order.
    assert path(DEFAULT, pointwise, pointwise.instance(1)) == "pointwise"
    assert path(DEFAULT, dense, dense.instance(1)) == "rows" and path(DEFAULT, dense, dense.instance(2)) == "narrow"
    assert path(DEFAULT, depthwise, depthwise.instance(1)) == "depthwise" and set(PATHS) >= {"rows", "narrow"}


def test_workload_round_trips_and_refuses_what_it_cannot_run():
    w = NchwcConvWorkload.of((3, 3, 2, 2, 1, 1), [(1, 32, 19, 15, 32, 1, 1, 0), (1, 16, 37, 30, 16, 1, 1, 0)],
                             depthwise=True, lanes=8)
    cold = NchwcConvWorkload.of(w.conv_class, w.instances, True, True, 8)
    for x in (w, cold):
        assert NchwcConvWorkload.from_key(x.key) == x and workload_from_key(x.key) == x
    dense = NchwcConvWorkload.of(w.conv_class, w.instances, lanes=16)
    assert cold.key != w.key and cold.class_key == w.class_key
    assert w.family is CONV_NCHWC_DW and dense.family is CONV_NCHWC
    assert dense.class_key != w.class_key and dense.key.startswith("conv-nchwc:16:")
    assert w.flops(1) == 2.0 * 16 * 19 * 15 * 9 and dense.flops(1) == 2.0 * 16 * 19 * 15 * 9 * 16
    assert w.point(2) == {"N": 1, "C": 32, "M": 32, "H": 19, "W": 15} and tuple(w.point(2)) == DIMS
    assert w.request()["kind"] == "conv-nchwc" and w.request()["depthwise"]
    with pytest.raises(ValueError, match="depthwise"):
        NchwcConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 8, 9, 9, 16, 1, 1, 0)], depthwise=True)
    with pytest.raises(ValueError, match="block"):
        NchwcConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 8, 9, 9, 16, 1, 1, 0)], lanes=4)
    with pytest.raises(ValueError, match="not a blocked conv workload key"):
        NchwcConvWorkload.from_key("conv-nchwc:8:3,3")


def test_worker_checks_and_times_every_instance(tmp_path):
    dense = NchwcConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 20, 13, 17, 36, 1, 1, 0), (2, 16, 9, 30, 24, 1, 1, 0)],
                                 lanes=LANES)
    depthwise = NchwcConvWorkload.of((5, 5, 2, 2, 1, 1), [(1, 20, 13, 17, 20, 2, 2, 0)], depthwise=True, lanes=LANES)
    built = {w: build_one(KERNELS[1], tmp_path, family=w.family) for w in (dense, depthwise)}
    for w in (dense, depthwise):
        for cold in (False, True):  # cold: every timed call after a flush of the caches
            good = measure(built[w], dataclasses.replace(w, cold=cold), list(range(1, w.hi + 1)), FAST)
            assert good.error is None and sorted(good.seconds) == list(range(1, w.hi + 1))
            assert min(good.seconds.values()) > 0
    # A library holds its family's entry point alone (the other would double a dense
    # candidate's build and multiply a depthwise one's by six): the other kind of task is refused.
    assert f"ss_conv_nchwc_{LANES}(" in CONV_NCHWC.source(KERNELS[1]) and "dwconv" not in CONV_NCHWC.source(KERNELS[1])
    assert f"ss_dwconv_nchwc_{LANES}(" in CONV_NCHWC_DW.source(KERNELS[1])
    assert f"ss_conv_nchwc_{LANES}(" not in CONV_NCHWC_DW.source(KERNELS[1])
    for w, other in ((dense, depthwise), (depthwise, dense)):
        bad = measure(built[other], w, [1], FAST)
        assert bad.error and "built for the" in bad.error and not bad.seconds
    # A kernel that computes only a batch's first image, and one that leaves the depthwise
    # bias out: both refused, naming the instance.
    first_only = build_one(KERNELS[0], tmp_path, family=CONV_NCHWC, source_fn=lambda s: unit_source(s).replace(
        "const int64_t MB = (M + @L@ - 1) / @L@;\nconst int64_t MBg".replace("@L@", str(LANES)),
        "N = N > 1 ? 1 : N;\nconst int64_t MB = (M + @L@ - 1) / @L@;\nconst int64_t MBg".replace("@L@", str(LANES))))
    bad = measure(first_only, dense, [1, 2], FAST)
    assert bad.error and "(2, 16, 9, 30, 24, 1, 1, 0)" in bad.error
    no_bias = build_one(KERNELS[0], tmp_path, family=CONV_NCHWC_DW, source_fn=lambda s: unit_source(s).replace(
        f"const ss_vf{LANES} bv = bias ?", f"const ss_vf{LANES} bv = 0 && bias ?"))
    bad = measure(no_bias, depthwise, [1], FAST)
    assert bad.error and "(1, 20, 13, 17, 20, 2, 2, 0)" in bad.error


# ---- the dispatcher of a class -----------------------------------------------------------

# A model's unit: the program's declarations, then its dispatchers; the untuned kernels
# (which the default schedule's entries call) linked beside them.
UNIT_HEAD = PRELUDE + fragments.declarations(["nchwc", "conv_nchwc"])


@pytest.fixture(scope="module")
def dispatchers(build_cache):
    """A dense and a depthwise dispatcher, and a second dense one sharing two of the first's
    schedules (their kernels compiled once: the guards)."""
    source = UNIT_HEAD + dispatch.tuned_conv_nchwc_c(KERNELS, TREE, "ss_td_", DIMS, LANES, False) + \
        dispatch.tuned_conv_nchwc_c(KERNELS, TREE, "ss_tw_", DIMS, LANES, True) + \
        dispatch.tuned_conv_nchwc_c(KERNELS[::-1], TREE, "ss_te_", DIMS, LANES, False) + fragments.text("conv_nchwc")
    return compile_library(source, name_hint="cnc_dispatch", cache_dir=build_cache).cdll


@pytest.mark.parametrize("case", DENSE + DEPTHWISE, ids=_id)
def test_dispatcher_computes_every_case_right(dispatchers, case):
    """Cases on both sides of each split of the tree, dense and depthwise."""
    xs, m, k, s, p, d, g = case
    for prefix in ("ss_tw_",) if g > 1 else ("ss_td_", "ss_te_"):
        run_case(_Named(dispatchers, prefix), LANES, xs, m, k, s, p, d, g, "relu", seed=5)


def test_a_dispatcher_copies_no_default_kernel_and_names_kernels_by_schedule():
    dense = dispatch.tuned_conv_nchwc_c(KERNELS, TREE, "ss_td_", DIMS, LANES, False)
    again = dispatch.tuned_conv_nchwc_c(KERNELS[1:], TREE, "ss_te_", DIMS, LANES, False)
    copies = set(re.findall(r"void (ss_cnck_\w+?_conv_nchwc_\d+)\(", dense))
    assert len(copies) == 2 and copies == set(re.findall(r"void (ss_cnck_\w+?_conv_nchwc_\d+)\(", again))
    assert f"ss_conv_nchwc_{LANES}(x, w" in dense  # the default schedule: the untuned kernel
    assert "dwconv" not in dense.split("---- tuned blocked conv dispatch")[0]  # one entry per dispatcher
    # A depthwise set: schedules that differ only in fields the depthwise kernel never reads
    # are the untuned kernel.
    dw = dispatch.tuned_conv_nchwc_c((DEFAULT, dataclasses.replace(DEFAULT, rx=4, l2_share=8)), TREE, "ss_tw_", DIMS,
                                     LANES, True)
    assert "ss_cnck_" not in dw and dw.count(f"ss_dwconv_nchwc_{LANES}(x, w") == 2


def test_dispatcher_picks_the_trees_kernel(tmp_path):
    """Each kernel of a set of three non-default schedules made to write a mark of its own:
    the dispatcher calls the one the tree names, for dense and depthwise calls (M is C for
    a depthwise one)."""
    kernels = (*KERNELS[1:], dataclasses.replace(DEFAULT, l2_share=8, dw_pixels=6))
    text = dispatch.tuned_conv_nchwc_c(kernels, TREE, "ss_mk_", DIMS, LANES, False)
    text += dispatch.tuned_conv_nchwc_c(kernels, TREE, "ss_mw_", DIMS, LANES, True)
    for pattern in (r"void (ss_cnck_\w+?_conv_nchwc_\d+)\(", r"void (ss_cnck_\w+?_dwconv_nchwc_\d+)\("):
        for i, name in enumerate(re.findall(pattern, text)):
            body = text.index("{", text.index(f"void {name}("))
            text = text[:body + 1] + f"\n    y[0] = {100 + i}.0f; return;" + text[body + 1:]
    lib = compile_library(UNIT_HEAD + text, name_hint="cnc_marks", cache_dir=tmp_path).cdll
    y = np.zeros(1, np.float32)
    for n, c, h, w in ((1, 8, 9, 9), (1, 24, 9, 9), (1, 24, 9, 20), (2, 40, 1, 13)):
        want = 100 + dispatch.choose(TREE, {"N": n, "C": c, "M": c, "H": h, "W": w})
        conv = getattr(lib, f"ss_mk_conv_nchwc_{LANES}")
        conv.argtypes = [F32P] * 4 + [I64] * 17 + EPI
        conv(None, None, None, y.ctypes.data_as(F32P), n, c, h, w, c, 3, 3, h, w, 1, 1, 1, 1, 1, 1, 1, LANES, None, 0,
             0.0, 0.0, 0, 0.0, 0.0)
        assert y[0] == want
        dw = getattr(lib, f"ss_mw_dwconv_nchwc_{LANES}")
        dw.argtypes = [F32P] * 4 + [I64] * 14 + EPI
        y[0] = 0
        dw(None, None, None, y.ctypes.data_as(F32P), n, c, h, w, 3, 3, h, w, 1, 1, 1, 1, 1, 1, None, 0, 0.0, 0.0, 0,
           0.0, 0.0)
        assert y[0] == want


# ---- records, the lowering, the CLI ------------------------------------------------------

def _mobile(path) -> str:
    """A MobileNet-style net of dynamic image size (h, w), which the layout pass blocks (it
    has depthwise convs): a stem 3->16 stride 2 (plain input), depthwise 3x3 on 16 with
    Relu, 1x1 16->24, depthwise 5x5 stride 2 on 24 with HardSwish, 1x1 24->40 with a
    residual-free Relu, 1x1 stride 2 40->20: ragged channels, every blocked class."""
    rng = np.random.default_rng(0)

    def weight(shape, name):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    inits = [weight((16, 3, 3, 3), "w0"), weight((16, 1, 3, 3), "w1"), weight((16,), "b1"),
             weight((24, 16, 1, 1), "w2"), weight((24, 1, 5, 5), "w3"), weight((40, 24, 1, 1), "w4"),
             weight((40,), "b4"), weight((20, 40, 1, 1), "w5")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[2, 2, 2, 2], strides=[2, 2], group=24),
             helper.make_node("HardSwish", ["c3"], ["h3"]), helper.make_node("Conv", ["h3", "w4", "b4"], ["c4"]),
             helper.make_node("Relu", ["c4"], ["r4"]), helper.make_node("Conv", ["r4", "w5"], ["y"], strides=[2, 2])]
    graph = helper.make_graph(nodes, "mobile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    out = str(path / "mobile.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


DYNAMIC = {"h": (64, 160), "w": (64, 160)}


def _check(session, model_path, hw) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, *hw)).astype(np.float32)
    ref = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def _tuned(session) -> set[str]:
    """The tuned blocked-conv dispatchers the program's steps call."""
    code = "\n".join(step.lowered.code for step in session._executor.program.steps if step.lowered)
    names = {n for n in session._executor.program.tuned_names() if n.startswith("ss_tuned_cnc_")}
    return {n for n in names if f"{n}conv_nchwc_{LANES}(" in code or f"{n}dwconv_nchwc_{LANES}(" in code}


def test_records_route_each_blocked_class_to_its_dispatcher(tmp_path):
    """A depthwise class record and a pointwise class record (instances at two sizes) serve
    those convs at any size; the 1x1 stride-2 class has none and keeps the untuned kernel."""
    model = _mobile(tmp_path)
    dw = NchwcConvWorkload.of((3, 3, 1, 1, 1, 1), [(1, 16, 32, 32, 16, 1, 1, 0), (1, 16, 40, 50, 16, 1, 1, 0)],
                              depthwise=True, lanes=LANES)
    pw = NchwcConvWorkload.of((1, 1, 1, 1, 1, 1), [(1, 16, 1, 1024, 24, 0, 0, 0), (1, 24, 1, 400, 40, 0, 0, 0)],
                              lanes=LANES)
    db = tmp_path / "cnc.db"
    with Database(db) as d:
        for w in (dw, pw):
            d.add_selection(d.workload_id(w), 1, w.hi, 1, "dietcode",
                            [{"candidate": i, "schedule": w.family.to_json(s)} for i, s in enumerate(KERNELS)], TREE)
    tuning = GemmTuning.from_db(db, 1)
    assert len(tuning) == 2 and all(isinstance(r, TunedConv) and r.blocked for r in tuning)
    assert GemmTuning.from_json(tuning.to_json()).to_json() == tuning.to_json()
    session = InferenceSession(model, DYNAMIC, backend="native", num_threads=1, tuning_db=db)
    assert _tuned(session) == {TunedConv(w.key, KERNELS, TREE, 1, "dietcode").name for w in (dw, pw)}
    for hw in ((64, 64), (81, 130), (160, 65)):
        _check(session, model, hw)


def test_cli_tunes_blocked_classes_over_dynamic_sizes_and_the_session_matches(tmp_path, capsys):
    """--dynamic h and w: one tuning run over sampled sizes makes a task per blocked class;
    the session runs their dispatchers at sizes none was tuned at (odd ones too) and
    matches onnxruntime."""
    model = _mobile(tmp_path)
    db = tmp_path / "dyn.db"
    assert main(["tune", model, "--dynamic", "h=64:160", "--dynamic", "w=64:160", "--trials", "1",
                 "--db", str(db)]) == 0
    out = capsys.readouterr().out
    for label in (f"depthwise NCHW{LANES}c conv 3x3/1", f"depthwise NCHW{LANES}c conv 5x5/2",
                  f"NCHW{LANES}c conv 1x1/1", f"NCHW{LANES}c conv 1x1/2"):
        assert label in out
    session = InferenceSession(model, DYNAMIC, backend="native", num_threads=1, tuning_db=db)
    assert len(_tuned(session)) == 4
    for hw in ((64, 64), (96, 160), (81, 130), (160, 65)):
        _check(session, model, hw)
