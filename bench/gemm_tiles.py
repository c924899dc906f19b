"""Register tiles of the dense GEMM on this CPU: the measurement behind a microarchitecture
class's untuned tile (shapeshift/target/microarch.py, ``chosen_by``).

    python bench/gemm_tiles.py [--tiles 6x16 6x32 8x32 ...] [--ms 16 128 512] [--rounds 9]
                               [--sample-ms 20] [--output bench/results/gemm_tiles_<class>.md]

Every tile runs the prepacked dense GEMM (A [M, K] x packed weight [K, N] + bias) on the
four BERT-base weight shapes of bench/gemm.py, in zmm (``MRxNR``) or ymm (``MRxNRy``), its
kc and mc from codegen/defaults.py's cache rule (the class's own blocking where the tile is
the class's), against NumPy (OpenBLAS) with ``out=`` and the bias added in place. One
thread for both: ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` are set to 1 before
anything loads (the kernel is timed by a C loop, NumPy by a Python one). Per shape the
candidates are sampled in turn, ``--rounds`` times, each sample enough calls for
``--sample-ms``; the table keeps each one's best sample (interference only adds time) in
GFLOPS, and the geomean of NumPy's time over each tile's.
"""

from __future__ import annotations

import os
import sys

os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402

os.environ.update(machine.peer_env(1))  # OpenBLAS's own kernel for this CPU, before NumPy loads

import argparse  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402

import gemm as gemm_bench  # noqa: E402
import numpy as np  # noqa: E402

from shapeshift.codegen.defaults import tile_schedule  # noqa: E402
from shapeshift.target import host_target  # noqa: E402


def schedule_for(tile: str, target):
    """The untuned schedule of tile ``MRxNR`` (zmm) or ``MRxNRy`` (ymm): codegen/defaults.py's
    tile_schedule, the class's blocking for its own tile, else the cache rule's kc and mc."""
    lanes = 8 if tile.endswith("y") else 16
    mr, nr = (int(v) for v in tile.rstrip("y").split("x"))
    return tile_schedule(target, mr, nr, lanes)


def label(s) -> str:
    return f"{s.mr}x{s.nr}{'' if s.lanes == 16 else ' ymm'} kc {s.kc} mc {s.mc}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 8x16 led on an AMD Zen 4 (bench/results/gemm_tiles_amd-zen4.md) where it had not been swept before.
    parser.add_argument("--tiles", nargs="+", default=["6x16", "8x16", "6x32", "8x32", "12x32", "14x32", "8x48",
                                                       "6x64", "4x64"])
    parser.add_argument("--ms", type=int, nargs="+", default=[16, 128, 512])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    target = host_target()
    if not target.avx512 and any(not t.endswith("y") for t in args.tiles):
        args.tiles = [t if t.endswith("y") else t + "y" for t in args.tiles]  # no zmm here
    schedules = [schedule_for(t, target) for t in args.tiles]
    cache = Path(tempfile.mkdtemp(prefix="gemm_tiles_"))
    libs = [gemm_bench._load_library(cache, s) for s in schedules]
    for lib in libs:
        lib.ss_set_num_threads(1)
    names = [label(s) for s in schedules]
    lines, ratios = [], {n: [] for n in names}
    for m in args.ms:
        for k, n in gemm_bench.DENSE:
            samplers, checks = {}, []
            for name, lib in zip(names, libs):
                candidates, flops, check = gemm_bench._dense_candidates(lib, np, m, k, n)
                samplers[name] = candidates["ss_gemm_prepacked"]
                candidates["ss_gemm"](1)  # so that check() finds both of its results written
                samplers.setdefault("numpy", candidates["numpy"])
                checks.append(check)
            best = {name: math.inf for name in samplers}
            calls = {name: max(1, int(args.sample_ms / 1e3 / max(s(1), 1e-7))) for name, s in samplers.items()}
            for check in checks:
                check()  # after a call of each: every tile's result against float64 NumPy
            for _ in range(args.rounds):
                for name, sample in samplers.items():
                    best[name] = min(best[name], sample(calls[name]))
            line = f"M={m:4d} {k}x{n}: numpy {flops / best['numpy'] / 1e9:6.1f}" + "".join(
                f" | {name} {flops / best[name] / 1e9:6.1f}" for name in names)
            print(line, flush=True)
            lines.append(line)
            for name in names:
                ratios[name].append(best["numpy"] / best[name])
    summary = [f"- {name}: {math.exp(sum(map(math.log, r)) / len(r)):.3f}x NumPy's speed geomean (min {min(r):.2f})"
               for name, r in ratios.items()]
    print("\n".join(summary))
    klass = target.microarch.name
    out = args.output or HERE / "results" / f"gemm_tiles_{klass}.md"
    text = "\n".join([
        f"# GEMM register tiles on this {klass} CPU", "",
        f"`python bench/gemm_tiles.py --tiles {' '.join(args.tiles)} --ms {' '.join(map(str, args.ms))}`", "",
        machine.describe(), machine.describe_peer(), "",
        "Prepacked dense GEMM with bias, 1 thread, GFLOPS of each one's best of "
        f"{args.rounds} interleaved samples of about {args.sample_ms:g} ms (the class's current tile: "
        f"{target.microarch.tile[0]}x{target.microarch.tile[1]}).", "",
        "```", *lines, "```", "", "Geomean over the rows of NumPy's time / the tile's:", "", *summary, ""])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
