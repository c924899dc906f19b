"""The command line: `info` and `run`, and one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from shapeshift.cli.main import main


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shapeshift.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def test_info_lists_symbolic_inputs_and_ops(encoder_path, capsys):
    assert main(["info", str(encoder_path)]) == 0
    out = capsys.readouterr().out
    assert "opset:   ai.onnx 17" in out
    assert "  input_ids: int64[batch, seq]" in out
    assert "  last_hidden_state: float[batch, seq, 32]" in out
    assert "MatMul" in out and "unsupported ops: none" in out


def test_run_random_prints_outputs(encoder_path, capsys):
    assert main(["run", str(encoder_path), "--random", "--dynamic", "seq=5:5", "--dynamic", "batch=2:2"]) == 0
    out = capsys.readouterr().out
    assert "output last_hidden_state: float32[2, 5, 32]" in out


def test_run_with_input_files(encoder_path, tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.arange(6, dtype=np.int64).reshape(1, 6))
    np.save(tmp_path / "mask.npy", np.ones((1, 6), np.int64))
    save_dir = tmp_path / "out"
    assert main(["run", str(encoder_path), "--input", f"input_ids={tmp_path / 'ids.npy'}",
                 "--input", f"attention_mask={tmp_path / 'mask.npy'}", "--save", str(save_dir)]) == 0
    assert np.load(save_dir / "last_hidden_state.npy").shape == (1, 6, 32)


@pytest.mark.parametrize("args,pattern", [
    (["info", "{missing}"], "no such file"),
    (["info", "{garbage}"], "ONNX model"),
    (["run", "{model}"], "pass --input NAME=FILE.npy or --random"),
    (["run", "{model}", "--input", "input_ids={garbage}", "--random"], "not a .npy array"),
    (["run", "{model}", "--input", "nope={ids}", "--random"], "unknown input name"),
    (["run", "{model}", "--random", "--dynamic", "seq=9:2"], "--dynamic 'seq=9:2'"),
    (["run", "{model}", "--input", "input_ids={ids32}", "--random"], "'input_ids': expected dtype int64"),
])
def test_errors_print_one_line_and_exit_2(encoder_path, tmp_path, args, pattern):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    np.save(tmp_path / "ids.npy", np.zeros((1, 3), np.int64))
    np.save(tmp_path / "ids32.npy", np.zeros((1, 3), np.int32))
    paths = {"missing": tmp_path / "missing.onnx", "garbage": garbage, "model": encoder_path,
             "ids": tmp_path / "ids.npy", "ids32": tmp_path / "ids32.npy"}
    result = _cli(*[a.format(**paths) for a in args])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and pattern in lines[0], result.stderr


def test_simplify_prints_table_checks_and_writes(encoder_path, tmp_path):
    out = tmp_path / "simplified.onnx"
    result = _cli("simplify", str(encoder_path), str(out), "--check", "2", "--dynamic", "seq=1:32",
                  "--dynamic", "batch=1:3")
    assert result.returncode == 0, result.stderr
    assert "Shape ops" in result.stdout and "check 2/2" in result.stdout and "outputs equal" in result.stdout
    import onnx

    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert sum(n.op_type == "Shape" for n in model.graph.node) < 17


def test_simplify_input_shape_makes_the_model_static(encoder_path, tmp_path):
    out = tmp_path / "static.onnx"
    result = _cli("simplify", str(encoder_path), str(out), "--input-shape", "input_ids=1,8",
                  "--input-shape", "attention_mask=1,8")
    assert result.returncode == 0, result.stderr
    import onnx

    model = onnx.load(out)
    assert not [n for n in model.graph.node if n.op_type == "Shape"]
    dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 8, 32]


def test_simplify_output_is_readable_like_any_new_file(encoder_path, tmp_path):
    out = tmp_path / "simplified.onnx"
    result = _cli("simplify", str(encoder_path), str(out))
    assert result.returncode == 0, result.stderr
    from shapeshift.files import new_file_mode

    assert out.stat().st_mode & 0o777 == new_file_mode() and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_save_atomically_with_external_data_and_after_a_failed_write(encoder_path, tmp_path, monkeypatch):
    import onnx

    from shapeshift.cli import simplify_cmd

    model = onnx.load(encoder_path)
    out = tmp_path / "big.onnx"
    monkeypatch.setattr(simplify_cmd, "EXTERNAL_DATA_THRESHOLD", 0)  # every model counts as over 2 GB
    simplify_cmd.save_atomically(onnx.load(encoder_path), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    reread = onnx.load(out)
    assert {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in reread.graph.initializer} == \
        {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}
    # A write that fails halfway leaves the published files as they were, and no staging folder.
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(simplify_cmd.onnx, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        simplify_cmd.save_atomically(model, out)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_failed_write_of_a_one_file_model_leaves_out_as_it_was(encoder_path, tmp_path, monkeypatch):
    from shapeshift.cli import simplify_cmd

    out = tmp_path / "out.onnx"
    out.write_bytes(b"the previous output")

    def failing_write(path, data):
        path.write_bytes(data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(simplify_cmd, "_write_bytes", failing_write)
    with pytest.raises(OSError, match="disk full"):
        simplify_cmd.save_atomically(onnx.load(encoder_path), out)
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"] and out.read_bytes() == b"the previous output"


def _table_sizes_kib(stdout: str) -> tuple[int, int]:
    row = next(line for line in stdout.splitlines() if "file size (KiB)" in line)
    before, after = row.split()[-2:]
    return int(before), int(after)


def test_the_table_gives_the_sizes_of_the_files(encoder_path, tmp_path):
    """Before: the input file; after: the file written (both without serializing anything
    more than the output, once)."""
    out = tmp_path / "simplified.onnx"
    result = _cli("simplify", str(encoder_path), str(out))
    assert result.returncode == 0, result.stderr
    assert _table_sizes_kib(result.stdout) == (encoder_path.stat().st_size // 1024, out.stat().st_size // 1024)


def test_the_size_of_a_model_with_external_data_counts_its_data_file(encoder_path, tmp_path):
    model = onnx.load(encoder_path)
    source = tmp_path / "external.onnx"
    onnx.save(model, str(source), save_as_external_data=True, all_tensors_to_one_file=True,
              location="external.onnx.data", size_threshold=0)
    stored = source.stat().st_size + (tmp_path / "external.onnx.data").stat().st_size
    out = tmp_path / "simplified.onnx"
    result = _cli("simplify", str(source), str(out), "--check", "1", "--dynamic", "seq=1:16", "--dynamic", "batch=1:2")
    assert result.returncode == 0, result.stderr
    assert _table_sizes_kib(result.stdout)[0] == stored // 1024 and "outputs equal" in result.stdout


def test_simplify_bad_input_writes_nothing(tmp_path):
    garbage = tmp_path / "bad.onnx"
    garbage.write_bytes(b"not a model at all" * 5)
    out = tmp_path / "out.onnx"
    result = _cli("simplify", str(garbage), str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.onnx.*"))


@pytest.mark.parametrize("spec,pattern", [
    ("nope=1,2", "'nope', which is not a graph input"),
    ("input_ids=1", "'input_ids' has rank 2; the shape given for it has 1 dims"),
])
def test_simplify_bad_input_shape(encoder_path, tmp_path, spec, pattern):
    out = tmp_path / "out.onnx"
    result = _cli("simplify", str(encoder_path), str(out), "--input-shape", spec)
    assert result.returncode == 2 and pattern in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_info_lists_unsupported_ops_instead_of_failing(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Frobnicate", ["a"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "unsupported.onnx"
    onnx.save(model, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "unsupported ops: Frobnicate x1" in out and "  x: float[n]" in out
    result = _cli("run", str(path), "--random")
    assert result.returncode == 2 and "unsupported ops: Frobnicate x1" in result.stderr


def test_run_on_the_native_backend_gives_the_reference_outputs(encoder_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    outputs = {}
    for backend in ("reference", "native"):
        save = tmp_path / backend
        assert main(["run", str(encoder_path), "--random", "--seed", "3", "--backend", backend,
                     "--save", str(save)]) == 0
        assert f"on the {backend} backend" in capsys.readouterr().out
        outputs[backend] = np.load(save / "last_hidden_state.npy")
    np.testing.assert_allclose(outputs["native"], outputs["reference"], rtol=1e-5, atol=1e-6)


def test_info_native_lists_compiled_and_fallback_ops(encoder_path, capsys):
    assert main(["info", str(encoder_path), "--backend", "native"]) == 0
    out = capsys.readouterr().out
    assert "native backend:" in out and "as C code, 1 compiled segment(s)" in out
    compiled = next(line for line in out.splitlines() if line.startswith("  compiled:"))
    fallback = next(line for line in out.splitlines() if line.startswith("  reference fallback:"))
    # The bundled encoder lowers completely: attention, GELU and LayerNorm included.
    assert all(f"{op} x" in compiled for op in ("MatMul", "Softmax", "LayerNormalization", "Erf"))
    assert fallback == "  reference fallback: none"


@pytest.mark.parametrize("command", ["simplify", "compile"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "empty"])
def test_an_output_that_is_no_regular_file_is_refused_untouched(encoder_path, tmp_path, command, kind):
    """The write goes through a rename: over a device (run as root, /dev/null) or a pipe it
    would have put a regular file in its place. Refused before any work, left as it was."""
    import os
    import stat

    target = tmp_path / "out"
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    spec = "" if kind == "empty" else str(target)
    args = [command, str(encoder_path), spec] if command == "simplify" else [command, str(encoder_path), "-o", spec]
    result = _cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("path is empty" in result.stderr if kind == "empty" else "name a file to write" in
            result.stderr)
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if kind == "empty" else ["out"])


def test_outputs_through_a_symlink_and_into_new_folders(encoder_path, tmp_path):
    """A symlinked OUT keeps its link (the file it points to gets the model), and compile
    makes missing folders, as simplify does."""
    real = tmp_path / "real.onnx"
    link = tmp_path / "link.onnx"
    link.symlink_to(real)
    assert _cli("simplify", str(encoder_path), str(link)).returncode == 0
    assert link.is_symlink() and onnx.load(str(real)).graph.node
    artifact = tmp_path / "new" / "folder" / "model.ss"
    result = _cli("compile", str(encoder_path), "-o", str(artifact))
    assert result.returncode == 0, result.stderr
    assert artifact.is_file()


def test_compile_refuses_to_write_over_its_model(encoder_path, tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(encoder_path.read_bytes())
    result = _cli("compile", str(model), "-o", str(model))
    assert result.returncode == 2 and "is the model being compiled" in result.stderr
    assert model.read_bytes() == encoder_path.read_bytes()


def test_simplify_writes_its_output_even_when_the_reader_of_its_table_stops(encoder_path, tmp_path):
    """`shapeshift simplify IN OUT | head -1`: the table was printed before OUT was written,
    and the closed pipe ended the command with a traceback and no OUT."""
    out = tmp_path / "out.onnx"
    command = f"{sys.executable} -m shapeshift.cli.main simplify {encoder_path} {out} | head -c 1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert onnx.load(str(out)).graph.node


def test_run_profile_takes_the_default_backend(encoder_path, capsys):
    assert main(["run", str(encoder_path), "--random", "--profile", "--dynamic", "seq=4:4",
                 "--dynamic", "batch=1:1"]) == 0
    assert "native" in capsys.readouterr().out


def test_a_file_the_command_cannot_write_is_named_without_a_traceback(encoder_path, tmp_path):
    """An OSError (here: --save under a path whose parent is a file) is a one-line error."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _cli("run", str(encoder_path), "--random", "--save", str(blocker / "outputs"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(blocker) in result.stderr


