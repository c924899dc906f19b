"""bench/cnn.py and bench/cnn_models.py: the built CNNs have torchvision's structure (parameter
counts, FLOPs), healthy activations, and run on the native backend as on onnxruntime at small
and ragged image sizes (also built for the AVX2-only x86-64-v3 target); the bench's table and
verdict on made-up rows; one tiny end-to-end bench run. No timing is asserted."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cnn  # noqa: E402
import cnn_models  # noqa: E402

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

# Per model: (batch, height, width) feeds, small; ragged where the net allows it (the
# YOLO-style net needs multiples of 32 for its Concat of upsampled and skipped maps).
SIZES = {
    "resnet50": [(1, 64, 64), (2, 57, 83)],
    "resnet50_bn": [(1, 64, 64), (2, 57, 83)],
    "mobilenet_v3_small": [(1, 64, 64), (2, 71, 45)],
    "yolo_style": [(1, 64, 96), (2, 96, 64)],
}


@pytest.fixture(scope="module")
def built():
    """Each model built once for the module (ResNet-50's weights take a couple of seconds)."""
    return {name: builder() for name, builder in cnn_models.BUILDERS.items()}


def _feed(batch: int, h: int, w: int, seed: int = 0) -> dict:
    return {"images": np.random.default_rng(seed).standard_normal((batch, 3, h, w)).astype(np.float32)}


def _onnxruntime(model, feed):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _assert_close(got, want, what: str) -> None:
    assert got.shape == want.shape, what
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


def _params(model, skip=()) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == 1 and len(t.dims) >= 1 and not any(t.name.startswith(s) for s in skip))


def test_resnet50_has_torchvisions_weights_and_flops(built, tmp_path):
    model = built["resnet50"]
    # torchvision's resnet50 has 25,557,032 parameters; folding each BatchNorm's weight and
    # bias into one conv bias removes one per BN channel (26,560 of them).
    assert _params(model) == 25_557_032 - 26_560
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 53 and sum(n.op_type == "Gemm" for n in model.graph.node) == 1
    # Stride 2 sits on the 3x3 of each stage's first block (v1.5) and on its 1x1 downsample.
    strided = [(cnn_models._attr(n, "kernel_shape")[0], cnn_models._attr(n, "strides")[0]) for n in convs]
    assert sorted(k for k, s in strided if s == 2) == [1, 1, 1, 3, 3, 3, 7]
    path = tmp_path / "resnet50.onnx"
    import onnx

    onnx.save(model, str(path))
    # torchvision reports 4.09 GMACs at 224x224.
    gflop = cnn.conv_gflop(path, cnn.SPEC["resnet50"], 1, (224, 224))
    assert 8.1 < gflop < 8.3


def test_mobilenet_v3_small_has_torchvisions_weights(built):
    model = built["mobilenet_v3_small"]
    # torchvision's mobilenet_v3_small: 2,542,856 parameters; the BatchNormalization running
    # statistics are buffers there, initializers here.
    assert _params(model, skip=("bn_mean", "bn_var")) == 2_542_856
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == 34 and ops.count("HardSwish") == 19 and ops.count("HardSigmoid") == 9
    depthwise = {(cnn_models._attr(n, "kernel_shape")[0], cnn_models._attr(n, "strides")[0])
                 for n in model.graph.node if n.op_type == "Conv" and cnn_models._attr(n, "group") > 1}
    assert depthwise == {(3, 1), (3, 2), (5, 1), (5, 2)}


def test_yolo_style_has_its_blocks(built):
    ops = [n.op_type for n in built["yolo_style"].graph.node]
    assert {"Split", "Concat", "Resize", "MaxPool", "Sigmoid", "Reshape"} <= set(ops)
    assert ops.count("Resize") == 2 and ops.count("MaxPool") == 3 and ops.count("Split") == 8


def test_resnet50_bn_is_resnet50_with_its_batchnorms_left_in(built):
    ops = [n.op_type for n in built["resnet50_bn"].graph.node]
    assert ops.count("Conv") == ops.count("BatchNormalization") == 53
    convs = [n for n in built["resnet50_bn"].graph.node if n.op_type == "Conv"]
    assert all(len(n.input) == 2 for n in convs)  # no bias: the BatchNormalization after each has it
    assert [op for op in ops if op != "BatchNormalization"] == [n.op_type for n in built["resnet50"].graph.node]


