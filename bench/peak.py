"""The machine's FMA peak per vector width, measured now (not from the cache).

    python bench/peak.py

Runs shapeshift.target's calibration afresh (C loops of independent and of dependent
FMAs, the fastest of many ~1 ms samples), replaces the cached result the other
benchmarks read, prints the target description and writes bench/results/peak.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shapeshift.target import host_target, measure_fma  # noqa: E402
from shapeshift.target.report import describe  # noqa: E402


def main() -> None:
    target = host_target()
    facts = measure_fma(target, refresh=True)
    lines = describe(target, facts)
    print("\n".join(lines))
    rows = ["| width | GFLOPS a core (float32) | vector FMAs / ns | FMA latency (ns) | FMAs in flight needed |",
            "|---|---|---|---|---|"]
    rows += [f"| {w.bits}-bit | {w.peak_gflops:.1f} | {w.fma_per_ns:.2f} | {w.latency_ns:.2f} | {w.chains} |"
             for w in facts.widths]
    text = ("# FMA peak of this machine\n\n`python bench/peak.py`: independent FMA chains (as many as the "
            "register file holds less four) for throughput, one chain for latency, the fastest of 60 "
            "samples of about 1 ms each.\n\n```\n" + "\n".join(lines) + "\n```\n\n" + "\n".join(rows) + "\n")
    out = ROOT / "bench" / "results" / "peak.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
