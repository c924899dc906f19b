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
    <key[:2]>/<key>.o           an object linked into libraries (a kernel fragment's, see
                                codegen/fragments.py), with the same .c, .json and .lock

    artifacts/<sha[:2]>/<sha>.so  a compiled artifact's library (``install_library``), named by
                                the sha256 of its bytes, next to its source <sha>.c
    headers/<key>/              the prelude's includes precompiled for one compiler and flag set
                                (codegen/precompiled.py)

The key is a sha256 over the source, the flags and the compiler's ``--version`` output,
and for a library that links objects, over their keys too.

Concurrency and crashes: every file is written to a temporary name in the same directory
and moved into place with ``os.replace``; the metadata goes in before the .so, so a .so
under its final name always has metadata. Readers check the entry without the lock; any
doubt (missing, mismatched, unloadable) sends them to the lock, where the entry is checked
again and only then removed and rebuilt. So two processes building the same key compile
it once and both load the one entry. An entry whose .so (or .o) does not match its
metadata, has no metadata, or (a .so) does not load is removed and rebuilt, never used;
so is one where any of its files is not a regular file (a directory, a symlink, a fifo: the
cache writes none, and reading a fifo would block), and a lock that is not one is replaced.

A library that links objects compiles its own source to an object while the objects it
lacks are built, each under its own lock, in parallel (gcc runs in processes of its own,
at most one per core, the largest sources first so that the last to finish is a small
one), then links them all. An object, and the library's own source, may be compiled at an
optimization level of its own (``opt``: flags that replace the -O flag of ``flags``; a
model's calls into the kernels at -O0, its small loops at -O1, its elementwise loops over
whole tensors at -O3, see codegen/emit.py); the level is part of its key.

A unit that starts with the prelude's includes is compiled against their precompiled form
when one exists for its flags (about 0.2 s of gcc less per unit, the object unchanged); a
build that compiles at least three such units with the same flags makes it first.
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..errors import CompileError, CompilerNotFoundError, ShapeshiftError
from ..files import discard, discard_if_not_regular, not_regular, replace_file
from . import precompiled

log = logging.getLogger(__name__)

DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11",
                                  # A call to a function the unit does not declare is a bug in
                                  # the generated code, not something to guess a signature for.
                                  "-Werror=implicit-function-declaration")
COMPILER_CANDIDATES: tuple[str, ...] = ("cc", "gcc")
# Bump when the key's recipe or the entry layout changes, so old entries are never reused.
CACHE_FORMAT = 2
# How much of the compiler's complaint goes into a CompileError message.
ERROR_LINES = 20
# gcc's time per character of a generated unit by -O level, against -O0's (SSDlite's units
# on an AMD Zen 3: -O0 2.0 ms a KB, -O1 2.7, -O3 7.8, each unit's 48 KB of declarations included).
_COST_PER_CHARACTER = {"-O0": 1, "-O1": 1.5, "-O2": 4, "-O3": 4, "-Os": 2, "-Og": 1}


@dataclass(frozen=True)
class CompiledLibrary:
    """A built, validated and loaded shared library from the cache."""

    path: Path  # the .so
    source_path: Path  # the .c it was built from (kept next to it)
    key: str  # hex sha256 of source, flags and compiler version
    cdll: ctypes.CDLL = field(repr=False, compare=False)


# How long a libgomp thread spins waiting for work before it sleeps, unless the user set
# OMP_WAIT_POLICY or GOMP_SPINCOUNT: libgomp's own default, about 300,000 spins, keeps an
# idle thread on its core between parallel regions. With another busy process per core,
# those spins took the time the other thread of the region needed, and every region waited
# for it: the BERT-base-size encoder at 2 threads slowed 2.5-3.5x against onnxruntime's
# 1.7-2.4x; with 10,000 it slowed 2.0-2.3x (bench/results/e2e_bert_2t_load*.md). A spin is
# a PAUSE, 25 ns on an AMD Zen 4 VM: 10,000 is about 250 us there, and 30,000 (750 us)
# already collapsed the loaded encoder (seq 1: 127.8 ms against onnxruntime's 30.9, idle
# 12.5 both), while 10,000 is too short to keep the worker awake between runs of a small
# model (e2e_bert_2t_load_zen4_spin30000.md says both). Only a pool whose caller does not
# wait for a sleeping worker escapes the trade.
OPENMP_SPINCOUNT = "10000"


