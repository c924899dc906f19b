"""End-to-end latency and memory: shapeshift native vs onnxruntime vs the reference backend.

    python bench/e2e.py [--threads 1] [--seqs 1 8 32 128 512] [--models NAME ...]
                        [--tools native onnxruntime reference] [--no-bert] [--runs 10] [--rounds 2] [--load N]
                        [--pause-ms MS]
                        [--tuning-db FILE [--tune TRIALS]]

``--tuning-db FILE`` adds the tool "native-tuned": the native backend with the tuned GEMM
records of FILE (``InferenceSession(..., tuning_db=FILE)``). ``--tune TRIALS`` first runs
``shapeshift tune`` on the BERT-base-size encoder (batch 1, seq 1..512, ``--threads``) into
FILE with that many trials per task (weight shape or attention matmul) and reports its
wall time; issue 5's end-to-end target (tuned / onnxruntime geomean <= 1.0) is then checked too.

Models: a BERT-base-size encoder (hidden 768, 12 layers, 12 heads, random weights) built
with ``shapeshift.examples.encoder.build_encoder`` in the TorchScript exporter's style,
run at batch 1 and each sequence length (its native sessions declare batch=1:1 and
seq=1:max, the ranges ``--tune`` tunes for); and every model in ../shared/models at the
three feeds of ``tests/shared_models.py`` (skipped with a message when the folder is
missing), but for gpt2_past.ts, run as a generation loop runs it (``GPT2_STEPS``): a
128-token prompt from an empty key/value cache, then one token after 500 cached ones at
batch 1 and 4 (its native sessions declare past_seq=0:1024).

Each (tool, model) runs in a fresh process with ``OMP_NUM_THREADS`` and
``OPENBLAS_NUM_THREADS`` set to ``--threads`` (and OpenBLAS's spin-wait cut short: see
``_run_worker``); onnxruntime gets the same
``intra_op_num_threads`` and its default graph optimizations (all on). In that process:

- load time: session creation. For native this is import + simplify + lowering + the C
  build with an empty cache ("cold"), then a second session from the warm cache ("cache"),
  and the build step alone from the warm cache ("cache build");
- latency: per shape, warm-up runs for ``WARMUP_S`` (one when a run takes over a second),
  then the median of ``--runs`` runs (``LONG_RUN_REPEATS`` when one run takes over a second);
- peak memory: the process's peak resident set over load and all runs, minus its resident
  set before loading (Linux VmHWM, reset through /proc/self/clear_refs).

The whole set of workers runs ``--rounds`` times, the tools' order reversed in every other
round, and each shape's latency is the fastest of its rounds' medians. This machine's noise is
bursty and one-sided (other work only ever adds time): with one round, a burst during one
tool's process moved a geomean ratio by 10%. Each round's own geomean ratios are reported too.

``--load N`` keeps N busy processes (a Python loop each) running beside every worker: with
one per core, each tool's threads share their cores with other work, as on a loaded server.

``--pause-ms MS`` sleeps that long before each timed run (not the warm-up), as a server sits
idle between requests: the threads of both tools go to sleep, and each run starts by waking
them (on these VMs the host also takes an idle vCPU away; see the prelude's ss_place_workers
in shapeshift/codegen/kernels/prelude.py for what that did to native's threads).

The report starts with the CPU, its flags and its measured FMA peak (bench/machine.py), and
gives native's rate on the encoder as GFLOPS over its matmul FLOPs and as % of that peak.

Outputs are compared with onnxruntime's in the same bench (max abs difference reported).
Prints the tables and writes bench/results/e2e.md and bench/results/e2e.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

MODELS_DIR = ROOT.parent / "shared" / "models"
RESULTS = ROOT / "bench" / "results"
TOOLS = ("native", "onnxruntime", "reference")
TUNED = "native-tuned"
SEQS = (1, 8, 32, 128, 512)
BERT = "bert-base-encoder"
BERT_SIZE = dict(layers=12, hidden=768, heads=12, vocab=30522, max_positions=512)
# Issue 27's end-to-end target: native / onnxruntime latency geomean over the sequence lengths.
TARGET_GEOMEAN_27 = 0.8


def bert_gflop(seq: int) -> float:
    """Matmul GFLOP of one batch-1 run of the encoder: per layer Q, K, V, output and the two
    FFN products, 2 x seq x (4 h^2 + 2 h f), and attention's two, 2 x 2 x seq^2 x h."""
    h, f, layers = BERT_SIZE["hidden"], 4 * BERT_SIZE["hidden"], BERT_SIZE["layers"]
    return layers * (2 * seq * (4 * h * h + 2 * h * f) + 4 * seq * seq * h) / 1e9
