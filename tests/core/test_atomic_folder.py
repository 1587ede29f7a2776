"""atomic_write_folder(): a folder is built under a temporary name and swapped into place, so its
name shows the old folder or the whole new one; whatever step fails, the old folder stays and
nothing is left beside it."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from entmtp.core import (
    EntmtpError,
    all_or_none,
    atomic_write_folder,
    atomic_write_text,
    replacing_read_only,
)

OLD = {"a.txt": b"old a", "sub": None, "sub/b.txt": b"old b"}
NEW = {"a.txt": b"new a", "c.bin": b"\x00new c", "deep": None, "deep/er": None,
       "deep/er/d.txt": b"new d"}


def _tree(root: Path) -> dict[str, bytes | None] | None:
    """Relative path -> bytes (None for a folder) under ``root``; None when it is absent."""
    if not root.exists():
        return None
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def _make(root: Path, tree: dict[str, bytes | None]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in tree.items():
        if data is None:
            (root / name).mkdir(parents=True, exist_ok=True)
        else:
            (root / name).write_bytes(data)


def _build_new(staging: Path) -> None:
    _make(staging, NEW)


def _fail_once(monkeypatch, module, name: str, call: int, error: BaseException) -> None:
    """``module.name`` raises ``error`` on its ``call``-th call only."""
    real = getattr(module, name)
    count = [0]

    def flaky(*args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_new_folder_appears_whole_with_plain_permissions(tmp_path):
    def build(staging: Path) -> None:
        _build_new(staging)
        (staging / "c.bin").chmod(0o600)  # as some writers make their files
        (staging / "deep" / "er").chmod(0o700)

    target = atomic_write_folder(tmp_path / "out", build)
    assert target == tmp_path / "out"
    assert _tree(target) == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    mask = _umask()
    for path in [target, *target.rglob("*")]:
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_an_old_folder_is_replaced_and_nothing_is_left_beside_it(tmp_path):
    _make(tmp_path / "out", OLD)
    atomic_write_folder(tmp_path / "out", _build_new)
    assert _tree(tmp_path / "out") == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_missing_parents_are_made(tmp_path):
    atomic_write_folder(tmp_path / "a" / "b" / "out", _build_new)
    assert _tree(tmp_path / "a" / "b" / "out") == NEW


def test_the_name_never_shows_a_partial_folder(tmp_path, monkeypatch):
    """Seen at every rename and inside the build: the old folder, nothing (between the two
    renames of a replacement) or the whole new one."""
    target = tmp_path / "out"
    _make(target, OLD)
    seen: list = []
    for name in ("replace", "rename"):
        real = getattr(os, name)

        def watched(*args, _real=real, **kwargs):
            seen.append(_tree(target))
            result = _real(*args, **kwargs)
            seen.append(_tree(target))
            return result

        monkeypatch.setattr(os, name, watched)

    def build(staging: Path) -> None:
        for name, data in NEW.items():
            seen.append(_tree(target))
            _make(staging, {name: data})

    atomic_write_folder(target, build)
    assert seen and all(state in (OLD, None, NEW) for state in seen)
    assert seen[-1] == NEW and _tree(target) == NEW


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "old-folder"])
@pytest.mark.parametrize("module, name, call", [
    (tempfile, "mkdtemp", 1), (tempfile, "mkdtemp", 2), (os, "fsync", 1), (os, "fsync", 3),
    (os, "chmod", 1), (os, "chmod", 4), (os, "replace", 1), (os, "replace", 2),
    (os, "open", 2)])
def test_a_failing_step_leaves_the_old_folder_and_nothing_else(tmp_path, monkeypatch, existing,
                                                               module, name, call):
    if existing:
        _make(tmp_path / "out", OLD)
    before = _tree(tmp_path)
    _fail_once(monkeypatch, module, name, call, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    try:
        atomic_write_folder(tmp_path / "out", _build_new, prefix="cannot write the thing",
                            option="--out")
    except EntmtpError as err:
        message = str(err)
        assert message.startswith("cannot write the thing: No space left on device")
        assert "--out" in message and "\n" not in message
        assert _tree(tmp_path) == before
    else:  # the failing call came after the last one this case makes
        assert _tree(tmp_path / "out") == NEW
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "old-folder"])
@pytest.mark.parametrize("error", [RuntimeError("boom"), OSError(errno.ENOSPC, "No space"),
                                   KeyboardInterrupt()], ids=["error", "os-error", "interrupt"])
@pytest.mark.parametrize("after", [0, 1, 4], ids=lambda n: f"after-{n}-entries")
def test_an_interrupted_build_leaves_the_old_folder_and_raises_its_error(tmp_path, existing,
                                                                         error, after):
    if existing:
        _make(tmp_path / "out", OLD)
    before = _tree(tmp_path)

    def build(staging: Path) -> None:
        _make(staging, dict(list(NEW.items())[:after]))
        raise error

    with pytest.raises(type(error)) as info:  # the build's own error, unchanged
        atomic_write_folder(tmp_path / "out", build)
    assert info.value is error
    assert _tree(tmp_path) == before


def test_a_failed_build_removes_the_parents_it_made(tmp_path):
    def build(staging: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_write_folder(tmp_path / "a" / "b" / "out", build)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    _make(tmp_path / "out", OLD)
    (tmp_path / "out").chmod(0o555)
    _fail_once(monkeypatch, os, "replace", 2, OSError(errno.EXDEV, os.strerror(errno.EXDEV)))
    with replacing_read_only(), pytest.raises(EntmtpError, match="cannot write"):
        atomic_write_folder(tmp_path / "out", _build_new)
    assert _tree(tmp_path / "out") == OLD
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o555  # as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "out").chmod(0o755)


# -- refusals: nothing is built, nothing changes -------------------------------------------
def _never(staging: Path) -> None:
    raise AssertionError("build ran for a refused target")


@pytest.mark.parametrize("replace", [True, False])
def test_a_symbolic_link_is_refused(tmp_path, replace):
    _make(tmp_path / "real", OLD)
    (tmp_path / "out").symlink_to(tmp_path / "real", target_is_directory=True)
    before = _tree(tmp_path)
    with pytest.raises(EntmtpError, match="symbolic link"):
        atomic_write_folder(tmp_path / "out", _never, replace=replace)
    assert (tmp_path / "out").is_symlink() and _tree(tmp_path) == before


@pytest.mark.parametrize("replace", [True, False])
def test_a_file_is_refused(tmp_path, replace):
    (tmp_path / "out").write_bytes(b"a file")
    with pytest.raises(EntmtpError, match="not a folder: choose a new folder for --out"):
        atomic_write_folder(tmp_path / "out", _never, replace=replace, option="--out")
    assert (tmp_path / "out").read_bytes() == b"a file"


def test_a_pipe_is_refused(tmp_path):
    os.mkfifo(tmp_path / "out")
    with pytest.raises(EntmtpError, match="not a folder"):
        atomic_write_folder(tmp_path / "out", _never)
    assert stat.S_ISFIFO((tmp_path / "out").lstat().st_mode)


def test_a_parent_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(EntmtpError, match="a parent of it is a file"):
        atomic_write_folder(tmp_path / "file" / "out", _never)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_read_only_folder_is_replaced_only_with_force(tmp_path):
    _make(tmp_path / "out", OLD)
    (tmp_path / "out").chmod(0o555)
    with pytest.raises(EntmtpError, match="read-only: pass --force"):
        atomic_write_folder(tmp_path / "out", _never)
    assert _tree(tmp_path / "out") == OLD
    with replacing_read_only():
        atomic_write_folder(tmp_path / "out", _build_new)
    assert _tree(tmp_path / "out") == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_prefix_and_option_name_an_unwritable_parent(tmp_path, monkeypatch):
    _fail_once(monkeypatch, tempfile, "mkdtemp", 1,
               OSError(errno.EACCES, os.strerror(errno.EACCES)))
    with pytest.raises(EntmtpError) as info:
        atomic_write_folder(tmp_path / "new" / "out", _never, prefix="cannot write heads to X",
                            option="--out")
    assert str(info.value) == "cannot write heads to X: Permission denied; choose a writable --out"
    assert list(tmp_path.iterdir()) == []  # nor the parent it made


# -- keeping a folder that is already there ----------------------------------------------------
def test_without_replace_a_folder_already_there_is_kept(tmp_path):
    _make(tmp_path / "out", OLD)
    assert atomic_write_folder(tmp_path / "out", _build_new, replace=False) == tmp_path / "out"
    assert _tree(tmp_path / "out") == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_without_replace_another_writers_copy_that_came_first_is_kept(tmp_path):
    def build(staging: Path) -> None:
        _build_new(staging)
        _make(tmp_path / "out", OLD)  # another process finished its copy meanwhile

    atomic_write_folder(tmp_path / "out", build, replace=False)
    assert _tree(tmp_path / "out") == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_without_replace_an_absent_folder_is_written(tmp_path):
    atomic_write_folder(tmp_path / "out", _build_new, replace=False)
    assert _tree(tmp_path / "out") == NEW


def test_without_replace_a_read_only_folder_is_kept_without_force(tmp_path):
    _make(tmp_path / "out", OLD)
    (tmp_path / "out").chmod(0o555)
    try:
        atomic_write_folder(tmp_path / "out", _build_new, replace=False)
        assert _tree(tmp_path / "out") == OLD
    finally:
        (tmp_path / "out").chmod(0o755)


# -- inside an all_or_none() block -------------------------------------------------------------
def test_files_written_into_the_folder_land_before_the_swap_inside_all_or_none(tmp_path):
    def build(staging: Path) -> None:
        atomic_write_text(staging / "marker.json", "{}\n")

    with all_or_none():
        atomic_write_text(tmp_path / "report.txt", "r")
        atomic_write_folder(tmp_path / "out", build)
        assert (tmp_path / "out" / "marker.json").read_text() == "{}\n"
        assert not (tmp_path / "report.txt").exists()  # the block's own writes still wait
    assert (tmp_path / "report.txt").read_text() == "r"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "report.txt"]
