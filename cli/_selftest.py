"""`entmtp selftest`: whether this machine runs entmtp's runtime, one line per check."""

from __future__ import annotations

from pathlib import Path

import typer

from ._errors import user_errors
from ._model_setup import DEVICE_OPTION, DTYPE_OPTION, FORCE_OPTION, check_outputs
from ._typer_app import app


@app.command()
@user_errors
def selftest(
    device: str = DEVICE_OPTION,
    dtype: str = DTYPE_OPTION,
    json_file: Path | None = typer.Option(None, "--json", help="Also write every check's "
                                          "record (status, first error line, details) to "
                                          "this JSON file."),
    force: bool = FORCE_OPTION,
) -> None:
    """Check torch, the attention kernel under a tree mask, CUDA graph capture of every step
    variant and the runtime's results on a tiny random model (no files, no downloads): one
    PASS, FAIL or SKIP line per check, a failure's with its first error line.

    The exit status is the number of failed checks (0: all passed), capped at 125.

    Example (the first command on a GPU machine):
    entmtp selftest --device cuda --json selftest.json
    """
    from entmtp.evaluation import run_selftest  # torch: imported when the command runs

    check_outputs(json_file)
    report = run_selftest(device, dtype, on_record=lambda record: typer.echo(record.line()))
    counts = report.to_json()
    typer.echo(f"selftest on {report.device} ({report.dtype}): {counts['passed']} passed, "
               f"{report.failures} failed, {counts['skipped']} skipped in "
               f"{report.seconds:.1f} s")
    if json_file is not None:
        report.save(json_file)
        typer.echo(f"wrote {json_file}")
    raise typer.Exit(report.exit_code)
