"""Pareto fronts against O(n^2) dominance checks and brute force over every small tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.treesearch._acceptance import bucket_of, expected_accept_length, prefix_probabilities
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._pareto import (
    TreeCandidate,
    build_front,
    fronts_by_bucket,
    greedy_candidates,
    pareto_front,
    score_tree,
)
from entmtp.treesearch._tree import Tree

SOURCES = ("greedy", "optuna", "reference")


def dominates(a: TreeCandidate, b: TreeCandidate) -> bool:
    return (
        a.expected_accept_length >= b.expected_accept_length
        and a.latency_ms <= b.latency_ms
        and (a.expected_accept_length > b.expected_accept_length or a.latency_ms < b.latency_ms)
    )


def weakly_covered(point: TreeCandidate, front: list[TreeCandidate], tol: float = 1e-12) -> bool:
    return any(
        f.expected_accept_length >= point.expected_accept_length - tol
        and f.latency_ms <= point.latency_ms + tol
        for f in front
    )


@st.composite
def candidate_lists(draw) -> list[TreeCandidate]:
    # Values on a coarse grid so that ties and exact duplicates are common.
    size = draw(st.integers(0, 30))
    out = []
    for i in range(size):
        accept = draw(st.integers(0, 8)) / 4 + 1
        latency = draw(st.integers(1, 8)) * 2.5
        source = draw(st.sampled_from(SOURCES))
        tree = Tree.from_paths([[r] for r in range(1 + i % 5)])
        out.append(TreeCandidate(tree, accept, latency, source))
    return out


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists())
def test_pareto_front_matches_brute_force_dominance(candidates: list[TreeCandidate]) -> None:
    front = pareto_front(candidates)
    nondominated = {
        (c.expected_accept_length, c.latency_ms)
        for c in candidates
        if not any(dominates(o, c) for o in candidates)
    }
    points = [(c.expected_accept_length, c.latency_ms) for c in front]
    assert set(points) == nondominated
    assert len(points) == len(set(points))  # duplicates collapsed
    assert [c.latency_ms for c in front] == sorted(c.latency_ms for c in front)
    assert all(any(c is f for c in candidates) for f in front)


def test_pareto_front_prefers_smaller_tree_among_duplicates() -> None:
    small = Tree.from_paths([[0]])
    large = Tree.from_paths([[0], [1]])
    front = pareto_front(
        [TreeCandidate(large, 2.0, 5.0, "optuna"), TreeCandidate(small, 2.0, 5.0, "greedy")]
    )
    assert [c.tree for c in front] == [small]


def skewed_ranks(seed: int, positions: int, heads: int, topk: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.geometric(0.55, size=(positions, heads)) - 1, topk)
    ranks[rng.random((positions, heads)) < 0.15] = -1
    return ranks.astype(np.int16)


def test_greedy_candidates_are_scored_like_any_tree() -> None:
    ranks = skewed_ranks(0, 400, 4, 5)
    latency = LatencyModel.cpu_like(depth_ms=2.0)
    candidates = greedy_candidates(ranks, latency, max_nodes=20)
    assert [c.tree.num_nodes for c in candidates] == list(range(1, 21))
    for c in candidates:
        assert c.source == "greedy"
        reference = score_tree(c.tree, ranks, latency)
        assert c.expected_accept_length == reference.expected_accept_length
        assert c.latency_ms == pytest.approx(reference.latency_ms)


def all_prefix_closed_trees(heads: int, topk: int, max_size: int) -> list[frozenset]:
    out, level = [], {frozenset()}
    for _ in range(max_size):
        level = {
            tree | {(*parent, rank)}
            for tree in level
            for parent in [(), *tree]
            if len(parent) < heads
            for rank in range(topk)
            if (*parent, rank) not in tree
        }
        out.extend(level)
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("depth_ms", [0.0, 3.0, 40.0])
def test_build_front_is_exact_for_size_and_depth_latency(seed: int, depth_ms: float) -> None:
    """Every prefix-closed tree of <= 6 nodes is weakly dominated by the greedy front."""
    heads, topk, max_nodes = 3, 2, 6
    ranks = skewed_ranks(seed, 200, heads, topk)
    latency = LatencyModel(
        nodes=(0, 2, 6), verify_ms=(10.0, 11.0, 30.0), autoregressive_ms=9.0, depth_ms=depth_ms
    )
    front = build_front(ranks, latency, max_nodes=max_nodes, topk=topk)
    probs = prefix_probabilities(ranks, topk=topk)
    for paths in all_prefix_closed_trees(heads, topk, max_nodes):
        tree = Tree.from_paths(paths)
        point = TreeCandidate(
            tree, 1.0 + sum(probs.get(p, 0.0) for p in paths), latency.tree_ms(tree), "reference"
        )
        assert weakly_covered(point, front, tol=1e-9)
    for c in front:
        assert c.expected_accept_length == pytest.approx(expected_accept_length(c.tree, ranks))


def test_build_front_keeps_extra_candidates_that_win() -> None:
    ranks = skewed_ranks(1, 300, 3, 4)
    latency = LatencyModel.gpu_like()
    magic = TreeCandidate(Tree.from_paths([[3]]), 10.0, 0.5, "reference")
    front = build_front(ranks, latency, max_nodes=10, extra=[magic])
    assert front[0] is magic and len(front) == 1


def test_fronts_by_bucket_equal_per_bucket_fronts() -> None:
    rng = np.random.default_rng(3)
    entropy = rng.uniform(0, 4, 600)
    ranks = skewed_ranks(3, 600, 3, 4)
    edges = np.array([1.0, 2.0, 10.0])  # the last bucket is empty
    latency = LatencyModel.cpu_like(depth_ms=1.0)
    fronts = fronts_by_bucket(entropy, ranks, edges, latency, max_nodes=12)
    assert len(fronts) == 4 and fronts[3] == []
    which = bucket_of(entropy, edges)
    for b in range(3):
        want = build_front(ranks[which == b], latency, max_nodes=12)
        assert [(c.tree, c.expected_accept_length, c.latency_ms) for c in fronts[b]] == [
            (c.tree, c.expected_accept_length, c.latency_ms) for c in want
        ]


def test_heads_that_never_match_give_an_empty_front_and_plain_decoding():
    """A Hydra checkpoint on a model it was not trained for: every rank is a miss (-1). With a
    per-level latency the depth-capped family used to take argmax of an empty sequence."""
    from entmtp.treesearch import SearchSettings, search
    from entmtp.treesearch._synthetic import synthetic_profile

    latency = LatencyModel.cpu_like(depth_ms=0.5)
    assert build_front(-np.ones((50, 3), dtype=np.int16), latency, max_nodes=8) == []
    profile = synthetic_profile(num_traces=4, positions=64, num_heads=3, seed=2)
    for trace in profile.traces:
        trace.ranks[:] = -1
    outcome = search(profile, latency, SearchSettings(schedule_trials=3, validation_folds=0))
    assert [tree.num_nodes for tree in outcome.schedule.schedule.trees] == [0]
