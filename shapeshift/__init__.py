"""shapeshift: a compiler for neural networks whose tensor shapes change at run time.

Importing the package imports almost nothing: ``Graph`` and ``InferenceSession`` (and onnx,
numpy and the compiler behind them) load on first use. The command line relies on it: it
catches Ctrl-C from its first line on, and anything imported before that line printed a
traceback when interrupted (cli/main.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from .errors import ShapeshiftError

if TYPE_CHECKING:
    import onnx

    from .frontend.onnx_import import ModelSource
    from .ir.graph import Graph
    from .runtime.session import InferenceSession

__version__ = "0.1.0"


def __getattr__(name: str):
    """The classes the package exports, imported when first asked for (module docstring)."""
    if name == "InferenceSession":
        from .runtime.session import InferenceSession

        return InferenceSession
    if name == "RunOptions":
        from .runtime.run_options import RunOptions

        return RunOptions
    if name == "Graph":
        from .ir.graph import Graph

        return Graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) into a typed Graph."""
    from .frontend.onnx_import import import_model

    return import_model(model, dict(dynamic or {}))


def to_onnx(graph: Graph) -> onnx.ModelProto:
    """Export a Graph back to an ONNX ModelProto."""
    from .frontend.onnx_export import export_model

    return export_model(graph)


def simplify(model: ModelSource, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
             input_shapes: Optional[Mapping[str, list]] = None, strategy: str = "incremental") -> onnx.ModelProto:
    """Simplify an ONNX model: fold constants, make dynamic ops static (with symbolic
    parameters), remove dead code and duplicates; see docs/simplify.md."""
    from .passes.simplify import simplify as simplify_to_proto

    return simplify_to_proto(model, dynamic, input_shapes, strategy)


def compile(model: ModelSource, out, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
            tuning_db=None, threads: Optional[int] = None, target: str = "native"):
    """Compile ``model`` for the native backend into the artifact file ``out``, which
    ``InferenceSession(out)`` runs without a C compiler; returns the written Artifact
    (its header says what it holds). ``tuning_db``: a ``shapeshift tune`` database whose
    records for ``threads`` threads (default: every core) are built in. See docs/native.md,
    "Compiled artifacts", and docs/tune.md. ``target``: native (this machine, every
    feature it has) or a psABI level, x86-64-v3 or x86-64-v4 (docs/target.md): the
    artifact then runs on any CPU of that level."""
    from .runtime.artifact import write_artifact
    from .runtime.session import load_tuning
    from .target import named_target

    return write_artifact(model, out, dynamic, tuning=load_tuning(tuning_db, threads), target=named_target(target))


__all__ = ["Graph", "InferenceSession", "ShapeshiftError", "compile", "load", "simplify", "to_onnx", "__version__"]
