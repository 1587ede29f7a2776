"""The offline search pipeline: which trees the schedule search is offered."""

from __future__ import annotations

import numpy as np

from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile, Trace
from entmtp.treesearch._run import SearchSettings, search
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
