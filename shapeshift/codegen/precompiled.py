"""Precompiled headers: the includes every generated unit starts with, parsed once per
compiler and flag set instead of once per unit.

gcc takes about 0.2 s to parse ``immintrin.h`` (with -march=native on a Zen 4: 0.23 s of
the 0.26 s the prelude's includes cost), the same in every translation unit. A model split
into units pays it per unit (ssdlite320's six units and twelve kernel fragments, silero_vad's
eight units), and a tuning run per candidate kernel. With ``-include <header>``, gcc loads
``<header>.gch`` beside it instead when that file was made by the same compiler with the
same flags: a unit's header cost falls to a few hundredths of a second.

The header is the prelude's ``HEADER`` (codegen/kernels/prelude.py). A unit whose text
starts with it is compiled with ``-include``; its own ``#include`` lines then reopen guarded
headers, which costs nothing, and its text, cache key and object are what they were without.

Layout, one folder per (compiler version, flags) under the build cache's ``headers/``::

    ss_header.h        the header's text
    ss_header.h.gch    gcc's precompiled form of it
    deps.json          the files gcc read to make it, each with its size and mtime (gcc does
                       not check them: a system header updated since would go unnoticed)
    unusable           the compiler's complaint, when it could not make one (never retried)
    lock               flock'ed around making it

deps.json is written last, so a folder without it is unfinished: it is made again. Only gcc
(clang names and checks precompiled headers its own way). A precompiled header that gcc
rejects fails the compile rather than being skipped (cc1: "while reading precompiled
header"), so the build (codegen/build.py) compiles the unit again without it and discards it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from ..files import replace_file
from .kernels.prelude import HEADER

log = logging.getLogger(__name__)

HEADER_FILE = "ss_header.h"
# What gcc's precompiled headers start with.
GCH_MAGIC = b"gpch"
# Making the .gch costs about three parses of the header: it is made only for a build that
# compiles at least this many units with the same flags, and used by every later one.
WORTH_MAKING = 3


def applies(source: str, compiler_version: str) -> bool:
    """Whether ``source`` can be compiled against the precompiled header: it starts with the
    header, and the compiler is gcc (the GNU copyright line of ``--version``, not clang's)."""
    return (source.startswith(HEADER) and "Free Software Foundation" in compiler_version
            and "clang" not in compiler_version)


def header_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """The flags of a compile that must match the precompiled header's: all but the ones
    that only say what to make of the unit (an object, a shared library)."""
    return tuple(f for f in flags if f not in ("-c", "-shared"))


def find(folder: Path) -> Optional[Path]:
    """The header in ``folder`` if its precompiled form is complete (a gcc one, though
    only gcc can tell whether it is whole) and made from files that have not changed since,
    else None."""
    try:
        deps = json.loads((folder / "deps.json").read_text())
        if (folder / HEADER_FILE).read_text() != HEADER:
            return None
        with open(folder / f"{HEADER_FILE}.gch", "rb") as f:
            if f.read(4) != GCH_MAGIC:  # gcc would parse the text beside it, and nothing says so
                return None
        for path, size, mtime in deps:
            st = os.stat(path)
            if st.st_size != size or st.st_mtime_ns != mtime:
                return None
    except (OSError, ValueError, TypeError):
        return None
    return folder / HEADER_FILE


def make(folder: Path, cc: str, flags: Sequence[str]) -> Optional[Path]:
    """The header in ``folder``, precompiled first by ``cc`` with ``flags`` if it is not
    already (another process may be at it: the lock makes it wait and reuse that one).
    None where the compiler cannot make it, now or before, or the cache cannot hold it (a
    full disk, a folder it may not write: the build goes on without)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "lock", "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            found = find(folder)
            if found is not None or (folder / "unusable").exists():
                return found
            return _make(folder, cc, header_flags(flags))
    except OSError as exc:
        log.warning("no precompiled header in %s: %s", folder, exc)
        return None


def discard(folder: Path) -> None:
    """Forget the precompiled header in ``folder`` (the compiler rejected it): the next
    build that is worth it makes it again."""
    (folder / "deps.json").unlink(missing_ok=True)
    (folder / f"{HEADER_FILE}.gch").unlink(missing_ok=True)


def _make(folder: Path, cc: str, flags: tuple[str, ...]) -> Optional[Path]:
    header = folder / HEADER_FILE
    replace_file(header, HEADER.encode())
    scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".make."))
    try:
        gch, dep_file = scratch / f"{HEADER_FILE}.gch", scratch / "deps.d"
        proc = subprocess.run([cc, *flags, "-x", "c-header", str(header), "-o", str(gch), "-MD", "-MF", str(dep_file)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            replace_file(folder / "unusable", (proc.stderr or proc.stdout or "").encode())
            log.info("no precompiled header for %s: %s exited with %d", folder, cc, proc.returncode)
            return None
        deps = []
        for path in _make_rule_inputs(dep_file.read_text()):
            st = os.stat(path)
            deps.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
        os.replace(gch, folder / f"{HEADER_FILE}.gch")
        replace_file(folder / "deps.json", json.dumps(deps).encode())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return header


def _make_rule_inputs(text: str) -> list[str]:
    """The prerequisites of the one rule in a -MD dependency file (no file name with spaces
    among system headers: gcc would escape it, and the check would miss it, not fail)."""
    words = text.replace("\\\n", " ").split()
    return words[1:] if words and words[0].endswith(":") else []
