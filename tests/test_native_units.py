"""A large program's C is split into translation units compiled in parallel
(codegen/emit.py): the split program computes what onnxruntime does, passes a step's error
code on from a later part, and survives a compiled artifact. Splitting is forced on small
models by lowering ``UNIT_CHARS``."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeshift
from shapeshift.codegen import emit
from shapeshift.errors import ExecutionError

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")


@pytest.fixture
def small_units(monkeypatch):
    monkeypatch.setattr(emit, "UNIT_CHARS", 1500)
    monkeypatch.setattr(emit, "SMALL_PROGRAM_CHARS", 0)


def _shared_definitions(units: list[str]) -> dict[str, list[int]]:
    """Each shared step function of a program's ``units``, with the units that define it."""
    defined: dict[str, list[int]] = {}
    for u, text in enumerate(units):
        for name in re.findall(r"\bint (ss_step_shared_\d+)\([^)]*\) \{", text):
            defined.setdefault(name, []).append(u)
    return defined


def _calls(text: str, name: str) -> int:
    """How many steps ``text`` runs with shared function ``name``: calls, and rows of a table
    of such steps run by one loop."""
    return text.count(f"{name}(v, e,") + text.count(f"{{{name}, ")


def _encoder_feed(batch: int, seq: int) -> dict:
    rng = np.random.default_rng(seq)
    return {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def test_a_split_encoder_matches_onnxruntime(encoder_path, small_units, compiler_calls):
    import onnxruntime as ort

    session = shapeshift.InferenceSession(encoder_path, backend="native")
    program = session._executor.program
    assert len(program.parts) >= 2 and len(program.segments) == 1
    assert "_part1(v, e)) != 0) return code;" in program.source  # the segment calls its parts in turn
    assert len(compiler_calls) == 1, "one library, its units linked"
    reference = ort.InferenceSession(str(encoder_path), providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 1), (2, 9), (1, 30)):
        feed = _encoder_feed(batch, seq)
        np.testing.assert_allclose(session.run(None, feed)[0], reference.run(None, feed)[0], rtol=1e-4, atol=1e-5)


