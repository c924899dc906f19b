"""The pure half of bench/dietcode.py: the T grid, the held-out shapes, the summary
numbers, issue #5's targets, the markdown and the plot.

Nothing here tunes or times, so tests/test_bench_dietcode.py checks it in milliseconds.
Results are plain JSON-able dicts (what bench/dietcode.py collects per task):

task: {"task": {"kind": "dense", "k", "n", "batch", "threads"} or {"kind": "attention", "op", "batch",
"threads"}, "wall": {"dietcode",
"pad-max", "per-shape", "held-out": [s, ...]}, "trials": {...}, "sampled_ms", "held_out_ms",
"t_range": [lo, hi], "extrapolate_to" (how many T per-shape would tune: every T in
[lo, min(hi, 128)]),
"kernels", "spearman", "dietcode_ms" (the Ms dietcode sampled: none above its measurement cap),
"rows": [{"m", "t", "grid", "sampled", "held_out", "kernel",
"gflops": {column: GFLOPS}, "gflops_median": {column: GFLOPS}}]}; an attention task's "m"
is T (its tuner's dynamic value), and its rows have an "untuned" column too. "gflops" is
from each method's fastest sample, which the targets use; "gflops_median" from its median
sample, shown beside them (rows written before it was kept have none).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from machine import geomean  # noqa: E402

# Per-shape tuning is extrapolated to every T up to this (issue #5: "every T in [1, 128]").
EXTRAPOLATE_TO_T = 128

# (summary key, short name, what is compared, threshold): met when the value is >= the threshold.
TARGETS = (
    ("tuning_ratio", "tuning time ratio",
     "tuning wall time: per-shape for every T in [1, 128] (extrapolated) / dietcode for the whole range", 20.0),
    ("held_out_geomean", "vs per-shape, held out",
     "dispatcher / per-shape tuned GFLOPS, geomean over the held-out shapes", 0.95),
    ("blas_geomean", "vs OpenBLAS, geomean", "dispatcher / OpenBLAS GFLOPS, geomean over the T grid", 1.0),
    ("blas_min", "vs OpenBLAS, minimum", "dispatcher / OpenBLAS GFLOPS, minimum over the T grid", 0.8),
)

# One colour per method in every panel of the plot.
COLOURS = {"dispatcher": "C0", "pad-max": "C1", "numpy": "C2", "onnxruntime": "C3", "untuned": "C7"}

# BERT-base attention: 12 heads of 64; its two batched matmuls.
HEADS, HEAD_DIM = 12, 64
ATTENTION_OPS = {"qk": "Q K^T [T,64] x [64,T]", "pv": "P V [T,T] x [T,64]"}


# ---- shapes -----------------------------------------------------------------------------

def t_grid(lo: int, hi: int, dense_to: int = EXTRAPOLATE_TO_T, step: int = 8) -> list[int]:
    """Every T in [lo, dense_to], then every ``step``-th T after dense_to, and hi."""
    dense = range(lo, min(hi, dense_to) + 1)
    sparse = range(dense_to + step, hi + 1, step)
    return sorted(set(dense) | {t for t in sparse if t >= lo} | {hi})


def held_out_ms(sampled: Sequence[int], batch: int, count: int) -> list[int]:
    """``count`` M values (multiples of ``batch``: M = batch x T) that the tuner did not
    sample, the farthest from the samples: the midpoint of two consecutive sampled Ms,
    rounded to a multiple of batch, in ``count`` of the gaps spread evenly over the range."""
    candidates = []
    for m1, m2 in zip(sampled, sampled[1:]):
        m = batch * int(math.floor((m1 + m2) / (2 * batch) + 0.5))
        if m1 < m < m2:  # a gap narrower than batch has no multiple of it inside
            candidates.append(m)
    if len(candidates) <= count:
        return candidates
    picks = np.linspace(0, len(candidates) - 1, count).round().astype(int)
    return [candidates[i] for i in sorted(set(picks.tolist()))]


def extrapolate_count(lo: int, hi: int) -> int:
    """How many T per-shape tuning of every T in [lo, min(hi, 128)] would tune."""
    return max(0, min(hi, EXTRAPOLATE_TO_T) - lo + 1)


# ---- numbers ----------------------------------------------------------------------------

def _ratios(rows: Sequence[dict], num: str, den: str, field: str = "gflops") -> list[tuple[float, float]]:
    """(GFLOPS ratio, T) of the rows that have both columns."""
    return [(r[field][num] / r[field][den], r["t"]) for r in rows
            if num in r.get(field, {}) and den in r.get(field, {})]


def per_shape_seconds(res: dict) -> tuple[float, str]:
    """Per-shape tuning wall time per shape, and where it comes from.

    From the one-point tunings (the held-out shapes, each tuned alone from scratch: what
    tuning every T separately repeats), not from the run over the sampled shapes, whose
    kernel-set validation measures every chosen kernel at every sampled M, work that
    tuning each T alone does not do. Only those with T <= 128 where there are any: the
    target extrapolates to every T in [1, 128], and a shape costs more to tune the larger
    its M (at batch 16 the held-out shapes past T = 128 took up to 4x as long). All held-out
    shapes without one, and the sampled-shape run without any held-out shape.
    """
    wall = res["wall"]
    small = [w for m, w in zip(res["held_out_ms"], wall["held-out"])
             if m / res["task"]["batch"] <= EXTRAPOLATE_TO_T]
    if small:
        return sum(small) / len(small), f"mean of the {len(small)} one-point tunings with T <= {EXTRAPOLATE_TO_T}"
    if wall["held-out"]:
        return sum(wall["held-out"]) / len(wall["held-out"]), f"mean of the {len(wall['held-out'])} one-point tunings"
    return wall["per-shape"] / len(res["sampled_ms"]), "the sampled-shape run / its shapes (no held-out shapes)"


def dense_summary(res: dict) -> dict:
    rows = res["rows"]
    grid = [r for r in rows if r["grid"]]
    vs_blas = _ratios(grid, "dispatcher", "numpy")
    worst = min(vs_blas) if vs_blas else (math.nan, None)
    wall = res["wall"]
    per_shape_each, per_shape_source = per_shape_seconds(res)
    held = wall["held-out"]
    held_mean = sum(held) / len(held) if held else math.nan
    extrapolated = per_shape_each * res["extrapolate_to"]
    return {
        "dietcode_wall": wall["dietcode"], "pad_max_wall": wall["pad-max"], "per_shape_sampled_wall": wall["per-shape"],
        "per_shape_each": per_shape_each, "per_shape_source": per_shape_source,
        "per_shape_each_all_held_out": held_mean, "per_shape_held_out_count": len(held),
        "per_shape_extrapolated": extrapolated, "tuning_ratio": extrapolated / wall["dietcode"],
        "tuning_ratio_all_held_out": held_mean * res["extrapolate_to"] / wall["dietcode"],
        "held_out_geomean": geomean([x for x, _ in _ratios([r for r in rows if r["held_out"]], "dispatcher",
                                                           "per-shape")]),
        "sampled_geomean": geomean([x for x, _ in _ratios([r for r in rows if r["sampled"]], "dispatcher",
                                                          "per-shape")]),
        "blas_geomean": geomean([x for x, _ in vs_blas]), "blas_min": worst[0], "blas_min_t": worst[1],
        "ort_geomean": geomean([x for x, _ in _ratios(grid, "dispatcher", "onnxruntime")]),
        "pad_max_blas_geomean": geomean([x for x, _ in _ratios(grid, "pad-max", "numpy")]),
        "kernels": res["kernels"], "spearman": res["spearman"],
        **_median_summary(rows, grid),
    }


def _median_summary(rows: Sequence[dict], grid: Sequence[dict]) -> dict:
    """The OpenBLAS and held-out ratios again, from every method's median sample."""
    vs_blas = _ratios(grid, "dispatcher", "numpy", "gflops_median")
    held = _ratios([r for r in rows if r["held_out"]], "dispatcher", "per-shape", "gflops_median")
    worst = min(vs_blas) if vs_blas else (math.nan, None)
    return {"median_held_out_geomean": geomean([x for x, _ in held]),
            "median_blas_geomean": geomean([x for x, _ in vs_blas]), "median_blas_min": worst[0],
            "median_blas_min_t": worst[1]}


