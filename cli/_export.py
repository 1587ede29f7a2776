"""`entmtp export`: a bundle in the entmtp, Medusa, TensorRT-LLM or vLLM format, or the draft
length per batch size that vLLM and TensorRT-LLM read."""

from __future__ import annotations

from pathlib import Path

import typer

from entmtp.calibrate import RunDir
from entmtp.core import EntmtpError, atomic_write_text
from entmtp.treesearch import (
    BATCH_SCHEDULE_FORMATS,
    EXPORT_FORMATS,
    BatchLatency,
    LatencyModel,
    Profile,
    best_chain_by_batch,
    export_bundle,
    load_bundle,
    trtllm_draft_len_schedule,
    vllm_batch_schedule,
)

from ._errors import user_errors
from ._model_setup import FORCE_OPTION
from ._sources import resolve_bundle_path, shipped_profile  # decode's reader too
from ._typer_app import app

# the draft length per batch size of a serving runtime: format -> runtime
BATCH_FORMATS = {f"{runtime}-batch": runtime for runtime in BATCH_SCHEDULE_FORMATS}
_BATCH_WRITERS = {"vllm": vllm_batch_schedule, "trtllm": trtllm_draft_len_schedule}


# The runtimes of the tree formats, as their warnings name them.
RUNTIME_NAMES = {"medusa": "FasterDecoding/Medusa", "trtllm": "TensorRT-LLM"}


def no_heads_of_type(head_type: str, fmt: str) -> str:
    """Why a tree searched for ``head_type`` heads (not Medusa's) is out of place in ``fmt``:
    the runtime drafts with Medusa heads only, whose acceptance the tree was not chosen for."""
    runtime, heads = RUNTIME_NAMES[fmt], head_type.capitalize()
    return (f"{runtime} has no {heads} heads, only Medusa heads: this tree was chosen for "
            f"{heads} heads' acceptance, not for the Medusa heads it would draft with there; "
            f"export a medusa bundle for {runtime} (`entmtp bundles` lists them)")


def _profile_hint(bundle) -> str:  # noqa: ANN001 - a Bundle
    """Where the profile a bundle was searched on is: the shipped one, when entmtp ships it."""
    folder = shipped_profile(bundle)
    if folder is not None:
        return (f"give --profile {folder / 'profile.npz'} (the shipped profile it was "
                "searched on)")
    return "give the run folder (with profile.npz) or --profile PROFILE.npz"


def _run_profile(source: Path, profile: Path | None) -> Path | None:
    """``--profile``, else the run folder's profile.npz when there is one."""
    if profile is not None:
        return profile
    if source.is_dir() and RunDir(source).profile.exists():
        return RunDir(source).profile
    return None


@app.command("export")
@user_errors
def export_command(
    source: Path = typer.Argument(..., help="A run folder or a bundle.json."),
    fmt: str = typer.Option(
        "entmtp", "--format", metavar="<format>",
        help=f"One of: {', '.join([*EXPORT_FORMATS, *BATCH_FORMATS])}. "
        "vllm is the tree of vLLM <= 0.20.2; vllm-chain the best chain (num_speculative_tokens) "
        "for later vLLM; vllm-batch and trtllm-batch the best chain length per batch size "
        "(vLLM num_speculative_tokens_per_batch_size, TensorRT-LLM draft_len_schedule) from "
        "--latency."
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
    refit_ranks: bool = typer.Option(
        False, "--refit-ranks",
        help="medusa/trtllm: re-search a tree whose ranks the runtime cannot hold (Medusa: "
        ">= 10, TensorRT-LLM: >= 16) on the run's profile, same node count, instead of failing.",
    ),
    profile: Path | None = typer.Option(
        None, "--profile", help="The bundle's profile.npz (vllm-chain, the -batch formats, "
        "--refit-ranks) when SOURCE is a bundle file; a run folder's own is used otherwise."
    ),
    latency: Path | None = typer.Option(
        None, "--latency", help="vllm-batch / trtllm-batch: a latency file with step times at "
        "several batch sizes (entmtp latency --import STEP_TIMES.csv); default: the run "
        "folder's latency.json."
    ),
    force: bool = FORCE_OPTION,
) -> None:
    """Write a bundle for the entmtp runtime, or one of its trees for Medusa / TensorRT-LLM / vLLM.

    Example: entmtp export runs/code --format trtllm --out medusa_choices.yaml
    """
    bundle_path = resolve_bundle_path(source)
    bundle = load_bundle(bundle_path)
    profile_path = _run_profile(source, profile)
    needs_profile = fmt == "vllm-chain" or fmt in BATCH_FORMATS or refit_ranks
    if needs_profile and profile_path is None:
        if fmt == "vllm-chain":
            what = "vllm-chain searches the best chain"
        elif fmt in BATCH_FORMATS:
            what = f"{fmt} searches the best chain per batch size"
        else:
            what = "--refit-ranks re-searches the tree"
        raise EntmtpError(f"{what} on the bundle's profile, which {source} does not hold: "
                          f"{_profile_hint(bundle)}")
    if fmt in ("medusa", "trtllm") and bundle.heads.type != "medusa":
        typer.echo(f"entmtp: warning: {no_heads_of_type(bundle.heads.type, fmt)}", err=True)
    if fmt in BATCH_FORMATS:
        _export_batch_schedule(source, bundle.heads.type, fmt, profile_path, latency, out, force)
        return
    run_profile = Profile.load(profile_path) if needs_profile and profile_path else None
    chain_latency = None
    if fmt == "vllm-chain" and bundle.latency is None and source.is_dir():
        if RunDir(source).latency.exists():
            chain_latency = LatencyModel.load(RunDir(source).latency)
    result = export_bundle(
        bundle, fmt, out, tree_index=tree_index, largest_regular_subtree=largest_regular_subtree,
        refit=refit_ranks, profile=run_profile, latency=chain_latency,
        bundle_name=str(bundle_path),
    )
    if result.header is None:
        typer.echo(f"wrote {result.path}")
        return
    header = result.header
    beside = f"; header in {result.sidecar}" if result.sidecar is not None else ""
    typer.echo(f"wrote {result.path} ({header.tree}, {header.num_nodes} nodes{beside})")
    for note in header.notes:
        if not note.startswith("warning: "):
            typer.echo(f"  {note}")
    for warning in result.warnings:
        typer.echo(f"entmtp: warning: {warning}", err=True)


def _export_batch_schedule(source: Path, head_type: str, fmt: str, profile: Path,
                           latency: Path | None, out: Path, force: bool) -> None:
    """The best chain length per batch size as ``fmt``'s runtime reads it, written to ``out``."""
    if latency is None and source.is_dir() and RunDir(source).latency.exists():
        latency = RunDir(source).latency
    if latency is None:
        raise EntmtpError(f"{fmt} needs step times at several batch sizes: give --latency FILE "
                          "(entmtp latency --import STEP_TIMES.csv makes one)")
    by_batch = BatchLatency.load(latency)
    if len(by_batch) < 2:
        raise EntmtpError(f"{latency} times batch size {by_batch.batch_sizes[0]} only: a batch "
                          "schedule needs step times at several batch sizes (entmtp latency "
                          "--import STEP_TIMES.csv)")
    choices = best_chain_by_batch(Profile.load(profile), by_batch)
    schedule = _BATCH_WRITERS[BATCH_FORMATS[fmt]](choices, head_type, source=str(profile))
    path = atomic_write_text(out, schedule.yaml_text(), replace_read_only=force)
    typer.echo(f"wrote {path}")
    for line in schedule.header:
        typer.echo(f"  {line}")
