"""The profiler: greedy trajectories -> per-position base entropy and head rank vectors.

For each batch of prompts:
1. ``greedy_generate`` (``_greedy``): the base model's greedy continuation (left-padded batch,
   KV cache), up to and including the first EOS token, at most ``max_new_tokens``.
2. ``trajectory_traces`` (``entmtp.evaluation``): one teacher-forced forward over prompt +
   generated tokens per trajectory gives each generated position's base entropy and head ranks.

With ``shard_dir`` each finished prompt's trace is written (atomically) to its own ``.npz`` and a
re-run skips it: an interrupted job resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entmtp.core import EntmtpError, atomic_write
from entmtp.evaluation import check_heads_fit, profile_meta, trajectory_traces
from entmtp.model import BaseModel, greedy_generate, model_fingerprint
from entmtp.treesearch import Profile, ProfileMeta, Trace, values_problem

from ._tasks import TaskPrompt

_SHARD_FORMAT_VERSION = 1

ProgressCallback = Callable[[int, int], None]  # (generated tokens so far, prompts done)


# -- sharding --------------------------------------------------------------------------------
def shard_prompts(
    prompts: Sequence[TaskPrompt], num_shards: int, shard_index: int
) -> list[TaskPrompt]:
    """Every ``num_shards``-th prompt starting at ``shard_index``: shards are a disjoint cover."""
    _check_shard(num_shards, shard_index)
    return list(prompts[shard_index::num_shards])


def resolve_shard(num_shards: int | None = None, shard_index: int | None = None) -> tuple[int, int]:
    """Explicit shard options, else torchrun's WORLD_SIZE / RANK, else a single shard."""
    if num_shards is None and shard_index is None:
        try:
            num_shards = int(os.environ.get("WORLD_SIZE", "1"))
            shard_index = int(os.environ.get("RANK", "0"))
        except ValueError as err:
            raise EntmtpError(f"WORLD_SIZE / RANK are not integers ({err}): unset them or pass "
                              "--num-shards and --shard-index") from err
    elif num_shards is None or shard_index is None:
        raise EntmtpError("--num-shards and --shard-index go together: pass both or neither")
    _check_shard(num_shards, shard_index)
    return num_shards, shard_index


def _check_shard(num_shards: int, shard_index: int) -> None:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise EntmtpError(f"shard index {shard_index} of {num_shards} shards is out of range: use "
                          "--num-shards S >= 1 and 0 <= --shard-index < S")


# -- the profiler ----------------------------------------------------------------------------
def profile_prompts(
    base: BaseModel,
    heads: Any,
    prompts: Sequence[TaskPrompt],
    *,
    max_new_tokens: int = 128,
    topk: int = 10,
    batch_size: int = 8,
    shard_dir: str | os.PathLike | None = None,
    progress: ProgressCallback | Any | None = None,
    task: str = "",
    split: str = "",
    seed: int = 0,
) -> Profile:
    """Profile ``prompts``; traces come back ordered by ``TaskPrompt.index``.

    ``heads`` follows the DraftHeads interface (``head_type``, ``num_heads``, ``hidden_size``,
    ``vocab_size``, ``head_logits(depth, hidden, prefix_tokens)``, ``sha256()``). ``progress``:
    a callback ``(generated_tokens, prompts_done)`` or a ``rich.progress.Progress``.
    """
    if max_new_tokens < 1 or topk < 1 or batch_size < 1:
        raise EntmtpError("--max-new-tokens, top-k and batch size must each be at least 1")
    check_heads_fit(base, heads)
    indices = [p.index for p in prompts]
    if len(set(indices)) != len(indices):
        raise EntmtpError("the same prompt appears twice in the list to profile")
    meta = profile_meta(base, heads, task=task, topk=topk, split=split,
                        max_new_tokens=max_new_tokens, seed=seed)
    settings = _settings_key(base, meta)
    folder = Path(shard_dir) if shard_dir is not None else None
    eos = sorted(base.eos_token_ids)

    traces: dict[int, Trace] = {}
    todo: list[tuple[TaskPrompt, list[int]]] = []
    for prompt in prompts:
        ids = base.encode_task_prompt(prompt)
        if not ids:
            raise EntmtpError(f"prompt {prompt.prompt_id} encodes to no tokens: drop it")
        base.check_fits_context(prompt.prompt_id, len(ids), max_new_tokens)
        stored = (_read_trace(folder, prompt, ids, settings, meta.topk) if folder is not None
                  else None)
        if stored is not None:
            traces[prompt.index] = stored
        else:
            todo.append((prompt, ids))
    report = _Progress(progress, total=len(prompts), already_done=len(traces))
    todo.sort(key=lambda item: len(item[1]))  # similar lengths share a batch: less padding

    with torch.inference_mode():
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            prompt_ids = [ids for _, ids in batch]
            generated = [run.tokens for run in greedy_generate(
                base.model, prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos)]
            for (prompt, ids), trace in zip(
                    batch, trajectory_traces(base.model, heads, batch, generated, topk=topk),
                    strict=True):
                if folder is not None:
                    _write_trace(folder, trace, ids, settings)
                traces[prompt.index] = trace
            report.advance(prompts=len(batch), tokens=sum(len(g) for g in generated))
    report.close()
    return Profile(meta, [traces[i] for i in sorted(traces)])


