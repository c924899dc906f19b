"""Print a program's generated C, split into translation units that compile in parallel.

Every native step is a braced block of C statements; a segment is one exported function
``int ss_segment<prefix>_<k>(void* const* v, const int64_t* e)`` running its blocks in
order. A model that lowers completely is a single segment, so splitting by segment would
not split it: a large program's blocks are cut, in order, into *parts*
(``ss_segment<prefix>_<k>_part<j>``, same signature, same error codes), spread over a few
units, and the segment becomes a function in the first unit that calls its parts in turn
and passes any error code on. gcc then compiles the units at once, one process each
(codegen/build.py), instead of one -O3 run over the whole program.

How many units depends only on the program's size, never on the machine, so that one
program always prints the same text (a compiled artifact is checked against it).
A profiled program or one that calls tuned dispatchers stays one unit: its counters and
dispatchers are private to the unit that defines them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from ..target import Target
from .fragments import declarations
from .kernels.prelude import HEADER, PRELUDE

if TYPE_CHECKING:  # program.py imports this module
    from .program import Program

#: Characters of step code per unit. gcc -O3 takes about 3 s per 100 KB of it here, and
#: each unit pays about 0.4 s for the includes and fragment declarations it starts with.
UNIT_CHARS = 64_000
MAX_UNITS = 8
_SIGNATURE = "(void* const* v, const int64_t* e)"


def emit_units(programs: list["Program"], fragments: tuple[str, ...], tuned: Sequence[str] = (),
               target: Optional[Target] = None) -> list[str]:
    """The translation units of ``programs`` (a root and its branch programs): the first
    starts with the prelude and defines every segment function; the others define parts."""
    blocks = {(id(p), k): _step_blocks(p, indices) for p in programs for k, indices in enumerate(p.segments)}
    total = sum(len(b) for bs in blocks.values() for b in bs)
    count = 1 if tuned or any(p.profiled for p in programs) else max(1, min(MAX_UNITS, round(total / UNIT_CHARS)))
    head = declarations(fragments, target)
    if count == 1:
        return [PRELUDE + head + "".join(tuned) + "".join(
            _profile_counters(p) + "".join(_function(p.segment_name(k), blocks[id(p), k])
                                           for k in range(len(p.segments)))
            for p in programs)]

    bodies: list[list[str]] = [[] for _ in range(count)]
    segments: list[str] = []
    target, filled, unit = total / count, 0, 0
    for p in programs:
        for k in range(len(p.segments)):
            parts: list[tuple[int, list[str]]] = []
            for block in blocks[id(p), k]:
                while unit < count - 1 and filled >= target * (unit + 1):
                    unit += 1
                if not parts or parts[-1][0] != unit:
                    parts.append((unit, []))
                parts[-1][1].append(block)
                filled += len(block)
            name = p.segment_name(k)
            for j, (u, part) in enumerate(parts):
                bodies[u].append(_function(f"{name}_part{j}", part))
            segments.append(_calling(name, [f"{name}_part{j}" for j in range(len(parts))]))
    first = PRELUDE + head + "".join(segments) + "".join(bodies[0])
    return [first] + [HEADER + head + "".join(body) for body in bodies[1:]]


def _step_blocks(program: "Program", indices: list[int]) -> list[str]:
    """One braced block per step. A profiled program's steps each add their wall time and
    one call to its counters (omp_get_wtime: one clock read before and one after each step)."""
    counters = f"ss_profile{program.prefix}"
    blocks = []
    for i in indices:
        step = program.steps[i]
        code = _indent(step.lowered.code.replace("STEP_ERROR", str(i + 1)), 8)
        if program.profiled:
            code = (f"        const double ss_started = omp_get_wtime();\n        {{\n{_indent(code, 4)}\n"
                    f"        }}\n        {counters}[{2 * i}] += omp_get_wtime() - ss_started;\n"
                    f"        {counters}[{2 * i + 1}] += 1;")
        label = f"    /* step {i}: {step.node.op_type} {_comment(step.node.name)} */\n"
        blocks.append(label + "    {\n" + code + "\n    }\n")
    return blocks


def _profile_counters(program: "Program") -> str:
    if not program.profiled:
        return ""
    counters = f"ss_profile{program.prefix}"
    return (f"\nstatic double {counters}[{2 * max(1, len(program.steps))}];\n"
            f"double* {program.profile_symbol()}(void) {{ return {counters}; }}\n")


def _function(name: str, blocks: list[str]) -> str:
    return f"\nint {name}{_SIGNATURE} {{\n    (void)e;\n" + "".join(blocks) + "    return 0;\n}\n"


def _calling(name: str, parts: list[str]) -> str:
    """``name`` runs ``parts`` in order and returns the first nonzero error code."""
    declared = "".join(f"int {part}{_SIGNATURE};\n" for part in parts)
    calls = "".join(f"    if ((code = {part}(v, e)) != 0) return code;\n" for part in parts)
    return f"\n{declared}int {name}{_SIGNATURE} {{\n    int code;\n{calls}    return 0;\n}}\n"


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def _indent(code: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else line for line in code.strip("\n").splitlines())
