"""InferenceSession: onnxruntime's calling convention over shapeshift's executors.

``InferenceSession(model, dynamic=None, backend="reference").run(None, feed)``
checks the feed (see binding.py), runs the graph and returns a list of arrays.

``model`` may also be the path of a compiled artifact (``shapeshift compile``; recognised by
its magic header, see artifact.py): it runs on the native backend without compiling, and
``dynamic``, if given, must equal the ranges it was compiled for.

``tuning_db`` (native backend): a database written by ``shapeshift tune``; every MatMul or
Gemm whose constant weight shape has a selection there for the session's thread count runs
the tuned kernels (see shapeshift/tune/records.py). An artifact carries its own records.

``run(..., run_options=RunOptions(timeout_s=...))`` bounds one run's wall time, and its
``terminate`` stops it from another thread (see run_options.py).

``profile=True`` (native backend, not an artifact): every step is timed; ``profile()``
returns the times so far (see profile.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..errors import ArtifactError, InputError, ShapeshiftError, UnknownOutputError
from ..frontend.onnx_import import ModelSource, import_model
from ..ir.graph import Graph, Value
from ..ir.types import OptionalType, SequenceType, TensorType, ort_type_name
from ..symbolic import Expr, to_string
from .artifact import is_artifact, load_artifact
from .binding import check_feed
from .reference import ReferenceExecutor, as_feed_array
from .run_options import active

BACKENDS = ("reference", "native")
#: The backend of a model's session when none is asked for (an artifact's is always native).
DEFAULT_BACKEND = "native"
CHECKED_FEEDS_KEPT = 256  # distinct feed signatures whose check is remembered


@dataclass(frozen=True)
class NodeArg:
    """What get_inputs()/get_outputs() return, shaped like onnxruntime's NodeArg."""

    name: str
    shape: Optional[list]
    type: str


def _node_arg(value: Value) -> NodeArg:
    t = value.type
    if isinstance(t, TensorType):
        shape = None if t.shape is None else [to_string(d) if isinstance(d, Expr) else int(d) for d in t.shape]
        return NodeArg(value.name, shape, ort_type_name(t.dtype))
    if isinstance(t, SequenceType):
        return NodeArg(value.name, None, f"seq({ort_type_name(t.elem.dtype) if isinstance(t.elem, TensorType) else '?'})")
    if isinstance(t, OptionalType):
        return NodeArg(value.name, None, "optional")
    return NodeArg(value.name, None, "unknown")


def _native_executor(graph: Graph, reimport, num_threads: Optional[int], tuning_db=None, profile: bool = False):
    # Imported here: the native backend pulls in the C build machinery, which the
    # reference backend never needs.
    from .native import create_executor

    return create_executor(graph, reimport, num_threads=num_threads, tuning=load_tuning(tuning_db, num_threads),
                           profile=profile)


def load_tuning(tuning_db, num_threads: Optional[int]):
    """The records of ``tuning_db`` for the thread count a session runs on (its
    ``num_threads``, else every core), or None without a database."""
    if tuning_db is None:
        return None
    from ..tune.records import GemmTuning

    return GemmTuning.from_db(tuning_db, num_threads or os.cpu_count() or 1)


def _artifact_backend(path, backend: Optional[str]) -> str:
    if backend not in (None, "native"):
        raise ArtifactError(f"{path}: a compiled artifact runs on the native backend only, not {backend!r}")
    return "native"


