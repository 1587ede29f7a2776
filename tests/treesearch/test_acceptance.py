"""Acceptance models against plain reference implementations."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import (
    AcceptanceTable,
    accept_lengths,
    acceptance_table,
    bucket_of,
    entropy_bucket_edges,
    expected_accept_length,
    head_rank_probabilities,
    independence_error,
    independence_expected_accept_length,
    prefix_probabilities,
    prefix_table,
)
from entmtp.treesearch._tree import Tree


# -- strategies and references -------------------------------------------------------------
@st.composite
def trees(draw, max_heads: int = 4, max_topk: int = 4, max_nodes: int = 12) -> Tree:
    """Random prefix-closed trees grown node by node from the root's frontier."""
    heads = draw(st.integers(1, max_heads))
    topk = draw(st.integers(1, max_topk))
    size = draw(st.integers(0, max_nodes))
    chosen: list[tuple[int, ...]] = []
    for _ in range(size):
        frontier = [
            (*p, r)
            for p in [(), *chosen]
            if len(p) < heads
            for r in range(topk)
            if (*p, r) not in chosen
        ]
        if not frontier:
            break
        chosen.append(draw(st.sampled_from(frontier)))
    return Tree.from_paths(chosen)


def random_ranks(rng: np.random.Generator, positions: int, heads: int, topk: int) -> np.ndarray:
    """Ranks in [-1, topk] (topk itself = a rank past a smaller top-k) with skew toward 0."""
    ranks = np.minimum(rng.geometric(0.5, size=(positions, heads)) - 1, topk)
    ranks[rng.random((positions, heads)) < 0.2] = -1
    return ranks.astype(np.int16)


def reference_accept_length(tree: Tree, rank_row) -> int:
    paths = set(tree.paths)
    accepted = 1
    for d in range(1, len(rank_row) + 1):
        prefix = tuple(int(r) for r in rank_row[:d])
        if min(prefix) < 0 or prefix not in paths:
            break
        accepted += 1
    return accepted


def reference_prefix_counts(ranks: np.ndarray, max_depth: int, topk: int | None) -> Counter:
    counts: Counter = Counter()
    for row in ranks:
        for d in range(1, max_depth + 1):
            prefix = tuple(int(r) for r in row[:d])
            if min(prefix) < 0 or (topk is not None and max(prefix) >= topk):
                break
            counts[prefix] += 1
    return counts


# -- exact replay --------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(tree=trees(), seed=st.integers(0, 2**16), heads=st.integers(1, 5))
def test_accept_lengths_match_reference(tree: Tree, seed: int, heads: int) -> None:
    ranks = random_ranks(np.random.default_rng(seed), 50, heads, 4)
    got = accept_lengths(tree, ranks)
    want = [reference_accept_length(tree, row) for row in ranks]
    assert got.tolist() == want
    assert expected_accept_length(tree, ranks) == pytest.approx(np.mean(want))


@settings(max_examples=40, deadline=None)
@given(tree=trees(), seed=st.integers(0, 2**16))
def test_expected_accept_length_is_additive_over_nodes(tree: Tree, seed: int) -> None:
    ranks = random_ranks(np.random.default_rng(seed), 80, 4, 4)
    probs = prefix_probabilities(ranks)
    additive = 1.0 + sum(probs.get(path, 0.0) for path in tree.paths)
    assert expected_accept_length(tree, ranks) == pytest.approx(additive)


def test_accept_lengths_edge_cases() -> None:
    tree = Tree.from_paths([[0], [0, 0]])
    assert accept_lengths(tree, np.zeros((0, 2), dtype=np.int16)).shape == (0,)
    assert expected_accept_length(tree, np.zeros((0, 2), dtype=np.int16)) == 1.0
    # A rank far beyond anything in the tree is simply a miss.
    assert accept_lengths(tree, np.array([[0, 30000], [30000, 0]])).tolist() == [2, 1]
    assert accept_lengths(Tree.from_paths([]), np.zeros((3, 2))).tolist() == [1, 1, 1]
    with pytest.raises(EntmtpError):
        accept_lengths(tree, np.zeros(4, dtype=np.int16))


