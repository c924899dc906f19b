"""``shapeshift tune --plot FILE.png``: GFLOPS against M for each chosen kernel and for the
dispatcher, one panel per tuned GEMM (matplotlib, only imported when asked for).

Kernel lines are measured at every sampled M (the selection measures each chosen kernel
there); the dispatcher's points are the measured time of the kernel its tree picks at each
sampled M, so where the tree picks well they sit on the top line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

from ..errors import ShapeshiftError
from ..files import publish
from . import dispatch
from .search import TuneResult, tree_point


def plot_results(results: Sequence[tuple[str, TuneResult]], path: Path) -> None:
    """One panel per (title, result); written to a temporary file, then moved to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ShapeshiftError("--plot needs matplotlib (pip install -e '.[tune]')") from None
    fig, axes = plt.subplots(len(results), 1, figsize=(7, 3.2 * len(results)), squeeze=False)
    for ax, (title, r) in zip(axes[:, 0], results):
        w = r.workload
        for i, times in enumerate(r.kernel_seconds):
            ms = sorted(times)
            ax.plot(ms, [w.flops(m) / times[m] / 1e9 for m in ms], marker=".", linewidth=1,
                    label=f"kernel {i}: mr={r.kernels[i].mr} nr={r.kernels[i].nr} small_m={r.kernels[i].small_m}")
        ms = [m for m in r.sampled_ms if m in r.seconds]
        ax.plot(ms, [r.gflops(m) for m in ms], "k*", markersize=9, label="dispatcher (tree's pick)")
        for i in range(len(r.kernels)):
            picked = [m for m in ms if dispatch.choose(r.tree, tree_point(w, m)) == i]
            if picked:
                ax.annotate(f"k{i}", (picked[0], r.gflops(picked[0])), textcoords="offset points", xytext=(0, 6),
                            fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("M" if getattr(w, "ordered", True) else "instance (tune/gemm_group.py)")
        ax.set_ylabel("GFLOPS")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=str(Path(path).resolve().parent))
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        publish(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
