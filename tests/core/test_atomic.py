"""Atomic writes: readers see the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import stat

import pytest

from entmtp.core import atomic_write, atomic_write_json


def test_written_file_has_plain_open_permissions(tmp_path):
    path = atomic_write_json(tmp_path / "x.json", {"a": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def explode(handle):
        handle.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, explode)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