# -- prefix tables -------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("max_depth", "topk"), [(None, None), (2, None), (None, 2), (3, 3)])
def test_prefix_table_matches_brute_force(seed: int, max_depth, topk) -> None:
    ranks = random_ranks(np.random.default_rng(seed), 300, 4, 4)
    table = prefix_table(ranks, max_depth=max_depth, topk=topk)
    want = reference_prefix_counts(ranks, max_depth or 4, topk)
    got = {table.path(i): int(table.counts[i]) for i in range(table.num_prefixes)}
    assert got == dict(want)
    assert table.num_positions == 300
    keys = [(-int(table.counts[i]), int(table.depths[i]), table.path(i))
            for i in range(table.num_prefixes)]
    assert keys == sorted(keys)
    for i in range(table.num_prefixes):
        path = table.path(i)
        if len(path) == 1:
            assert table.parents[i] == -1
        else:
            assert table.path(int(table.parents[i])) == path[:-1]
            assert table.parents[i] < i  # parents precede children
    assert prefix_probabilities(ranks, max_depth=max_depth, topk=topk) == pytest.approx(
        {p: c / 300 for p, c in want.items()}
    )


def test_prefix_table_rejects_bad_ranks() -> None:
    with pytest.raises(EntmtpError):
        prefix_table(np.zeros(5, dtype=np.int16))
    with pytest.raises(EntmtpError):
        prefix_table(np.zeros((5, 2), dtype=np.float32))


# -- entropy buckets -----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=200),
    num_buckets=st.integers(1, 8),
)
def test_bucket_edges_are_increasing_and_leave_no_bucket_empty(values, num_buckets) -> None:
    entropy = np.array(values)
    edges = entropy_bucket_edges(entropy, num_buckets)
    assert len(edges) <= num_buckets - 1
    assert np.all(np.diff(edges) > 0)
    which = bucket_of(entropy, edges)
    assert np.bincount(which, minlength=len(edges) + 1).min() > 0


@pytest.mark.parametrize("num_buckets", [2, 3, 4, 7])
def test_bucket_edges_balance_distinct_values(num_buckets: int) -> None:
    entropy = np.random.default_rng(num_buckets).permutation(np.linspace(0.0, 5.0, 1000))
    edges = entropy_bucket_edges(entropy, num_buckets)
    assert len(edges) == num_buckets - 1
    sizes = np.bincount(bucket_of(entropy, edges))
    assert sizes.max() - sizes.min() <= 2


def test_bucket_of_matches_half_open_definition() -> None:
    rng = np.random.default_rng(0)
    edges = np.sort(rng.choice(np.arange(20) / 4, size=5, replace=False))
    entropy = np.concatenate([rng.uniform(-1, 6, 200), edges])
    got = bucket_of(entropy, edges)
    for x, b in zip(entropy, got, strict=True):
        lower = -np.inf if b == 0 else edges[b - 1]
        upper = np.inf if b == len(edges) else edges[b]
        assert lower <= x < upper


def test_bucket_edges_reject_bad_input() -> None:
    with pytest.raises(EntmtpError):
        entropy_bucket_edges(np.array([]), 3)
    with pytest.raises(EntmtpError):
        entropy_bucket_edges(np.array([1.0, np.nan]), 3)
    with pytest.raises(EntmtpError):
        entropy_bucket_edges(np.array([1.0]), 0)
    assert len(entropy_bucket_edges(np.full(50, 2.0), 4)) == 0


# -- acceptance tables ---------------------------------------------------------------------
def _table_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    entropy = rng.gamma(2.0, 0.8, size=600)
    ranks = random_ranks(rng, 600, 3, 6)
    return entropy, ranks


def test_acceptance_table_matches_brute_force() -> None:
    entropy, ranks = _table_inputs()
    table = acceptance_table(entropy, ranks, topk=5, num_buckets=4)
    which = bucket_of(entropy, table.edges)
    assert table.counts.tolist() == np.bincount(which, minlength=4).tolist()
    for b, j, r in itertools.product(range(table.num_buckets), range(3), range(5)):
        in_bucket = which == b
        want = np.mean(ranks[in_bucket, j] == r)
        assert table.rank_probs[b, j, r] == pytest.approx(want)
    for b in range(table.num_buckets):
        assert table.mean_entropy[b] == pytest.approx(entropy[which == b].mean())
    assert np.all(table.topk_acceptance[..., -1] <= 1 + 1e-12)
    assert np.all(np.diff(table.topk_acceptance, axis=2) >= 0)


