"""Print a program's generated C, split into translation units that compile in parallel.

Every native step is a braced block of C statements; a segment is one exported function
``int ss_segment<prefix>_<k>(void* const* v, const int64_t* e)`` running its blocks in
order. A model that lowers completely is a single segment, so splitting by segment would
not split it: a program's blocks are cut, in order, into *parts*
(``ss_segment<prefix>_<k>_part<j>``, same signature, same error codes), spread over
units, and the segment becomes a function in the first unit that calls its parts in turn
and passes any error code on. gcc then compiles the units at once, one process per core
(codegen/build.py), instead of one -O3 run over the whole program.

Blocks are of three kinds, compiled at three optimization levels (``OPT_FLAGS``):

- **hot** (-O3, vectorized): a parallel loop of the block's own (``#pragma omp
  parallel``: the elementwise chains, which the lowering writes over whole tensors) over
  outputs not known to be small (a symbolic size, or more than ``SMALL_ELEMENTS``
  elements): work per element of a large tensor;
- **warm** (-O1): other loops: serial ones over index-sized data (a NonZero's scan, a
  GatherND's rows, a reduction over a few elements), which their lowering does not
  parallelize because they are small, and elementwise loops over a few thousand elements
  at most (SSDlite's score thresholds per class: 3234 elements each, 66 of them took
  2.3 s of gcc -O3);
- **glue** (-O0): no loop at all: the block computes arguments and calls kernel entry
  points, which live in the fragment objects, built at -O3 once for every model
  (codegen/fragments.py). Optimizing it would save nanoseconds per call.

Most of the step code is glue or warm (bert.ts: a third, and it compiles 3.6x faster at -O1
than at -O3; SSDlite: nine tenths, its post-processing repeated for 90 classes), and it
was most of the build.

Units hold blocks of one kind, at most ``UNIT_CHARS`` characters of hot code (times
``UNIT_CHARS_FACTOR`` for the cheaper kinds), so their count grows with the model and each
takes a bounded time; a segment's part is a run of consecutive blocks in one unit. The
first unit, glue, holds the segment functions; a segment whose blocks all fall in the
first unit runs them itself, without a part.

Steps whose code repeats but for the slots and extents it indexes and its error code share
one noinline function per template (``_shared_steps``), defined once, in a unit of its
kind, and called from glue: the call is glue whatever the function runs, so a segment's
run of repeated steps stays one part instead of alternating between units (SSDlite's
post-processing had a warm NonZero scan between glue steps in each of its 90 classes: 750
part functions, each about half a millisecond of gcc even when empty). Consecutive calls
of shared functions are a table run by one loop (``_call_table``): gcc compiles a row as
data, where a call and its error check were statements. A template shares when it repeats
and is a loop or at least ``SHARED_MIN_CHARS`` long, or a short glue step that repeats
``SHORT_SHARED_MIN_USES`` times (SSDlite's per-class Gather, TopK and Shape steps, which
then join their class's table). On SSDlite (1635 steps) the sharing, first per unit, cut
gcc's serial time from 3.0 to 1.9 s; defined once, called from glue and run from tables,
with its 90-input Concats as loops built as glue (lower/layout.py), its units took 1.35 s
of gcc CPU where they had taken 2.90 (AMD Zen 3). Hot steps share too: a transformer
repeats each layer's GELU, residual Add and mask per layer, and sharing them took bert.ts
from two hot units (1.2 s of gcc -O3 each) to one (0.55 s), its session creation on a warm
kernel library from 2.1 to 1.1 s (AMD Zen 4). The shared loop is the same code (the
template keeps every literal stride and size; only the slot and extent indices become
arguments), so run time does not change but for a call per step.

How many units there are depends only on the program's size, never on the machine, so
that one program always prints the same text (a compiled artifact is checked against it).
A small program or one that calls tuned dispatchers stays one unit, built at -O3: the
dispatchers are private to the unit that defines them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from ..ir.graph import Value
from ..target import Target
from .fragments import declarations
from .kernels.prelude import HEADER, PRELUDE

if TYPE_CHECKING:  # program.py imports this module
    from .program import Program

HOT, WARM, GLUE = "hot", "warm", "glue"
KINDS = (GLUE, WARM, HOT)  # the order of their units, after the first
#: What replaces the -O flag of the library's flags for a unit of each kind.
OPT_FLAGS: dict[str, tuple[str, ...]] = {HOT: ("-O3",), WARM: ("-O1",), GLUE: ("-O0",)}
#: Characters of hot step code per unit: gcc -O3 takes about 3 s per 100 KB of it here
#: (bert.ts), and each unit pays about 0.2 s for the includes and declarations it starts with.
UNIT_CHARS = 32_000
#: How much more code of each kind a unit holds: -O1 compiles about 2-3x faster, -O0
#: about 3x faster again (SSDlite's post-processing, bert.ts's step code).
UNIT_CHARS_FACTOR = {HOT: 1, WARM: 2, GLUE: 4}
#: Below this many characters of step code a program is one unit (one header to parse).
SMALL_PROGRAM_CHARS = 8_000
#: Outputs of at most this many elements in all, every dim static, make a loop warm.
SMALL_ELEMENTS = 16_384
_SIGNATURE = "(void* const* v, const int64_t* e)"
#: A segment (the VM's entry) also takes its session's thread count.
_SEGMENT_SIGNATURE = "(void* const* v, const int64_t* e, int ss_threads)"
_SHARED_SIGNATURE = "(void* const* v, const int64_t* e, const int32_t* ss_s, const int32_t* ss_x, int ss_code)"
#: A shared step function is defined once, in a unit of its kind, and called from units of
#: any kind: linked, not exported. noinline: gcc -O3 otherwise inlined the function (its
#: parallel loop outlined, what is left looks small) into every call in its unit and
#: vectorized its serial tail loop again in each: bert.ts's hot unit took 1.16 s of gcc
#: with the copies, 0.67 s without.
_SHARED_ATTRIBUTES = '__attribute__((noinline, visibility("hidden")))'
#: A row of a table of shared-function steps (``_call_table``).
_SHARED_STEP = ("\ntypedef struct {\n"
                "    int (*run)(void* const*, const int64_t*, const int32_t*, const int32_t*, int);\n"
                "    const int32_t* s;\n    const int32_t* x;\n    int code;\n} ss_shared_step;\n")
#: What a segment function (the VM's entry) runs first: its session's thread count and the
#: workers' placement (the prelude's ss_enter_threads).
_SEGMENT_ENTER = "    ss_enter_threads(ss_threads);\n"
#: Steps whose code, but for the slots and extents it names and its error code, repeats
#: in the program and is at least this long run as one function per unit
#: (``_shared_steps``).
SHARED_MIN_CHARS = 160
#: ... or, glue, repeats at least this often.
SHORT_SHARED_MIN_USES = 8
# The slot and extent tables a step's code indexes with literals.
_SLOT = re.compile(r"(?<![\w.>])v\[(\d+)\]")
_EXTENT = re.compile(r"(?<![\w.>])e\[(\d+)\]")
# A pointer or array of its own named v or e, which would shadow the tables (a scalar could
# not be indexed by the code as it was): such a step stays as it is.
_SHADOW = re.compile(r"\b(?:void|char|float|double|_Float16|bool|size_t|u?int(?:8|16|32|64)_t|ss_\w+|__m\w+)"
                     r"(?:\s+const)?\s*(?:\*+\s*(?:const\s+)?[ve]\b|\s[ve]\s*\[)")
# A parallel region of the block's own (code, not a comment: at the start of a line).
_PARALLEL = re.compile(r"^\s*#\s*pragma\s+omp\s+parallel\b", re.MULTILINE)
# A loop: C's three loop statements.
_LOOP = re.compile(r"\b(for|while)\s*\(|\bdo\s*\{")


@dataclass(frozen=True)
class _Call:
    """A step run by a shared step function: its label comment, the function, the slot and
    extent indices it passes and its error code."""

    label: str
    function: str
    slots: tuple[str, ...]
    extents: tuple[str, ...]
    code: int

    def tables(self, suffix: str = "") -> tuple[str, str, str]:
        """Declarations of its slot and extent tables, named s<suffix> and x<suffix> (lines
        indented for a step's block), and the two arguments that pass them (NULL for none)."""
        lines = "".join(f"        static const int32_t {name}{suffix}[] = {{{', '.join(items)}}};\n"
                        for name, items in (("s", self.slots), ("x", self.extents)) if items)
        return lines, f"s{suffix}" if self.slots else "NULL", f"x{suffix}" if self.extents else "NULL"

    @property
    def text(self) -> str:
        """The step as a block of its own."""
        lines, s, x = self.tables()
        return (f"{self.label}    {{\n{lines}        const int c = {self.function}(v, e, {s}, {x}, {self.code}); "
                "if (c) return c;\n    }\n")


@dataclass(frozen=True)
class Unit:
    """One translation unit and the kind of code it holds (the key of ``OPT_FLAGS``)."""

    text: str
    kind: str


def block_kind(code: str, outputs: Sequence[Value], glue: bool = False) -> str:
    """The kind of a step whose C is ``code`` and whose node has ``outputs`` (see above);
    ``glue``: its lowering says its loops only call kernels."""
    if glue or not _LOOP.search(code):
        return GLUE
    if not _PARALLEL.search(code):
        return WARM
    total = 0
    for value in outputs:
        shape = getattr(value.type, "shape", None)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return HOT
        total += math.prod(shape)
    return HOT if total > SMALL_ELEMENTS else WARM


def emit_units(programs: list["Program"], fragments: tuple[str, ...], tuned: Sequence[str] = (),
               target: Optional[Target] = None) -> list[Unit]:
    """The translation units of ``programs`` (a root and its branch programs): the first
    starts with the prelude and defines every segment function; the others define parts."""
    blocks = {(id(p), k): _step_blocks(p, indices) for p in programs for k, indices in enumerate(p.segments)}
    head = declarations(fragments, target)
    totals = dict.fromkeys(KINDS, 0)
    for bs in blocks.values():
        for b, kind in bs:
            totals[kind] += len(b)
    if tuned or sum(totals.values()) < SMALL_PROGRAM_CHARS:
        return [Unit(PRELUDE + head + "".join(tuned) + "".join(
            _function(p.segment_name(k), [b for b, _ in blocks[id(p), k]], segment=True)
            for p in programs for k in range(len(p.segments))), HOT)]

    blocks, shared = _shared_steps(programs, blocks)
    totals = dict.fromkeys(KINDS, 0)
    for bs in blocks.values():
        for b, kind, _ in bs:
            totals[kind] += _size(b)
    for text, kind in shared.values():
        totals[kind] += len(text)
    if 0 < totals[WARM] < SMALL_PROGRAM_CHARS:  # too little for a unit's header: built with the hot code
        blocks = {key: [(b, HOT if kind == WARM else kind, f) for b, kind, f in bs] for key, bs in blocks.items()}
        shared = {name: (text, HOT if kind == WARM else kind) for name, (text, kind) in shared.items()}
        totals[HOT], totals[WARM] = totals[HOT] + totals[WARM], 0
    # Units of each kind, filled in program order to an even share of that kind's code.
    counts = {kind: max(1, math.ceil(totals[kind] / (UNIT_CHARS * UNIT_CHARS_FACTOR[kind]))) for kind in KINDS}
    index: dict[tuple[str, int], int] = {}
    kinds: list[str] = []
    for kind in KINDS:  # glue first: the first unit is glue unit 0
        for u in range(counts[kind]):
            index[kind, u] = len(kinds)
            kinds.append(kind)
    bodies: list[list[str]] = [[] for _ in kinds]
    defined: list[dict[str, str]] = [{} for _ in kinds]  # the shared step functions each unit defines
    called: list[set[str]] = [set() for _ in kinds]
    home: dict[str, int] = {}  # the unit defining each shared function
    filled, current = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)

    def next_unit(kind: str, size: int) -> int:
        """The unit of ``kind`` that takes the next ``size`` characters of it."""
        share = totals[kind] / counts[kind]
        while current[kind] < counts[kind] - 1 and filled[kind] >= share * (current[kind] + 1):
            current[kind] += 1
        filled[kind] += size
        return index[kind, current[kind]]

    segments: list[str] = []
    for p in programs:
        for k in range(len(p.segments)):
            parts: list[tuple[int, list[str]]] = []
            for block, kind, function in blocks[id(p), k]:
                unit = next_unit(kind, _size(block))
                if not parts or parts[-1][0] != unit:
                    parts.append((unit, []))
                parts[-1][1].append(block)
                if function is not None:
                    called[unit].add(function)
                    if function not in home:
                        text, function_kind = shared[function]
                        home[function] = next_unit(function_kind, len(text))
                        defined[home[function]][function] = text
            name = p.segment_name(k)
            if len(parts) == 1 and parts[0][0] == 0:  # the segment function runs its blocks itself
                segments.append(_function(name, parts[0][1], segment=True))
                continue
            for j, (u, part) in enumerate(parts):
                bodies[u].append(_function(f"{name}_part{j}", part))
            segments.append(_calling(name, [f"{name}_part{j}" for j in range(len(parts))]))
    # Each unit declares the shared functions it calls but does not define, in the order they were made.
    declared = [_SHARED_STEP + "".join(_shared_declaration(n) for n in shared if n in calls and n not in defs)
                for calls, defs in zip(called, defined)]
    texts = [PRELUDE + head + declared[0] + "".join(defined[0].values()) + "".join(segments) + "".join(bodies[0])]
    texts += [HEADER + head + decls + "".join(defs.values()) + "".join(body)
              for decls, defs, body in zip(declared[1:], defined[1:], bodies[1:])]
    # A kind without code leaves an empty unit behind: dropped (the first always stays).
    return [Unit(text, kind) for u, (text, kind) in enumerate(zip(texts, kinds)) if u == 0 or bodies[u] or defined[u]]


