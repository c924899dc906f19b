"""The native executor: simplify the graph, lower it to a C program, run it on the VM.

Simplification first makes every op static (symbolic parameters included), which is
what lets the lowering see the shapes it needs; the program (codegen/program.py) is
built and compiled once, when the executor is created, so a missing compiler fails at
session creation and every later run, at any shape in the declared ranges, reuses it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..codegen.build import CompiledLibrary
from ..codegen.program import Program, build_program
from ..ir.graph import Graph, Value
from ..passes.simplify import simplify_graph
from ..passes.simplify.outputs import restore_output_names
from .vm import NativeVM


def prepare_program(graph: Graph, tuning=None) -> Program:
    """Simplify ``graph`` in place and build its native program (with the tuned GEMM
    dispatchers of ``tuning``, a shapeshift.tune.records.GemmTuning, where it has them)."""
    simplify_graph(graph)
    restore_output_names(graph)
    return build_program(graph, tuning)


class NativeExecutor:
    """Runs ``graph`` natively. ``program`` and ``library`` come from a compiled artifact
    (runtime/artifact.py): the program already built from ``graph`` (so ``graph`` is already
    simplified) and its library already compiled, so nothing is simplified or compiled here."""

    def __init__(self, graph: Graph, num_threads: Optional[int] = None, cache_dir=None,
                 program: Optional[Program] = None, library: Optional[CompiledLibrary] = None, tuning=None):
        self.graph = graph
        self.tuning = tuning
        self.program = program if program is not None else prepare_program(graph, tuning)
        self.vm = NativeVM(self.program, cache_dir=cache_dir, num_threads=num_threads, library=library)

    def run(self, feeds: dict[Value, Any], binding: Optional[Mapping[str, int]] = None) -> list:
        return self.vm.run(feeds, dict(binding or {}))