def test_acceptance_table_json_round_trip_and_format() -> None:
    entropy, ranks = _table_inputs(1)
    edges = np.array([0.5, 1.0, 2.0, 50.0])  # last bucket is empty
    table = acceptance_table(entropy, ranks, topk=5, edges=edges)
    assert table.counts[-1] == 0 and np.isnan(table.mean_entropy[-1])
    again = AcceptanceTable.from_json(json.loads(json.dumps(table.to_json(), allow_nan=False)))
    np.testing.assert_array_equal(again.edges, table.edges)
    np.testing.assert_array_equal(again.counts, table.counts)
    np.testing.assert_array_equal(again.rank_probs, table.rank_probs)
    np.testing.assert_array_equal(again.mean_entropy, table.mean_entropy)
    text = table.format()
    lines = text.splitlines()
    assert sum(line.startswith("bucket ") for line in lines) == table.num_buckets
    assert "top-1" in text and "top-3" in text and "top-5" in text
    bucket_one = lines.index(next(line for line in lines if line.startswith("bucket 1:")))
    head_two = lines[bucket_one + 3].split()
    assert head_two[0] == "2"
    assert float(head_two[1]) == pytest.approx(table.rank_probs[1, 1, 0], abs=5e-4)
    assert float(head_two[3]) == pytest.approx(table.rank_probs[1, 1].sum(), abs=5e-4)


def test_acceptance_table_rejects_bad_input() -> None:
    entropy, ranks = _table_inputs()
    with pytest.raises(EntmtpError):
        acceptance_table(entropy[:-1], ranks, topk=5)
    with pytest.raises(EntmtpError):
        acceptance_table(entropy, ranks, topk=5, edges=[1.0, 0.5])
    with pytest.raises(EntmtpError):
        AcceptanceTable.from_json({"format": "something-else"})
    with pytest.raises(EntmtpError):
        AcceptanceTable.from_json(
            {"format": "entmtp-acceptance-table", "edges": [1.0], "counts": [1],
             "mean_entropy": [1.0], "rank_probs": [[[1.0]]]}
        )


# -- independence model --------------------------------------------------------------------
def product_grid_ranks(marginal_counts: np.ndarray) -> np.ndarray:
    """Rank rows whose empirical joint distribution is exactly the product of the marginals.

    ``marginal_counts[j, r + 1]`` is head j's count for rank r (column 0 = miss).
    """
    heads, width = marginal_counts.shape
    rows = []
    for combo in itertools.product(range(width), repeat=heads):
        weight = int(np.prod([marginal_counts[j, c] for j, c in enumerate(combo)]))
        rows.extend([[c - 1 for c in combo]] * weight)
    return np.array(rows, dtype=np.int16)


def test_independence_model_equals_empirical_on_independent_data() -> None:
    counts = np.array([[1, 4, 2, 1], [2, 3, 1, 1], [3, 2, 2, 1]])
    ranks = product_grid_ranks(counts)
    marginals = head_rank_probabilities(ranks, topk=3)
    np.testing.assert_allclose(marginals, counts[:, 1:] / counts.sum(axis=1, keepdims=True))
    for paths in ([[0]], [[0], [1], [0, 0], [0, 0, 0], [1, 2]], [[2], [2, 2], [2, 2, 2]]):
        tree = Tree.from_paths(paths)
        assert independence_expected_accept_length(tree, marginals) == pytest.approx(
            expected_accept_length(tree, ranks)
        )
        report = independence_error(tree, ranks, 3)
        assert report["relative_error"] == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(tree=trees(max_heads=3, max_topk=3))
def test_independence_model_matches_sum_of_products(tree: Tree) -> None:
    probs = np.random.default_rng(tree.num_nodes).dirichlet(np.ones(4), size=3)[:, :3]
    want = 1.0 + sum(np.prod([probs[j, r] for j, r in enumerate(p)]) for p in tree.paths)
    assert independence_expected_accept_length(tree, probs) == pytest.approx(want)


def test_independence_error_reports_correlated_heads() -> None:
    # Heads that always hit together: the empirical model sees it, the product model does not.
    ranks = np.array([[0, 0]] * 50 + [[-1, -1]] * 50, dtype=np.int16)
    tree = Tree.from_paths([[0], [0, 0]])
    report = independence_error(tree, ranks, topk=1)
    assert report["empirical"] == pytest.approx(2.0)
    assert report["independence"] == pytest.approx(1.75)
    assert report["relative_error"] == pytest.approx(-0.125)
    with pytest.raises(EntmtpError):
        independence_expected_accept_length(Tree.from_paths([[0], [0, 0]]), np.ones((1, 2)))
