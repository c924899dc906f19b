"""Compiled artifacts: one file that runs a model on the native backend without a C compiler.

``shapeshift compile MODEL -o OUT`` (or ``shapeshift.compile(model, out)``) writes one;
``InferenceSession(OUT)`` loads it. The file holds the model, the shared library compiled
from its program, and what is needed to trust that library here. Loading rebuilds the
Program in Python (import, simplify, build_program: deterministic), checks that its C
source hashes to the recorded sha256, and loads the recorded library instead of compiling
that source: the program gives the VM its steps, slots and constants, the library its code.

Format, version 1 (``FORMAT_VERSION``)::

    SHAPESHIFT-ARTIFACT/1 <header size> <header sha256>\\n   magic line, ASCII, decimal size, hex digest
    <header>                                               UTF-8 JSON object, <header size> bytes
    <section><section>...                                  back to back, in the header's order

The header holds ``sections`` (a list of ``{"name", "size", "sha256"}``; the sections are
``model``, the ONNX model as serialized bytes, and ``library``, the shared library, absent
when the program has no compiled code) and ``shapeshift_version``, ``graph`` (its name),
``dynamic`` (``{symbol: [lo, hi]}``, the ranges it was compiled for), ``source_sha256``
(of the generated C source), ``library_key`` (the build cache key), ``flags``,
``compiler``, ``compiler_version``, ``machine`` (``platform.machine()``) and
``target`` (the target description it was built for, shapeshift.target: name, -march,
flags, caches and CPU identity; loading rebuilds the program for it, so the same default
schedules), ``cpu_features`` (what the library may use: the build host's instruction set
extensions, from /proc/cpuinfo, for ``--target native``, built with ``-march=native``; a
psABI level's features for ``--target x86-64-v3`` or ``x86-64-v4``), and ``tuning`` (the tuned
GEMM records the program was built with and uses, as ``TunedGemm.to_json()``; absent without any), so
that loading rebuilds the same program without the tuning database.

A model the native backend builds in program versions (runtime/versions.py: Ifs decided by
the input shapes or by small inputs' values, silero_vad's sample rate) has, instead of
``source_sha256``, ``library_key`` and the ``library`` section, ``guards`` (the If names, in
order) and ``versions``: per version, in the order build_versions makes them, its
``outcome`` (one true, false or null per guard), ``source_sha256``, and ``section`` and
``library_key`` (its library ``library.<i>``; absent without compiled code). Loading builds
the versions again from the model and checks each one's source.

A file is used only if its header and every section match their sha256 and the file has
exactly the announced length, it was written by this shapeshift version, this machine has
the same architecture and every recorded CPU feature, and the rebuilt source matches;
otherwise ArtifactError says which, naming the file. The file is written to a temporary
name next to OUT and moved into place, so OUT is never half-written.

The library is installed under the build cache directory (``artifacts/``, named by its
sha256; see ``codegen.build.install_library``) and loaded from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

from ..errors import ArtifactError, ShapeshiftError
from ..files import publish
from ..frontend.onnx_import import ModelSource, import_model, read_model

MAGIC = b"SHAPESHIFT-ARTIFACT/"
FORMAT_VERSION = 1
# The magic line is short; a longer first line is not ours.
MAX_MAGIC_LINE = 256
CPUINFO = Path("/proc/cpuinfo")
# x86 extensions -march=native can make the compiler use (names as /proc/cpuinfo spells them).
# Other architectures record every listed feature: their lists are instruction sets only.
X86_FEATURES = frozenset("""
    sse sse2 sse3 pni ssse3 sse4_1 sse4_2 sse4a popcnt abm lzcnt movbe aes pclmulqdq
    avx avx2 fma fma4 f16c bmi1 bmi2 adx rdrand rdrnd rdseed sha_ni gfni vaes vpclmulqdq
    avx_vnni avx_vnni_int8 avx_ifma avx_ne_convert
    avx512f avx512cd avx512bw avx512dq avx512vl avx512ifma avx512vbmi avx512_vbmi2
    avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 avx512_vp2intersect
    amx_tile amx_int8 amx_bf16 amx_fp16
""".split())

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Artifact:
    """A verified artifact read from ``path``: its header and its sections' bytes."""

    path: Path
    header: dict
    sections: dict  # name -> bytes

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def dynamic(self) -> dict[str, tuple[int, int]]:
        return {name: (int(lo), int(hi)) for name, (lo, hi) in self.header.get("dynamic", {}).items()}


# -- the container -------------------------------------------------------------------------


