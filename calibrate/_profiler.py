"""The profiler: greedy trajectories -> per-position base entropy and head rank vectors.

For each batch of prompts:
1. ``greedy_generate`` (``_greedy``): the base model's greedy continuation (left-padded batch,
   KV cache), up to and including the first EOS token, at most ``max_new_tokens``.
2. ``score_trajectories``: one teacher-forced forward over prompt + generated tokens per
   trajectory. At generated token ``i`` (position ``i`` of ``treesearch._profile``): the entropy of
   the base distribution that produced it, and the final-norm hidden state that distribution
   was read from; head ``j`` at that hidden state ranks generated token ``i + j`` (Hydra: with
   the true tokens ``i .. i + j - 1`` as the drafted prefix), batched over all positions.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entmtp.core import HEAD_TYPES, EntmtpError, atomic_write
from entmtp.treesearch import Profile, ProfileMeta, Trace, values_problem

from ._greedy import greedy_generate
from ._heads import draft_columns
from ._model import BaseModel, model_fingerprint
from ._stats import entropy_from_logits, topk_ranks
from ._tasks import TaskPrompt

_SHARD_FORMAT_VERSION = 1
_HEAD_CHUNK = 512  # positions per head forward: bounds the [positions, vocab] logits in memory

ProgressCallback = Callable[[int, int], None]  # (generated tokens so far, prompts done)


@dataclass
class ScoredTrajectory:
    entropy: np.ndarray  # [generated] float32, nats
    ranks: np.ndarray  # [generated, heads] int16, -1 = miss / past the end
    draft_entropy: np.ndarray  # [generated] float32, nats: head 1's entropy at each state


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
    _check_heads_fit(base, heads)
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


def profile_trajectories(
    base: BaseModel,
    heads: Any,
    prompts: Sequence[tuple[Any, Sequence[int]]],
    trajectories: Sequence[Sequence[int]],
    *,
    topk: int,
    batch_size: int = 8,
    task: str = "",
    split: str = "",
) -> Profile:
    """The profile of given greedy trajectories (e.g. live autoregressive outputs): the
    profiler's scoring and assembly, without generating again. ``prompts``: (prompt with
    ``index`` and ``prompt_id``, its token ids) per trajectory, in the same order."""
    meta = profile_meta(base, heads, task=task, topk=topk, split=split,
                        max_new_tokens=max((len(t) for t in trajectories), default=0))
    traces: list[Trace] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            traces += trajectory_traces(base.model, heads, prompts[start : start + batch_size],
                                        trajectories[start : start + batch_size], topk=topk)
    return Profile(meta, traces)


def profile_meta(base: BaseModel, heads: Any, *, task: str, topk: int, split: str,
                 max_new_tokens: int, seed: int = 0) -> ProfileMeta:
    """What a profile of ``base`` with ``heads`` records about how it was made."""
    return ProfileMeta(
        model=base.name, vocab_size=base.vocab_size, hidden_size=base.hidden_size,
        head_type=heads.head_type, num_heads=heads.num_heads, heads_sha256=heads.sha256(),
        task=task, topk=topk, split=split, max_new_tokens=max_new_tokens, seed=seed,
        extra={"model_source": base.source, "dtype": str(base.model.dtype).replace("torch.", ""),
               **_draft_vocab_record(heads)},
    )


def _draft_vocab_record(heads: Any) -> dict[str, int]:
    """``draft_vocab_size`` of heads that draft over a subset of the vocabulary, else nothing
    (the profile's latency check compares it with what a latency model timed)."""
    size = getattr(heads, "draft_vocab_size", None)
    return {"draft_vocab_size": int(size)} if size is not None and size != heads.vocab_size \
        else {}


def trajectory_traces(model: Any, heads: Any, prompts: Sequence[tuple[Any, Sequence[int]]],
                      generated: Sequence[Sequence[int]], *, topk: int) -> list[Trace]:
    """One trace per (prompt, its token ids) and its greedy continuation in ``generated``."""
    prompt_ids = [ids for _, ids in prompts]
    scored = score_trajectories(model, heads, prompt_ids, [list(g) for g in generated],
                                topk=topk)
    return [Trace(prompt.index, prompt.prompt_id, result.entropy, result.ranks,
                  prompt_length=len(ids), draft_entropy=result.draft_entropy)
            for (prompt, ids), result in zip(prompts, scored, strict=True)]


def _check_heads_fit(base: BaseModel, heads: Any) -> None:
    if heads.head_type not in HEAD_TYPES:
        raise EntmtpError(f"unknown head type {heads.head_type!r}: use medusa or hydra")
    if heads.hidden_size != base.hidden_size or heads.vocab_size != base.vocab_size:
        raise EntmtpError(
            f"the heads expect hidden size {heads.hidden_size} and vocab {heads.vocab_size} but "
            f"the model has {base.hidden_size} and {base.vocab_size}: pass heads trained for "
            "this model"
        )


# -- step 2: one teacher-forced forward per trajectory ---------------------------------------
def score_trajectories(
    model: Any,
    heads: Any,
    prompt_ids: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    *,
    topk: int,
) -> list[ScoredTrajectory]:
    """Entropy and head ranks at every generated position of each (prompt, generated) pair.

    Each trajectory gets its own unpadded forward, so its numbers depend on nothing else in the
    batch: shards merge into exactly the single-process profile. (On a CPU a padded batch is
    no faster: the forward is compute-bound; generation, not scoring, dominates the cost.)
    """
    return [
        score_trajectory(model, heads, prompt, gen, topk=topk)
        for prompt, gen in zip(prompt_ids, generated, strict=True)
    ]


def score_trajectory(
    model: Any, heads: Any, prompt_ids: Sequence[int], generated: Sequence[int], *, topk: int
) -> ScoredTrajectory:
    device = model.get_input_embeddings().weight.device
    sequence = torch.tensor([list(prompt_ids) + list(generated)], dtype=torch.long, device=device)
    backbone = model.get_decoder()  # its output is the final-norm state that lm_head reads
    hidden = backbone(input_ids=sequence).last_hidden_state[0]  # [length, hidden]
    # generated token i was read from position len(prompt) - 1 + i
    count = len(generated)
    states = hidden[len(prompt_ids) - 1 : len(prompt_ids) - 1 + count]  # [count, hidden]
    tokens = sequence[0, len(prompt_ids) :]  # [count]

    lm_head = model.get_output_embeddings()
    entropy = torch.cat([entropy_from_logits(lm_head(chunk))
                         for chunk in states.split(_HEAD_CHUNK)])
    ranks = torch.full((count, heads.num_heads), -1, dtype=torch.long, device=device)
    draft_entropy = torch.zeros(count, dtype=torch.float32, device=device)
    for depth in range(1, heads.num_heads + 1):
        # depth 1 at every position (its entropy is the drafter's confidence there); ranks only
        # where a token i + depth exists
        positions = torch.arange(count if depth == 1 else max(count - depth, 0), device=device)
        if len(positions) == 0:
            continue
        for chunk in positions.split(_HEAD_CHUNK):
            prefix = None
            if heads.head_type == "hydra":  # root token i, then the true tokens i+1 .. i+depth-1
                prefix = tokens[chunk[:, None] + torch.arange(depth, device=device)]
            logits = heads.head_logits(depth, states[chunk], prefix)
            if depth == 1:
                draft_entropy[chunk] = entropy_from_logits(logits).float()
            scored = chunk[chunk + depth < count]
            ranks[scored, depth - 1] = topk_ranks(
                logits[: len(scored)], draft_columns(heads, tokens[scored + depth]), topk)
    return ScoredTrajectory(entropy.float().cpu().numpy(), ranks.cpu().numpy().astype(np.int16),
                            draft_entropy.cpu().numpy())


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