def _step_blocks(program: "Program", indices: list[int]) -> list[tuple[str, str]]:
    """One braced block per step, with its kind (``block_kind``). A profiled program's steps
    each add their wall time and one call to its counters, the COUNTERS slot that the
    session's VM owns (omp_get_wtime: one clock read before and one after each step)."""
    counters = f"((double*)v[{program.profile_slot}])"
    blocks = []
    for i in indices:
        step = program.steps[i]
        kind = block_kind(step.lowered.code, step.node.outputs, step.lowered.glue)
        code = _indent(step.lowered.code.replace("STEP_ERROR", str(i + 1)), 8)
        if program.profiled:
            code = (f"        const double ss_started = omp_get_wtime();\n        {{\n{_indent(code, 4)}\n"
                    f"        }}\n        {counters}[{2 * i}] += omp_get_wtime() - ss_started;\n"
                    f"        {counters}[{2 * i + 1}] += 1;")
        label = f"    /* step {i}: {step.node.op_type} {_comment(step.node.name)} */\n"
        blocks.append((label + "    {\n" + code + "\n    }\n", kind))
    return blocks


def _shared_steps(programs: list["Program"], blocks: dict) -> tuple[dict, dict[str, tuple[str, str]]]:
    """``blocks`` with each step whose code repeats in ``programs`` (a template:
    its code with the slots and extents it indexes, in order of appearance, and its error
    code as parameters) replaced by a call of one function per template (a glue ``_Call``),
    which one unit of the template's kind defines. Returns the blocks as (text or _Call,
    kind, function name or None) and the functions by name: (definition, kind).

    A model that repeats a structure repeats its steps' code: SSDlite's post-processing per
    class (90 classes: 1635 steps, 597 KB of step code, 256 templates of 119 KB), a
    transformer's layers. gcc's time grows with the code, so the repeats were most of a
    cold build. A shared hot step keeps its parallel loop: the region is outlined from the
    shared function as it was from the segment's part."""
    templates: dict[str, list] = {}
    keyed: dict[tuple, tuple] = {}
    for key, bs in blocks.items():
        program = next(p for p in programs if id(p) == key[0])
        indices = program.segments[key[1]]
        for j, ((text, kind), i) in enumerate(zip(bs, indices)):
            code = program.steps[i].lowered.code
            if program.profiled or _SHADOW.search(code):
                continue
            slots: list[str] = []
            extents: list[str] = []

            def slot(m: re.Match) -> str:
                slots.append(m.group(1))
                return f"v[ss_s[{len(slots) - 1}]]"

            def extent(m: re.Match) -> str:
                extents.append(m.group(1))
                return f"e[ss_x[{len(extents) - 1}]]"

            template = _EXTENT.sub(extent, _SLOT.sub(slot, code)).replace("STEP_ERROR", "ss_code")
            templates.setdefault(template, []).append((key, j))
            keyed[key, j] = (template, slots, extents, i)
    functions: dict[str, tuple[str, str]] = {}
    out = {key: [(text, kind, None) for text, kind in bs] for key, bs in blocks.items()}
    for template, uses in templates.items():
        kind = blocks[uses[0][0]][uses[0][1]][1]
        # A loop shares at any length: its call is glue, so the steps around it stay in one
        # part. A short glue step shares where it repeats enough for its calls to be table rows.
        if len(uses) < 2 or (kind == GLUE and len(template) < SHARED_MIN_CHARS and len(uses) < SHORT_SHARED_MIN_USES):
            continue
        name = f"ss_step_shared_{len(functions)}"
        functions[name] = (f"\n{_SHARED_ATTRIBUTES} int {name}{_SHARED_SIGNATURE} {{\n"
                           f"    (void)v; (void)e; (void)ss_s; (void)ss_x; (void)ss_code;\n"
                           f"    {{\n{_indent(template, 8)}\n    }}\n    return 0;\n}}\n", kind)
        for key, j in uses:
            _, slots, extents, i = keyed[key, j]
            text = out[key][j][0]
            # The call is glue whatever the function's kind: it runs no loop of its own.
            out[key][j] = (_Call(text[:text.index("\n") + 1], name, tuple(slots), tuple(extents), i + 1), GLUE, name)
    return out, functions


