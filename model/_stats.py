"""Per-position statistics shared by the profiler and live decoding, so both agree exactly.

``entropy_from_logits``: Shannon entropy (nats) of softmax(logits), computed in float32.
``topk_ranks``: where a target token sits in ``torch.topk(logits, k)`` order. The live drafter
takes its candidates by ``torch.topk`` index, so ranks must use the same ordering (ties
included) rather than a sort of our own.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last dim: ``[..., vocab] -> [...]`` float32."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    # exp(-inf) * -inf is nan; a zero-probability token contributes nothing.
    terms = torch.where(
        torch.isneginf(log_probs), torch.zeros_like(log_probs), log_probs.exp() * log_probs
    )
    return -terms.sum(dim=-1)


def topk_ranks(logits: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Rank of ``targets`` in ``torch.topk(logits, k)`` order; -1 when outside the top-k.

    logits: [..., vocab]; targets: [...] long (a negative target never matches). Returns [...]
    long. ``k`` is clamped to the vocabulary size.
    """
    if k < 1:
        raise ValueError(f"top-k must be at least 1, got {k}")
    k = min(int(k), logits.shape[-1])
    top = torch.topk(logits, k, dim=-1).indices  # [..., k]
    hits = top == targets.unsqueeze(-1)
    first_hit = hits.to(torch.int8).argmax(dim=-1)  # the first True (topk indices are distinct)
    return torch.where(hits.any(dim=-1), first_hit, torch.full_like(first_hit, -1)).long()
