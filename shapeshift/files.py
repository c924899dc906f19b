"""Publishing output files atomically.

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
