"""Atomic file and folder writes: a temp file (or folder) in the same folder, fsync, rename.

The one way entmtp writes a file, or a whole folder (``atomic_write_folder``). The target of a
file write must be a regular file or absent: a folder, a symbolic link, a device node, a pipe or
a read-only file is refused before anything is written (a rename would replace the link or the
device node itself with a regular file). An OS error (disk full, permission denied) becomes one
``EntmtpError`` line, and nothing is left behind: no temp file, and no folder that this write
created. A read-only target is replaced only inside ``replacing_read_only()`` (the command
line's ``--force``).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
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

# Whether writes may replace read-only targets; set for one command by ``replacing_read_only``.
_REPLACE_READ_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "entmtp_replace_read_only", default=False)


@contextlib.contextmanager
def replacing_read_only(enabled: bool = True) -> Iterator[None]:
    """Within the block, every write may replace a read-only target (``--force``)."""
    token = _REPLACE_READ_ONLY.set(enabled)
    try:
        yield
    finally:
        _REPLACE_READ_ONLY.reset(token)


def may_replace_read_only() -> bool:
    """Whether the current command may replace read-only targets (``--force``)."""
    return _REPLACE_READ_ONLY.get()


def own_status(target: Path, *, prefix: str, fix: str, os_error_prefix: str | None = None,
               os_error_fix: str | None = "") -> os.stat_result | None:
    """``target``'s own status (links not followed), None when it is absent; a parent that is a
    file, or any other OS error, becomes one line ``{prefix}: ...: {fix}``
    (``os_error_prefix`` / ``os_error_fix`` override them for the latter; a None fix: none)."""
    try:
        return target.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError as err:
        raise EntmtpError(f"{prefix}: a parent of it is a file, not a folder: {fix}") from err
    except OSError as err:
        tail = fix if os_error_fix == "" else os_error_fix
        raise EntmtpError(f"{os_error_prefix or prefix}: {err.strerror}"
                          + (f": {tail}" if tail else "")) from err


def link_refusal(prefix: str) -> str:
    """The one line refusing to write through a symbolic link."""
    return (f"{prefix}: it is a symbolic link, and entmtp does not write through links: give "
            "the real path or remove the link")


def check_writable_target(path: str | os.PathLike, *,
                          replace_read_only: bool | None = None) -> Path:
    """Refuse a target that a rename must not replace; returns it as a Path.

    ``replace_read_only``: None follows ``replacing_read_only()``.
    """
    if replace_read_only is None:
        replace_read_only = may_replace_read_only()
    target = Path(path)
    info = own_status(target, prefix=f"cannot write {target}", fix="choose another output path",
                      os_error_fix=None)
    if info is None:
        return target
    if stat.S_ISLNK(info.st_mode):
        raise EntmtpError(link_refusal(f"cannot write {target}"))
    if stat.S_ISDIR(info.st_mode):
        raise EntmtpError(f"cannot write {target}: it is a folder: give a file path to write")
    if not stat.S_ISREG(info.st_mode):
        raise EntmtpError(f"cannot write {target}: it is not a regular file (a device, pipe or "
                          "socket): give a file path to write")
    if not replace_read_only and not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise EntmtpError(f"cannot write {target}: it is read-only: pass --force to replace it, "
                          "or make it writable (chmod u+w), or choose another output path")
    return target


def check_output_folder(folder: str | os.PathLike, *, what: str = "output folder") -> Path:
    """Refuse, before a command's first side effect, an output folder that is a link, a file, a
    device or under a file (absent or a real folder passes); returns it as a Path."""
    folder = Path(folder)
    info = own_status(folder, prefix=f"cannot make {what} {folder}", fix="choose another --out",
                      os_error_prefix=f"cannot use {what} {folder}")
    if info is None:
        return folder
    if not stat.S_ISDIR(info.st_mode):
        raise EntmtpError(f"{what} {folder} is a file or a link, not a folder: choose another "
                          "--out")
    return folder


def make_folder(folder: Path) -> list[Path]:
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
        remove_folders(missing)
        raise EntmtpError(
            f"cannot create output folder {folder}: {err.strerror}; choose a writable --out"
        ) from err
    return missing


def remove_folders(created: list[Path]) -> None:
    """Remove the folders ``make_folder`` created, deepest first, stopping at one not empty."""
    for folder in created:  # deepest first; only ones still empty
        try:
            folder.rmdir()
        except OSError:
            return


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], *,
                 replace_read_only: bool | None = None) -> Path:
    """Write ``path`` through ``write(fileobj)`` so that readers see the old file or the new one.

    Never leaves a partial file behind: on any error the temp file (and any folder this call
    created) is removed.
    """
    target = check_writable_target(path, replace_read_only=replace_read_only)
    folder = target.parent if str(target.parent) else Path(".")
    created = make_folder(folder)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        remove_folders(created)
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
        pending = _PENDING.get()
        if pending is not None:  # inside all_or_none(): renamed with the others at its end
            pending.append((tmp_name, target, created))
            return target
        os.replace(tmp_name, target)
    except BaseException as err:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        remove_folders(created)
        if isinstance(err, OSError):
            fix = _FIXES.get(err.errno or 0, "choose another output path")
            raise EntmtpError(f"cannot write {target}: {err.strerror or err}: {fix}") from err
        raise
    return target


# The writes of an open all_or_none() block: (temp file, target, folders that write created).
_PENDING: contextvars.ContextVar[list[tuple[str, Path, list[Path]]] | None] = (
    contextvars.ContextVar("entmtp_pending_renames", default=None))


@contextlib.contextmanager
def all_or_none() -> Iterator[None]:
    """The outputs written inside the block appear together at its end, or none of them does:
    each is written and synced to its temp file as usual, and the renames wait until the block
    has finished. (Renames need no space, so a full disk fails before the first of them; if a
    rename fails all the same, the new files renamed before it are removed again, while a file
    that one of them replaced cannot come back.)"""
    pending: list[tuple[str, Path, list[Path]]] = []
    token = _PENDING.set(pending)
    try:
        yield
        _PENDING.reset(token)
        token = None
        renamed_new: list[tuple[str, Path, list[Path]]] = []
        for i, (tmp_name, target, created) in enumerate(pending):
            existed = os.path.lexists(target)
            try:
                os.replace(tmp_name, target)
            except OSError as err:
                for _, path, _ in renamed_new:
                    path.unlink(missing_ok=True)
                pending = renamed_new + pending[i:]  # their folders go once emptied below
                raise EntmtpError(f"cannot write {target}: {err.strerror or err}: "
                                  "choose another output path") from err
            if not existed:
                renamed_new.append((tmp_name, target, created))
        pending = []
    finally:
        if token is not None:
            _PENDING.reset(token)
        for tmp_name, _, created in reversed(pending):  # not renamed: remove what they made
            try:
                os.unlink(tmp_name)
            except FileNotFoundError:
                pass
            remove_folders(created)


def atomic_write_folder(path: str | os.PathLike, build: Callable[[Path], None], *,
                        replace: bool = True, prefix: str | None = None,
                        option: str = "output path",
                        replace_read_only: bool | None = None) -> Path:
    """Write the folder ``path`` through ``build(staging)`` so that readers find the old folder
    or the new one under its name, never a part of either.

    ``build`` fills ``staging``, a new empty folder beside ``path`` under a temporary name;
    then its files are synced, given the permissions a plain mkdir / open would have, and the
    folder is renamed into place. With ``replace`` a folder already at ``path`` is first
    renamed aside (for an instant between the two renames nothing is at ``path``) and removed
    once the new one is in; without it, a folder found at ``path`` by then (another writer's
    finished copy) is kept and the new one dropped.

    Refused before anything is written: a symbolic link, a file, a device or a pipe at
    ``path``, and (with ``replace``) a read-only folder outside ``replacing_read_only()``;
    ``replace_read_only``: None follows ``replacing_read_only()``. On any error nothing is left
    behind: no temp folder, no parent folder this call created, and an old folder stays where
    it was (should putting it back fail too, in a hidden folder beside it). What ``build``
    raises passes through; an OS error of the writer's own steps becomes one
    ``EntmtpError`` line that starts with ``prefix`` (by default ``cannot write PATH``) and
    names ``option`` (where the path came from, e.g. ``--out``) in its fix.
    """
    if replace_read_only is None:
        replace_read_only = may_replace_read_only()
    target = Path(path)
    prefix = prefix or f"cannot write {target}"
    may_replace = replace_read_only or not replace  # a folder that is kept may be read-only
    _check_folder_target(target, prefix=prefix, option=option, replace_read_only=may_replace)
    parent = target.parent if str(target.parent) else Path(".")
    created = make_folder(parent)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as err:
        remove_folders(created)
        raise EntmtpError(f"{prefix}: {err.strerror}; choose a writable {option}") from err
    try:
        # The folder's own files are written now, not at the end of an all_or_none() block.
        token = _PENDING.set(None)
        try:
            build(staging)
        finally:
            _PENDING.reset(token)
        try:
            _finish_folder(staging)
            if replace:
                info = _check_folder_target(target, prefix=prefix, option=option,
                                            replace_read_only=may_replace)
                _swap_in(staging, target, info)
            else:
                _move_in_unless_there(staging, target)
        except OSError as err:
            raise EntmtpError(f"{prefix}: {err.strerror or err}: free some space or choose "
                              f"another {option}") from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_folders(created)
        raise
    return target


def _check_folder_target(target: Path, *, prefix: str, option: str,
                         replace_read_only: bool) -> os.stat_result | None:
    """``target``'s own status if a folder may be renamed onto it (None: absent); refuses a
    link, anything not a folder, and a read-only folder unless ``replace_read_only``."""
    info = own_status(target, prefix=prefix, fix=f"choose another {option}")
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise EntmtpError(link_refusal(prefix))
    if not stat.S_ISDIR(info.st_mode):
        raise EntmtpError(f"{prefix}: it exists and is not a folder: choose a new folder for "
                          f"{option}")
    if not replace_read_only and not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise EntmtpError(f"{prefix}: the folder is read-only: pass --force to replace it, or "
                          f"choose another {option}")
    return info


def _finish_folder(staging: Path) -> None:
    """Sync every file under ``staging`` and give it, and every folder, the permissions a plain
    open / mkdir would have (mkdtemp makes a private folder; some writers make private files).
    Links are left alone: chmod and open would reach through them."""
    umask = _current_umask()
    os.chmod(staging, 0o777 & ~umask)
    for root, folders, files in os.walk(staging, onerror=_raise):
        folders[:] = [name for name in folders if not os.path.islink(os.path.join(root, name))]
        for name in folders:  # before os.walk lists them: a private folder could not be read
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
        for name in files:
            file_path = os.path.join(root, name)
            if os.path.islink(file_path):
                continue
            os.chmod(file_path, 0o666 & ~umask)
            fd = os.open(file_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _raise(err: OSError) -> None:
    raise err


def _swap_in(staging: Path, target: Path, info: os.stat_result | None) -> None:
    """Rename ``staging`` to ``target``; an old folder there (``info``) is renamed aside first
    and removed after, or put back if the new one cannot take its place."""
    if info is None:
        os.replace(staging, target)
        return
    mode = stat.S_IMODE(info.st_mode)
    read_only = not mode & stat.S_IWUSR
    if read_only:  # a read-only folder (--force): a folder moves to another one only if writable
        os.chmod(target, mode | stat.S_IWUSR)
    try:
        retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                        dir=staging.parent))
        aside = retired / target.name
        try:
            os.replace(target, aside)
        except BaseException:
            retired.rmdir()
            raise
    except BaseException:
        if read_only:
            os.chmod(target, mode)
        raise
    try:
        os.replace(staging, target)
    except BaseException:
        try:  # put the old folder back; should that fail too, it stays in ``retired``
            os.replace(aside, target)
            retired.rmdir()
            if read_only:
                os.chmod(target, mode)
        except OSError:
            pass
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _move_in_unless_there(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target`` unless a folder holding anything is there by now: that
    one is kept, and ``staging`` removed."""
    try:
        os.rename(staging, target)  # replaces at most an empty folder
    except OSError as err:
        if (err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or os.path.islink(target)
                or not os.path.isdir(target)):
            raise
        shutil.rmtree(staging, ignore_errors=True)

def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, *,
                      replace_read_only: bool | None = None) -> Path:
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")),
                        replace_read_only=replace_read_only)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2,
                      replace_read_only: bool | None = None) -> Path:
    try:
        text = json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    except ValueError as err:  # NaN or infinity: JSON has none, and a reader would refuse it
        raise EntmtpError(f"cannot write {path}: {err}") from err
    return atomic_write_text(path, text, replace_read_only=replace_read_only)
