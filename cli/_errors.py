"""One-line errors for user mistakes; tracebacks only with --debug."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import typer

from entmtp.core import EntmtpError, missing_extra

F = TypeVar("F", bound=Callable[..., object])


def debug_enabled() -> bool:
    return os.environ.get("ENTMTP_DEBUG", "") not in ("", "0")


def user_errors(fn: F) -> F:
    """Turn EntmtpError, and a missing optional extra, into ``entmtp: error: ...`` on stderr
    and exit code 2; a command's ``force`` parameter (``--force``) lets its writes replace
    read-only outputs."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from entmtp.core import replacing_read_only

        try:
            with replacing_read_only(bool(kwargs.get("force", False))):
                return fn(*args, **kwargs)
        except EntmtpError as err:
            if debug_enabled():
                raise
            typer.echo(f"entmtp: error: {err}", err=True)
            raise typer.Exit(2) from None
        except ModuleNotFoundError as err:  # an optional extra is not installed
            message = missing_extra(err)
            if message is None or debug_enabled():
                raise
            typer.echo(f"entmtp: error: {message}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("entmtp: interrupted; re-run the same command to resume", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
