"""Reading draft heads from a checkpoint folder: entmtp's own format, Medusa's and Hydra's.

- entmtp: ``config.json`` (``format: "entmtp-heads"``) + ``heads.safetensors`` (see
  ``_heads_format``).
- Medusa: ``config.json`` with ``medusa_num_heads`` / ``medusa_num_layers`` and
  ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``; keys ``{head}.{layer}.linear.weight``,
  ``{head}.{layer}.linear.bias``, ``{head}.{num_layers}.weight`` (the state dict of Medusa's
  ``medusa_head`` ModuleList). A checkpoint without the projection keys keeps Medusa's
  initialisation, a copy of the base lm_head, so it loads as a shared lm_head.
- Hydra: ``config.json`` with ``hydra_num_heads``, ``hydra_num_layers``, ``hydra_head_arch``
  (only ``"mlp"``), ``grounded_heads``, ``hidden_state_offset`` (only 0) and
  ``hydra_lm_head.pt``; keys ``hydra_mlp.{head}.{layer}.linear.*``,
  ``hydra_mlp.{head}.0.res_connection.*`` (grounded heads), ``hydra_lm_head.{head}.weight/bias``
  (the state dict of Hydra's ``HydraMLP``; its ``input_embed_fn.*`` copy of the base embedding is
  ignored).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from entmtp.core import HEAD_TYPES, EntmtpError, read_json

from ._heads import (
    DraftHeads,
    HydraHeads,
    MedusaHeads,
    base_dimensions,
    build_heads,
    draft_vocab_problem,
    unwrap_base,
)
from ._heads_format import HEADS_CONFIG, HEADS_FORMAT, HEADS_FORMAT_VERSION, HEADS_WEIGHTS
from ._row_gemm import use_row_kernels


def detect_heads_format(path: str | os.PathLike) -> str:
    """"entmtp", "medusa" or "hydra" for a heads folder; EntmtpError when it is none of them."""
    return _detect(Path(path), _read_config(Path(path)))


def load_heads(path: str | os.PathLike, base: Any, *, dtype: torch.dtype | None = None
               ) -> DraftHeads:
    """Load heads from an entmtp, Medusa or Hydra folder onto ``base`` (its device; the heads'
    own weights in ``dtype``, by default the base's; a shared lm_head stays the base's)."""
    folder = Path(path)
    config = _read_config(folder)
    kind = _detect(folder, config)
    module = unwrap_base(base)
    if kind == "entmtp":
        heads = _load_entmtp(folder, config, module)
    elif kind == "medusa":
        heads = _load_medusa(folder, config, module)
    else:
        heads = _load_hydra(folder, config, module)
    # Still the stored values (upcast to float32, exactly): their hash is the heads' identity.
    heads._remember_stored_identity(heads._current_sha256())
    parameter = next(module.parameters())
    heads = heads.to(dtype=dtype or parameter.dtype, device=parameter.device).eval()
    use_row_kernels(heads)
    return heads


def read_heads_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a heads folder (entmtp, Medusa or Hydra), read and checked."""
    return _read_config(Path(path))


def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise EntmtpError(f"heads path {folder} is not a folder; pass the folder that holds "
                          "config.json and the head weights")
    config_path = folder / HEADS_CONFIG
    if not config_path.exists() and not config_path.is_symlink():
        raise EntmtpError(f"{folder} has no config.json; it is not an entmtp, Medusa or Hydra "
                          "heads folder")
    # nan_as_null: heads trained before save_heads wrote NaN accuracies (no held-out position)
    # as null carry NaN in their "training" record
    return read_json(config_path, source=f"heads config {config_path}", nan_as_null=True,
                     fix="pass an entmtp, Medusa or Hydra heads folder (entmtp heads train "
                     "writes one)")


def _detect(folder: Path, config: Mapping[str, Any]) -> str:
    if config.get("format") == HEADS_FORMAT:
        return "entmtp"
    if "medusa_num_heads" in config:
        return "medusa"
    if "hydra_num_heads" in config:
        return "hydra"
    raise EntmtpError(
        f"{folder}/config.json is not a heads config (no format: {HEADS_FORMAT!r}, "
        "medusa_num_heads or hydra_num_heads)"
    )


def _weights_file(folder: Path, stem: str) -> Path:
    for suffix in (".safetensors", ".pt"):
        candidate = folder / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    raise EntmtpError(f"{folder} has no {stem}.safetensors or {stem}.pt")


