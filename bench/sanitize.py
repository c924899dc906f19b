"""The native backend under AddressSanitizer and UndefinedBehaviorSanitizer: the shared
models at three shapes each and the counted ONNX node cases, with the number of reports.

    python bench/sanitize.py [-j 2] [--models NAME ...] [--no-models] [--no-cases]
                             [-k REGEX] [--shapes 0 1 2] [--out bench/results/sanitize.md]

Every item (a model at its shapes, or one node case) runs in a worker process started
by ``python -m shapeshift.sanitize`` (SHAPESHIFT_SANITIZE=1, libasan preloaded, reports
to files). A sanitizer stops its process at the first report, so a worker announces each
item before and after it; when one dies, the item it was on is charged with the death
(the report file, or the signal) and a new worker goes on from the next item.

Python errors of an item (a case the native stage gets wrong, a build that fails) are
counted apart: they are not memory errors, and the other tests judge them.
tests/test_sanitize.py runs a small subset of this in CI and asserts zero reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shapeshift import sanitize  # noqa: E402

SHARED_MODELS = ROOT.parent / "shared" / "models"
DEFAULT_OUT = ROOT / "bench" / "results" / "sanitize.md"
DEFAULT_CACHE = ROOT / "build" / "sanitize-cache"


@dataclass
class Outcome:
    item: str  # "model:NAME" or "case:NAME"
    status: str  # ok | error (a Python exception) | report (a sanitizer's) | crash (a signal) | lost
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str, kind: str = "") -> int:
        return sum(o.status == status and o.item.startswith(kind) for o in self.outcomes)

    @property
    def reports(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in ("report", "crash", "lost")]


# -- the worker: runs items in a sanitized process ---------------------------------------------


def _run_model(name: str, shapes: Sequence[int]) -> None:
    import shapeshift
    from tests.shared_models import feeds

    session = shapeshift.InferenceSession(SHARED_MODELS / name, backend="native")
    for index in shapes:
        session.run(None, feeds(name, index))


def _run_case(name: str, cases: dict) -> None:
    from shapeshift.conformance import stage_native

    stage_native(cases[name])


def worker(items: Sequence[str], shapes: Sequence[int]) -> None:
    """Run ``items`` in order, printing ``start``/``end`` lines the driver follows."""
    import warnings

    import numpy as np

    cases: dict = {}
    if any(i.startswith("case:") for i in items):
        from shapeshift.conformance import collect_cases

        cases = {c.name: c for c in collect_cases()}
    for item in items:
        kind, _, name = item.partition(":")
        print(json.dumps({"start": item}), flush=True)
        started = time.perf_counter()
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                _run_model(name, shapes) if kind == "model" else _run_case(name, cases)
            status, detail = "ok", ""
        except Exception as exc:  # noqa: BLE001 - recorded, and judged by other tests
            status, detail = "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        print(json.dumps({"end": item, "status": status, "detail": detail,
                          "seconds": time.perf_counter() - started}), flush=True)


# -- the driver ----------------------------------------------------------------------------------


def _run_queue(items: list[str], shapes: Sequence[int], env: dict, log_root: Path, outcomes: list,
               timeout: float) -> None:
    """Run ``items`` in sanitized workers, one after another, restarting after each death."""
    attempt = 0
    while items:
        attempt += 1
        log_dir = log_root / f"w{threading.get_ident()}-{attempt}"
        run_env = sanitize.environment(env, log_dir=log_dir)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(list(items)),
               "--shapes", *map(str, shapes)]
        done: set[str] = set()
        current: Optional[str] = None
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        stderr_lines: list[str] = []
        drain = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True)
        drain.start()
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue  # something the code under test printed
            if "start" in message:
                current, started = message["start"], time.perf_counter()
            elif "end" in message:
                outcomes.append(Outcome(message["end"], message["status"], message["detail"], message["seconds"]))
                done.add(message["end"])
                current = None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        drain.join(timeout=5)
        if current is not None:
            found = sanitize.reports(log_dir)
            if found:
                status, detail = "report", _first_report(found)
            elif code < 0:
                status, detail = "crash", f"signal {-code}; " + "".join(stderr_lines[-20:])[-1500:]
            else:
                status, detail = "lost", f"exit {code}; " + "".join(stderr_lines[-20:])[-1500:]
            outcomes.append(Outcome(current, status, detail, time.perf_counter() - started))
            done.add(current)
        elif code != 0 and not done:
            raise RuntimeError(f"the sanitized worker failed before its first item (exit {code}):\n"
                               + "".join(stderr_lines[-30:]))
        items = [i for i in items if i not in done]


def _first_report(paths: Sequence[Path]) -> str:
    text = paths[0].read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    keep = [line for line in lines if "ERROR" in line or "runtime error" in line or "SUMMARY" in line
            or re.match(r"\s+#\d+ ", line)]
    return "\n".join(keep[:25])


def run(items: Sequence[str], shapes: Sequence[int] = (0, 1, 2), jobs: int = 2,
        cache_dir: Optional[Path] = None, timeout: float = 3600.0) -> Summary:
    """Every item under the sanitizers, in ``jobs`` workers; the outcome of each."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["SHAPESHIFT_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    queues = [list(items[k::jobs]) for k in range(jobs)]
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shapeshift-sanitize-") as logs:
        threads = [threading.Thread(target=_run_queue, args=(q, shapes, env, Path(logs), outcomes, timeout))
                   for q in queues if q]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    order = {item: k for k, item in enumerate(items)}
    outcomes.sort(key=lambda o: order.get(o.item, len(order)))
    return Summary(outcomes, time.perf_counter() - started)


