"""Options shared by the commands that load a model, and the loading itself."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from entmtp.treesearch import EntmtpError

HEAD_TYPES = ("medusa", "hydra")
# Heads trained for the default model, shipped as package data (see trees/heads/README.md).
SHIPPED_HEADS = {"medusa": "smollm2-135m-medusa", "hydra": "smollm2-135m-hydra"}


def shipped_heads_path(head_type: str) -> Path:
    folder = resources.files("entmtp.trees").joinpath("heads", SHIPPED_HEADS[head_type])
    path = Path(str(folder))
    if not path.is_dir():
        raise EntmtpError(
            f"no shipped {head_type} heads at {path}: pass --heads FOLDER or train some with "
            "`entmtp heads train`"
        )
    return path


def resolve_heads(heads: str | None, head_type: str, model: str | None) -> Path:
    if head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")
    if heads is not None:
        path = Path(heads).expanduser()
        if not path.exists():
            raise EntmtpError(f"heads folder {path} does not exist: pass a Medusa, Hydra or "
                              "entmtp heads folder to --heads")
        return path
    if model is not None:
        raise EntmtpError("--heads is required with --model: the shipped heads fit only the "
                          "default model")
    return shipped_heads_path(head_type)


def load_model_and_heads(model: str | None, heads: str | None, head_type: str):
    """(BaseModel, DraftHeads) for the options; the default model with its shipped heads."""
    heads_path = resolve_heads(heads, head_type, model)
    from entmtp.calibrate._heads import load_heads
    from entmtp.calibrate._model import load_base_model

    base = load_base_model(model)
    # A checkpoint declares its own head type; --head-type only picks the shipped default.
    return base, load_heads(heads_path, base.model)
