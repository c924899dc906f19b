"""The target description: the one place that knows the machine code is built for.

``Target`` holds the instruction sets (AVX2, FMA, AVX-512 F/BW/VL/DQ, VNNI, AMX), the
vector widths and register file they give, the cache sizes, the microarchitecture class
(target/microarch.py) and the ``-march`` the C compiler gets. ``host_target()`` describes
this machine (-march=native); ``named_target("x86-64-v3")`` and ``"x86-64-v4"`` describe
the psABI levels, for code that must run on any CPU of that level. Measured facts (FMA
throughput and latency per width) come from target/calibrate.py, on the host only.

Describing another machine: ``SHAPESHIFT_DESCRIBE_CPU=FILE`` (a /proc/cpuinfo text, such as
tests/target_samples/*.cpuinfo) makes ``host_target()`` of that process, and of every process
it starts, describe the CPU in FILE instead of its own: its model name and flags, hence its
target key, with the generic cache sizes (FILE says nothing of sysfs). It is for tests (a
Ray node on this machine that stands for another CPU model: tests/test_tune_cluster_models.py)
and for tuning records: which selections a machine of that model takes (tune/records.py).
What is measured under it is this machine's timing filed under the other model's key: a
database meant for real machines of that model is not tuned with it set. The code is still
built with -march=native and runs here, so FILE may not claim an instruction set the code
generator uses (``CODEGEN_FEATURES``) that this CPU lacks, and an unreadable FILE, or one
without a model name and flags, is an error rather than a silent fall back to this machine:
either would record measurements under a key they were not made for. What is measured
under it (target/calibrate.py) is cached under the described key, never this CPU's own.

Kernels, schedule spaces, default schedules and cost-model features read what they need
from here; no kernel file knows a register count of its own.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ShapeshiftError
from .cpu import Caches, CpuIdentity, identity_text, parse_cpuinfo, read_host
from .microarch import MicroarchClass, classify

# The x86-64 psABI levels, as /proc/cpuinfo spells their features (lzcnt is "abm" there).
X86_64_V2 = frozenset("cx16 lahf_lm popcnt pni sse sse2 sse4_1 sse4_2 ssse3".split())
X86_64_V3 = X86_64_V2 | frozenset("avx avx2 bmi1 bmi2 f16c fma abm movbe xsave".split())
X86_64_V4 = X86_64_V3 | frozenset("avx512f avx512bw avx512cd avx512dq avx512vl".split())
LEVELS = {"x86-64-v3": X86_64_V3, "x86-64-v4": X86_64_V4}
# Where a named target cannot know the caches of the CPU it will run on: sizes most x86
# cores of the last decade have at least.
GENERIC_CACHES = Caches(l1d=32 << 10, l2=1 << 20, l3=8 << 20)
# Features the native backend needs whatever the target.
REQUIRED = frozenset({"avx2", "fma"})
# Every extension a Target's properties read, so kernels may be generated for: what a
# described CPU (``DESCRIBE_CPU_ENV``) may claim only where this CPU has it too.
CODEGEN_FEATURES = X86_64_V4 | frozenset("avx512_vnni avx_vnni avx512_bf16 avx512_fp16 amx_tile".split())
# Names a /proc/cpuinfo text this process describes as its CPU (the module docstring).
DESCRIBE_CPU_ENV = "SHAPESHIFT_DESCRIBE_CPU"


def registers_of_width(lanes: int) -> int:
    """The vector registers a kernel in vectors of ``lanes`` floats can count on in any build
    that has them: 32 for zmm (AVX-512 has 32), 16 for ymm (AVX2 has 16; a ymm kernel also
    compiled for builds without AVX-512 cannot use ymm16-31)."""
    return 32 if lanes == 16 else 16


@dataclass(frozen=True)
class Target:
    """A CPU to generate code for."""

    name: str  # "native" (this machine) or a psABI level
    flags: frozenset[str]  # instruction-set extensions as /proc/cpuinfo names them
    caches: Caches
    march: str  # the compiler's -march value
    cpu: Optional[CpuIdentity] = None  # the host's identity; None when named

    @property
    def cpu_model(self) -> str:
        """The CPU model name (the host's), or the level's name for a named target."""
        return self.cpu.model_name if self.cpu is not None else self.name

    @property
    def microarch(self) -> MicroarchClass:
        return classify(self.cpu, self.flags)

    def has(self, *features: str) -> bool:
        return all(f in self.flags for f in features)

    @property
    def avx512(self) -> bool:
        """AVX-512 F, BW, CD, DQ and VL: what -march=x86-64-v4 and the zmm kernels use."""
        return self.has("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

    @property
    def vnni(self) -> bool:
        return self.has("avx512_vnni") or self.has("avx_vnni")

    @property
    def amx(self) -> bool:
        return self.has("amx_tile")

    @property
    def vector_registers(self) -> int:
        """Vector registers the compiler may use: 32 with AVX-512 (ymm16-31 too, with VL), else 16."""
        return registers_of_width(16 if self.has("avx512f") else 8)

    @property
    def widths(self) -> tuple[int, ...]:
        """Vector widths in bits that the kernels may use."""
        return (256, 512) if self.has("avx512f") else (256,)

    @property
    def isa(self) -> list[str]:
        """The extensions that matter here, in a fixed order, for printing."""
        names = [("AVX2", self.has("avx2")), ("FMA", self.has("fma")),
                 ("AVX-512F", self.has("avx512f")), ("AVX-512BW", self.has("avx512bw")),
                 ("AVX-512VL", self.has("avx512vl")), ("AVX-512DQ", self.has("avx512dq")),
                 ("VNNI", self.vnni), ("AVX-512-BF16", self.has("avx512_bf16")),
                 ("AVX-512-FP16", self.has("avx512_fp16")), ("AMX", self.amx)]
        return [name for name, present in names if present]

    @property
    def key(self) -> str:
        """A short hash of the CPU model and flags: what measured facts and tuning records
        are keyed by (a change of either makes them stale)."""
        return hashlib.sha256(identity_text(self.cpu_model, self.flags).encode()).hexdigest()[:16]

    def missing(self, features) -> list[str]:
        """``features`` this target lacks, sorted."""
        return sorted(set(features) - self.flags)


def target_to_json(target: Target) -> dict:
    """What a compiled artifact records of the target it was built for."""
    cpu = target.cpu
    return {"name": target.name, "march": target.march, "flags": sorted(target.flags),
            "caches": [target.caches.l1d, target.caches.l2, target.caches.l3],
            "cpu": None if cpu is None else {"vendor": cpu.vendor, "model_name": cpu.model_name,
                                             "family": cpu.family, "model": cpu.model}}


def target_from_json(data: dict) -> Target:
    """The target ``target_to_json`` recorded: the same default schedules and -march."""
    flags = frozenset(data["flags"])
    cpu = data.get("cpu")
    identity = None if cpu is None else CpuIdentity(vendor=cpu["vendor"], model_name=cpu["model_name"],
                                                    family=int(cpu["family"]), model=int(cpu["model"]),
                                                    flags=flags, logical_cpus=1)
    return Target(name=str(data["name"]), flags=flags, caches=Caches(*map(int, data["caches"])),
                  march=str(data["march"]), cpu=identity)


def target_from_cpu(cpu: CpuIdentity, caches: Caches) -> Target:
    """The description of a machine with this identity and caches, built with -march=native."""
    filled = Caches(l1d=caches.l1d or GENERIC_CACHES.l1d, l2=caches.l2 or GENERIC_CACHES.l2,
                    l3=caches.l3 or GENERIC_CACHES.l3)
    return Target(name="native", flags=cpu.flags, caches=filled, march="native", cpu=cpu)


@functools.cache
def host_target() -> Target:
    """This machine, as /proc/cpuinfo and sysfs describe it (read once per process), or the
    CPU that ``$SHAPESHIFT_DESCRIBE_CPU`` describes (the module docstring)."""
    cpu, caches = read_host()
    described = os.environ.get(DESCRIBE_CPU_ENV)
    if described:
        return described_target(Path(described), cpu)
    if cpu is None:
        # Not Linux, or no /proc: assume the level every supported machine has.
        return named_target("x86-64-v3")
    return target_from_cpu(cpu, caches)


def described_target(path: Path, real: Optional[CpuIdentity]) -> Target:
    """The CPU the cpuinfo text at ``path`` describes, standing for this machine, whose own
    identity is ``real`` (None: unknown, taken as x86-64-v3); a ShapeshiftError if it cannot
    stand for it (the module docstring)."""
    where = f"{DESCRIBE_CPU_ENV}={path}"
    try:
        cpu = parse_cpuinfo(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ShapeshiftError(f"{where}: cannot read the CPU description: {getattr(exc, 'strerror', None) or exc}"
                              ) from None
    if not cpu.model_name or not cpu.flags:
        raise ShapeshiftError(f"{where}: not a /proc/cpuinfo text (no 'model name' and 'flags' lines)")
    have = real.flags if real is not None else X86_64_V3
    beyond = sorted((cpu.flags - have) & CODEGEN_FEATURES)
    if beyond:
        raise ShapeshiftError(f"{where}: describes {cpu.model_name} with {', '.join(beyond)}, which this CPU lacks: "
                              f"kernels built for it would not run here")
    return target_from_cpu(cpu, Caches(0, 0, 0))


def named_target(name: str) -> Target:
    """``native`` (this machine) or a psABI level, x86-64-v3 or x86-64-v4."""
    if name == "native":
        return host_target()
    if name not in LEVELS:
        raise ShapeshiftError(f"unknown target {name!r}: use native, " + ", ".join(sorted(LEVELS)))
    return Target(name=name, flags=LEVELS[name], caches=GENERIC_CACHES, march=name)
