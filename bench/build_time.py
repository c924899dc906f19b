"""Session creation time: shapeshift's native backend at three cache states, against onnxruntime.

    python bench/build_time.py [--models NAME ...] [--no-bert] [--runs 3] [--output bench/results/build_time.md]

For every model in ../shared/models and a BERT-base-size encoder (the one bench/e2e.py
builds), each measurement is one session created in a fresh process (``num_threads=1``):

- **empty cache**: nothing built yet; the kernel fragment objects the model calls and the
  model's own units are all compiled (what the very first model on a machine pays);
- **fragments cached**: the cache holds every kernel fragment's object (codegen/fragments.py)
  but nothing of this model: its own units are compiled and linked (what a new model, or a
  new version of one, pays once the machine has built any);
- **cache hit**: the model's library is in the cache too;
- **onnxruntime**: ``InferenceSession`` with its default graph optimizations, the peer.

Every native figure includes import, simplify and lowering; the ratios divide it by
onnxruntime's time measured in the same round. Each (state, model) is measured ``--runs``
times, the states interleaved per run, and the median is reported.
Prints the table and writes bench/results/build_time.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

MODELS_DIR = ROOT.parent / "shared" / "models"
RESULTS = ROOT / "bench" / "results"
BERT = "bert-base-encoder"
BERT_SIZE = dict(layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)
STATES = ("empty cache", "fragments cached", "cache hit", "onnxruntime")


def _worker(tool: str, path: str) -> None:
    """One session in this process; prints its creation time in seconds as JSON (the
    tool's package is imported before the clock starts)."""
    if tool == "onnxruntime":
        import onnxruntime as ort

        start = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    else:
        import shapeshift

        start = time.perf_counter()
        shapeshift.InferenceSession(path, backend="native", num_threads=1)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _timed(tool: str, path: str, cache: Path, timeout: float) -> float:
    env = {**os.environ, "SHAPESHIFT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--worker", tool, path], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} on {path}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def build_fragment_cache(cache: Path) -> None:
    """Compile every kernel fragment's object into ``cache`` (through one library that links them all)."""
    from shapeshift.codegen import fragments
    from shapeshift.codegen.build import compile_library
    from shapeshift.codegen.kernels.prelude import PRELUDE

    ordered = fragments.dependency_order(fragments.names())
    compile_library(PRELUDE + fragments.declarations(ordered), name_hint="every fragment", cache_dir=cache,
                    objects=fragments.object_sources(ordered))
    for library in cache.rglob("*.so"):  # keep the objects only
        library.unlink()
        library.with_suffix(".json").unlink()


def measure(models: dict[str, str], runs: int, timeout: float, workdir: Path) -> dict[tuple[str, str], list[float]]:
    fragment_cache = workdir / "fragments"
    build_fragment_cache(fragment_cache)
    times: dict[tuple[str, str], list[float]] = {}
    for run in range(runs):
        for model, path in models.items():
            empty = workdir / f"empty-{run}-{model}"
            warm = workdir / f"warm-{run}-{model}"
            shutil.copytree(fragment_cache, warm)
            row = {"empty cache": lambda: _timed("native", path, empty, timeout),
                   "fragments cached": lambda: _timed("native", path, warm, timeout),
                   "cache hit": lambda: _timed("native", path, warm, timeout),
                   "onnxruntime": lambda: _timed("onnxruntime", path, empty, timeout)}
            for state in STATES:
                seconds = row[state]()
                times.setdefault((model, state), []).append(seconds)
                print(f"run {run + 1} {model} {state}: {seconds:.2f} s", flush=True)
            shutil.rmtree(empty, ignore_errors=True)
            shutil.rmtree(warm, ignore_errors=True)
    return times


def report(times: dict[tuple[str, str], list[float]], models: list[str], runs: int) -> str:
    median = {key: statistics.median(values) for key, values in times.items()}
    lines = ["# Session creation: native backend by cache state, against onnxruntime", "", machine.describe(), "",
             f"`python bench/build_time.py --runs {runs}` on {platform.machine()}, {os.cpu_count()} CPUs; "
             f"Python {platform.python_version()}. Seconds, median of {runs} fresh processes per cell "
             "(native: import + simplify + lowering + build or cache lookup; see the docstring for the states). "
             "Ratios: native / onnxruntime.", "",
             "| model | " + " | ".join(f"{s} s" for s in STATES) + " | empty / ORT | fragments cached / ORT |"
             " cache hit / ORT |", "|---" * (len(STATES) + 4) + "|"]
    for model in models:
        cells = [f"{median[model, s]:.2f}" for s in STATES]
        ort_s = median[model, "onnxruntime"]
        ratios = [f"{median[model, s] / ort_s:.1f}x" for s in STATES[:3]]
        lines.append(f"| {model} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=None, help="names in ../shared/models (default: all)")
    parser.add_argument("--no-bert", action="store_true", help="skip the BERT-base-size encoder")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--output", default=str(RESULTS / "build_time.md"))
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        models: dict[str, str] = {}
        if MODELS_DIR.is_dir():
            for path in sorted(MODELS_DIR.glob("*.onnx")):
                if args.models is None or path.stem in args.models:
                    models[path.stem] = str(path)
        else:
            print(f"skipping shared models: {MODELS_DIR} does not exist", file=sys.stderr)
        if not args.no_bert:
            import onnx

            from shapeshift.examples.encoder import build_encoder

            models[BERT] = str(workdir / f"{BERT}.onnx")
            onnx.save(build_encoder(**BERT_SIZE), models[BERT])
        times = measure(models, args.runs, args.timeout, workdir)
    text = report(times, list(models), args.runs)
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