def test_an_error_in_a_later_part_is_passed_on(small_units):
    # Enough steps before the Gather that it lands in a part after the first.
    nodes = [helper.make_node("Mul" if i % 2 else "Add", [f"x{i}", f"x{i}"], [f"x{i + 1}"]) for i in range(40)]
    nodes.append(helper.make_node("Gather", ["table", "ids"], ["g"], axis=0, name="lookup"))
    graph = helper.make_graph(
        nodes, "late_error",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["m"])],
        [helper.make_tensor_value_info("x40", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.ones((4, 2), np.float32), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops()
    # The Gather is glue, in the first unit but in the segment's last part (the Adds are hot).
    text = program.full_source()
    part = re.findall(r"int ss_segment\w*_part(\d+)\(", text[:text.index("lookup")])[-1]
    assert int(part) >= 1
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    assert session.run(None, {"x0": x, "ids": np.array([3, 0], np.int64)})[1].shape == (2, 2)
    with pytest.raises(ExecutionError, match="lookup"):
        session.run(None, {"x0": x, "ids": np.array([0, 4], np.int64)})


def test_a_split_program_compiles_into_an_artifact(encoder_path, small_units, tmp_path):
    out = tmp_path / "encoder.ssa"
    shapeshift.compile(str(encoder_path), str(out), dynamic={"batch": (1, 4), "seq": (1, 64)})
    loaded = shapeshift.InferenceSession(str(out))
    assert loaded._executor.program.parts
    direct = shapeshift.InferenceSession(encoder_path, backend="native")
    feed = _encoder_feed(2, 5)
    np.testing.assert_allclose(loaded.run(None, feed)[0], direct.run(None, feed)[0], rtol=1e-6, atol=1e-6)


def test_units_depend_on_size_only(encoder_path, small_units, monkeypatch):
    # An artifact is checked against the text its program prints, on any machine.
    first = shapeshift.InferenceSession(encoder_path, backend="native")._executor.program
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    second = shapeshift.InferenceSession(encoder_path, backend="native")._executor.program
    assert len(first.parts) >= 2 and first.full_source() == second.full_source()


def test_units_of_each_kind_compile_at_their_level_and_match_onnxruntime(small_units, monkeypatch, tmp_path):
    # Hot: elementwise over a symbolic size; warm: elementwise over a small static input;
    # glue: a MatMul and a Gather, calls into the kernel objects only.
    import onnxruntime as ort

    from shapeshift.codegen import build

    monkeypatch.setenv("SHAPESHIFT_CACHE_DIR", str(tmp_path / "cache"))
    commands: list = []
    real = build._run_compiler
    monkeypatch.setattr(build, "_run_compiler", lambda cmd: commands.append(cmd) or real(cmd))
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("MatMul", ["t", "w"], ["m"]), helper.make_node("Sigmoid", ["s"], ["sg"]),
             helper.make_node("Mul", ["sg", "sg"], ["sq"]),
             helper.make_node("Gather", ["table", "ids"], ["g"], axis=0)]
    graph = helper.make_graph(
        nodes, "kinds",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 37]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 5]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["k"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("m", "sq", "g")],
        initializer=[numpy_helper.from_array(rng.standard_normal((37, 9)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert set(program.unit_kinds) == {emit.HOT, emit.WARM, emit.GLUE} and program.unit_kinds[0] == emit.GLUE
    units = [program.source, *program.parts]
    compiled = {}  # unit index -> the -O flags it was compiled with
    for cmd in (cmd for cmd in commands if "-shared" not in cmd):  # the link reads objects
        text = Path(cmd[cmd.index("-o") - 1]).read_text()
        if text in units:
            compiled[units.index(text)] = tuple(f for f in cmd if f.startswith("-O"))
    assert compiled == {u: emit.OPT_FLAGS[kind] for u, kind in enumerate(program.unit_kinds)}
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 7, 33):
        feed = {"x": rng.standard_normal((n, 37)).astype(np.float32),
                "s": rng.standard_normal((3, 5)).astype(np.float32),
                "ids": rng.integers(-6, 6, n).astype(np.int64)}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_repeated_steps_share_one_function_and_keep_their_error_codes(small_units):
    # Four GatherND steps alike but for their slots (warm loops over a static count): one
    # shared function, defined once in a warm unit and called from glue code with each
    # step's slots and error code.
    import onnxruntime as ort

    nodes = [helper.make_node("GatherND", [f"data{i}", f"idx{i}"], [f"y{i}"], name=f"gnd{i}") for i in range(4)]
    graph = helper.make_graph(
        nodes, "repeats",
        [*(helper.make_tensor_value_info(f"data{i}", TensorProto.FLOAT, [6, 5]) for i in range(4)),
         *(helper.make_tensor_value_info(f"idx{i}", TensorProto.INT64, [3, 1]) for i in range(4))],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = shapeshift.InferenceSession(model, backend="native")
    program = session._executor.program
    assert not program.fallback_ops()
    text = program.full_source()
    units = [program.source, *program.parts]
    definitions = _shared_definitions(units)
    assert len(definitions) == 1, definitions
    (name, defined_in), = definitions.items()
    assert [program.unit_kinds[u] for u in defined_in] == [emit.WARM]
    calling = [u for u, unit in enumerate(units) if _calls(unit, name)]
    assert calling and all(program.unit_kinds[u] == emit.GLUE for u in calling)
    assert _calls(text, name) == 4
    assert "static const ss_shared_step steps[]" in text  # the four run from one table
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    feed = {**{f"data{i}": rng.standard_normal((6, 5)).astype(np.float32) for i in range(4)},
            **{f"idx{i}": rng.integers(-6, 6, (3, 1)).astype(np.int64) for i in range(4)}}
    for got, want in zip(session.run(None, feed), reference.run(None, feed)):
        np.testing.assert_array_equal(got, want)
    feed["idx2"] = np.array([[0], [6], [1]], np.int64)  # out of range: the third step's error
    with pytest.raises(ExecutionError, match="gnd2"):
        session.run(None, feed)


def test_repeated_hot_steps_share_one_function_and_run_in_parallel(small_units):
    # Four elementwise chains alike but for their slots, each a parallel loop over a
    # symbolic size (hot: -O3), as a transformer repeats its layers' GELU and residual Add:
    # one function, called four times, computing what onnxruntime does whether or
    # not the loop splits across the threads.
    import onnxruntime as ort

    nodes = []
    for i in range(4):
        nodes += [helper.make_node("Erf", [f"x{i}"], [f"e{i}"]), helper.make_node("Mul", [f"x{i}", f"e{i}"], [f"y{i}"])]
    graph = helper.make_graph(
        nodes, "hot_repeats", [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["n", 37]) for i in range(4)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = shapeshift.InferenceSession(model, backend="native", num_threads=2)
    program = session._executor.program
    units = [program.source, *program.parts]
    definitions = _shared_definitions(units)
    assert len(definitions) == 1, definitions
    (name, defined_in), = definitions.items()
    assert [program.unit_kinds[u] for u in defined_in] == [emit.HOT]
    assert "#pragma omp parallel" in units[defined_in[0]].split(f"int {name}(")[1]
    assert _calls(program.full_source(), name) == 4
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n in (1, 7, 33, 1000):  # 37000 elements: past the loop's parallel threshold
        feed = {f"x{i}": rng.standard_normal((n, 37)).astype(np.float32) for i in range(4)}
        for got, want in zip(session.run(None, feed), reference.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
