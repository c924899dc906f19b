"""`shapeshift simplify IN OUT`: simplify, print a before/after table, optionally check."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
from onnx import external_data_helper

from ..errors import ShapeshiftError
from ..files import output_target, publish
from ..frontend.external_data import has_external_data, nbytes, save_with_external_data
from ..frontend.onnx_import import read_model, read_model_sized
from ..passes.simplify import simplify_model
from ..passes.simplify.report import count_model
from .feeds import random_feed

#: Past this many bytes of tensors a model is written with external data (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


class CheckFailed(ShapeshiftError):
    """The simplified model's outputs differ from the original's."""


def parse_input_shape(text: str) -> tuple[str, list]:
    name, sep, dims = text.partition("=")
    if not sep or not name or not dims:
        raise ShapeshiftError(f"--input-shape {text!r}: expected NAME=D0,D1,... (ints or symbol names)")
    return name, [d.strip() for d in dims.split(",")] if dims.strip() else []


def _row(label: str, before, after) -> str:
    return f"  {label:<24} {str(before):>12} {str(after):>12}"


def print_table(before, after, seconds: float) -> None:
    print(f"  {'':<24} {'before':>12} {'after':>12}")
    print(_row("nodes", before.nodes, after.nodes))
    print(_row("Shape ops", before.shape_ops, after.shape_ops))
    print(_row("dynamic ops", before.dynamic_ops, after.dynamic_ops))
    print(_row("file size (KiB)", before.size_bytes // 1024, after.size_bytes // 1024))
    changed = sorted(op for op in set(before.ops) | set(after.ops) if before.ops[op] != after.ops[op])
    for op in changed:
        print(_row(f"  {op}", before.ops[op], after.ops[op]))
    print(f"  simplified in {seconds * 1000:.0f} ms")


def serialized(model: onnx.ModelProto) -> Optional[bytes]:
    """The bytes of ``model`` as one file, or None when its tensors are too large for one
    protobuf or still in the input's external data file (it is then written with external
    data)."""
    if has_external_data(model):
        return None
    # Sized from dims: reading raw_data copies it out of the proto (2 GB: 3 s and 2 GB more).
    tensor_bytes = sum(nbytes(t) for t in model.graph.initializer)
    return None if tensor_bytes > EXTERNAL_DATA_THRESHOLD else model.SerializeToString()


def _write_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def save_atomically(model: onnx.ModelProto, path: Path, data: Optional[bytes] = None,
                    source_dir: Optional[Path] = None, before_publish=None) -> None:
    """Write to a staging folder next to ``path``, then rename into place: never a
    half-written OUT (files.py). A model written with external data publishes its data
    file first, then the model that reads it; its tensors still in the input's external
    data file (under ``source_dir``) are copied from there, file to file, and ``model``
    then refers to the new file.  ``data``: ``serialized(model)``, if the caller has it
    (serializing a BERT-base takes a second).  ``before_publish(staged_path)``, for a model
    written with external data: run on the staged files (a check raising leaves OUT as it
    was)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = serialized(model)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        staged = staging / path.name
        if data is None:
            data_name = f"{path.name}.data"
            save_with_external_data(model, staged, data_name, source_dir or path.parent)
            if before_publish is not None:
                before_publish(staged)
            publish(staging / data_name, path.parent / data_name)
        else:
            _write_bytes(staged, data)
        publish(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def model_bytes(path: Path, stored_bytes: int) -> bytes:
    """The model at ``path`` as one protobuf: the file itself or, when it keeps tensors in
    external files, the model with them loaded (onnxruntime's shape inference cannot read
    an external constant)."""
    if path.stat().st_size == stored_bytes:
        return path.read_bytes()
    return read_model(path).SerializeToString()


def _session(model: bytes, which: str):
    import onnxruntime as ort

    try:
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors
        raise CheckFailed(f"onnxruntime cannot load the {which} model: {str(exc).splitlines()[0][:300]}") from None


def check_outputs(original: bytes, simplified: bytes, graph, dynamic, count: int) -> list[str]:
    """Run the original and the simplified model on ``count`` random feeds in the
    declared ranges; CheckFailed on the first difference, else a line per feed."""
    lines = []
    reference = _session(original, "original")
    candidate = _session(simplified, "simplified")
    rng = np.random.default_rng(0)
    for trial in range(count):
        feed = random_feed(graph, list(graph.inputs), dynamic or {}, rng)
        shapes = _shapes_text(feed)
        try:
            want = reference.run(None, feed)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors
            raise CheckFailed(f"check {trial + 1}: onnxruntime cannot run the original model on random inputs "
                              f"{shapes}: {str(exc).splitlines()[0][:300]}") from None
        try:
            got = candidate.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"check {trial + 1}: onnxruntime cannot run the simplified model on inputs "
                              f"{shapes}: {str(exc).splitlines()[0][:300]}") from None
        worst = 0.0
        for name, w, g in zip([o.name for o in reference.get_outputs()], want, got):
            if w.shape != g.shape or w.dtype != g.dtype:
                raise CheckFailed(f"check {trial + 1}: output {name!r} is {g.dtype}{list(g.shape)}, "
                                  f"original gives {w.dtype}{list(w.shape)} (inputs {shapes})")
            if w.dtype.kind == "f":
                scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
                diff = float(np.nanmax(np.abs(w - g))) if w.size else 0.0
                if not diff <= 1e-4 * scale:
                    raise CheckFailed(f"check {trial + 1}: output {name!r} differs by {diff:.3g} (inputs {shapes})")
                worst = max(worst, diff)
            elif not np.array_equal(w, g):
                raise CheckFailed(f"check {trial + 1}: output {name!r} differs (inputs {shapes})")
        lines.append(f"  check {trial + 1}/{count}: inputs {shapes}: outputs equal (max abs diff {worst:.2g})")
    return lines


