"""The ONNX backend node cases through round trip, type inference, reference execution and simplify.

Each case's outcome per stage must match tests/conformance_expected_failures.txt:
an unexpected failure fails, and so does an unexpected pass (so the list stays
true).  The summary test checks the pass rates the foundation issue requires.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shapeshift.conformance import STAGES, collect_cases, is_counted, read_expected_failures, run_case

EXPECTED_PATH = Path(__file__).parent / "conformance_expected_failures.txt"
EXPECTED = read_expected_failures(EXPECTED_PATH)
CASES = collect_cases()
# Ops whose outputs are random draws: a failure is expected, but a chance match
# with the case's data must not count as an "unexpected pass".
RANDOM_CASES = ("test_bernoulli", "test_multinomial", "test_random")


@pytest.mark.conformance
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    result = run_case(case)
    problems = []
    for stage in STAGES:
        expected_failure = (stage, case.name) in EXPECTED
        if stage in result.failures and not expected_failure:
            problems.append(f"{stage}: unexpected failure: {result.failures[stage]}")
        if stage not in result.failures and expected_failure and not case.name.startswith(RANDOM_CASES):
            problems.append(f"{stage}: unexpected pass (remove it from {EXPECTED_PATH.name})")
    assert not problems, "\n".join(problems)


def test_expected_failures_name_real_cases():
    names = {c.name for c in CASES}
    stale = sorted(f"{stage} {name}" for stage, name in EXPECTED if name not in names or stage not in STAGES)
    assert not stale, f"entries naming no case/stage: {stale}"


def test_counted_pass_rates_meet_the_bar():
    counted = [c.name for c in CASES if is_counted(c.model)]
    assert len(counted) > 1000
    rates = {stage: 1 - sum((stage, n) in EXPECTED for n in counted) / len(counted) for stage in STAGES}
    assert rates["roundtrip"] >= 0.95, rates
    assert rates["types"] >= 0.90, rates
    assert rates["reference"] >= 0.95, rates
    # Simplification must not lose a case that the reference backend passes.
    assert rates["simplify"] >= rates["reference"], rates
