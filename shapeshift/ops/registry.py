"""The op registry: one table entry per op holding every rule about it.

An :class:`OpRule` gathers, in one place, what shapeshift knows of an op:

* ``infer(ctx) -> list[type]``: the type rule (dtype and symbolic shape of each
  output, from the input types and whatever input contents are known).  It may
  also record known contents of small integer outputs with
  ``ctx.set_contents``.  It degrades (unknown dims, unknown rank) rather than
  fail when inputs are only partly known.
* ``evaluate(ctx, *inputs) -> list[array]``: the NumPy evaluator.
* ``params``: the input positions that are op *parameters* (shape, axes,
  pads, ...) rather than data; simplification turns them into node parameters.
* ``single``: the input positions the spec gives one element (a 0-D or one-element 1-D
  tensor: Range's start, TopK's k). Another size is refused, at load where the input's
  shape says so, else when it runs (the native backend's check: codegen/lower/contracts.py),
  as onnxruntime refuses it; the rules themselves then read element 0 without looking.

Rules are keyed by ``(domain, op_type, since_version)``; a model's opset picks
the newest rule whose ``since`` is not above it.  Rules whose behaviour changes
across versions read ``ctx.opset`` instead of registering twice.

The table is filled once, when the op modules are imported, and only read after.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

# The type of a rule's callables; kept loose so op modules stay short.
InferFn = Callable[..., list]
EvalFn = Callable[..., list]


@dataclass(frozen=True)
class OpRule:
    op_type: str
    infer: InferFn
    evaluate: EvalFn
    domain: str = ""
    since: int = 1
    params: tuple[int, ...] = ()
    #: True for rules that delegate to onnx's own reference/shape inference.
    delegated: bool = False
    single: tuple[int, ...] = ()


class OpRegistry:
    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], list[OpRule]] = {}

    def add(self, rule: OpRule) -> OpRule:
        versions = self._rules.setdefault((rule.domain, rule.op_type), [])
        if any(r.since == rule.since for r in versions):
            raise ValueError(f"op {rule.domain}::{rule.op_type} since {rule.since} registered twice")
        versions.append(rule)
        versions.sort(key=lambda r: r.since)
        lookup.cache_clear()  # a rule registered late must not be hidden by a memoized answer
        return rule

    def lookup(self, domain: str, op_type: str, opset: int) -> Optional[OpRule]:
        versions = self._rules.get((_canonical_domain(domain), op_type))
        if not versions:
            return None
        chosen = None
        for rule in versions:
            if rule.since <= opset:
                chosen = rule
        return chosen

    def versions(self, domain: str, op_type: str) -> list[OpRule]:
        return list(self._rules.get((_canonical_domain(domain), op_type), ()))

    def op_types(self, domain: str = "") -> list[str]:
        return sorted(op for (d, op) in self._rules if d == domain)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return (_canonical_domain(key[0]), key[1]) in self._rules


def _canonical_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


REGISTRY = OpRegistry()


def define(op_type: str, *, infer: InferFn, evaluate: EvalFn, params: tuple[int, ...] = (),
           since: int = 1, domain: str = "", single: tuple[int, ...] = ()) -> OpRule:
    """Register an op's rules. Call at module level in the op family's file."""
    if single:
        infer, evaluate = _one_element_type(infer, single), _one_element_eval(evaluate, single)
    return REGISTRY.add(OpRule(op_type, infer, evaluate, domain, since, params, single=single))


def one_element_inputs(domain: str, op_type: str) -> tuple[int, ...]:
    """The input positions of an op given one element (``define``'s ``single``), at any opset."""
    return tuple(sorted({i for rule in REGISTRY.versions(domain, op_type) for i in rule.single}))


def one_element_message(index: int, name: Optional[str]) -> str:
    named = f" ({name!r})" if name else ""
    return f"input {index}{named} must hold one element"


def _input_name(ctx, index: int) -> Optional[str]:
    inputs = ctx.node.inputs
    return inputs[index].name if index < len(inputs) and inputs[index] is not None else None


def _one_element_type(infer: InferFn, single: tuple[int, ...]) -> InferFn:
    def checked(ctx) -> list:
        for index in single:
            shape = ctx.input_shape(index)
            count = math.prod(shape) if shape is not None and all(isinstance(d, int) for d in shape) else 1
            if count != 1:
                ctx.fail(f"{one_element_message(index, _input_name(ctx, index))}, got {count}")
        return infer(ctx)

    return checked


def _one_element_eval(evaluate: EvalFn, single: tuple[int, ...]) -> EvalFn:
    def checked(ctx, *inputs) -> list:
        for index in single:
            count = np.size(inputs[index]) if index < len(inputs) and inputs[index] is not None else 1
            if count != 1:
                ctx.fail(f"{one_element_message(index, _input_name(ctx, index))}, got {count}")
        return evaluate(ctx, *inputs)

    return checked


@functools.lru_cache(maxsize=4096)
def lookup(domain: str, op_type: str, opset: int) -> Optional[OpRule]:
    """The rule for an op at an opset, falling back to onnx's reference ops.

    Memoized: every pass asks this for every node it visits, and the answer only
    depends on the table (whose changes clear the memo) and the onnx package.
    """
    rule = REGISTRY.lookup(domain, op_type, opset)
    if rule is None:
        from .delegated import delegated_rule

        rule = delegated_rule(domain, op_type, opset)
    return rule