def _shapes_text(feed: dict) -> str:
    items = [f"{name}{list(array.shape)}" for name, array in feed.items()]
    return ", ".join(items[:3]) + (f", ... ({len(items)} inputs)" if len(items) > 3 else "")


def _stored_size(path: Path) -> int:
    """A model file and the external data files it names."""
    return read_model_sized(path, load_external=False)[1]


def cmd_simplify(args) -> int:
    output = output_target(args.output)  # before the work: a bad OUT is refused at once
    source_dir = Path(args.input).parent
    # External data stays in its file unless the model is small enough for one protobuf:
    # loading copies it twice (the file's bytes, then protobuf's), and a tensor simplify
    # does not read is copied file to file when OUT is written.
    original, stored_bytes = read_model_sized(args.input, load_external=False)
    external = has_external_data(original)
    if external and stored_bytes <= EXTERNAL_DATA_THRESHOLD:
        external_data_helper.load_external_data_for_model(original, str(source_dir))
        external = False
    before = count_model(original, stored_bytes)
    input_shapes = dict(parse_input_shape(t) for t in args.input_shape)
    start = time.perf_counter()
    # The model read becomes the output (its unchanged weights are not copied: half the
    # peak memory on a large model); --check reads the input file again.
    simplified, graph, stats = simplify_model(original, args.dynamic, input_shapes or None, args.strategy,
                                              consume=True, merge_matmuls=args.merge_matmuls,
                                              external_dir=str(source_dir) if external else None)
    seconds = time.perf_counter() - start
    del original
    # Serialized once: for the table's size, for --check and for the file.
    data = serialized(simplified)
    checks = []
    # onnxruntime reads a model over 2 GiB from its path (with its external data), not from bytes.
    reference = str(args.input) if external else None
    if data is None:
        def check_staged(staged: Path) -> None:
            if args.check:
                checks.extend(check_outputs(reference or model_bytes(Path(args.input), stored_bytes), str(staged),
                                            graph, args.dynamic, args.check))

        # Written before anything is printed: a reader that stops early (| head) loses nothing.
        save_atomically(simplified, output, None, source_dir, before_publish=check_staged)
        after = count_model(simplified, _stored_size(output))
    else:
        after = count_model(simplified, len(data))
        if args.check:
            checks = check_outputs(model_bytes(Path(args.input), stored_bytes), data, graph, args.dynamic,
                                   args.check)
        save_atomically(simplified, output, data)
    print(f"{args.input} -> {args.output} (strategy {args.strategy})")
    print_table(before, after, seconds)
    for warning in stats.warnings[:5]:
        print(f"  warning: {warning}")
    for line in checks:
        print(line)
    return 0
