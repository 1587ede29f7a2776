"""Exact acceptance under greedy verification.

A step at position ``t`` accepts the base model's own token plus the longest tree path whose
ranks equal the true ranks ``(r_1(t), ..., r_d(t))``: ``accepted = 1 + d*``.
"""

from __future__ import annotations

import numpy as np

from ._tree import Tree


def _prefix_codes(ranks: np.ndarray, base: int) -> np.ndarray:
    """codes[t, d-1] identifies the rank prefix of length d at position t; -1 once a miss occurs.

    A prefix ``(r_1..r_d)`` maps to ``sum_j (r_j + 1) * base**(d-j)`` which is injective for ranks
    in ``[0, base-1)``; int64 holds it for ``base**depth < 2**63``.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    positions, depth = ranks.shape
    codes = np.full((positions, depth), -1, dtype=np.int64)
    running = np.zeros(positions, dtype=np.int64)
    alive = np.ones(positions, dtype=bool)
    for d in range(depth):
        alive &= ranks[:, d] >= 0
        running = running * base + ranks[:, d] + 1
        codes[:, d] = np.where(alive, running, -1)
    return codes


def _path_code(path: tuple[int, ...], base: int) -> int:
    code = 0
    for rank in path:
        code = code * base + rank + 1
    return code


def accept_lengths(tree: Tree, ranks: np.ndarray) -> np.ndarray:
    """Tokens accepted by a step at each position: ``1 + d*`` as an int64 array [positions]."""
    ranks = np.asarray(ranks)
    positions = ranks.shape[0]
    depth = min(tree.depth, ranks.shape[1])
    if depth == 0 or positions == 0:
        return np.ones(positions, dtype=np.int64)
    base = int(max(ranks.max(initial=0), max((max(p) for p in tree.paths), default=0))) + 2
    codes = _prefix_codes(ranks[:, :depth], base)
    accepted = np.ones(positions, dtype=np.int64)
    still = np.ones(positions, dtype=bool)
    for d in range(depth):
        level = np.array(
            [_path_code(p, base) for p in tree.paths if len(p) == d + 1], dtype=np.int64
        )
        still &= np.isin(codes[:, d], level)
        accepted += still
    return accepted


def expected_accept_length(tree: Tree, ranks: np.ndarray) -> float:
    """Mean accepted tokens per step over the positions of ``ranks`` (empirical prefix model)."""
    ranks = np.asarray(ranks)
    if ranks.shape[0] == 0:
        return 1.0
    return float(accept_lengths(tree, ranks).mean())
