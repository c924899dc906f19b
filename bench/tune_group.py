"""A static model tuned grouped (DietCode's grouping of its instances) against one task
per instance.

    python bench/tune_group.py [--model encoder|resnet50] [--seq 128] [--layers 12] [--hidden 768]
                               [--size 224] [--trials 16] [--threads 1] [--runs 20] [--rounds 3]
                               [--workdir DIR] [--output bench/results/tune_group_<model>_<class>.md]

Models: ``encoder``, the BERT-like encoder of ``shapeshift.examples.encoder`` at batch 1 and
a fixed sequence length (``--seq``): its tasks are its dense GEMMs; ``resnet50``, bench/
cnn_models.py's ResNet-50 (torchvision's layout, random weights, BatchNorm folded) at batch
1 and ``--size`` x ``--size``: its tasks are its conv classes and its classifier's GEMM.
Every dim is declared with one value, so the model is static. It is tuned twice into fresh
databases with the same ``--trials`` per task: grouped (``shapeshift tune --group``: the
dense GEMMs as one task, tune/gemm_group.py, and one task per conv class over its
instances, tune/conv_workload.py) and per instance (``--no-group``: one task per weight
shape and per conv instance, the baseline). Reported: tuning wall time of each, the
kernels each keeps (compiled copies: a grouped task's kernels once for all its instances),
the compiled size of the tuned dispatchers (their C alone, built as one library), and
latency of the model at that shape with the default schedules, the grouped records, the
per-instance records and onnxruntime, all in this process, in rounds that alternate the
order (each tool's best round median kept).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import machine  # noqa: E402  (bench/machine.py)

os.environ.update(machine.peer_env(1))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from shapeshift import InferenceSession  # noqa: E402
from shapeshift.codegen.build import compile_library  # noqa: E402
from shapeshift.codegen.kernels.prelude import PRELUDE  # noqa: E402
from shapeshift.examples.encoder import build_encoder  # noqa: E402
from shapeshift.target import host_target  # noqa: E402
from shapeshift.tune.records import GemmTuning  # noqa: E402

TOOLS = ("native default", "native grouped", "native per-instance", "onnxruntime")


def dims(args) -> dict[str, tuple[int, int]]:
    """The model's dims, each declared with one value."""
    if args.model == "encoder":
        return {"batch": (1, 1), "seq": (args.seq, args.seq)}
    return {"batch": (1, 1), "height": (args.size, args.size), "width": (args.size, args.size)}


