"""bench/conv_profile.py: conv classes named from logical shapes the same way for both tools,
every conv of a net found in both profiles, and a tiny run writing its table and plot. No
timing is asserted."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import conv_profile  # noqa: E402

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")


@pytest.mark.parametrize("x, w, y, key, flops", [
    ([1, 256, 14, 14], [1024, 256, 1, 1], [1, 1024, 14, 14], "256->1024 k1x1 s1 14x14", 2 * 1024 * 196 * 256),
    ([1, 3, 224, 224], [64, 3, 7, 7], [1, 64, 112, 112], "3->64 k7x7 s2 112x112", 2 * 64 * 112 * 112 * 3 * 49),
    ([1, 96, 15, 15], [96, 1, 5, 5], [1, 96, 8, 8], "96->96 k5x5 s2 dw 8x8", 2 * 96 * 64 * 25),
    ([1, 64, 9, 9], [128, 16, 3, 3], [1, 128, 9, 9], "64->128 k3x3 s1 g4 9x9", 2 * 128 * 81 * 16 * 9),
])
def test_conv_class_and_flops(x, w, y, key, flops):
    assert conv_profile.conv_class(x, w, y) == key
    assert conv_profile.class_flops(key, 1) == flops
    assert conv_profile.class_flops(key, 3) == 3 * flops


@needs_cc
def test_every_conv_is_found_in_both_profiles_and_the_table_is_written(monkeypatch, tmp_path,
                                                                        capsys):
    workdir = str(tmp_path)
    native = conv_profile.worker("native", "mobilenet_v3_small", 1, (64, 64), 1, 2, workdir, {})
    peer = conv_profile.worker("onnxruntime", "mobilenet_v3_small", 1, (64, 64), 1, 2, workdir, {})
    classes = {k: v[1] for k, v in native.items() if k not in (conv_profile.OTHER, "total")}
    # MobileNetV3-small has 52 convs; the same classes, each with as many convs, in both profiles.
    assert sum(classes.values()) == 52
    assert classes == {k: v[1] for k, v in peer.items() if k not in (conv_profile.OTHER, "total")}
    assert "16->16 k3x3 s2 dw 16x16" in classes
    assert all(v[0] > 0 for v in native.values())
    out = tmp_path / "profile.md"
    assert conv_profile.main(["--models", "mobilenet_v3_small", "--size", "64x64", "--runs", "2", "--rounds", "1",
                              "--native-variant", "nchwc-off", "env:SHAPESHIFT_NCHWC=0", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| **total** |" in text and "nchwc-off us" in text and "16->16 k3x3 s2 dw 16x16" in text
    # The plot needs the bench extra's matplotlib; without it the run says so and writes none.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in capsys.readouterr().out
        assert not out.with_suffix(".png").exists()
    else:
        assert out.with_suffix(".png").stat().st_size > 0
