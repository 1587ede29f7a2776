"""How sure a measured speedup is: a paired bootstrap over prompts.

Two rows of a bench decode the same prompts, interleaved. Their speedup is a ratio of rates,
``(sum tokens_a / sum ms_a) / (sum tokens_b / sum ms_b)``; resampling the prompts (with
replacement, the same prompts for both rows) and taking the percentiles of that ratio gives an
interval that holds the machine's timing noise and the prompts' spread. A 0.98x whose interval
reaches past 1.0 is not evidence of a slowdown.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entmtp.core import EntmtpError


def carryover_balanced_orders(count: int) -> list[list[int]]:
    """Run orders of ``count`` methods (a Williams design): every method takes every place
    equally often and follows every other method equally often, so what one method leaves
    behind (a large tree's buffers in the caches, a warm allocator) is no fixed neighbour's
    bias. ``count`` rows for an even count, ``2 * count`` (each row and its mirror) for odd."""
    if count < 1:
        raise EntmtpError(f"need at least one method to order, got {count}")
    first, low, high = [0], 1, count - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    rows = [[(m + shift) % count for m in first] for shift in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    return rows


def ratio_of_rates(tokens_a: Sequence[float], ms_a: Sequence[float],
                   tokens_b: Sequence[float], ms_b: Sequence[float]) -> float:
    """Rate of ``a`` over rate of ``b``, each its total tokens over its total time."""
    a = np.sum(tokens_a) / np.sum(ms_a)
    b = np.sum(tokens_b) / np.sum(ms_b)
    return float(a / b)


def paired_ratio_interval(
    tokens_a: Sequence[float], ms_a: Sequence[float],
    tokens_b: Sequence[float], ms_b: Sequence[float],
    *, level: float = 0.95, resamples: int = 4000, seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`ratio_of_rates`, resampling prompts in pairs.

    Every sequence has one entry per prompt, in the same prompt order; times must be positive.
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in (tokens_a, ms_a, tokens_b, ms_b)]
    count = len(arrays[0])
    if count == 0 or any(len(x) != count for x in arrays):
        raise EntmtpError("a paired ratio needs the same non-zero number of prompts in both rows")
    if min(arrays[1].min(), arrays[3].min()) <= 0:
        raise EntmtpError("a paired ratio needs positive decoding times for every prompt")
    if not 0 < level < 1:
        raise EntmtpError(f"confidence level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(resamples, count))
    sums = [x[picks].sum(axis=1) for x in arrays]
    ratios = (sums[0] / sums[1]) / (sums[2] / sums[3])
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)