def evaluate_targets(summary: dict) -> list[tuple[str, float, float, bool]]:
    """(what, value, threshold, met) per target; a missing value (NaN) is not met."""
    return [(what, summary[key], threshold, bool(summary[key] >= threshold)) for key, _, what, threshold in TARGETS]


# ---- markdown ---------------------------------------------------------------------------

def task_label(task: dict) -> str:
    if task["kind"] == "dense":
        what = f"dense {task['k']}x{task['n']}"
    else:
        what = f"attention {ATTENTION_OPS[task['op']]} x {HEADS * task['batch']} heads"
    return f"{what}, batch {task['batch']}, {task['threads']} thread{'s' if task['threads'] > 1 else ''}"


def fmt_t(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return str(int(t)) if float(t).is_integer() else f"{t:.1f}"


def _g(row: dict, column: str) -> str:
    return f"{row['gflops'][column]:.1f}" if column in row["gflops"] else ""


def dense_section(res: dict) -> str:
    s = dense_summary(res)
    task = res["task"]
    rho = f"{s['spearman']:.2f}" if s["spearman"] is not None else "-"
    lo, hi = res["t_range"]
    size = f"M = {task['batch']} x T" if task["kind"] == "dense" else "Sizes follow T (M = T, and N or K = T)"
    untuned = "untuned" in res["rows"][0]["gflops"] if res["rows"] else False
    lines = [
        f"## {task_label(task)}", "",
        f"{size}. Trials: " + ", ".join(f"{k} {v}" for k, v in res["trials"].items()) + ".", "",
        "| measure | value |", "|---|---|",
        f"| tuning wall time, dietcode (whole range) | {s['dietcode_wall']:.0f} s |",
        f"| tuning wall time, pad-max | {s['pad_max_wall']:.0f} s |",
        f"| tuning wall time, per-shape on the {len(res['sampled_ms'])} sampled shapes (one run) | "
        f"{s['per_shape_sampled_wall']:.0f} s |",
        "| tuning wall time, per-shape on each held-out shape alone | "
        + (", ".join(f"{w:.0f}" for w in res["wall"]["held-out"]) or "-") + " s |",
        f"| per-shape wall time per shape ({s['per_shape_source']}) | {s['per_shape_each']:.1f} s |",
        f"| per-shape for every T in [{lo}, {min(hi, EXTRAPOLATE_TO_T)}] ({res['extrapolate_to']} shapes), "
        f"**extrapolated**: time per shape x {res['extrapolate_to']} | {s['per_shape_extrapolated']:.0f} s |",
        f"| ratio extrapolated per-shape / dietcode | {s['tuning_ratio']:.1f}x |",
        f"| the same from all {s['per_shape_held_out_count']} held-out shapes (larger M included): time per shape; "
        f"ratio | {s['per_shape_each_all_held_out']:.1f} s; {s['tuning_ratio_all_held_out']:.1f}x |",
        f"| dispatcher / per-shape GFLOPS, geomean, held-out shapes (M = {', '.join(map(str, res['held_out_ms']))}) "
        f"| {s['held_out_geomean']:.3f} |",
        f"| dispatcher / per-shape GFLOPS, geomean, sampled shapes | {s['sampled_geomean']:.3f} |",
        f"| dispatcher / OpenBLAS GFLOPS, geomean over the T grid | {s['blas_geomean']:.3f} |",
        f"| dispatcher / OpenBLAS GFLOPS, minimum over the T grid | {s['blas_min']:.3f} "
        f"at T = {fmt_t(s['blas_min_t'])} |",
        f"| dispatcher / onnxruntime GFLOPS, geomean over the T grid | {s['ort_geomean']:.3f} |",
        f"| pad-max / OpenBLAS GFLOPS, geomean over the T grid | {s['pad_max_blas_geomean']:.3f} |",
        "| the same from every method's median sample, not its fastest: vs per-shape held out; vs OpenBLAS "
        f"geomean; vs OpenBLAS minimum | {s['median_held_out_geomean']:.3f}; {s['median_blas_geomean']:.3f}; "
        f"{s['median_blas_min']:.3f} at T = {fmt_t(s['median_blas_min_t'])} |",
        f"| kernels in the dispatcher | {s['kernels']} |",
        f"| Ms dietcode sampled (it measures none above the last) | "
        f"{', '.join(map(str, res.get('dietcode_ms', res['sampled_ms'])))} |",
        f"| cost-model Spearman (dietcode, held-out measurements) | {rho} |", "",
    ]
    lines += [f"- **{'met' if met else 'NOT met'}**: {what} = {value:.3g} (target >= {threshold:g})"
              for what, value, threshold, met in evaluate_targets(s)]
    extra = " untuned default |" if untuned else ""
    lines += ["", "| T | M | dispatcher GFLOPS (kernel) | pad-max | per-shape tuned | numpy (OpenBLAS) | onnxruntime "
                  f"|{extra} dispatcher / OpenBLAS |", "|---|---|---|---|---|---|---|" + ("---|" if untuned else "")
              + "---|"]
    for r in res["rows"]:
        mark = " (held out)" if r["held_out"] else " (sampled)" if r["sampled"] else ""
        ratio = r["gflops"]["dispatcher"] / r["gflops"]["numpy"]
        cell = f" {_g(r, 'untuned')} |" if untuned else ""
        lines.append(f"| {fmt_t(r['t'])}{mark} | {r['m']} | {_g(r, 'dispatcher')} ({r['kernel']}) | {_g(r, 'pad-max')} "
                     f"| {_g(r, 'per-shape')} | {_g(r, 'numpy')} | {_g(r, 'onnxruntime')} |{cell} {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def targets_section(results: Sequence[dict]) -> str:
    if not results:
        return ""
    heads = [f"{short} (>= {threshold:g})" for _, short, _, threshold in TARGETS]
    lines = ["## Targets (issue #5)", "", "| task | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    all_met = True
    for res in results:
        s = dense_summary(res)
        cells = []
        for (key, *_), (_, value, _, met) in zip(TARGETS, evaluate_targets(s)):
            where = f" at T = {fmt_t(s['blas_min_t'])}" if key == "blas_min" else ""
            cells.append(f"{value:.3g}{where} {'met' if met else '**NOT met**'}")
            all_met &= met
        lines.append(f"| {task_label(res['task'])} | " + " | ".join(cells) + " |")
    lines += ["", f"All targets met in every task: **{'yes' if all_met else 'no'}**.", ""]
    return "\n".join(lines) + "\n"


def render(meta: dict, results: Sequence[dict], png: Optional[str], partial: bool = False) -> str:
    title = "# DietCode-style tuning on BERT-base GEMMs (issue #5)"
    if partial:
        title += " — PARTIAL, the run has not finished"
    after = f"{meta['load_after']:.1f}" if meta.get("load_after") is not None else "-"
    head = [title, "",
            f"`{meta['command']}` on {meta['machine']}; Python {meta['python']}, numpy {meta['numpy']} "
            f"({meta['blas']}), onnxruntime {meta['onnxruntime']}. 1-minute load average {meta['load_before']:.1f} "
            f"before the run, {after} after it. Started {meta['started']}, took {meta.get('took', '-')}.", "",
            meta["method"], ""]
    body = [targets_section(results)] + [dense_section(r) for r in results]
    if png:
        body.append(f"![GFLOPS against T]({png})\n")
    return "\n".join(head) + "\n" + "\n".join(body)


# ---- plot ---------------------------------------------------------------------------------

def plot(results: Sequence[dict], path: Path) -> bool:
    """Draw the GFLOPS plot into ``path``; False (with a message) without matplotlib."""
    plt = machine.pyplot()
    if plt is None:
        return False

    panels = []  # (title, {label: (ts, gflops)}, {label: (ts, gflops)} drawn as markers)
    for res in results:
        rows = res["rows"]
        grid = [r for r in rows if r["grid"]]
        columns = [c for c in ("dispatcher", "pad-max", "numpy", "onnxruntime", "untuned")
                   if grid and c in grid[0]["gflops"]]
        lines = {c: ([r["t"] for r in grid], [r["gflops"][c] for r in grid]) for c in columns}
        tuned = [r for r in rows if "per-shape" in r["gflops"]]
        marks = {"per-shape tuned": ([r["t"] for r in tuned], [r["gflops"]["per-shape"] for r in tuned])}
        panels.append((task_label(res["task"]), lines, marks))
    if not panels:
        return False
    cols = min(2, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(7 * cols, 4 * rows_n), squeeze=False)
    for ax, (title, lines, marks) in zip(axes.flat, panels):
        for label, (ts, gf) in lines.items():
            ax.plot(ts, gf, label=label, linewidth=1.2, color=COLOURS.get(label))
        for label, (ts, gf) in marks.items():
            ax.plot(ts, gf, "kx", label=label, markersize=6)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("T")
        ax.set_ylabel("GFLOPS")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def write_atomic(path: Path, text: str) -> None:
    """A reader (or a killed run) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
