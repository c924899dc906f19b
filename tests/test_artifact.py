"""Compiled artifacts: `shapeshift compile` / shapeshift.compile write one file that
InferenceSession runs without a C compiler, and every reason to distrust it is an
ArtifactError naming the file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shapeshift
from shapeshift.codegen import build
from shapeshift.errors import ArtifactError, ModelLoadError
from shapeshift.runtime import artifact as artifact_mod
from shapeshift.runtime.artifact import host_cpu_features, is_artifact, read_container, write_container

DYNAMIC = {"batch": (1, 4), "seq": (1, 64)}
SEQ_LENGTHS = (1, 7, 64)


@pytest.fixture(scope="module")
def compiled(encoder_path, build_cache, tmp_path_factory) -> Path:
    """The example encoder compiled with the Python API."""
    out = tmp_path_factory.mktemp("artifacts") / "encoder.ssa"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHAPESHIFT_CACHE_DIR", str(build_cache))
        written = shapeshift.compile(encoder_path, out, dynamic=DYNAMIC)
    assert written.path == out and written.size == out.stat().st_size
    return out


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """An empty cache and no way to compile: loading must not try."""
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("SHAPESHIFT_CC", str(tmp_path / "no-such-cc"))

    def refuse(cmd):
        raise AssertionError(f"the compiler ran: {cmd}")

    monkeypatch.setattr(build, "_run_compiler", refuse)
    return tmp_path / "empty-cache"


def _feed(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    return {"input_ids": rng.integers(0, 100, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def _expected(encoder_path, feed):
    import onnxruntime as ort

    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    return reference.run(None, feed)[0]


def _edited(compiled: Path, tmp_path: Path, **changes) -> Path:
    """A copy of the artifact with header fields changed (checksums recomputed)."""
    header, sections = read_container(compiled)
    header.update(changes)
    header.pop("sections")
    out = tmp_path / "edited.ssa"
    write_container(out, header, sections)
    return out


def _library_offset(path: Path) -> int:
    header, _ = read_container(path)
    sizes = {s["name"]: s["size"] for s in header["sections"]}
    assert header["sections"][-1]["name"] == "library"
    return path.stat().st_size - sizes["library"]


# -- loading without a compiler -----------------------------------------------------------------------


def test_artifact_runs_without_compiling_and_matches_onnxruntime(compiled, encoder_path, no_compiler):
    assert is_artifact(compiled) and not is_artifact(encoder_path)
    session = shapeshift.InferenceSession(compiled, num_threads=2)
    assert session.backend == "native"
    library = session._executor.vm.library
    assert library.path.is_relative_to(no_compiler / "artifacts")
    for batch, seq in zip((2, 1, 1), SEQ_LENGTHS):
        feed = _feed(batch, seq)
        np.testing.assert_allclose(session.run(None, feed)[0], _expected(encoder_path, feed), rtol=1e-4, atol=1e-5)
    # The installed library is reused by the next session; dynamic= may repeat the compiled ranges.
    again = shapeshift.InferenceSession(compiled, dynamic=DYNAMIC, backend="native")
    assert again._executor.vm.library.path == library.path


def test_cli_compile_then_cli_run_in_a_fresh_process(encoder_path, build_cache, tmp_path):
    env = dict(os.environ, SHAPESHIFT_CACHE_DIR=str(build_cache))
    out = tmp_path / "cli.ssa"
    result = subprocess.run([sys.executable, "-m", "shapeshift.cli.main", "compile", str(encoder_path), "-o", str(out),
                             "--dynamic", "batch=1:4", "--dynamic", "seq=1:64"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}: {out.stat().st_size} bytes" in result.stdout
    assert "library" in result.stdout and "seq=1:64" in result.stdout
    assert ", ".join(host_cpu_features()) in result.stdout
    # A fresh process, an empty cache and no compiler: `run` takes the artifact as it is.
    env = dict(os.environ, SHAPESHIFT_CACHE_DIR=str(tmp_path / "empty"), SHAPESHIFT_CC=str(tmp_path / "no-cc"))
    result = subprocess.run([sys.executable, "-m", "shapeshift.cli.main", "info", str(out)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert f"artifact: {out}" in result.stdout and "sections: model" in result.stdout
    assert "MatMul" in result.stdout, "then the model inside it, as for an ONNX file"
    feed = _feed(2, 7)
    for name, array in feed.items():
        np.save(tmp_path / f"{name}.npy", array)
    result = subprocess.run([sys.executable, "-m", "shapeshift.cli.main", "run", str(out),
                             "--save", str(tmp_path / "o"), *[f"--input={name}={tmp_path / name}.npy" for name in feed]],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert "on the native backend" in result.stdout
    np.testing.assert_allclose(np.load(tmp_path / "o" / "last_hidden_state.npy"), _expected(encoder_path, feed),
                               rtol=1e-4, atol=1e-5)


# -- refusals ----------------------------------------------------------------------------------------


def test_another_shapeshift_version_is_refused(compiled, tmp_path, no_compiler):
    edited = _edited(compiled, tmp_path, shapeshift_version="0.0.1-other")
    with pytest.raises(ArtifactError, match=rf"{edited}: built by shapeshift 0\.0\.1-other, this is shapeshift"):
        shapeshift.InferenceSession(edited)


def test_missing_cpu_feature_is_named(compiled, tmp_path, no_compiler):
    header, _ = read_container(compiled)
    edited = _edited(compiled, tmp_path, cpu_features=[*header["cpu_features"], "avx9000"])
    with pytest.raises(ArtifactError, match=rf"{edited}: .*CPU feature\(s\) this machine lacks: avx9000;"):
        shapeshift.InferenceSession(edited)


def test_another_architecture_is_refused(compiled, tmp_path, no_compiler):
    edited = _edited(compiled, tmp_path, machine="pdp11")
    with pytest.raises(ArtifactError, match=rf"{edited}: compiled for a pdp11 machine"):
        shapeshift.InferenceSession(edited)


def test_truncated_artifacts_are_refused(compiled, tmp_path, no_compiler):
    data = compiled.read_bytes()
    cut = tmp_path / "cut.ssa"
    for length, pattern in ((len(data) - 100, "truncated artifact: .* bytes, its header announces"),
                            (200, "truncated artifact: the header is cut short"),
                            (30, "truncated or corrupt artifact: no complete magic line")):
        cut.write_bytes(data[:length])
        with pytest.raises(ArtifactError, match=rf"{cut}: {pattern}"):
            shapeshift.InferenceSession(cut)


@pytest.mark.parametrize("where,pattern", [
    ("library", "section 'library' does not match its sha256"),
    ("header", "the header does not match its sha256"),
    ("end", r"1 bytes after its last section"),
])
def test_corrupt_artifacts_are_refused(compiled, tmp_path, no_compiler, where, pattern):
    data = bytearray(compiled.read_bytes())
    if where == "library":
        data[_library_offset(compiled) + 1000] ^= 0x01
    elif where == "header":
        data[data.index(b'"graph"') + 3] ^= 0x01
    else:
        data += b"\0"
    bad = tmp_path / "bad.ssa"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=rf"{bad}: corrupt artifact: {pattern}"):
        shapeshift.InferenceSession(bad)


def test_source_hash_mismatch_is_refused(compiled, tmp_path, no_compiler):
    edited = _edited(compiled, tmp_path, source_sha256="0" * 64)
    with pytest.raises(ArtifactError, match=rf"{edited}: the program rebuilt from its model differs"):
        shapeshift.InferenceSession(edited)


def test_missing_library_section_never_compiles(compiled, tmp_path, no_compiler):
    header, sections = read_container(compiled)
    del header["sections"], sections["library"]
    bare = tmp_path / "bare.ssa"
    write_container(bare, header, sections)
    with pytest.raises(ArtifactError, match="holds no library section"):
        shapeshift.InferenceSession(bare)


def test_other_ranges_and_the_reference_backend_are_refused(compiled, no_compiler):
    with pytest.raises(ArtifactError, match=r"compiled for dynamic ranges batch=1:4, seq=1:64, not seq=1:128"):
        shapeshift.InferenceSession(compiled, dynamic={"seq": (1, 128)})
    with pytest.raises(ArtifactError, match="native backend only"):
        shapeshift.InferenceSession(compiled, backend="reference")


def test_onnx_paths_behave_as_before(encoder_path, tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        shapeshift.InferenceSession(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.ssa"
    garbage.write_bytes(b"SHAPESHIFT-NOT-QUITE\n" * 4)
    with pytest.raises(ModelLoadError, match="ONNX model"):
        shapeshift.InferenceSession(garbage)
    session = shapeshift.InferenceSession(str(encoder_path))
    assert session.backend == "native"  # the default for a model
    assert not is_artifact(tmp_path) and not is_artifact(encoder_path.read_bytes())


# -- writing -----------------------------------------------------------------------------------------


def test_a_failed_write_leaves_out_untouched(tmp_path, monkeypatch):
    out = tmp_path / "out.ssa"
    out.write_bytes(b"previous")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(artifact_mod.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_container(out, {"shapeshift_version": "x"}, {"model": b"abc"})
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.ssa"]


@pytest.mark.parametrize("make,pattern", [
    (lambda d: d / "missing.onnx", "no such file"),
    (lambda d: (d / "garbage.onnx").write_bytes(b"\x00\x01 not protobuf \xff" * 10) and d / "garbage.onnx",
     "ONNX model"),
])
def test_cli_compile_of_a_bad_model_exits_2_with_one_line(tmp_path, make, pattern):
    model = make(tmp_path)
    out = tmp_path / "out.ssa"
    result = subprocess.run([sys.executable, "-m", "shapeshift.cli.main", "compile", str(model), "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith("shapeshift compile: error: ") and pattern in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_host_cpu_features_reads_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu vme avx2 fma hypervisor avx512f\n")
    assert host_cpu_features(x86) == ["avx2", "avx512f", "fma"]
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert host_cpu_features(arm) == ["asimd", "fp", "sve"]
    assert host_cpu_features(tmp_path / "absent") is None


# -- models built in program versions -----------------------------------------------------------


def test_a_model_in_program_versions_compiles_to_one_artifact(tmp_path, build_cache, monkeypatch):
    # The nested value/shape guard model (tests/test_native_versions.py): three versions, each
    # with its library in the artifact, rebuilt and checked on loading, and run without a compiler.
    import onnxruntime as ort

    from shapeshift.runtime.versions import VersionedExecutor

    from .test_native_versions import _mode_model

    path = _mode_model(tmp_path, nested=True)
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(build_cache))
    out = tmp_path / "nested.ssa"
    written = shapeshift.compile(path, out, dynamic={"B": (1, 8), "T": (1, 16)})
    assert written.header["guards"] == ["mode_if", "squeeze_if"]
    assert [v["outcome"] for v in written.header["versions"]] == [[False, None], [True, False], [True, True]]
    assert sorted(s for s in written.sections if s.startswith("library.")) == ["library.0", "library.1", "library.2"]
    assert "library" not in written.sections and "source_sha256" not in written.header

    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(build, "_run_compiler", lambda cmd: pytest.fail(f"the compiler ran: {cmd}"))
    session = shapeshift.InferenceSession(out)
    assert isinstance(session._executor, VersionedExecutor) and len(session._executor.versions) == 3
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for (b, t), mode in [((2, 1), 1), ((3, 6), 1), ((2, 5), 0), ((1, 1), 4)]:
        feed = {"x": rng.standard_normal((b, t)).astype(np.float32), "mode": np.array(mode, np.int64)}
        got, = session.run(None, feed)
        want, = reference.run(None, feed)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, err_msg=f"B={b} T={t} mode={mode}")

    # A version whose recorded source differs is refused like a plain artifact's.
    header, sections = read_container(out)
    header.pop("sections")
    header["versions"][1]["source_sha256"] = "0" * 64
    edited = tmp_path / "edited.ssa"
    write_container(edited, header, sections)
    with pytest.raises(ArtifactError, match=rf"{edited}: the program rebuilt from its model differs"):
        shapeshift.InferenceSession(edited)
    # So is one that lost a version's library.
    header["versions"][1] = dict(written.header["versions"][1])
    del sections["library.2"]
    write_container(edited, header, sections)
    with pytest.raises(ArtifactError, match="holds no library.2 section"):
        shapeshift.InferenceSession(edited)


AVX2_ONLY_CPUINFO = Path(__file__).parent / "target_samples" / "skylake_client.cpuinfo"


def test_an_artifact_for_x86_64_v3_runs_where_only_avx2_is_allowed(encoder_path, build_cache, tmp_path,
                                                                   monkeypatch):
    """compile --target x86-64-v3 on any machine (AVX-512 here, if it has it): the header needs
    only that level's features and names the target, the library has no zmm instruction, and
    it loads and matches onnxruntime on a machine that reports an AVX2-only CPU (the
    Skylake sample as this machine's /proc/cpuinfo). A --target native artifact is refused
    there, naming the features the sample lacks, whenever the host has any such feature."""
    from shapeshift.target.description import X86_64_V3

    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(build_cache))
    v3 = shapeshift.compile(encoder_path, tmp_path / "v3.ssa", dynamic=DYNAMIC, target="x86-64-v3")
    native = shapeshift.compile(encoder_path, tmp_path / "native.ssa", dynamic=DYNAMIC)
    assert v3.header["target"]["name"] == "x86-64-v3" and "-march=x86-64-v3" in v3.header["flags"]
    assert set(v3.header["cpu_features"]) <= X86_64_V3 and "avx512f" not in v3.header["cpu_features"]
    assert native.header["target"]["name"] == "native"
    objdump = shutil.which("objdump")
    if objdump is not None:  # no zmm register anywhere in the library's code
        library = tmp_path / "v3.so"
        library.write_bytes(v3.sections["library"])
        listing = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        assert "%zmm" not in listing

    sample = artifact_mod.host_cpu_features(AVX2_ONLY_CPUINFO)
    monkeypatch.setattr(artifact_mod, "host_cpu_features", lambda *args: sample)
    session = shapeshift.InferenceSession(str(v3.path))
    for seq in SEQ_LENGTHS:
        feed = _feed(2, seq)
        np.testing.assert_allclose(session.run(None, feed)[0], _expected(encoder_path, feed), rtol=1e-4, atol=1e-4)
    missing = sorted(set(native.header["cpu_features"]) - set(sample))
    if missing:
        with pytest.raises(ArtifactError, match="needs CPU feature.*" + missing[0]):
            shapeshift.InferenceSession(str(native.path))
    else:  # this machine has nothing the sample lacks: the native artifact runs there too
        shapeshift.InferenceSession(str(native.path))


def test_compile_refuses_an_unknown_target(encoder_path, tmp_path):
    result = subprocess.run([sys.executable, "-m", "shapeshift.cli.main", "compile", str(encoder_path), "-o",
                             str(tmp_path / "x.ssa"), "--target", "pentium4"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown target 'pentium4'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "x.ssa").exists()
