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

Every fragment module has a ``fragment()``: the declared view is assembled from its parts,
never cut out of the text (regular expressions did that before the C writer).

A fragment's own object declares the fragments it depends on (its ``DEPENDS``) the same
way, so each entry point is defined in exactly one object.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Iterable, Optional

from ..target import Target
from .cwriter import Fragment
from .kernels.prelude import HEADER

def _module(name: str):
    return importlib.import_module(f"shapeshift.codegen.kernels.{name}")


@functools.cache
def _fragment(name: str, target: Optional[Target] = None) -> Fragment:
    """The fragment's parts (its module's ``fragment()``)."""
    module = _module(name)
    if not hasattr(module, "fragment"):
        raise TypeError(f"kernel module {name!r} has no fragment(): write it with the C writer (codegen/cwriter.py)")
    if name == "gemm":
        from .defaults import default_schedule

        return module.fragment(default_schedule(target))
    if name in ("rnn", "conv_igemm", "conv_panels", "conv_wino", "conv_nchwc"):  # their tiles and switches follow the target
        return module.fragment(target)
    return module.fragment()


@functools.cache
def text(name: str, target: Optional[Target] = None) -> str:
    """The fragment's C text, with the default parameters of ``target`` (this machine's
    when None): the GEMM's schedule is the target's (codegen/defaults.py)."""
    return _fragment(name, target).text()


@functools.cache
def declared(name: str, target: Optional[Target] = None) -> str:
    """What units that call the fragment include: its shared parts and a prototype of each
    entry point (``Fragment.declared``)."""
    return _fragment(name, target).declared()


def names() -> tuple[str, ...]:
    """Every kernel fragment (the modules of codegen/kernels/ but the prelude)."""
    from . import kernels

    # A fragment module has a source(); the others there (gemm_tiles, gemm_driver) are parts of one.
    return tuple(sorted(m.name for m in pkgutil.iter_modules(kernels.__path__)
                        if m.name != "prelude" and hasattr(_module(m.name), "source")))


def has_object(name: str) -> bool:
    """Whether the fragment defines entry points (and so is compiled as an object)."""
    return bool(_fragment(name).entries)


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

