"""The asynchronous search on a cluster (tune/search.py, ``Tuner.evolve``) against a fake
cluster in this process: no Ray, no compiler, no worker process. The fake has the cluster's
interface (submit, wait, cancel, time_together); it runs each candidate for a virtual time on
the first free of its slots and answers with made-up seconds that depend on the candidate's
source only, so what a test asserts is the tuner's bookkeeping and scheduling."""

from __future__ import annotations

import zlib

import pytest

from shapeshift.codegen.kernels import gemm
from shapeshift.target import host_target
from shapeshift.tune.builder import source_text
from shapeshift.tune.cluster import ClusterError
from shapeshift.tune.database import Database
from shapeshift.tune.runner import Result, RunnerConfig
from shapeshift.tune.search import TuneConfig, Tuner, split_by_cost
from shapeshift.tune.workload import GemmWorkload

pytest.importorskip("sklearn")

WORKLOAD = GemmWorkload(64, 96, 1, 64)
FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=60)
SLOW = "/* slow */"
BROKEN = "/* broken */"


def _gflops(source: str) -> float:
    return 5.0 + zlib.crc32(source.encode()) % 100


def _seconds(source: str, ms) -> dict[int, float]:
    return {m: WORKLOAD.flops(m) / (_gflops(source) * (1 + 0.01 * m) * 1e9) for m in ms}


class FakeCluster:
    """``slots`` workers in virtual time; a task lasts ``duration(ticket, source)``. ``wait`` returns
    the earliest results (``batched``: also every other one finished by then plus ``lag``,
    as a driver busy elsewhere would find them)."""

    def __init__(self, slots: int, duration=lambda ticket, source: 1.0, batched: bool = False, lag: float = 0.0,
                 lose_after: int = -1):
        self.target = host_target()
        self.n, self.duration, self.batched, self.lag, self.lose_after = slots, duration, batched, lag, lose_after
        self.free = [0.0] * slots  # when each slot is next free
        self.now = 0.0
        self.jobs: dict[int, tuple[float, str, list[int]]] = {}  # ticket -> (end, source, ms)
        self.submitted: list[tuple[int, str, list[int]]] = []
        self.finished: list[int] = []  # tickets, in the order their results were handed back
        self.cancelled: list[int] = []
        self.chunks: list[list[list[int]]] = []
        self.twice_in_flight = 0  # submissions of a source already in flight

    def slots(self, threads: int) -> int:
        return self.n

    def submit(self, source, workload, ms, config) -> int:
        source = source_text(source)  # the tuner sends family and schedule; compared here as C
        ticket = len(self.submitted)
        self.twice_in_flight += any(s == source for _, s, _ in self.jobs.values())
        i = self.free.index(min(self.free))
        end = max(self.now, self.free[i]) + self.duration(ticket, source)
        self.free[i] = end
        self.jobs[ticket] = (end, source, list(ms))
        self.submitted.append((ticket, source, list(ms)))
        return ticket

    def wait(self, tickets) -> list[tuple[int, Result]]:
        if len(self.finished) == self.lose_after:
            raise ClusterError("the cluster could not run a measurement after 4 tries (every worker lost?)")
        first = min(self.jobs[t][0] for t in tickets)
        until = first + (self.lag if self.batched else 0.0)
        ready = sorted((t for t in tickets if self.jobs[t][0] <= until), key=lambda t: (self.jobs[t][0], t))
        if not self.batched:
            ready = ready[:1]
        self.now = max(self.now, until)
        out = []
        for t in ready:
            _, source, ms = self.jobs.pop(t)
            self.finished.append(t)
            out.append((t, Result(error="worker crashed (exit status -6)") if BROKEN in source
                        else Result(seconds=_seconds(source, ms))))
        return out

    def cancel(self, tickets) -> None:
        for t in tickets:
            self.jobs.pop(t, None)
            self.cancelled.append(t)

    def time_together(self, sources, workload, chunks, config, timeouts):
        self.chunks.append([list(c) for c in chunks])
        return [[Result(seconds=_seconds(source_text(s), ms)) for s in sources] for ms in chunks]


def _tune(tmp_path, cluster, source_fn=None, name="t.db", **config):
    config = TuneConfig(**{"trials": 16, "samples": 4, "runner": FAST, **config})
    with Database(tmp_path / name) as db:
        tuner = Tuner(WORKLOAD, db, tmp_path / "cache", config, source_fn=source_fn, log=lambda s: None,
                      cluster=cluster)
        result = tuner.run()
        rows = db.measurements(tuner.wid, 1)
    return tuner, result, rows


def _source_of(tuner, cid) -> str:
    return source_text(tuner._source(tuner.schedules[cid]))


def test_results_out_of_order_are_recorded_under_their_own_candidate(tmp_path):
    cluster = FakeCluster(3, duration=lambda ticket, source: 0.5 + zlib.crc32(source.encode()) % 7)
    tuner, result, rows = _tune(tmp_path, cluster)
    order = [t for t in cluster.finished]
    assert order != sorted(order), "the fake should hand results back out of submission order"
    assert result.trials == 16 and tuner.trials == 16
    # Every stored time is the one the fake made for that candidate's own source.
    for cid, m, seconds, error in rows:
        assert error is None and seconds == pytest.approx(_seconds(_source_of(tuner, cid), [m])[m])
    # A candidate is not drawn again while in flight, nor measured twice at one M.
    assert cluster.twice_in_flight == 0
    pairs = [(source, m) for _, source, ms in cluster.submitted for m in ms]
    assert len(pairs) == len(set(pairs))


