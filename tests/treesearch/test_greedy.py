"""Greedy trees: optimal against brute force over every prefix-closed tree, nested, and equal to
Medusa's independence-model construction on exactly independent data."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import (
    expected_accept_length,
    head_rank_probabilities,
    independence_expected_accept_length,
    prefix_probabilities,
    prefix_table,
)
from entmtp.treesearch._greedy import (
    best_tree,
    best_trees,
    greedy_accept_lengths,
    independence_tree,
)
from entmtp.treesearch._tree import Tree


def all_prefix_closed_trees(heads: int, topk: int, size: int) -> set[frozenset]:
    """Every prefix-closed set of exactly ``size`` paths (depth <= heads, ranks < topk)."""
    level = {frozenset()}
    for _ in range(size):
        grown = set()
        for tree in level:
            for parent in [(), *tree]:
                if len(parent) < heads:
                    for rank in range(topk):
                        child = (*parent, rank)
                        if child not in tree:
                            grown.add(tree | {child})
        level = grown
    return level


def brute_force_best(ranks: np.ndarray, heads: int, topk: int, size: int) -> float:
    probs = prefix_probabilities(ranks, topk=topk)
    return max(
        1.0 + sum(probs.get(p, 0.0) for p in tree)
        for tree in all_prefix_closed_trees(heads, topk, size)
    )


def skewed_ranks(seed: int, positions: int, heads: int, topk: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.geometric(rng.uniform(0.3, 0.7), size=(positions, heads)) - 1, topk)
    ranks[rng.random((positions, heads)) < 0.15] = -1
    return ranks.astype(np.int16)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("heads", "topk"), [(2, 2), (2, 3), (3, 2), (3, 3)])
def test_greedy_matches_brute_force(seed: int, heads: int, topk: int) -> None:
    ranks = skewed_ranks(seed, 60, heads, topk)
    observed = len(prefix_probabilities(ranks, topk=topk))
    for size in range(1, min(5, observed) + 1):
        tree = best_tree(ranks, size, topk=topk)
        assert tree.num_nodes == size
        assert expected_accept_length(tree, np.where(ranks < topk, ranks, -1)) == pytest.approx(
            brute_force_best(ranks, heads, topk, size)
        )


@settings(max_examples=25, deadline=None)
@given(
    ranks=arrays(np.int16, st.tuples(st.integers(1, 12), st.just(2)), elements=st.integers(-1, 2))
)
def test_greedy_matches_brute_force_on_arbitrary_ranks(ranks: np.ndarray) -> None:
    observed = len(prefix_probabilities(ranks))
    for size in range(1, min(4, observed) + 1):
        tree = best_tree(ranks, size)
        assert expected_accept_length(tree, ranks) == pytest.approx(
            brute_force_best(ranks, 2, 3, size)
        )


@pytest.mark.parametrize("seed", range(3))
def test_best_trees_are_nested_and_scored_exactly(seed: int) -> None:
    ranks = skewed_ranks(seed, 500, 4, 6)
    trees = best_trees(ranks, 40)
    assert [t.num_nodes for t in trees] == list(range(1, len(trees) + 1))
    for small, large in itertools.pairwise(trees):
        assert set(small.paths) < set(large.paths)
    table = prefix_table(ranks)
    curve = greedy_accept_lengths(table, 40)
    for n, tree in enumerate(trees, start=1):
        assert tree == best_tree(ranks, n)
        assert Tree.from_paths(tree.paths) == tree  # prefix-closed and canonical
        assert curve[n - 1] == expected_accept_length(tree, ranks)
    assert np.all(np.diff(curve) >= 0)


def test_budget_beyond_observed_prefixes_stops_there() -> None:
    ranks = np.array([[0, 1], [0, 1], [1, -1], [-1, 0]], dtype=np.int16)
    assert set(prefix_probabilities(ranks)) == {(0,), (0, 1), (1,)}
    assert best_tree(ranks, 100).paths == ((0,), (1,), (0, 1))
    assert len(best_trees(ranks, 100)) == 3
    assert best_tree(ranks, 0).num_nodes == 0
    with pytest.raises(EntmtpError):
        best_tree(ranks, -1)


def test_ties_break_by_depth_then_path() -> None:
    # (0,), (1,), (0, 0) and (1, 1) each seen twice... (0,) and (1,) tie with their children.
    ranks = np.array([[0, 0], [0, 0], [1, 1], [1, 1]], dtype=np.int16)
    assert best_tree(ranks, 1).paths == ((0,),)
    assert best_tree(ranks, 2).paths == ((0,), (1,))
    assert best_tree(ranks, 3).paths == ((0,), (1,), (0, 0))


@pytest.mark.parametrize(("max_depth", "topk"), [(1, None), (2, 3), (None, 2)])
def test_depth_and_topk_caps(max_depth, topk) -> None:
    ranks = skewed_ranks(7, 400, 4, 6)
    for tree in best_trees(ranks, 30, max_depth=max_depth, topk=topk):
        assert tree.depth <= (max_depth or 4)
        assert all(max(p) < (topk or 7) for p in tree.paths)


# -- Medusa's construction -----------------------------------------------------------------
def product_grid_ranks(marginal_counts: np.ndarray) -> np.ndarray:
    heads, width = marginal_counts.shape
    rows = []
    for combo in itertools.product(range(width), repeat=heads):
        weight = int(np.prod([marginal_counts[j, c] for j, c in enumerate(combo)]))
        rows.extend([[c - 1 for c in combo]] * weight)
    return np.array(rows, dtype=np.int16)


def reference_medusa_tree(probs: np.ndarray, size: int) -> set[tuple[int, ...]]:
    """Plain frontier expansion: add the most probable child of the current tree, one by one."""
    chosen: set[tuple[int, ...]] = set()
    heads, topk = probs.shape
    for _ in range(size):
        frontier = {
            (*p, r): np.prod([probs[j, x] for j, x in enumerate((*p, r))])
            for p in [(), *chosen]
            if len(p) < heads
            for r in range(topk)
            if (*p, r) not in chosen
        }
        chosen.add(max(frontier, key=frontier.get))
    return chosen


@pytest.mark.parametrize("seed", range(4))
def test_greedy_on_independent_data_reproduces_medusa_construction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 7, size=(3, 4))  # per head: miss, rank 0, rank 1, rank 2
    ranks = product_grid_ranks(counts)
    marginals = head_rank_probabilities(ranks, topk=3)
    for size in (1, 3, 6, 12):
        greedy = best_tree(ranks, size)
        medusa = independence_tree(marginals, size)
        reference = reference_medusa_tree(marginals, size)
        value = independence_expected_accept_length(Tree.from_paths(sorted(reference)), marginals)
        # Equal up to ties in probability: same value under the (here exact) independence model.
        assert expected_accept_length(greedy, ranks) == pytest.approx(value)
        assert independence_expected_accept_length(medusa, marginals) == pytest.approx(value)
        assert expected_accept_length(medusa, ranks) == pytest.approx(value)


def test_independence_tree_skips_impossible_nodes() -> None:
    probs = np.array([[0.6, 0.0], [0.5, 0.5]])
    tree = independence_tree(probs, 10)
    assert tree.paths == ((0,), (0, 0), (0, 1))
