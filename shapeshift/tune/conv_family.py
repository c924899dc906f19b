"""The ``conv`` kernel family: ``ConvSchedule`` (kernels/conv_tuned.py) as a tuning task's
schedule type, for the conv tasks of tune/conv_workload.py.

Its space is the GEMM space the conv paths share (tune/space.py), or the target's default
GEMM schedule (half the draws: the paths' switches matter on their own), with the switches
drawn from lists around their defaults. The cost model sees the GEMM's features at the
conv's GEMM shape (pixels x taps x output channels, batch N) and which path the schedule
sends this instance down, mirroring ``ss_conv2d``'s order (conv_panels, the implicit GEMM,
the small-plane GEMM, the 1 x 1 GEMM, the rest) with the weights prepacked, as the tuned
lowering always passes them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

from ..codegen.defaults import default_conv_schedule
from ..codegen.kernels.conv_tuned import ConvSchedule, unit_source
from ..target import Target
from . import gemm_family, space
from .task import register

BLOCKS = (24, 36, 48, 72, 96)
MIN_PLANES = (0, 4, 9, 16, 25, 36, 49, 64, 100)
PANEL_PLANES = (0, 64, 144, 400)
SMALL_PLANES = (0, 16, 36, 64, 144)
SMALL_PLANE_MAXES = (0, 64, 256, 576, 1024)
MUTABLE = ("gemm", "igemm_block", "igemm_min_plane", "panels_max_plane", "small_plane", "small_plane_max")
PATHS = ("panels", "igemm", "small_plane", "gemm_1x1", "other")

BENCH_SOURCE = """
/* Seconds per call of `calls` back-to-back ss_conv2d calls (group 1, prepacked weights). */
double tune_conv_bench(int64_t calls, const float* x, const float* w, const float* bias, float* y,
                       int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                       int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                       int64_t dh, int64_t dw, int64_t act, float* work, const float* wpacked)
{
    double start = omp_get_wtime();
    for (int64_t i = 0; i < calls; ++i)
        ss_conv2d(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, 1, (int)act, work, wpacked);
    return (omp_get_wtime() - start) / (double)calls;
}

/* The same, each call timed alone after a write to every cache line of `flush` (more
   floats than the caches hold): the conv finds its input, weights and output in DRAM. */