GPT2 = "gpt2_past.ts"
# GPT-2 with its key/value cache run as a generation loop runs it: a prompt from an empty
# cache, then one token after 500 cached ones, at batch 1 and 4 (batch, new tokens, past).
GPT2_STEPS = ((1, 128, 0), (1, 1, 500), (4, 1, 500))
GPT2_RANGES = {"past_seq": (0, 1024)}
LONG_RUN_S = 1.0
# Warm-up: runs for at least this long before a shape is timed (one run at least). Just
# after a session loads, a model's first shape ran 2-7x slower for 15-20 ms at 2 threads
# (vit_interp 0.4-1.0 ms a run, then 0.13), for native and onnxruntime alike, and one
# warm-up run left the median of 10 inside that window.
WARMUP_S = 0.1
LONG_RUN_REPEATS = 3
# Targets from issue 4 (BERT-base-size encoder).
TARGET_GEOMEAN = 1.5
TARGET_SEQ1 = 1.2
TARGET_VS_REFERENCE = 10.0
TARGET_CACHE_LOAD_S = 1.0
# Target from issue 5: the encoder with tuned records.
TARGET_TUNED_GEOMEAN = 1.0


# -- the worker: one tool on one model, in its own process ------------------------------------


def _vm_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> int:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _vm_kb("VmRSS")


def _feeds(model: str, seqs) -> list[tuple[str, dict]]:
    import numpy as np

    if model == BERT:
        rng = np.random.default_rng(0)
        return [(f"seq {s}", {"input_ids": rng.integers(0, 1000, (1, s)).astype(np.int64),
                              "attention_mask": np.ones((1, s), np.int64)}) for s in seqs]
    if model == GPT2:
        return _gpt2_feeds()
    from tests.shared_models import feeds

    rng_feeds = []
    for i in range(3):
        feed = feeds(model + ".onnx", i)
        rng_feeds.append((_describe(feed), feed))
    return rng_feeds


def _gpt2_feeds() -> list[tuple[str, dict]]:
    import numpy as np
    import onnx

    inputs = onnx.load(str(MODELS_DIR / f"{GPT2}.onnx"), load_external_data=False).graph.input
    rng = np.random.default_rng(0)
    out = []
    for batch, seq, past in GPT2_STEPS:
        feed = {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
                "attention_mask": np.ones((batch, past + seq), np.int64)}
        for value in inputs[2:]:  # past_key_values.<layer>.key / .value: [batch, heads, past, head_dim]
            heads, head_dim = (value.type.tensor_type.shape.dim[i].dim_value for i in (1, 3))
            feed[value.name] = rng.standard_normal((batch, heads, past, head_dim)).astype(np.float32)
        out.append((f"b{batch} new {seq} past {past}", feed))
    return out


def _describe(feed: dict) -> str:
    first = next(iter(feed.values()))
    return "x".join(map(str, first.shape))


def _model_path(model: str, workdir: Path) -> str:
    if model != BERT:
        return str(MODELS_DIR / f"{model}.onnx")
    path = workdir / f"{BERT}.onnx"
    if not path.exists():
        import onnx

        from shapeshift.examples.encoder import build_encoder

        onnx.save(build_encoder(**BERT_SIZE), str(path))
    return str(path)


def _session(tool: str, path: str, threads: int, tuning_db=None, dynamic=None):
    if tool == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    import shapeshift

    if tool == "native":
        return shapeshift.InferenceSession(path, dynamic, backend="native", num_threads=threads)
    if tool == TUNED:
        return shapeshift.InferenceSession(path, dynamic, backend="native", num_threads=threads, tuning_db=tuning_db)
    return shapeshift.InferenceSession(path, dynamic, backend="reference")


