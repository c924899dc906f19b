"""Shared fixtures: paths to ../shared/models and the bundled example model."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_MODELS = ROOT.parent / "shared" / "models"


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
