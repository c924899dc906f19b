"""The ``conv-nchwc`` and ``conv-nchwc-dw`` kernel families: ``NchwcSchedule``
(kernels/conv_nchwc_tuned.py) as a tuning task's schedule type, for the blocked conv tasks
of tune/conv_workload.py (``NchwcConvWorkload``: the ``NCHWcConv`` nodes a model's conv
trunk runs as), dense and depthwise.

Two families because the two entry points read different fields: the dense kernel its tile
``rx``, the pointwise blocking (``l1_share``, ``l2_share``) and ``par_min``; the depthwise
kernel ``dw_pixels`` and ``par_min``. A family draws, mutates and names (its JSON) only its
own fields, the others left at the default: no trial is spent on a field the kernel never
reads, and schedules that run the same code are one candidate. Its space: the dense tile's
pixels from 4 to two past the target's default (past the register file the accumulators
spill, which the search measures rather than assumes; half the draws keep the default
tile and change only the blocking), the depthwise tile's pixels, the shares of L1 and L2
and the threading threshold, each from a short list around its default. The cost model
sees the schedule's fields, how the call's row divides into its tiles (the pixels the last
overlapping tile computes again) and the call's sizes, and which of the kernel's paths the
call takes (pointwise, narrow plane, row tiles, depthwise), mirroring ``ss_conv_nchwc_L``'s
order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

from ..codegen.defaults import default_nchwc_schedule
from ..codegen.kernels.conv_nchwc_tuned import MAX_RX, NchwcSchedule, unit_source
from ..codegen.kernels.nchwc import block_width
from ..target import Target, host_target
from .task import register

DW_PIXELS = (4, 6, 8, 10, 12)  # within MAX_DW_PIXELS
SHARES = (2, 4, 8)
PAR_MINS = (1 << 15, 1 << 17, 1 << 19)
DENSE_FIELDS = ("rx", "l1_share", "l2_share", "par_min")
DEPTHWISE_FIELDS = ("dw_pixels", "par_min")
PATHS = ("pointwise", "narrow", "rows", "depthwise")

# The call of each family's entry point: a measurement library holds that entry alone.
_CALLS = {
    "dense": """    ss_conv_nchwc_@L@(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, 1, @L@,
                      NULL, 0, 0.0f, 0.0f, 0, 0.0f, 0.0f);""",
    "depthwise": """    (void)M;
    ss_dwconv_nchwc_@L@(x, w, bias, y, N, C, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, NULL, 0, 0.0f, 0.0f,
                        0, 0.0f, 0.0f);""",
}

_BENCH = """
/* The blocked conv of one instance (kernels/conv_nchwc.py) through the library's one entry
   point, dense or depthwise (`depthwise` says which the caller means: the other is not
   built); no epilogue beyond the bias. */
static void tune_cnc_call(int64_t depthwise, const float* x, const float* w, const float* bias, float* y,
                          int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                          int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                          int64_t dh, int64_t dw)
{
    (void)depthwise;
@CALL@
}

/* 1 where the library's entry point is the depthwise one: the worker checks it against the
   workload before calling (a dense library given a depthwise call would compute garbage). */
int tune_cnc_depthwise_entry(void) { return @DEPTHWISE@; }

