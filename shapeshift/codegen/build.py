"""Compile generated C source into a shared library, cached on disk, and load it with ctypes.

``compile_library(source)`` returns a ``CompiledLibrary`` whose ``cdll`` is already loaded:
loading is the last integrity check of a cache entry, so it is done eagerly, before the
entry is trusted.

Cache layout, under ``cache_dir`` / ``$SHAPESHIFT_CACHE_DIR`` / ``~/.cache/shapeshift``::

    <key[:2]>/<key>.so          the library
    <key[:2]>/<key>.c           the source it was built from
    <key[:2]>/<key>.json        metadata: key, size and sha256 of the .so, flags, compiler, versions
    <key[:2]>/<key>.lock        flock'ed around the build of one key (never deleted: deleting
                                a lock file that another process may hold is a race)
    <key[:2]>/<key>.failed.c    the source of a build the compiler rejected

    artifacts/<sha[:2]>/<sha>.so  a compiled artifact's library (``install_library``), named by
                                the sha256 of its bytes, next to its source <sha>.c

The key is a sha256 over the source, the flags and the compiler's ``--version`` output.

Concurrency and crashes: every file is written to a temporary name in the same directory
and moved into place with ``os.replace``; the metadata goes in before the .so, so a .so
under its final name always has metadata. Readers check the entry without the lock; any
doubt (missing, mismatched, unloadable) sends them to the lock, where the entry is checked
again and only then removed and rebuilt. So two processes building the same key compile
it once and both load the one entry. An entry whose .so does not match its metadata, has
no metadata, or does not load is removed and rebuilt, never used.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..errors import CompileError, CompilerNotFoundError

log = logging.getLogger(__name__)

DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
COMPILER_CANDIDATES: tuple[str, ...] = ("cc", "gcc")
# Bump when the key's recipe or the entry layout changes, so old entries are never reused.
CACHE_FORMAT = 1
# How much of the compiler's complaint goes into a CompileError message.
ERROR_LINES = 20


@dataclass(frozen=True)
class CompiledLibrary:
    """A built, validated and loaded shared library from the cache."""

    path: Path  # the .so
    source_path: Path  # the .c it was built from (kept next to it)
    key: str  # hex sha256 of source, flags and compiler version
    cdll: ctypes.CDLL = field(repr=False, compare=False)


def default_cache_dir() -> Path:
    """``$SHAPESHIFT_CACHE_DIR`` if set, else ``~/.cache/shapeshift``."""
    env = os.environ.get("SHAPESHIFT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "shapeshift"


def find_compiler() -> str:
    """The C compiler to use: ``$SHAPESHIFT_CC`` if set, else ``cc`` or ``gcc`` on PATH."""
    env = os.environ.get("SHAPESHIFT_CC")
    if env:
        found = shutil.which(env)
        if found is None:
            raise CompilerNotFoundError(
                f"no C compiler found: SHAPESHIFT_CC={env} is not an executable; "
                "install gcc or set SHAPESHIFT_CC to a C compiler (or run without one: backend=\"reference\")")
        return found
    for name in COMPILER_CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return found
    tried = ", ".join(COMPILER_CANDIDATES)
    raise CompilerNotFoundError(
        f"no C compiler found: install gcc or set SHAPESHIFT_CC (tried $SHAPESHIFT_CC (unset), {tried} on PATH), "
        "or run without one: backend=\"reference\"")


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    """``<cc> --version`` output: the compiler's identity in the cache key (run once per path)."""
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompilerNotFoundError(f"no C compiler found: {cc} could not be run ({exc})") from exc
    if proc.returncode != 0:
        raise CompilerNotFoundError(
            f"no C compiler found: `{cc} --version` exited with {proc.returncode}: {proc.stderr.strip()[:200]}")
    return proc.stdout.strip()


def cache_key(source: str, flags: Sequence[str], version: str) -> str:
    """Hex sha256 over the cache format, compiler version, flags and source (length-prefixed)."""
    h = hashlib.sha256()
    for part in (str(CACHE_FORMAT), version, *flags, "\0source\0", source):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def compile_library(source: str, name_hint: str = "kernels", flags: Optional[Sequence[str]] = None,
                    cache_dir: Optional[Path] = None) -> CompiledLibrary:
    """Build ``source`` into a shared library (or take it from the cache) and load it.

    ``flags`` replace ``DEFAULT_FLAGS`` (extend them with ``[*DEFAULT_FLAGS, ...]``); they
    must still make a shared library. ``name_hint`` only labels the metadata and error
    messages: the same source under two names is one entry.
    Raises CompilerNotFoundError, or CompileError naming the kept source file.
    """
    flags = tuple(DEFAULT_FLAGS if flags is None else flags)
    cc = find_compiler()
    version = compiler_version(cc)
    key = cache_key(source, flags, version)
    directory = Path(cache_dir if cache_dir is not None else default_cache_dir()) / key[:2]
    directory.mkdir(parents=True, exist_ok=True)
    entry = _Entry(directory, key)

    # Fast path, no lock: a complete entry is never modified, only replaced whole.
    if _check(entry) is None:
        lib = _try_load(entry)
        if lib is not None:
            return lib

    with _locked(entry.lock):
        problem = _check(entry)
        if problem is None:
            lib = _try_load(entry)
            if lib is not None:
                return lib
            problem = "the library does not load"
        if entry.so.exists() or entry.meta.exists():
            log.warning("rebuilding corrupt cache entry %s: %s", entry.so, problem)
        _remove(entry)
        _build(entry, source, name_hint, flags, cc, version)
        lib = _try_load(entry)
        if lib is None:
            raise CompileError(f"{name_hint}: {entry.so} was just built by {cc} but does not load; "
                               f"source kept at {entry.source}")
        return lib


