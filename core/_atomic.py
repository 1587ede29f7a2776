"""Atomic file writes: a temp file in the same folder, fsync, then rename.

The one way entmtp writes a file. The target must be a regular file or absent: a folder, a
symbolic link, a device node, a pipe or a read-only file is refused before anything is written
(a rename would replace the link or the device node itself with a regular file). An OS error
(disk full, permission denied) becomes one ``EntmtpError`` line, and nothing is left behind: no
temp file, and no folder that this write created.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ._errors import EntmtpError

_FIXES = {
    errno.ENOSPC: "free some space or choose another output path",
    errno.EDQUOT: "free some space or choose another output path",
    errno.EACCES: "choose a writable output path",
    errno.EPERM: "choose a writable output path",
    errno.EROFS: "choose an output path on a writable disk",
}


def check_writable_target(path: str | os.PathLike, *, replace_read_only: bool = False) -> Path:
    """Refuse a target that a rename must not replace; returns it as a Path."""
    target = Path(path)
    try:
        info = target.lstat()
    except FileNotFoundError:
        return target
    except NotADirectoryError as err:
        raise EntmtpError(f"cannot write {target}: a parent of it is a file, not a folder: "
                          "choose another output path") from err
    except OSError as err:
        raise EntmtpError(f"cannot write {target}: {err.strerror}") from err
    if stat.S_ISLNK(info.st_mode):
        raise EntmtpError(f"cannot write {target}: it is a symbolic link, and entmtp does not "
                          "write through links: give the real path or remove the link")
    if stat.S_ISDIR(info.st_mode):
        raise EntmtpError(f"cannot write {target}: it is a folder: give a file path to write")
    if not stat.S_ISREG(info.st_mode):
        raise EntmtpError(f"cannot write {target}: it is not a regular file (a device, pipe or "
                          "socket): give a file path to write")
    if not replace_read_only and not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise EntmtpError(f"cannot write {target}: it is read-only: make it writable (chmod u+w) "
                          "or remove it to replace it, or choose another output path")
    return target


def _make_folder(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, deepest first."""
    missing = []
    probe = folder
    while not probe.exists() and not probe.is_symlink():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise EntmtpError(f"cannot create output folder {folder}: {probe} is a file, not a "
                          "folder: choose another output path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _remove_folders(missing)
        raise EntmtpError(
            f"cannot create output folder {folder}: {err.strerror}; choose a writable --out"
        ) from err
    return missing


def _remove_folders(created: list[Path]) -> None:
    for folder in created:  # deepest first; only ones still empty
        try:
            folder.rmdir()
        except OSError:
            return


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], *,
                 replace_read_only: bool = False) -> Path:
    """Write ``path`` through ``write(fileobj)`` so that readers see the old file or the new one.

    Never leaves a partial file behind: on any error the temp file (and any folder this call
    created) is removed.
    """
    target = check_writable_target(path, replace_read_only=replace_read_only)
    folder = target.parent if str(target.parent) else Path(".")
    created = _make_folder(folder)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        _remove_folders(created)
        raise EntmtpError(
            f"cannot write to {folder}: {err.strerror}; choose a writable output path"
        ) from err
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would have.
        os.chmod(tmp_name, 0o666 & ~_current_umask())
        os.replace(tmp_name, target)
    except BaseException as err:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        _remove_folders(created)
        if isinstance(err, OSError):
            fix = _FIXES.get(err.errno or 0, "choose another output path")
            raise EntmtpError(f"cannot write {target}: {err.strerror or err}: {fix}") from err
        raise
    return target


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, *,
                      replace_read_only: bool = False) -> Path:
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")),
                        replace_read_only=replace_read_only)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2,
                      replace_read_only: bool = False) -> Path:
    text = json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    return atomic_write_text(path, text, replace_read_only=replace_read_only)
