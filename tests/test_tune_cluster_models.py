"""A Ray cluster of two CPU models (tune/cluster.py's ModelNodes, cli/tune_cmd.py): two
one-CPU nodes on 127.0.0.1 (ray.cluster_utils.Cluster), the second one's processes describing
another CPU (target/description.py's SHAPESHIFT_DESCRIBE_CPU: the Skylake client sample,
renamed so that no real machine has its key). Started once for the module, stopped after it;
each test connects and disconnects (the CLI connects on its own)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from shapeshift.cli.main import main
from shapeshift.codegen.kernels.gemm import GemmSchedule
from shapeshift.target import host_target
from shapeshift.target.cpu import parse_cpuinfo
from shapeshift.target.description import DESCRIBE_CPU_ENV, GENERIC_CACHES, target_from_cpu
from shapeshift.tune import space
from shapeshift.tune.builder import measurement_source
from shapeshift.tune.runner import RunnerConfig
from shapeshift.tune.workload import GemmWorkload

from .sample_targets import sample_target

pytest.importorskip("sklearn")
pytest.importorskip("ray")

SAMPLES = Path(__file__).parent / "target_samples"
DESCRIBED = "Described Skylake client (a shapeshift test)"
WORKLOAD = GemmWorkload(64, 96, 1, 16)
FAST = RunnerConfig(repeats=1, sample_s=0.0005, timeout_s=60)
SMALL = GemmSchedule(mr=4, nr=8, kc=32, mc=8, nc=32, unroll_k=2, small_m=2, small_nc=16)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(the cluster's address, the described CPU's cpuinfo file, the ray.cluster_utils.Cluster)."""
    from ray.cluster_utils import Cluster

    from shapeshift.tune.cluster import _import_ray

    _import_ray(local=True)  # addresses on 127.0.0.1 stay there (see _import_ray)
    cpuinfo = tmp_path_factory.mktemp("cpu") / "described.cpuinfo"
    text = (SAMPLES / "skylake_client.cpuinfo").read_text()
    cpuinfo.write_text(re.sub(r"(?m)^model name\t: .*$", f"model name\t: {DESCRIBED}", text))
    nodes = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, node_ip_address="127.0.0.1",
                                                              include_dashboard=False))
    try:
        nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1", env_vars={DESCRIBE_CPU_ENV: str(cpuinfo)})
        nodes.wait_for_nodes()
        yield nodes.address, cpuinfo, nodes
    finally:
        nodes.shutdown()


@pytest.fixture
def cluster(mixed):
    from shapeshift.tune.cluster import RayCluster

    c = RayCluster(mixed[0])
    yield c
    c.shutdown()


def _described_key(cpuinfo: Path) -> str:
    return target_from_cpu(parse_cpuinfo(cpuinfo.read_text()), GENERIC_CACHES).key


def test_the_nodes_are_grouped_by_cpu_model(cluster, mixed):
    from shapeshift.tune.cluster import ClusterError

    models = {m.target.key: m for m in cluster.models}
    assert set(models) == {host_target().key, _described_key(mixed[1])}
    nodes = [m.nodes() for m in cluster.models]
    assert [len(n) for n in nodes] == [1, 1] and nodes[0][0][0] != nodes[1][0][0]
    assert all(addr == "127.0.0.1" for n in nodes for _, addr, _ in n)
    assert [m.slots(1) for m in cluster.models] == [1, 1]  # each model's CPUs only
    text = cluster.describe()
    assert "2 node(s), 2 CPU(s), 2 CPU models" in text and DESCRIBED in text and host_target().cpu_model in text
    assert all(n[0][0][:8] in text for n in nodes)
    # A tune runs on one model: the cluster as a whole has no one target to draw for.
    with pytest.raises(ClusterError, match="2 CPU models"):
        cluster.target


def test_each_models_measurements_run_on_its_own_nodes_only(cluster):
    source = measurement_source(SMALL)
    for model in cluster.models:
        results = model.measure_many([(source, [1]), (source, [4])], WORKLOAD, FAST)
        (together,) = model.time_together([source], WORKLOAD, [[1, 16]], FAST, [60.0])
        assert all(r.error is None for r in results + together)
        own = {node[:8] for node, _, _ in model.nodes()}
        assert set(model.counts) == own and sum(model.counts.values()) == 3
    assert not set(cluster.models[0].counts) & set(cluster.models[1].counts)


def test_a_model_whose_nodes_are_all_lost_stops_with_a_clear_error(cluster, mixed, monkeypatch):
    """A node started and removed again stands for a model that lost its last one: Ray refuses
    a task for nodes it knows are dead, and holds one while it does not know yet (the wait
    then checks every LIVENESS_S); either way the tune stops with an error naming the model."""
    from shapeshift.tune import cluster as cluster_mod

    nodes = mixed[2]
    gone = nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    nodes.wait_for_nodes()
    nodes.remove_node(gone)
    monkeypatch.setattr(cluster_mod, "LIVENESS_S", 0.2)
    target = cluster.models[0].target
    lost = cluster_mod.ModelNodes(cluster, target, frozenset({gone.node_id}))
    ticket = lost.submit(measurement_source(SMALL), WORKLOAD, [1], FAST)
    with pytest.raises(cluster_mod.ClusterError, match=rf"{re.escape(target.cpu_model)} \(target key {target.key}\)"):
        lost.wait([ticket])
    lost.cancel([ticket])


