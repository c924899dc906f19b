"""The schedule space: valid ``GemmSchedule`` values for a target, sampled at random and mutated.

Every candidate is shape-generic (it runs any M), which is what lets one kernel serve a
range of M. The space is drawn from the target description: the vector width is a field
(ymm, and zmm where the target has AVX-512), register tiles are the (mr, nr) whose
accumulators, B vectors and A broadcast fit the target's register file at that width,
and blocking sizes come from lists around the defaults (codegen/defaults.py).
"""

from __future__ import annotations

import dataclasses
import json
import random

from ..codegen.kernels.gemm import MAX_SMALL_M, GemmSchedule, max_rows
from ..target import Target

# Columns of a tile, in vectors of the width (nr = lanes x vectors).
NR_VECTORS = (1, 2, 3, 4)
KC_CHOICES = (64, 128, 192, 256, 384, 512)
MC_PANELS = (2, 4, 6, 8, 12, 16, 24)  # mc = mr * panels
NC_PANELS = (4, 8, 16, 32, 64, 192)  # nc = nr * panels
# one_block_nc = nr * panels (0: nc itself), for the calls whose rows are one block of A.
ONE_BLOCK_NC_PANELS = (0, 8, 16, 32, 48, 64)
UNROLL_CHOICES = (1, 2, 4, 8)
SMALL_M_CHOICES = (0, 1, 2, 4, 6, 8, 10, 12, 14, 16, 24, 32)
SMALL_NC_PANELS = (4, 8, 16, 32)
PACK_ROWS_CHOICES = (4, 8, 16)
PREFETCH_ROWS_CHOICES = (0, 16, 32, 64)  # rows of B the B-streaming path prefetches ahead
PREFETCH_MIN_M_CHOICES = (1, 4, 6, 8)
PAR_MIN_FLOPS_CHOICES = (1 << 20, 1 << 22, 1 << 24)
SMALL_PANELS_CHOICES = (1, 2, 4)  # packed panels of B the B-streaming path reads at once
FIELDS = ("mr", "nr", "kc", "mc", "nc", "one_block_nc", "unroll_k", "small_m", "small_nc", "pack_rows", "prefetch_rows",
          "prefetch_min_m", "parallel_min_flops", "small_panels", "lanes", "registers", "prefetch_c", "a_in_l1")
# Fields a mutation may change ("tile" is mr, nr and the width together).
MUTABLE = ("tile", "kc", "mc", "nc", "one_block_nc", "unroll_k", "small_m", "small_nc", "pack_rows", "prefetch_rows",
           "prefetch_min_m", "parallel_min_flops", "small_panels", "prefetch_c", "a_in_l1")
# Schedules recorded before a field existed ran as this value of it (from_json): before
# the width was a field, every tile ran in ymm registers on AVX2's 16 but the full tile of
# an nr multiple of 16 on AVX-512 builds, which lanes = 8 does not reproduce exactly (the
# tile then runs in ymm); such records came from before target descriptions.
BEFORE_FIELD = {"one_block_nc": 0, "small_panels": 1, "lanes": 8, "registers": 16, "prefetch_c": 0, "a_in_l1": 0}


def tile_choices(target: Target) -> list[tuple[int, int, int]]:
    """(mr, nr, lanes) of every register tile the target's register file holds, in each width."""
    out = []
    for lanes in (8, 16) if target.avx512 else (8,):
        for vectors in NR_VECTORS:
            nr = lanes * vectors
            out += [(mr, nr, lanes) for mr in range(1, max_rows(nr, lanes, target.vector_registers) + 1)
                    if mr >= 2 or vectors >= 2]
    return out


def random_schedule(rng: random.Random, target: Target) -> GemmSchedule:
    mr, nr, lanes = rng.choice(tile_choices(target))
    return _make(rng, mr=mr, nr=nr, lanes=lanes, registers=target.vector_registers)


def _make(rng: random.Random, **fixed) -> GemmSchedule:
    """A schedule with the given fields, the others drawn (derived sizes kept consistent)."""
    mr, nr = fixed["mr"], fixed["nr"]
    values = dict(
        kc=rng.choice(KC_CHOICES), mc=mr * rng.choice(MC_PANELS), nc=nr * rng.choice(NC_PANELS),
        one_block_nc=nr * rng.choice(ONE_BLOCK_NC_PANELS),
        unroll_k=rng.choice(UNROLL_CHOICES), small_m=rng.choice(SMALL_M_CHOICES),
        small_nc=nr * rng.choice(SMALL_NC_PANELS), pack_rows=rng.choice(PACK_ROWS_CHOICES),
        prefetch_rows=rng.choice(PREFETCH_ROWS_CHOICES), prefetch_min_m=rng.choice(PREFETCH_MIN_M_CHOICES),
        parallel_min_flops=rng.choice(PAR_MIN_FLOPS_CHOICES), small_panels=rng.choice(SMALL_PANELS_CHOICES),
        prefetch_c=rng.choice((0, 1)), a_in_l1=rng.choice((0, 1)))
    values.update(fixed)
    values["small_m"] = min(values["small_m"], MAX_SMALL_M)
    return GemmSchedule(**values)


def mutate(schedule: GemmSchedule, rng: random.Random, target: Target) -> GemmSchedule:
    """Change one or two fields; a tile change rescales mc, nc and small_nc to stay valid."""
    fields = dataclasses.asdict(schedule)
    for _ in range(rng.choice((1, 2))):
        name = rng.choice(MUTABLE)
        if name == "tile":
            mr, nr, lanes = rng.choice(tile_choices(target))
            fields.update(mr=mr, nr=nr, lanes=lanes, registers=target.vector_registers,
                          mc=mr * max(1, fields["mc"] // fields["mr"]),
                          nc=nr * max(1, fields["nc"] // fields["nr"]),
                          one_block_nc=nr * (fields["one_block_nc"] // fields["nr"]),
                          small_nc=nr * max(1, fields["small_nc"] // fields["nr"]))
        elif name == "kc":
            fields["kc"] = rng.choice(KC_CHOICES)
        elif name == "mc":
            fields["mc"] = fields["mr"] * rng.choice(MC_PANELS)
        elif name == "nc":
            fields["nc"] = fields["nr"] * rng.choice(NC_PANELS)
        elif name == "one_block_nc":
            fields["one_block_nc"] = fields["nr"] * rng.choice(ONE_BLOCK_NC_PANELS)
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
        elif name in ("prefetch_c", "a_in_l1"):
            fields[name] = 1 - fields[name]
        else:
            fields["parallel_min_flops"] = rng.choice(PAR_MIN_FLOPS_CHOICES)
    return GemmSchedule(**fields)


def to_json(schedule: GemmSchedule) -> str:
    """Canonical JSON (sorted keys): the candidate's identity in the database. The fields
    are plain ints, so the dataclass's own dict serves (``dataclasses.asdict`` copies
    recursively, and this runs twice for every candidate a search sends)."""
    return json.dumps(vars(schedule), sort_keys=True)


def from_json(text: str) -> GemmSchedule:
    """A schedule from ``to_json``'s text; a field missing from an older record takes the
    value that reproduces how that record's kernel ran (``BEFORE_FIELD``), not its default."""
    return GemmSchedule(**{**BEFORE_FIELD, **json.loads(text)})
