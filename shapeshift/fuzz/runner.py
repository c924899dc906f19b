"""Run mutants on three paths in worker processes with memory and time limits, and
classify what happens.

The paths: ``simplify`` (shapeshift's simplify and export), ``reference`` (a reference
session created and run on the mutant's feed) and ``native`` (the same on the native
backend; its outputs are also compared with the reference's where both ran).

Outcome classes, per mutant and path:

* ``ok``; ``error``: a ShapeshiftError (the clear refusal every bad model should get; a run
  past its ``RUN_DEADLINE`` is one);
* ``bug``: any other exception (its type, message and the innermost frame are kept);
* ``memory``: a MemoryError under the worker's address-space limit (or the sanitizer's
  malloc limit);
* ``crash``: the worker died by a signal or an exit of its own; ``hang``: the path ran
  past its time limit and the worker was killed;
* ``mismatch`` (native only, informational): both backends ran and disagree.

A worker runs many mutants (starting one Python per mutant would cost more than most
mutants do) and announces each path before and after it on stdout; the driver charges a
death or a timeout to the path under way and starts a new worker from the next mutant.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

PATHS = ("simplify", "reference", "native")
CLASSES = ("ok", "error", "bug", "memory", "crash", "hang", "mismatch")
BAD = ("bug", "memory", "crash", "hang")
MEMORY_LIMIT = 4 << 30
TIME_LIMIT = 60.0
# Each run gets this deadline (RunOptions.timeout_s), as a service would give it: a model that
# asks for billions of Loop iterations is then refused with a RunStoppedError (an ``error``)
# instead of being killed as a ``hang``; what still passes TIME_LIMIT is a real hang (a
# single kernel, or the deadline not checked where it should be).
RUN_DEADLINE = TIME_LIMIT / 2
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    index: int
    seed_model: str = ""
    mutations: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)  # path -> class
    details: dict = field(default_factory=dict)  # path -> message
    seconds: dict = field(default_factory=dict)


# -- the worker ----------------------------------------------------------------------------------


def _emit(**message) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    inner = [f for f in frames if "shapeshift" in f.filename] or frames
    if not inner:
        return ""
    f = inner[-1]
    return f" at {Path(f.filename).relative_to(ROOT) if f.filename.startswith(str(ROOT)) else f.filename}:{f.lineno}"


def _classify(exc: BaseException) -> tuple[str, str]:
    from ..errors import ShapeshiftError

    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, ShapeshiftError):
        return "error", f"{type(exc).__name__}: {message}"
    if isinstance(exc, MemoryError):
        return "memory", f"{type(exc).__name__}: {message}{_where(exc)}"
    return "bug", f"{type(exc).__name__}: {message}{_where(exc)}"


def _same(a, b) -> bool:
    import numpy as np

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype.kind in "fc":
            scale = float(np.nanmax(np.abs(np.where(np.isfinite(y), y, 0)))) if y.size else 0.0
            if not np.allclose(x, y, rtol=1e-3, atol=1e-4 * max(scale, 1.0), equal_nan=True):
                return False
        elif x.dtype.kind != "O" and not np.array_equal(x, y):
            return False
    return True


def run_path(path: str, model, feed: dict):
    """Run one path on ``model``; the outputs of a session's run (None for simplify)."""
    import shapeshift
    from ..passes.simplify import simplify_model

    if path == "simplify":
        exported, _, _ = simplify_model(model, check=True)
        exported.SerializeToString()
        return None
    session = shapeshift.InferenceSession(model, backend=path)
    return session.run(None, feed, run_options=shapeshift.RunOptions(timeout_s=RUN_DEADLINE))


def worker(seed: int, indices: Iterable[int], use_shared: bool, memory_limit: int) -> None:
    """Run each mutant of ``indices`` on every path; the protocol is JSON lines on stdout."""
    import warnings

    import numpy as np

    from .mutate import mutant
    from .seeds import seeds

    if memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    sys.setrecursionlimit(10000)
    chosen = seeds(shared=use_shared)
    for index in indices:
        try:
            m = mutant(seed, index, chosen)
            model = m.model
            model.SerializeToString()  # a mutant protobuf refuses to encode is not a test
        except Exception as exc:  # noqa: BLE001 - the generator's fault: skip the index, say why
            _emit(index=index, skipped=f"{type(exc).__name__}: {exc}"[:300])
            continue
        _emit(index=index, seed_model=m.seed_model, mutations=m.mutations)
        reference = None
        for path in PATHS:
            _emit(index=index, start=path)
            started = time.perf_counter()
            detail = ""
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    # Each path gets its own copy: a path must not see another's changes.
                    copy = type(model)()
                    copy.CopyFrom(model)
                    outputs = run_path(path, copy, dict(m.feed))
                outcome = "ok"
                if path == "reference":
                    reference = outputs
                elif path == "native" and reference is not None and not _same(outputs, reference):
                    outcome, detail = "mismatch", "native and reference outputs differ"
            except RecursionError as exc:
                outcome, detail = "bug", f"RecursionError: {str(exc)[:200]}"
            except BaseException as exc:  # noqa: BLE001 - every failure is a result
                if isinstance(exc, KeyboardInterrupt):
                    raise
                outcome, detail = _classify(exc)
            _emit(index=index, end=path, outcome=outcome, detail=detail, seconds=time.perf_counter() - started)


