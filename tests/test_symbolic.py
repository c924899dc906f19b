"""Tests of shapeshift.symbolic: canonical, interned dimension expressions.

Property tests build random expression trees over a few ranged symbols, turn
each into a canonical Expr, and check it against the same tree evaluated with
plain Python ints (floor semantics): values, interval bounds, printing and
parsing, pickling, substitution, and that equal expressions are one object.
Example tests pin the documented simplifications and the error cases.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapeshift.errors import ExpressionError
from shapeshift.symbolic import (
    Expr,
    add,
    add_all,
    bounds,
    ceildiv,
    evaluate,
    floordiv,
    free_symbols,
    is_static,
    maximum,
    minimum,
    mod,
    mul,
    parse_dim,
    prove_eq,
    prove_le,
    sub,
    substitute,
    symbol,
    to_string,
)
from shapeshift.symbolic.expr import INF, SIZE_CAP

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = ("n", "seq_len", "B2")

# -- random expression trees ---------------------------------------------------
#
# A tree is a nested tuple: ("sym", name), ("const", k), (op, left, right) with
# op in add/sub/mul/min/max, or (op, left, divisor) with op in
# floordiv/ceildiv/mod, where the divisor never takes the value 0.


_SYMS = st.sampled_from(NAMES).map(lambda name: ("sym", name))
_DIVISORS = st.one_of(
    st.integers(1, 7).map(lambda k: ("const", k)),
    st.integers(-5, -1).map(lambda k: ("const", k)),
    _SYMS,  # its symbol gets a range with lo >= 1
    st.tuples(st.just("add"), _SYMS, st.integers(1, 3).map(lambda k: ("const", k))),
    st.tuples(st.just("sub"), st.integers(-3, -1).map(lambda k: ("const", k)), _SYMS),  # negative
)
_TREES = st.recursive(
    st.one_of(_SYMS, st.integers(-3, 6).map(lambda k: ("const", k))),
    lambda children: st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "mul", "min", "max"]), children, children),
        st.tuples(st.sampled_from(["floordiv", "ceildiv", "mod"]), children, _DIVISORS),
    ),
    max_leaves=10,
)


def _divide(tree, steps):
    for op, divisor in steps:
        tree = (op, tree, divisor)
    return tree


# Chains of divisions of a small tree, (x // 2) // 3 % 4 and the like, where
# the division rules meet each other; random trees rarely stack them.
_CHAINS = st.builds(
    _divide,
    st.recursive(_SYMS | st.integers(-3, 6).map(lambda k: ("const", k)),
                 lambda children: st.tuples(st.sampled_from(["add", "sub", "mul"]), children, children),
                 max_leaves=4),
    st.lists(st.tuples(st.sampled_from(["floordiv", "ceildiv", "mod"]), _DIVISORS), min_size=1, max_size=3),
)


def symbol_divisors(tree):
    """Names of the symbols some division in ``tree`` divides by directly."""
    if tree[0] in ("sym", "const"):
        return set()
    found = symbol_divisors(tree[1]) | symbol_divisors(tree[2])
    if tree[0] in ("floordiv", "ceildiv", "mod") and tree[2][0] == "sym":
        found.add(tree[2][1])
    return found


@st.composite
def cases(draw, bindings=4):
    """(ranges, tree, [binding, ...]): a tree over 2-3 symbols with random
    ranges (lo in 0..5, hi in lo..60; lo >= 1 for a symbol divided by), and
    bindings inside the ranges."""
    count = draw(st.integers(2, 3))
    tree = _fold_names(draw(_TREES | _CHAINS), NAMES[:count])
    divided = symbol_divisors(tree)
    ranges = {}
    for name in NAMES[:count]:
        lo = draw(st.integers(1 if name in divided else 0, 5))
        ranges[name] = (lo, draw(st.integers(lo, 60)))
    envs = [{name: draw(st.integers(lo, hi)) for name, (lo, hi) in ranges.items()} for _ in range(bindings)]
    return ranges, tree, envs


def _fold_names(tree, names):
    """``tree`` with every symbol outside ``names`` renamed to ``names[0]``."""
    if tree[0] == "sym":
        return tree if tree[1] in names else ("sym", names[0])
    if tree[0] == "const":
        return tree
    return (tree[0], _fold_names(tree[1], names), _fold_names(tree[2], names))


def py_eval(tree, env):
    """The tree's value with Python ints (floor division, floor modulo)."""
    kind = tree[0]
    if kind == "sym":
        return env[tree[1]]
    if kind == "const":
        return tree[1]
    a, b = py_eval(tree[1], env), py_eval(tree[2], env)
    return {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
        "floordiv": lambda: a // b,
        "ceildiv": lambda: -(-a // b),
        "mod": lambda: a % b,
    }[kind]()


_FUNCS = {"add": add, "sub": sub, "mul": mul, "min": minimum, "max": maximum,
          "floordiv": floordiv, "ceildiv": ceildiv, "mod": mod}


def build(tree, ranges):
    """The canonical dimension for ``tree``, through the module's functions."""
    kind = tree[0]
    if kind == "sym":
        return symbol(tree[1], *ranges[tree[1]])
    if kind == "const":
        return tree[1]
    return _FUNCS[kind](build(tree[1], ranges), build(tree[2], ranges))


def build_differently(tree, ranges):
    """The same expression built another way: Python operators, operands of
    commutative ops swapped, subtraction as adding a negation, and products of
    sums distributed.  Canonical forms must make it the very same object."""
    kind = tree[0]
    if kind in ("sym", "const"):
        return build(tree, ranges)
    if kind == "mul" and tree[1][0] in ("add", "sub"):
        inner, left, right = tree[1]
        negate = -1 if inner == "sub" else 1
        factor = build_differently(tree[2], ranges)
        return (factor * build_differently(right, ranges)) * negate + build_differently(left, ranges) * factor
    a, b = build_differently(tree[1], ranges), build_differently(tree[2], ranges)
    if kind == "add":
        return b + a
    if kind == "sub":
        return -b + a
    if kind == "mul":
        return b * a
    if kind == "min":
        return minimum(b, a)
    if kind == "max":
        return maximum(b, a)
    if kind == "floordiv":
        return a // b
    if kind == "mod":
        return a % b
    return ceildiv(a, b)


def all_atoms(e):
    return e.atoms() if isinstance(e, Expr) else set()


def is_capped(e):
    """Whether the size cap replaced some part of ``e`` by a fresh symbol."""
    return any(atom.kind == "sym" and atom.definition is not None for atom in all_atoms(e))


def same(a, b):
    """Equal dimensions: equal ints, or the very same interned Expr."""
    if isinstance(a, Expr) or isinstance(b, Expr):
        return a is b
    return a == b


def within(value, lo, hi):
    # A bound at +-INF means "unbounded" (the module clamps magnitudes there).
    return (lo <= -INF or lo <= value) and (hi >= INF or value <= hi)


# -- properties ----------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(cases())
def test_evaluate_matches_python_ints(case):
    ranges, tree, envs = case
    e = build(tree, ranges)
    for env in envs:
        assert evaluate(e, env) == py_eval(tree, env), (tree, env, to_string(e))


@PROPERTY_SETTINGS
@given(cases())
def test_bounds_contain_every_value(case):
    ranges, tree, envs = case
    e = build(tree, ranges)
    lo, hi = bounds(e)
    assert lo <= hi
    for env in envs:
        assert within(py_eval(tree, env), lo, hi), (tree, env, to_string(e), (lo, hi))


@PROPERTY_SETTINGS
@given(cases(bindings=0))
def test_static_results_are_ints(case):
    ranges, tree, _ = case
    e = build(tree, ranges)
    assert isinstance(e, (int, Expr)) and not isinstance(e, bool)
    if isinstance(e, Expr):
        assert not is_static(e)
        assert free_symbols(e) <= set(ranges)


@PROPERTY_SETTINGS
@given(cases(bindings=0))
def test_print_then_parse_is_identity(case):
    ranges, tree, _ = case
    e = build(tree, ranges)
    if is_capped(e):
        return  # a capped part prints as its fresh symbol's name
    text = to_string(e)
    assert same(parse_dim(text, ranges), e), text


@PROPERTY_SETTINGS
@given(cases(bindings=0))
def test_pickle_round_trip_is_identity(case):
    ranges, tree, _ = case
    e = build(tree, ranges)
    assert same(pickle.loads(pickle.dumps(e)), e)
    assert same(pickle.loads(pickle.dumps([e, e], protocol=2))[1], e)


@PROPERTY_SETTINGS
@given(cases())
def test_substitute_agrees_with_evaluate(case):
    ranges, tree, envs = case
    e = build(tree, ranges)
    for env in envs:
        expected = py_eval(tree, env)
        assert substitute(e, env) == expected
        # Bind one symbol now and the rest later.
        first, *rest = sorted(env)
        partial = substitute(e, {first: env[first]})
        assert first not in free_symbols(partial)
        assert evaluate(partial, {name: env[name] for name in rest}) == expected
        # Rename a symbol: a symbol for a symbol, same range.
        renamed = substitute(e, {first: symbol("renamed", *ranges[first])})
        assert evaluate(renamed, {**env, "renamed": env[first], first: None}) == expected


@PROPERTY_SETTINGS
@given(cases(bindings=0))
def test_equal_expressions_are_one_object(case):
    ranges, tree, _ = case
    e = build(tree, ranges)
    other = build_differently(tree, ranges)
    if is_capped(e) or is_capped(other):
        return  # capping depends on the order intermediate results grow in
    assert same(other, e), (tree, to_string(e), to_string(other))
    assert hash(other) == hash(e)


@PROPERTY_SETTINGS
@given(st.lists(cases(), min_size=1, max_size=4), st.integers(-3, 3))
def test_add_all_is_the_sum_of_its_terms(parts, constant):
    """A sum gathered in one pass is the very expression that adding in turn builds, and has
    its value. Each part has symbols of its own (n -> n_2), its first one comes twice (so
    that like terms merge), and a constant joins them."""
    ranges, env, trees = {}, {}, []
    for i, (part_ranges, tree, envs) in enumerate(parts):
        suffix = f"_{i}"
        trees.append(_suffixed(tree, suffix))
        ranges.update({name + suffix: bound for name, bound in part_ranges.items()})
        env.update({name + suffix: value for name, value in envs[0].items()})
    trees.append(trees[0])
    dims = [build(tree, ranges) for tree in trees] + [constant]
    total = add_all(dims)
    stepwise = 0
    for d in dims:
        stepwise = add(stepwise, d)
    if not (is_capped(total) or is_capped(stepwise)):
        assert same(total, stepwise), [to_string(d) for d in dims]
    assert evaluate(total, env) == sum(py_eval(tree, env) for tree in trees) + constant


def _suffixed(tree, suffix):
    """``tree`` with every symbol renamed to its name plus ``suffix``."""
    if tree[0] == "sym":
        return ("sym", tree[1] + suffix)
    if tree[0] == "const":
        return tree
    return (tree[0], _suffixed(tree[1], suffix), _suffixed(tree[2], suffix))


def test_add_all_of_many_data_sized_parts():
    """SSDlite's per-class Concat: 90 parts, each sized by its own data (a NonZero's count)."""
    counts = [symbol(f"k{i}", 0, 3234) for i in range(90)]
    total = add_all(counts)
    assert total is sum(counts[1:], counts[0])
    assert bounds(total) == (0, 90 * 3234)
    assert evaluate(total, {f"k{i}": i for i in range(90)}) == sum(range(90))
    assert add_all([]) == 0 and add_all([3, 4]) == 7


@PROPERTY_SETTINGS
@given(cases())
def test_prove_le_is_sound(case):
    ranges, tree, envs = case
    e = build(tree, ranges)
    for other in (0, 1, symbol(NAMES[0], *ranges[NAMES[0]])):
        if prove_le(e, other):
            assert all(py_eval(tree, env) <= evaluate(other, env) for env in envs)
        if prove_le(other, e):
            assert all(evaluate(other, env) <= py_eval(tree, env) for env in envs)


# -- documented facts ------------------------------------------------------------------


def test_max_with_lower_bound_is_the_symbol():
    n = symbol("n", 1, 512)
    assert maximum(n, 1) is n
    assert maximum(1, n) is n
    assert minimum(n, 1) == 1
    assert maximum(symbol("m", 0, 9), 1) is not symbol("m", 0, 9)


def test_min_of_n_and_n_plus_one():
    n = symbol("n")
    assert minimum(n, n + 1) is n
    assert maximum(n, n + 1) is n + 1
    assert minimum(n, n) is n


def test_min_of_values_equal_everywhere_is_canonical():
    # Both symbols can only be 1: either is a right answer, but min(a, b) and
    # min(b, a) must be the same object.
    a, b = symbol("a", 1, 1), symbol("b", 1, 1)
    assert minimum(a, b) is minimum(b, a)
    assert maximum(a, b) is maximum(b, a)
    assert minimum(a, 1) == 1 and maximum(1, a) == 1


def test_halving_an_odd_expression():
    n = symbol("n", 0, 100)
    assert (2 * n + 1) // 2 is n
    assert floordiv(4 * n + 3, 2) is 2 * n + 1
    assert ceildiv(2 * n + 1, 2) is n + 1
    assert (6 * n) // 3 is 2 * n


def test_division_by_one_is_identity():
    seq = symbol("seq", 1, 512)
    assert seq // 1 is seq
    assert floordiv(seq, 1) is seq
    assert ceildiv(seq, 1) is seq
    assert seq // seq == 1


def test_nested_floordiv_merges():
    n = symbol("n", 0, 1000)
    assert (n // 2) // 3 is n // 6


def test_floordiv_by_negative_constant():
    n = symbol("n", 0, 100)
    e = n // -3
    assert e is (-n) // 3
    assert [evaluate(e, {"n": v}) for v in range(10)] == [v // -3 for v in range(10)]


def test_exact_division_by_a_symbol():
    a, b = symbol("a", 1, 64), symbol("b", 0, 64)
    assert (a * b + 3 * a) // a is b + 3
    assert mod(a * b, a) == 0
    assert mod(a, a) == 0


def test_mod_facts():
    n = symbol("n", 0, 100)
    assert mod(n, 1) == 0
    assert mod(n, -1) == 0
    assert mod(4 * n + 1, 2) == 1
    assert mod(2 * n, 2) == 0
    assert mod(symbol("k", 0, 6), 7) is symbol("k", 0, 6)
    assert bounds(mod(n, 7)) == (0, 6)
    assert bounds(mod(n, -4)) == (-3, 0)
    d = symbol("d", 2, 9)
    assert mod(symbol("s", 0, 1), d) is symbol("s", 0, 1)
    assert bounds(mod(n, d)) == (0, 8)
    for v in range(-3, 12):
        assert evaluate(mod(n - 3, 5), {"n": v}) == (v - 3) % 5
        assert evaluate(mod(n, -4), {"n": v}) == v % -4


def test_ceildiv_and_mod_by_symbol_evaluate():
    n, d = symbol("n", 0, 50), symbol("d", 1, 8)
    for nv in range(0, 51, 7):
        for dv in range(1, 9):
            env = {"n": nv, "d": dv}
            assert evaluate(ceildiv(n, d), env) == -(-nv // dv)
            assert evaluate(mod(n, d), env) == nv % dv
            assert evaluate(n // d, env) == nv // dv


def test_constants_stay_ints():
    assert add(2, 3) == 5 and isinstance(add(2, 3), int)
    n = symbol("n")
    assert n - n == 0 and isinstance(n - n, int)
    assert n * 0 == 0
    assert floordiv(symbol("m", 0, 3), 4) == 0
    assert minimum(symbol("m", 0, 3), 5) is symbol("m", 0, 3)


def test_interning_and_operators():
    a, b = symbol("a", 0, 10), symbol("b", 1, 10)
    assert (a + b) * 2 is 2 * b + 2 * a
    assert (a - b) * (a + b) is a * a - b * b
    assert a + b is parse_dim("b + a", {"a": (0, 10), "b": (1, 10)})
    assert 1 - a is -a + 1
    assert 10 // b is floordiv(10, b)
    assert 10 % b is mod(10, b)
    assert prove_eq(a * b, b * a)
    assert not prove_eq(a, b)
    assert {a + b: 1}[b + a] == 1


def test_symbols_with_different_ranges_are_different():
    assert symbol("n", 1, 8) is not symbol("n", 1, 9)
    assert symbol("n", 1, 8) is symbol("n", 1, 8)


def test_printing():
    n, m = symbol("n", 1, 100), symbol("m", 1, 100)
    assert to_string(2 * n + 1) == "2*n + 1"
    assert to_string(n - m) in ("n - m", "-m + n")
    assert to_string(5) == "5"
    assert str(n) == "n"
    assert repr(n * n) == "Expr(n**2)"
    assert to_string(maximum(n - 50, m - 50)) == f"max({to_string(n - 50)}, {to_string(m - 50)})" or \
        to_string(maximum(n - 50, m - 50)) == f"max({to_string(m - 50)}, {to_string(n - 50)})"


def test_parse_grammar():
    ranges = {"n": (1, 64), "k": (2, 8)}
    n, k = symbol("n", 1, 64), symbol("k", 2, 8)
    assert parse_dim("2*n + 1", ranges) is 2 * n + 1
    assert parse_dim("n**2", ranges) is n * n
    assert parse_dim("n**0", ranges) == 1
    assert parse_dim("ceildiv(n, k)", ranges) is ceildiv(n, k)
    assert parse_dim("floordiv(n, 4)", ranges) is n // 4
    assert parse_dim("mod(n, k)", ranges) is mod(n, k)
    assert parse_dim("-n + +3", ranges) is 3 - n
    assert parse_dim("  12  ") == 12
    assert parse_dim("x") is symbol("x")  # undeclared: default range


@pytest.mark.parametrize("text", [
    "n +", "n / 2", "n ** m", "n ** -1", "1.5", "min(n)", "max(n, 1, 2)", "foo(n, 1)",
    "n if n else 1", "n.attr", "True", "'n'", "", "n < 2", "min(n, b=1)",
])
def test_parse_errors_name_the_text(text):
    with pytest.raises(ExpressionError) as info:
        parse_dim(text)
    assert repr(text) in str(info.value)


def test_division_by_zero():
    n = symbol("n", 1, 10)
    for make in (lambda: floordiv(n, 0), lambda: mod(n, 0), lambda: ceildiv(n, 0),
                 lambda: floordiv(5, 0), lambda: mod(5, 0), lambda: parse_dim("n // 0"),
                 lambda: parse_dim("n % (n - n)")):
        with pytest.raises(ExpressionError):
            make()
    d = symbol("d", 0, 4)  # may be zero: only evaluation can tell
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate(n // d, {"n": 3, "d": 0})
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate(mod(n, d), {"n": 3, "d": 0})
    assert evaluate(n // d, {"n": 3, "d": 2}) == 1


def test_unbound_symbol_and_empty_range():
    with pytest.raises(ExpressionError, match="'m'"):
        evaluate(symbol("n") + symbol("m"), {"n": 1})
    with pytest.raises(ExpressionError, match="empty range"):
        symbol("n", 5, 4)
    with pytest.raises(ExpressionError, match="empty range"):
        parse_dim("n", {"n": (3, 1)})


def _big_expression():
    """A product of sums past SIZE_CAP, with its Python-int evaluator."""
    syms = [symbol(f"s{i}", 0, 3) for i in range(6)]
    e = 1
    for s in syms:
        e = e * (s + syms[0] + 1)
    return e, syms


def test_size_cap_replaces_by_a_fresh_symbol():
    e, syms = _big_expression()
    assert isinstance(e, Expr) and is_capped(e)
    assert e.size <= SIZE_CAP
    env = {f"s{i}": (i * 7 + 1) % 4 for i in range(6)}
    expected = 1
    for i in range(6):
        expected *= env[f"s{i}"] + env["s0"] + 1
    assert evaluate(e, env) == expected
    assert substitute(e, env) == expected
    lo, hi = bounds(e)
    assert lo <= expected <= hi
    assert free_symbols(e) == {f"s{i}" for i in range(6)}
    assert pickle.loads(pickle.dumps(e)) is e
    # Building it again gives the same object.
    assert _big_expression()[0] is e
    # And it keeps composing.
    assert evaluate(e * 2 + syms[1], env) == 2 * expected + env["s1"]
    assert evaluate(e // 3, env) == expected // 3


def test_huge_ranges_pickle_to_the_same_symbol():
    n = symbol("n", 0, 2**70)  # past INF: the range is clamped
    assert pickle.loads(pickle.dumps(n)) is n
    assert pickle.loads(pickle.dumps(n + 1)) is n + 1


def test_unbounded_ends_stay_unbounded():
    # With default ranges x*y*z reaches 2**93, past INF; sums and quotients of
    # it must not come back below INF and "prove" facts that are false.
    x, y, z, w = (symbol(c) for c in "xyzw")
    assert bounds(x * y * z)[1] >= INF
    assert bounds(x * y * z - w)[1] >= INF
    assert bounds((x * y * z) // 2)[1] >= INF
    assert bounds(-(x * y * z) + w)[0] <= -INF
    assert not prove_le(x * y * z - w, 2**62)
    assert not prove_le((x * y * z) // 2, 2**61)
    assert not prove_le(mod(x * y * z, x * y * z + w), 2**62 - 1)