/* Seconds per call of `calls` back-to-back calls. */
double tune_cnc_bench(int64_t calls, int64_t depthwise, const float* x, const float* w, const float* bias, float* y,
                      int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                      int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        tune_cnc_call(depthwise, x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
    return (omp_get_wtime() - start) / (double)calls;
}

/* The same, each call timed alone after a write to every cache line of `flush`. */
double tune_cnc_bench_cold(int64_t calls, int64_t depthwise, const float* x, const float* w, const float* bias,
                           float* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                           int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                           int64_t dw, float* flush, int64_t flush_floats)
{
    double total = 0.0;
    for (int64_t i = 0; i < calls; ++i) {
        for (int64_t j = 0; j < flush_floats; j += 16) flush[j] += 1.0f;
        double start = omp_get_wtime();
        tune_cnc_call(depthwise, x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
        total += omp_get_wtime() - start;
    }
    return total / (double)calls;
}
"""


def path(schedule: NchwcSchedule, task, inst) -> str:
    """The path ``ss_conv_nchwc_L`` (or the depthwise kernel) takes for ``inst``."""
    from .conv_workload import output

    if task.depthwise:
        return "depthwise"
    kh, kw, sh, sw, _, _ = task.conv_class
    _, _, _, _, _, ph, pw, _ = inst
    oh, ow = output(task.conv_class, inst)
    if kh == kw == 1 and ph == pw == 0 and oh * ow >= schedule.rx:
        return "pointwise"
    if ow < 2 * schedule.rx and oh * ow >= schedule.rx:
        return "narrow"
    return "rows"


def _tail(pixels: int, tile: int) -> float:
    """Pixels a row of ``pixels`` computes in tiles of ``tile`` over the useful ones (the
    last tile overlapping the one before computes some again)."""
    return math.ceil(pixels / tile) * tile / pixels if pixels >= tile else tile / pixels


class NchwcConvFamily:
    def __init__(self, depthwise: bool):
        self.depthwise = depthwise
        self.name = "conv-nchwc-dw" if depthwise else "conv-nchwc"
        self.fields = DEPTHWISE_FIELDS if depthwise else DENSE_FIELDS

    def default(self, target: Target) -> NchwcSchedule:
        return default_nchwc_schedule(target)

    def _choices(self, name: str, target: Target) -> list[int]:
        if name == "rx":
            return list(range(4, min(MAX_RX, default_nchwc_schedule(target).rx + 2) + 1))
        return {"dw_pixels": DW_PIXELS, "l1_share": SHARES, "l2_share": SHARES, "par_min": PAR_MINS}[name]

    def random(self, rng: random.Random, target: Target) -> NchwcSchedule:
        keep_tile = rng.random() < 0.5
        return dataclasses.replace(default_nchwc_schedule(target), **{
            f: rng.choice(self._choices(f, target)) for f in self.fields
            if not (keep_tile and f in ("rx", "dw_pixels"))})

    def mutate(self, schedule: NchwcSchedule, rng: random.Random, target: Target) -> NchwcSchedule:
        name = rng.choice(self.fields)
        return dataclasses.replace(schedule, **{name: rng.choice(self._choices(name, target))})

    def to_json(self, schedule: NchwcSchedule) -> str:
        # Its own fields only (and which entry: the two families' candidates never share a
        # row of the database's candidates, whose schedules are unique).
        return json.dumps({"entry": self.entry,
                           **{f: getattr(schedule, f) for f in self.fields}}, sort_keys=True)

    def from_json(self, text: str) -> NchwcSchedule:
        data = json.loads(text)
        if data.pop("entry", None) != self.entry or set(data) != set(self.fields):
            raise ValueError(f"not a {self.name} schedule: {text}")
        return dataclasses.replace(default_nchwc_schedule(), **data)

    @property
    def entry(self) -> str:
        """The entry point the family's schedules are measured through (conv_nchwc.ENTRIES)."""
        return "depthwise" if self.depthwise else "dense"

    def source(self, schedule: NchwcSchedule, prefix: str = "ss_") -> str:
        # Its own entry only, as a dispatcher builds it (tune/dispatch.py): the other took
        # a dense candidate's gcc time from 6.7 to 8.7 s and a depthwise one's from 1.5 to
        # 8.7 (AMD Zen 4; MobileNetV3-small's 5x5/1 depthwise task tuned in 12 s, not 29).
        return unit_source(schedule, prefix=prefix, entries=(self.entry,))

    def bench_source(self) -> str:
        return _BENCH.replace("@CALL@", _CALLS[self.entry]).replace("@DEPTHWISE@", str(int(self.depthwise))).replace(
            "@L@", str(block_width(host_target())))

    def layout(self, schedule: NchwcSchedule) -> int:
        return 0  # pack_dense / pack_depthwise: one layout for every schedule

    def features(self, schedule: NchwcSchedule, task, value: int, threads: int) -> tuple[list[float], float]:
        from .conv_workload import output

        inst = task.instance(value)
        n, c, h, w, m, ph, pw, _ = inst
        oh, ow = output(task.conv_class, inst)
        kh, kw, sh, sw, _, _ = task.conv_class
        taken = path(schedule, task, inst)
        lanes = task.lanes
        blocks = math.ceil(m / lanes) * lanes / m * (1.0 if task.depthwise else math.ceil(c / lanes) * lanes / c)
        tile = schedule.dw_pixels if task.depthwise else schedule.rx
        tail = _tail(oh * ow if taken in ("pointwise", "narrow") else ow, tile)
        work = blocks * tail
        macs = task.flops(value) / 2
        row = [schedule.rx, schedule.dw_pixels, math.log2(schedule.l1_share), math.log2(schedule.l2_share),
               math.log2(max(1, schedule.par_min)), float(macs >= schedule.par_min), threads,
               *(float(taken == p) for p in PATHS), kh * kw, sh * sw, float(ph + pw > 0), math.log2(n),
               math.log2(c), math.log2(m), math.log2(max(1, oh)), math.log2(ow), tail, blocks, math.log2(macs)]
        return row, work

    def prior(self, schedule: NchwcSchedule, task, value: int) -> float:
        # Before any data: the default (measured when it was written) ranks first, tiles
        # further from it lower.
        default = default_nchwc_schedule()
        return -0.05 * abs(schedule.rx - default.rx) - 0.02 * abs(schedule.dw_pixels - default.dw_pixels) + (
            0.1 if schedule == default else 0.0)


CONV_NCHWC = register(NchwcConvFamily(depthwise=False))
CONV_NCHWC_DW = register(NchwcConvFamily(depthwise=True))
