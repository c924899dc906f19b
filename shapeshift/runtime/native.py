"""The native executor: simplify the graph, lower it to a C program, run it on the VM.

Simplification first makes every op static (symbolic parameters included), which is
what lets the lowering see the shapes it needs; the program (codegen/program.py) is
built and compiled once, when the executor is created, so a missing compiler fails at
session creation and every later run, at any shape in the declared ranges, reuses it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

from ..codegen.build import CompiledLibrary
from ..codegen.program import Program, build_program, compile_program
from ..ir.graph import Graph, Value
from ..passes.simplify import SimplifyOptions, simplify_graph
from ..passes.simplify.outputs import restore_output_names
from .profile import StepTime
from .versions import build_versions
from .vm import NativeVM


#: Folded before lowering whatever their size (SimplifyOptions.fold_any_size): a weight
#: quantized in the model (QDQ) becomes a float weight the GEMM prepacks once.
NATIVE_FOLD_ANY_SIZE = frozenset({"DequantizeLinear"})


def simplify_options() -> SimplifyOptions:
    """What the native backend simplifies a graph with (the tuner too: it must see the
    graph a session lowers)."""
    # shared_weights: products by one constant weight of independent inputs run as one
    # (passes/simplify/shared_weight.py), so the weight streams once for all their rows;
    # fold_batch_norm: a Conv's BatchNormalization becomes its weights and bias (what
    # onnxruntime's optimizer does too).
    return SimplifyOptions(fold_any_size=NATIVE_FOLD_ANY_SIZE, shared_weights=True, fold_batch_norm=True)


def prepare_program(graph: Graph, tuning=None, profile: bool = False, target=None) -> Program:
    """Simplify ``graph`` in place and build its native program (with the tuned GEMM
    dispatchers of ``tuning``, a shapeshift.tune.records.GemmTuning, where it has them;
    with step timers when ``profile``)."""
    simplify_graph(graph, simplify_options())
    restore_output_names(graph)
    return build_program(graph, tuning, profile, target)


def create_executor(graph: Graph, reimport: Optional[Callable[[], Graph]] = None, num_threads: Optional[int] = None,
                    cache_dir=None, tuning=None, profile: bool = False, target=None):
    """The native executor of ``graph``: simplified and lowered, or, when Ifs decided by
    the input shapes or by small inputs' values keep part of it on the fallback or run as
    branch programs, and ``reimport`` can give fresh imports of the model, one program
    version per outcome of those Ifs (versions.py)."""
    program = prepare_program(graph, tuning, profile, target)
    fallback = sum(program.fallback_ops().values())
    if (fallback or program.branches) and reimport is not None:
        def make_executors(versions: list) -> list:
            libraries = _compile_all([p for _, p in versions], cache_dir)
            return [NativeExecutor(g, num_threads=num_threads, cache_dir=cache_dir, program=p, library=lib,
                                   tuning=tuning) for (g, p), lib in zip(versions, libraries)]

        versioned = build_versions(graph, fallback, reimport, lambda g: prepare_program(g, tuning, profile, target),
                                   make_executors)
        if versioned is not None:
            return versioned
    return NativeExecutor(graph, num_threads=num_threads, cache_dir=cache_dir, program=program, tuning=tuning)


def _compile_all(programs: list[Program], cache_dir) -> list[Optional[CompiledLibrary]]:
    """Each program's library (None without compiled code), compiled in parallel: gcc runs
    in processes of its own, so threads suffice to keep every core busy."""
    def one(program: Program) -> Optional[CompiledLibrary]:
        if not program.has_code():
            return None
        return compile_program(program, cache_dir)

    with ThreadPoolExecutor(max_workers=max(1, min(len(programs), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, programs))


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

    def programs(self) -> list[Program]:
        return self.program.all_programs()

    def profile(self, reset: bool = False) -> list[StepTime]:
        return self.vm.profile(reset)