def test_a_slow_candidate_does_not_hold_up_the_others(tmp_path):
    """The first candidate drawn takes 100 times as long as any other: the others are drawn,
    measured and recorded while it runs, far more than a round's worth."""
    cluster = FakeCluster(2, duration=lambda ticket, source: 100.0 if ticket == 0 else 1.0)
    tuner, result, _ = _tune(tmp_path, cluster, trials=24, probes=False)
    slow = 0
    came_back_first = cluster.finished[: cluster.finished.index(slow)]
    # A synchronous round (batch = max(4, slots)) would let at most 3 others finish first.
    assert len(came_back_first) >= 20 > tuner.batch
    # Meanwhile the other slot never stood idle: the search took about as long as the slow one.
    assert cluster.now <= 100.0 + 2.0


def test_with_one_slot_what_is_drawn_depends_on_the_results_only(tmp_path):
    """One slot, two in flight: results handed back one at a time or several at once (a
    driver that was busy) give the same candidates, Ms and choice: reproducible with a seed."""
    runs = []
    for i, (batched, lag) in enumerate([(False, 0.0), (True, 2.5), (True, 0.5)]):
        cluster = FakeCluster(1, duration=lambda ticket, source: 1.0 + zlib.crc32(source.encode()) % 3,
                              batched=batched, lag=lag)
        tuner, result, _ = _tune(tmp_path, cluster, name=f"{i}.db")
        runs.append(([(source, ms) for _, source, ms in cluster.submitted], result.kernels, result.tree))
    assert runs[0] == runs[1] == runs[2]


def test_the_joint_timings_are_split_by_m_across_the_slots_and_merged(tmp_path):
    cluster = FakeCluster(3)
    tuner, result, _ = _tune(tmp_path, cluster, trials=12)
    assert cluster.chunks
    for chunks in cluster.chunks:
        assert len(chunks) == min(3, sum(map(len, chunks)))
        flat = [m for c in chunks for m in c]
        assert len(flat) == len(set(flat))  # each M in one chunk (one process) only
    shortlist = cluster.chunks[0]
    ms = sorted(m for c in shortlist for m in c)
    assert ms == tuner.select_ms
    # Every kernel of the shortlist has a joint time at every M, whichever chunk timed it.
    timed = [c for c in tuner.together if set(tuner.select_ms) <= set(tuner.together[c])]
    assert timed and all(tuner.together[c][m] == pytest.approx(_seconds(_source_of(tuner, c), [m])[m])
                         for c in timed for m in ms)


def test_split_by_cost_balances_and_keeps_every_point_once():
    points, costs = [1, 2, 4, 8, 16, 32, 64], [1, 1, 2, 4, 8, 16, 32]
    chunks = split_by_cost(points, costs, 3)
    assert sorted(m for c in chunks for m in c) == points
    loads = sorted(sum(costs[points.index(m)] for m in c) for c in chunks)
    assert loads == [16, 16, 32]
    assert split_by_cost(points, costs, 1) == [points]
    assert split_by_cost([5], [1.0], 4) == [[5]]


def test_a_failing_candidate_is_recorded_once_and_not_drawn_again(tmp_path):
    cluster = FakeCluster(2)

    def source_fn(schedule):
        text = gemm.source(schedule)
        # About one schedule in five crashes its worker.
        return text + BROKEN if zlib.crc32(text.encode()) % 5 == 0 else text

    tuner, result, rows = _tune(tmp_path, cluster, source_fn=source_fn, trials=16, probes=False)
    failed = [source for _, source, _ in cluster.submitted if BROKEN in source]
    assert failed, "no candidate of this seed was made to fail"
    assert len(failed) == len(set(failed))  # each sent once
    assert tuner.failed and all(any(e for c, _, _, e in rows if c == cid) for cid in tuner.failed)
    assert result.kernels and not any(BROKEN in source_text(tuner._source(k)) for k in result.kernels)


def test_losing_every_worker_stops_with_the_error_and_keeps_what_was_measured(tmp_path):
    cluster = FakeCluster(2, lose_after=6)
    config = TuneConfig(trials=16, samples=4, runner=FAST)
    with Database(tmp_path / "t.db") as db:
        tuner = Tuner(WORKLOAD, db, tmp_path / "cache", config, log=lambda s: None, cluster=cluster)
        with pytest.raises(ClusterError, match="every worker lost"):
            tuner.run()
        stored = {cid for cid, *_ in db.measurements(tuner.wid, 1)}
    back = {source for t, source, _ in cluster.submitted if t in cluster.finished}
    assert len(back) == 6 and {_source_of(tuner, c) for c in stored} == back
    # What was still in flight is cancelled, not left running on the cluster.
    assert cluster.cancelled and not cluster.jobs and not tuner.pending


def test_a_candidate_source_writes_the_same_c_as_the_driver_did():
    """The driver sends family and schedule (builder.CandidateSource); the C the measuring
    process writes from them is the C the driver wrote before, for schedules of every width."""
    import random

    from shapeshift.tune.builder import CandidateSource, measurement_source
    from shapeshift.tune.gemm_family import GEMM

    rng, target = random.Random(3), host_target()
    for schedule in [GEMM.default(target)] + [GEMM.random(rng, target) for _ in range(6)]:
        sent = CandidateSource(GEMM.name, GEMM.to_json(schedule))
        assert source_text(sent) == measurement_source(schedule, GEMM)