def worker(tool: str, model: str, threads: int, seqs, runs: int, workdir: str, tuning_db=None,
           pause_s: float = 0.0) -> dict:
    workdir = Path(workdir)
    # The encoder's native sessions declare the ranges it is run (and tuned) at: with
    # batch left at its default range, its attention matmuls would have two dynamic dims,
    # which no batched tuning record covers.
    dynamic = {"batch": (1, 1), "seq": (1, max(seqs))} if model == BERT else GPT2_RANGES if model == GPT2 else None
    return measure(tool, _model_path(model, workdir), _feeds(model, seqs), threads, runs, workdir, model,
                   tuning_db, dynamic, pause_s=pause_s)


def measure(tool: str, path: str, feeds, threads: int, runs: int, workdir: Path, tag: str, tuning_db=None,
            dynamic=None, kernel_library: Optional[Path] = None, pause_s: float = 0.0) -> dict:
    """One tool's session on the model at ``path``: load times, each feed's median latency,
    outputs saved under ``workdir`` (named by ``tag``), peak memory, and for native its fallbacks.
    ``kernel_library``: a build cache holding only the kernel library (bench/build_time.py's
    ``build_fragment_cache``); native's session creation from a copy of it is timed too, in a
    process of its own (``_fresh_process_load_s``).
    ``pause_s``: seconds slept before each timed run (``--pause-ms``)."""
    import numpy as np

    os.environ["SHAPESHIFT_CACHE_DIR"] = str(workdir / f"cache-{tool}-{tag}-{time.time_ns()}")
    baseline = _reset_peak()
    start = time.perf_counter()
    session = _session(tool, path, threads, tuning_db, dynamic)
    result: dict = {"load_s": time.perf_counter() - start, "latency": {}, "outputs": {}}
    if tool.startswith("native"):
        # Every program version's (runtime/versions.py), the untaken branches' included.
        programs = session._executor.programs()
        fallback: dict = {}
        for program in programs:
            for op, count in program.fallback_ops().items():
                fallback[op] = fallback.get(op, 0) + count
        result["fallback"] = fallback
        result["versions"] = len(getattr(session._executor, "versions", ())) or 1
    for label, feed in feeds:
        times = []
        first = time.perf_counter()
        outputs = session.run(None, feed)
        once = time.perf_counter() - first
        if once <= LONG_RUN_S:
            warm_until = time.perf_counter() + WARMUP_S
            session.run(None, feed)
            while time.perf_counter() < warm_until:
                session.run(None, feed)
        repeats = min(runs, LONG_RUN_REPEATS) if once > LONG_RUN_S else runs
        # At 2 threads or more, the cores' state around the timed runs (bench/machine.py:
        # these VMs' two vCPUs change between near and far, and a far pair runs both tools'
        # threads slower): the report says in which state each tool's figure was taken.
        before = machine.core_to_core_ns() if threads >= 2 else None
        for _ in range(repeats):
            if pause_s:
                time.sleep(pause_s)
            t = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - t)
        if threads >= 2:
            result.setdefault("cores_ns", {})[label] = [before, machine.core_to_core_ns()]
        result["latency"][label] = statistics.median(times if times else [once])
        out_path = workdir / f"out-{tool}-{tag}-{label.replace(' ', '_')}.npz"
        np.savez(out_path, *[np.asarray(o) for o in outputs])
        result["outputs"][label] = str(out_path)
    result["peak_mb"] = (_vm_kb("VmHWM") - baseline) / 1024
    if tool.startswith("native"):
        programs = session._executor.programs()
        result["tuned"] = sum(p.prefix != "ss_gemm_" for prog in programs for p in prog.packs)
        result["tuned_batched"] = sum(len(prog.tuned_calls) for prog in programs)
        _time_warm_cache(result, session, path, threads, tool, tuning_db, dynamic)
        if kernel_library is not None:
            library_copy = workdir / f"library-{tool}-{tag}-{time.time_ns()}"
            shutil.copytree(kernel_library, library_copy)
            result["library_load_s"] = _fresh_process_load_s(tool, path, threads, tuning_db, dynamic, library_copy)
    return result