def _one_matmul(path: Path, weight: np.ndarray) -> str:
    """An ONNX model of one MatMul, x [M, 64] times a constant [64, 96] weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w")])
    out = str(path / "one.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    return out


def _selections(db: Path) -> dict[str, list]:
    """Target key -> its selections, each a list of its kernels' schedules (as JSON objects)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT target, kernels FROM selections").fetchall()
    by_key: dict[str, list] = {}
    for target, kernels in rows:
        by_key.setdefault(json.loads(target)["key"], []).append([json.loads(k["schedule"])
                                                                 for k in json.loads(kernels)])
    return by_key


def _schedules(record) -> list:
    return [json.loads(space.to_json(s)) for s in record.kernels]


def test_tune_on_a_mixed_cluster_keeps_a_selection_per_model_and_a_session_takes_its_own(mixed, tmp_path,
                                                                                         capsys):
    from shapeshift import InferenceSession

    address, cpuinfo, _ = mixed
    db = tmp_path / "t.db"
    assert main(["tune", "--gemm", "64", "96", "--dynamic", "M=1:16", "--trials", "3", "--db", str(db),
                 "--threads", "1", "--cluster", address]) == 0
    out = capsys.readouterr().out
    assert "2 CPU models" in out
    here, described = host_target().key, _described_key(cpuinfo)
    assert re.search(rf"CPU model [12]/2: {re.escape(DESCRIBED)} \(target key {described}\), 1 node\(s\)", out)
    assert re.search(rf"CPU model [12]/2: .*\(target key {here}\), 1 node\(s\)", out)
    selections = _selections(db)
    assert {key: len(s) for key, s in selections.items()} == {here: 1, described: 1}
    with sqlite3.connect(db) as conn:
        measured = {k for (k,) in conn.execute("SELECT DISTINCT target FROM measurements")}
    assert measured == {here, described}
    # A session on this machine takes this machine's selection, and says nothing of the other.
    weight = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    model = _one_matmul(tmp_path, weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = InferenceSession(model, {"M": (1, 16)}, backend="native", num_threads=1, tuning_db=db)
    assert _schedules(session._executor.tuning.get(64, 96)) == selections[here][0]
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight, rtol=1e-4, atol=1e-4)
    # A process on the described CPU takes the described model's selection (what its
    # session would load: GemmTuning.from_db, runtime/session.py's load_tuning).
    code = ("import json, sys; from shapeshift.tune import space; from shapeshift.tune.records import GemmTuning; "
            "r = GemmTuning.from_db(sys.argv[1], 1).get(64, 96); "
            "print(json.dumps([json.loads(space.to_json(s)) for s in r.kernels]))")
    done = subprocess.run([sys.executable, "-c", code, str(db)], env={**os.environ, DESCRIBE_CPU_ENV: str(cpuinfo)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == selections[described][0]


def test_a_database_of_several_models_warns_only_for_workloads_without_this_machines(tmp_path):
    """[64, 96] has a selection of this machine and one of another model: this machine's is
    taken, silently. [96, 48] has the other model's only: not applied, and the warning names
    that model."""
    from shapeshift.tune.database import Database
    from shapeshift.tune.records import GemmTuning

    other = sample_target("zen4", GENERIC_CACHES)
    mine, theirs = [SMALL], [SMALL, GemmSchedule()]
    tree = {"le": 8, "left": {"leaf": 0}, "right": {"leaf": 1}}
    db = tmp_path / "t.db"
    with Database(db) as d:
        for (k, n), targets in (((64, 96), (host_target(), other)), ((96, 48), (other,))):
            wid = d.workload_id(GemmWorkload(k, n, 1, 16))
            for target in targets:
                kernels = mine if target is host_target() else theirs
                d.add_selection(wid, 1, 16, 1, "dietcode", [{"candidate": i, "schedule": space.to_json(s)}
                                                            for i, s in enumerate(kernels)],
                                tree if len(kernels) > 1 else {"leaf": 0}, target)
    with pytest.warns(UserWarning, match=rf"not used: {re.escape(other.cpu_model)} \(target key {other.key}\)"):
        tuning = GemmTuning.from_db(db, 1)
    assert list(tuning.get(64, 96).kernels) == mine and tuning.get(96, 48) is None
    with sqlite3.connect(db) as conn:  # [96, 48] gone: nothing left to warn about
        conn.execute("DELETE FROM selections WHERE workload_id = (SELECT id FROM workloads WHERE key LIKE '%:96:48')")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(GemmTuning.from_db(db, 1).get(64, 96).kernels) == mine


def test_a_cluster_at_a_loopback_address_is_reached_from_a_fresh_process(mixed):
    """`ray start --head --node-ip-address=127.0.0.1` listens on 127.0.0.1 only: a driver in a
    process of its own (no Ray imported before, as the CLI is) must not swap that address for
    the machine's routable one."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    code = ("import sys; from shapeshift.tune.cluster import RayCluster; c = RayCluster(sys.argv[1]); "
            "print(c.describe()); c.shutdown()")
    done = subprocess.run([sys.executable, "-c", code, mixed[0]], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 node(s), 2 CPU(s), 2 CPU models" in done.stdout
