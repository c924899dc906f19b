"""Simplify: incremental type inference, constant folding and dynamic-to-static in one worklist.

``simplify_model`` is the whole job (import, simplify, export); the engine lives
in engine.py, the clean-up rules in rules.py, the graph fusions in fusions.py
(on for ``simplify_model``; ``merge_matmuls=False`` keeps MatMuls of one input apart).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Mapping, Optional, Sequence, Union

import onnx

from ...errors import ExpressionError, ShapeshiftError
from ...frontend.onnx_export import export_model
from ...frontend.onnx_import import MAX_DIM, ModelSource, import_model, read_model, source_label
from ...ir.graph import Graph
from ...ir.types import TensorType
from ...ir.verifier import verify
from ...symbolic import parse_dim
from ..infer_types import infer_types
from .engine import STRATEGIES, SimplifyOptions, SimplifyStats, simplify_graph
from .outputs import materialize_subgraph_outputs, restore_output_names

DimSpec = Union[int, str]

__all__ = ["STRATEGIES", "SimplifyOptions", "SimplifyStats", "simplify_graph", "simplify_model"]


def _apply_input_shapes(graph: Graph, input_shapes: Mapping[str, Sequence[DimSpec]]) -> None:
    by_name = {v.name: v for v in graph.inputs}
    for name, dims in input_shapes.items():
        value = by_name.get(name)
        if value is None:
            raise ShapeshiftError(f"the input shapes name {name!r}, which is not a graph input "
                                  f"(inputs: {', '.join(map(repr, by_name))})")
        if not isinstance(value.type, TensorType):
            raise ShapeshiftError(f"input {name!r} is not a tensor; its shape cannot be set")
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
            raise ShapeshiftError(f"input {name!r}: the shape given for it is {dims!r}, not a list of dims "
                                  f"(sizes or symbol names)")
        declared = value.type.shape
        if declared is not None and len(declared) != len(dims):
            raise ShapeshiftError(f"input {name!r} has rank {len(declared)}; the shape given for it has "
                                  f"{len(dims)} dims ({', '.join(map(str, dims)) or 'none'})")
        shape = []
        for d in dims:
            if isinstance(d, int) or (isinstance(d, str) and d.strip().lstrip("-").isdigit()):
                if int(d) < 0:  # -1 may mean "dynamic" to the user: that is a symbol's name here
                    raise ShapeshiftError(f"input {name!r}: dimension {d} is negative; give a size or a symbol "
                                          f"name (a new name makes that dim dynamic)")
                if int(d) > MAX_DIM:
                    raise ShapeshiftError(f"input {name!r}: dimension {d} is past the largest there is room for "
                                          f"({MAX_DIM})")
                shape.append(int(d))
                continue
            try:
                parsed = parse_dim(str(d), graph.symbols.ranges)
            except ExpressionError as exc:
                raise ShapeshiftError(f"input {name!r}: bad dimension {d!r}: {exc}") from None
            shape.append(parsed if not isinstance(parsed, int) else parsed)
        value.type = TensorType(value.type.dtype, tuple(
            graph.symbols.get(d.as_symbol().name) if not isinstance(d, int) and d.as_symbol() else d for d in shape))


def simplify_model(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
                   input_shapes: Optional[Mapping[str, Sequence[DimSpec]]] = None,
                   strategy: str = "incremental", fold_limit: Optional[int] = None,
                   check: bool = False, consume: bool = False, fusions: bool = True,
                   merge_matmuls: bool = True, external_dir: Optional[str] = None,
                   shared_weights: bool = False) -> tuple[onnx.ModelProto, Graph, SimplifyStats]:
    """Import, simplify and export; returns the model, the simplified graph and statistics.

    ``fusions``: run the graph fusions (fusions.py); ``merge_matmuls``: among them, merge
    MatMuls that share their input into one MatMul and a Split; ``shared_weights``: stack
    the products of independent inputs by one constant weight (shared_weight.py, as the
    native backend does).  ``external_dir``: the
    folder of a ModelProto read with its external data left in its files
    (``read_model_sized(path, load_external=False)``): a tensor there is read only if
    simplify reads it, and the result still refers to the files for the others (write
    it with frontend/external_data.py).

    A model given as a path or bytes is read here and becomes the result: the weights
    simplification left alone stay in it, not copied (the graph still refers to them).
    A ModelProto passed in is not modified, unless ``consume`` gives it up the same way.
    """
    with _cyclic_gc_paused():
        return _simplify_model(model, dynamic, input_shapes, strategy, fold_limit, check, consume,
                               SimplifyOptions(strategy=strategy, fusions=fusions, merge_matmuls=merge_matmuls,
                                               shared_weights=shared_weights),
                               external_dir)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Pause Python's cyclic garbage collector for the duration of one simplification.

    The IR is full of reference cycles (values list their users, users their values),
    so the collector keeps running full passes over a heap that only grows while we
    work: on a 48-layer encoder that made the time superlinear (about 20% of it).
    Nothing is lost: the cycles left behind are collected when it resumes.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _simplify_model(model, dynamic, input_shapes, strategy, fold_limit, check, consume=False, options=None,
                    external_dir=None):
    proto = read_model(model)
    # A model read here is ours: export leaves the weights simplify did not change in
    # it rather than copying them (a model the caller passed is its, unless consumed).
    owned = consume or proto is not model
    # keep_tensors: export copies the weights simplify left alone straight from the model.
    graph = import_model(proto, dict(dynamic or {}), infer=not input_shapes, keep_tensors=True,
                         label=source_label(model), constants_as_initializers=True, external_dir=external_dir)
    if input_shapes:
        _apply_input_shapes(graph, input_shapes)
        infer_types(graph)
    options = options or SimplifyOptions(strategy=strategy, fusions=True)
    if fold_limit is not None:
        options.fold_limit = fold_limit
    stats = simplify_graph(graph, options)
    restore_output_names(graph)
    materialize_subgraph_outputs(graph)
    if check:
        verify(graph)
    return export_model(graph, reuse=proto if owned else None), graph, stats


def simplify(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
             input_shapes: Optional[Mapping[str, Sequence[DimSpec]]] = None,
             strategy: str = "incremental", merge_matmuls: bool = True) -> onnx.ModelProto:
    """The simplified ONNX model (see simplify_model for the details)."""
    options = SimplifyOptions(strategy=strategy, fusions=True, merge_matmuls=merge_matmuls)
    with _cyclic_gc_paused():
        simplified, graph, _ = _simplify_model(model, dynamic, input_shapes, strategy, None, False, options=options)
        graph.release()  # nobody else holds it: freed here, not by a collector pass later
    return simplified
