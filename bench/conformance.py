"""Pass counts of the ONNX backend node cases, per stage and per op.

    python bench/conformance.py [--write-expected tests/conformance_expected_failures.txt] [-j N]

Prints a summary and writes bench/results/conformance.md.  With
``--write-expected`` it also rewrites the list of expected failures that
tests/test_conformance.py checks (review the diff before committing it).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shapeshift.conformance import (  # noqa: E402
    EXTRA_STAGES,
    STAGES,
    CaseResult,
    collect_cases,
    run_case,
    summarize,
)

from shapeshift.ops.registry import REGISTRY  # noqa: E402

ALL_STAGES = STAGES + EXTRA_STAGES


def _run_index(index: int) -> CaseResult:
    return run_case(_CASES[index], ALL_STAGES)


_CASES: list = []


def run_all(jobs: int) -> list[CaseResult]:
    global _CASES
    _CASES = collect_cases()
    if jobs <= 1:
        return [run_case(c, ALL_STAGES) for c in _CASES]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(_run_index, range(len(_CASES)), chunksize=8)


def _pct(passed: int, total: int) -> str:
    return f"{passed}/{total} ({100.0 * passed / max(total, 1):.1f}%)"


def report(results: list[CaseResult], seconds: float) -> str:
    import onnx

    counted = summarize(results, True, ALL_STAGES)
    others = summarize(results, False, ALL_STAGES)
    everything = summarize(results, None, ALL_STAGES)
    lines = [
        "# ONNX node conformance",
        "",
        f"onnx {onnx.__version__}; {len(results)} cases; {sum(r.counted for r in results)} counted "
        f"(opset <= 23, no bfloat16/float8/float4/int4/uint4). Run time {seconds:.0f} s.",
        "",
        "| stage | counted cases | other cases | all |",
        "|---|---|---|---|",
    ]
    for stage in ALL_STAGES:
        lines.append(f"| {stage} | {_pct(*counted[stage])} | {_pct(*others[stage])} | {_pct(*everything[stage])} |")
    lines += ["", "`types` infers with parameter inputs (shape, axes, pads, sizes, ...) known as constants, as exporters "
              "write them; `types_inputs_only` knows every input by its type only (reported, not required).",
              "", "## Counted cases per op (failures only)", "", "| op | cases | " + " | ".join(STAGES) + " |",
              "|---|---|" + "---|" * len(STAGES)]
    per_op: dict[str, list[CaseResult]] = collections.defaultdict(list)
    for r in results:
        if r.counted:
            per_op[r.op_type].append(r)
    for op, rs in sorted(per_op.items()):
        if all(not r.failures for r in rs):
            continue
        cells = [f"{sum(r.passed(s) for r in rs)}/{len(rs)}" for s in STAGES]
        lines.append(f"| {op} | {len(rs)} | " + " | ".join(cells) + " |")
    full_ops = sum(1 for rs in per_op.values() if all(not r.failures for r in rs))
    lines += ["", f"{full_ops} of {len(per_op)} ops pass every counted case in every stage."]
    return "\n".join(lines) + "\n"


#: Ops whose output size depends on input values: no static inference can be exact.
DATA_DEPENDENT = {"NonZero", "NonMaxSuppression", "Unique", "StringSplit", "StringNormalizer", "Compress",
                  "RegexFullMatch", "TfIdfVectorizer", "Loop"}


def classify(result: CaseResult, stage: str) -> str:
    """A short human reason for a failure, put before the raw message."""
    message = result.failures[stage]
    name = result.name
    if name.startswith(("test_bernoulli", "test_multinomial", "test_random")):
        return "random draws cannot match the case's data"
    if "unsupported ops" in message:
        return "op unknown to shapeshift and to onnx.reference"
    if not result.counted:
        return "not counted (opset > 23 or exotic dtype)"
    if stage == "types" and result.op_type in DATA_DEPENDENT:
        return "output size depends on input values"
    if stage == "types" and "_expanded" in name:
        return "an expanded function computes a size our rules do not track"
    if stage == "types" and REGISTRY.lookup("", result.op_type, result.opset) is None:
        return "delegated to onnx shape inference, which gives no exact shape here"
    if stage == "types":
        return "a size input is read at run time only"
    if "fp16" in name or "bf16" in name:
        return "half-precision rounding differs from the reference data"
    return "numerics differ from the case's data"


def write_expected(results: list[CaseResult], path: Path) -> None:
    lines = ["# Expected failures of tests/test_conformance.py: `stage case  # reason`.",
             "# Regenerate with `python bench/conformance.py --write-expected PATH` and review the diff."]
    for r in sorted(results, key=lambda r: r.name):
        for stage in STAGES:
            if stage in r.failures:
                detail = " ".join(r.failures[stage].split())[:160]
                lines.append(f"{stage} {r.name}  # {classify(r, stage)} | {detail}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=max(1, multiprocessing.cpu_count()))
    parser.add_argument("--write-expected", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    results = run_all(args.jobs)
    text = report(results, time.perf_counter() - start)
    out = ROOT / "bench" / "results" / "conformance.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    if args.write_expected:
        write_expected(results, args.write_expected)
        print(f"wrote {args.write_expected}")


if __name__ == "__main__":
    main()