@pytest.mark.parametrize("name", list(cnn_models.BUILDERS))
def test_activations_neither_explode_nor_vanish(built, name):
    for size in (64, 320):
        stats = cnn_models.activation_stats(built[name], _feed(1, size, size, seed=3))
        assert stats["finite"] and 0.1 < stats["std"] < 10, (name, size, stats)


@needs_cc
@pytest.mark.parametrize("name", list(cnn_models.BUILDERS))
def test_native_matches_onnxruntime(built, name):
    import shapeshift

    session = shapeshift.InferenceSession(built[name], backend="native", num_threads=2)
    for batch, h, w in SIZES[name]:
        feed = _feed(batch, h, w, seed=h)
        _assert_close(session.run(None, feed)[0], _onnxruntime(built[name], feed), f"{name} at {batch}x{h}x{w}")


@needs_cc
@pytest.mark.parametrize("name", ["mobilenet_v3_small", "yolo_style"])
def test_avx2_build_matches_onnxruntime(built, tmp_path, name):
    """The x86-64-v3 target (AVX2 kernels, ymm tiles), whatever this machine has. Not ResNet-50:
    its 53 conv instances built again for another target took 70-245 s here (a loaded 2-core
    machine); these two cover depthwise 3x3 and 5x5, dense 3x3 and 1x1 convs at stride 1 and 2."""
    import shapeshift

    model = built[name]
    artifact = shapeshift.compile(model, tmp_path / f"{name}.ssa", target="x86-64-v3")
    assert "-march=x86-64-v3" in artifact.header["flags"]
    session = shapeshift.InferenceSession(str(artifact.path))
    for batch, h, w in SIZES[name]:
        feed = _feed(batch, h, w, seed=w)
        _assert_close(session.run(None, feed)[0], _onnxruntime(model, feed), f"{name} (x86-64-v3) at {h}x{w}")


def test_bad_activation_is_named():
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        cnn_models._Net(0, calibration_hw=32).act(cnn_models.INPUT, "gelu")


# -- the bench's plumbing -------------------------------------------------------------------------


def test_quick_is_one_thread_batch_one_first_size():
    args = cnn.parse_args(["--quick"])
    configs = cnn.configurations(args)
    assert [spec.name for spec, _, _ in configs] == [s.name for s in cnn.SPECS if s.default]
    assert "resnet50_bn" not in [spec.name for spec, _, _ in configs]  # only when asked for
    for spec, threads, shapes in configs:
        assert threads == 1 and shapes == [(1, spec.sizes[0])]
    full = cnn.configurations(cnn.parse_args(["--models", "yolo_style", "ssdlite320_mobilenet_v3_large.ts"]))
    assert [(s.name, t, len(shapes)) for s, t, shapes in full] == [
        ("yolo_style", 1, 4), ("yolo_style", 2, 4),
        ("ssdlite320_mobilenet_v3_large.ts", 1, 1), ("ssdlite320_mobilenet_v3_large.ts", 2, 1)]  # one image only
    with pytest.raises(SystemExit):
        cnn.parse_args(["--sizes", "224"])


def test_feeds_are_the_same_in_every_worker_and_fit_the_input():
    spec = cnn.SPEC["ssdlite320_mobilenet_v3_large.ts"]
    a, b = cnn.feed_for(spec, 1, (96, 128)), cnn.feed_for(spec, 1, (96, 128))
    assert a["images"].shape == (3, 96, 128) and np.array_equal(a["images"], b["images"])
    assert 0 <= a["images"].min() and a["images"].max() <= 1
    assert cnn.feed_for(cnn.SPEC["ppocr_det.det_infer"], 4, (64, 32))["x"].shape == (4, 3, 64, 32)


def _row(model, ratio, threads=1):
    row = cnn.Row(model, (224, 224), 1, threads, gflop=1.0)
    row.latency = {"native": ratio * 0.01, cnn.PEER: 0.01}
    row.diff, row.scale = {"native": 1e-6}, 2.0
    return row


def test_table_and_verdict_on_made_up_rows():
    rows = [_row("a", 0.5), _row("a", 2.0, threads=2), _row("b", 0.8)]
    text = cnn.table(rows, peak=100.0)
    assert "| **a geomean** |" in text and "**1.00**" in text  # sqrt(0.5 * 2)
    assert "**all geomean**" in text and f"**{(0.5 * 2.0 * 0.8) ** (1 / 3):.2f}**" in text
    assert "| 200 (200%) |" in text  # 1 GFLOP in 5 ms on one 100-GFLOPS core
    lines = cnn.verdict(rows)
    assert "NOT met (1 of 3 above: a 224x224 b1 2t (2.00))" in lines[0] and "NOT met" in lines[1]
    assert all("met" in line and "NOT" not in line for line in cnn.verdict([_row("a", 0.5), _row("b", 0.7)]))
    assert math.isnan(cnn.Row("c", (1, 1), 1, 1).ratio())


