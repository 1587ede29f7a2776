"""Draft vocabularies: the tokens a head's top-k is taken over, chosen by frequency.

A draft head's vocabulary projection reads a ``[vocab, hidden]`` matrix for every row it scores;
for a small model with a large vocabulary (SmolLM2-135M: 49152 x 576) that read is most of a
drafting step on a CPU. Drafting over the most frequent tokens of the text the heads will see
(FR-Spec, Zhao et al. 2025; EAGLE-3's draft vocabulary) reads a fraction of it, and loses only
the drafts whose true token lies outside: verification still decides every token, so decoding
stays exactly the base model's.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def target_token_counts(sequences: Iterable[tuple[torch.Tensor, int]], vocab_size: int
                        ) -> np.ndarray:
    """How often each token is a trained target: [vocab_size] int64.

    ``sequences``: (tokens [L] int, start) pairs, as head data stores them; the targets are the
    tokens after the trained positions, ``tokens[start + 1:]``.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for tokens, start in sequences:
        targets = np.asarray(tokens[start + 1:], dtype=np.int64)
        if targets.size and (targets.min() < 0 or targets.max() >= vocab_size):
            raise ValueError(f"a token id lies outside 0..{vocab_size - 1}")
        counts += np.bincount(targets, minlength=vocab_size)
    return counts


def frequent_tokens(counts: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` most frequent token ids, sorted by id (ties: the smaller id first)."""
    if not 1 <= size <= len(counts):
        raise ValueError(f"size must be in 1..{len(counts)}, got {size}")
    order = np.lexsort((np.arange(len(counts)), -np.asarray(counts)))  # count desc, then id
    return np.sort(order[:size]).astype(np.int64)


def draft_vocab_coverage(counts: np.ndarray, token_ids: np.ndarray) -> float:
    """Fraction of the counted targets that ``token_ids`` holds (nan without targets)."""
    total = int(np.asarray(counts).sum())
    return float(np.asarray(counts)[np.asarray(token_ids)].sum()) / total if total else float("nan")
