"""Measurements on a Ray cluster (tune/cluster.py): a local Ray on 127.0.0.1 with 2 CPUs,
started once for the module and stopped after it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from shapeshift.cli.main import main
from shapeshift.codegen.kernels import gemm
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.tune.builder import measurement_source
from shapeshift.tune.database import Database
from shapeshift.tune.runner import RunnerConfig
from shapeshift.tune.search import TuneConfig, Tuner
from shapeshift.tune.workload import GemmWorkload

pytest.importorskip("sklearn")
pytest.importorskip("ray")

WORKLOAD = GemmWorkload(64, 96, 1, 16)
FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=60)
SMALL = GemmSchedule(mr=4, nr=8, kc=32, mc=8, nc=32, unroll_k=2, small_m=2, small_nc=16)
RUN_HEAD = "static void ss_gemm_run(const ss_gemm_problem* P)\n{"


@pytest.fixture(scope="module")
def cluster():
    from shapeshift.tune.cluster import RayCluster

    c = RayCluster("local:2")
    yield c
    c.shutdown()


def _slow(schedule):
    """Every call first spins for 0.4 s: a measurement that lasts a few seconds."""
    return gemm.source(schedule).replace(RUN_HEAD, RUN_HEAD + "\n    { double t0 = omp_get_wtime(); "
                                                   "while (omp_get_wtime() - t0 < 0.4) {} }")


def _held(release):
    """A source whose every call first waits until the file ``release`` exists (50 s at most):
    a measurement that ends when the test says, however the machine schedules the workers."""
    def source(schedule):
        wait = (f'{{ double t0 = omp_get_wtime(); while (access("{release}", 0) != 0 && '
                f'omp_get_wtime() - t0 < 50.0) {{}} }}')
        return gemm.source(schedule).replace(
            RUN_HEAD, "extern int access(const char* path, int mode);\n" + RUN_HEAD + "\n    " + wait)
    return source


def _crashes(schedule):
    return gemm.source(schedule).replace(RUN_HEAD, RUN_HEAD + "\n    abort();")


def test_the_cluster_is_local_and_one_cpu_model(cluster):
    nodes = cluster.nodes()
    assert len(nodes) == 1 and nodes[0][1] == "127.0.0.1" and nodes[0][2] == 2
    from shapeshift.target import host_target

    assert cluster.target.key == host_target().key
    assert "1 node(s), 2 CPU(s)" in cluster.describe()


def test_a_tune_on_the_cluster_records_what_it_measured(tmp_path, cluster):
    cache = tmp_path / "driver_cache"
    cache.mkdir()
    before = sum(cluster.counts.values())
    joint_before = len(cluster.joint_tasks)
    config = TuneConfig(trials=4, batch=2, samples=3, runner=FAST)
    with Database(tmp_path / "t.db") as db:
        tuner = Tuner(WORKLOAD, db, cache, config, log=lambda s: None, cluster=cluster)
        result = tuner.run()
        wid = db.workload_id(WORKLOAD)
        rows = db.measurements(wid, 1)
        keys = {k for (k,) in db.conn.execute("SELECT DISTINCT target FROM measurements")}
        machines = db.machines(wid)
    assert result.kernels and rows and all(seconds and seconds > 0 for _, _, seconds, _ in rows)
    assert keys == {cluster.target.key}
    # Every measurement names the node that made it, its CPU and its measured FMA peak.
    from shapeshift.tune.machine import peak_gflops

    assert sum(n for _, n in machines) == len(rows)
    assert all(m["node"] != "local" and m["target_key"] == cluster.target.key and peak_gflops(m) > 1.0
               for m, _ in machines)
    assert sum(cluster.counts.values()) > before
    # Nothing was compiled on the driver: the nodes built every candidate in their own cache.
    assert not any(cache.iterdir())
    # The shortlist was timed in one task per chunk of Ms, a chunk per slot, each M in one.
    shortlist = [ms for ms, _ in cluster.joint_tasks[joint_before:joint_before + 2]]
    assert len(shortlist) == 2 and sorted(shortlist[0] + shortlist[1]) == tuner.select_ms


def test_wait_hands_back_what_finished_first_not_what_was_submitted_first(cluster, tmp_path):
    """A held candidate submitted first, a quick one after it: on two CPUs ``wait`` returns the
    quick one alone, while the held one runs on until the test releases it. (A candidate that
    only spun 0.4 s a call finished first once under a loaded test run: the quick one had
    waited for its worker.)"""
    release = tmp_path / "release"
    slow = cluster.submit(measurement_source(SMALL, source_fn=_held(release)), WORKLOAD, [4], FAST)
    quick = cluster.submit(measurement_source(SMALL), WORKLOAD, [1], FAST)
    first = cluster.wait([slow, quick])
    release.touch()
    assert [t for t, _ in first] == [quick] and first[0][1].error is None
    (ticket, result), = cluster.wait([slow])
    assert ticket == slow and result.error is None and set(result.seconds) == {4}


def test_a_crashing_or_broken_candidate_fails_once_and_a_good_one_beside_it_is_measured(cluster):
    good, bad = measurement_source(SMALL), measurement_source(SMALL, source_fn=_crashes)
    broken = measurement_source(SMALL) + "\nthis is not C;\n"
    results = cluster.measure_many([(good, [1, 16]), (bad, [1, 16]), (broken, [1])], WORKLOAD, FAST)
    assert results[0].error is None and set(results[0].seconds) == {1, 16}
    assert results[1].error and "crashed" in results[1].error
    assert results[2].error and results[2].error.startswith("build failed")


def _cmdline(pid) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def _measurement_parents() -> list[int]:
    """The Ray worker processes running a measurement: parents of a measurement process
    (python -m shapeshift.tune.worker) whose title is Ray's ("ray::..."). Only those: another
    test on another pytest worker may be measuring at the same time, under that worker."""
    parents = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = _cmdline(pid)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if b"shapeshift.tune.worker" in cmd and _cmdline(ppid)[0].startswith(b"ray::"):
                parents.append(ppid)
        except OSError:
            continue
    return parents


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes through /proc")
def test_a_ray_worker_killed_mid_measurement_is_retried_not_failed(cluster):
    """The Ray worker process running a measurement is SIGKILLed while the measurement runs:
    Ray runs the task again and the candidate gets its times, no error."""
    slow = measurement_source(SMALL, source_fn=_slow)
    out = {}
    thread = threading.Thread(target=lambda: out.update(r=cluster.measure_many([(slow, [4])], WORKLOAD, FAST)))
    thread.start()
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline:
        parents = _measurement_parents()
        if parents:
            killed = parents[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    thread.join(180)
    assert killed is not None, "no measurement process was seen running"
    (result,) = out["r"]
    assert result.error is None and set(result.seconds) == {4}


def test_without_ray_the_cli_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    code = main(["tune", "--gemm", "64", "96", "--dynamic", "M=1:8", "--db", str(tmp_path / "t.db"),
                 "--cluster", "local:1"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'shapeshift[cluster]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "no-port-here"])
def test_a_wrong_address_is_one_line_at_once(tmp_path, capsys, address):
    start = time.monotonic()
    code = main(["tune", "--gemm", "64", "96", "--dynamic", "M=1:8", "--db", str(tmp_path / "t.db"),
                 "--cluster", address])
    err = capsys.readouterr().err
    assert code == 2 and address in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - start < 30
