"""Pass counts of the ONNX backend node cases, per stage and per op.

    python bench/conformance.py [--write-expected tests/conformance_expected_failures.txt] [-j N]
    python bench/conformance.py --native [--only-native] [--native-cache DIR] [-j N]

Prints a summary and writes bench/results/conformance.md (conformance_native.md
with ``--only-native``).  With
``--write-expected`` it also rewrites the list of expected failures that
tests/test_conformance.py checks (review the diff before committing it).

``--native`` adds the native-backend stages (every case compiles its own C library;
the build cache, by default build/native-conformance-cache, makes reruns fast) and a
table of why cases fall back; ``--only-native`` runs those stages alone.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shapeshift.conformance import (  # noqa: E402
    EXTRA_STAGES,
    FALLBACK_PREFIX,
    NATIVE_STAGES,
    STAGES,
    CaseResult,
    collect_cases,
    is_counted,
    run_case,
    summarize,
)

from shapeshift.ops.registry import REGISTRY  # noqa: E402

ALL_STAGES = STAGES + EXTRA_STAGES
DEFAULT_NATIVE_CACHE = ROOT / "build" / "native-conformance-cache"
NATIVE_LABELS = {"native": "native: fully native and correct", "native_fallback": "native: correct (fallback allowed)"}


def _run_index(index: int) -> CaseResult:
    case = _CASES[index]
    stages = _STAGES
    if not _NATIVE_OTHERS and not is_counted(case.model):
        stages = tuple(s for s in stages if s not in NATIVE_STAGES)
    return run_case(case, stages)


# Set before the pool forks; the workers read their copy (a Pool cannot pickle cases).
_CASES: list = []
_STAGES: tuple = ()
_NATIVE_OTHERS = False  # run the native stages on cases that are not counted too


def run_all(jobs: int, stages: tuple = ALL_STAGES, pattern: str = "", native_others: bool = False,
            progress: Optional[Path] = None) -> list[CaseResult]:
    """Every case (matching ``pattern``) through ``stages``; with ``progress``, each result's
    failures are appended to that file as it arrives (a long native run can be read early)."""
    global _CASES, _STAGES, _NATIVE_OTHERS
    _CASES = [c for c in collect_cases() if re.search(pattern, c.name)]
    _STAGES, _NATIVE_OTHERS = stages, native_others
    log = progress.open("w", encoding="utf-8") if progress else None
    results: list[CaseResult] = []
    try:
        if jobs <= 1:
            outcomes = map(_run_index, range(len(_CASES)))
            for r in outcomes:
                results.append(_log(log, r))
        else:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                for r in pool.imap(_run_index, range(len(_CASES)), chunksize=4):
                    results.append(_log(log, r))
    finally:
        if log:
            log.close()
    return results


def _log(log, r: CaseResult) -> CaseResult:
    if log is not None:
        kind = "counted" if r.counted else "other"
        log.write(f"ran {r.name} {kind}\n")
        log.writelines(f"{stage} {r.name} {kind}  # {msg}\n" for stage, msg in r.failures.items())
        log.flush()
    return r


def _pct(passed: int, total: int) -> str:
    return f"{passed}/{total} ({100.0 * passed / max(total, 1):.1f}%)"


def report(results: list[CaseResult], seconds: float, stages: tuple = ALL_STAGES, native_others: bool = True) -> str:
    import onnx

    counted = summarize(results, True, stages)
    others = summarize(results, False, stages)
    everything = summarize(results, None, stages)
    lines = [
        "# ONNX node conformance",
        "",
        f"onnx {onnx.__version__}; {len(results)} cases; {sum(r.counted for r in results)} counted "
        f"(opset <= 23, no bfloat16/float8/float4/int4/uint4). Run time {seconds:.0f} s.",
        "",
        "| stage | counted cases | other cases | all |",
        "|---|---|---|---|",
    ]
    for stage in stages:
        label = NATIVE_LABELS.get(stage, stage)
        if stage in NATIVE_STAGES and not native_others:
            lines.append(f"| {label} | {_pct(*counted[stage])} | not run | - |")
            continue
        lines.append(f"| {label} | {_pct(*counted[stage])} | {_pct(*others[stage])} | {_pct(*everything[stage])} |")
    if any(s in stages for s in NATIVE_STAGES):
        lines += native_report(results)
    base = [s for s in STAGES if s in stages]
    if not base:
        return "\n".join(lines) + "\n"
    lines += ["", "`types` infers with parameter inputs (shape, axes, pads, sizes, ...) known as constants, as exporters "
              "write them; `types_inputs_only` knows every input by its type only (reported, not required).",
              "", "## Counted cases per op (failures only)", "", "| op | cases | " + " | ".join(base) + " |",
              "|---|---|" + "---|" * len(base)]
    per_op: dict[str, list[CaseResult]] = collections.defaultdict(list)
    for r in results:
        if r.counted:
            per_op[r.op_type].append(r)
    for op, rs in sorted(per_op.items()):
        if all(r.passed(s) for r in rs for s in base):
            continue
        cells = [f"{sum(r.passed(s) for r in rs)}/{len(rs)}" for s in base]
        lines.append(f"| {op} | {len(rs)} | " + " | ".join(cells) + " |")
    full_ops = sum(1 for rs in per_op.values() if all(r.passed(s) for r in rs for s in base))
    lines += ["", f"{full_ops} of {len(per_op)} ops pass every counted case in every stage."]
    return "\n".join(lines) + "\n"


def fallback_reasons(result: CaseResult) -> list[str]:
    """The distinct ``Op (reason)`` entries of a case that was correct but fell back."""
    message = result.failures.get("native", "")
    if not message.startswith(FALLBACK_PREFIX):
        return []
    return sorted(set(message[len(FALLBACK_PREFIX):].split("; ")))


def native_report(results: list[CaseResult], top: int = 40) -> list[str]:
    """Counted cases per fallback reason, per op, and the failures that are not fallbacks."""
    counted = [r for r in results if r.counted]
    reasons = collections.Counter(x for r in counted for x in fallback_reasons(r))
    wrong = collections.Counter(r.failures["native_fallback"].split(":")[0] for r in counted
                                if "native_fallback" in r.failures)
    lines = ["", "`native` needs every node lowered to C (no fallback step); `native_fallback` lets the "
             "reference evaluator run the nodes without a rule. Both compare outputs like `reference`.",
             "", "## Native: counted cases per fallback reason", "", "| fallback (op, reason) | cases |", "|---|---|"]
    lines += [f"| {reason} | {n} |" for reason, n in reasons.most_common(top)]
    if len(reasons) > top:
        lines.append(f"| ({len(reasons) - top} more reasons) | {sum(n for _, n in reasons.most_common()[top:])} |")
    lines += ["", "## Native: counted cases with wrong outputs or errors, by exception", "",
              "| exception | cases |", "|---|---|"]
    lines += [f"| {kind} | {n} |" for kind, n in wrong.most_common()]
    per_op: dict[str, list[CaseResult]] = collections.defaultdict(list)
    for r in counted:
        per_op[r.op_type].append(r)
    lines += ["", "## Native: counted cases per op (ops not fully native only)", "",
              "| op | cases | native | native_fallback |", "|---|---|---|---|"]
    for op, rs in sorted(per_op.items()):
        if all(r.passed("native") for r in rs):
            continue
        lines.append(f"| {op} | {len(rs)} | {sum(r.passed('native') for r in rs)} | "
                     f"{sum(r.passed('native_fallback') for r in rs)} |")
    return lines


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
    parser.add_argument("--native", action="store_true", help="add the native-backend stages")
    parser.add_argument("--only-native", action="store_true", help="run the native-backend stages alone")
    parser.add_argument("--native-cache", type=Path, default=DEFAULT_NATIVE_CACHE,
                        help="build cache of the native stages (default: %(default)s)")
    parser.add_argument("--native-others", action="store_true",
                        help="run the native stages on the cases that are not counted too (slow)")
    parser.add_argument("-k", "--cases", default="", help="only the cases whose name matches this regex")
    parser.add_argument("--failures", type=Path,
                        help="also write every case run and every failure, one line each, to this file as they come")
    args = parser.parse_args()
    if (args.only_native or args.cases) and args.write_expected:
        parser.error("--write-expected needs the default stages on every case; drop --only-native and -k")
    stages = NATIVE_STAGES if args.only_native else ALL_STAGES + (NATIVE_STAGES if args.native else ())
    if args.native or args.only_native:
        # A dedicated cache: a rerun only compiles what changed, and other caches stay clean.
        os.environ["SHAPESHIFT_CACHE_DIR"] = str(args.native_cache)
    start = time.perf_counter()
    results = run_all(args.jobs, stages, args.cases, args.native_others, args.failures)
    text = report(results, time.perf_counter() - start, stages, args.native_others)
    # --only-native leaves the full report alone.
    out = ROOT / "bench" / "results" / ("conformance_native.md" if args.only_native else "conformance.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    if args.write_expected:
        write_expected(results, args.write_expected)
        print(f"wrote {args.write_expected}")


if __name__ == "__main__":
    main()
