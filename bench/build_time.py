"""Session creation time: shapeshift's native backend at three cache states, against
onnxruntime; and the per-run overhead of a small model.

    python bench/build_time.py [--models NAME ...] [--no-bert] [--runs 3] [--output bench/results/build_time.md]

For every model in ../shared/models and a BERT-base-size encoder (the one bench/e2e.py
builds), each measurement is one session created in a fresh process (``num_threads=1``):

- **empty cache**: nothing built yet; the kernel fragment objects the model calls and the
  model's own units are all compiled (what the very first model on a machine pays);
- **fragments cached** (a warm kernel library, an empty model cache): the cache holds every
  kernel fragment's object (codegen/fragments.py) but nothing of this model: its own units
  are compiled and linked (what a new model, or a new version of one, pays once the machine
  has built any);
- **cache hit**: the model's library is in the cache too;
- **onnxruntime**: ``InferenceSession`` with its default graph optimizations, the peer.

Each process first imports the package (shapeshift's ``InferenceSession`` pulls in onnx,
and onnx ml_dtypes: the "import" column, measured in the cache-hit process; onnxruntime's
import is not counted either), then starts the clock; it reads the package's modules
compiled, as from an installed package (bench/machine.py's ``installed_env``: with
PYTHONDONTWRITEBYTECODE=1, as these machines set it, the modules a session imports lazily
were compiled from source inside the timed creation). Each native figure is session
creation after that import: load, simplify, lowering, the build or the cache lookup and
loading the library. "hit: build" is the part of a cache hit spent in the build cache
(``compile_library``: keys, checks, dlopen). The ratios divide by onnxruntime's time
measured in the same round. Each (state, model) is measured ``--runs`` times, the states
interleaved per run, and the median is reported.

Per-run overhead: a model of three nodes (Add, MatMul with a constant 8x8 weight, Tanh on
[4, 8]: nothing to compute) run in a loop by the native session and by onnxruntime's
(1 thread each), in microseconds per run, both as wall time and as the thread's CPU time
(which other processes on a busy machine do not inflate); best of 5 batches.

Prints the tables and writes bench/results/build_time.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
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
    """One session in this process; prints as JSON its creation time in seconds (the
    tool's package imported before the clock starts), the import's time and, native, the
    time spent in the build cache."""
    started = time.perf_counter()
    if tool == "onnxruntime":
        import onnxruntime as ort

        imported = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        build = 0.0
    else:
        from shapeshift.codegen import program
        from shapeshift.runtime.session import InferenceSession

        imported = time.perf_counter()
        build = 0.0
        real = program.compile_library

        def timed(*args, **kwargs):
            nonlocal build
            begun = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                build += time.perf_counter() - begun

        program.compile_library = timed
        InferenceSession(path, backend="native", num_threads=1)
    print(json.dumps({"seconds": time.perf_counter() - imported, "import": imported - started, "build": build}))


def _timed(tool: str, path: str, cache: Path, timeout: float) -> dict:
    env = machine.installed_env({**os.environ, "SHAPESHIFT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"})
    proc = subprocess.run([sys.executable, __file__, "--worker", tool, path], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} on {path}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_fragment_cache(cache: Path) -> None:
    """Compile every kernel fragment's object into ``cache`` (through one library that links them all)."""
    from shapeshift.codegen import fragments
    from shapeshift.codegen.build import compile_library, precompile_header, target_flags, with_opt
    from shapeshift.codegen.emit import OPT_FLAGS
    from shapeshift.codegen.kernels.prelude import PRELUDE

    ordered = fragments.dependency_order(fragments.names())
    compile_library(PRELUDE + fragments.declarations(ordered), name_hint="every fragment", cache_dir=cache,
                    objects=fragments.object_sources(ordered))
    for library in cache.rglob("*.so"):  # keep the objects only
        library.unlink()
        library.with_suffix(".json").unlink()
    # Part of the kernel library too: the precompiled header of each unit kind's flags, made
    # by any earlier build that compiled a few units with them.
    for opt in sorted(set(OPT_FLAGS.values())):
        precompile_header(with_opt(target_flags(), opt), cache_dir=cache)


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
                result = row[state]()
                times.setdefault((model, state), []).append(result["seconds"])
                if state == "cache hit":
                    times.setdefault((model, "import"), []).append(result["import"])
                    times.setdefault((model, "hit: build"), []).append(result["build"])
                print(f"run {run + 1} {model} {state}: {result['seconds']:.2f} s (import {result['import']:.2f}, "
                      f"build cache {result['build']:.2f})", flush=True)
            shutil.rmtree(empty, ignore_errors=True)
            shutil.rmtree(warm, ignore_errors=True)
    return times


def report(times: dict[tuple[str, str], list[float]], models: list[str], runs: int, overhead: dict,
           command: str = "") -> str:
    """The results as markdown; ``command``: the arguments the bench ran with, as typed."""
    median = {key: statistics.median(values) for key, values in times.items()}
    columns = [*STATES, "hit: build", "import"]
    lines = ["# Session creation: native backend by cache state, against onnxruntime", "", machine.describe(), "",
             f"`python bench/build_time.py {command or f'--runs {runs}'}` on {platform.machine()}, "
             f"{os.cpu_count()} CPUs; "
             f"Python {platform.python_version()}; load average before the run {_load()}. Seconds, median of "
             f"{runs} fresh processes per cell (native: session creation after the package's import: load, "
             "simplify, lowering, build or cache lookup; see the docstring for the states and columns). "
             "Ratios: native / onnxruntime.", "",
             "| model | " + " | ".join(f"{s} s" for s in columns) + " | empty / ORT | fragments cached / ORT |"
             " cache hit / ORT |", "|---" * (len(columns) + 4) + "|"]
    for model in models:
        cells = [f"{median[model, s]:.2f}" for s in columns]
        ort_s = median[model, "onnxruntime"]
        ratios = [f"{median[model, s] / ort_s:.1f}x" for s in STATES[:3]]
        lines.append(f"| {model} | " + " | ".join(cells + ratios) + " |")
    if overhead:
        lines += ["", "## Per-run overhead: a three-node model ([4, 8] Add, MatMul 8x8, Tanh), 1 thread", "",
                  "Microseconds per `run`, best of 5 batches of 2000: wall time, and the thread's CPU time.", "",
                  "| runtime | wall us | CPU us |", "|---|---|---|"]
        for tool in ("native", "onnxruntime"):
            lines.append(f"| {tool} | {overhead[tool, 'wall'] * 1e6:.1f} | {overhead[tool, 'cpu'] * 1e6:.1f} |")
        lines.append(f"| native / onnxruntime | {overhead['native', 'wall'] / overhead['onnxruntime', 'wall']:.2f}x"
                     f" | {overhead['native', 'cpu'] / overhead['onnxruntime', 'cpu']:.2f}x |")
    return "\n".join(lines) + "\n"


def _load() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def per_run_overhead(cache: Path) -> dict:
    """Per-run seconds of a three-node model, native and onnxruntime (see the docstring)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    os.environ["SHAPESHIFT_CACHE_DIR"] = str(cache)
    from shapeshift.runtime.session import InferenceSession

    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["m"]),
             helper.make_node("Tanh", ["m"], ["y"])]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(nodes, "three", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
                              initializer=[numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
                                           numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32),
                                                                   "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {"native": InferenceSession(model, backend="native", num_threads=1),
                "onnxruntime": ort.InferenceSession(model.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])}
    feed = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    expected = sessions["onnxruntime"].run(None, feed)[0]
    np.testing.assert_allclose(sessions["native"].run(None, feed)[0], expected, rtol=1e-5, atol=1e-6)
    best: dict = {}
    for _ in range(5):
        for tool, session in sessions.items():  # interleaved batches
            for clock, key in ((time.perf_counter, "wall"), (time.thread_time, "cpu")):
                start = clock()
                for _ in range(2000):
                    session.run(None, feed)
                seconds = (clock() - start) / 2000
                best[tool, key] = min(best.get((tool, key), seconds), seconds)
    return best


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
        overhead = per_run_overhead(workdir / "overhead")
    command = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    text = report(times, list(models), args.runs, overhead, command)
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
