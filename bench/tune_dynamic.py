"""A CNN of dynamic image size tuned once over the whole range of sizes against tuning it
at each size (issue 28's dynamic H and W line).

    python bench/tune_dynamic.py [--model ../shared/models/ppocr_det.det_infer.onnx]
                                 [--range 96:960] [--trials 6] [--threads 1] [--held-out 8]
                                 [--part all|range|sizes|measure] [--sizes I:J]
                                 [--runs 10] [--rounds 3] [--workdir DIR (default: TMP/shapeshift_tune_dynamic)]
                                 [--output FILE.md]

``range``: one ``shapeshift tune MODEL --dynamic h=LO:HI --dynamic w=LO:HI`` run (the
model's height and width dims, its batch 1), which samples image sizes and tunes each conv
class over its instances at them (docs/tune.md: dynamic image sizes), into
``WORKDIR/range.db``. ``sizes``: ``--held-out`` sizes (multiples of 32 in the range, none a
sampled size, fixed by a seed) each tuned alone with the same ``--trials``, its dims
declared with that one value (``WORKDIR/size_HxW.db``); ``--sizes I:J`` tunes held-out sizes
I..J-1 only, so the part can run in pieces. ``measure``: at every held-out size, latency of
the session with the range's records (one session over the range: the dispatchers choose by
each call's sizes), of that size's own session with its records, of the untuned session and
of onnxruntime, in rounds that alternate their order (each tool's best round median), every
output checked against onnxruntime; a table and a plot into ``--output``. Wall times of the
tuning runs are kept in ``WORKDIR/wall.json`` and reported. The parts read and write only
WORKDIR, so a session can run one and the next the others.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import machine  # noqa: E402  (bench/machine.py)

os.environ.update(machine.peer_env(1))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from shapeshift import InferenceSession  # noqa: E402
from shapeshift.target import host_target  # noqa: E402
from shapeshift.tune.extract import sampled_bindings  # noqa: E402

DEFAULT_MODEL = HERE.parent.parent / "shared" / "models" / "ppocr_det.det_infer.onnx"
TOOLS = ("native, range records", "native, per-size records", "native default", "onnxruntime")


def model_dims(model: str) -> tuple[str, str, str, str]:
    """(input name, batch dim, height dim, width dim) of an NCHW image input."""
    inp = onnx.load(model, load_external_data=False).graph.input[0]
    dims = [d.dim_param or str(d.dim_value) for d in inp.type.tensor_type.shape.dim]
    if len(dims) != 4 or not all(dims[i] and not dims[i].isdigit() for i in (0, 2, 3)):
        raise SystemExit(f"{model}: input {inp.name} is not [batch, C, height, width] with named dims: {dims}")
    return inp.name, dims[0], dims[2], dims[3]


def held_out(lo: int, hi: int, count: int, taken: set) -> list[tuple[int, int]]:
    """``count`` (h, w) pairs of multiples of 32 in [lo, hi], none of them in ``taken``, the
    range's ends among the heights (a seed fixes the rest)."""
    values = list(range(-(-lo // 32) * 32, hi + 1, 32))
    rng = np.random.default_rng(28)
    picks: list[tuple[int, int]] = []
    while len(picks) < count:
        h = values[0] if not picks else values[-1] if len(picks) == 1 else int(rng.choice(values))
        pair = (h, int(rng.choice(values)))
        if pair not in taken and pair not in picks:
            picks.append(pair)
    return picks


def tune(model: str, db: Path, declared: dict, args) -> float:
    """Wall seconds of one ``shapeshift tune`` run into a fresh database."""
    for stale in (db, db.with_name(db.name + ".cache")):
        if stale.is_file():
            stale.unlink()
    flags = [f for name, (lo, hi) in declared.items() for f in ("--dynamic", f"{name}={lo}:{hi}")]
    cmd = [sys.executable, "-m", "shapeshift.cli.main", "tune", model, *flags, "--trials", str(args.trials),
           "--threads", str(args.threads), "--db", str(db)]
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def _median_ms(session, feed: dict, runs: int) -> float:
    for _ in range(2):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def measure(model: str, names, sizes, workdir: Path, args) -> dict:
    """{(h, w): {tool: ms}}."""
    import onnxruntime as ort

    inp, b, hd, wd = names
    lo, hi = args.lo, args.hi
    ranged = {b: (1, 1), hd: (lo, hi), wd: (lo, hi)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    peer = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    shared = {"native, range records": InferenceSession(model, ranged, backend="native", num_threads=args.threads,
                                                        tuning_db=str(workdir / "range.db")),
              "native default": InferenceSession(model, ranged, backend="native", num_threads=args.threads)}
    out = {}
    for h, w in sizes:
        own = InferenceSession(model, {b: (1, 1), hd: (h, h), wd: (w, w)}, backend="native",
                               num_threads=args.threads, tuning_db=str(workdir / f"size_{h}x{w}.db"))
        sessions = {**shared, "native, per-size records": own, "onnxruntime": peer}
        feed = {inp: np.random.default_rng(h * 1000 + w).standard_normal((1, 3, h, w)).astype(np.float32)}
        ref = peer.run(None, feed)[0]
        for tool, s in sessions.items():
            got = s.run(None, feed)[0]
            if not np.allclose(got, ref, rtol=1e-3, atol=1e-3):
                raise SystemExit(f"{tool} at {h}x{w}: output differs from onnxruntime by {np.abs(got - ref).max():.3g}")
        best = {tool: float("inf") for tool in sessions}
        for r in range(args.rounds):
            for tool in (list(sessions) if r % 2 == 0 else list(reversed(sessions))):
                best[tool] = min(best[tool], _median_ms(sessions[tool], feed, args.runs))
        out[(h, w)] = best
        print(f"{h}x{w}: " + ", ".join(f"{t} {ms:.2f} ms" for t, ms in best.items()), flush=True)
    return out


def report(model: str, sizes, ms: dict, wall: dict, args) -> str:
    geo = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
    lines = [f"# {Path(model).name}: tuned once over {args.lo}..{args.hi} against per size "
             f"({host_target().microarch.name}, {args.threads} thread(s))", "", machine.describe(), "",
             f"Command: `python bench/tune_dynamic.py --model {model} --range {args.lo}:{args.hi} --trials {args.trials} "
             f"--threads {args.threads} --held-out {args.held_out} --runs {args.runs} --rounds {args.rounds}`; "
             f"batch 1; convs measured cold (the default). Held-out sizes: multiples of 32 in the range, none a "
             f"sampled size of the range's tuning.", "",
             f"Tuning wall time: range {wall.get('range', float('nan')):.0f} s (one run); per size "
             + ", ".join(f"{k.removeprefix('size_')} {v:.0f} s" for k, v in wall.items() if k.startswith("size_"))
             + ".", "",
             "| size | range records ms | per-size records ms | default ms | onnxruntime ms | per-size / range "
             "(>= 0.95 wanted) | range / onnxruntime (<= 0.85 wanted) |", "|---|---|---|---|---|---|---|"]
    ratios, vs_peer = [], []
    for h, w in sizes:
        t = ms[(h, w)]
        r = t["native, per-size records"] / t["native, range records"]
        p = t["native, range records"] / t["onnxruntime"]
        ratios.append(r)
        vs_peer.append(p)
        lines.append(f"| {h}x{w} | {t['native, range records']:.2f} | {t['native, per-size records']:.2f} | "
                     f"{t['native default']:.2f} | {t['onnxruntime']:.2f} | {r:.3f} | {p:.3f} |")
    lines += ["", f"per-size / range: min {min(ratios):.3f}, geomean {geo(ratios):.3f}; range / onnxruntime: max "
              f"{max(vs_peer):.3f}, geomean {geo(vs_peer):.3f}."]
    return "\n".join(lines) + "\n"


def plot(sizes, ms: dict, path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(sizes))
    for i, tool in enumerate(TOOLS):
        ax.bar(x + (i - 1.5) * 0.2, [ms[s][tool] for s in sizes], 0.2, label=tool)
    ax.set_xticks(x, [f"{h}x{w}" for h, w in sizes], rotation=30)
    ax.set_ylabel("ms (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--range", default="96:960")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--held-out", type=int, default=8)
    p.add_argument("--part", choices=("all", "range", "sizes", "measure"), default="all")
    p.add_argument("--sizes", default=None, help="I:J, the held-out sizes the 'sizes' part tunes")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    if not Path(args.model).is_file():
        raise SystemExit(f"{args.model} does not exist (../shared/models holds the PP-OCR detector)")
    args.lo, args.hi = (int(v) for v in args.range.split(":"))
    workdir = Path(args.workdir or Path(tempfile.gettempdir()) / "shapeshift_tune_dynamic")
    workdir.mkdir(parents=True, exist_ok=True)
    names = model_dims(args.model)
    _, b, hd, wd = names
    ranged = {b: (1, 1), hd: (args.lo, args.hi), wd: (args.lo, args.hi)}
    taken = {(x[hd], x[wd]) for x in sampled_bindings(ranged)}
    sizes = held_out(args.lo, args.hi, args.held_out, taken)
    wall_path = workdir / "wall.json"
    wall = json.loads(wall_path.read_text()) if wall_path.is_file() else {}

    def save_wall() -> None:
        tmp = wall_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(wall, indent=1))
        tmp.replace(wall_path)

    if args.part in ("all", "range"):
        wall["range"] = tune(args.model, workdir / "range.db", ranged, args)
        save_wall()
        print(f"range: tuned in {wall['range']:.0f} s", flush=True)
    if args.part in ("all", "sizes"):
        i, j = (int(v) for v in args.sizes.split(":")) if args.sizes else (0, len(sizes))
        for h, w in sizes[i:j]:
            wall[f"size_{h}x{w}"] = tune(args.model, workdir / f"size_{h}x{w}.db", {b: (1, 1), hd: (h, h), wd: (w, w)},
                                         args)
            save_wall()
            print(f"{h}x{w}: tuned in {wall[f'size_{h}x{w}']:.0f} s", flush=True)
    if args.part in ("all", "measure"):
        ms = measure(args.model, names, sizes, workdir, args)
        text = report(args.model, sizes, ms, wall, args)
        print(text)
        out = Path(args.output or HERE / "results" / f"tune_dynamic_{host_target().microarch.name}.md")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(out)  # never a half-written results file
        plot(sizes, ms, out.with_suffix(".png"))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
