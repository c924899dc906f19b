"""The schedule space: valid ``GemmSchedule`` values, sampled at random and mutated.

Every candidate is shape-generic (it runs any M), which is what lets one kernel serve a
range of M. Register tiles come in the (mr, nr) pairs whose accumulators fit the 16 ymm
registers; blocking sizes are drawn from lists around the hand-tuned defaults.
"""

from __future__ import annotations

import dataclasses
import json
import random

from ..codegen.kernels.gemm import MAX_SMALL_M, YMM_REGISTERS, GemmSchedule

NR_CHOICES = (8, 16, 24, 32)
KC_CHOICES = (64, 128, 192, 256, 384, 512)
MC_PANELS = (2, 4, 6, 8, 12, 16, 24)  # mc = mr * panels
NC_PANELS = (4, 8, 16, 32, 64, 192)  # nc = nr * panels
UNROLL_CHOICES = (1, 2, 4, 8)
SMALL_M_CHOICES = (0, 1, 2, 4, 6, 8, 10, 12, 14, 16, 24, 32)
SMALL_NC_PANELS = (4, 8, 16, 32)
PACK_ROWS_CHOICES = (4, 8, 16)
PREFETCH_ROWS_CHOICES = (0, 16, 32, 64)  # rows of B the B-streaming path prefetches ahead
PREFETCH_MIN_M_CHOICES = (1, 4, 6, 8)
PAR_MIN_FLOPS_CHOICES = (1 << 20, 1 << 22, 1 << 24)
SMALL_PANELS_CHOICES = (1, 2, 4)  # packed panels of B the B-streaming path reads at once
FIELDS = ("mr", "nr", "kc", "mc", "nc", "unroll_k", "small_m", "small_nc", "pack_rows", "prefetch_rows",
          "prefetch_min_m", "parallel_min_flops", "small_panels")
# Fields a mutation may change ("tile" is mr and nr together).
MUTABLE = ("tile", "kc", "mc", "nc", "unroll_k", "small_m", "small_nc", "pack_rows", "prefetch_rows",
           "prefetch_min_m", "parallel_min_flops", "small_panels")
# Schedules recorded before a field existed ran as this value of it (from_json).
BEFORE_FIELD = {"small_panels": 1}


def max_mr(nr: int) -> int:
    """The tallest tile whose accumulators, B loads and A broadcast fit the registers."""
    vectors = nr // 8
    return (YMM_REGISTERS - vectors - 1) // vectors


def tile_pairs() -> list[tuple[int, int]]:
    return [(mr, nr) for nr in NR_CHOICES for mr in range(1, max_mr(nr) + 1) if mr >= 2 or nr >= 16]


def random_schedule(rng: random.Random) -> GemmSchedule:
    mr, nr = rng.choice(tile_pairs())
    return _make(rng, mr=mr, nr=nr)


def _make(rng: random.Random, **fixed) -> GemmSchedule:
    """A schedule with the given fields, the others drawn (derived sizes kept consistent)."""
    mr, nr = fixed["mr"], fixed["nr"]
    values = dict(
        kc=rng.choice(KC_CHOICES), mc=mr * rng.choice(MC_PANELS), nc=nr * rng.choice(NC_PANELS),
        unroll_k=rng.choice(UNROLL_CHOICES), small_m=rng.choice(SMALL_M_CHOICES),
        small_nc=nr * rng.choice(SMALL_NC_PANELS), pack_rows=rng.choice(PACK_ROWS_CHOICES),
        prefetch_rows=rng.choice(PREFETCH_ROWS_CHOICES), prefetch_min_m=rng.choice(PREFETCH_MIN_M_CHOICES),
        parallel_min_flops=rng.choice(PAR_MIN_FLOPS_CHOICES), small_panels=rng.choice(SMALL_PANELS_CHOICES))
    values.update(fixed)
    values["small_m"] = min(values["small_m"], MAX_SMALL_M)
    return GemmSchedule(**values)


def mutate(schedule: GemmSchedule, rng: random.Random) -> GemmSchedule:
    """Change one or two fields; a tile change rescales mc, nc and small_nc to stay valid."""
    fields = dataclasses.asdict(schedule)
    for _ in range(rng.choice((1, 2))):
        name = rng.choice(MUTABLE)
        if name == "tile":
            mr, nr = rng.choice(tile_pairs())
            fields.update(mr=mr, nr=nr, mc=mr * max(1, fields["mc"] // fields["mr"]),
                          nc=nr * max(1, fields["nc"] // fields["nr"]),
                          small_nc=nr * max(1, fields["small_nc"] // fields["nr"]))
        elif name == "kc":
            fields["kc"] = rng.choice(KC_CHOICES)
        elif name == "mc":
            fields["mc"] = fields["mr"] * rng.choice(MC_PANELS)
        elif name == "nc":
            fields["nc"] = fields["nr"] * rng.choice(NC_PANELS)
        elif name == "unroll_k":
            fields["unroll_k"] = rng.choice(UNROLL_CHOICES)
        elif name == "small_m":
            fields["small_m"] = rng.choice(SMALL_M_CHOICES)
        elif name == "small_nc":
            fields["small_nc"] = fields["nr"] * rng.choice(SMALL_NC_PANELS)
        elif name == "pack_rows":
            fields["pack_rows"] = rng.choice(PACK_ROWS_CHOICES)
        elif name == "prefetch_rows":
            fields["prefetch_rows"] = rng.choice(PREFETCH_ROWS_CHOICES)
        elif name == "prefetch_min_m":
            fields["prefetch_min_m"] = rng.choice(PREFETCH_MIN_M_CHOICES)
        elif name == "small_panels":
            fields["small_panels"] = rng.choice(SMALL_PANELS_CHOICES)
        else:
            fields["parallel_min_flops"] = rng.choice(PAR_MIN_FLOPS_CHOICES)
    return GemmSchedule(**fields)


def to_json(schedule: GemmSchedule) -> str:
    """Canonical JSON (sorted keys): the candidate's identity in the database."""
    return json.dumps(dataclasses.asdict(schedule), sort_keys=True)


def from_json(text: str) -> GemmSchedule:
    """A schedule from ``to_json``'s text; a field missing from an older record takes the
    value that reproduces how that record's kernel ran (``BEFORE_FIELD``), not its default."""
    return GemmSchedule(**{**BEFORE_FIELD, **json.loads(text)})
