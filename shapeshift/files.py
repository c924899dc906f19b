"""Publishing output files atomically, to a path checked first.

A file is written under a temporary name in its target's folder, then renamed over the
target: a reader, or a process killed halfway, sees the old file or the new one, never
part of one. ``tempfile.mkstemp`` makes the temporary file private (0600); a published
file gets the mode a plain ``open()`` would have given it instead (0666 less the umask),
so a simplified model or a compiled artifact can be read by whoever the user lets read
their other files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from .errors import ShapeshiftError

PathLike = Union[str, os.PathLike]


def new_file_mode() -> int:
    """0666 less the process umask. Python can only read the umask by setting it: for that
    instant it is 022 (a common default, not 0), should another thread create a file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def publish(tmp: PathLike, path: PathLike) -> None:
    """Give the finished temporary file ``tmp`` a new file's mode and rename it to ``path``."""
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, Path(path))


def output_target(path: PathLike, what: str = "output") -> Path:
    """The file an output written to ``path`` goes to: a symlink's target (the rename
    would replace the link), never a directory or a device (run as root, a rename over
    /dev/null made it a regular file); its folder is made if missing."""
    if not str(path):
        raise ShapeshiftError(f"the {what} path is empty")
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        kind = "a directory" if target.is_dir() else "not a regular file (a device, a pipe or a socket)"
        raise ShapeshiftError(f"{path}: the {what} is {kind}; name a file to write")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShapeshiftError(f"{path}: cannot make its folder {target.parent} ({exc.strerror})") from None
    return target
