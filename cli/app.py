"""The `entmtp` command line: thin commands over the library packages (treesearch, model,
runtime, evaluation, calibrate)."""

from __future__ import annotations

# Each command lives in its own module; importing it registers the command on `app`.
from . import (  # noqa: F401
    _bench,
    _bundles,
    _calibrate,
    _decode,
    _demo,
    _export,
    _heads_cmd,
    _latency_cmd,
    _pareto,
    _selftest,
    _validate,
)
from ._typer_app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