def _fresh_process_load_s(tool: str, path: str, threads: int, tuning_db, dynamic, cache: Path) -> float:
    """Seconds of a session's creation from the build cache ``cache``, in a process of its
    own started for it, with the package's session and build modules imported before the
    clock (as bench/build_time.py times it): in the measuring process, after the model's
    cold and warm sessions, the rest of the package was imported and the symbolic
    expressions were interned already, which a user's new process pays for."""
    code = "\n".join([
        "import json, sys, time",
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})",
        "import e2e",
        "from shapeshift.codegen import program  # noqa: F401",
        "from shapeshift.runtime.session import InferenceSession  # noqa: F401",
        "start = time.perf_counter()",
        f"e2e._session({tool!r}, {path!r}, {threads}, {None if tuning_db is None else str(tuning_db)!r}, {dynamic!r})",
        "print(json.dumps(time.perf_counter() - start))",
    ])
    proc = subprocess.run([sys.executable, "-c", code],
                          env=machine.installed_env(dict(os.environ, SHAPESHIFT_CACHE_DIR=str(cache))),
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"session creation from {cache} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def _time_warm_cache(result: dict, session, path: str, threads: int, tool: str, tuning_db, dynamic) -> None:
    """After the peak is taken (a second session would double it): a new session from the
    warm build cache, and the build step alone."""
    import gc

    from shapeshift.codegen.program import compile_program

    # Each program version's root (its branches live in its library).
    roots = [p for p in session._executor.programs() if p.source and not p.prefix]
    del session
    gc.collect()
    start = time.perf_counter()
    _session(tool, path, threads, tuning_db, dynamic)
    result["cache_load_s"] = time.perf_counter() - start
    start = time.perf_counter()
    for program in roots:  # the build step alone, from the warm cache
        compile_program(program)
    result["cache_compile_s"] = time.perf_counter() - start


# -- the parent: run the workers, compare, tabulate ---------------------------------------------


def _run_worker(tool: str, model: str, args, workdir: str) -> dict:
    # OPENBLAS_THREAD_TIMEOUT: NumPy's OpenBLAS threads, woken by a BLAS call while a
    # session loads, spin up to 2^28 cycles (its default) before they sleep, holding the
    # second core at 2 threads: vit_interp's first 25 runs after its load took a median
    # 0.68 ms natively, 0.16 with 2^4 cycles, for every tool.
    env = machine.installed_env(dict(os.environ, OMP_NUM_THREADS=str(args.threads),
                                     OPENBLAS_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                                     OPENBLAS_THREAD_TIMEOUT="4"))
    cmd = [sys.executable, __file__, "--worker", tool, model, "--threads", str(args.threads), "--runs",
           str(args.runs), "--workdir", workdir, "--seqs", *map(str, args.seqs), "--pause-ms", str(args.pause_ms)]
    if tool == TUNED:
        cmd += ["--tuning-db", str(args.tuning_db)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " / ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tune_bert(args, workdir: str) -> float:
    """``shapeshift tune`` on the BERT-base encoder into args.tuning_db; its wall seconds."""
    path = _model_path(BERT, Path(workdir))
    cmd = [sys.executable, "-m", "shapeshift.cli.main", "tune", path, "--dynamic", "batch=1:1", "--dynamic",
           f"seq=1:{max(args.seqs)}", "--threads", str(args.threads), "--trials", str(args.tune), "--db",
           str(args.tuning_db)]
    print("tuning:", " ".join(cmd[2:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def pause_note(pause_ms: float) -> str:
    """The report's sentence on ``--pause-ms`` (empty without it)."""
    return f"Each process slept {pause_ms:g} ms before each timed run (idle between requests). " if pause_ms else ""


def _max_diff(a_path: str, b_path: str) -> float:
    import numpy as np

    a, b = np.load(a_path), np.load(b_path)
    worst = 0.0
    for key in a.files:
        x, y = a[key], b[key]
        if x.shape != y.shape:
            return math.inf
        if x.size and x.dtype.kind == "f":
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst


def _models(args) -> list[str]:
    models = [] if args.no_bert else [BERT]
    if args.models is not None:
        return models + list(args.models)
    if MODELS_DIR.is_dir():
        models += sorted(p.stem for p in MODELS_DIR.glob("*.onnx"))
    else:
        print(f"note: {MODELS_DIR} is missing; only the BERT-base encoder is measured")
    return models


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seqs", type=int, nargs="+", default=list(SEQS))
    parser.add_argument("--models", nargs="*", default=None, help="names in ../shared/models (default: all)")
    parser.add_argument("--no-bert", action="store_true", help="skip the BERT-base-size encoder")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=(*TOOLS, TUNED))
    parser.add_argument("--tuning-db", default=None, metavar="FILE",
                        help="also run native with the tuned records of FILE (tool native-tuned)")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="first tune the BERT-base encoder's GEMMs into --tuning-db, TRIALS per task")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every worker this many times; each shape keeps its fastest round median")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="keep N busy processes (one per core: a loaded machine) running during every worker")
    parser.add_argument("--pause-ms", type=float, default=0.0, metavar="MS",
                        help="sleep this long before each timed run (a server idle between requests)")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--output", default=str(RESULTS / "e2e.md"))
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.threads, args.seqs, args.runs, args.workdir,
                                args.tuning_db, args.pause_ms / 1e3)))
        return 0
    if args.tune and not args.tuning_db:
        parser.error("--tune needs --tuning-db FILE")
    if args.tuning_db and TUNED not in args.tools:
        args.tools.insert(1, TUNED)
    with tempfile.TemporaryDirectory(prefix="shapeshift-e2e-") as workdir:
        models = _models(args)
        if BERT in models:
            # Built here, not in the first worker: building it there raised that worker's
            # baseline resident set and so understated its peak memory (466 MB against 845).
            _model_path(BERT, Path(workdir))
        if args.tune:
            args.tune_s = _tune_bert(args, workdir)
        rounds = []
        load = _start_load(args.load)
        try:
            rounds = _rounds(args, models, workdir)
        finally:
            for proc in load:
                proc.kill()
        results = merge_rounds(rounds)
        report = _report(results, args)
    print(report)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    _plot(results, args, output.with_suffix(".png"))
    return 0


