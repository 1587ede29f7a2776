"""Pareto fronts of trees: maximize expected accept length, minimize step latency."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ._acceptance import PrefixTable, bucket_of, prefix_table
from ._candidate import _SOURCE_PRIORITY, DEFAULT_STUDY_NAME, CandidateSource, TreeCandidate
from ._greedy import _tree_from_rows, best_trees_from_table, greedy_accept_lengths
from ._latency import LatencyModel
from ._tree import Tree


def _tie_key(candidate: TreeCandidate) -> tuple:
    # Among candidates with equal (accept length, latency) keep the smallest tree, then by source.
    return (
        candidate.tree.num_nodes,
        _SOURCE_PRIORITY.get(candidate.source, len(_SOURCE_PRIORITY)),
        candidate.tree.depth,
        candidate.tree.paths,
    )


def pareto_front(candidates: Iterable[TreeCandidate]) -> list[TreeCandidate]:
    """Non-dominated candidates, sorted by latency; exact duplicates collapse to one."""
    ordered = sorted(
        candidates,
        key=lambda c: (c.latency_ms, -c.expected_accept_length, *_tie_key(c)),
    )
    front: list[TreeCandidate] = []
    best = -np.inf
    for candidate in ordered:
        # Sorted by latency, a candidate is dominated iff an earlier one accepts at least as much.
        if candidate.expected_accept_length > best:
            front.append(candidate)
            best = candidate.expected_accept_length
    return front


def greedy_candidates_from_table(
    table: PrefixTable, latency: LatencyModel, *, max_nodes: int, all_depths: bool = False
) -> list[TreeCandidate]:
    """Greedy candidates from a precomputed table; see ``greedy_candidates``."""
    trees = best_trees_from_table(table, max_nodes)
    accepts = greedy_accept_lengths(table, len(trees))
    candidates = _scored(trees, accepts, latency)
    if all_depths and trees:  # no trees: the heads never matched, plain decoding wins
        for cap in range(1, table.max_depth):
            rows = np.flatnonzero(table.depths <= cap)[: len(trees)]
            # Budgets whose uncapped tree is already this shallow would repeat it.
            first_new = int(np.argmax(table.depths[: len(trees)] > cap))
            if table.depths[: len(trees)].max(initial=0) <= cap:
                continue
            sizes = range(first_new + 1, len(rows) + 1)
            capped = [_tree_from_rows(table, rows[:n]) for n in sizes]
            totals = np.cumsum(table.counts[rows])
            capped_accepts = [
                (table.num_positions + int(totals[n - 1])) / max(table.num_positions, 1)
                for n in sizes
            ]
            candidates += _scored(capped, capped_accepts, latency)
    return candidates


def _scored(
    trees: Sequence[Tree], accepts: Sequence[float], latency: LatencyModel
) -> list[TreeCandidate]:
    if not trees:
        return []
    sizes = np.array([t.num_nodes for t in trees], dtype=np.int64)
    depths = np.array([t.depth for t in trees], dtype=np.int64)
    latencies = np.atleast_1d(latency.step_ms(sizes, depths))
    return [
        TreeCandidate(tree, float(a), float(ms), "greedy")
        for tree, a, ms in zip(trees, accepts, latencies, strict=True)
    ]


def greedy_candidates(
    ranks: np.ndarray,
    latency: LatencyModel,
    *,
    max_nodes: int,
    max_depth: int | None = None,
    topk: int | Sequence[int] | None = None,
    all_depths: bool = False,
) -> list[TreeCandidate]:
    """The optimal tree of every size 1..max_nodes, scored on ``ranks`` and ``latency``.

    ``all_depths=True`` adds the optimal trees of every size under each depth cap
    1..max_depth-1. Since ``LatencyModel`` charges by (size, depth), that family holds the exact
    Pareto front for it: the best tree of ``n`` nodes and depth at most ``D`` is the ``n`` most
    probable prefixes of depth at most ``D``.
    """
    table = prefix_table(ranks, max_depth=max_depth, topk=topk)
    return greedy_candidates_from_table(
        table, latency, max_nodes=max_nodes, all_depths=all_depths
    )


def build_front(
    ranks: np.ndarray,
    latency: LatencyModel,
    *,
    max_nodes: int = 64,
    max_depth: int | None = None,
    optuna_trials: int = 0,
    seed: int = 0,
    storage: str | None = None,
    study_name: str | None = None,
    topk: int | Sequence[int] | None = None,
    extra: Iterable[TreeCandidate] = (),
) -> list[TreeCandidate]:
    """Pareto front over greedy trees, ``optuna_trials`` shape-search trials, and ``extra``
    candidates (e.g. reference trees already scored on the same positions).

    When the latency model charges per level (``depth_ms > 0``) the greedy family includes the
    depth-capped optimal trees, which makes the greedy front exact for ``LatencyModel``; Optuna
    then only matters for costs that depend on shape beyond (size, depth).
    """
    table = prefix_table(ranks, max_depth=max_depth, topk=topk)
    candidates = greedy_candidates_from_table(
        table, latency, max_nodes=max_nodes, all_depths=latency.depth_ms > 0
    )
    if optuna_trials > 0:
        from ._shape_search import search_tree_shapes_on_table

        candidates += search_tree_shapes_on_table(
            table,
            latency,
            max_nodes=max_nodes,
            n_trials=optuna_trials,
            seed=seed,
            storage=storage,
            study_name=study_name,
        )
    return pareto_front([*candidates, *extra])


def fronts_by_bucket(
    entropy: np.ndarray,
    ranks: np.ndarray,
    edges: np.ndarray | Sequence[float],
    latency: LatencyModel,
    **kwargs,
) -> list[list[TreeCandidate]]:
    """One ``build_front`` per entropy bucket (bucket i holds [edges[i-1], edges[i])).

    An empty bucket gets an empty front. With Optuna storage, each bucket uses its own study
    (the study name suffixed with ``-bucket{i}``).
    """
    ranks = np.asarray(ranks)
    which = bucket_of(np.asarray(entropy, dtype=np.float64), edges)
    fronts = []
    for b in range(len(edges) + 1):
        mask = which == b
        if not mask.any():
            fronts.append([])
            continue
        bucket_kwargs = dict(kwargs)
        if bucket_kwargs.get("storage") or bucket_kwargs.get("study_name"):
            name = bucket_kwargs.get("study_name") or DEFAULT_STUDY_NAME
            bucket_kwargs["study_name"] = f"{name}-bucket{b}"
        fronts.append(build_front(ranks[mask], latency, **bucket_kwargs))
    return fronts


def score_tree(
    tree: Tree, ranks: np.ndarray, latency: LatencyModel, *, source: CandidateSource = "reference"
) -> TreeCandidate:
    """A candidate for any tree (e.g. a shipped reference tree) scored on ``ranks``."""
    from ._acceptance import expected_accept_length

    return TreeCandidate(
        tree, expected_accept_length(tree, ranks), float(latency.tree_ms(tree)), source
    )
