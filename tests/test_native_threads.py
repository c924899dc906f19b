"""The native library's threads (the prelude's ss_segment_enter): a session's thread count
holds in whichever thread runs it, and its OpenMP workers are kept off the CPU of the thread
that calls them. Each check runs in a thread of its own, which OpenMP gives a team of its
own: new worker threads, whose ids and affinity /proc and os.sched_getaffinity show."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import subprocess
import sys
import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import shapeshift

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)


def _model():
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "w"], ["Y"])], "matmul",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 64])],
        initializer=[numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _in_thread(fn):
    """fn()'s result, run in a new thread (its exceptions raised here)."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            out["error"] = error

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _tasks() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


_LIBC = ctypes.CDLL(None, use_errno=True)


def _cpu() -> int:
    return _LIBC.sched_getcpu()


def test_the_thread_count_holds_in_a_thread_that_did_not_make_the_session(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    wanted = (os.cpu_count() or 1) + 1
    session = shapeshift.InferenceSession(_model(), backend="native", num_threads=wanted)
    cdll = session._executor.vm.library.cdll
    # A fresh thread's own OpenMP default, before any session runs in it.
    before = _in_thread(cdll.omp_get_max_threads)
    assert before != wanted, "the test needs a default thread count other than the session's"
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)

    def run_then_count():
        y = session.run(None, {"X": x})[0]
        return y, cdll.omp_get_max_threads()

    y, after = _in_thread(run_then_count)
    np.testing.assert_allclose(y, x @ W, rtol=1e-5, atol=1e-5)
    assert after == wanted


def test_sessions_of_one_model_keep_their_own_thread_counts(tmp_path, monkeypatch):
    """Two sessions of one model share its library: each still runs on its own count, the
    one made first too, and a session made without one runs on OpenMP's default, not on the
    count another session left in the thread (a 1-thread session ran on 2 threads once a
    2-thread session of the model had been made)."""
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    default = shapeshift.InferenceSession(_model(), backend="native")
    cdll = default._executor.vm.library.cdll
    # A new thread's OpenMP default (OMP_NUM_THREADS as libgomp read it, else every CPU), and
    # two other counts.
    fresh = _in_thread(cdll.omp_get_max_threads)
    few, many = (2 if fresh == 1 else 1), fresh + 2
    one = shapeshift.InferenceSession(_model(), backend="native", num_threads=few)
    several = shapeshift.InferenceSession(_model(), backend="native", num_threads=many)
    assert one._executor.vm.library.path == several._executor.vm.library.path == default._executor.vm.library.path
    x = np.random.default_rng(4).standard_normal((7, 64)).astype(np.float32)

    def counts():
        seen = []
        for session in (one, several, one, default, several, default):
            np.testing.assert_allclose(session.run(None, {"X": x})[0], x @ W, rtol=1e-5, atol=1e-5)
            seen.append(cdll.omp_get_max_threads())
        return seen

    assert _in_thread(counts) == [few, many, few, fresh, many, fresh]


def test_workers_are_kept_off_the_callers_cpu_and_follow_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_PROC_BIND", raising=False)  # read by libgomp at load: only a guard here
    session = shapeshift.InferenceSession(_model(), backend="native", num_threads=2)
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)

    def check():
        allowed = os.sched_getaffinity(0)
        existing = _tasks()
        first_cpu = _cpu()
        np.testing.assert_allclose(session.run(None, {"X": x})[0], x @ W, rtol=1e-5, atol=1e-5)
        workers = _tasks() - existing
        assert len(workers) == 1, f"expected this thread's one OpenMP worker, found {sorted(workers)}"
        worker = workers.pop()
        masks = [os.sched_getaffinity(worker)]
        if len(allowed) < 2:
            assert masks[0] == allowed  # nowhere else to go: left as it was
            return
        assert masks[0] == allowed - {first_cpu} or masks[0] == allowed - {_cpu()}
        # Moved to another CPU (pinned there for a moment, then free again), the caller
        # takes its worker's place: the worker moves off it at the next run.
        other = min(allowed - {_cpu()})
        for _ in range(5):
            os.sched_setaffinity(0, {other})
            os.sched_setaffinity(0, allowed)
            if _cpu() != other:
                continue
            session.run(None, {"X": x})
            if _cpu() == other:
                masks.append(os.sched_getaffinity(worker))
                break
        assert len(masks) == 2, "the calling thread never stayed on the CPU it was moved to"
        assert masks[1] == allowed - {other}
        assert os.sched_getaffinity(0) == allowed  # the caller's own affinity is left alone

    _in_thread(check)


def _scaled_model(scale: float):
    """Y = (X @ W) * scale: another model (another library) for each scale."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "w"], ["p"]), helper.make_node("Mul", ["p", "s"], ["Y"])], "scaled",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 64])],
        initializer=[numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.float32(scale), "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _build_elsewhere(model_path: str, cache: str) -> None:
    """The model's library built into ``cache`` by another process, so that this one has
    not loaded it when it forks."""
    code = ("import shapeshift; shapeshift.InferenceSession(%r, backend='native', num_threads=2)" % model_path)
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, SHAPESHIFT_CACHE_DIR=cache),
                   timeout=300)


def test_a_forked_child_runs_after_its_parent_ran_on_two_threads(tmp_path, monkeypatch):
    """A server that forks its workers after a warm-up run: the child's first parallel
    region waited forever for the parent's OpenMP workers. The child runs the parent's
    session, a session of a library it loads itself, and a session in a new thread (which
    gets OpenMP workers of its own: 2 threads again)."""
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    later = str(tmp_path / "later.onnx")
    onnx.save(_scaled_model(3.0), later)
    _build_elsewhere(later, str(tmp_path / "cache"))
    session = shapeshift.InferenceSession(_model(), backend="native", num_threads=2)
    # 600 rows: 4.9 Mflop, past the GEMM's threshold for a parallel region.
    x = np.random.default_rng(3).standard_normal((600, 64)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], x @ W, rtol=1e-5, atol=1e-5)

    def child(results):
        first = session.run(None, {"X": x})[0]
        second = shapeshift.InferenceSession(later, backend="native", num_threads=2).run(None, {"X": x})[0]
        threaded = _in_thread(lambda: (session.run(None, {"X": x})[0],
                                       session._executor.vm.library.cdll.omp_get_max_threads()))
        results.put((first, second, threaded[0], threaded[1]))

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=child, args=(results,))
    process.start()
    try:
        got = results.get(timeout=120)
    except Exception:  # noqa: BLE001 - the queue's Empty: the child hung or died
        got = None
    process.join(10)
    if process.is_alive():
        process.kill()
    assert got is not None, "the forked child gave no result in 120 s (hung in its first parallel region)"
    assert process.exitcode == 0
    first, second, threaded, threads = got
    np.testing.assert_allclose(first, x @ W, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, (x @ W) * 3.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(threaded, x @ W, rtol=1e-5, atol=1e-5)
    assert threads == 2