def test_an_npz_archive_as_an_input_is_named(encoder_path, tmp_path):
    archive = tmp_path / "ids.npz"
    np.savez(archive, input_ids=np.zeros((1, 3), np.int64))
    result = _cli("run", str(encoder_path), "--random", "--input", f"input_ids={archive}")
    assert result.returncode == 2 and "an .npz archive, not one .npy array" in result.stderr
    assert "Traceback" not in result.stderr


def test_simplify_names_an_artifact_and_refuses_a_negative_input_shape(encoder_path, tmp_path):
    artifact = tmp_path / "model.ss"
    assert _cli("compile", str(encoder_path), "-o", str(artifact)).returncode == 0
    result = _cli("simplify", str(artifact), str(tmp_path / "out.onnx"))
    assert result.returncode == 2 and "a compiled artifact (shapeshift compile), not an ONNX model" in result.stderr
    result = _cli("simplify", str(encoder_path), str(tmp_path / "out.onnx"), "--input-shape", "input_ids=-1,8")
    assert result.returncode == 2 and "dimension -1 is negative" in result.stderr
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("args,pattern", [
    (["run", "{model}", "--random", "--seed", "-1"], "--seed: must be a non-negative integer"),
    (["run", "{model}", "--random", "--dynamic", "seq=1:99999999999999999999"], "past the largest dim"),
    (["simplify", "{model}", "{out}", "--input-shape", "input_ids=99999999999999999999999,8"], "past the largest"),
], ids=["seed", "range", "input shape"])
def test_numbers_out_of_range_are_one_line_errors(encoder_path, tmp_path, args, pattern):
    result = _cli(*[a.format(model=encoder_path, out=tmp_path / "out.onnx") for a in args])
    assert result.returncode == 2 and pattern in result.stderr and "Traceback" not in result.stderr


