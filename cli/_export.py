"""`entmtp export`: a bundle in the entmtp, Medusa, TensorRT-LLM or vLLM format."""

from __future__ import annotations

from pathlib import Path

import typer

from entmtp.treesearch import EXPORT_FORMATS, EntmtpError, export, load_bundle
from entmtp.treesearch._exports import default_tree

from ._errors import user_errors
from ._runs import RunDir
from .app import app


def resolve_bundle_path(source: Path) -> Path:
    """A bundle file, or a run folder holding bundle.json."""
    if source.is_dir():
        path = RunDir(source).bundle
        if not path.exists():
            raise EntmtpError(f"{source} has no bundle.json: run `entmtp calibrate --out {source}`")
        return path
    if not source.exists():
        raise EntmtpError(f"{source} does not exist: give a bundle.json or a run folder")
    return source


@app.command("export")
@user_errors
def export_command(
    source: Path = typer.Argument(..., help="A run folder or a bundle.json."),
    fmt: str = typer.Option(
        "entmtp", "--format", help=f"One of: {', '.join(EXPORT_FORMATS)}."
    ),
    out: Path = typer.Option(..., "--out", help="File to write (atomically)."),
    tree_index: int | None = typer.Option(
        None, "--tree", help="Which tree of the bundle (medusa/trtllm/vllm take one static "
        "tree); default: the best static tree, else (none, or one without nodes) the largest."
    ),
    largest_regular_subtree: bool = typer.Option(
        False, "--largest-regular-subtree",
        help="vllm only: export the largest level-regular subtree instead of failing.",
    ),
) -> None:
    """Write a bundle for the entmtp runtime, or one of its trees for Medusa / TensorRT-LLM / vLLM.

    Example: entmtp export runs/code --format trtllm --out medusa_choices.yaml
    """
    bundle = load_bundle(resolve_bundle_path(source))
    path = export(bundle, fmt, out, tree_index=tree_index,
                  largest_regular_subtree=largest_regular_subtree)
    if fmt == "entmtp":
        typer.echo(f"wrote {path}")
    else:
        which = f"tree {tree_index}" if tree_index is not None else default_tree(bundle)[1]
        typer.echo(f"wrote {path} ({which})")
