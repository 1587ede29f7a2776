"""A model with a real model's architecture and random weights, built from its config alone.

Verification latency depends on the architecture, the dtype and the device, not on the weights'
values, so a target machine can measure a model's step-time curve without its weight files.

Where the config comes from:
- the default model / a ``.gguf`` file: the dequantized cache folder ``_model`` writes, when it
  exists; else the GGUF metadata, read without dequantizing any tensor (transformers'
  ``AutoConfig.from_pretrained(folder, gguf_file=name)``);
- a model folder: its ``config.json`` (the only file needed);
- a hub id: ``AutoConfig.from_pretrained(id)``.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from entmtp.core import EntmtpError, user_cache_dir

from ._base_model import CACHE_MARKER, default_gguf_path, file_sha256, resolve_dtype
from ._row_gemm import use_row_kernels


@dataclass
class ModelConfig:
    config: Any  # a transformers PretrainedConfig
    name: str  # what a bundle calls the model (as load_base_model names it)
    source: str  # where the config was read: a file, a folder or a hub id


@dataclass
class RandomModel:
    model: Any  # a transformers causal LM with random weights, eval mode
    name: str
    source: str


def model_config(spec: str | os.PathLike | None = None) -> ModelConfig:
    """The config of the model ``spec`` names (same forms as ``load_base_model``)."""
    if spec is None:
        return _gguf_config(default_gguf_path())
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        return _folder_config(path)
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_config(path)
    if path.exists() or text.endswith(".gguf") or text.startswith((".", "/", "~")) \
            or text.count("/") > 1:
        raise EntmtpError(f"model {path} is neither a model folder nor an existing .gguf file: "
                          "pass one of those or a hub id to --model")
    from ._loading import check_hub_model

    check_hub_model(text)  # offline: one line now, not a minute of retries
    return _hub_config(text)


def random_model(
    spec: str | os.PathLike | None = None,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> RandomModel:
    """The architecture of ``spec`` with weights drawn by its own initializer, on ``device``."""
    from transformers import AutoModelForCausalLM

    found = model_config(spec)
    config = copy.deepcopy(found.config)
    if hasattr(config, "quantization_config"):  # a GGUF config describes the file, not the model
        delattr(config, "quantization_config")
    torch_dtype = resolve_dtype(dtype)
    # Built directly on the device: a GPU run never allocates the weights on the host first.
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        except ValueError as err:
            raise EntmtpError(f"{found.source} does not describe a causal LM that transformers "
                              f"can build: {err}") from err
    use_row_kernels(model)
    return RandomModel(model.eval(), name=found.name, source=found.source)


# -- config sources --------------------------------------------------------------------------
def _folder_config(folder: Path) -> ModelConfig:
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise EntmtpError(f"model folder {folder} has no config.json: pass a Hugging Face model "
                          "folder, a .gguf file or a hub id")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise EntmtpError(f"cannot read the config of {folder}: {err}") from err
    return ModelConfig(config, name=folder.resolve().name, source=str(folder.resolve()))


def _gguf_config(path: Path) -> ModelConfig:
    from transformers import AutoConfig

    path = path.resolve()
    cached = _cached_gguf_folder(path)
    if cached is not None:
        config = AutoConfig.from_pretrained(cached)
        return ModelConfig(config, name=path.stem, source=str(path))
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError) as err:
        raise EntmtpError(f"cannot read the model config from the GGUF metadata of {path}: "
                          f"{err}") from err
    return ModelConfig(config, name=path.stem, source=str(path))


def _cached_gguf_folder(path: Path) -> Path | None:
    """The dequantized copy ``_model._load_gguf`` left for this exact file, if complete."""
    digest = file_sha256(path)
    folder = user_cache_dir() / "models" / f"{path.stem}-{digest[:16]}"
    try:
        marker = json.loads((folder / CACHE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if marker.get("gguf_sha256") != digest or not (folder / "config.json").is_file():
        return None
    return folder


def _hub_config(repo_id: str) -> ModelConfig:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(repo_id)
    except (OSError, ValueError) as err:
        raise EntmtpError(f"cannot read the config of {repo_id!r} from the Hugging Face hub "
                          f"({type(err).__name__}): check the id and the network, or pass a local "
                          "folder holding its config.json") from err
    return ModelConfig(config, name=repo_id, source=repo_id)
