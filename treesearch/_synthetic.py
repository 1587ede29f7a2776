"""Synthetic profiles: entropy regimes and head ranks with realistic structure, no model needed.

Each trace alternates low- and high-entropy regimes (a sticky two-state Markov chain). Head ``j``
at position ``i`` must predict token ``i + j`` from the state that also produced token ``i``; its
difficulty is the mean entropy of tokens ``i .. i+j``. Low difficulty: head 1 is top-1 about 80%
of the time; high: about 30%, with a heavier tail over ranks 1..k-1. Accuracy decays with depth.
Heads are *not* independent given entropy: once a head misses the top-1 (or the top-k), later
heads are likelier to miss, so deep all-hit paths are more common than the product of per-head
marginals says and Medusa's independence model is measurably off (pessimistic) on these profiles.
"""

from __future__ import annotations

import numpy as np

from entmtp.core import EntmtpError

from ._profile import Profile, ProfileMeta, Trace

LOW_ENTROPY = (0.1, 0.8)  # nats, range of a low regime's level
HIGH_ENTROPY = (2.0, 4.0)  # nats, range of a high regime's level
MEAN_RUN = {"low": 40.0, "high": 20.0}  # mean regime length in positions
DEPTH_DECAY = 0.78  # each deeper head's top-1 chance relative to the previous
TOP1_LOW, TOP1_HIGH = 0.82, 0.30  # head 1's top-1 chance at the easiest / hardest difficulty
TAIL_LOW, TAIL_HIGH = 0.45, 0.65  # P(rank in 1..k-1 | not top-1)
RATIO_LOW, RATIO_HIGH = 0.35, 0.8  # geometric ratio of the rank tail over 1..k-1
AFTER_NOT_TOP1 = 0.8  # later heads' chances scale by this once a head is not top-1
AFTER_MISS = 0.55  # ... and by this once a head misses the top-k


def _regime_entropy(rng: np.random.Generator, positions: int) -> np.ndarray:
    """Per-position entropy (nats) of one trace: sticky regimes, a level per run, noise per step."""
    entropy = np.empty(positions, dtype=np.float64)
    high = bool(rng.random() < 1.0 / 3.0)
    i = 0
    while i < positions:
        mean_run = MEAN_RUN["high" if high else "low"]
        run = 1 + int(rng.geometric(1.0 / mean_run))
        low_bound, high_bound = HIGH_ENTROPY if high else LOW_ENTROPY
        level = rng.uniform(low_bound, high_bound)
        noise = rng.lognormal(mean=0.0, sigma=0.35, size=min(run, positions - i))
        entropy[i : i + run] = level * noise
        i += run
        high = not high
    return np.clip(entropy, 0.01, 8.0)


def _difficulty(entropy: np.ndarray, heads: int) -> np.ndarray:
    """[positions, heads] in [0, 1]: mean entropy of tokens i..i+j, scaled; NaN past the end."""
    positions = len(entropy)
    cumulative = np.concatenate([[0.0], np.cumsum(entropy)])
    out = np.full((positions, heads), np.nan)
    index = np.arange(positions)
    for j in range(1, heads + 1):
        inside = index + j < positions
        i = index[inside]
        mean = (cumulative[i + j + 1] - cumulative[i]) / (j + 1)
        out[inside, j - 1] = np.clip((mean - LOW_ENTROPY[0]) / (HIGH_ENTROPY[1] - LOW_ENTROPY[0]),
                                     0.0, 1.0)
    return out


def _head_ranks(rng: np.random.Generator, difficulty: np.ndarray, topk: int) -> np.ndarray:
    positions, heads = difficulty.shape
    ranks = np.full((positions, heads), -1, dtype=np.int16)
    # Tail ranks 1..k-1 follow a truncated geometric whose ratio grows with difficulty.
    tail_ranks = np.arange(1, topk)
    scale = np.ones(positions)  # running penalty from earlier heads' misses
    for j in range(heads):
        u = difficulty[:, j]
        inside = ~np.isnan(u)
        u = np.where(inside, u, 0.0)
        top1 = (TOP1_LOW + (TOP1_HIGH - TOP1_LOW) * u) * DEPTH_DECAY**j * scale
        tail = (TAIL_LOW + (TAIL_HIGH - TAIL_LOW) * u) * np.sqrt(scale)
        draw = rng.random(positions)
        is_top1 = draw < top1
        in_tail = ~is_top1 & (draw < top1 + (1.0 - top1) * tail)
        rank = np.full(positions, -1, dtype=np.int64)
        rank[is_top1] = 0
        if topk > 1 and in_tail.any():
            ratio = RATIO_LOW + (RATIO_HIGH - RATIO_LOW) * u[in_tail]
            weights = ratio[:, None] ** (tail_ranks[None, :] - 1)
            cdf = np.cumsum(weights, axis=1)
            pick = rng.random(int(in_tail.sum())) * cdf[:, -1]
            rank[in_tail] = 1 + (cdf < pick[:, None]).sum(axis=1)
        rank[~inside] = -1
        ranks[:, j] = rank
        scale = scale * np.where(rank == 0, 1.0, np.where(rank > 0, AFTER_NOT_TOP1, AFTER_MISS))
    return ranks


def synthetic_profile(
    *,
    num_traces: int = 24,
    positions: int = 384,
    num_heads: int = 4,
    topk: int = 10,
    seed: int = 0,
    task: str = "synthetic",
    head_type: str = "medusa",
) -> Profile:
    """A deterministic (per ``seed``) profile with regime-switching entropy; see module doc."""
    for name, value, low in (
        ("num_traces", num_traces, 0),
        ("positions", positions, 1),
        ("num_heads", num_heads, 1),
        ("topk", topk, 1),
    ):
        if int(value) < low:
            raise EntmtpError(f"synthetic_profile: {name} must be >= {low}, got {value}")
    rng = np.random.default_rng(seed)
    traces = []
    for t in range(int(num_traces)):
        entropy = _regime_entropy(rng, int(positions))
        ranks = _head_ranks(rng, _difficulty(entropy, int(num_heads)), int(topk))
        traces.append(
            Trace(
                prompt_index=t,
                prompt_id=f"{task}-{t}",
                entropy=entropy.astype(np.float32),
                ranks=ranks,
                prompt_length=int(rng.integers(16, 256)),
            )
        )
    meta = ProfileMeta(
        model="synthetic",
        head_type=head_type,
        num_heads=int(num_heads),
        task=task,
        topk=int(topk),
        split="all",
        max_new_tokens=int(positions),
        seed=int(seed),
        extra={"synthetic": True},
    )
    return Profile(meta, traces)
