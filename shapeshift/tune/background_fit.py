"""The cost model's fit in a child process, while the search goes on drawing candidates.

On a cluster the driver is the one process every result passes through: while it fits the
cost model (0.1-0.6 s at a few hundred to a thousand rows), every worker that finishes
waits for its next candidate. With 32 workers those waits made the driver a fifth of the
wall time (bench/results/cluster.md). So, on a cluster of enough slots
(search.BACKGROUND_FIT_SLOTS), the search hands each fit to this child and keeps drawing
from the last fitted model; the new one is taken in at the first draw after it is done.
One fit runs at a time: a refit asked for meanwhile starts when that one returns, on the
rows of that moment.

The child is ``python -m shapeshift.tune.background_fit``, started on first use, fed
pickled jobs on its stdin and answering on its stdout, on one thread (the driver's machine
may be measuring on its other cores). Not multiprocessing: its ``spawn`` runs the caller's
main script again in the child, which a script without a ``__main__`` guard does not
survive, and a fork would copy the driver's Ray threads in whatever state they are in. A
thread here does the writing and reading, so the driver pays only for encoding the rows
(cached: cost_model.CostModel._encode) and pickling: a few milliseconds.

With a background fit, which model a draw sees depends on how long the fit took: the
search is no longer a function of the seed and the results alone. That is why it is kept
for clusters of several slots, where it pays; one slot (and this machine's rounds) fits in
line, reproducibly. Should the child die, the search fits in line from then on.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import BinaryIO, Optional

from ..errors import ShapeshiftError

_LENGTH = struct.Struct("<Q")
# One thread for every library the regressor might call into.
_ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def _send(stream: BinaryIO, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO):
    """The next object on ``stream``; EOFError when it ends."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class BackgroundFit:
    """One fit at a time in a child process: ``start`` a job (cost_model.CostModel.fit_job),
    ``done`` says whether it has returned, ``take`` returns what it returned
    (cost_model.train's tuple) and frees the fitter; ``drop`` forgets it."""

    def __init__(self):
        self._jobs: "queue.Queue[Optional[tuple[Future, tuple]]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._child: Optional[subprocess.Popen] = None
        self._job: Optional[Future] = None
        self._closed = threading.Event()

    @property
    def busy(self) -> bool:
        return self._job is not None

    def start(self, job: tuple) -> None:
        if self._job is not None:
            raise RuntimeError("a fit is already running")
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="shapeshift-background-fit", daemon=True)
            self._thread.start()
        self._job = Future()
        self._jobs.put((self._job, job))

    def done(self) -> bool:
        return self._job is not None and self._job.done()

    def take(self) -> tuple:
        """The started job's result (waits for it if it is still running), or the error that
        stopped it (a ShapeshiftError when the child died)."""
        job, self._job = self._job, None
        if job is None:
            raise RuntimeError("no fit was started")
        return job.result()

    def drop(self) -> None:
        """Forget the running fit (its rows are stale): its result is never taken."""
        self._job = None

    def close(self) -> None:
        """Stop: jobs not yet sent are dropped; the thread ends the child (closing its stdin)
        once the job it is on, if any, returns."""
        self._job = None
        if self._thread is not None:
            self._closed.set()
            self._jobs.put(None)
            self._thread = None
        self._child = None

    def _serve(self) -> None:
        """The thread: each job to the child and its answer back, in order; after the child
        died, every job gets that error."""
        child = None
        while (item := self._jobs.get()) is not None:
            future, job = item
            if self._closed.is_set():
                future.cancel()
                continue
            try:
                if child is None:
                    child = self._child = subprocess.Popen(
                        [sys.executable, "-m", "shapeshift.tune.background_fit"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, env={**os.environ, **_ONE_THREAD})
                _send(child.stdin, job)
                status, value = _receive(child.stdout)
            except (OSError, ValueError, EOFError, pickle.PickleError) as exc:
                future.set_exception(ShapeshiftError(f"the cost model's background fit process stopped ({exc!r}, "
                                                     f"exit status {child.poll() if child else None})"))
                continue
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(ShapeshiftError(f"the cost model's background fit failed: {value}"))
        if child is not None:
            try:
                child.stdin.close()
            except OSError:
                pass
            child.wait()


def _child_main() -> None:
    """The child: fit every job on stdin, answer each on stdout, until stdin closes."""
    from .cost_model import train

    # The answers get file descriptor 1 to themselves: anything else printed (a library's
    # warning) goes to stderr.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            job = _receive(stdin)
        except EOFError:
            return
        try:
            answer = ("ok", train(*job))
        except Exception as exc:  # sent back: the driver decides what a failed fit means
            answer = ("error", repr(exc))
        _send(stdout, answer)


if __name__ == "__main__":
    _child_main()