double tune_conv_bench_cold(int64_t calls, const float* x, const float* w, const float* bias, float* y,
                            int64_t N, int64_t C, int64_t H, int64_t W, int64_t M, int64_t KH, int64_t KW,
                            int64_t OH, int64_t OW, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                            int64_t dh, int64_t dw, int64_t act, float* work, const float* wpacked,
                            float* flush, int64_t flush_floats)
{
    double total = 0.0;
    for (int64_t i = 0; i < calls; ++i) {
        for (int64_t j = 0; j < flush_floats; j += 16) flush[j] += 1.0f;
        double start = omp_get_wtime();
        ss_conv2d(x, w, bias, y, N, C, H, W, M, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw, 1, (int)act, work, wpacked);
        total += omp_get_wtime() - start;
    }
    return total / (double)calls;
}
"""


def path(s: ConvSchedule, kh: int, kw: int, sh: int, sw: int, ph: int, pw: int, pixels: int, m: int,
         same_plane: bool) -> str:
    """The path ``ss_conv2d`` takes under ``s`` with prepacked weights (kernels/conv.py)."""
    kxk = kh * kw > 1
    if kxk and pixels <= s.panels_max_plane:
        return "panels"
    if kxk and pixels > s.igemm_min_plane:
        return "igemm"
    if pixels <= s.small_plane or (pixels <= s.small_plane_max and pixels <= m):
        return "small_plane"
    if not kxk and sh == sw == 1 and ph == pw == 0 and same_plane:
        return "gemm_1x1"
    return "other"


class ConvFamily:
    name = "conv"

    def default(self, target: Target) -> ConvSchedule:
        return default_conv_schedule(target)

    def random(self, rng: random.Random, target: Target) -> ConvSchedule:
        gemm = default_conv_schedule(target).gemm if rng.random() < 0.5 else space.random_schedule(rng, target)
        return ConvSchedule(gemm=gemm, igemm_block=rng.choice(BLOCKS), igemm_min_plane=rng.choice(MIN_PLANES),
                            panels_max_plane=rng.choice(PANEL_PLANES), small_plane=rng.choice(SMALL_PLANES),
                            small_plane_max=rng.choice(SMALL_PLANE_MAXES))

    def mutate(self, schedule: ConvSchedule, rng: random.Random, target: Target) -> ConvSchedule:
        name = rng.choice(MUTABLE)
        if name == "gemm":
            return dataclasses.replace(schedule, gemm=space.mutate(schedule.gemm, rng, target))
        choices = {"igemm_block": BLOCKS, "igemm_min_plane": MIN_PLANES, "panels_max_plane": PANEL_PLANES,
                   "small_plane": SMALL_PLANES, "small_plane_max": SMALL_PLANE_MAXES}[name]
        return dataclasses.replace(schedule, **{name: rng.choice(choices)})

    def to_json(self, schedule: ConvSchedule) -> str:
        fields = {f.name: getattr(schedule, f.name) for f in dataclasses.fields(schedule) if f.name != "gemm"}
        return json.dumps({**fields, "gemm": vars(schedule.gemm)}, sort_keys=True)

    def from_json(self, text: str) -> ConvSchedule:
        data = json.loads(text)
        return ConvSchedule(**{**data, "gemm": space.from_json(json.dumps(data["gemm"]))})

    def source(self, schedule: ConvSchedule, prefix: str = "ss_") -> str:
        return unit_source(schedule, prefix=prefix)

    def bench_source(self) -> str:
        return BENCH_SOURCE

    def layout(self, schedule: ConvSchedule) -> tuple[int, int]:
        return gemm_family.layout(schedule.gemm)

    def _instance(self, task, value: int):
        from .conv_workload import output

        kh, kw, sh, sw, _, _ = task.conv_class
        inst = task.instance(value)
        n, c, h, w, m, ph, pw, act = inst
        oh, ow = output(task.conv_class, inst)
        return kh, kw, sh, sw, ph, pw, n, c, m, act, oh * ow, (oh, ow) == (h, w)

    def features(self, schedule: ConvSchedule, task, value: int, threads: int) -> tuple[list[float], float]:
        kh, kw, sh, sw, ph, pw, n, c, m, act, pixels, same = self._instance(task, value)
        taken = path(schedule, kh, kw, sh, sw, ph, pw, pixels, m, same)
        taps = c * kh * kw
        if taken in ("small_plane", "panels"):
            work = gemm_family.work_ratio(schedule.gemm, pixels, m)
        else:  # the implicit GEMM's 16-channel panels (the 1 x 1 GEMM's rows are the channels)
            work = -(-m // 16) * 16 / m
        row = gemm_family.features(schedule.gemm, pixels, taps, m, threads, n, work)
        row += [schedule.igemm_block, schedule.igemm_min_plane, schedule.panels_max_plane, schedule.small_plane,
                schedule.small_plane_max, *(float(taken == p) for p in PATHS), kh * kw, sh * sw,
                math.log2(pixels), math.log2(c), math.log2(m), float(act), float(ph + pw > 0)]
        return row, work

    def prior(self, schedule: ConvSchedule, task, value: int) -> float:
        kh, kw, sh, sw, ph, pw, n, c, m, act, pixels, same = self._instance(task, value)
        base = gemm_family.prior_log_gflops(schedule.gemm, max(1, pixels), m)
        # Before any data: the defaults' switches rank first (they were measured).
        default = path(default_conv_schedule(), kh, kw, sh, sw, ph, pw, pixels, m, same)
        return base + (0.1 if path(schedule, kh, kw, sh, sw, ph, pw, pixels, m, same) == default else 0.0)


CONV = register(ConvFamily())