def test_run_save_keeps_outputs_whose_safe_names_collide(tmp_path):
    """Outputs 'a/b' and 'a_b' both make a_b.npy: the second one overwrote the first."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a/b", "a_b")]
    nodes = [helper.make_node("Relu", ["x"], ["a/b"]), helper.make_node("Neg", ["x"], ["a_b"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.save(tmp_path / "x.npy", np.array([-1.0, 2.0], np.float32))
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--save", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "a_b.npy"), [0.0, 2.0])
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "a_b_1.npy"), [1.0, -2.0])


def test_run_random_makes_bfloat16_inputs_and_names_an_untyped_one(tmp_path, capsys):
    """--random fed bfloat16 inputs Python objects (then refused), and an input without a
    type was called missing."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "bf16.onnx")
    assert main(["run", str(tmp_path / "bf16.onnx"), "--random"]) == 0
    assert "output y: bfloat16[" in capsys.readouterr().out
    del model.graph.input[:]
    model.graph.input.append(onnx.ValueInfoProto(name="x"))
    onnx.save(model, tmp_path / "untyped.onnx")
    assert main(["run", str(tmp_path / "untyped.onnx"), "--random"]) == 2
    assert "input(s) 'x' have no tensor type in the model" in capsys.readouterr().err


def test_simplify_api_names_an_input_shape_that_is_no_list(encoder_path):
    import shapeshift
    from shapeshift.errors import ShapeshiftError

    with pytest.raises(ShapeshiftError, match="input 'input_ids': the shape given for it is 3, not a list of dims"):
        shapeshift.simplify(str(encoder_path), input_shapes={"input_ids": 3})
