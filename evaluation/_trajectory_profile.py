"""The profile of greedy trajectories: per generated position the base model's entropy and
where each draft head ranks the true future token.

``score_trajectory``: one teacher-forced forward over prompt + generated tokens. At generated
token ``i`` (position ``i`` of a treesearch ``Trace``): the entropy of the base distribution that
produced it, and the final-norm hidden state that distribution was read from; head ``j`` at that
hidden state ranks generated token ``i + j`` (Hydra: with the true tokens ``i .. i + j - 1`` as
the drafted prefix), batched over all positions. The calibration profiler scores the trajectories
it generates with it, and live validation the trajectories that decoding produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from entmtp.core import HEAD_TYPES, EntmtpError
from entmtp.model import BaseModel, draft_columns, entropy_from_logits, topk_ranks
from entmtp.treesearch import Profile, ProfileMeta, Trace

_HEAD_CHUNK = 512  # positions per head forward: bounds the [positions, vocab] logits in memory


@dataclass
class ScoredTrajectory:
    entropy: np.ndarray  # [generated] float32, nats
    ranks: np.ndarray  # [generated, heads] int16, -1 = miss / past the end
    draft_entropy: np.ndarray  # [generated] float32, nats: head 1's entropy at each state


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


def check_heads_fit(base: BaseModel, heads: Any) -> None:
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