# -- resume: one small file per finished prompt ----------------------------------------------
def _settings_key(base: BaseModel, meta: ProfileMeta) -> str:
    settings = {
        "model": model_fingerprint(base), "eos": sorted(base.eos_token_ids),
        "dtype": meta.extra.get("dtype"), "head_type": meta.head_type,
        "num_heads": meta.num_heads, "heads_sha256": meta.heads_sha256, "topk": meta.topk,
        "max_new_tokens": meta.max_new_tokens, "fields": ["entropy", "ranks", "draft_entropy"],
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _tokens_key(ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def _trace_path(folder: Path, index: int) -> Path:
    return folder / f"prompt-{index:07d}.npz"


def _write_trace(folder: Path, trace: Trace, ids: Sequence[int], settings: str) -> None:
    header = {"format_version": _SHARD_FORMAT_VERSION, "settings": settings,
              "prompt_id": trace.prompt_id, "prompt_tokens": _tokens_key(ids)}
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
        "entropy": trace.entropy,
        "ranks": trace.ranks,
        "draft_entropy": trace.draft_entropy,
    }
    atomic_write(_trace_path(folder, trace.prompt_index),
                 lambda handle: np.savez(handle, **arrays))


def _read_trace(folder: Path, prompt: TaskPrompt, ids: Sequence[int], settings: str,
                topk: int) -> Trace | None:
    """The stored trace of ``prompt``, or None when absent or made with other settings."""
    path = _trace_path(folder, prompt.index)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode("utf-8"))
            entropy, ranks = data["entropy"], data["ranks"]
            draft = data["draft_entropy"]
    # A cut-off .npz fails in zipfile (BadZipFile, EOFError); a garbled header in the decoder.
    except (OSError, ValueError, KeyError, EOFError, RecursionError, zipfile.BadZipFile):
        return None  # unreadable: profile the prompt again and overwrite it
    expected = {"format_version": _SHARD_FORMAT_VERSION, "settings": settings,
                "prompt_id": prompt.prompt_id, "prompt_tokens": _tokens_key(ids)}
    if header != expected:
        return None
    try:
        trace = Trace(prompt.index, prompt.prompt_id, entropy, ranks, prompt_length=len(ids),
                      draft_entropy=draft)
    except EntmtpError:  # arrays of mismatched shapes
        return None
    if values_problem(trace.entropy, trace.ranks, trace.draft_entropy, topk=topk) is not None:
        return None  # NaN or impossible values: profile the prompt again
    return trace


# -- progress ---------------------------------------------------------------------------------
class _Progress:
    """Feeds a ``(tokens, prompts_done)`` callback or a rich Progress bar with tokens/s."""

    def __init__(self, sink: Any, *, total: int, already_done: int) -> None:
        self.sink, self.tokens, self.done = sink, 0, already_done
        self.started = time.perf_counter()
        self.task_id = None
        if sink is not None and hasattr(sink, "add_task"):
            self.task_id = sink.add_task("profiling", total=total, completed=already_done)
        elif callable(sink):
            sink(0, already_done)

    def advance(self, *, prompts: int, tokens: int) -> None:
        self.tokens += tokens
        self.done += prompts
        if self.task_id is not None:
            rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
            self.sink.update(self.task_id, advance=prompts,
                             description=f"profiling ({rate:.1f} tokens/s)")
        elif callable(self.sink):
            self.sink(self.tokens, self.done)

    def close(self) -> None:
        if self.task_id is not None:
            self.sink.refresh()
