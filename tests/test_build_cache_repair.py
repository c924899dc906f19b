"""Build-cache entries that are not regular files (issue 30, item 6): a directory, a symlink or
a fifo where the cache keeps a library, an object, their metadata, source or lock is
removed and the entry rebuilt; before, a directory failed every later build with
IsADirectoryError and a fifo blocked it for good."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from shapeshift.codegen import build
from shapeshift.codegen.build import compile_library, install_library
from shapeshift.files import not_regular

from .test_codegen_build import ADD_SOURCE, TWICE_OBJECT, _caller, _objects, call_add, copy_cache

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("SHAPESHIFT_CC"),
    reason="no C compiler on this machine")

KINDS = ["directory", "symlink", "fifo"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("SHAPESHIFT_CC", raising=False)
    monkeypatch.delenv("SHAPESHIFT_CACHE_DIR", raising=False)


def _damage(path: Path, kind: str) -> None:
    """Put a ``kind`` where the file ``path`` is: a directory with a file in it, a symlink to
    a copy of the file (right bytes, still not the cache's own), or a fifo."""
    keep = path.with_name("elsewhere" + path.suffix)
    if path.exists():
        shutil.copyfile(path, keep)
        path.unlink()
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_text("x")
    elif kind == "symlink":
        path.symlink_to(keep if keep.exists() else path.with_name("nowhere"))
    else:
        os.mkfifo(path)


def _within(seconds: float, fn):
    """``fn()``'s value; fails rather than hangs if it blocks (on a fifo, say)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("part", [".so", ".json", ".c", ".lock"])
def test_a_library_entry_that_is_not_a_file_is_rebuilt(tmp_path, kind, part):
    good = compile_library(ADD_SOURCE, cache_dir=tmp_path / "a")
    copy_cache(tmp_path / "a", tmp_path / "b")
    entry = tmp_path / "b" / good.key[:2] / f"{good.key}{part}"
    if part == ".lock":
        # The lock is taken only to build: the entry must need a build for it to matter.
        entry.with_suffix(".so").unlink()
        entry.touch()
    _damage(entry, kind)
    lib = _within(60, lambda: compile_library(ADD_SOURCE, cache_dir=tmp_path / "b"))
    assert call_add(lib, 20, 22) == 42
    for suffix in (".so", ".json", ".c", ".lock"):
        assert not not_regular(entry.with_suffix(suffix)), suffix
    # And now it is a plain hit.
    assert compile_library(ADD_SOURCE, cache_dir=tmp_path / "b").path == lib.path


@pytest.mark.parametrize("kind", KINDS)
def test_an_object_entry_that_is_not_a_file_is_rebuilt(tmp_path, kind):
    compile_library(_caller(0), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT)])
    (obj,) = _objects(tmp_path)
    _damage(obj, kind)
    # A new caller, so that its library is built and links the object again.
    lib = _within(60, lambda: compile_library(_caller(7), cache_dir=tmp_path, objects=[("twice", TWICE_OBJECT)]))
    assert call_add(lib, 1, 1) == 10 and not not_regular(obj)


@pytest.mark.parametrize("kind", KINDS)
def test_an_installed_artifact_library_that_is_not_a_file_is_replaced(tmp_path, kind):
    good = compile_library(ADD_SOURCE, cache_dir=tmp_path / "a")
    data = good.path.read_bytes()
    first = install_library(data, good.key, ADD_SOURCE, cache_dir=tmp_path / "b")
    path = first.path
    # A fresh path for the loader (it keeps a handle per path): install into a copy.
    copy_cache(tmp_path / "b", tmp_path / "c")
    moved = tmp_path / "c" / path.relative_to(tmp_path / "b")
    _damage(moved, kind)
    _damage(moved.with_suffix(".c"), "directory")
    lib = _within(60, lambda: install_library(data, good.key, ADD_SOURCE, cache_dir=tmp_path / "c"))
    assert call_add(lib, 2, 3) == 5 and moved.read_bytes() == data


@pytest.mark.parametrize("kind", KINDS)
def test_a_target_calibration_cache_that_is_not_a_file_is_measured_again_and_replaced(tmp_path, kind):
    from shapeshift.target import calibrate, host_target

    target = host_target()
    first = calibrate.measure_fma(target, cache_dir=tmp_path)
    (cached,) = (tmp_path / "target").glob("fma-*.json")
    _damage(cached, kind)
    again = _within(120, lambda: calibrate.measure_fma(target, cache_dir=tmp_path))
    assert again.target_key == first.target_key and not not_regular(cached)


def test_lookups_never_open_what_is_not_a_regular_file(tmp_path, monkeypatch):
    """The check happens before any read: a fifo at the metadata makes it say so, not block."""
    good = compile_library(ADD_SOURCE, cache_dir=tmp_path)
    entry = build._Entry(good.path.parent, good.key)
    _damage(entry.meta, "fifo")
    assert _within(10, lambda: build._check(entry)) == f"{good.key}.json is not a regular file"
