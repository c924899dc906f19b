"""bench/dietcode_report.py: the T grid, the held-out shapes, the summary numbers and issue
#5's targets, as pure functions on made-up results (no tuning, no timing)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import dietcode_report as report  # noqa: E402


def test_grid_is_every_t_to_dense_to_then_every_step_th():
    grid = report.t_grid(1, 512)
    assert grid[:128] == list(range(1, 129))
    assert grid[128:] == list(range(136, 513, 8))
    assert len(grid) == 176
    assert report.t_grid(1, 64, dense_to=16, step=8) == list(range(1, 17)) + [24, 32, 40, 48, 56, 64]
    assert report.t_grid(5, 30, dense_to=10, step=7)[-1] == 30  # hi always timed
    assert report.t_grid(3, 3) == [3]


@pytest.mark.parametrize("batch", [1, 16])
def test_held_out_shapes_are_midpoints_not_sampled_multiples_of_batch(batch):
    sampled = [1 * batch] + [round(x) for x in [batch + i * (511 * batch) / 9 for i in range(1, 10)]]
    held = report.held_out_ms(sampled, batch, 8)
    assert len(held) == 8 and held == sorted(held)
    assert all(m % batch == 0 and m not in sampled for m in held)
    gaps = list(zip(sampled, sampled[1:]))
    # each held-out shape lies in its own gap, near its middle
    inside = [next(i for i, (a, b) in enumerate(gaps) if a < m < b) for m in held]
    assert len(set(inside)) == 8
    for m, i in zip(held, inside):
        a, b = gaps[i]
        assert abs(m - (a + b) / 2) <= batch / 2
    assert report.held_out_ms(sampled, batch, 8) == held  # deterministic


def test_held_out_shapes_in_narrow_or_tiny_ranges():
    assert report.held_out_ms([1, 8, 15, 22], 1, 8) == [5, 12, 19]  # fewer gaps than asked: all of them
    assert report.held_out_ms([1, 2, 3], 1, 4) == []  # no M between consecutive samples
    assert report.held_out_ms([7], 1, 8) == []


def _result(walls=(100.0, 50.0, 400.0, [40.0, 40.0]), held=(1.0, 0.9), blas=(1.2, 0.85, 1.1)) -> dict:
    rows = [{"m": t, "t": t, "grid": True, "sampled": False, "held_out": False, "kernel": 0,
             "gflops": {"dispatcher": r * 50, "numpy": 50.0, "onnxruntime": 60.0, "pad-max": 40.0}}
            for t, r in zip((1, 2, 3), blas)]
    rows += [{"m": 10 + i, "t": 10 + i, "grid": False, "sampled": False, "held_out": True, "kernel": 1,
              "gflops": {"dispatcher": r * 70, "per-shape": 70.0, "numpy": 60.0, "onnxruntime": 60.0, "pad-max": 40.0}}
             for i, r in enumerate(held)]
    diet, pad, per, held_walls = walls
    return {"task": {"kind": "dense", "k": 768, "n": 768, "batch": 1, "threads": 1}, "rows": rows,
            "sampled_ms": list(range(8)), "held_out_ms": [10, 11], "t_range": [1, 512],
            "extrapolate_to": 128,
            "wall": {"dietcode": diet, "pad-max": pad, "per-shape": per, "held-out": list(held_walls)},
            "trials": {"dietcode": 32}, "kernels": 2, "spearman": 0.5}


def test_summary_extrapolates_the_one_point_tunings_time_per_shape():
    s = report.dense_summary(_result(walls=(100.0, 50.0, 400.0, [30.0, 50.0])))
    assert s["per_shape_each"] == pytest.approx(40.0)  # the held-out tunings, not the sampled run
    assert s["per_shape_extrapolated"] == pytest.approx(40 * 128)
    assert s["tuning_ratio"] == pytest.approx(40 * 128 / 100)
    assert s["tuning_ratio_all_held_out"] == pytest.approx(40 * 128 / 100)  # both held-out T <= 128


def test_the_tuning_ratio_extrapolates_from_the_held_out_shapes_with_t_up_to_128():
    # At batch 16, T = 10 and 11 are M = 160 and 176 (T <= 128), T = 300 is M = 4800: it cost
    # more to tune, and per-shape tuning of every T <= 128 never tunes such an M.
    res = _result(walls=(100.0, 50.0, 400.0, [30.0, 50.0, 400.0]))
    res["task"]["batch"] = 16
    res["held_out_ms"] = [160, 176, 4800]
    s = report.dense_summary(res)
    assert s["per_shape_each"] == pytest.approx(40.0) and "T <= 128" in s["per_shape_source"]
    assert s["tuning_ratio"] == pytest.approx(40 * 128 / 100)
    assert s["tuning_ratio_all_held_out"] == pytest.approx(160 * 128 / 100)
    res["held_out_ms"] = [4800, 5600, 6400]  # none with T <= 128: all of them
    assert report.dense_summary(res)["per_shape_each"] == pytest.approx(160.0)
    assert s["held_out_geomean"] == pytest.approx(math.sqrt(0.9))
    assert s["blas_geomean"] == pytest.approx((1.2 * 0.85 * 1.1) ** (1 / 3))
    assert (s["blas_min"], s["blas_min_t"]) == (pytest.approx(0.85), 2)
    assert math.isnan(s["sampled_geomean"])  # no sampled rows here


def test_summary_without_held_out_shapes_falls_back_to_the_sampled_run():
    res = _result(walls=(100.0, 50.0, 400.0, []))
    res["held_out_ms"] = []
    assert report.dense_summary(res)["per_shape_each"] == pytest.approx(400 / 8)


def test_targets_are_marked_from_the_numbers():
    met = [m for *_, m in report.evaluate_targets(report.dense_summary(_result()))]
    assert met == [True, False, True, True]  # held-out geomean sqrt(0.9) < 0.95
    slow_dietcode = report.dense_summary(_result(walls=(400.0, 50.0, 400.0, [40.0, 40.0])))
    assert [m for *_, m in report.evaluate_targets(slow_dietcode)][0] is False  # 12.8x < 20x
    dip = report.dense_summary(_result(held=(1.0, 1.0), blas=(1.5, 0.79, 1.5)))
    assert [m for *_, m in report.evaluate_targets(dip)] == [True, True, True, False]


def test_render_marks_targets_and_lists_every_row():
    meta = {"command": "python bench/dietcode.py --quick", "machine": "x", "python": "3", "numpy": "2",
            "blas": "openblas", "onnxruntime": "1", "load_before": 0.5, "started": "now", "method": "How."}
    text = report.render(meta, [_result()], "dietcode.png")
    assert "**NOT met**" in text and "All targets met in every task: **no**" in text
    assert "extrapolated" in text and "![GFLOPS against T](dietcode.png)" in text
    assert text.count("(held out) |") == 2


def test_a_wrong_result_fails_loudly():
    np = pytest.importorskip("numpy")
    import dietcode_timing as timing

    ref, wrong = np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)
    wrong[1, 2] = 2.0
    methods = {"numpy": timing.Method(lambda calls: 1e-6, ref), "dispatcher": timing.Method(lambda calls: 1e-6, wrong)}
    with pytest.raises(AssertionError, match="dispatcher at M=3 differs from numpy"):
        timing.sample_point(methods, 4, 3, 0.001, "M=3")
    methods["dispatcher"] = timing.Method(lambda calls: 2e-6, ref.copy())
    expected = {"numpy": 1e-6, "dispatcher": 2e-6}
    assert timing.summarize(timing.sample_point(methods, 4, 3, 0.001, "M=3")) == (expected, expected)


def test_a_point_keeps_the_fastest_and_the_median_sample():
    np = pytest.importorskip("numpy")
    import dietcode_timing as timing

    # Two warm-up calls (the check, the calibration), then 5 interleaved samples.
    samples = iter([1e-6, 1e-6, 5e-6, 2e-6, 9e-6, 3e-6, 4e-6])
    ref = np.ones((2, 2), np.float32)
    methods = {"numpy": timing.Method(lambda calls: 1e-6, ref),
               "dispatcher": timing.Method(lambda calls: next(samples), ref.copy())}
    fastest, median = timing.summarize(timing.sample_point(methods, 4, 5, 0.001, "M=2"))
    assert fastest == {"numpy": 1e-6, "dispatcher": 2e-6}
    assert median == {"numpy": 1e-6, "dispatcher": 4e-6}


def test_summary_gives_the_median_sample_ratios_too():
    res = _result()
    for row in res["rows"]:
        row["gflops_median"] = dict(row["gflops"], dispatcher=row["gflops"]["dispatcher"] / 2)
    s = report.dense_summary(res)
    assert s["median_blas_geomean"] == pytest.approx(s["blas_geomean"] / 2)
    assert s["median_blas_min"] == pytest.approx(0.425) and s["median_blas_min_t"] == 2
    assert s["median_held_out_geomean"] == pytest.approx(s["held_out_geomean"] / 2)
    assert math.isnan(report.dense_summary(_result())["median_blas_geomean"])  # rows without medians


def test_attention_task_renders_with_its_untuned_column():
    res = _result()
    res["task"] = {"kind": "attention", "op": "pv", "batch": 1, "threads": 1}
    for row in res["rows"]:
        row["gflops"]["untuned"] = 30.0
    meta = {"command": "c", "machine": "x", "python": "3", "numpy": "2", "blas": "openblas", "onnxruntime": "1",
            "load_before": 0.5, "started": "now", "method": "How."}
    text = report.render(meta, [res], None)
    assert "attention P V [T,T] x [T,64] x 12 heads, batch 1, 1 thread" in text
    assert "untuned default |" in text and "| 30.0 |" in text


def test_attention_workloads_address_contiguous_heads():
    np = pytest.importorskip("numpy")
    import dietcode

    for op, (a_shape, b_shape) in {"qk": ((24, 5, 64), (24, 64, 5)), "pv": ((24, 5, 5), (24, 5, 64))}.items():
        w = dietcode.attention_workload(op, 2, 1, 512)
        m, k, n, batch = w.shape(5)
        assert (batch, m, k) == a_shape and (batch, k, n) == b_shape
        st = w.strides(5)
        for strides, shape in ((st["a"], a_shape), (st["b"], b_shape), ([*st["c"], 1], (batch, m, n))):
            assert [s * 4 for s in strides] == list(np.empty(shape, np.float32).strides)


def test_passes_alternate_direction_and_pool_the_samples():
    import dietcode_timing as timing

    seen = []

    def sample_at(i, point):
        seen.append(i)
        return {"ours": [float(len(seen))]}

    samples = timing.run_passes([{"m": 1}, {"m": 2}, {"m": 3}], sample_at, 2, lambda p: f"M={p['m']}")
    assert seen == [0, 1, 2, 2, 1, 0]
    assert samples == [{"ours": [1.0, 6.0]}, {"ours": [2.0, 5.0]}, {"ours": [3.0, 4.0]}]
    assert timing.summarize(samples[0]) == ({"ours": 1.0}, {"ours": 3.5})


def test_the_saved_results_render_the_same_report_again(tmp_path, monkeypatch):
    """A run saves its raw results beside the report; ``--render`` writes the report again
    from them, measuring nothing (a partial run keeps its own .partial files until the end)."""
    import argparse

    import numpy as np

    import dietcode

    monkeypatch.setattr(report, "plot", lambda results, png: False)  # no matplotlib needed
    meta = {"command": "python bench/dietcode.py", "python": "3", "machine": "m", "numpy": "2",
            "onnxruntime": "1", "load_before": 0.5, "started": "2026-11-30T00:00:00", "method": "how"}
    res = _result()
    res["spearman"] = np.float64(0.5)  # a NumPy scalar saves as a number
    first = tmp_path / "first.md"
    dietcode.write(argparse.Namespace(output=first), meta, [res], final=False)
    assert first.with_suffix(".partial.json").exists() and not first.exists()
    dietcode.write(argparse.Namespace(output=first), dict(meta, took="1 h"), [res], final=True)
    assert not first.with_suffix(".partial.json").exists()
    again = tmp_path / "again.md"
    monkeypatch.setattr(sys, "argv", ["dietcode.py", "--render", str(first.with_suffix(".json")),
                                      "--output", str(again)])
    dietcode.main()
    assert again.read_text() == first.read_text() and "| tuning wall time, dietcode" in again.read_text()
