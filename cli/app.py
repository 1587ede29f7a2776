"""The `entmtp` command line: thin commands over treesearch, calibrate and runtime."""

from __future__ import annotations

import os

import typer

app = typer.Typer(
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


def _register() -> None:
    # Each command lives in its own module; importing registers it on `app`.
    from . import (  # noqa: F401
        _bench,
        _calibrate,
        _decode,
        _demo,
        _export,
        _heads_cmd,
        _latency_cmd,
        _pareto,
        _validate,
    )


_register()


def main() -> None:
    app()