def build(args, path: str) -> None:
    if args.model == "encoder":
        onnx.save(build_encoder(layers=args.layers, hidden=args.hidden, heads=max(1, args.hidden // 64)), path)
    else:
        import cnn_models  # bench/cnn_models.py

        onnx.save(cnn_models.resnet50(), path)


def feed(args) -> dict:
    rng = np.random.default_rng(0)
    if args.model == "encoder":
        return {"input_ids": rng.integers(0, 1000, (1, args.seq)).astype(np.int64),
                "attention_mask": np.ones((1, args.seq), np.int64)}
    import cnn_models

    return {cnn_models.INPUT: rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32)}


def tune(model: str, db: Path, args, group: bool) -> float:
    """Wall seconds of one ``shapeshift tune`` run (a fresh database)."""
    declared = [w for name, (lo, hi) in dims(args).items() for w in ("--dynamic", f"{name}={lo}:{hi}")]
    cmd = [sys.executable, "-m", "shapeshift.cli.main", "tune", model, *declared, "--trials", str(args.trials),
           "--threads", str(args.threads), "--db", str(db), "--group" if group else "--no-group"]
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def library_bytes(tuning: GemmTuning, workdir: Path, tag: str) -> int:
    """Size of the tuned dispatchers' C built alone as one shared library."""
    source = PRELUDE + "".join(r.source() for r in tuning)
    return os.path.getsize(compile_library(source, name_hint=f"tune_group_{tag}", cache_dir=workdir / "libs").path)


def kernels_kept(tuning: GemmTuning) -> tuple[int, int]:
    """(compiled kernel copies, distinct schedules) over the records."""
    copies = sum(len(r.kernels) for r in tuning)
    return copies, len({s for r in tuning for s in r.kernels})


def latencies(model: str, dbs: dict, args) -> dict[str, float]:
    """Each tool's best round median, in ms (rounds alternate the tools' order)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sessions = {"onnxruntime": ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])}
    for tool, db in dbs.items():
        sessions[tool] = InferenceSession(model, dims(args), backend="native", num_threads=args.threads,
                                          tuning_db=db)
    inputs = feed(args)
    ref = sessions["onnxruntime"].run(None, inputs)[0]
    for tool, s in sessions.items():
        got = s.run(None, inputs)[0]
        if not np.allclose(got, ref, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"{tool}: output differs from onnxruntime by {np.abs(got - ref).max():.3g}")
    best = {tool: float("inf") for tool in sessions}
    for r in range(args.rounds):
        order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
        for tool in order:
            s = sessions[tool]
            for _ in range(3):
                s.run(None, inputs)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                s.run(None, inputs)
                times.append(time.perf_counter() - t0)
            best[tool] = min(best[tool], float(np.median(times)) * 1e3)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("encoder", "resnet50"), default="encoder")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tune_group_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(workdir / f"{args.model}.onnx")
    build(args, model)

    dbs, wall = {}, {}
    for tool, group in (("native grouped", True), ("native per-instance", False)):
        db = workdir / f"{'grouped' if group else 'per_instance'}.db"
        for stale in (db, db.with_name(db.name + ".cache")):
            if stale.is_file():
                stale.unlink()
        wall[tool] = tune(model, db, args, group)
        dbs[tool] = str(db)
        print(f"{tool}: tuned in {wall[tool]:.0f} s", flush=True)
    tunings = {tool: GemmTuning.from_db(db, args.threads) for tool, db in dbs.items()}
    ms = latencies(model, {"native default": None, **dbs}, args)

    klass = host_target().microarch.name
    shape = (f"seq {args.seq}, {args.layers} layers, hidden {args.hidden}" if args.model == "encoder"
             else f"{args.size}x{args.size}")
    lines = [f"# {args.model} (static, batch 1, {shape}) tuned grouped vs per instance ({klass})", "",
             machine.describe(), "",
             f"Command: `python bench/tune_group.py --model {args.model} --seq {args.seq} --layers {args.layers} "
             f"--hidden {args.hidden} --size {args.size} --trials {args.trials} --threads {args.threads} "
             f"--runs {args.runs} --rounds {args.rounds}`; random weights; {args.trials} trials per task (GEMMs "
             f"and convs measured cold: `shapeshift tune`'s default for a model).", "",
             "| tuning | tasks | wall s | kernels compiled (distinct) | dispatcher library bytes |", "|---|---|---|---|---|"]
    for tool, tuning in tunings.items():
        copies, distinct = kernels_kept(tuning)
        lines.append(f"| {tool.removeprefix('native ')} | {len(tuning)} | {wall[tool]:.0f} | {copies} ({distinct}) | "
                     f"{library_bytes(tuning, workdir, tool.split()[-1])} |")
    ratio = wall["native per-instance"] / wall["native grouped"]
    lines += ["", f"Grouped tuning took {ratio:.2f}x less wall time than per-instance.", "",
              f"| tool | ms (best of {args.rounds} round medians of {args.runs} runs) | / onnxruntime | "
              "/ per-instance |", "|---|---|---|---|"]
    for tool in TOOLS:
        lines.append(f"| {tool} | {ms[tool]:.2f} | {ms[tool] / ms['onnxruntime']:.3f} | "
                     f"{ms[tool] / ms['native per-instance']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.output or HERE / "results" / f"tune_group_{args.model}_{klass}.md")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)  # never a half-written results file
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
