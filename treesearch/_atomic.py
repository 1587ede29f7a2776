"""Atomic file writes: a temp file in the same folder, fsync, then rename."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ._errors import EntmtpError


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` through ``write(fileobj)`` so that readers see the old file or the new one.

    Never leaves a partial file behind: on any error the temp file is removed.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise EntmtpError(
                f"cannot create output folder {folder}: {err.strerror}; choose a writable --out"
            ) from err
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
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
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return target


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    text = json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    return atomic_write_text(path, text)
