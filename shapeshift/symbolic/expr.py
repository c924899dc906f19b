"""Symbolic dimensions: canonical, interned integer expressions with interval bounds.

A dimension is either a Python ``int`` or an :class:`Expr`.  Every Expr is an
integer polynomial whose "variables" are *atoms*: named symbols, or the
non-polynomial operations ``floordiv``, ``mod``, ``min`` and ``max`` applied to
other expressions.  Expressions are kept in one canonical form and interned, so
two equal expressions are the same object: equality is ``is`` and hashing is
O(1).  Any operation whose result is a constant returns a plain ``int``, so a
static dimension is always an ``int``.

Facts such as ``max(n, 1) == n`` are decided by interval arithmetic over the
symbols' declared ranges; there is no general computer algebra here.  An
expression that grows past :data:`SIZE_CAP` is replaced by a fresh symbol that
carries its bounds and keeps the original as its definition (so it can still
be evaluated under a binding).
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from typing import Iterable, Mapping, Union

from ..errors import ExpressionError

#: Default range of a symbol nobody declared a range for.
DEFAULT_LO = 1
DEFAULT_HI = 2**31 - 1
#: Bounds at or beyond this magnitude mean "unbounded".
INF = 2**62
#: Number of atoms+terms past which an expression is replaced by a fresh symbol.
SIZE_CAP = 200

Dim = Union[int, "Expr"]


def _clamp(x: int) -> int:
    return max(-INF, min(INF, x))


# A bound clamped to +-INF stands for any value beyond it, so it must absorb:
# adding a finite amount (or halving) must not bring it back inside (-INF, INF),
# where it would read as a real bound and "prove" false facts, e.g.
# x*y*z - w <= 2**62 with default ranges.  A lower bound only needs -INF to
# absorb and an upper bound only +INF (clamping the other way is sound).
def _add_lo(x: int, y: int) -> int:
    return -INF if x <= -INF or y <= -INF else _clamp(x + y)


def _add_hi(x: int, y: int) -> int:
    return INF if x >= INF or y >= INF else _clamp(x + y)


def _interval_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return _clamp(min(products)), _clamp(max(products))


def _interval_pow(a: tuple[int, int], power: int) -> tuple[int, int]:
    lo, hi = a
    if power % 2 == 0 and lo < 0 < hi:
        return 0, _clamp(max(lo**power, hi**power))
    candidates = [lo**power, hi**power]
    return _clamp(min(candidates)), _clamp(max(candidates))


class Atom:
    """A variable of the polynomial form: a symbol or an opaque operation.

    Atoms are interned by ``key``; ``kind`` is one of ``sym``, ``floordiv``,
    ``mod``, ``min``, ``max``.  A ``sym`` atom created by the size cap keeps the
    expression it stands for in ``definition``.
    """

    __slots__ = ("key", "kind", "name", "args", "lo", "hi", "definition", "size", "__weakref__")

    def __init__(self, key, kind, name, args, lo, hi, definition, size):
        self.key = key
        self.kind = kind
        self.name = name
        self.args = args
        self.lo = lo
        self.hi = hi
        self.definition = definition
        self.size = size

    def __repr__(self) -> str:
        return f"Atom({self.key})"


_ATOMS: "weakref.WeakValueDictionary[str, Atom]" = weakref.WeakValueDictionary()
_EXPRS: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()


def _intern_atom(key: str, kind: str, name, args, lo, hi, definition=None) -> Atom:
    atom = _ATOMS.get(key)
    if atom is None:
        size = 1 + sum(a.size for a in args if isinstance(a, Expr))
        atom = Atom(key, kind, name, args, lo, hi, definition, size)
        _ATOMS[key] = atom
    return atom


class Expr:
    """An interned integer polynomial over atoms; never a constant (those are ints)."""

    __slots__ = ("terms", "lo", "hi", "size", "_key", "__weakref__")

    # terms: tuple of (monomial, coefficient); monomial: tuple of (Atom, power),
    # sorted by atom key; the empty monomial is the constant term.

    def __init__(self, terms, lo, hi, size, key):
        self.terms = terms
        self.lo = lo
        self.hi = hi
        self.size = size
        self._key = key

    # -- construction ------------------------------------------------------
    @staticmethod
    def _from_terms(terms: Mapping[tuple, int]) -> Dim:
        items = [(m, c) for m, c in terms.items() if c != 0]
        if not items:
            return 0
        if len(items) == 1 and items[0][0] == ():
            return items[0][1]
        items.sort(key=lambda mc: _monomial_sort_key(mc[0]))
        key = tuple((tuple((a.key, p) for a, p in m), c) for m, c in items)
        existing = _EXPRS.get(key)
        if existing is not None:
            return existing
        lo = hi = 0
        size = 0
        for monomial, coeff in items:
            mlo, mhi = coeff, coeff
            for atom, power in monomial:
                mlo, mhi = _interval_mul((mlo, mhi), _interval_pow((atom.lo, atom.hi), power))
                size += atom.size
            lo, hi = _add_lo(lo, mlo), _add_hi(hi, mhi)
            size += 1
        expr = Expr(tuple(items), lo, hi, size, key)
        if size > SIZE_CAP:
            return _capped(expr)
        _EXPRS[key] = expr
        return expr

    # -- inspection --------------------------------------------------------
    @property
    def key(self) -> str:
        return str(self._key)

    def atoms(self) -> set[Atom]:
        found: set[Atom] = set()
        for monomial, _ in self.terms:
            for atom, _ in monomial:
                found.add(atom)
                for arg in atom.args:
                    if isinstance(arg, Expr):
                        found |= arg.atoms()
        return found

    def free_symbols(self) -> set[str]:
        names: set[str] = set()
        for atom in self.atoms():
            if atom.kind == "sym":
                if atom.definition is not None:
                    names |= free_symbols(atom.definition)
                else:
                    names.add(atom.name)
        return names

    def as_symbol(self) -> Atom | None:
        """The atom if this expression is exactly one bare symbol, else None."""
        if len(self.terms) == 1:
            monomial, coeff = self.terms[0]
            if coeff == 1 and len(monomial) == 1 and monomial[0][1] == 1 and monomial[0][0].kind == "sym":
                return monomial[0][0]
        return None

    # -- arithmetic --------------------------------------------------------
    def __add__(self, other: Dim) -> Dim:
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other: Dim) -> Dim:
        return add(self, mul(other, -1))

    def __rsub__(self, other: Dim) -> Dim:
        return add(other, mul(self, -1))

    def __mul__(self, other: Dim) -> Dim:
        return mul(self, other)

    __rmul__ = __mul__

    def __neg__(self) -> Dim:
        return mul(self, -1)

    def __floordiv__(self, other: Dim) -> Dim:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return mod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return mod(other, self)

    def __str__(self) -> str:
        return to_string(self)

    def __repr__(self) -> str:
        return f"Expr({to_string(self)})"

    def __reduce__(self):
        # Pickling (e.g. to worker processes) re-interns on load.
        return (_rebuild, (_serialize(self),))


def _monomial_sort_key(monomial: tuple) -> tuple:
    degree = sum(p for _, p in monomial)
    return (-degree, tuple((a.key, p) for a, p in monomial)) if monomial else (1, ())


def _terms_of(x: Dim) -> dict:
    if isinstance(x, Expr):
        return dict(x.terms)
    if isinstance(x, (int,)) or hasattr(x, "__index__"):
        return {(): int(x)} if int(x) else {}
    raise TypeError(f"not a dimension: {x!r}")


def _atom_expr(atom: Atom) -> Dim:
    return Expr._from_terms({((atom, 1),): 1})


def _capped(expr: Expr) -> Dim:
    """Replace a too-large expression by a symbol standing for it."""
    # A digest of the full canonical form: stable across runs (unlike hash())
    # and, at 20 hex digits, not shared by two different expressions in practice.
    name = f"_e{hashlib.blake2b(str(expr._key).encode(), digest_size=10).hexdigest()}"
    key = f"s:{name}:{expr.lo}:{expr.hi}"
    atom = _intern_atom(key, "sym", name, (), expr.lo, expr.hi, definition=expr)
    return _atom_expr(atom)


# -- public constructors and operations ------------------------------------------


def symbol(name: str, lo: int = DEFAULT_LO, hi: int = DEFAULT_HI) -> Expr:
    """The expression made of the single symbol ``name`` ranging over [lo, hi]."""
    if lo > hi:
        raise ExpressionError(f"symbol {name!r}: empty range [{lo}, {hi}]")
    # Key on the clamped range, the one the atom keeps: pickling rebuilds the
    # symbol from atom.lo/atom.hi and must find this same atom again.
    lo, hi = _clamp(lo), _clamp(hi)
    key = f"s:{name}:{lo}:{hi}"
    atom = _intern_atom(key, "sym", name, (), lo, hi)
    return _atom_expr(atom)  # type: ignore[return-value]


def is_dim(x) -> bool:
    return isinstance(x, (int, Expr)) and not isinstance(x, bool)


def is_static(x: Dim) -> bool:
    return not isinstance(x, Expr)


def bounds(x: Dim) -> tuple[int, int]:
    if isinstance(x, Expr):
        return x.lo, x.hi
    return int(x), int(x)


def add(a: Dim, b: Dim) -> Dim:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return int(a) + int(b)
    return _add_symbolic(a if isinstance(a, Expr) else int(a), b if isinstance(b, Expr) else int(b))


# Expressions are interned and immutable, so symbolic sums and products can be
# memoized by identity: type rules recompute the same ones (a Reshape's element
# count, broadcast dims) at every visit.
@functools.lru_cache(maxsize=1 << 16)
def _add_symbolic(a: Dim, b: Dim) -> Dim:
    terms = _terms_of(a)
    for m, c in _terms_of(b).items():
        terms[m] = terms.get(m, 0) + c
    return Expr._from_terms(terms)


def add_all(dims: Iterable[Dim]) -> Dim:
    """The sum of ``dims``, its terms gathered in one pass: adding n symbolic dims one at a
    time builds n growing expressions (SSDlite's Concats of 90 data-sized parts: 0.26 s of
    its import's type inference under cProfile). A sum too large for ``SIZE_CAP`` becomes one symbol for the
    whole sum, where adding in turn capped the first partial sum past it."""
    terms: dict = {}
    constant = 0
    symbolic = False
    for d in dims:
        if isinstance(d, Expr):
            symbolic = True
            for m, c in d.terms:
                terms[m] = terms.get(m, 0) + c
        else:
            constant += int(d)
    if not symbolic:
        return constant
    if constant:
        terms[()] = terms.get((), 0) + constant
    return Expr._from_terms(terms)


def sub(a: Dim, b: Dim) -> Dim:
    return add(a, mul(b, -1))


def _mul_monomials(m1: tuple, m2: tuple) -> tuple:
    powers: dict[Atom, int] = {}
    for atom, p in m1 + m2:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items(), key=lambda ap: ap[0].key))


def mul(a: Dim, b: Dim) -> Dim:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return int(a) * int(b)
    return _mul_symbolic(a if isinstance(a, Expr) else int(a), b if isinstance(b, Expr) else int(b))


@functools.lru_cache(maxsize=1 << 16)
def _mul_symbolic(a: Dim, b: Dim) -> Dim:
    result: dict = {}
    for m1, c1 in _terms_of(a).items():
        for m2, c2 in _terms_of(b).items():
            m = _mul_monomials(m1, m2)
            result[m] = result.get(m, 0) + c1 * c2
    return Expr._from_terms(result)


def _opaque(kind: str, args: tuple, lo: int, hi: int) -> Dim:
    if lo == hi and -INF < lo < INF:
        return lo
    key = f"{kind}({','.join(_arg_key(a) for a in args)})"
    atom = _intern_atom(key, kind, None, args, lo, hi)
    return _atom_expr(atom)


def _arg_key(a: Dim) -> str:
    return a.key if isinstance(a, Expr) else str(int(a))


def _split_by_divisor(a: Dim, c: int) -> tuple[Dim, Dim]:
    """a = c*q + r where q collects the terms whose coefficients c divides."""
    quotient: dict = {}
    rest: dict = {}
    for m, coeff in _terms_of(a).items():
        if coeff % c == 0:
            quotient[m] = coeff // c
        else:
            rest[m] = coeff
    return Expr._from_terms(quotient), Expr._from_terms(rest)


def floordiv(a: Dim, b: Dim) -> Dim:
    """Floor division (Python semantics: rounds toward negative infinity)."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        if int(b) == 0:
            raise ExpressionError("division by zero in a shape expression")
        return int(a) // int(b)
    if not isinstance(b, Expr):
        c = int(b)
        if c == 0:
            raise ExpressionError("division by zero in a shape expression")
        if c == 1:
            return a
        if c < 0:
            return floordiv(mul(a, -1), -c)
        quotient, rest = _split_by_divisor(a, c)
        if quotient != 0:
            return add(quotient, floordiv(rest, c))
        lo, hi = bounds(rest)
        if 0 <= lo and hi < c:
            return 0
        # (x // p + k) // c == (x + p*k) // (p*c) for positive constants p, c and
        # any integer k: conv/pool output sizes nest this way layer after layer.
        nested = _nested_floordiv(rest)
        if nested is not None:
            inner, offset = nested
            numerator, divisor = inner.args
            return floordiv(add(numerator, divisor * offset), divisor * c)
        return _opaque("floordiv", (rest, c), *_floordiv_bounds(bounds(rest), (c, c)))
    # b symbolic
    if a is b and b.lo > 0:
        return 1
    exact = _divide_exactly(a, b)
    if exact is not None:
        return exact
    return _opaque("floordiv", (a, b), *_floordiv_bounds(bounds(a), bounds(b)))


def _nested_floordiv(x: Dim) -> tuple[Atom, int] | None:
    """(atom, k) when x is exactly ``floordiv(y, p) + k`` with a positive constant p."""
    if not isinstance(x, Expr):
        return None
    offset = 0
    inner = None
    for monomial, coeff in x.terms:
        if not monomial:
            offset = coeff
        elif coeff == 1 and len(monomial) == 1 and monomial[0][1] == 1 and inner is None:
            inner = monomial[0][0]
        else:
            return None
    if inner is None or inner.kind != "floordiv" or isinstance(inner.args[1], Expr) or inner.args[1] <= 0:
        return None
    return inner, offset


def _divide_exactly(a: Dim, b: Expr) -> Dim | None:
    """a / b when a is a constant multiple of b, or b is one monomial dividing every term of a."""
    if b.lo <= 0:
        return None
    if isinstance(a, Expr):
        # (64*x + 64) / (x + 1): try the ratio of the leading terms.
        lead_monomial, lead_coeff = b.terms[0]
        coeff = dict(a.terms).get(lead_monomial)
        if coeff is not None and coeff % lead_coeff == 0 and mul(b, coeff // lead_coeff) is a:
            return coeff // lead_coeff
    if len(b.terms) != 1 or b.terms[0][1] != 1:
        return None
    (bm, _), = b.terms
    bpowers = dict(bm)
    quotient: dict = {}
    for m, c in _terms_of(a).items():
        powers = dict(m)
        for atom, p in bpowers.items():
            if powers.get(atom, 0) < p:
                return None
            powers[atom] -= p
        key = tuple(sorted(((at, p) for at, p in powers.items() if p), key=lambda ap: ap[0].key))
        quotient[key] = quotient.get(key, 0) + c
    return Expr._from_terms(quotient)


def _floordiv_bounds(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    if b[0] <= 0 <= b[1]:
        return -INF, INF
    corners = [_floordiv_corner(x, y) for x in a for y in b]
    return _clamp(min(corners)), _clamp(max(corners))


def _floordiv_corner(x: int, y: int) -> int:
    # An unbounded dividend stays unbounded (INF // 2 would read as a bound).
    if abs(x) >= INF:
        return INF if (x > 0) == (y > 0) else -INF
    return x // y


def ceildiv(a: Dim, b: Dim) -> Dim:
    if not isinstance(b, Expr) and int(b) > 0:
        # ceil(a/b) == floor((a + b - 1)/b) for b > 0, and reads better.
        return floordiv(add(a, int(b) - 1), b)
    return mul(floordiv(mul(a, -1), b), -1)


def mod(a: Dim, b: Dim) -> Dim:
    """Floor modulo (Python semantics: the result has the sign of ``b``)."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        if int(b) == 0:
            raise ExpressionError("modulo by zero in a shape expression")
        return int(a) % int(b)
    if not isinstance(b, Expr):
        c = int(b)
        if c == 0:
            raise ExpressionError("modulo by zero in a shape expression")
        if abs(c) == 1:
            return 0
        if c > 0:
            reduced = Expr._from_terms({m: coeff % c for m, coeff in _terms_of(a).items()})
            lo, hi = bounds(reduced)
            if 0 <= lo and hi < c:
                return reduced
            if not isinstance(reduced, Expr):
                return reduced % c
            return _opaque("mod", (reduced, c), 0, c - 1 if lo < 0 else min(c - 1, hi))
        return _opaque("mod", (a, c), c + 1, 0)
    if a is b:
        return 0
    if b.lo > 0:
        lo, hi = bounds(a)
        if 0 <= lo and hi < b.lo:
            return a
        if _divide_exactly(a, b) is not None:
            return 0
        top = _add_hi(b.hi, -1)
        return _opaque("mod", (a, b), 0, top if lo < 0 else min(top, hi))
    return _opaque("mod", (a, b), -INF, INF)


def _absorb(kind: str, a: Dim, b: Dim) -> Dim | None:
    """Absorption: max(min(x, y), x) is x, min(max(x, y), x) is x (either order)."""
    dual = "min" if kind == "max" else "max"
    for inner, other in ((a, b), (b, a)):
        if isinstance(inner, Expr) and len(inner.terms) == 1:
            (monomial, coeff), = inner.terms
            if coeff == 1 and len(monomial) == 1 and monomial[0][1] == 1:
                atom = monomial[0][0]
                if atom.kind == dual and any(arg is other for arg in atom.args):
                    return other
    return None


def _minmax(kind: str, a: Dim, b: Dim) -> Dim:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        return min(int(a), int(b)) if kind == "min" else max(int(a), int(b))
    if a is b:
        return a
    absorbed = _absorb(kind, a, b)
    if absorbed is not None:
        return absorbed
    lo, hi = bounds(sub(a, b))
    if lo == hi == 0:
        # Equal everywhere (e.g. two symbols ranging over [1, 1]): choose by
        # key, not by argument order, so that min(a, b) is min(b, a).
        if not isinstance(a, Expr):
            return a
        if not isinstance(b, Expr):
            return b
        return min((a, b), key=_arg_key)
    if hi <= 0:  # a <= b everywhere
        return a if kind == "min" else b
    if lo >= 0:  # a >= b everywhere
        return b if kind == "min" else a
    first, second = sorted((a, b), key=_arg_key)
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    if kind == "min":
        return _opaque("min", (first, second), min(alo, blo), min(ahi, bhi))
    return _opaque("max", (first, second), max(alo, blo), max(ahi, bhi))


def minimum(a: Dim, b: Dim) -> Dim:
    return _minmax("min", a, b)


def maximum(a: Dim, b: Dim) -> Dim:
    return _minmax("max", a, b)


# -- facts ---------------------------------------------------------------------


def prove_le(a: Dim, b: Dim) -> bool:
    """True when a <= b holds for every binding inside the symbols' ranges."""
    return bounds(sub(b, a))[0] >= 0


def prove_eq(a: Dim, b: Dim) -> bool:
    return a is b or (not isinstance(a, Expr) and not isinstance(b, Expr) and int(a) == int(b))


def free_symbols(x: Dim) -> set[str]:
    return x.free_symbols() if isinstance(x, Expr) else set()


# -- evaluation and substitution -------------------------------------------------


def evaluate(x: Dim, binding: Mapping[str, int]) -> int:
    """The integer value of ``x`` when each symbol takes its value in ``binding``."""
    if not isinstance(x, Expr):
        return int(x)
    return _eval_expr(x, binding, {})


def _eval_atom(atom: Atom, binding: Mapping[str, int], memo: dict) -> int:
    cached = memo.get(atom)
    if cached is not None:
        return cached
    if atom.kind == "sym":
        if atom.definition is not None:
            value = evaluate(atom.definition, binding)
        elif atom.name in binding:
            value = int(binding[atom.name])
        else:
            raise ExpressionError(f"symbol {atom.name!r} has no value")
    else:
        args = [_eval_expr(a, binding, memo) if isinstance(a, Expr) else int(a) for a in atom.args]
        if atom.kind in ("floordiv", "mod") and args[1] == 0:
            raise ExpressionError(f"division by zero evaluating {atom.key}")
        value = {
            "floordiv": lambda: args[0] // args[1],
            "mod": lambda: args[0] % args[1],
            "min": lambda: min(args),
            "max": lambda: max(args),
        }[atom.kind]()
    memo[atom] = value
    return value


def _eval_expr(x: Expr, binding: Mapping[str, int], memo: dict) -> int:
    total = 0
    for monomial, coeff in x.terms:
        value = coeff
        for atom, power in monomial:
            value *= _eval_atom(atom, binding, memo) ** power
        total += value
    return total


def substitute(x: Dim, mapping: Mapping[str, Dim]) -> Dim:
    """Replace symbols by dimensions (ints or expressions) and re-canonicalize."""
    if not isinstance(x, Expr):
        return x
    total: Dim = 0
    for monomial, coeff in x.terms:
        value: Dim = coeff
        for atom, power in monomial:
            replaced = _substitute_atom(atom, mapping)
            for _ in range(power):
                value = mul(value, replaced)
        total = add(total, value)
    return total


def _substitute_atom(atom: Atom, mapping: Mapping[str, Dim]) -> Dim:
    if atom.kind == "sym":
        if atom.definition is not None:
            return substitute(atom.definition, mapping)
        return mapping.get(atom.name, _atom_expr(atom))
    args = [substitute(a, mapping) for a in atom.args]
    return {"floordiv": floordiv, "mod": mod, "min": minimum, "max": maximum}[atom.kind](*args)


# -- printing --------------------------------------------------------------------


def to_string(x: Dim) -> str:
    if not isinstance(x, Expr):
        return str(int(x))
    parts: list[str] = []
    for monomial, coeff in x.terms:
        factors = [_atom_string(a) + (f"**{p}" if p > 1 else "") for a, p in monomial]
        if not factors:
            body, magnitude = str(abs(coeff)), None
        else:
            magnitude = abs(coeff)
            body = "*".join(([str(magnitude)] if magnitude != 1 else []) + factors)
        sign = "-" if coeff < 0 else "+"
        parts.append((sign, body))
    text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    for sign, body in parts[1:]:
        text += f" {sign} {body}"
    return text


def _wrapped(x: Dim) -> str:
    text = to_string(x)
    if isinstance(x, Expr) and (len(x.terms) > 1 or x.terms[0][1] < 0 or len(x.terms[0][0]) > 1 or x.terms[0][1] != 1):
        return f"({text})"
    return text


def _atom_string(atom: Atom) -> str:
    if atom.kind == "sym":
        return atom.name
    a, b = atom.args
    if atom.kind == "floordiv":
        return f"({_wrapped(a)} // {_wrapped(b)})"
    if atom.kind == "mod":
        return f"({_wrapped(a)} % {_wrapped(b)})"
    return f"{atom.kind}({to_string(a)}, {to_string(b)})"


# -- pickling support --------------------------------------------------------------


def _serialize(x: Dim):
    if not isinstance(x, Expr):
        return int(x)
    return tuple(
        (tuple((_serialize_atom(a), p) for a, p in m), c) for m, c in x.terms
    )


def _serialize_atom(atom: Atom):
    if atom.kind == "sym":
        definition = None if atom.definition is None else _serialize(atom.definition)
        return ("sym", atom.name, atom.lo, atom.hi, definition)
    return (atom.kind, tuple(_serialize(a) for a in atom.args))


def _rebuild(data) -> Dim:
    if isinstance(data, int):
        return data
    # Assemble the whole polynomial at once, as it was: adding it up term by
    # term could cross SIZE_CAP part-way and cap a different partial sum, so a
    # capped expression would not come back as the same object.
    terms: dict = {}
    for monomial, coeff in data:
        m: tuple = ()
        for atom_data, power in monomial:
            atom = _bare_atom(_rebuild_atom(atom_data))
            if atom is None:
                return _rebuild_by_arithmetic(data)
            m = _mul_monomials(m, ((atom, power),))
        terms[m] = terms.get(m, 0) + coeff
    return Expr._from_terms(terms)


def _bare_atom(x: Dim) -> Atom | None:
    """The atom when ``x`` is exactly one atom (coefficient 1, power 1)."""
    if isinstance(x, Expr) and len(x.terms) == 1:
        monomial, coeff = x.terms[0]
        if coeff == 1 and len(monomial) == 1 and monomial[0][1] == 1:
            return monomial[0][0]
    return None


def _rebuild_by_arithmetic(data) -> Dim:
    total: Dim = 0
    for monomial, coeff in data:
        value: Dim = coeff
        for atom_data, power in monomial:
            atom_value = _rebuild_atom(atom_data)
            for _ in range(power):
                value = mul(value, atom_value)
        total = add(total, value)
    return total


def _rebuild_atom(data) -> Dim:
    if data[0] == "sym":
        _, name, lo, hi, definition = data
        if definition is not None:
            return _rebuild(definition)
        return symbol(name, lo, hi)
    kind, args = data
    rebuilt = [_rebuild(a) for a in args]
    return {"floordiv": floordiv, "mod": mod, "min": minimum, "max": maximum}[kind](*rebuilt)

