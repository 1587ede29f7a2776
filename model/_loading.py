"""The model and draft heads a command names (``--model``, ``--heads``, ``--head-type``) on the
device and in the precision it names (``--device``, ``--dtype``), each checked before the slow
load (a hub id the hub cannot serve now included). Importing this module does not import
torch."""

from __future__ import annotations

import os
import re
import socket
from importlib import resources
from pathlib import Path

from entmtp.core import ENGINES, HEAD_TYPES, EntmtpError, dtype_name

# Heads trained for the default model, shipped as package data (see trees/heads/README.md).
SHIPPED_HEADS = {"medusa": "smollm2-135m-medusa", "hydra": "smollm2-135m-hydra"}


def check_engine(engine: str) -> str:
    """``--engine`` as given, or a one-line error."""
    if engine not in ENGINES:
        raise EntmtpError(f"--engine {engine!r}: use {', '.join(ENGINES)}")
    return engine


def check_head_type(head_type: str) -> str:
    """``--head-type`` as given, or a one-line error."""
    if head_type not in HEAD_TYPES:
        raise EntmtpError(f"--head-type {head_type!r}: use one of {', '.join(HEAD_TYPES)}")
    return head_type


def check_device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    """(device, torch dtype name) of ``--device`` / ``--dtype``; a one-line error for a bad
    value, so that commands check both before any side effect."""
    return check_device(device), resolve_dtype_name(dtype)


def resolve_dtype_name(dtype: str) -> str:
    """``--dtype`` as torch's name (``bf16`` -> ``bfloat16``)."""
    return dtype_name(dtype, option="--dtype")


def check_device_name(device: str) -> str:
    """``cpu`` or ``cuda[:N]`` as a name, whether or not this machine has that device."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", device) is None:
        raise EntmtpError(f"--device {device!r}: use cpu or cuda (cuda:N for another GPU)")
    return device


def check_device(device: str) -> str:
    """``cpu`` or ``cuda[:N]`` that this machine has."""
    import torch

    if check_device_name(device) == "cpu":
        return device
    if not torch.cuda.is_available():
        raise EntmtpError(f"--device {device}: this machine has no CUDA GPU that torch "
                          f"{torch.__version__} can use; use --device cpu or run on the GPU "
                          "machine")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise EntmtpError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    return device


def shipped_heads_path(head_type: str, sha256: str | None = None) -> Path:
    """The shipped heads folder of ``head_type``: the one whose weights have ``sha256`` (a
    bundle's heads; some tasks ship heads of their own), else the default one."""
    root = Path(str(resources.files("entmtp.trees").joinpath("heads")))
    if sha256 is not None:
        for folder in sorted(root.glob("*/config.json")):
            config = _read_config(folder)
            if (config.get("head_type") == head_type
                    and str(config.get("sha256", "")).lower() == sha256.lower()):
                return folder.parent
    path = root / SHIPPED_HEADS[head_type]
    if not path.is_dir():
        raise EntmtpError(
            f"no shipped {head_type} heads at {path}: pass --heads FOLDER or train some with "
            "`entmtp heads train`"
        )
    return path


def _read_config(path: Path) -> dict:
    import json

    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def resolve_heads(heads: str | None, head_type: str, model: str | None,
                  sha256: str | None = None) -> Path:
    """The ``--heads`` folder, else the shipped heads of ``head_type`` (those with ``sha256``
    when some are: the heads a bundle was calibrated for)."""
    check_head_type(head_type)
    if heads is not None:
        path = Path(heads).expanduser()
        if not path.exists():
            raise EntmtpError(f"heads folder {path} does not exist: pass a Medusa, Hydra or "
                              "entmtp heads folder to --heads")
        return path
    if model is not None:
        raise EntmtpError("--heads is required with --model: the shipped heads fit only the "
                          "default model")
    return shipped_heads_path(head_type, sha256)


def quiet_transformers() -> None:
    """No transformers progress bars: the commands show their own, and errors stay one line."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_base(model: str | None, *, device: str = "cpu", dtype: str = "fp32"):
    """The base model of ``--model`` (the default SmolLM2 GGUF when None) on ``--device`` in
    ``--dtype`` (both checked before the slow load)."""
    from ._base_model import load_base_model

    dtype_name = resolve_dtype_name(dtype)
    device = check_device(device)
    check_hub_model(model)
    quiet_transformers()
    return load_base_model(model, dtype=dtype_name, device=device)


# -- a hub id, offline ------------------------------------------------------------------------
HUB_TIMEOUT_S = 3.0  # the one connection attempt's limit; the hub's own client retries ~50 s
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def is_hub_id(model: str) -> bool:
    """``--model`` names a hub model: no local folder or file, nothing path-like, a valid id
    (an invalid one is the loader's one-line error)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from ._base_model import _looks_like_path

    path = Path(model).expanduser()
    if path.exists() or model.endswith(".gguf") or _looks_like_path(model):
        return False
    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def hub_unreachable(timeout: float = HUB_TIMEOUT_S) -> str | None:
    """Why the hub's host (``HF_ENDPOINT``'s) cannot be reached now, in a few words, or None.
    Behind a proxy only the proxy knows: not checked then."""
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    url = urlsplit(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:  # a name that does not resolve, a refused or timed-out connection
        return f"{host}: {err.strerror or str(err) or type(err).__name__}"


def check_hub_model(model: str | None) -> None:
    """Fail in one line, now, for a hub id that cannot load here: not in the local cache while
    HF_HUB_OFFLINE is set or the hub is out of reach (the download would retry for most of a
    minute first). A cached model with the hub out of reach loads from the cache, offline."""
    if model is None or not is_hub_id(model):
        return
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(model, "config.json"), str)
    if constants.is_offline_mode():
        if not cached:
            raise EntmtpError(f"model {model!r} is not in the Hugging Face cache "
                              f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: download it "
                              "once with the network on, or pass a local model folder or .gguf "
                              "to --model")
        return
    problem = hub_unreachable()
    if problem is None:
        return
    if cached:
        # the libraries ask is_offline_mode() before each request: the cache, no retries
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants.HF_HUB_OFFLINE = True
        return
    raise EntmtpError(f"cannot reach the Hugging Face hub ({problem}) to download model "
                      f"{model!r}, which is not in the local cache: connect this machine to the "
                      "network, or pass a local model folder or .gguf to --model")


def load_heads_for(base, heads: str | None, head_type: str, model: str | None,
                   sha256: str | None = None):
    """Heads from ``--heads`` (any head type), else the shipped heads of ``head_type`` (those
    with ``sha256`` when some are)."""
    from ._heads_load import load_heads

    return load_heads(resolve_heads(heads, head_type, model, sha256), base.model)


def load_model_and_heads(model: str | None, heads: str | None, head_type: str, *,
                         device: str = "cpu", dtype: str = "fp32"):
    """(BaseModel, DraftHeads) for the options; the default model with its shipped heads, both
    on ``device`` in ``dtype``.

    A checkpoint declares its own head type; ``head_type`` only picks the shipped default.
    """
    resolve_heads(heads, head_type, model)  # option errors before the slow model load
    base = load_base(model, device=device, dtype=dtype)
    return base, load_heads_for(base, heads, head_type, model)
