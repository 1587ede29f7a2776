"""The offline search pipeline: which trees the schedule search is offered."""

from __future__ import annotations

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._pareto import TreeCandidate
from entmtp.treesearch._profile import Profile, Trace
from entmtp.treesearch._replay import replay
from entmtp.treesearch._run import SearchSettings, search, select_candidates
from entmtp.treesearch._synthetic import synthetic_profile
from entmtp.treesearch._tree import Tree


def test_the_empty_tree_is_a_candidate_and_wins_where_drafts_never_pay():
    profile = synthetic_profile(num_traces=4, positions=96, seed=0)
    # heads that are never right: every draft is wasted work
    hopeless = Profile(profile.meta, [
        Trace(t.prompt_index, t.prompt_id, t.entropy, np.full_like(t.ranks, -1), t.prompt_length)
        for t in profile.traces])
    settings = SearchSettings(max_nodes=16, schedule_trials=5)
    outcome = search(hopeless, LatencyModel.cpu_like(), settings)
    empty = Tree.from_paths([])
    assert empty in outcome.schedule.candidates
    assert outcome.schedule.candidates[outcome.schedule.best_static_index] == empty
    assert outcome.schedule.schedule.trees == (empty,)
    useful = search(profile, LatencyModel.cpu_like(), settings)
    assert empty in useful.schedule.candidates
    assert useful.schedule.schedule.trees != (empty,)  # these heads do pay on this latency


def _candidate(paths, accept: float, ms: float) -> TreeCandidate:
    return TreeCandidate(Tree.from_paths(paths), accept, ms)


def _random_fronts(rng: np.random.Generator) -> list[list[TreeCandidate]]:
    shapes = [[[0]], [[0], [1]], [[0], [0, 0]], [[0], [1], [2]], [[0], [0, 0], [0, 0, 0]],
              [[0], [1], [0, 0]], [[0], [1], [2], [3]], [[0], [0, 0], [1]], [[1]], [[0], [2]]]
    fronts = []
    for _ in range(rng.integers(1, 5)):
        picks = rng.choice(len(shapes), size=rng.integers(1, len(shapes) + 1), replace=False)
        fronts.append([_candidate(shapes[i], 1 + rng.random(), 10 + 50 * rng.random())
                       for i in picks])
    return fronts


def test_candidates_keep_every_fronts_best_trees_first():
    rng = np.random.default_rng(0)
    empty = Tree.from_paths([])
    for _ in range(200):
        fronts = _random_fronts(rng)
        limit = int(rng.integers(1, 12))
        chosen = select_candidates(fronts, limit, extra=[empty])
        distinct = {c.tree for f in fronts for c in f} | {empty}
        assert len(chosen) == len(set(chosen)) == min(limit, len(distinct))
        assert set(chosen) <= distinct
        assert chosen == sorted(chosen, key=lambda t: (t.num_nodes, t.depth, t.paths))
        assert empty in chosen
        # brute force: the r best of every front are in whenever 1 + r * fronts trees fit
        for rank in range(len(distinct)):
            if 1 + (rank + 1) * len(fronts) > limit:
                break
            for front in fronts:
                ordered = sorted(front, key=lambda c: -c.tokens_per_ms)
                assert all(c.tree in chosen for c in ordered[: rank + 1])


def test_candidates_reject_an_empty_limit():
    with pytest.raises(EntmtpError, match="at least 1 candidate"):
        select_candidates([[_candidate([[0]], 1.5, 10.0)]], 0)


def test_the_schedule_is_never_slower_than_a_static_tree_of_the_front():
    profile = synthetic_profile(num_traces=6, positions=128, seed=3)
    latency = LatencyModel.cpu_like()
    outcome = search(profile, latency, SearchSettings(max_nodes=32, schedule_trials=5,
                                                      max_candidates=6))
    rate = outcome.schedule.result.tokens_per_second
    for candidate in outcome.front:
        assert rate >= replay(profile, candidate.tree, latency).tokens_per_second * (1 - 1e-9)
