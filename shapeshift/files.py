"""Publishing output files atomically, to a path checked first.

A file is written under a temporary name in its target's folder, then renamed over the
target: a reader, or a process killed halfway, sees the old file or the new one, never
part of one. ``tempfile.mkstemp`` makes the temporary file private (0600); a published
file gets the mode a plain ``open()`` would have given it instead (0666 less the umask),
so a simplified model or a compiled artifact can be read by whoever the user lets read
their other files.

A rename alone is atomic for processes, not across a power cut: the file system may write
the new name to disk before the file's data (ext4 with delalloc, XFS), leaving an empty or
partial file under the final name. So ``publish`` fsyncs the file before the rename and its
folder after it (the rename is durable only once the folder is). The build cache
(codegen/build.py) renames without fsync: it checks every entry against the sha256 in its
metadata before use, and rebuilds one a crash left damaged.

Also here: ``discard_if_not_regular``, for caches that find a directory, a symlink or a fifo
where they keep a file.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Union

from .errors import ShapeshiftError

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]


def new_file_mode() -> int:
    """0666 less the process umask. Python can only read the umask by setting it: for that
    instant it is 022 (a common default, not 0), should another thread create a file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def fsync_path(path: PathLike, directory: bool = False) -> None:
    """fsync the file or folder at ``path`` (its data and inode; a folder's, its entries)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: PathLike, path: PathLike) -> None:
    """Give the finished (written and closed) temporary file ``tmp`` a new file's mode and
    rename it to ``path``, durably: the file is on disk before the rename, the rename once
    this returns."""
    os.chmod(tmp, new_file_mode())
    fsync_path(tmp)
    os.replace(tmp, Path(path))
    fsync_path(Path(path).parent, directory=True)


def replace_file(path: PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``: other
    processes see the old file or the new one. Not durable across a power cut (no fsync):
    for caches, which check what they read and rebuild what a crash damaged."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def not_regular(path: PathLike) -> bool:
    """Whether something other than a regular file is at ``path`` (a symlink counts, not
    what it points to)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def discard(path: PathLike) -> None:
    """Remove whatever is at ``path``: a file, a symlink (not its target), a directory tree."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):  # gone, or made a file, by another process meanwhile
        pass


def discard_if_not_regular(path: PathLike) -> None:
    """Remove a directory, symlink, fifo, ... where a cache keeps a file (what it finds
    there would fail or block every read, and every rename over it)."""
    if not_regular(path):
        log.warning("removing %s: a cache file was expected there", path)
        discard(path)
