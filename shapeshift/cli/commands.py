"""The bodies of the CLI subcommands; each takes the parsed arguments."""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import numpy as np
import onnx

from ..errors import InputError, ShapeshiftError
from ..files import output_target
from ..frontend.onnx_import import import_model, read_model, unsupported_ops
from ..ir.graph import Graph
from ..ir.types import TensorType, dtype_name
from ..ops.registry import REGISTRY
from ..runtime.profile import format_profile
from ..runtime.session import DEFAULT_BACKEND, InferenceSession
from .feeds import random_feed


def _shape_text(value_info: onnx.ValueInfoProto) -> str:
    """A value's type exactly as the model names it (dim_param text kept)."""
    t = value_info.type
    if t.HasField("tensor_type"):
        tt = t.tensor_type
        name = dtype_name(tt.elem_type)
        if not tt.HasField("shape"):
            return f"{name}[?]"
        dims = [d.dim_param if d.dim_param else (str(d.dim_value) if d.HasField("dim_value") else "?")
                for d in tt.shape.dim]
        return f"{name}[{', '.join(dims)}]"
    return t.WhichOneof("value") or "?"


def _op_histogram(graph: Graph) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for node in graph.walk_nodes():
        counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
    return counts


def cmd_info(args) -> int:
    from ..runtime.artifact import is_artifact, read_artifact

    if args.machine:
        from ..target import host_target, measure_fma
        from ..target.report import describe

        target = host_target()
        print("\n".join(describe(target, measure_fma(target))))
        if args.model is None:
            return 0
        print()
    if args.model is None:
        raise InputError("info needs a MODEL (or --machine for this machine's description)")
    source, dynamic = args.model, args.dynamic
    if is_artifact(args.model):
        # A compiled artifact: what it holds and needs, then the model inside it.
        artifact = read_artifact(args.model)
        print(f"artifact: {artifact.path}: {artifact.size} bytes")
        _print_artifact_header(artifact)
        source, dynamic = artifact.sections["model"], dynamic or artifact.dynamic
    model = read_model(source)
    graph = import_model(model, dynamic, check=False)
    unsupported = unsupported_ops(model)
    initializers = {t.name for t in model.graph.initializer}
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in graph.opset.items())
    print(f"model:   {args.model}")
    print(f"opset:   {opsets}   (IR version {model.ir_version}, producer {model.producer_name or '?'} "
          f"{model.producer_version})")
    print("inputs:")
    for vi in model.graph.input:
        if vi.name not in initializers:
            print(f"  {vi.name}: {_shape_text(vi)}")
    print("outputs:")
    by_name = {v.name: v for v in graph.outputs}
    for vi in model.graph.output:
        inferred = by_name.get(vi.name)
        extra = f"   (inferred {inferred.type})" if inferred is not None and inferred.type is not None else ""
        print(f"  {vi.name}: {_shape_text(vi)}{extra}")
    counts = _op_histogram(graph)
    print(f"nodes:   {sum(counts.values())} (including subgraphs), {len(graph.initializers)} initializers")
    print("ops:")
    for op, count in counts.most_common():
        print(f"  {op:<28} {count}")
    delegated = sorted(op for op in counts if (("", op) not in REGISTRY and "::" not in op))
    listed = ", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items()))
    print(f"unsupported ops: {listed or 'none'}")
    if delegated:
        print(f"evaluated through onnx.reference: {', '.join(delegated)}")
    if args.backend == "native":
        _print_native_coverage(graph)
    warnings = graph.metadata.get("inference_warnings") or []
    for warning in warnings[:10]:
        print(f"warning: {warning}")
    return 0


def _print_native_coverage(graph: Graph) -> None:
    """Which nodes the native backend lowers to C and which it leaves to the reference
    evaluator (after simplification, which the native backend always runs first)."""
    from ..runtime.native import prepare_program
    from ..runtime.versions import find_guards

    program = prepare_program(graph)
    native: collections.Counter = collections.Counter()
    for step in program.steps:
        if step.kind != "fallback":
            native[step.node.op_type] += 1
            for node in ((*step.lowered.absorbed, *step.lowered.cancels) if step.lowered else ()):
                native[node.op_type] += 1
    fallback = program.fallback_ops()
    total = sum(native.values()) + sum(fallback.values())
    print(f"native backend: {sum(native.values())} of {total} nodes (after simplify) as C code, "
          f"{len(program.segments)} compiled segment(s)")
    print("  compiled: " + (", ".join(f"{op} x{n}" for op, n in native.most_common()) or "none"))
    print("  reference fallback: " + (", ".join(f"{op} x{n}" for op, n in fallback.most_common()) or "none"))
    layout = graph.metadata.get("nchwc")
    from ..codegen.lower.layout_assign import mode as nchwc_mode

    print("  layout: " + (layout.describe() if layout is not None else
                          "NCHW (NCHWc off: SHAPESHIFT_NCHWC=0)" if nchwc_mode() == "off" else
                          "NCHW (no depthwise conv; SHAPESHIFT_NCHWC=1 runs the conv trunk in NCHWc anyway)"))
    guards = find_guards(graph) if fallback or program.branches else []
    if guards:
        print(f"  {len(guards)} If(s) decided by the input shapes or small inputs' values "
              f"({', '.join(g.name for g in guards)}): a session builds one program version per outcome and "
              f"runs each feed on its own (counts above: unspecialized)")


