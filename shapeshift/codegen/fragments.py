"""Kernel fragments compiled once into objects that every model's library links.

A fragment (``codegen/kernels/<name>.py``) is C: types, macros, static helpers, and
*entry points*, the functions with external linkage that generated code calls
(``ss_gemm``, ``ss_copy``, ``ss_softmax``...). Pasted whole into each model's translation
unit, the fragments were most of every build, and the same work for every model: 9 of
the 13 s that gcc -O3 spent on the TorchScript BERT of ../shared/models.

So a fragment with entry points is compiled on its own into an object file, cached like
a library (codegen/build.py: keyed by its text, flags and compiler) and linked into every
library that uses it. The model's translation unit sees the fragment *declared*: a
fragment module's ``fragment()`` (codegen/cwriter.py) says which of its parts other units
see (``Shared``: the macros, types and ``static inline`` helpers that generated loops or
other fragments use, such as ``ss_pad_fold`` and vmath's ``ss_erf8``) and generates a
prototype of each entry point; its ``Private`` parts stay in its object. A fragment
without entry points (vmath, scalar, intpow, conv_igemm) is header-only: it has no object,
and units include it whole.

One fragment, indexing, is still plain text (``source()`` only): its
declared view is cut out of the text with regular expressions, the path every fragment
took before the C writer (see ``_cut_declared``). It stays until it is written with
the C writer too; a new fragment must have a ``fragment()``.

A fragment's own object declares the fragments it depends on (its ``DEPENDS``) the same
way, so each entry point is defined in exactly one object.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from typing import Iterable, Optional

from ..target import Target
from .cwriter import Fragment
from .kernels.prelude import HEADER

# Fragments still written as plain text, whose declared view is cut out with regular
# expressions: indexing only, kept on that path while it was being edited elsewhere. Every
# other fragment module has a fragment().
_PLAIN_TEXT = frozenset({"indexing"})

# Plain-text fragments only. The head of a function definition at the start of a line: a
# return type, the name, the parameter list (which may span lines), then the opening brace.
# An entry point has external linkage; a private helper is static and not inline.
_ENTRY_POINT_HEAD = re.compile(
    r"^(?!static\b|typedef\b|struct\b|union\b|enum\b|extern\b)[A-Za-z_][\w \t*]*?\b\w+\s*\([^;{}]*\)\s*\{", re.M)
_PRIVATE_HELPER_HEAD = re.compile(r"^static\s+(?!inline\b)[\w \t*]*?\b(\w+)\s*\([^;{}]*\)\s*\{", re.M)


def _module(name: str):
    return importlib.import_module(f"shapeshift.codegen.kernels.{name}")


@functools.cache
def _fragment(name: str, target: Optional[Target] = None) -> Optional[Fragment]:
    """The fragment's parts (its module's ``fragment()``); None for indexing,
    which are still plain text (``source()``)."""
    module = _module(name)
    if not hasattr(module, "fragment"):
        if name in _PLAIN_TEXT:
            return None
        raise TypeError(f"kernel module {name!r} has no fragment(): write it with the C writer (codegen/cwriter.py)")
    if name == "gemm":
        from .defaults import default_schedule

        return module.fragment(default_schedule(target))
    return module.fragment()


@functools.cache
def text(name: str, target: Optional[Target] = None) -> str:
    """The fragment's C text, with the default parameters of ``target`` (this machine's
    when None): the GEMM's schedule is the target's (codegen/defaults.py)."""
    parts = _fragment(name, target)
    return parts.text() if parts is not None else _module(name).source()


@functools.cache
def declared(name: str, target: Optional[Target] = None) -> str:
    """What units that call the fragment include: its shared parts and a prototype of each
    entry point (``Fragment.declared``), or for indexing, the text cut down."""
    parts = _fragment(name, target)
    if parts is not None:
        return parts.declared()
    return _cut_declared(text(name, target), name)


def _cut_declared(source: str, name: str) -> str:
    """A plain-text fragment (indexing) as other units declare it: its text with the
    body of each entry point replaced by ``;`` and the private helpers (static, not inline)
    that only those bodies called left out, so that the units that include it do not even
    parse them. A helper named anywhere else, in an inline helper or even in a comment, stays."""
    source = _cut(source, _ENTRY_POINT_HEAD, name)
    # Every private helper definition: (name, start, end). A name may be defined twice,
    # once under #ifdef __AVX2__ and once under #else.
    helpers = [(m.group(1), m.start(), _end_of_block(source, m.end() - 1, name))
               for m in _PRIVATE_HELPER_HEAD.finditer(source)]
    outside, pos = [], 0
    for _, start, end in helpers:
        outside.append(source[pos:start])
        pos = end
    outside.append(source[pos:])
    # What the rest of the text calls, and what those helpers call in turn.
    names = {h for h, _, _ in helpers}
    needed = {h for h in names if re.search(rf"\b{h}\b", "".join(outside))}
    pending = list(needed)
    while pending:
        caller = pending.pop()
        bodies = "".join(source[start:end] for h, start, end in helpers if h == caller)
        for h in names - needed:
            if re.search(rf"\b{h}\b", bodies):
                needed.add(h)
                pending.append(h)
    kept, pos = [], 0
    for h, start, end in helpers:
        if h not in needed:
            kept.append(source[pos:start])
            pos = end
    kept.append(source[pos:])
    return "".join(kept)


def _cut(source: str, heads: re.Pattern, name: str) -> str:
    """``source`` with the body of each function whose head matches cut to its prototype."""
    parts, pos = [], 0
    for head in heads.finditer(source):
        if head.start() < pos:  # a line of a body already cut that looks like a definition
            continue
        brace = head.end() - 1
        parts.append(source[pos:brace].rstrip() + ";\n")
        pos = _end_of_block(source, brace, name)
    parts.append(source[pos:])
    return "".join(parts)


def names() -> tuple[str, ...]:
    """Every kernel fragment (the modules of codegen/kernels/ but the prelude)."""
    from . import kernels

    # A fragment module has a source(); the others there (gemm_tiles, gemm_driver) are parts of one.
    return tuple(sorted(m.name for m in pkgutil.iter_modules(kernels.__path__)
                        if m.name != "prelude" and hasattr(_module(m.name), "source")))


def has_object(name: str) -> bool:
    """Whether the fragment defines entry points (and so is compiled as an object)."""
    parts = _fragment(name)
    if parts is not None:
        return bool(parts.entries)
    return _ENTRY_POINT_HEAD.search(text(name)) is not None


def dependency_order(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` and everything they depend on, each after its dependencies."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for dep in getattr(_module(name), "DEPENDS", ()):
            visit(dep)
        ordered.append(name)

    for name in sorted(names):
        visit(name)
    return tuple(ordered)


def declarations(fragments: Iterable[str], target: Optional[Target] = None) -> str:
    """What a translation unit that calls ``fragments`` (in dependency order) includes."""
    return "".join(f"/* ---- kernels: {name} ---- */\n{declared(name, target)}" for name in fragments)


def object_sources(fragments: Iterable[str], target: Optional[Target] = None) -> list[tuple[str, str]]:
    """(name, translation unit) of each fragment's object, for those that have one."""
    units = []
    for name in fragments:
        if has_object(name):
            deps = dependency_order(getattr(_module(name), "DEPENDS", ()))
            units.append((f"kernels.{name}", HEADER + declarations(deps, target) + f"/* ---- kernels: {name} ---- */\n"
                          + text(name, target)))
    return units


def _end_of_block(source: str, brace: int, name: str) -> int:
    """Index just past the ``}`` matching the ``{`` at ``brace``; comments and string or
    character literals are skipped, since a brace in them does not count."""
    depth, i, n = 0, brace, len(source)
    while i < n:
        if source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
            continue
        if source.startswith("/*", i):
            end = source.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        c = source[i]
        if c in "\"'":
            i += 1
            while i < n and source[i] != c:
                i += 2 if source[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"kernel fragment {name!r}: unbalanced braces after offset {brace}")
