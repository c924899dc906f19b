"""What the operating system says about the CPU: /proc/cpuinfo and the cache folders of sysfs.

Pure parsers over text and folders, so that tests can feed them fixed samples of other
machines (tests/target_samples/); ``read_host()`` reads this machine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CPUINFO = Path("/proc/cpuinfo")
SYSFS_CPU0_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class CpuIdentity:
    """The first processor block of /proc/cpuinfo, and how many blocks there are."""

    vendor: str  # GenuineIntel, AuthenticAMD, ...
    model_name: str
    family: int
    model: int
    flags: frozenset[str]
    logical_cpus: int


def identity_text(model_name: str, flags) -> str:
    """A CPU's model name and sorted flags as one string: what the target key hashes and
    what a -march=native build's cache key holds (codegen/build.py's native_cpu)."""
    return model_name + "\0" + " ".join(sorted(flags))


@dataclass(frozen=True)
class Caches:
    """Data cache sizes in bytes: L1d and L2 of one core, L3 of the whole package (0: none)."""

    l1d: int
    l2: int
    l3: int


def parse_cpuinfo(text: str) -> CpuIdentity:
    """The identity in /proc/cpuinfo's text; a field it lacks reads as empty or 0."""
    blocks = [b for b in text.split("\n\n") if "processor" in b]
    first: dict[str, str] = {}
    for line in (blocks[0] if blocks else text).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            first.setdefault(key.strip(), value.strip())
    return CpuIdentity(vendor=first.get("vendor_id", ""), model_name=first.get("model name", ""),
                       family=_int(first.get("cpu family")), model=_int(first.get("model")),
                       flags=frozenset(first.get("flags", "").split()), logical_cpus=max(1, len(blocks)))


def parse_size(text: str) -> int:
    """A sysfs cache size ("48K", "2048K", "1M") in bytes; 0 if unreadable."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else 0


def read_caches(folder: Path = SYSFS_CPU0_CACHE) -> Caches:
    """Cache sizes from ``folder``/index*/{level,type,size}; 0 where sysfs says nothing."""
    sizes = {}
    for index in sorted(folder.glob("index*")) if folder.is_dir() else ():
        level, kind, size = (_read(index / name) for name in ("level", "type", "size"))
        if kind in ("Data", "Unified") and level.isdigit():
            sizes.setdefault(int(level), parse_size(size))
    return Caches(l1d=sizes.get(1, 0), l2=sizes.get(2, 0), l3=sizes.get(3, 0))


def read_host(cpuinfo: Path = CPUINFO, caches: Path = SYSFS_CPU0_CACHE) -> tuple[Optional[CpuIdentity], Caches]:
    """This machine's identity (None where /proc/cpuinfo cannot be read) and caches."""
    text = _read(cpuinfo)
    return (parse_cpuinfo(text) if text else None), read_caches(caches)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _int(text: Optional[str]) -> int:
    return int(text) if text and text.isdigit() else 0
