"""The `entmtp` Typer app object and its one-line usage errors; each command module registers
its command on ``app``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import typer
from typer.core import TyperGroup

try:  # newer typer carries its own copy of click, whose exceptions its parser raises
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - typer versions that use click itself
    from click import exceptions as _click_errors


@contextlib.contextmanager
def _usage_errors_on_one_line() -> Iterator[None]:
    """A mistyped command line (an unknown option, a value of the wrong type, a missing option)
    becomes one ``entmtp: error:`` line and exit code 2, like every other user mistake, instead of
    click's usage panel; ``entmtp`` alone still prints the help."""
    try:
        yield
    except _click_errors.NoArgsIsHelpError:
        raise
    except _click_errors.ClickException as err:
        from ._errors import debug_enabled

        if debug_enabled():
            raise
        command = err.ctx.command_path if getattr(err, "ctx", None) is not None else "entmtp"
        message = " ".join(err.format_message().split()).rstrip(".")
        typer.echo(f"entmtp: error: {message}: see `{command} --help`", err=True)
        raise typer.Exit(2) from None


class _Commands(TyperGroup):
    """The command group; parsing errors of it and of every subcommand are one line."""

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: ANN001, ANN201
        with _usage_errors_on_one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):  # noqa: ANN001, ANN201
        with _usage_errors_on_one_line():
            return super().invoke(ctx)


app = typer.Typer(
    cls=_Commands,
    no_args_is_help=True,
    add_completion=False,
    help="entmtp: entropy-adaptive draft trees for Medusa / Hydra speculative decoding.",
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"entmtp {version('entmtp')}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    if debug:
        os.environ["ENTMTP_DEBUG"] = "1"