class InferenceSession:
    """Load a model once, run it on any input shapes inside the declared ranges."""

    def __init__(self, model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
                 backend: Optional[str] = None, num_threads: Optional[int] = None, tuning_db=None,
                 profile: bool = False):
        """``backend``: "native" (the default) lowers the model to C, built once with the
        system C compiler and cached; "reference" runs it on the NumPy evaluator, with no
        compiler. A compiled artifact runs on the native backend."""
        if backend is not None and backend not in BACKENDS:
            raise ShapeshiftError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ShapeshiftError(f"num_threads must be a positive integer, got {num_threads!r}")
        chosen = backend or DEFAULT_BACKEND
        if tuning_db is not None and chosen != "native" and not is_artifact(model):
            raise ShapeshiftError("tuning_db applies to the native backend only: pass backend=\"native\"")
        if profile and (chosen != "native" or is_artifact(model)):
            raise ShapeshiftError("profile=True needs the native backend and a model, not a compiled artifact "
                                  "(its library was built without timers)")
        self._profiled = bool(profile)
        if is_artifact(model):
            if tuning_db is not None:
                raise ArtifactError(f"{model}: a compiled artifact carries the tuning records it was built with; "
                                    "compile it again with `shapeshift compile --db` to use other records")
            self.backend = _artifact_backend(model, backend)
            self.graph, self._executor = load_artifact(model, dynamic, num_threads)
        else:
            self.backend = chosen
            def load() -> Graph:  # the native backend may import again, to build program versions
                return import_model(model, dict(dynamic or {}))

            self.graph: Graph = load()
            self._executor = (ReferenceExecutor(self.graph) if self.backend == "reference"
                              else _native_executor(self.graph, load, num_threads, tuning_db, self._profiled))
        self._outputs = {v.name: i for i, v in enumerate(self.graph.outputs)}
        self._input_values = {v.name: v for v in self.graph.inputs}
        # Feed signature (see _signature) -> (the inputs in the feed's order, the binding).
        self._checked_feeds: dict[tuple, tuple[tuple[Value, ...], dict[str, int]]] = {}

    def profile(self, reset: bool = False) -> list:
        """The time and calls of every program step over the runs so far (profile.StepTime
        rows; format them with profile.format_profile); ``reset`` zeroes the counters after."""
        if not self._profiled:
            raise ShapeshiftError("this session was created without profile=True")
        return self._executor.profile(reset)

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(v) for v in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(v) for v in self.graph.outputs]

    def bind(self, feed: Mapping[str, Any]) -> dict[str, int]:
        """The value of every input symbol for this feed (after checking it)."""
        return check_feed(self.graph, {k: as_feed_array(v, k) for k, v in feed.items()})[1]

    def run(self, output_names: Optional[Sequence[str]], feed: Mapping[str, Any], run_options: Any = None) -> list:
        wanted = list(output_names) if output_names else None  # None: all, in the model's order
        unknown = [n for n in wanted or () if n not in self._outputs]
        if unknown:
            raise UnknownOutputError(
                f"unknown output name(s) {', '.join(map(repr, unknown))}; the model's outputs are "
                f"{', '.join(map(repr, self._outputs))}")
        # A dict first: the Mapping ABC's check costs more than the rest of this method.
        if type(feed) is not dict and not isinstance(feed, Mapping):
            raise InputError(f"the feed must map input names to arrays (a dict, as onnxruntime takes), "
                             f"got a {type(feed).__name__}; the model's inputs are "
                             f"{', '.join(map(repr, self._input_values))}")
        values, binding = self._check(feed)
        if run_options is None:  # the common case: no context to enter on every run
            results = self._executor.run(values, binding)
        else:
            with active(run_options):
                results = self._executor.run(values, binding)
        if wanted is None:  # every executor returns a list of its own, in the model's order
            return results
        return [results[self._outputs[n]] for n in wanted]

    def _check(self, feed: Mapping[str, Any]) -> tuple[dict, dict]:
        """check_feed, remembered per feed signature (_signature): for numpy arrays its
        verdict and binding depend on nothing else, and at small shapes checking again would
        cost more than running the model. Only feeds that passed are remembered, so a wrong
        one is checked, and refused, every time."""
        checked = self._remembered(feed)
        if checked is not None:
            return checked
        arrays = {k: as_feed_array(v, k) for k, v in feed.items()}
        checked = self._remembered(arrays)  # Python scalars or lists, now arrays
        if checked is not None:
            return checked
        values, binding = check_feed(self.graph, arrays)
        if len(self._checked_feeds) < CHECKED_FEEDS_KEPT \
                and all(isinstance(a, np.ndarray) and a.dtype.kind != "O" for a in arrays.values()):
            self._checked_feeds[_signature(arrays)] = (tuple(self._input_values[k] for k in arrays), binding)
        return values, binding

    def _remembered(self, feed: Mapping[str, Any]) -> Optional[tuple[dict, dict]]:
        """The values and binding of ``feed`` if its signature passed the check before."""
        try:
            checked = self._checked_feeds.get(_signature(feed))
        except (AttributeError, TypeError):  # not array-like: no shape or dtype, or unhashable ones
            return None
        if checked is None:
            return None
        inputs, binding = checked
        return dict(zip(inputs, feed.values())), binding


def _signature(feed: Mapping[str, Any]) -> tuple:
    """(name, type, shape, dtype) of each feed, in the feed's order. The type is in it so
    that only numpy arrays, the feeds _check remembers, match a remembered signature: a
    NumPy scalar or a pandas Series has a shape and a dtype too, but the VM reads arrays."""
    return tuple([(name, type(a), a.shape, a.dtype) for name, a in feed.items()])