def _read_state(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # corrupt or foreign file: one line for the user
        raise EntmtpError(f"cannot read head weights {path}: {err}") from err
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise EntmtpError(f"{path} is not a state dict of tensors")
    return dict(state)


def _int_field(
    config: Mapping[str, Any], key: str, folder: Path, default: int | None = None
) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EntmtpError(f"{folder}/config.json: {key} must be a positive integer, got {value!r}")
    return value


def _check_base_match(folder: Path, hidden_size: int, vocab_size: int, module: nn.Module) -> None:
    base_hidden, base_vocab = base_dimensions(module)
    if hidden_size != base_hidden or vocab_size != base_vocab:
        raise EntmtpError(
            f"heads in {folder} are for hidden size {hidden_size} and vocabulary {vocab_size}, "
            f"but the base model has {base_hidden} and {base_vocab}; pass the base model the "
            "heads were trained for (--model)"
        )


def _load_state_into(heads: DraftHeads, state: Mapping[str, Tensor], source: Path) -> None:
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise EntmtpError(f"head weights {source} do not match their config: {detail}")
    for name, tensor in expected.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise EntmtpError(
                f"head weights {source}: {name} has shape {tuple(state[name].shape)}, expected "
                f"{tuple(tensor.shape)}; the heads do not fit this base model"
            )
    heads.load_state_dict({name: state[name].to(torch.float32) if expected[name].is_floating_point()
                           else state[name] for name in expected})


def _load_entmtp(folder: Path, config: Mapping[str, Any], module: nn.Module) -> DraftHeads:
    version = config.get("format_version", HEADS_FORMAT_VERSION)
    if not isinstance(version, int) or version > HEADS_FORMAT_VERSION:
        raise EntmtpError(
            f"{folder}: heads format_version {version!r} is newer than this entmtp reads "
            f"({HEADS_FORMAT_VERSION}); upgrade entmtp"
        )
    head_type = config.get("head_type")
    if head_type not in HEAD_TYPES:
        raise EntmtpError(f"{folder}/config.json: head_type must be medusa or hydra, got "
                          f"{head_type!r}")
    hidden_size = _int_field(config, "hidden_size", folder)
    vocab_size = _int_field(config, "vocab_size", folder)
    _check_base_match(folder, hidden_size, vocab_size, module)
    heads = build_heads(
        head_type,
        num_heads=_int_field(config, "num_heads", folder),
        num_layers=_int_field(config, "num_layers", folder),
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        lm_head=module.get_output_embeddings() if config.get("shared_lm_head", True) else None,
        embed=module.get_input_embeddings(),
        grounded=bool(config.get("grounded", True)),
    )
    weights = folder / HEADS_WEIGHTS
    if not weights.is_file():
        raise EntmtpError(f"{folder} has no {HEADS_WEIGHTS}")
    state = _read_state(weights)
    heads.set_draft_vocab(_stored_draft_vocab(state, config, folder, vocab_size))
    _load_state_into(heads, state, weights)
    heads.base_model_name = str(config.get("base_model", ""))
    return heads


def _stored_draft_vocab(state: Mapping[str, Tensor], config: Mapping[str, Any], folder: Path,
                        vocab_size: int) -> Tensor | None:
    """The stored draft vocabulary (checked against the config's ``draft_vocab_size``)."""
    ids = state.get("draft_vocab")
    size = config.get("draft_vocab_size")
    if ids is None and size is None:
        return None
    if ids is None or size is None:
        where = HEADS_WEIGHTS if ids is None else "config.json"
        raise EntmtpError(f"{folder}: a draft vocabulary is half stored (nothing in {where}); "
                          "write the heads again with entmtp heads draft-vocab")
    problem = draft_vocab_problem(ids, vocab_size)
    if problem is None and (isinstance(size, bool) or size != int(ids.numel())):
        problem = f"config.json says draft_vocab_size {size!r} but it holds {int(ids.numel())}"
    if problem is None and not bool((ids[1:] > ids[:-1]).all()):
        problem = "token ids are not sorted"
    if problem is not None:
        raise EntmtpError(f"{folder}: draft vocabulary: {problem}; write the heads again with "
                          "entmtp heads draft-vocab")
    return ids


def _same_as_lm_head(weight: Tensor, bias: Tensor | None, lm_head: nn.Module) -> bool:
    base_weight = lm_head.weight.detach().to("cpu")
    if tuple(weight.shape) != tuple(base_weight.shape):
        return False
    if bias is not None and bool(bias.any()):
        return False
    return torch.equal(weight.to(base_weight.dtype), base_weight)


def _shared_or_own(
    state: Mapping[str, Tensor], keys: list[tuple[str, str | None]], lm_head: nn.Module, path: Path
) -> bool:
    """True when every head's projection is absent or a copy of the base lm_head (-> share)."""
    present = [weight_key in state for weight_key, _ in keys]
    if any(present) and not all(present):
        raise EntmtpError(f"{path}: some heads have a vocabulary projection and some do not")
    if not any(present):
        return True
    return all(
        _same_as_lm_head(state[w], state.get(b) if b else None, lm_head) for w, b in keys
    )


def _load_medusa(folder: Path, config: Mapping[str, Any], module: nn.Module) -> DraftHeads:
    num_heads = _int_field(config, "medusa_num_heads", folder)
    num_layers = _int_field(config, "medusa_num_layers", folder, default=1)
    path = _weights_file(folder, "medusa_lm_head")
    state = _strip_prefix(_read_state(path), "medusa_head.")
    hidden_size, vocab_size = base_dimensions(module)
    first = state.get("0.0.linear.weight")
    if first is None:
        raise EntmtpError(f"{path} has no key 0.0.linear.weight; it is not a Medusa head file")
    projection = state.get(f"0.{num_layers}.weight")
    _check_base_match(
        folder,
        int(first.shape[1]),
        int(projection.shape[0]) if projection is not None else vocab_size,
        module,
    )
    lm_head = module.get_output_embeddings()
    keys = [(f"{h}.{num_layers}.weight", None) for h in range(num_heads)]
    shared = _shared_or_own(state, keys, lm_head, path)
    heads = MedusaHeads(
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        lm_head=lm_head if shared else None,
    )
    own: dict[str, Tensor] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            for part in ("weight", "bias"):
                own[f"blocks.{h}.{layer}.linear.{part}"] = _take(
                    state, f"{h}.{layer}.linear.{part}", path
                )
        if not shared:
            own[f"proj.{h}.weight"] = state[f"{h}.{num_layers}.weight"]
    _load_state_into(heads, own, path)
    heads.base_model_name = str(config.get("base_model_name_or_path", ""))
    return heads


def _load_hydra(folder: Path, config: Mapping[str, Any], module: nn.Module) -> DraftHeads:
    arch = config.get("hydra_head_arch", "mlp")
    if arch != "mlp":
        raise EntmtpError(
            f"{folder}: Hydra head architecture {arch!r} is not supported; entmtp reads "
            "hydra_head_arch 'mlp' only"
        )
    if config.get("hidden_state_offset", 0):
        raise EntmtpError(
            f"{folder}: Hydra heads with hidden_state_offset "
            f"{config.get('hidden_state_offset')} read an inner layer, which is not supported; "
            "entmtp feeds the final-norm hidden state (offset 0)"
        )
    num_heads = _int_field(config, "hydra_num_heads", folder)
    num_layers = _int_field(config, "hydra_num_layers", folder, default=1)
    grounded = bool(config.get("grounded_heads", False))
    path = _weights_file(folder, "hydra_lm_head")
    state = _read_state(path)
    first = state.get("hydra_mlp.0.0.linear.weight")
    projection = state.get("hydra_lm_head.0.weight")
    if first is None or projection is None:
        raise EntmtpError(f"{path} has no hydra_mlp.0.0.linear.weight or "
                          "hydra_lm_head.0.weight; it is not a Hydra mlp head file")
    hidden_size = int(first.shape[0])
    _check_base_match(folder, hidden_size, int(projection.shape[0]), module)
    if int(first.shape[1]) != (2 if grounded else 1) * hidden_size:
        raise EntmtpError(
            f"{path}: first Hydra block reads {int(first.shape[1])} features, which does not "
            f"match grounded_heads={grounded} with hidden size {hidden_size}"
        )
    vocab_size = int(projection.shape[0])
    lm_head = module.get_output_embeddings()
    keys = [(f"hydra_lm_head.{h}.weight", f"hydra_lm_head.{h}.bias") for h in range(num_heads)]
    shared = _shared_or_own(state, keys, lm_head, path)
    heads = HydraHeads(
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        embed=module.get_input_embeddings(),
        lm_head=lm_head if shared else None,
        grounded=grounded,
    )
    own: dict[str, Tensor] = {}
    for h in range(num_heads):
        for part in ("weight", "bias"):
            own[f"first.{h}.linear.{part}"] = _take(state, f"hydra_mlp.{h}.0.linear.{part}", path)
            if grounded:
                own[f"first.{h}.residual.{part}"] = _take(
                    state, f"hydra_mlp.{h}.0.res_connection.{part}", path
                )
            for layer in range(1, num_layers):
                own[f"blocks.{h}.{layer - 1}.linear.{part}"] = _take(
                    state, f"hydra_mlp.{h}.{layer}.linear.{part}", path
                )
        if not shared:
            own[f"proj.{h}.weight"] = state[f"hydra_lm_head.{h}.weight"]
            bias = state.get(f"hydra_lm_head.{h}.bias")
            own[f"proj.{h}.bias"] = bias if bias is not None else torch.zeros(vocab_size)
    _load_state_into(heads, own, path)
    heads.base_model_name = str(config.get("base_model_name_or_path", ""))
    return heads


def _strip_prefix(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    if state and all(name.startswith(prefix) for name in state):
        return {name[len(prefix):]: tensor for name, tensor in state.items()}
    return state


def _take(state: Mapping[str, Tensor], key: str, path: Path) -> Tensor:
    if key not in state:
        raise EntmtpError(f"head weights {path} lack {key}; the file does not match its config")
    return state[key]