def library_metadata(library: CompiledLibrary) -> dict:
    """The metadata of a library built by ``compile_library`` (flags, compiler, sizes; see above)."""
    return json.loads(library.path.with_suffix(".json").read_text())


def install_library(data: bytes, key: str, source: str, cache_dir: Optional[Path] = None) -> CompiledLibrary:
    """Load a library built elsewhere (a compiled artifact's) from its bytes, without a compiler.

    The bytes go to ``artifacts/<sha[:2]>/<sha>.so`` under the cache directory, named by their
    own sha256 so that one name always holds the same bytes (two processes installing it race
    harmlessly), next to the ``source`` it was built from. They are kept apart from the build
    entries: ``key`` names the build that made them elsewhere, not one made on this machine.
    The caller checks ``data`` against its own record; raises OSError if it cannot be written
    or loaded.
    """
    digest = hashlib.sha256(data).hexdigest()
    directory = Path(cache_dir if cache_dir is not None else default_cache_dir()) / "artifacts" / digest[:2]
    directory.mkdir(parents=True, exist_ok=True)
    so, c_file = directory / f"{digest}.so", directory / f"{digest}.c"
    if not c_file.exists() or c_file.read_text() != source:
        _write_atomic(c_file, source.encode())
    if not so.exists() or hashlib.sha256(so.read_bytes()).hexdigest() != digest:
        _write_atomic(so, data)
    return CompiledLibrary(path=so, source_path=c_file, key=key, cdll=ctypes.CDLL(str(so)))


def _run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run the compiler; one function so tests can count or fake invocations."""
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class _Entry:
    directory: Path
    key: str

    @property
    def so(self) -> Path:
        return self.directory / f"{self.key}.so"

    @property
    def source(self) -> Path:
        return self.directory / f"{self.key}.c"

    @property
    def meta(self) -> Path:
        return self.directory / f"{self.key}.json"

    @property
    def lock(self) -> Path:
        return self.directory / f"{self.key}.lock"

    @property
    def failed_source(self) -> Path:
        return self.directory / f"{self.key}.failed.c"


def _check(entry: _Entry) -> Optional[str]:
    """None if the entry's files are complete and consistent, else what is wrong."""
    try:
        meta = json.loads(entry.meta.read_text())
    except FileNotFoundError:
        return "no metadata" if entry.so.exists() else "not built"
    except (OSError, ValueError) as exc:
        return f"unreadable metadata ({exc})"
    if not isinstance(meta, dict) or meta.get("key") != entry.key:
        return "metadata is for another key"
    try:
        data = entry.so.read_bytes()
    except FileNotFoundError:
        return "no library"
    if len(data) != meta.get("so_size"):
        return f"library is {len(data)} bytes, metadata says {meta.get('so_size')}"
    if hashlib.sha256(data).hexdigest() != meta.get("so_sha256"):
        return "library's sha256 does not match its metadata"
    if not entry.source.exists():
        return "no source"
    return None


def _try_load(entry: _Entry) -> Optional[CompiledLibrary]:
    try:
        cdll = ctypes.CDLL(str(entry.so))
    except OSError as exc:
        log.debug("cannot load %s: %s", entry.so, exc)
        return None
    return CompiledLibrary(path=entry.so, source_path=entry.source, key=entry.key, cdll=cdll)


def _remove(entry: _Entry) -> None:
    # Metadata first: a .so without metadata is never trusted, whatever happens next.
    for path in (entry.meta, entry.so):
        path.unlink(missing_ok=True)


def _build(entry: _Entry, source: str, name_hint: str, flags: tuple[str, ...], cc: str, version: str) -> None:
    _write_atomic(entry.source, source.encode())
    fd, tmp_name = tempfile.mkstemp(dir=entry.directory, prefix=f".{entry.key}.", suffix=".so.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [cc, *flags, str(entry.source), "-o", str(tmp)]
        proc = _run_compiler(cmd)
        if proc.returncode != 0:
            os.replace(entry.source, entry.failed_source)
            raise CompileError(_compile_error_message(name_hint, cmd, proc, entry.source, entry.failed_source))
        data = tmp.read_bytes()
        from .. import __version__  # here, not at import: the package imports codegen while initialising

        meta = {
            "key": entry.key, "name_hint": name_hint,
            "so_size": len(data), "so_sha256": hashlib.sha256(data).hexdigest(),
            "flags": list(flags), "compiler": cc, "compiler_version": version,
            "shapeshift_version": __version__, "cache_format": CACHE_FORMAT,
        }
        _write_atomic(entry.meta, json.dumps(meta, indent=1).encode())
        os.replace(tmp, entry.so)
    finally:
        tmp.unlink(missing_ok=True)
    entry.failed_source.unlink(missing_ok=True)


def _compile_error_message(name_hint: str, cmd: list[str], proc: subprocess.CompletedProcess,
                           compiled: Path, kept: Path) -> str:
    # The compiler names the file it read, which has since been renamed to the kept one.
    text = (proc.stderr or proc.stdout or "").replace(str(compiled), str(kept))
    lines = text.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    shown = (errors or lines)[:ERROR_LINES]
    more = f"\n... ({len(lines) - len(shown)} more lines)" if len(lines) > len(shown) else ""
    return (f"C compilation of {name_hint} failed ({cmd[0]} exited with {proc.returncode}); "
            f"generated source kept at {kept}\n" + "\n".join(shown) + more)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
