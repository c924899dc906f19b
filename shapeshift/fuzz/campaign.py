"""The fuzz campaign's command line and its report.

    python -m shapeshift.fuzz -n 10000 [-j 2] [--seed 0] [--out bench/results/fuzz.md]
                              [--no-shared] [--sanitize] [--time-limit 60] [--memory-limit-gb 4]
    python -m shapeshift.fuzz --reproduce SEED:INDEX [--path native]

``make fuzz N=10000`` runs the first form. ``--reproduce`` rebuilds one mutant, prints
its mutations, saves it (``--save``) and runs the paths in this process, with the full
traceback of any failure.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

from .runner import BAD, CLASSES, MEMORY_LIMIT, PATHS, TIME_LIMIT, Result, counts, run, worker

#: How many examples of each bad class the report shows per path.
EXAMPLES = 5


def report(results: dict[int, Result], seed: int, seconds: float, jobs: int, sanitize: bool,
           time_limit: float, memory_limit: int, shared: bool = True) -> str:
    flags = "" if shared else " --no-shared"
    table = counts(results)
    by_seed: dict[str, int] = {}
    for r in results.values():
        by_seed[r.seed_model] = by_seed.get(r.seed_model, 0) + 1
    shown = [c for c in (*CLASSES, "not run", "skipped") if any(table[p].get(c) for p in PATHS) or c in BAD]
    lines = [
        "# Fuzz campaign", "",
        f"`python -m shapeshift.fuzz -n {len(results)} --seed {seed} -j {jobs}{flags}{' --sanitize' if sanitize else ''}`: "
        f"{len(results)} structure-aware mutants (shapeshift/fuzz/mutate.py) of {len(by_seed)} seed models, each "
        f"run in a worker process limited to {memory_limit >> 30} GiB of address space and {time_limit:.0f} s per "
        "path, on three paths: simplify (and export), a reference session and run, a native session and run"
        + (" (built with AddressSanitizer and UBSan)" if sanitize else "") + ".",
        f"CPU: {_cpu_name()}; {jobs} workers; wall time {seconds / 60:.1f} min.", "",
        "Classes: ok; error = a ShapeshiftError (a clear refusal); bug = any other exception; memory = "
        "MemoryError; crash = the worker died (signal or exit); hang = past the time limit; mismatch = "
        "native and reference both ran and disagree (informational); not run = an earlier path of the "
        "mutant crashed or hung the worker.", "",
        "| path | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
    for path in PATHS:
        lines.append(f"| {path} | " + " | ".join(str(table[path].get(c, 0)) for c in shown) + " |")
    lines += ["", "Mutants per seed model: " + ", ".join(f"{k} {v}" for k, v in sorted(by_seed.items())) + "."]
    for cls in (*BAD, "mismatch"):
        examples = [(r, p) for r in results.values() for p in PATHS if r.outcomes.get(p) == cls]
        if not examples:
            continue
        lines += ["", f"## {cls}: {len(examples)}", ""]
        grouped: dict[tuple[str, str], list] = {}
        for r, p in examples:
            # Mismatches all read alike: told apart by the model and the kinds of mutation.
            what = (f"{r.seed_model}: " + ", ".join(sorted({m.split()[0] for m in r.mutations}))
                    if cls == "mismatch" else _signature(r.details.get(p, "")))
            grouped.setdefault((p, what), []).append(r)
        lines += ["| path | what | mutants | first reproducer | its mutations |", "|---|---|---|---|---|"]
        for (p, what), rs in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
            r = rs[0]
            lines.append(f"| {p} | {_cell(what)} | {len(rs)} | `--reproduce {seed}:{r.index}{flags}` ({r.seed_model}) "
                         f"| {_cell('; '.join(r.mutations))} |")
    return "\n".join(lines) + "\n"


def _signature(detail: str) -> str:
    """The part of a failure that names its kind and place, not its values."""
    head = detail.split(" at ", 1)
    kind = head[0].split(":", 1)[0]
    where = head[1] if len(head) > 1 else ""
    return f"{kind} at {where}" if where else detail[:120]


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:300]


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "unknown"


def reproduce(spec: str, paths: tuple[str, ...], save: Optional[Path], use_shared: bool) -> None:
    import numpy as np
    import onnx

    from .mutate import mutant
    from .seeds import seeds

    seed, index = (int(x) for x in spec.split(":"))
    m = mutant(seed, index, seeds(shared=use_shared))
    print(f"mutant {seed}:{index} of {m.seed_model}:")
    for text in m.mutations:
        print(f"  {text}")
    print("feed: " + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in m.feed.items()))
    if save is not None:
        onnx.save(m.model, save)
        np.savez(save.with_suffix(".feed.npz"), **m.feed)
        print(f"saved {save} and {save.with_suffix('.feed.npz')}")
    from .runner import run_path

    for path in paths:
        copy = type(m.model)()
        copy.CopyFrom(m.model)
        try:
            run_path(path, copy, dict(m.feed))
            print(f"{path}: ok")
        except Exception:  # noqa: BLE001 - shown in full
            print(f"{path}:")
            traceback.print_exc(file=sys.stdout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shapeshift.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="number of mutants")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first mutant index")
    parser.add_argument("--out", type=Path, help="write the report here (markdown)")
    parser.add_argument("--no-shared", action="store_true", help="only the seed models built here")
    parser.add_argument("--sanitize", action="store_true", help="native builds with ASan/UBSan")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="seconds per path")
    parser.add_argument("--memory-limit-gb", type=float, default=MEMORY_LIMIT / (1 << 30))
    parser.add_argument("--cache", type=Path, help="the native build cache (default: build/fuzz-cache)")
    parser.add_argument("--reproduce", metavar="SEED:INDEX")
    parser.add_argument("--path", choices=PATHS, action="append", help="with --reproduce: only this path")
    parser.add_argument("--save", type=Path, help="with --reproduce: save the mutant's model here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--indices", help=argparse.SUPPRESS)
    parser.add_argument("--memory-limit", type=int, default=MEMORY_LIMIT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.seed, [int(i) for i in args.indices.split(",") if i], not args.no_shared, args.memory_limit)
        return
    if args.reproduce:
        reproduce(args.reproduce, tuple(args.path or PATHS), args.save, not args.no_shared)
        return
    from .runner import ROOT

    memory_limit = int(args.memory_limit_gb * (1 << 30))
    cache = args.cache or ROOT / "build" / "fuzz-cache"
    done = [0]
    started = time.perf_counter()

    def progress(result: Result) -> None:
        done[0] += 1
        if done[0] % 100 == 0:
            print(f"{done[0]}/{args.n} mutants, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    results = run(args.seed, args.n, jobs=args.jobs, start=args.start, use_shared=not args.no_shared,
                  time_limit=args.time_limit, memory_limit=memory_limit, cache_dir=cache, sanitize=args.sanitize,
                  on_result=progress)
    text = report(results, args.seed, time.perf_counter() - started, args.jobs, args.sanitize, args.time_limit,
                  memory_limit, shared=not args.no_shared)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
