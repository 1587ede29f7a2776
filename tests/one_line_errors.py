"""Checking a refused command: exit code 2, one ``entmtp: error:`` line, no traceback, and no
file or folder added, removed or changed (bytes included)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entmtp.cli.app import app

runner = CliRunner()
ERROR_PREFIX = "entmtp: error:"


def snapshot(*roots: Path) -> dict[Path, bytes | None]:
    """Every file (its bytes) and folder (None) under ``roots``; symlinks by their target."""
    out: dict[Path, bytes | None] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_symlink():
                out[path] = str(path.readlink()).encode()
            elif path.is_dir():
                out[path] = None
            elif path.is_file():
                out[path] = path.read_bytes()
    return out


def char_device(path: Path) -> Path:
    """A character device node (the null device's numbers) at ``path``, never the system's
    /dev/null: a writer that replaced its target would replace only this one."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as err:
        pytest.skip(f"cannot make a device node here ({err.strerror})")
    return path


def without_tmp_paths(message: str, tmp_path: Path) -> str:
    """The message with pytest's temp paths cut out: they hold test names such as "storage"."""
    return re.sub(re.escape(str(tmp_path.parent)) + r"\S*", "<path>", message)


def assert_user_error(args: list[str], *watched: Path, env: dict[str, str] | None = None,
                      mentions: tuple[str, ...] = ()) -> str:
    """Run ``entmtp ARGS``; check the one-line error and that nothing under ``watched``
    changed. Returns the error line, lower case, without temp paths."""
    before = snapshot(*watched)
    result = runner.invoke(app, args, env={"WORLD_SIZE": None, "RANK": None, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: crashed with {type(result.exception).__name__}: {result.exception}")
    assert result.exit_code == 2, (args, result.output)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if ERROR_PREFIX in line]
    assert len(errors) == 1 and errors[0].startswith(ERROR_PREFIX), result.stderr
    # Anything printed before (a model-loading bar) is fine; the error is the last word.
    assert result.stderr.strip().splitlines()[-1].strip() == errors[0].strip(), result.stderr
    message = without_tmp_paths(errors[0], watched[0]).lower()
    for word in mentions:
        assert word in message, errors[0]
    assert snapshot(*watched) == before, f"{args} changed files"
    return message
