"""One way to write C: functions as descriptors, fragments as parts, lines through a writer.

A kernel fragment (codegen/kernels/) is compiled once into an object that every model's
library links, and every unit that calls it sees only its *declared* view: its macros,
types and the inline helpers other code inlines, plus a prototype of each entry point
(codegen/fragments.py). That view used to be cut out of the fragment's text with regular
expressions; here each piece says what it is, so the view is assembled, never parsed:

- ``Function``: a C function described by its return type, name, parameters and body, and
  its linkage: ``entry`` (external: the object defines it, units see its prototype),
  ``static`` (private to the object) or ``inline`` (``static inline``: private unless
  ``shared``, then every unit sees its definition). Prototypes are generated from it, so a
  declaration cannot drift from its definition.
- ``Shared(text)``: C every unit sees (macros, typedefs, shared inline helpers).
- ``Private(text)``: C only the fragment's own object compiles (its kernels and helpers).
- ``Fragment``: the parts in order; ``text()`` is the object's translation unit body and
  ``declared()`` the view other units include.

``CWriter`` builds code line by line with indentation, ``{ }`` blocks and preprocessor
guards, for generated kernels (register tiles, unrolled steps). ``fill`` substitutes
``@NAME@`` markers in a template, every marker exactly once named and every value used, so
a template cannot silently keep a marker or take a value meant for another (the way a
textual replace of ``OFF_in1`` also rewrote ``OFF_in10``).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence, Union

LINKAGES = ("entry", "static", "inline")
_MARKER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


@dataclass(frozen=True)
class Function:
    ret: str
    name: str
    params: Sequence[str]  # "const float* x", ...; empty: (void)
    body: str  # the statements inside the braces, as written (indented or not)
    linkage: str = "entry"
    comment: str = ""  # a C comment's text, written above the definition
    shared: bool = False  # an inline helper other units inline too (declared with its body)

    def __post_init__(self) -> None:
        if self.linkage not in LINKAGES:
            raise ValueError(f"function {self.name}: linkage {self.linkage!r} is not one of {', '.join(LINKAGES)}")
        if self.shared and self.linkage != "inline":
            raise ValueError(f"function {self.name}: only an inline helper can be shared with other units")

    def head(self) -> str:
        storage = {"entry": "", "static": "static ", "inline": "static inline "}[self.linkage]
        return f"{storage}{self.ret} {self.name}({', '.join(self.params) or 'void'})"

    def prototype(self) -> str:
        return self.head() + ";\n"

    def definition(self) -> str:
        comment = f"/* {self.comment} */\n" if self.comment else ""
        body = self.body.strip("\n")
        return f"{comment}{self.head()}\n{{\n{body}\n}}\n"


@dataclass(frozen=True)
class Shared:
    """C text every unit that uses the fragment sees."""

    text: str


@dataclass(frozen=True)
class Private:
    """C text only the fragment's own object compiles."""

    text: str


Part = Union[Function, Shared, Private]


class Fragment:
    """A kernel fragment's parts, in order."""

    def __init__(self, parts: Iterable[Part] = ()):
        self.parts: list[Part] = list(parts)

    def add(self, *parts: Part) -> "Fragment":
        self.parts.extend(parts)
        return self

    @property
    def entries(self) -> list[Function]:
        return [p for p in self.parts if isinstance(p, Function) and p.linkage == "entry"]

    def text(self) -> str:
        """Everything: the body of the fragment's own object."""
        return "".join(_ensure_newline(p.definition() if isinstance(p, Function) else p.text) for p in self.parts)

    def declared(self) -> str:
        """What the units that call the fragment include: the shared parts and shared inline
        helpers, and a prototype of every entry point."""
        out = []
        for p in self.parts:
            if isinstance(p, Shared):
                out.append(_ensure_newline(p.text))
            elif isinstance(p, Function) and p.linkage == "entry":
                out.append(p.prototype())
            elif isinstance(p, Function) and p.shared:
                out.append(p.definition())
        return "".join(out)


def _ensure_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def fill(template: str, **values: object) -> str:
    """``template`` with every ``@NAME@`` replaced by ``values[NAME]`` (str() of it). A
    marker without a value, or a value no marker names, is an error: both mean the template
    and its caller disagree."""
    unused = set(values)

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise KeyError(f"C template marker @{name}@ has no value")
        unused.discard(name)
        return str(values[name])

    out = _MARKER.sub(one, template)
    if unused:
        raise KeyError(f"C template has no marker for {', '.join(sorted(unused))}")
    return out


class CWriter:
    """C code built line by line: ``line``, ``{ }`` blocks and ``#if`` guards, indented."""

    def __init__(self, indent: str = "    ", level: int = 0):
        self._lines: list[str] = []
        self._unit = indent
        self._level = level

    def line(self, *texts: str) -> "CWriter":
        """One line per text, at the current indentation (an empty text: a blank line)."""
        for text in texts:
            self._lines.append(self._unit * self._level + text if text else "")
        return self

    def lines(self, texts: Iterable[str]) -> "CWriter":
        return self.line(*texts)

    def raw(self, text: str) -> "CWriter":
        """Lines written as they are: preprocessor lines, or code another writer made."""
        self._lines.extend(text.rstrip("\n").split("\n"))
        return self

    def comment(self, text: str) -> "CWriter":
        return self.line(f"/* {text} */")

    @contextmanager
    def block(self, head: str = "", tail: str = "") -> Iterator["CWriter"]:
        """``head {`` ... ``}tail``, the body one level in."""
        self.line(f"{head} {{" if head else "{")
        self._level += 1
        try:
            yield self
        finally:
            self._level -= 1
            self.line("}" + tail)

    @contextmanager
    def guard(self, condition: str) -> Iterator["CWriter"]:
        """``#if condition`` ... ``#endif`` (``#ifdef X`` for a bare macro name); ``orelse``
        inside writes the ``#else``."""
        directive = f"#ifdef {condition}" if re.fullmatch(r"\w+", condition) else f"#if {condition}"
        self._lines.append(directive)
        try:
            yield self
        finally:
            self._lines.append("#endif")

    def orelse(self) -> "CWriter":
        self._lines.append("#else")
        return self

    def text(self) -> str:
        return "\n".join(self._lines) + "\n" if self._lines else ""