def test_rows_split_by_the_cores_state_in_each_round():
    row = _row("a", 1.0, threads=2)
    # Four rounds: near, changed (near before, far after), far, changed.
    row.probes = [60.0, 70.0, 400.0, 420.0, 60.0]
    assert row.round_states() == ["near", None, "far", None]
    row.samples = {"native": [1.0, 9.0, 2.0, 9.0], cnn.PEER: [2.0, 9.0, 2.0, 9.0]}
    assert row.ratio_in("near") == (0.5, 1) and row.ratio_in("far") == (1.0, 1)
    lines = cnn.by_state([row, _row("b", 0.5)])  # the 1-thread row has no probes: not listed
    assert "| a | 224x224 | 1 | 2 | 60-420 | 1 / 1 / 2 | 0.50 | 1.00 |" in lines
    assert not any(line.startswith("| b |") for line in lines)
    assert "- near state, 1 of 1 rows measured in it: every one <= 0.9" in lines
    assert "- far state, 1 of 1 rows measured in it: 1 above 0.9: a 224x224 b1 2t (1.00)" in lines
    assert cnn.by_state([_row("b", 0.5)]) == []


def test_shared_models_missing_are_skipped_with_a_reason(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cnn, "MODELS_DIR", tmp_path / "absent")
    cnn.main(["--quick", "--models", "yolov8n_nudenet.320n", "--out", str(tmp_path / "cnn.md")])
    assert "skipped: yolov8n_nudenet.320n:" in capsys.readouterr().out
    assert "yolov8n_nudenet.320n: " in (tmp_path / "cnn.md").read_text()


@needs_cc
def test_a_tiny_bench_run_writes_its_table(tmp_path):
    """With the NCHWc-off column where the tree has the switch, and one more native column
    set through both kinds of setting (neither changes what runs: an unused variable and the
    session's default)."""
    out = tmp_path / "cnn.md"
    cnn.main(["--quick", "--models", "mobilenet_v3_small", "--sizes", "64x64", "--repeats", "2", "--sample-ms", "1",
              "--native-variant", "native again", "env:SHAPESHIFT_CNN_BENCH_UNUSED=1", "session:profile=false",
              "--out", str(out)])
    text = out.read_text()
    natives = ["native"] + (["native NCHWc on", "native NCHWc off"] if cnn.nchwc_switch() else []) + ["native again"]
    head = " | ".join([f"{c} ms" for c in natives] + ["onnxruntime ms"] + [f"{c} / onnxruntime" for c in natives])
    assert f"| {head} |" in text
    row = next(line for line in text.splitlines() if line.startswith("| mobilenet_v3_small | 64x64 | 1 | 1 |"))
    diffs = [float(d.split()[0]) for d in row.split("|")[-2].split(" / ")]
    assert len(diffs) == len(natives) and max(diffs) < 1e-3  # each native column compared with onnxruntime
    assert "Machine:" in text and "Not measured:" in text


def test_nchwc_off_column_follows_the_switch():
    switch = cnn.nchwc_switch()
    variants = cnn.parse_args(["--quick"]).variants
    if switch is None:
        assert list(variants) == ["native"]
    else:
        assert variants["native NCHWc on"].env == {switch: "1"}
        assert variants["native NCHWc off"].env == {switch: "0"}
    assert list(cnn.parse_args(["--quick", "--no-nchwc-off"]).variants) == ["native"]


def test_native_variant_settings():
    label, variant = cnn.parse_variant(["off", "env:A=0", "session:x=false", "session:name=plain"])
    assert label == "off" and variant.env == {"A": "0"} and variant.options == {"x": False, "name": "plain"}
    for bad in (["off", "A=0"], ["off", "env:=1"], ["off", "cli:A=1"], ["native", "env:A=0"],
                ["native NCHWc off", "env:A=0"]):
        with pytest.raises(Exception, match="--native-variant"):
            cnn.parse_variant(bad)
    with pytest.raises(SystemExit):
        cnn.parse_args(["--native-variant", "off", "A"])
