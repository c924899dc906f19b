"""The ONNX backend node test cases run through shapeshift, stage by stage.

Cases come from the installed onnx package, collected in memory
(``onnx.backend.test.case.node.collect_testcases``).  Each case goes through:

* ``roundtrip``: import -> export; the export passes ``check_model(full_check=True)``
  and gives the expected outputs in onnxruntime (or, for ops onnxruntime lacks,
  in onnx's reference evaluator);
* ``types``: every inferred output type equals the expected output's dtype and
  shape exactly;
* ``reference``: InferenceSession(backend="reference") gives the expected outputs;
* ``simplify``: the model after ``shapeshift simplify`` (verified, exported) still
  gives the expected outputs on the reference backend.

Two native stages (``NATIVE_STAGES``, opt-in: each case compiles its own C library,
~0.3-2 s, too slow for the default test run) judge ``backend="native"`` from one build:

* ``native``: every node was lowered to C (no fallback step) and the outputs match;
* ``native_fallback``: the outputs match, fallback steps allowed.

A ``native`` failure that is only a fallback reads ``fallback: Op (reason); ...``, so
the bench can count cases per fallback reason.

A case is *counted* when its opset is at most 23 and none of its tensors is
bfloat16, float8, float4, int4 or uint4; the others are run and reported.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import onnx

STAGES = ("roundtrip", "types", "reference", "simplify")
#: Reported beside the stages, not required: types with every input known by type only.
EXTRA_STAGES = ("types_inputs_only",)
#: Opt-in stages of the native backend (see the module docstring).
NATIVE_STAGES = ("native", "native_fallback")
#: Prefix of a ``native`` failure whose outputs were right but some node fell back.
FALLBACK_PREFIX = "fallback: "
MAX_COUNTED_OPSET = 23


def _exotic_types() -> set[int]:
    names = ["BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
             "FLOAT4E2M1", "FLOAT8E8M0", "INT2", "UINT2"]
    return {getattr(onnx.TensorProto, n) for n in names if hasattr(onnx.TensorProto, n)}


EXOTIC = _exotic_types()


@dataclass
class CaseResult:
    name: str
    op_type: str
    opset: int
    counted: bool
    failures: dict[str, str] = field(default_factory=dict)  # stage -> reason

    def passed(self, stage: str) -> bool:
        return stage not in self.failures


def collect_cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(collect_testcases(), key=lambda c: c.name)


def model_opset(model: onnx.ModelProto) -> int:
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [1])


def _elem_types(t: onnx.TypeProto):
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        yield t.tensor_type.elem_type
    elif kind == "sequence_type":
        yield from _elem_types(t.sequence_type.elem_type)
    elif kind == "optional_type":
        yield from _elem_types(t.optional_type.elem_type)


def uses_exotic_types(model: onnx.ModelProto) -> bool:
    def walk(graph: onnx.GraphProto) -> bool:
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if set(_elem_types(vi.type)) & EXOTIC:
                return True
        if any(t.data_type in EXOTIC for t in graph.initializer):
            return True
        for node in graph.node:
            for attr in node.attribute:
                if attr.name == "to" and attr.i in EXOTIC:
                    return True
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in EXOTIC:
                    return True
                if attr.type == onnx.AttributeProto.GRAPH and walk(attr.g):
                    return True
        return False

    return walk(model.graph)


def is_counted(model: onnx.ModelProto) -> bool:
    return model_opset(model) <= MAX_COUNTED_OPSET and not uses_exotic_types(model)


def case_op_type(case) -> str:
    nodes = case.model.graph.node
    return nodes[0].op_type if len(nodes) == 1 else case.name.replace("test_", "").split("_")[0]


def _as_value(x: Any) -> Any:
    """Case data may hold TensorProtos (exotic dtypes) and sequences of them."""
    if isinstance(x, onnx.TensorProto):
        return onnx.numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_as_value(v) for v in x]
    return x


def _feed(model: onnx.ModelProto, inputs: list) -> dict[str, Any]:
    initializers = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in initializers]
    return dict(zip(names, (_as_value(x) for x in inputs)))


# -- comparing outputs --------------------------------------------------------------


def assert_outputs_equal(got: list, expected: list, rtol: float, atol: float) -> None:
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        _assert_value_equal(g, _as_value(e), rtol, atol, f"output {i}")


def _assert_value_equal(got: Any, expected: Any, rtol: float, atol: float, where: str) -> None:
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            raise AssertionError(f"{where}: expected a sequence of {len(expected)}, got {type(got).__name__}")
        for j, (g, e) in enumerate(zip(got, expected)):
            _assert_value_equal(g, e, rtol, atol, f"{where}[{j}]")
        return
    if expected is None:
        if got is not None:
            raise AssertionError(f"{where}: expected an empty optional")
        return
    expected = np.asarray(expected)
    got = np.asarray(got)
    if got.dtype != expected.dtype:
        raise AssertionError(f"{where}: dtype {got.dtype}, expected {expected.dtype}")
    if got.shape != expected.shape:
        raise AssertionError(f"{where}: shape {got.shape}, expected {expected.shape}")
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=where)


# -- the stages ------------------------------------------------------------------------


def _run_onnxruntime(model: onnx.ModelProto, feed: dict) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _run_onnx_reference(model: onnx.ModelProto, feed: dict) -> list:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feed)


def stage_roundtrip(case) -> None:
    """The export passes the full checker and computes what the original computes.

    Judged on onnxruntime: the export must give the expected outputs, or exactly
    what onnxruntime gives on the original (where onnxruntime's own numerics differ
    from the case's).  Ops onnxruntime lacks are judged on onnx's reference evaluator.
    """
    import shapeshift

    exported = shapeshift.to_onnx(shapeshift.load(case.model))
    onnx.checker.check_model(exported, full_check=True)
    for inputs, expected in case.data_sets:
        feed = _feed(exported, list(inputs))
        original_feed = _feed(case.model, list(inputs))
        try:
            original = _run_onnxruntime(case.model, original_feed)
        except Exception:  # noqa: BLE001 - onnxruntime lacks the op: use onnx's evaluator
            got = [_normalize_strings(v) for v in _run_onnx_reference(exported, feed)]
            assert_outputs_equal(got, list(expected), case.rtol, case.atol)
            continue
        got = _run_onnxruntime(exported, feed)
        try:
            assert_outputs_equal(got, list(expected), case.rtol, case.atol)
        except AssertionError:
            assert_outputs_equal(got, original, 0.0, 0.0)


def _normalize_strings(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind in "US":
        return value.astype(object)
    if isinstance(value, list):
        return [_normalize_strings(v) for v in value]
    return value


def parameters_as_constants(model: onnx.ModelProto, inputs: list) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs that feed op *parameters* (a Reshape's
    shape, a Slice's starts, a Resize's sizes, ...) are initializers holding the case's data.

    Exporters write parameters as constants; the node cases feed them as inputs
    only because a test case has to.  Data inputs stay inputs.
    """
    from shapeshift.ops import lookup

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    parameter_names: set[str] = set()
    for node in model.graph.node:
        rule = lookup(node.domain, node.op_type, opsets.get(node.domain, 1))
        for position in (rule.params if rule is not None else ()):
            if position < len(node.input) and node.input[position]:
                parameter_names.add(node.input[position])
    data = _feed(model, inputs)
    chosen = {name for name in parameter_names if isinstance(data.get(name), np.ndarray)}
    if not chosen:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [vi for vi in copy.graph.input if vi.name not in chosen]
    del copy.graph.input[:]
    copy.graph.input.extend(kept)
    copy.graph.initializer.extend(onnx.numpy_helper.from_array(data[name], name) for name in sorted(chosen))
    return copy


def stage_types(case, parameters_known: bool = True) -> None:
    """Inferred output types equal the expected outputs' exactly.

    With ``parameters_known`` (the counted stage), parameter inputs are constants
    as in exported models; without it, every input is known by its type only.
    """
    import shapeshift
    from shapeshift.ir.types import OptionalType, SequenceType, TensorType, tensor_type_of

    model = case.model
    if parameters_known and case.data_sets:
        model = parameters_as_constants(model, list(case.data_sets[0][0]))
    graph = shapeshift.load(model)
    for _, expected in case.data_sets[:1]:
        for value, want in zip(graph.outputs, map(_as_value, expected)):
            got = value.type
            if isinstance(got, OptionalType) and want is not None:
                got = got.elem  # a present optional is judged by its contents
            if isinstance(want, list):
                if not isinstance(got, SequenceType):
                    raise AssertionError(f"{value.name}: inferred {got}, expected a sequence")
                elem = got.elem
                if want and (not isinstance(elem, TensorType) or elem.dtype != tensor_type_of(np.asarray(want[0])).dtype):
                    raise AssertionError(f"{value.name}: inferred {got}, expected seq of {np.asarray(want[0]).dtype}")
                continue
            if want is None:
                if not isinstance(got, OptionalType):
                    raise AssertionError(f"{value.name}: inferred {got}, expected an optional")
                continue
            expected_type = tensor_type_of(np.asarray(want))
            if got != expected_type:
                raise AssertionError(f"{value.name}: inferred {got}, expected {expected_type}")


def stage_reference(case) -> None:
    import shapeshift

    session = shapeshift.InferenceSession(case.model, backend="reference")
    for inputs, expected in case.data_sets:
        got = session.run(None, _feed(case.model, list(inputs)))
        assert_outputs_equal(got, list(expected), case.rtol, case.atol)


def stage_simplify(case) -> None:
    from shapeshift.passes.simplify import simplify_model
    import shapeshift

    simplified = simplify_model(case.model, check=True)[0]
    session = shapeshift.InferenceSession(simplified, backend="reference")
    for inputs, expected in case.data_sets:
        got = session.run(None, _feed(simplified, list(inputs)))
        assert_outputs_equal(got, list(expected), case.rtol, case.atol)


def stage_types_strict(case) -> None:
    stage_types(case, parameters_known=False)


def native_fallbacks(session) -> list[str]:
    """``Op (reason)`` for every step of a native session left to the reference evaluator."""
    from shapeshift.codegen.program import FALLBACK

    return [f"{s.node.op_type} ({s.reason})" for program in session._executor.programs()
            for s in program.steps if s.kind == FALLBACK]


def stage_native(case) -> dict[str, Optional[str]]:
    """Both native stages from one build per data set: {stage: failure message or None}.

    As in the ``types`` stage, parameter inputs (a Reshape's shape, OneHot's depth, a
    CumSum's axis, ...) are constants holding the case's data, as exporters write them:
    a native program needs them to size its buffers. Correctness is judged like the
    reference stage; ``native`` also fails when any node fell back (listing them),
    ``native_fallback`` does not.
    """
    import shapeshift

    fallbacks: list[str] = []
    for inputs, expected in case.data_sets:
        # Some cases hold scalar parameters as NumPy scalars: as 0-d arrays they count too.
        inputs = [np.asarray(x) if isinstance(x, np.generic) else x for x in inputs]
        model = parameters_as_constants(case.model, inputs)
        session = shapeshift.InferenceSession(model, backend="native")
        names = {vi.name for vi in model.graph.input}
        got = session.run(None, {k: v for k, v in _feed(case.model, inputs).items() if k in names})
        assert_outputs_equal(got, list(expected), case.rtol, case.atol)
        fallbacks += [f for f in native_fallbacks(session) if f not in fallbacks]
    return {"native": FALLBACK_PREFIX + "; ".join(fallbacks) if fallbacks else None, "native_fallback": None}


STAGE_FUNCTIONS = {"roundtrip": stage_roundtrip, "types": stage_types, "reference": stage_reference,
                   "simplify": stage_simplify, "types_inputs_only": stage_types_strict}


def _failure(exc: Exception) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}"[:300]


