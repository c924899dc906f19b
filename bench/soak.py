"""Load test (issue 30 item 7): one session shared by many threads over thousands of runs at
random shapes, and a session created and dropped over and over; outputs and resident memory.

    python bench/soak.py [--runs 10000] [--threads 8] [--sessions 1000] [--backend native]
                         [--pool 48] [--output bench/results/soak.md]

The model is the bundled encoder (shapeshift.examples.encoder: 2 layers, hidden 64, dynamic
batch and seq). A pool of ``--pool`` feeds at random shapes (batch 1..4, seq 1..128, ragged)
is run once each on one thread first: those outputs are the expected ones. Then:

1. **Shared session**: ``--threads`` Python threads share that one session and run
   ``--runs`` feeds drawn at random from the pool; every output must equal the expected one
   bit for bit (the same program on the same shape computes the same sums in the same
   order). The process's resident set (VmRSS) is sampled every 100 runs; the growth from
   the sample after the first 10% of the runs to the last must stay under 1% (no leak).
2. **Sessions created and dropped**: ``--sessions`` times, a new session of the same model
   (from the warm build cache), one run checked against the expected output, the session
   dropped; resident-set growth from the first 10% of them to the end, under 1%.

Each session runs its kernels on one thread (``num_threads=1``) so that the Python threads
are what share the cores. Writes bench/results/soak.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import machine  # noqa: E402

SAMPLE_EVERY = 100
WARM_FRACTION = 0.1
TARGET_GROWTH = 0.01


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def make_feeds(count: int, seed: int = 0) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        batch, seq = int(rng.integers(1, 5)), int(rng.integers(1, 129))
        feeds.append({"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64),
                      "attention_mask": np.ones((batch, seq), np.int64)})
    return feeds


def open_session(path: str, backend: str):
    import shapeshift

    return shapeshift.InferenceSession(path, {"batch": (1, 4), "seq": (1, 128)}, backend=backend, num_threads=1)


def _same(got, expected) -> bool:
    import numpy as np

    return len(got) == len(expected) and all(np.array_equal(g, e) for g, e in zip(got, expected))


def shared_session(session, feeds: list[dict], expected: list, runs: int, threads: int, seed: int = 1) -> dict:
    """``runs`` runs of random pool feeds on ``threads`` threads sharing ``session``."""
    lock = threading.Lock()
    state = {"next": 0, "mismatches": [], "errors": [], "samples": []}
    rng = random.Random(seed)
    order = [rng.randrange(len(feeds)) for _ in range(runs)]

    def work():
        while True:
            with lock:
                index = state["next"]
                if index >= runs:
                    return
                state["next"] += 1
                if index % SAMPLE_EVERY == 0:
                    state["samples"].append((index, rss_kb()))
            k = order[index]
            try:
                got = session.run(None, feeds[k])
            except Exception as error:  # reported, not raised: the soak counts every failure
                with lock:
                    state["errors"].append(f"run {index}: {type(error).__name__}: {error}")
                continue
            if not _same(got, expected[k]):
                with lock:
                    state["mismatches"].append(index)

    start = time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    state["samples"].append((runs, rss_kb()))
    state["seconds"] = time.perf_counter() - start
    return state


def created_and_dropped(path: str, backend: str, feed: dict, expected, sessions: int) -> dict:
    state = {"mismatches": [], "errors": [], "samples": []}
    start = time.perf_counter()
    for index in range(sessions):
        if index % max(1, sessions // 100) == 0:
            gc.collect()
            state["samples"].append((index, rss_kb()))
        try:
            session = open_session(path, backend)
            if not _same(session.run(None, feed), expected):
                state["mismatches"].append(index)
            del session
        except Exception as error:
            state["errors"].append(f"session {index}: {type(error).__name__}: {error}")
    gc.collect()
    state["samples"].append((sessions, rss_kb()))
    state["seconds"] = time.perf_counter() - start
    return state


def growth(samples: list[tuple[int, int]], total: int) -> tuple[int, int, float]:
    """(RSS at the first sample past the warm-up, RSS at the end, relative growth)."""
    warm = next((kb for index, kb in samples if index >= WARM_FRACTION * total), samples[-1][1])
    end = samples[-1][1]
    return warm, end, (end - warm) / warm


def _section(title: str, state: dict, total: int, what: str) -> list[str]:
    warm, end, rel = growth(state["samples"], total)
    ok = not state["mismatches"] and not state["errors"] and rel < TARGET_GROWTH
    lines = [f"## {title}", "",
             f"- {total} {what} in {state['seconds']:.1f} s; outputs different from the single-threaded run: "
             f"{len(state['mismatches'])}; errors: {len(state['errors'])}",
             f"- resident set after the first {WARM_FRACTION:.0%}: {warm / 1024:.1f} MB; at the end: {end / 1024:.1f} MB; "
             f"growth {100 * rel:+.2f}% (target < {100 * TARGET_GROWTH:.0f}%)",
             f"- {'met' if ok else 'NOT met'}"]
    lines += [f"  - {e}" for e in state["errors"][:10]]
    curve = ", ".join(f"{i}: {kb / 1024:.1f}" for i, kb in state["samples"][:: max(1, len(state["samples"]) // 12)])
    return lines + [f"- resident set (MB) along the run: {curve}", ""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--pool", type=int, default=48)
    parser.add_argument("--backend", default="native", choices=("native", "reference"))
    parser.add_argument("--output", default=str(HERE / "results" / "soak.md"))
    args = parser.parse_args(argv)

    import onnx

    from shapeshift.examples.encoder import build_encoder

    with tempfile.TemporaryDirectory(prefix="shapeshift-soak-") as workdir:
        os.environ.setdefault("SHAPESHIFT_CACHE_DIR", str(Path(workdir) / "cache"))
        path = str(Path(workdir) / "encoder.onnx")
        onnx.save(build_encoder(), path)
        session = open_session(path, args.backend)
        feeds = make_feeds(args.pool)
        expected = [session.run(None, feed) for feed in feeds]
        print(f"shared session: {args.runs} runs on {args.threads} threads ...", flush=True)
        shared = shared_session(session, feeds, expected, args.runs, args.threads)
        del session
        print(f"{args.sessions} sessions created and dropped ...", flush=True)
        churn = created_and_dropped(path, args.backend, feeds[0], expected[0], args.sessions)
    lines = ["# Soak: one session shared by threads, and sessions created and dropped", "", machine.describe(), "",
             f"Model: the bundled encoder (2 layers, hidden 64), backend {args.backend}, num_threads=1 per session; "
             f"a pool of {args.pool} feeds at random (batch 1..4, seq 1..128). "
             f"Generated by `python bench/soak.py {' '.join(sys.argv[1:])}`.", ""]
    lines += _section(f"One session, {args.threads} threads", shared, args.runs, "runs")
    lines += _section("Sessions created and dropped", churn, args.sessions, "sessions")
    text = "\n".join(lines)
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