def use_openmp_defaults() -> None:
    """Set the OpenMP wait policy the libraries run best under, where the user has not:
    libgomp reads it once, when the first OpenMP library loads into the process, so this
    runs before every load."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPINCOUNT)


#: What ``SHAPESHIFT_SANITIZE=1`` adds to the flags of the native backend's libraries (and so
#: of the kernel objects they link, whose flags derive from the library's): AddressSanitizer
#: and UndefinedBehaviorSanitizer, stopping at the first report of either. The flags are part
#: of every cache key, so sanitized and plain builds are separate entries.
SANITIZE_FLAGS: tuple[str, ...] = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                                   "-fno-sanitize-recover=undefined")


#: The highest -O level of a sanitized build. The sanitizers check the accesses the source
#: makes, at any level; gcc -O3 with them on the kernel fragments was most of a sanitized
#: test run (tests/test_sanitize.py with an empty cache, 2 jobs, AMD Zen 3: 122 s at -O3).
SANITIZE_MAX_OPT = "-O1"


def sanitizer_opt(flags: Sequence[str]) -> tuple[str, ...]:
    """``flags``, their -O2 or -O3 lowered to ``SANITIZE_MAX_OPT`` where they sanitize."""
    if not any(f.startswith("-fsanitize=") for f in flags):
        return tuple(flags)
    return tuple(SANITIZE_MAX_OPT if f in ("-O2", "-O3") else f for f in flags)


def sanitizing() -> bool:
    """Whether ``$SHAPESHIFT_SANITIZE`` asks for sanitized native builds (set, and not 0)."""
    return os.environ.get("SHAPESHIFT_SANITIZE", "") not in ("", "0")


def target_flags(target=None) -> tuple[str, ...]:
    """``DEFAULT_FLAGS`` for a target description (shapeshift.target.Target; None: this
    machine): its -march in place of -march=native; with ``SANITIZE_FLAGS`` when
    ``sanitizing()``, which needs the sanitizer runtime preloaded (shapeshift/sanitize.py):
    without it loading the library would end the process, so this raises a ShapeshiftError."""
    march = f"-march={target.march if target is not None else 'native'}"
    flags = tuple(march if flag == "-march=native" else flag for flag in DEFAULT_FLAGS)
    if not sanitizing():
        return flags
    from ..sanitize import require_runtime  # here: that module runs the compiler to find its runtime

    require_runtime()
    return (*flags, *SANITIZE_FLAGS)


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


@functools.cache
def native_cpu() -> str:
    """What -march=native builds for on this machine: the CPU's model name and flags from
    /proc/cpuinfo ('' where it cannot be read). In the key of whatever is built with it, so
    that a cache shared by machines of two CPUs (a home folder on NFS across a cluster's
    nodes) never gives one of them code made for instructions it lacks."""
    from ..target.cpu import identity_text, read_host  # here: the target package imports this module

    cpu, _ = read_host()
    return "" if cpu is None else identity_text(cpu.model_name, cpu.flags)


# Features a ``-mno-<feature>`` flag turns off, and the macro the compiler defines while one is on.
_FEATURE_MACROS = {"avx512f": "__AVX512F__", "avx512vl": "__AVX512VL__", "avx512bw": "__AVX512BW__",
                   "avx512dq": "__AVX512DQ__", "avx2": "__AVX2__", "fma": "__FMA__"}


@functools.lru_cache(maxsize=None)
def native_macros(cc: str) -> frozenset:
    """The macros ``cc -march=native`` predefines here (empty where it cannot say)."""
    try:
        proc = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True,
                              text=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    if proc.returncode != 0:
        return frozenset()
    return frozenset(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define "))


def key_flags(flags: Sequence[str], cc: str) -> tuple[str, ...]:
    """``flags`` as the cache key takes them: with -march=native, a ``-mno-<feature>`` for a
    feature this CPU lacks changes nothing the compiler makes, so it is left out, and the build
    is the one without it (an AVX2 machine's builds "without AVX-512", which the tests make to
    cover the AVX2 forms on AVX-512 machines, were second copies of its native builds,
    compiled again: gcc took 193 s on one of them on an AMD Zen 3). Kept whole where a flag
    turns a listed feature on (then the order matters) or the compiler cannot be asked. Flags
    with no ``-mno-`` (every build a session makes) return as they are, without asking it."""
    flags = tuple(flags)
    if ("-march=native" not in flags or not any(f.startswith("-mno-") for f in flags)
            or any(f"-m{name}" in flags for name in _FEATURE_MACROS)):
        return flags
    macros = native_macros(cc)
    if not macros:
        return flags
    return tuple(f for f in flags if not (f.startswith("-mno-") and f[5:] in _FEATURE_MACROS
                                          and _FEATURE_MACROS[f[5:]] not in macros))


def cache_key(source: str, flags: Sequence[str], version: str, linked: Sequence[str] = ()) -> str:
    """Hex sha256 over the cache format, compiler version, flags (with -march=native, what
    it means here: ``native_cpu``), source and the keys of the objects ``linked`` into it
    (each length-prefixed)."""
    native = ("\0native\0", native_cpu()) if "-march=native" in flags else ()
    h = hashlib.sha256()
    for part in (str(CACHE_FORMAT), version, *flags, *native, "\0source\0", source, "\0linked\0", *linked):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def compile_library(source: str, name_hint: str = "kernels", flags: Optional[Sequence[str]] = None,
                    cache_dir: Optional[Path] = None, objects: Sequence[tuple] = (),
                    source_opt: Sequence[str] = ()) -> CompiledLibrary:
    """Build ``source`` into a shared library (or take it from the cache) and load it.

    ``flags`` replace ``DEFAULT_FLAGS`` (extend them with ``[*DEFAULT_FLAGS, ...]``); they
    must still make a shared library. ``name_hint`` only labels the metadata and error
    messages: the same source under two names is one entry. ``objects``: (name, source) or
    (name, source, opt) of translation units compiled on their own (with ``flags`` less
    ``-shared``, their -O flag replaced by ``opt`` where given; cached) and linked into the
    library; ``source`` declares what it calls of them. ``source_opt``: the same for
    ``source`` itself, when it is compiled to an object (with ``objects``).
    Raises CompilerNotFoundError, or CompileError naming the kept source file.
    """
    flags = sanitizer_opt(DEFAULT_FLAGS if flags is None else flags)
    cc = find_compiler()
    version = compiler_version(cc)
    object_flags = _object_flags(flags)
    linked = []
    for name, src, *opt in objects:
        unit_flags = sanitizer_opt(with_opt(object_flags, opt[0] if opt else ()))
        linked.append(_Linked(name, src, unit_flags, cache_key(src, key_flags(unit_flags, cc), version)))
    own_flags = sanitizer_opt(with_opt(object_flags, source_opt)) if linked else None
    key = cache_key(source, key_flags(flags if not (linked and source_opt) else (*flags, "\0own\0", *own_flags), cc),
                    version, [unit.key for unit in linked])
    entry = _entry(cache_dir, key, ".so")

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
        if entry.output.exists() or entry.meta.exists():
            log.warning("rebuilding corrupt cache entry %s: %s", entry.output, problem)
        _remove(entry)
        _build(entry, source, name_hint, flags, cc, version, linked, cache_dir, own_flags)
        try:
            return _load(entry)
        except OSError as exc:
            raise CompileError(f"{name_hint}: {entry.output} was just built by {cc} but does not load ({exc}); "
                               f"source kept at {entry.source}") from None


def _expected_cost(source: str, flags: Sequence[str]) -> float:
    """How long gcc should take on ``source`` with ``flags``, in units of a character at -O0:
    what orders a build's units, so that a small -O3 unit does not start last and end
    after every other (SSDlite's 60 KB hot unit took 0.47 s, its 150 KB -O0 ones 0.26-0.36 s)."""
    level = next((f for f in reversed(flags) if f.startswith("-O")), "-O0")
    return len(source) * _COST_PER_CHARACTER.get(level, _COST_PER_CHARACTER["-O3"])


def _object_flags(flags: Sequence[str]) -> tuple[str, ...]:
    return (*[f for f in flags if f != "-shared"], "-c")


def with_opt(flags: Sequence[str], opt: Sequence[str]) -> tuple[str, ...]:
    """``flags`` with their -O flag replaced by ``opt`` (unchanged when ``opt`` is empty)."""
    if not opt:
        return tuple(flags)
    kept = [f for f in flags if not f.startswith("-O")]
    return (*opt, *kept)


@dataclass(frozen=True)
class _Linked:
    """An object a library links: its name (for messages), source, flags and cache key."""

    name: str
    source: str
    flags: tuple[str, ...]
    key: str


def _cache_folder(cache_dir: Optional[Path], *parts: str) -> Path:
    """The folder ``parts`` under the build cache, made if missing; an error naming the cache
    (and how to move it) where it cannot be: a read-only home in a container, a file where
    the folder should be."""
    base = Path(cache_dir if cache_dir is not None else default_cache_dir())
    directory = base.joinpath(*parts)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShapeshiftError(f"the build cache {base} cannot be used ({exc.strerror}: {exc.filename}); "
                              "set SHAPESHIFT_CACHE_DIR to a folder this process can write") from None
    return directory


def _entry(cache_dir: Optional[Path], key: str, suffix: str) -> "_Entry":
    return _Entry(_cache_folder(cache_dir, key[:2]), key, suffix)


def _cached_object(name: str, source: str, key: str, flags: tuple[str, ...], cc: str, version: str,
                   cache_dir: Optional[Path], make_headers: frozenset = frozenset()) -> Path:
    """The object file of ``source`` from the cache, built first if missing or corrupt
    (``make_headers``: see ``_header``)."""
    entry = _entry(cache_dir, key, ".o")
    if _check(entry) is None:
        return entry.output
    with _locked(entry.lock):
        problem = _check(entry)
        if problem is None:
            return entry.output
        if entry.output.exists() or entry.meta.exists():
            log.warning("rebuilding corrupt cache entry %s: %s", entry.output, problem)
        _remove(entry)
        _build(entry, source, name, flags, cc, version, cache_dir=cache_dir, make_headers=make_headers)
        return entry.output


def library_metadata(library: CompiledLibrary) -> dict:
    """The metadata of a library built by ``compile_library`` (flags, compiler, sizes; see above)."""
    return json.loads(library.path.with_suffix(".json").read_text())


def install_library(data: bytes, key: str, source: str, cache_dir: Optional[Path] = None) -> CompiledLibrary:
    """Load a library built elsewhere (a compiled artifact's) from its bytes, without a compiler.

    The bytes go to ``artifacts/<sha[:2]>/<sha>.so`` under the cache directory, named by their
    own sha256 so that one name always holds the same bytes (two processes installing it race
    harmlessly), next to the ``source`` it was built from. They are kept apart from the build
    entries: ``key`` names the build that made them elsewhere, not one made on this machine.
    The caller checks ``data`` against its own record; raises ShapeshiftError if the cache
    folder cannot be made, OSError if the library cannot be written or loaded.
    """
    digest = hashlib.sha256(data).hexdigest()
    directory = _cache_folder(cache_dir, "artifacts", digest[:2])
    so, c_file = directory / f"{digest}.so", directory / f"{digest}.c"
    for path in (so, c_file):
        discard_if_not_regular(path)
    if not c_file.exists() or c_file.read_text() != source:
        replace_file(c_file, source.encode())
    if not so.exists() or hashlib.sha256(so.read_bytes()).hexdigest() != digest:
        replace_file(so, data)
    use_openmp_defaults()
    return CompiledLibrary(path=so, source_path=c_file, key=key, cdll=ctypes.CDLL(str(so)))


def _run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run the compiler; one function so tests can count or fake invocations."""
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@dataclass(frozen=True)
class _Entry:
    directory: Path
    key: str
    suffix: str = ".so"  # or ".o"

    @property
    def output(self) -> Path:
        return self.directory / f"{self.key}{self.suffix}"

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
    what = "library" if entry.suffix == ".so" else "object"
    # Before any read: a fifo would block it, a directory fail it with IsADirectoryError.
    for path in (entry.meta, entry.output, entry.source):
        if not_regular(path):
            return f"{path.name} is not a regular file"
    try:
        meta = json.loads(entry.meta.read_text())
    except FileNotFoundError:
        return "no metadata" if entry.output.exists() else "not built"
    except (OSError, ValueError) as exc:
        return f"unreadable metadata ({exc})"
    if not isinstance(meta, dict) or meta.get("key") != entry.key:
        return "metadata is for another key"
    try:
        data = entry.output.read_bytes()
    except FileNotFoundError:
        return f"no {what}"
    if len(data) != meta.get("so_size"):
        return f"{what} is {len(data)} bytes, metadata says {meta.get('so_size')}"
    if hashlib.sha256(data).hexdigest() != meta.get("so_sha256"):
        return f"{what}'s sha256 does not match its metadata"
    if not entry.source.exists():
        return "no source"
    return None


def _load(entry: _Entry) -> CompiledLibrary:
    """The entry's library, loaded; OSError (the loader's message) if it does not load."""
    use_openmp_defaults()
    return CompiledLibrary(path=entry.output, source_path=entry.source, key=entry.key,
                           cdll=ctypes.CDLL(str(entry.output)))


def _try_load(entry: _Entry) -> Optional[CompiledLibrary]:
    try:
        return _load(entry)
    except OSError as exc:
        log.debug("cannot load %s: %s", entry.output, exc)
        return None


def _remove(entry: _Entry) -> None:
    # Metadata first: an output without metadata is never trusted, whatever happens next.
    for path in (entry.meta, entry.output):
        discard(path)
    # The build renames new files over these: not possible over a directory.
    for path in (entry.source, entry.failed_source):
        discard_if_not_regular(path)


def _build(entry: _Entry, source: str, name_hint: str, flags: tuple[str, ...], cc: str, version: str,
           linked: Sequence[_Linked] = (), cache_dir: Optional[Path] = None,
           own_flags: Optional[tuple[str, ...]] = None, make_headers: frozenset = frozenset()) -> None:
    """Compile ``source`` into ``entry``'s output. With ``linked`` objects: compile
    ``source`` to an object (with ``own_flags``) while they are fetched from the cache or
    built, all in parallel, then link everything. ``make_headers``: see ``_header``."""
    replace_file(entry.source, source.encode())
    with _scratch(entry, entry.suffix) as tmp, _scratch(entry, ".o") as own:
        if linked:
            own_flags = own_flags or _object_flags(flags)
            to_compile = [(unit.source, unit.flags) for unit in linked
                          if not _entry(cache_dir, unit.key, ".o").meta.exists()]
            make_headers = _headers_worth_making([(source, own_flags), *to_compile], version)
            own_cmd = [cc, *own_flags, str(entry.source), "-o", str(own)]
            own_header = functools.partial(_header, source, own_flags, cc, version, cache_dir, make_headers)
            jobs = [(_expected_cost(source, own_flags),
                     lambda: _compile(entry, name_hint, own_cmd, header=own_header()))]
            jobs += [(_expected_cost(unit.source, unit.flags),
                      functools.partial(_cached_object, unit.name, unit.source, unit.key, unit.flags, cc, version,
                                        cache_dir, make_headers))
                     for unit in linked]
            # Longest first: on a few cores the build ends soon after its longest unit does.
            order = sorted(range(len(jobs)), key=lambda i: -jobs[i][0])
            with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
                futures = {i: pool.submit(jobs[i][1]) for i in order}
                results = [futures[i].result() for i in range(len(jobs))]
            objects = [str(path) for path in results[1:]]
            _compile(entry, f"{name_hint} (linking)", [cc, *flags, str(own), *objects, "-o", str(tmp)],
                     keep_source=False)
        else:
            _compile(entry, name_hint, [cc, *flags, str(entry.source), "-o", str(tmp)],
                     header=_header(source, flags, cc, version, cache_dir, make_headers))
        data = tmp.read_bytes()
        from .. import __version__  # here, not at import: the package imports codegen while initialising

        meta = {
            "key": entry.key, "name_hint": name_hint,
            "so_size": len(data), "so_sha256": hashlib.sha256(data).hexdigest(),
            "flags": list(flags), "compiler": cc, "compiler_version": version,
            "shapeshift_version": __version__, "cache_format": CACHE_FORMAT,
            "linked": [unit.key for unit in linked],
        }
        replace_file(entry.meta, json.dumps(meta, indent=1).encode())
        os.replace(tmp, entry.output)
    entry.failed_source.unlink(missing_ok=True)


def _compile(entry: _Entry, name_hint: str, cmd: list[str], keep_source: bool = True,
             header: Optional[Path] = None) -> None:
    """Run ``cmd`` (with ``-include header``, a precompiled one, where given); on failure keep
    the entry's source as its .failed.c and raise CompileError."""
    if header is not None:
        proc = _run_compiler([cmd[0], "-include", str(header), *cmd[1:]])
        if proc.returncode == 0:
            return
        # gcc fails a unit over a precompiled header it cannot read (one damaged on disk)
        # instead of parsing the text: compiled again without, which also says whose fault it was.
        proc = _run_compiler(cmd)
        if proc.returncode == 0:
            log.warning("discarding the precompiled header %s.gch: %s rejected it", header, cmd[0])
            precompiled.discard(header.parent)
            return
    else:
        proc = _run_compiler(cmd)
    if proc.returncode != 0:
        if keep_source:
            os.replace(entry.source, entry.failed_source)
        raise CompileError(_compile_error_message(name_hint, cmd, proc, entry.source, entry.failed_source))


