"""The entmtp heads format: its file names, writing it, and checking where it may be written.

A heads folder holds ``config.json`` (``format: "entmtp-heads"``, the structure, the base model,
the weights' sha256, and optionally the training record) and ``heads.safetensors`` (the heads'
state-dict names; half precision allowed, loaded back in the base model's dtype).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from entmtp.core import (
    EntmtpError,
    atomic_write_folder,
    check_writable_target,
    dtype_name,
    link_refusal,
    may_replace_read_only,
    own_status,
)

from ._heads import DraftHeads, weights_sha256

HEADS_FORMAT = "entmtp-heads"
HEADS_FORMAT_VERSION = 1
HEADS_WEIGHTS = "heads.safetensors"
HEADS_CONFIG = "config.json"


def save_heads(
    heads: DraftHeads,
    folder: str | os.PathLike,
    *,
    dtype: torch.dtype | None = torch.float16,
    topk_default: int = 10,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``heads`` as an entmtp heads folder (``config.json`` + ``heads.safetensors``).

    The folder is built next to ``folder`` and renamed into place, so readers see the old folder
    or the new one. ``dtype`` is the storage precision (None keeps the heads' own); ``extra``
    goes into the config under ``"training"`` (data, seed, wall time, accuracy, ...).
    """
    from safetensors.torch import save_file

    target = check_heads_target(folder)
    prefix = f"cannot write heads to {target}"

    def build(staging: Path) -> None:
        try:
            state = {
                name: tensor.detach().to("cpu", (dtype or tensor.dtype)
                                         if tensor.is_floating_point() else tensor.dtype
                                         ).contiguous()
                for name, tensor in heads.state_dict().items()
            }
            floating = [tensor for tensor in state.values() if tensor.is_floating_point()]
            config = {
                "format": HEADS_FORMAT,
                "format_version": HEADS_FORMAT_VERSION,
                **heads.config_dict(),
                "base_model": heads.base_model_name,
                "topk_default": int(topk_default),
                "storage_dtype": dtype_name(floating[0].dtype),
                "sha256": weights_sha256(heads.config_dict(), state),
            }
            if extra:
                config["training"] = _finite(dict(extra))
            save_file(state, str(staging / HEADS_WEIGHTS), metadata={"format": HEADS_FORMAT})
            with open(staging / HEADS_CONFIG, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(config, indent=2, allow_nan=False) + "\n")
        except OSError as err:
            raise EntmtpError(f"{prefix}: {err.strerror or err}: free some space or choose "
                              "another --out") from err

    return atomic_write_folder(target, build, prefix=prefix, option="--out")


def check_heads_target(folder: str | os.PathLike) -> Path:
    """``folder`` if ``save_heads`` may write it: absent, or an entmtp heads folder (only
    config.json and heads.safetensors) that is not read-only (``--force`` replaces that); a link,
    a file, a device or a folder holding anything else is refused. Checked before training."""
    target = Path(folder)
    info = own_status(target, prefix=f"cannot write heads to {target}", fix="choose another --out")
    if info is None:
        return target
    if stat.S_ISLNK(info.st_mode):
        raise EntmtpError(link_refusal(f"cannot write heads to {target}"))
    if not stat.S_ISDIR(info.st_mode):
        raise EntmtpError(f"cannot write heads to {target}: it exists and is not a folder: "
                          "choose a new folder for --out")
    others = sorted(p.name for p in target.iterdir() if p.name not in (HEADS_CONFIG,
                                                                       HEADS_WEIGHTS))
    if others:
        raise EntmtpError(f"cannot write heads to {target}: it holds {others[0]!r}, not only "
                          "entmtp heads, and writing replaces the whole folder: choose a new "
                          "folder for --out")
    if not may_replace_read_only() and not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP
                                                             | stat.S_IWOTH):
        raise EntmtpError(f"cannot write heads to {target}: the folder is read-only: pass "
                          "--force to replace it, or choose another --out")
    for name in (HEADS_CONFIG, HEADS_WEIGHTS):
        check_writable_target(target / name)
    return target


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null: JSON has none (an accuracy over no held-out
    position is NaN), and the heads reader refuses them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