def _start_load(count: int) -> list:
    """``count`` processes that each keep a core busy (a loop in Python), until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _rounds(args, models: list[str], workdir: str) -> list[dict]:
    rounds = []
    for index in range(max(1, args.rounds)):
            tools = args.tools if index % 2 == 0 else args.tools[::-1]
            results = {}
            for model in models:
                for tool in tools:
                    print(f"round {index + 1}: {model} / {tool} ...", flush=True)
                    results[(model, tool)] = _run_worker(tool, model, args, workdir)
            rounds.append(results)
    return rounds


def merge_rounds(rounds: list[dict]) -> dict:
    """One result per (model, tool) from several rounds of the same workers.

    Each shape's latency is the fastest of the rounds' medians (load only adds time);
    everything else (load times, peak memory, outputs) comes from the first round that
    ran without error. ``round_latency`` keeps every round's latencies for the report;
    ``cores_ns``, where measured, is the cores' state around the round each latency came from.
    """
    merged: dict = {}
    for key in dict.fromkeys(k for results in rounds for k in results):
        ok = [results[key] for results in rounds if key in results and "error" not in results[key]]
        if not ok:
            merged[key] = next(results[key] for results in rounds if key in results)
            continue
        result = dict(ok[0])
        labels = dict.fromkeys(label for r in ok for label in r["latency"])
        result["latency"] = {label: min(r["latency"][label] for r in ok if label in r["latency"])
                             for label in labels}
        result["round_latency"] = [r["latency"] for r in ok]
        if any("cores_ns" in r for r in ok):
            kept = {label: min((r for r in ok if label in r["latency"]), key=lambda r: r["latency"][label])
                    for label in labels}
            result["cores_ns"] = {label: r["cores_ns"][label] for label, r in kept.items()
                                  if label in r.get("cores_ns", {})}
        merged[key] = result
    return merged


def round_geomeans(tool: dict, reference: dict, labels) -> list[float]:
    """The geomean latency ratio tool / reference of each round, from that round's own medians."""
    pairs = zip(tool.get("round_latency", []), reference.get("round_latency", []))
    return [machine.geomean(mine[l] / theirs[l] for l in labels) for mine, theirs in pairs
            if all(l in mine and l in theirs for l in labels)]