def counted_case_names(pattern: str = "") -> list[str]:
    from shapeshift.conformance import collect_cases, is_counted

    return [c.name for c in collect_cases() if is_counted(c.model) and re.search(pattern, c.name)]


def shared_model_names() -> list[str]:
    from tests.shared_models import FEEDS

    return [name for name in sorted(FEEDS) if (SHARED_MODELS / name).exists()]


def report(summary: Summary, shapes: Sequence[int]) -> str:
    from shapeshift.codegen.build import SANITIZE_FLAGS

    lines = ["# The native backend under AddressSanitizer and UndefinedBehaviorSanitizer", "",
             f"`python bench/sanitize.py`: every item built with `{' '.join(SANITIZE_FLAGS)}` "
             f"(SHAPESHIFT_SANITIZE=1) and run under `python -m shapeshift.sanitize` (libasan preloaded; "
             f"arena buffers fenced by poisoned gaps). Shared models at shapes {list(shapes)} of "
             "tests/shared_models.py; counted ONNX node cases through the native stage. "
             f"CPU: {_cpu_name()}; run time {summary.seconds:.0f} s.", "",
             "| items | run | sanitizer reports | crashes (signal) | lost | Python errors |", "|---|---|---|---|---|---|"]
    for kind, label in (("model:", "shared models"), ("case:", "counted node cases")):
        total = sum(o.item.startswith(kind) for o in summary.outcomes)
        if total:
            lines.append(f"| {label} | {total} | {summary.count('report', kind)} | {summary.count('crash', kind)} "
                         f"| {summary.count('lost', kind)} | {summary.count('error', kind)} |")
    bad = summary.reports
    if bad:
        lines += ["", "## Reports", ""]
        for o in bad:
            lines += [f"### {o.item} ({o.status})", "", "```", o.detail.strip(), "```", ""]
    errors = [o for o in summary.outcomes if o.status == "error"]
    if errors:
        lines += ["", "## Python errors (not memory errors; the native conformance lists them too)", "",
                  "| item | error |", "|---|---|"]
        lines += [f"| {o.item} | {o.detail.splitlines()[0][:160].replace('|', '/')} |" for o in errors]
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--models", nargs="*", help="these shared models (default: every one present)")
    parser.add_argument("--no-models", action="store_true")
    parser.add_argument("--no-cases", action="store_true")
    parser.add_argument("-k", "--cases", default="", help="only the counted cases whose name matches")
    parser.add_argument("--shapes", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="the sanitized builds' cache")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(json.loads(args.worker), args.shapes)
        return
    items = []
    if not args.no_models:
        items += [f"model:{n}" for n in (args.models if args.models is not None else shared_model_names())]
    if not args.no_cases:
        items += [f"case:{n}" for n in counted_case_names(args.cases)]
    summary = run(items, args.shapes, args.jobs, args.cache)
    text = report(summary, args.shapes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
