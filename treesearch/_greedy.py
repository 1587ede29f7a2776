"""The best tree for a node budget: the most probable rank prefixes.

Expected accepted length is additive over nodes (``1 + sum_{v in T} P(v)``) and a prefix is never
more probable than its parent, so the ``n`` most probable prefixes (ties broken by depth, then
lexicographic path, which keeps parents ahead of children) form the optimal prefix-closed tree of
``n`` nodes, and the optimal trees for budgets 1, 2, ... are nested: one sort serves them all.

Budgets larger than the number of observed prefixes stop at the observed count: any further node
has empirical probability 0 and would only add latency.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from entmtp.core import EntmtpError

from ._acceptance import PrefixTable, prefix_table
from ._tree import Path, Tree, _canonical_key


def _tree_from_rows(table: PrefixTable, rows: Sequence[int] | np.ndarray) -> Tree:
    # Rows from the greedy order are prefix-closed by construction; skip re-validation.
    return Tree(tuple(sorted((table.path(int(r)) for r in rows), key=_canonical_key)))


def _check_budget(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise EntmtpError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def best_tree(
    ranks: np.ndarray,
    num_nodes: int,
    *,
    max_depth: int | None = None,
    topk: int | Sequence[int] | None = None,
) -> Tree:
    """The ``num_nodes``-node tree with the highest empirical expected accept length on ``ranks``.

    Has fewer nodes when fewer prefixes were observed. ``max_depth`` caps the depth, ``topk``
    the ranks (one int or one per head).
    """
    num_nodes = _check_budget("num_nodes", num_nodes)
    table = prefix_table(ranks, max_depth=max_depth, topk=topk)
    return _tree_from_rows(table, range(min(num_nodes, table.num_prefixes)))


def best_trees(
    ranks: np.ndarray,
    max_nodes: int,
    *,
    max_depth: int | None = None,
    topk: int | Sequence[int] | None = None,
) -> list[Tree]:
    """Optimal trees for budgets 1..max_nodes (element ``i`` has ``i + 1`` nodes), nested.

    The list stops early when fewer than ``max_nodes`` prefixes were observed.
    """
    return best_trees_from_table(
        prefix_table(ranks, max_depth=max_depth, topk=topk), max_nodes
    )


def best_trees_from_table(table: PrefixTable, max_nodes: int) -> list[Tree]:
    """``best_trees`` on a precomputed ``PrefixTable`` (reuse one table across many calls)."""
    count = min(_check_budget("max_nodes", max_nodes), table.num_prefixes)
    paths = [table.path(i) for i in range(count)]
    trees = []
    for n in range(1, count + 1):
        trees.append(Tree(tuple(sorted(paths[:n], key=_canonical_key))))
    return trees


def greedy_accept_lengths(table: PrefixTable, max_nodes: int) -> np.ndarray:
    """[min(max_nodes, prefixes)] float64: expected accept length of the best tree per budget."""
    count = min(_check_budget("max_nodes", max_nodes), table.num_prefixes)
    if table.num_positions == 0:
        return np.ones(count)
    totals = np.cumsum(table.counts[:count])
    return (table.num_positions + totals) / table.num_positions


def independence_tree(rank_probs_per_head: np.ndarray, num_nodes: int) -> Tree:
    """Medusa's construction: grow the tree by repeatedly adding the frontier node with the
    highest product probability ``prod_j p_j(r_j)`` (heads assumed independent).

    ``rank_probs_per_head`` is [heads, topk] with ``p_j(r) = P(rank_j == r)``. Ties go to the
    shallower, then lexicographically smaller path; zero-probability nodes are never added.
    """
    probs = np.asarray(rank_probs_per_head, dtype=np.float64)
    if probs.ndim != 2:
        raise EntmtpError("rank_probs_per_head must be a 2-D array [heads, topk]")
    num_nodes = _check_budget("num_nodes", num_nodes)
    heads, topk = probs.shape
    chosen: list[Path] = []
    frontier: list[tuple[float, int, Path]] = []

    def push_children(path: Path, prob: float) -> None:
        depth = len(path)
        if depth >= heads:
            return
        for rank in range(topk):
            child_prob = prob * probs[depth, rank]
            if child_prob > 0:
                heapq.heappush(frontier, (-child_prob, depth + 1, (*path, rank)))

    push_children((), 1.0)
    while frontier and len(chosen) < num_nodes:
        neg_prob, _, path = heapq.heappop(frontier)
        chosen.append(path)
        push_children(path, -neg_prob)
    return Tree(tuple(sorted(chosen, key=_canonical_key)))