def _per_round(geomeans: list[float]) -> str:
    if len(geomeans) < 2:
        return ""
    return " (each round alone: " + ", ".join(f"{g:.2f}" for g in geomeans) + ")"


def _report(results: dict, args) -> str:
    import numpy as np
    import onnxruntime

    lines = ["# End-to-end latency: shapeshift native vs onnxruntime vs reference", "", machine.describe(), "",
             (f"Loaded machine: {args.load} busy process(es) (a Python loop each) ran beside every worker. "
              if args.load else "") +
             pause_note(args.pause_ms) +
             f"Python {platform.python_version()}, numpy {np.__version__}, onnxruntime {onnxruntime.__version__}; "
             f"{platform.machine()}, {os.cpu_count()} CPUs; {args.threads} thread(s) for every tool. "
             f"Latency: in each of {args.rounds} round(s) (every tool in turn, the order reversed each round), "
             f"the median of {args.runs} runs after warm-up ({min(args.runs, LONG_RUN_REPEATS)} when a run takes "
             f"over {LONG_RUN_S:.0f} s); the table keeps each shape's fastest round. "
             "Load: session creation (native: import, simplify, lowering and the C build with an empty cache; "
             "'cache': a second session from the warm build cache). Peak MB: the worker process's peak resident "
             "set minus its resident set before loading. max |diff|: largest absolute difference from "
             "onnxruntime's outputs. Ratios > 1 mean slower than onnxruntime.", ""]
    models = sorted({m for m, _ in results}, key=lambda m: (m != BERT, m))
    for model in models:
        lines += [f"## {model}", ""]
        ort_result = results.get((model, "onnxruntime"), {})
        labels = list(ort_result.get("latency", {})) or list(
            next((r.get("latency", {}) for (m, _), r in results.items() if m == model and "latency" in r), {}))
        header = "| tool | load s | cache load s | cache build s | peak MB | " + " | ".join(f"{l} ms" for l in labels) + \
                 " | geomean ratio vs ORT | max abs diff | fallback ops |"
        lines += [header, "|" + "---|" * (header.count("|") - 1)]
        for tool in args.tools:
            r = results.get((model, tool))
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {tool} | error: {r['error'][:200]} |")
                continue
            lat = r["latency"]
            ratios = [lat[l] / ort_result["latency"][l] for l in labels
                      if l in lat and l in ort_result.get("latency", {})]
            diffs = [_max_diff(r["outputs"][l], ort_result["outputs"][l]) for l in labels
                     if tool != "onnxruntime" and l in r["outputs"] and l in ort_result.get("outputs", {})]
            cells = [f"{lat[l] * 1e3:.2f}" if l in lat else "" for l in labels]
            fallback = (", ".join(f"{k}x{v}" for k, v in sorted(r.get("fallback", {}).items()))
                        if tool.startswith("native") else "")
            if r.get("versions", 1) > 1:
                fallback = f"{r['versions']} program versions, over all of them: {fallback}"
            cache = f"{r['cache_load_s']:.2f}" if "cache_load_s" in r else ""
            build = f"{r['cache_compile_s']:.3f}" if "cache_compile_s" in r else ""
            lines.append(f"| {tool} | {r['load_s']:.2f} | {cache} | {build} | {r['peak_mb']:.0f} | " + " | ".join(cells)
                         + f" | {machine.geomean(ratios):.2f} | {max(diffs) if diffs else 0:.2e} | {fallback} |")
        lines.append("")
        if model == BERT:
            lines += _targets(results, labels, args) + _tuned_targets(results, labels, args)
    return "\n".join(lines) + "\n"