# -- the driver ----------------------------------------------------------------------------------


def _own_process_group() -> None:
    os.setpgrp()  # so that killing a hung worker takes the gcc it may be waiting on too


def run_queue(seed: int, indices: Sequence[int], results: dict, use_shared: bool = True,
              time_limit: float = TIME_LIMIT, memory_limit: int = MEMORY_LIMIT, cache_dir: Optional[Path] = None,
              sanitize: bool = False, on_result=None) -> None:
    """Run ``indices`` in workers, one at a time, restarting after each death or timeout;
    fill ``results`` (index -> Result)."""
    pending = list(indices)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # the campaign's parallelism is its workers
    if cache_dir is not None:
        env["SHAPESHIFT_CACHE_DIR"] = str(cache_dir)
    if sanitize:
        from .. import sanitize as san

        env = san.environment(env)
        env["ASAN_OPTIONS"] += f":malloc_limit_mb={memory_limit >> 20}"
        memory_limit = 0  # ASan reserves terabytes of address space: RLIMIT_AS would stop it at once
    while pending:
        cmd = [sys.executable, "-m", "shapeshift.fuzz", "--worker", "--seed", str(seed),
               "--indices", ",".join(map(str, pending)), "--memory-limit", str(memory_limit)]
        if not use_shared:
            cmd.append("--no-shared")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                preexec_fn=_own_process_group)
        lines: queue.Queue = queue.Queue()
        stderr_tail: list[str] = []
        # The queue and the pipes are arguments, not names looked up later: a reader of the
        # last worker (whose pipe an orphan may hold open) once put its end-of-file None in
        # this worker's queue, and the driver then waited for a hung worker for good.
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
        threading.Thread(target=_keep_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
        current: Optional[tuple[int, str]] = None
        deadline = None
        timed_out = False
        done_indices: set[int] = set()
        while True:
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                timed_out = True
                _kill(proc)
                break
            if line is None:
                break
            try:
                message = json.loads(line)
            except ValueError:
                continue  # something the code under test printed
            index = message.get("index")
            if index is None:
                continue
            result = results.setdefault(index, Result(index))
            if "skipped" in message:
                result.outcomes = {p: "skipped" for p in PATHS}
                result.details = {p: message["skipped"] for p in PATHS}
                done_indices.add(index)
            elif "mutations" in message:
                result.seed_model, result.mutations = message["seed_model"], message["mutations"]
            elif "start" in message:
                current, deadline = (index, message["start"]), time.monotonic() + time_limit
            elif "end" in message:
                result.outcomes[message["end"]] = message["outcome"]
                result.details[message["end"]] = message["detail"]
                result.seconds[message["end"]] = message["seconds"]
                current, deadline = None, None
                if message["end"] == PATHS[-1]:
                    done_indices.add(index)
                    if on_result:
                        on_result(result)
        try:
            code = proc.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:  # its stdout closed but it runs on: stop it
            _kill(proc)
            code = proc.wait()
        if current is not None:
            index, path = current
            result = results[index]
            tail = "".join(stderr_tail)[-600:].strip()
            if timed_out:
                result.outcomes[path], result.details[path] = "hang", f"no result within {time_limit:.0f} s"
            elif code < 0:
                result.outcomes[path], result.details[path] = "crash", f"signal {-code}: {tail}"
            else:
                result.outcomes[path], result.details[path] = "crash", f"exit {code}: {tail}"
            for later in PATHS[PATHS.index(path) + 1:]:
                result.outcomes.setdefault(later, "not run")
            done_indices.add(index)
            if on_result:
                on_result(result)
        elif code != 0 and not done_indices:
            raise RuntimeError(f"a fuzz worker failed before its first mutant (exit {code}): "
                               + "".join(stderr_tail)[-2000:])
        pending = [i for i in pending if i not in done_indices]


def _read_lines(pipe, lines: queue.Queue) -> None:
    for line in pipe:
        lines.put(line)
    lines.put(None)


def _keep_tail(pipe, tail: list, keep: int = 40) -> None:
    for line in pipe:
        tail.append(line)
        del tail[:-keep]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run(seed: int, count: int, jobs: int = 2, start: int = 0, **options) -> dict[int, Result]:
    """Mutants ``start`` .. ``start + count - 1`` of campaign ``seed`` in ``jobs`` parallel
    workers; returns index -> Result."""
    results: dict[int, Result] = {}
    indices = list(range(start, start + count))
    queues = [indices[k::jobs] for k in range(jobs)]
    threads = [threading.Thread(target=run_queue, args=(seed, q, results), kwargs=options) for q in queues if q]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return dict(sorted(results.items()))


def counts(results: dict[int, Result]) -> dict[str, dict[str, int]]:
    """path -> outcome class -> number of mutants."""
    table = {path: {c: 0 for c in (*CLASSES, "not run", "skipped")} for path in PATHS}
    for result in results.values():
        for path in PATHS:
            outcome = result.outcomes.get(path, "not run")
            table[path][outcome] = table[path].get(outcome, 0) + 1
    return table