def _shared_declaration(name: str) -> str:
    return f"{_SHARED_ATTRIBUTES} int {name}{_SHARED_SIGNATURE};\n"


def _size(block) -> int:
    """Characters of a block (text, or a ``_Call`` as a block of its own): what fills units."""
    return len(block.text if isinstance(block, _Call) else block)


def _function(name: str, blocks: Sequence, segment: bool = False) -> str:
    """A function running ``blocks`` (text, or ``_Call``s: a run of them becomes a table);
    a ``segment`` (what the VM calls) first runs _SEGMENT_ENTER."""
    enter, signature = (_SEGMENT_ENTER, _SEGMENT_SIGNATURE) if segment else ("", _SIGNATURE)
    body: list[str] = []
    run: list[_Call] = []
    for block in [*blocks, None]:
        if isinstance(block, _Call):
            run.append(block)
            continue
        if len(run) >= 2:
            body.append(_call_table(run))
        elif run:
            body.append(run[0].text)
        run = []
        if block is not None:
            body.append(block)
    return f"\nint {name}{signature} {{\n    (void)e;\n{enter}" + "".join(body) + "    return 0;\n}\n"


def _call_table(calls: list[_Call]) -> str:
    """Consecutive shared-function steps as a table run by one loop: gcc compiles a table
    entry as data, where a call and its error check were statements (at -O0 about a
    millisecond each: SSDlite's post-processing has a thousand)."""
    tables, rows = [], []
    for n, call in enumerate(calls):
        lines, s, x = call.tables(str(n))
        tables.append(lines)
        rows.append(f"            {{{call.function}, {s}, {x}, {call.code}}},  {call.label.strip()}\n")
    return ("    {\n" + "".join(tables) + "        static const ss_shared_step steps[] = {\n" + "".join(rows)
            + "        };\n"
            f"        for (int i = 0; i < {len(calls)}; i++) {{\n"
            "            const int c = steps[i].run(v, e, steps[i].s, steps[i].x, steps[i].code);\n"
            "            if (c) return c;\n"
            "        }\n"
            "    }\n")


def _calling(name: str, parts: list[str]) -> str:
    """Segment ``name`` runs ``parts`` in order and returns the first nonzero error code."""
    declared = "".join(f"int {part}{_SIGNATURE};\n" for part in parts)
    if len(parts) == 1:
        return f"\n{declared}int {name}{_SEGMENT_SIGNATURE} {{\n{_SEGMENT_ENTER}    return {parts[0]}(v, e);\n}}\n"
    calls = "".join(f"    if ((code = {part}(v, e)) != 0) return code;\n" for part in parts)
    return f"\n{declared}int {name}{_SEGMENT_SIGNATURE} {{\n    int code;\n{_SEGMENT_ENTER}{calls}    return 0;\n}}\n"


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def _indent(code: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else line for line in code.strip("\n").splitlines())
