"""all_or_none(): the outputs of one command appear together or not at all, whatever write or
rename fails; and --force's replacing_read_only() is scoped to its block."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from entmtp.core import EntmtpError
from entmtp.core._atomic import (
    all_or_none,
    atomic_write_text,
    check_writable_target,
    replacing_read_only,
)


def _files(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _fail_from(monkeypatch, name: str, call: int) -> None:
    real = getattr(os, name)
    count = [0]

    def flaky(*args, **kwargs):
        count[0] += 1
        if count[0] >= call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, flaky)


@pytest.mark.parametrize("existing", [False, True], ids=["new-targets", "one-existing"])
@pytest.mark.parametrize("failing, call", [("fsync", 1), ("fsync", 2), ("fsync", 3),
                                           ("replace", 1), ("replace", 2), ("replace", 3)])
def test_a_failing_write_or_rename_leaves_no_new_file(tmp_path, monkeypatch, failing, call,
                                                      existing):
    if existing:
        (tmp_path / "a.txt").write_text("old a")
    before = _files(tmp_path)
    _fail_from(monkeypatch, failing, call)
    with pytest.raises(EntmtpError, match="No space left"), all_or_none():
        atomic_write_text(tmp_path / "a.txt", "new a")
        atomic_write_text(tmp_path / "new" / "deeper" / "b.txt", "new b")
        atomic_write_text(tmp_path / "new" / "c.txt", "new c")
    after = _files(tmp_path)
    if existing and failing == "replace" and call > 1:
        # a.txt was renamed before the failing rename: replaced files cannot come back
        assert after == {**before, "a.txt": b"new a"}
    else:
        assert after == before


def test_nothing_appears_before_the_block_ends_then_everything(tmp_path):
    with all_or_none():
        atomic_write_text(tmp_path / "a.txt", "a")
        atomic_write_text(tmp_path / "sub" / "b.txt", "b")
        assert not (tmp_path / "a.txt").exists() and not (tmp_path / "sub" / "b.txt").exists()
    assert (tmp_path / "a.txt").read_text() == "a"
    assert (tmp_path / "sub" / "b.txt").read_text() == "b"
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == []


def test_an_error_in_the_block_writes_nothing(tmp_path):
    with pytest.raises(KeyError), all_or_none():
        atomic_write_text(tmp_path / "a.txt", "a")
        raise KeyError("the command failed after its first output")
    assert list(tmp_path.iterdir()) == []


def test_outside_a_block_writes_are_immediate_again(tmp_path):
    with pytest.raises(RuntimeError), all_or_none():
        raise RuntimeError
    atomic_write_text(tmp_path / "a.txt", "a")
    assert (tmp_path / "a.txt").read_text() == "a"


def test_replacing_read_only_is_scoped(tmp_path):
    path = tmp_path / "ro.txt"
    path.write_text("keep")
    path.chmod(0o444)
    with pytest.raises(EntmtpError, match="--force"):
        check_writable_target(path)
    with replacing_read_only():
        atomic_write_text(path, "new")
    assert path.read_text() == "new"
    path.chmod(0o444)
    with pytest.raises(EntmtpError, match="--force"):
        atomic_write_text(path, "again")
