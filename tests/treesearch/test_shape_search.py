"""Optuna tree-shape search: capped construction, depth-heavy latency, determinism, journals."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import expected_accept_length, prefix_table
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._pareto import build_front, greedy_candidates, pareto_front
from entmtp.treesearch._shape_search import ShapeBuilder, open_storage, search_tree_shapes
from entmtp.treesearch._synthetic import synthetic_profile
from entmtp.treesearch._tree import Tree

DEPTH_HEAVY = LatencyModel(
    nodes=(0, 64), verify_ms=(10.0, 12.0), autoregressive_ms=9.0, depth_ms=6.0
)


@pytest.fixture(scope="module")
def ranks() -> np.ndarray:
    return synthetic_profile(num_traces=6, positions=256, seed=3).ranks()


def reference_capped_tree(table, depth: int, widths: list[int], nodes: int) -> set:
    """One pass in greedy order: take a prefix if its parent is taken and its level has room."""
    taken: list[tuple[int, ...]] = []
    per_level = [0] * table.max_depth
    for i in range(table.num_prefixes):
        path = table.path(i)
        d = len(path)
        if len(taken) == nodes:
            break
        if d > depth or per_level[d - 1] >= widths[d - 1]:
            continue
        if d > 1 and path[:-1] not in taken:
            continue
        taken.append(path)
        per_level[d - 1] += 1
    return set(taken)


def test_capped_construction_matches_reference(ranks: np.ndarray) -> None:
    table = prefix_table(ranks)
    builder = ShapeBuilder(table)
    rng = np.random.default_rng(0)
    for _ in range(60):
        depth = int(rng.integers(1, 5))
        widths = [int(w) for w in rng.integers(1, 20, size=4)]
        nodes = int(rng.integers(1, 40))
        rows = builder.rows(depth, widths, nodes)
        paths = {table.path(int(r)) for r in rows}
        assert paths == reference_capped_tree(table, depth, widths, nodes)
        tree = Tree.from_paths(sorted(paths))  # prefix-closed
        assert tree.depth <= depth and tree.num_nodes <= nodes
        assert all(w <= cap for w, cap in zip(tree.widths, widths, strict=False))
        assert table.expected_accept_length(rows) == expected_accept_length(tree, ranks)


def test_depth_heavy_latency_finds_shallow_wide_trees(ranks: np.ndarray) -> None:
    greedy = greedy_candidates(ranks, DEPTH_HEAVY, max_nodes=32)
    found = search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=32, n_trials=60, seed=0)
    assert found and all(c.source == "optuna" for c in found)
    for c in found:
        assert c.expected_accept_length == expected_accept_length(c.tree, ranks)
        assert c.latency_ms == pytest.approx(DEPTH_HEAVY.tree_ms(c.tree))
    greedy_depth = {c.tree.num_nodes: c.tree.depth for c in greedy}
    greedy_trees = {c.tree for c in greedy}
    shallower = [
        c for c in found
        if c.tree not in greedy_trees and c.tree.depth < greedy_depth[c.tree.num_nodes]
    ]
    assert shallower
    greedy_front = pareto_front(greedy)
    union_front = pareto_front(greedy + found)
    for point in greedy_front:
        assert any(
            u.expected_accept_length >= point.expected_accept_length
            and u.latency_ms <= point.latency_ms
            for u in union_front
        )
    assert any(u.source == "optuna" for u in union_front)
    # The depth-capped greedy family is exact for (size, depth) latency: Optuna cannot beat it.
    exact = build_front(ranks, DEPTH_HEAVY, max_nodes=32)
    for c in found:
        assert any(
            e.expected_accept_length >= c.expected_accept_length
            and e.latency_ms <= c.latency_ms + 1e-12
            for e in exact
        )


def _signature(candidates):
    return [(c.tree.paths, c.expected_accept_length, c.latency_ms) for c in candidates]


def test_seeded_search_is_deterministic(ranks: np.ndarray) -> None:
    first = search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=16, n_trials=20, seed=5)
    second = search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=16, n_trials=20, seed=5)
    assert _signature(first) == _signature(second)


def test_build_front_with_optuna_is_deterministic(ranks: np.ndarray) -> None:
    runs = [
        build_front(ranks, LatencyModel.cpu_like(depth_ms=3.0), max_nodes=16, optuna_trials=12,
                    seed=1)
        for _ in range(2)
    ]
    assert _signature(runs[0]) == _signature(runs[1])


def test_journal_storage_accumulates_trials(ranks: np.ndarray, tmp_path) -> None:
    url = f"journal:{tmp_path / 'shapes.log'}"
    search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=16, n_trials=4, seed=0, storage=url,
                       study_name="s")
    second = search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=16, n_trials=5, seed=1,
                                storage=url, study_name="s")
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    assert len(study.trials) == 9
    # Every completed trial's tree is returned (deduplicated), not just this call's.
    distinct = {
        ShapeBuilder(prefix_table(ranks)).rows(
            t.params["depth"], [t.params[f"width_{d}"] for d in range(1, 5)], t.params["nodes"]
        ).tobytes()
        for t in study.trials
    }
    assert len(second) == len(distinct)
    # n_trials=0 with a storage reads the study back without running anything.
    again = search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=16, n_trials=0, storage=url,
                               study_name="s")
    assert _signature(again) == _signature(second)


@pytest.mark.parametrize(
    "url", ["journal:/nonexistent-entmtp-dir/x/shapes.log", "nosuchdb://host/db", "journal:"]
)
def test_unopenable_storage_raises_one_line_error(ranks: np.ndarray, url: str) -> None:
    with pytest.raises(EntmtpError) as err:
        search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=8, n_trials=1, storage=url)
    assert "\n" not in str(err.value)


def test_optuna_trial_logging_is_silenced(ranks: np.ndarray, capfd) -> None:
    before = optuna.logging.get_verbosity()
    search_tree_shapes(ranks, DEPTH_HEAVY, max_nodes=8, n_trials=3, seed=0)
    captured = capfd.readouterr()
    assert "Trial" not in captured.err and "Trial" not in captured.out
    assert optuna.logging.get_verbosity() == before


def test_no_trials_or_no_prefixes_give_no_candidates() -> None:
    assert search_tree_shapes(np.zeros((4, 2), dtype=np.int16), DEPTH_HEAVY, max_nodes=4,
                              n_trials=0) == []
    assert search_tree_shapes(np.full((4, 2), -1, dtype=np.int16), DEPTH_HEAVY, max_nodes=4,
                              n_trials=3) == []