def is_artifact(source) -> bool:
    """Whether ``source`` is the path of a file starting with the artifact magic."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    try:
        with open(source, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:  # missing, a directory, unreadable: not an artifact; the ONNX loader says why
        return False


def write_container(out: PathLike, header: dict, sections: Mapping[str, bytes]) -> int:
    """Write ``header`` (plus each section's size and sha256) and ``sections`` to ``out``
    atomically; returns the file's size. Low level: ``write_artifact`` fills the header."""
    header = dict(header, sections=[{"name": name, "size": len(data), "sha256": _sha256(data)}
                                    for name, data in sections.items()])
    head = json.dumps(header, indent=1, sort_keys=True).encode()
    magic_line = MAGIC + f"{FORMAT_VERSION} {len(head)} {_sha256(head)}\n".encode()
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (magic_line, head, *sections.values()):
                f.write(part)
        publish(tmp, out)  # readable as any new file (mkstemp's is private): artifacts are shipped
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.stat().st_size


def read_container(path: PathLike) -> tuple[dict, dict]:
    """``(header, sections)`` of the artifact at ``path``, every length and checksum verified."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read the artifact ({exc.strerror or exc})") from None
    head_size, head_sha, start = _parse_magic_line(path, data)
    head = data[start:start + head_size]
    if len(head) != head_size:
        raise ArtifactError(f"{path}: truncated artifact: the header is cut short "
                            f"(file is {len(data)} bytes)")
    if _sha256(head) != head_sha:
        raise ArtifactError(f"{path}: corrupt artifact: the header does not match its sha256")
    header = _parse_header(path, head)
    sections = _split_sections(path, data, start + head_size, header["sections"])
    return header, sections


def _parse_magic_line(path: Path, data: bytes) -> tuple[int, str, int]:
    end = data.find(b"\n", 0, MAX_MAGIC_LINE)
    if not data.startswith(MAGIC) or end < 0:
        raise ArtifactError(f"{path}: truncated or corrupt artifact: no complete magic line")
    fields = data[len(MAGIC):end].decode("ascii", "replace").split()
    if not fields or fields[0] != str(FORMAT_VERSION):
        version = fields[0] if fields else "?"
        raise ArtifactError(f"{path}: artifact format {version}, this shapeshift reads format {FORMAT_VERSION}; "
                            "recompile it with `shapeshift compile`")
    if len(fields) != 3 or not fields[1].isdigit():
        raise ArtifactError(f"{path}: corrupt artifact: malformed magic line")
    return int(fields[1]), fields[2], end + 1


def _parse_header(path: Path, head: bytes) -> dict:
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise ArtifactError(f"{path}: corrupt artifact: the header is not JSON ({exc})") from None
    sections = header.get("sections") if isinstance(header, dict) else None
    if not isinstance(sections, list) or not all(
            isinstance(s, dict) and isinstance(s.get("size"), int) and s["size"] >= 0 for s in sections):
        raise ArtifactError(f"{path}: corrupt artifact: the header lists no valid sections")
    return header


def _split_sections(path: Path, data: bytes, offset: int, entries: list) -> dict:
    expected = offset + sum(s["size"] for s in entries)
    if len(data) < expected:
        raise ArtifactError(f"{path}: truncated artifact: {len(data)} bytes, its header announces {expected}")
    if len(data) > expected:
        raise ArtifactError(f"{path}: corrupt artifact: {len(data) - expected} bytes after its last section")
    sections = {}
    for entry in entries:
        chunk = data[offset:offset + entry["size"]]
        offset += entry["size"]
        if _sha256(chunk) != entry.get("sha256"):
            raise ArtifactError(f"{path}: corrupt artifact: section {entry.get('name')!r} does not match its sha256")
        sections[entry.get("name")] = chunk
    return sections


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- CPU features --------------------------------------------------------------------------


def host_cpu_features(cpuinfo: Path = CPUINFO) -> Optional[list[str]]:
    """This machine's instruction set extensions (sorted), or None if /proc/cpuinfo cannot say."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):  # x86 | ARM
            listed = set(value.split())
            return sorted(listed & X86_FEATURES if key.strip() == "flags" else listed)
    return None


def _check_machine(path: Path, header: dict) -> None:
    machine = platform.machine()
    if header.get("machine") != machine:
        raise ArtifactError(f"{path}: compiled for a {header.get('machine')} machine, this one is {machine}")
    needed = header.get("cpu_features") or []
    have = host_cpu_features()
    if have is None:
        raise ArtifactError(f"{path}: cannot read this machine's CPU features from {CPUINFO}, so cannot check "
                            f"that it has those the library needs ({', '.join(needed)})")
    missing = sorted(set(needed) - set(have))
    if missing:
        raise ArtifactError(f"{path}: its library needs CPU feature(s) this machine lacks: {', '.join(missing)}; "
                            "compile the model on (or for) this machine")


# -- artifacts -----------------------------------------------------------------------------


def read_artifact(path: PathLike) -> Artifact:
    """Read and verify the artifact at ``path``: checksums, shapeshift version, machine, CPU."""
    from .. import __version__  # here: the package imports the runtime while initialising

    path = Path(path)
    header, sections = read_container(path)
    version = header.get("shapeshift_version")
    if version != __version__:
        raise ArtifactError(f"{path}: built by shapeshift {version}, this is shapeshift {__version__}; "
                            "recompile it with `shapeshift compile`")
    if "model" not in sections:
        raise ArtifactError(f"{path}: corrupt artifact: no model section")
    _check_machine(path, header)
    return Artifact(path, header, sections)


def write_artifact(model: ModelSource, out: PathLike, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
                   cache_dir: Optional[PathLike] = None, tuning=None, target=None) -> Artifact:
    """Compile ``model`` for the native backend and write the artifact ``out``; returns it.
    ``target``: the shapeshift.target.Target to build for (None: this machine); an
    artifact for a named level needs only that level's CPU features.

    The model is stored serialized as imported (external data included), and the program
    is built from exactly those bytes, so that loading rebuilds the same source.
    """
    from .. import __version__
    from .native import create_executor  # the C build machinery, only when compiling
    from .versions import VersionedExecutor

    ranges = _normalize_dynamic(dynamic)
    try:
        model_bytes = read_model(model).SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GiB
        label = model if isinstance(model, (str, os.PathLike)) else "the model"
        raise ArtifactError(f"{label}: cannot serialize the model into an artifact ({exc})") from None
    graph = import_model(model_bytes, ranges)
    from ..target import host_target
    from ..target.description import target_to_json

    built_for = target or host_target()
    executor = create_executor(graph, lambda: import_model(model_bytes, ranges), cache_dir=cache_dir, tuning=tuning,
                               target=built_for)
    header = {
        "shapeshift_version": __version__, "graph": graph.name,
        "dynamic": {name: list(bounds) for name, bounds in sorted(ranges.items())},
        "machine": platform.machine(), "target": target_to_json(built_for),
        "cpu_features": (host_cpu_features() or []) if built_for.name == "native"
        else sorted(built_for.flags & X86_FEATURES),
    }
    sections = {"model": model_bytes}
    if isinstance(executor, VersionedExecutor):
        versions = list(executor.versions.items())  # in build_versions' order, which loading repeats
        header["guards"] = [g.name for g in executor.guards]
        header["versions"] = []
        for i, (outcome, version) in enumerate(versions):
            entry = {"outcome": list(outcome), "source_sha256": _sha256(version.program.full_source().encode())}
            if version.vm.library is not None:
                entry.update(section=f"library.{i}", library_key=version.vm.library.key)
                sections[f"library.{i}"] = version.vm.library.path.read_bytes()
            header["versions"].append(entry)
        programs, libraries = [v.program for _, v in versions], [v.vm.library for _, v in versions]
    else:
        header["source_sha256"] = _sha256(executor.program.full_source().encode())
        if executor.vm.library is not None:
            header["library_key"] = executor.vm.library.key
            sections["library"] = executor.vm.library.path.read_bytes()
        programs, libraries = [executor.program], [executor.vm.library]
    built = next((lib for lib in libraries if lib is not None), None)
    if built is not None:
        header.update(_library_header(built))
    if tuning is not None:
        # Only the records the programs use: the others do not change their source.
        used = set().union(*(p.tuned_names() for p in programs))
        records = [t.to_json() for t in tuning if t.name in used]
        if records:
            header["tuning"] = records
    write_container(out, header, sections)
    return read_artifact(out)


def _library_header(library) -> dict:
    from ..codegen.build import library_metadata

    meta = library_metadata(library)
    return {"flags": meta.get("flags"), "compiler": meta.get("compiler"),
            "compiler_version": meta.get("compiler_version")}


def load_artifact(path: PathLike, dynamic: Optional[Mapping[str, tuple[int, int]]] = None,
                  num_threads: Optional[int] = None, cache_dir: Optional[PathLike] = None):
    """``(graph, executor)`` for the artifact at ``path``, without compiling anything: a
    NativeExecutor, or a VersionedExecutor when the model was compiled in program versions
    (runtime/versions.py; the header's ``guards`` and ``versions``, one library section each).

    ``dynamic``, if given, must equal the ranges the artifact was compiled for (the library
    was built for those; other ranges need another ``shapeshift compile``).
    """
    from .native import NativeExecutor, prepare_program

    artifact = read_artifact(path)
    _check_dynamic(artifact, dynamic)
    tuning = _tuning(artifact)
    try:
        graph = import_model(artifact.sections["model"], artifact.dynamic)
        program = prepare_program(graph, tuning, target=_target(artifact))
    except ShapeshiftError as exc:
        raise ArtifactError(f"{artifact.path}: its model no longer builds a program: {exc}") from None
    if "versions" in artifact.header:
        return graph, _load_versions(artifact, graph, program, tuning, num_threads, cache_dir, _target(artifact))
    _check_source(artifact, program.full_source(), artifact.header.get("source_sha256"))
    library = _install_library(artifact, program, cache_dir, "library", artifact.header.get("library_key"))
    return graph, NativeExecutor(graph, num_threads=num_threads, program=program, library=library)


def _target(artifact: Artifact):
    """The target the artifact was built for (its default schedules and -march)."""
    from ..target.description import target_from_json

    data = artifact.header.get("target")
    return target_from_json(data) if data is not None else None


def _load_versions(artifact: Artifact, graph, program, tuning, num_threads, cache_dir, target):
    """The VersionedExecutor the artifact's versions make: built again from its model the way
    compiling built them, each version's source checked and its library installed."""
    from .native import NativeExecutor, prepare_program
    from .versions import build_versions

    entries = artifact.header["versions"]

    def reimport():
        return import_model(artifact.sections["model"], artifact.dynamic)

    def make_executors(versions: list) -> list:
        if len(versions) != len(entries):
            raise ArtifactError(f"{artifact.path}: its model now gives {len(versions)} program versions, the "
                                f"artifact holds {len(entries)}; recompile it")
        made = []
        for entry, (version_graph, version_program) in zip(entries, versions):
            _check_source(artifact, version_program.full_source(), entry.get("source_sha256"))
            library = _install_library(artifact, version_program, cache_dir, entry.get("section"),
                                       entry.get("library_key"))
            made.append(NativeExecutor(version_graph, num_threads=num_threads, program=version_program,
                                       library=library))
        return made

    try:
        versioned = build_versions(graph, sum(program.fallback_ops().values()), reimport,
                                   lambda g: prepare_program(g, tuning, target=target), make_executors)
    except ArtifactError:
        raise
    except ShapeshiftError as exc:
        raise ArtifactError(f"{artifact.path}: its model no longer builds its program versions: {exc}") from None
    if versioned is None or [g.name for g in versioned.guards] != artifact.header.get("guards"):
        raise ArtifactError(f"{artifact.path}: the program versions rebuilt from its model differ from the "
                            "compiled ones; recompile it")
    return versioned


def _tuning(artifact: Artifact):
    records = artifact.header.get("tuning")
    if not records:
        return None
    from ..tune.records import GemmTuning

    try:
        return GemmTuning.from_json(records, str(artifact.path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{artifact.path}: its tuning records cannot be read: {exc}") from None


def _normalize_dynamic(dynamic: Optional[Mapping[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    from ..frontend.onnx_import import symbol_ranges

    return symbol_ranges(dynamic)


def _check_dynamic(artifact: Artifact, dynamic: Optional[Mapping[str, tuple[int, int]]]) -> None:
    given = _normalize_dynamic(dynamic)
    if given and given != artifact.dynamic:
        def show(ranges):
            return ", ".join(f"{k}={lo}:{hi}" for k, (lo, hi) in sorted(ranges.items())) or "none"
        raise ArtifactError(f"{artifact.path}: compiled for dynamic ranges {show(artifact.dynamic)}, "
                            f"not {show(given)}; omit dynamic= or recompile with the new ranges")


def _check_source(artifact: Artifact, source: str, recorded: Optional[str]) -> None:
    # Equal sources mean equal programs: the steps, slots and extents the library's code
    # indexes are the ones this process just built.
    rebuilt = _sha256(source.encode())
    if rebuilt != recorded:
        raise ArtifactError(
            f"{artifact.path}: the program rebuilt from its model differs from the compiled one (source sha256 "
            f"{rebuilt[:16]}..., recorded {str(recorded)[:16]}...): it was made by a different build of "
            f"shapeshift {artifact.header.get('shapeshift_version')}; recompile it")


def _install_library(artifact: Artifact, program, cache_dir: Optional[PathLike], section: Optional[str],
                     key: Optional[str]):
    """The library of section ``section`` (None: the program has no library), installed as ``key``."""
    from ..codegen.build import install_library

    data = artifact.sections.get(section) if section else None
    if data is None:
        if program.has_code():
            # Without this the VM would quietly compile the program: an artifact never does.
            raise ArtifactError(f"{artifact.path}: corrupt artifact: its program has compiled code "
                                f"but it holds no {section or 'library'} section")
        return None
    try:
        return install_library(data, str(key), program.full_source(),
                               Path(cache_dir) if cache_dir is not None else None)
    except OSError as exc:
        raise ArtifactError(f"{artifact.path}: cannot install or load its library ({exc}); "
                            "check that the cache directory ($SHAPESHIFT_CACHE_DIR) is writable") from None
