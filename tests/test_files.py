"""Atomic, durable publishing of output files (shapeshift/files.py; issue 30, item 6): the
file is fsynced before the rename and its folder after it, so that a power cut leaves the
old file or the whole new one, never an empty file under the new name."""

from __future__ import annotations

import os

from shapeshift import files


def test_publish_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    tmp, out = tmp_path / ".out.tmp", tmp_path / "out.bin"
    tmp.write_bytes(b"new contents")
    files.publish(tmp, out)
    assert events == [("fsync", str(tmp)), ("rename", str(tmp), str(out)), ("fsync", str(tmp_path))]
    assert out.read_bytes() == b"new contents" and not tmp.exists()


def test_an_artifact_and_a_simplified_model_are_published_durably(tmp_path, monkeypatch):
    """The writers go through ``publish``: their renames are fsynced too."""
    from shapeshift.runtime.artifact import write_container

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                        real_fsync(fd))[1])
    out = tmp_path / "a.ssa"
    write_container(out, {"what": "test"}, {"data": b"1234"})
    assert synced[-1] == str(tmp_path) and len(synced) == 2