def _tuned_targets(results: dict, labels: list[str], args) -> list[str]:
    tuned, ort_r, native = results.get((BERT, TUNED), {}), results.get((BERT, "onnxruntime"), {}), \
        results.get((BERT, "native"), {})
    if "latency" not in tuned or "latency" not in ort_r:
        return []
    geo = machine.geomean(tuned["latency"][l] / ort_r["latency"][l] for l in labels)
    out = ["Target (issue 5, the encoder with tuned records, tool native-tuned):", "",
           f"- native-tuned / onnxruntime latency, geomean over the sequence lengths: {geo:.2f} "
           f"(target <= {TARGET_TUNED_GEOMEAN}) {'met' if geo <= TARGET_TUNED_GEOMEAN else 'NOT met'}"
           f"{_per_round(round_geomeans(tuned, ort_r, labels))}; "
           f"{tuned.get('tuned', 0)} weight GEMM calls and {tuned.get('tuned_batched', 0)} batched (attention) "
           f"GEMM calls of the program run tuned kernels (records: {args.tuning_db})"]
    if "latency" in native:
        gain = machine.geomean(native["latency"][l] / tuned["latency"][l] for l in labels)
        out.append(f"- native (default schedule) / native-tuned, geomean: {gain:.2f}")
    if getattr(args, "tune_s", None):
        out.append(f"- tuning (`shapeshift tune`, {args.tune} trials per task) took {args.tune_s:.0f} s")
    return out + [""]


def _targets(results: dict, labels: list[str], args) -> list[str]:
    native, ort_r, ref = (results.get((BERT, t), {}) for t in TOOLS)
    if "latency" not in native or "latency" not in ort_r:
        return []
    ratios = {l: native["latency"][l] / ort_r["latency"][l] for l in labels}
    geo = machine.geomean(ratios.values())
    out = ["Targets (issue 4, BERT-base-size encoder):", "",
           f"- native / onnxruntime latency, geomean over the sequence lengths: {geo:.2f} "
           f"(target <= {TARGET_GEOMEAN}) {'met' if geo <= TARGET_GEOMEAN else 'NOT met'}"
           f"{_per_round(round_geomeans(native, ort_r, labels))}"]
    slow = [l for l in labels if ratios[l] > 1.0]
    out.append(f"- issue 27: geomean <= {TARGET_GEOMEAN_27} {'met' if geo <= TARGET_GEOMEAN_27 else 'NOT met'}; "
               f"no sequence length above 1.0: {'met' if not slow else 'NOT met (' + ', '.join(slow) + ')'}")
    peak = machine.peak_gflops() * args.threads
    # Latencies are in seconds.
    rates = [f"{l} {bert_gflop(int(l.split()[-1])) / native['latency'][l]:.0f} GFLOPS "
             f"({100 * bert_gflop(int(l.split()[-1])) / native['latency'][l] / peak:.0f}% of peak)"
             for l in labels if l.startswith("seq ")]
    if rates:
        out.append("- native's rate over the encoder's matmul FLOPs: " + ", ".join(rates))
    first = labels[0]
    out.append(f"- at {first}: {ratios[first]:.2f} (target <= {TARGET_SEQ1}) "
               f"{'met' if ratios[first] <= TARGET_SEQ1 else 'NOT met'}")
    if "latency" in ref:
        speedup = machine.geomean(ref["latency"][l] / native["latency"][l] for l in labels)
        out.append(f"- reference / native, geomean: {speedup:.1f}x (target >= {TARGET_VS_REFERENCE:.0f}x) "
                   f"{'met' if speedup >= TARGET_VS_REFERENCE else 'NOT met'}")
    build = native.get("cache_compile_s")
    if build is not None:
        out.append(f"- the build step from the warm cache (hash the source, check and load the library): {build:.3f} s "
                   f"(target < {TARGET_CACHE_LOAD_S:.0f} s) {'met' if build < TARGET_CACHE_LOAD_S else 'NOT met'}; "
                   f"the whole session creation from the warm cache (reading the model included) took "
                   f"{native.get('cache_load_s', math.nan):.2f} s, onnxruntime's session creation "
                   f"{ort_r.get('load_s', math.nan):.2f} s")
    return out + [""]


def _plot(results: dict, args, path: Path) -> None:
    plt = machine.pyplot()
    if plt is None:
        return
    models = sorted({m for m, _ in results}, key=lambda m: (m != BERT, m))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for tool in args.tools:
            r = results.get((model, tool), {})
            if "latency" not in r:
                continue
            labels = list(r["latency"])
            ax.plot(range(len(labels)), [r["latency"][l] * 1e3 for l in labels], marker="o", label=tool)
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("latency ms (log)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