def precompile_header(flags: Sequence[str], cache_dir: Optional[Path] = None) -> Optional[Path]:
    """The precompiled header (codegen/precompiled.py) of units compiled with ``flags``
    (their -O level included), made now if missing: a warm-up, as any build that compiles
    enough units with those flags makes it. None where the compiler cannot make one."""
    cc = find_compiler()
    version = compiler_version(cc)
    flags = precompiled.header_flags(flags)
    return _header(precompiled.HEADER, flags, cc, version, cache_dir, frozenset([flags]))


def _headers_worth_making(units: Sequence[tuple[str, tuple[str, ...]]], version: str) -> frozenset:
    """The header flags (``precompiled.header_flags``) of the (source, flags) ``units`` to be
    compiled that are shared by enough of them to pay for making a precompiled header."""
    counts = Counter(precompiled.header_flags(flags) for source, flags in units
                     if precompiled.applies(source, version))
    return frozenset(flags for flags, n in counts.items() if n >= precompiled.WORTH_MAKING)


def _header(source: str, flags: Sequence[str], cc: str, version: str, cache_dir: Optional[Path],
            make_headers: frozenset = frozenset()) -> Optional[Path]:
    """The precompiled header to compile ``source`` with (codegen/precompiled.py), made first
    if its flags are in ``make_headers``; None where there is none (or
    ``SHAPESHIFT_PRECOMPILED_HEADER=0``)."""
    if os.environ.get("SHAPESHIFT_PRECOMPILED_HEADER") == "0" or not precompiled.applies(source, version):
        return None
    header_flags = precompiled.header_flags(flags)
    folder = _cache_folder(cache_dir, "headers", cache_key(precompiled.HEADER, header_flags, version))
    found = precompiled.find(folder)
    if found is None and header_flags in make_headers:
        found = precompiled.make(folder, cc, header_flags)
    return found


@contextmanager
def _scratch(entry: _Entry, suffix: str) -> Iterator[Path]:
    """A temporary file name next to ``entry``, removed afterwards whatever happens."""
    fd, name = tempfile.mkstemp(dir=entry.directory, prefix=f".{entry.key}.", suffix=f"{suffix}.tmp")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


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


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # A lock that is not a regular file cannot be one (a directory fails the open, a fifo
    # blocks it): replaced. Should two processes repair it at once, both may build the entry,
    # which the atomic renames make harmless.
    discard_if_not_regular(path)
    try:
        f = open(path, "a+b")
    except OSError as exc:
        raise ShapeshiftError(f"the build cache's lock file {path} cannot be opened ({exc.strerror}); "
                              "set SHAPESHIFT_CACHE_DIR to a folder this process can write") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
