"""The `entmtp` command line (placeholder until the CLI issue lands)."""

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command()
def version() -> None:
    """Print entmtp's version."""
    from importlib.metadata import version as _version

    typer.echo(_version("entmtp"))


def main() -> None:
    app()
