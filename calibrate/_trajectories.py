"""Base-model runs kept for head training, and their files.

The base model runs once: batched greedy generation from prompts (self-distillation: the heads
learn the base model's own continuations) or one teacher-forced pass over given text. Each run
is kept as a :class:`Trajectory` of final-norm hidden states and the tokens they chose, so that
the heads then train for several epochs on the cache without touching the base model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from entmtp.core import EntmtpError, atomic_write
from entmtp.model import greedy_generate, unwrap_base

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class Trajectory:
    """One base-model run: ``hidden[s]`` is the final-norm state whose logits chose ``tokens[s]``.

    Self-distillation: ``tokens`` are the greedy continuation of a prompt and ``hidden[0]`` is
    the state at the prompt's last token. Text: ``tokens[s]`` is the text token after position s.
    """

    hidden: Tensor  # [T, hidden_size] float
    tokens: Tensor  # [T] int64
    source: str = ""  # a label (e.g. the task) for per-source accuracy

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _eos_ids(base: Any, module: torch.nn.Module) -> set[int]:
    ids = getattr(base, "eos_token_ids", None)
    if ids is None:
        ids = getattr(module.config, "eos_token_id", None)
    if ids is None:
        return set()
    if isinstance(ids, int):
        return {ids}
    return {int(i) for i in ids}


def _prompt_ids(base: Any, item: Any) -> list[int]:
    """Token ids of a prompt given as token ids, text, or a TaskPrompt (or anything with
    ``.text``)."""
    if hasattr(item, "text_for") and hasattr(base, "encode_task_prompt"):
        return list(base.encode_task_prompt(item))
    text = getattr(item, "text", item)
    if isinstance(text, str):
        encode = getattr(base, "encode_prompt", None)
        if encode is None:
            raise EntmtpError(
                "text prompts need a base model with encode_prompt (load it with "
                "entmtp's load_base_model); or pass token ids"
            )
        ids = encode(text)
    else:
        ids = text
    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1).tolist()
    if not ids:
        raise EntmtpError("an empty prompt cannot be continued; drop it from the data")
    return ids


def _text_ids(base: Any, item: Any) -> list[int]:
    text = getattr(item, "text", item)
    if isinstance(text, str):
        tokenizer = getattr(base, "tokenizer", None)
        if tokenizer is None:
            raise EntmtpError("text mode needs a base model with a tokenizer, or token ids")
        return list(tokenizer(text)["input_ids"])
    return torch.as_tensor(text, dtype=torch.int64).reshape(-1).tolist()


def _report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


def generate_trajectories(
    base: Any,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    sources: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """Greedy trajectories of ``prompts`` (text, TaskPrompt-like, or token ids), in order.

    Prompts are batched by length to keep left padding small.
    """
    module = unwrap_base(base)
    eos_ids = _eos_ids(base, module)
    ids = [_prompt_ids(base, prompt) for prompt in prompts]
    labels = list(sources) if sources is not None else [""] * len(ids)
    if len(labels) != len(ids):
        raise EntmtpError(f"{len(labels)} source labels for {len(ids)} prompts")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    result: list[Trajectory | None] = [None] * len(ids)
    _report(progress, "generate", 0, len(ids))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        runs = greedy_generate(module, [ids[i] for i in chunk], max_new_tokens=max_new_tokens,
                               eos_token_ids=eos_ids, keep_hidden=True)
        for index, run in zip(chunk, runs, strict=True):
            tokens = torch.tensor(run.tokens, dtype=torch.int64)
            result[index] = Trajectory(hidden=run.hidden, tokens=tokens, source=labels[index])
        _report(progress, "generate", min(start + batch_size, len(ids)), len(ids))
    return [trajectory for trajectory in result if trajectory is not None]


@torch.inference_mode()
def text_trajectories(
    base: Any,
    texts: Sequence[Any],
    *,
    max_length: int = 512,
    batch_size: int = 8,
    sources: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> list[Trajectory]:
    """Teacher-forced trajectories of ``texts`` cut into windows of ``max_length`` tokens."""
    module = unwrap_base(base)
    decoder = module.base_model
    device = next(module.parameters()).device
    labels = list(sources) if sources is not None else [""] * len(texts)
    windows: list[tuple[list[int], str]] = []
    for text, label in zip(texts, labels, strict=True):
        ids = _text_ids(base, text)
        for start in range(0, max(len(ids) - 1, 0), max_length - 1):
            window = ids[start:start + max_length]
            if len(window) >= 2:
                windows.append((window, label))
    result: list[Trajectory] = []
    _report(progress, "forward", 0, len(windows))
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        width = max(len(window) for window, _ in chunk)
        input_ids = torch.zeros((len(chunk), width), dtype=torch.int64, device=device)
        mask = torch.zeros_like(input_ids)
        for row, (window, _) in enumerate(chunk):
            input_ids[row, : len(window)] = torch.as_tensor(window)
            mask[row, : len(window)] = 1
        hidden = decoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        for row, (window, label) in enumerate(chunk):
            length = len(window)
            result.append(
                Trajectory(
                    hidden=hidden[row, : length - 1].float().cpu().clone(),
                    tokens=input_ids[row, 1:length].cpu().clone(),
                    source=label,
                )
            )
        _report(progress, "forward", min(start + batch_size, len(windows)), len(windows))
    return result


def save_trajectories(path: str | os.PathLike, trajectories: Sequence[Trajectory], *,
                      key: dict[str, Any] | None = None) -> Path:
    """One safetensors file (concatenated hidden states and tokens, lengths, sources, and
    ``key``: what the states were computed from, read back by ``trajectories_key``)."""
    from safetensors.torch import save

    if not trajectories:
        raise EntmtpError("no trajectories to save")
    tensors = {
        "hidden": torch.cat([t.hidden for t in trajectories]).contiguous(),
        "tokens": torch.cat([t.tokens for t in trajectories]).contiguous(),
        "lengths": torch.as_tensor([len(t) for t in trajectories], dtype=torch.int64),
    }
    metadata = {"sources": json.dumps([t.source for t in trajectories])}
    if key is not None:
        metadata["key"] = json.dumps(key, sort_keys=True)
    payload = save(tensors, metadata=metadata)
    return atomic_write(path, lambda handle: handle.write(payload))


def trajectories_key(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``key`` a trajectories file was saved with (None: saved without one)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            text = (handle.metadata() or {}).get("key")
        return None if text is None else json.loads(text)
    except Exception as err:
        raise EntmtpError(f"cannot read trajectories {path}: {err}") from err


def load_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            sources = json.loads((handle.metadata() or {}).get("sources", "[]"))
            hidden, tokens, lengths = (
                handle.get_tensor(name) for name in ("hidden", "tokens", "lengths")
            )
    except Exception as err:
        raise EntmtpError(f"cannot read trajectories {path}: {err}") from err
    result, offset = [], 0
    for index, length in enumerate(lengths.tolist()):
        source = sources[index] if index < len(sources) else ""
        result.append(
            Trajectory(hidden[offset:offset + length], tokens[offset:offset + length], source)
        )
        offset += length
    return result

