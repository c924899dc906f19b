"""Shared fixtures: paths to ../shared/models, the bundled example model, and the build
cache every test of a run compiles into."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_MODELS = ROOT.parent / "shared" / "models"


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    """One build cache for the whole test run, shared by its xdist workers (the cache locks
    each entry, so a library two tests need is compiled once and the second waits for it).

    Kernel fixtures and model tests used a cache of their own, per module and per worker: the
    same fragments were compiled a dozen times in a run (the blocked conv kernels of both
    widths took gcc 193 s on an AMD Zen 3, twice). A test that needs an empty cache (counting
    compiles, a corrupt entry) still takes its own ``tmp_path``."""
    return _run_cache(tmp_path_factory)


def _run_cache(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "build-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _run_build_cache(tmp_path_factory):
    """Compiles go to the run's cache, not the user's home (unless SHAPESHIFT_CACHE_DIR was set
    before the run: a developer reusing a warm cache), so a run is the same on a fresh machine
    as here."""
    if os.environ.get("SHAPESHIFT_CACHE_DIR"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SHAPESHIFT_CACHE_DIR", str(_run_cache(tmp_path_factory)))
        yield


@pytest.fixture(scope="session")
def encoder_path(tmp_path_factory) -> Path:
    """The bundled example encoder, built once per test session."""
    import onnx

    from shapeshift.examples.encoder import build_encoder

    path = tmp_path_factory.mktemp("models") / "encoder.onnx"
    onnx.save(build_encoder(layers=1, hidden=32, heads=2, vocab=100), path)
    return path


@pytest.fixture
def compiler_calls(monkeypatch, tmp_path) -> list:
    """The command of every shared library the C compiler made during the test (with an
    empty build cache of its own): one entry per library built. The kernel objects a
    library links (codegen/fragments.py) and its own object are compiled on the way, by
    commands without ``-shared``, which are not listed."""
    from shapeshift.codegen import build

    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    calls: list = []
    real = build._run_compiler

    def recording(cmd):
        if "-shared" in cmd:
            calls.append(cmd)
        return real(cmd)

    monkeypatch.setattr(build, "_run_compiler", recording)
    return calls


@pytest.fixture
def compiles(monkeypatch) -> list[list[str]]:
    """Every compiler command run through the build module's runner (unit compiles and
    links alike), in order."""
    from shapeshift.codegen import build

    calls: list[list[str]] = []
    real = build._run_compiler

    def counting(cmd):
        calls.append(cmd)
        return real(cmd)

    monkeypatch.setattr(build, "_run_compiler", counting)
    return calls


def shared_model(name: str) -> Path:
    path = SHARED_MODELS / name
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared/models is absent on this machine)")
    return path