def _load_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    feed = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {spec!r}: expected NAME=FILE.npy")
        if not os.path.exists(path):
            raise InputError(f"--input {name}: {path}: no such file")
        try:
            array = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - numpy raises several kinds
            raise InputError(f"--input {name}: {path}: not a .npy array ({type(exc).__name__}: {exc})") from None
        if not isinstance(array, np.ndarray):  # an .npz archive loads as a mapping of arrays
            array.close()
            raise InputError(f"--input {name}: {path}: an .npz archive, not one .npy array "
                             f"(save the input with np.save)")
        feed[name] = array
    return feed


def cmd_run(args) -> int:
    if args.repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {args.repeat}")
    if args.profile and (args.backend or DEFAULT_BACKEND) != "native":
        raise InputError("--profile times the native backend's steps: add --backend native")
    if args.save and Path(args.save).exists() and not Path(args.save).is_dir():
        raise InputError(f"--save {args.save}: is a file, not a folder for the outputs")
    session = InferenceSession(args.model, dynamic=args.dynamic, backend=args.backend, profile=args.profile)
    feed = _load_inputs(args.input)
    missing = [v for v in session.graph.inputs if v.name not in feed]
    if missing and not args.random:
        raise InputError(f"no value for input(s) {', '.join(repr(v.name) for v in missing)}; "
                         f"pass --input NAME=FILE.npy or --random")
    untyped = [v.name for v in missing if not isinstance(v.type, TensorType)]
    if untyped:  # random_feed cannot make them, and check_feed would call them missing
        raise InputError(f"input(s) {', '.join(map(repr, untyped))} have no tensor type in the model: give them "
                         f"with --input NAME=FILE.npy")
    if missing:
        feed.update(random_feed(session.graph, missing, args.dynamic, np.random.default_rng(args.seed), given=feed))
    for name, array in feed.items():
        print(f"input  {name}: {array.dtype}{list(array.shape)}")
    for run in range(args.repeat):
        start = time.perf_counter()
        outputs = session.run(None, feed)
        elapsed = time.perf_counter() - start
        if args.profile and run == 0 and args.repeat > 1:
            session.profile(reset=True)  # the first run pays one-time costs (thread pool, arena pages)
    for value, array in zip(session.graph.outputs, outputs):
        print(f"output {value.name}: {_summary(array)}")
    runs = f" (run {args.repeat} of {args.repeat})" if args.repeat > 1 else ""
    print(f"ran in {elapsed * 1000:.1f} ms on the {session.backend} backend{runs}")
    if args.profile:
        print()
        print(format_profile(session.profile(), args.repeat - 1 if args.repeat > 1 else 1))
    if args.save:
        out_dir = Path(args.save)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, array in zip(_file_names([v.name for v in session.graph.outputs]), outputs):
            np.save(out_dir / f"{name}.npy", np.asarray(array))
            print(f"saved  {out_dir / name}.npy")
    return 0


def _file_names(names: list[str]) -> list[str]:
    """A file name per output: its name made safe, with a number after any that two share
    (``a/b`` and ``a_b`` both make ``a_b``: the second file overwrote the first)."""
    taken: set[str] = set()
    result = []
    for name in names:
        base = candidate = _safe(name)
        count = 1
        while candidate in taken:
            candidate = f"{base}_{count}"
            count += 1
        taken.add(candidate)
        result.append(candidate)
    return result


def cmd_compile(args) -> int:
    from ..runtime.artifact import write_artifact
    from ..runtime.session import load_tuning
    from ..target import named_target

    if args.threads is not None and args.threads < 1:
        raise ShapeshiftError(f"--threads must be a positive integer, got {args.threads}")
    output = output_target(args.output, "artifact")
    if Path(args.model).exists() and output == Path(os.path.realpath(args.model)):
        raise ShapeshiftError(f"{args.output}: is the model being compiled; name another file for the artifact")
    target = named_target(args.target)  # an unknown name is refused before any work
    tuning = load_tuning(args.db, args.threads)
    artifact = write_artifact(args.model, output, args.dynamic, tuning=tuning, target=target)
    print(f"wrote {artifact.path}: {artifact.size} bytes")
    _print_artifact_header(artifact)
    if tuning is not None:
        used = _tuned_weights(artifact)
        print(f"tuning records from {args.db}: {len(tuning)} weight shape(s), used by this model: "
              + (", ".join(used) or "none (no MatMul/Gemm weight of a tuned shape)"))
    return 0


def _print_artifact_header(artifact) -> None:
    header = artifact.header
    parts = ", ".join(f"{s['name']} {s['size']} bytes" for s in header["sections"])
    ranges = ", ".join(f"{k}={lo}:{hi}" for k, (lo, hi) in sorted(artifact.dynamic.items())) or "as declared"
    print(f"sections: {parts}")
    print(f"shapeshift {header['shapeshift_version']}, dynamic ranges: {ranges}")
    built_for = header.get("target") or {}
    if built_for:
        print(f"target: {built_for.get('name')} (-march={built_for.get('march')})")
    print(f"needs CPU features ({header['machine']}): {', '.join(header['cpu_features']) or 'none'}")
    if "versions" in header:
        print(f"{len(header['versions'])} program versions, one per outcome of the input-decided Ifs "
              f"{', '.join(header['guards'])}")
    if header.get("tuning"):
        print(f"tuned GEMM records: {', '.join(_tuned_weights(artifact))}")


def _tuned_weights(artifact) -> list[str]:
    return [f"[{t['k']}, {t['n']}]" for t in artifact.header.get("tuning", [])]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _summary(array) -> str:
    if not isinstance(array, np.ndarray):
        return f"{type(array).__name__}"
    head = f"{array.dtype}{list(array.shape)}"
    if array.size == 0 or array.dtype.kind not in "biufc":
        return head
    data = array.astype(np.float64)
    return f"{head} min {data.min():.4g} max {data.max():.4g} mean {data.mean():.4g}"
