"""Run shapeshift's native code under AddressSanitizer and UndefinedBehaviorSanitizer.

``SHAPESHIFT_SANITIZE=1`` makes the native backend build its libraries and kernel
objects with ``codegen.build.SANITIZE_FLAGS``. Such a library cannot be loaded into an
ordinary Python: the ASan runtime must be the first library of the process, so it has
to be preloaded. This module knows how::

    python -m shapeshift.sanitize [--log-dir DIR] -- COMMAND [ARG ...]

runs COMMAND with ``SHAPESHIFT_SANITIZE=1``, ``LD_PRELOAD`` naming the compiler's
libasan (``gcc -print-file-name=libasan.so``) and the sanitizer options below; with
``--log-dir`` every report goes to a file there (``asan.<pid>`` / ``ubsan.<pid>``), which
is how bench/sanitize.py and tests/test_sanitize.py count them. A process stops at its
first report and exits with ``REPORT_EXIT_CODE``.

The VM leaves poisoned gaps between the buffers of its arena in this mode (see
runtime/vm.py): without them a kernel writing past its output would land in the next
buffer of the same allocation, which ASan cannot see.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .errors import ShapeshiftError

#: The exit status of a process stopped by a sanitizer report (not 1: an ordinary error).
REPORT_EXIT_CODE = 86

#: Python allocates for good at exit by design, and CPython, numpy and onnxruntime are not
#: built with ASan: leak reports would all be theirs. The link-order check is what preloading
#: satisfies; it is off so that a child that drops LD_PRELOAD says why at the first load.
ASAN_OPTIONS = ("detect_leaks=0", "halt_on_error=1", "abort_on_error=0", f"exitcode={REPORT_EXIT_CODE}",
                "allocator_may_return_null=1", "handle_segv=1", "symbolize=1")
UBSAN_OPTIONS = ("print_stacktrace=1", "halt_on_error=1", f"exitcode={REPORT_EXIT_CODE}")


@functools.lru_cache(maxsize=None)
def runtime_library() -> Path:
    """The ASan runtime of the compiler the native backend uses."""
    from .codegen.build import find_compiler

    cc = find_compiler()
    proc = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    path = Path(proc.stdout.strip())
    if proc.returncode != 0 or not path.is_absolute() or not path.exists():
        raise ShapeshiftError(f"{cc} has no AddressSanitizer runtime (`{cc} -print-file-name=libasan.so` "
                              f"gave {proc.stdout.strip()!r}); install libasan (Debian: libgcc-12-dev)")
    return path.resolve()


def runtime_loaded() -> bool:
    """Whether the ASan runtime is part of this process (preloaded)."""
    return hasattr(ctypes.CDLL(None), "__asan_init")


def require_runtime() -> None:
    """Raise a ShapeshiftError saying how to run sanitized, unless the ASan runtime is loaded."""
    if not runtime_loaded():
        raise ShapeshiftError(
            "SHAPESHIFT_SANITIZE is set but the AddressSanitizer runtime is not loaded: a sanitized library "
            "would end the process when loaded. Run the command as `python -m shapeshift.sanitize -- COMMAND` "
            f"(it preloads {_runtime_hint()}), or unset SHAPESHIFT_SANITIZE")


def _runtime_hint() -> str:
    try:
        return str(runtime_library())
    except ShapeshiftError:
        return "libasan"


def environment(base: Optional[Mapping[str, str]] = None, log_dir: Optional[Path] = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with what a sanitized run needs."""
    env = dict(os.environ if base is None else base)
    runtime = str(runtime_library())
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != runtime]
    env["LD_PRELOAD"] = ":".join([runtime, *preload])  # the runtime must come first
    asan, ubsan = list(ASAN_OPTIONS), list(UBSAN_OPTIONS)
    if log_dir is not None:
        log_dir = Path(log_dir).resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        asan.append(f"log_path={log_dir / 'asan'}")
        ubsan.append(f"log_path={log_dir / 'ubsan'}")
    # The user's own options go last: the sanitizers let a later option win.
    env["ASAN_OPTIONS"] = ":".join(filter(None, [*asan, env.get("ASAN_OPTIONS", "")]))
    env["UBSAN_OPTIONS"] = ":".join(filter(None, [*ubsan, env.get("UBSAN_OPTIONS", "")]))
    env["SHAPESHIFT_SANITIZE"] = "1"
    return env


def reports(log_dir: Path) -> list[Path]:
    """The report files the sanitizers wrote under ``log_dir`` (one per process that reported)."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        return []
    return sorted(p for p in log_dir.iterdir() if p.name.startswith(("asan.", "ubsan.")))


# -- poisoning: what the VM uses to fence the buffers of one allocation --------------------


def poison(address: int, size: int) -> None:
    """Mark ``size`` bytes at ``address`` unaddressable: an access there is a report."""
    if size > 0:
        _api().__asan_poison_memory_region(ctypes.c_void_p(address), ctypes.c_size_t(size))


def unpoison(address: int, size: int) -> None:
    if size > 0:
        _api().__asan_unpoison_memory_region(ctypes.c_void_p(address), ctypes.c_size_t(size))


@functools.lru_cache(maxsize=None)
def _api() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shapeshift.sanitize", description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", type=Path, help="write each report to a file in this folder")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: python -m shapeshift.sanitize -- COMMAND [ARG ...]")
    try:
        env = environment(log_dir=args.log_dir)
    except ShapeshiftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"error: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main()