def run_case(case, stages=STAGES) -> CaseResult:
    result = CaseResult(case.name, case_op_type(case), model_opset(case.model), is_counted(case.model))
    for stage in stages:
        if stage in NATIVE_STAGES:
            continue  # both run together below, from one build
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                STAGE_FUNCTIONS[stage](case)
        except Exception as exc:  # noqa: BLE001 - every failure is a result here
            result.failures[stage] = _failure(exc)
    native = [s for s in NATIVE_STAGES if s in stages]
    if native:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outcome = stage_native(case)
        except Exception as exc:  # noqa: BLE001 - wrong outputs, or the build/run failed
            outcome = dict.fromkeys(NATIVE_STAGES, _failure(exc))
        for stage in native:
            if outcome[stage] is not None:
                # Fallback lists can be long; keep every op named (the bench counts them).
                result.failures[stage] = outcome[stage][:2000]
    return result


# -- the checked-in list of expected failures -------------------------------------------


def read_expected_failures(path) -> dict[tuple[str, str], str]:
    """Lines ``stage case_name  # reason`` -> {(stage, case): reason}."""
    expected: dict[tuple[str, str], str] = {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        entry, _, reason = line.partition("#")
        stage, case_name = entry.split()
        expected[(stage, case_name)] = reason.strip()
    return expected


def summarize(results: list[CaseResult], counted_only: Optional[bool] = True,
              stages: tuple[str, ...] = STAGES) -> dict[str, tuple[int, int]]:
    chosen = [r for r in results if counted_only is None or r.counted == counted_only]
    return {stage: (sum(r.passed(stage) for r in chosen), len(chosen)) for stage in stages}
