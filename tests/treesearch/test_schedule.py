"""Schedules: bucket lookup against a plain count, validation, merging, JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._schedule import Schedule, as_schedule, check_thresholds
from entmtp.treesearch._tree import Tree

CHAIN = [Tree.from_paths([[0] * d for d in range(1, n + 1)]) for n in range(5)]


def plain_bucket(thresholds, estimate) -> int:
    """Tree i serves [t_{i-1}, t_i): the number of thresholds at or below the estimate."""
    return sum(1 for t in thresholds if t <= estimate)


def test_tree_index_matches_the_interval_definition():
    rng = np.random.default_rng(0)
    for _ in range(50):
        count = int(rng.integers(1, 5))
        thresholds = tuple(np.sort(rng.choice(np.linspace(0, 4, 41), count - 1, replace=False)))
        schedule = Schedule(tuple(CHAIN[:count]), thresholds, EntropyEstimator.ema(0.2))
        # Probe the thresholds themselves and points between them.
        probes = np.concatenate([thresholds, rng.uniform(-1, 5, 30)]).astype(np.float64)
        vector = schedule.tree_indices(probes)
        for estimate, from_vector in zip(probes.tolist(), vector.tolist(), strict=True):
            expected = plain_bucket(thresholds, estimate)
            assert schedule.tree_index(estimate) == expected == from_vector
            assert schedule.tree_for(estimate) == CHAIN[expected]


def test_static_schedule_serves_every_estimate_with_its_tree():
    schedule = Schedule.static(CHAIN[3])
    assert schedule.num_buckets == 1 and schedule.thresholds == ()
    assert set(schedule.tree_indices(np.array([-1e9, 0.0, 1e9])).tolist()) == {0}


@pytest.mark.parametrize(
    ("trees", "thresholds", "field"),
    [
        ((), (), "trees"),
        ((CHAIN[1], CHAIN[2]), (), "thresholds"),
        ((CHAIN[1],), (1.0,), "thresholds"),
        ((CHAIN[1], CHAIN[2], CHAIN[3]), (2.0, 1.0), "ascending"),
        ((CHAIN[1], CHAIN[2], CHAIN[3], CHAIN[4]), (1.0, 1.0, 0.5), "ascending"),
        ((CHAIN[1], CHAIN[2]), (float("inf"),), "finite"),
        ((CHAIN[1], CHAIN[2]), (float("nan"),), "finite"),
        ((CHAIN[1], CHAIN[2]), ("x",), "thresholds"),
        (([[0]],), (), "trees"),
    ],
)
def test_invalid_schedules_name_the_field(trees, thresholds, field):
    with pytest.raises(EntmtpError, match=field):
        Schedule(trees, thresholds, EntropyEstimator.last())


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(-3.0, 3.0), st.sampled_from([1.0, math.nan, math.inf, -math.inf])),
        max_size=5,
    ),
    num_trees=st.integers(1, 6),
)
def test_check_thresholds_accepts_exactly_what_a_plain_reading_allows(values, num_trees):
    right_count = len(values) == num_trees - 1
    bad = [i for i, v in enumerate(values)
           if not math.isfinite(v) or (i > 0 and v < values[i - 1])]
    try:
        checked = check_thresholds(values, num_trees, context="file x: ")
    except EntmtpError as err:
        message = str(err)
        assert "\n" not in message
        if not right_count:
            assert message.startswith(f"file x: thresholds: {len(values)} values for ")
        else:  # the first bad one is named (finite ones before it ascend)
            assert bad and message.startswith(f"file x: thresholds[{bad[0]}]: ")
    else:
        assert right_count and not bad
        assert checked == tuple(values) and all(type(t) is float for t in checked)


def test_equal_thresholds_leave_a_tree_that_is_never_chosen():
    thresholds = (1.0, 1.0, 2.5, 2.5)
    schedule = Schedule(tuple(CHAIN), thresholds)
    rng = np.random.default_rng(2)
    probes = np.concatenate(
        [thresholds, np.nextafter(thresholds, -np.inf), rng.uniform(-1, 4, 300)]
    )
    vector = schedule.tree_indices(probes).tolist()
    chosen = set()
    for estimate, from_vector in zip(probes.tolist(), vector, strict=True):
        expected = plain_bucket(thresholds, estimate)
        assert schedule.tree_index(estimate) == expected == from_vector
        chosen.add(expected)
    assert chosen == {0, 2, 4}  # trees 1 and 3 serve empty intervals


def test_merged_keeps_the_mapping_and_drops_redundant_thresholds():
    rng = np.random.default_rng(1)
    for _ in range(60):
        count = int(rng.integers(1, 7))
        trees = tuple(CHAIN[int(k)] for k in rng.integers(0, 3, count))
        # a coarse grid, so some thresholds repeat (never-chosen trees)
        thresholds = tuple(np.sort(rng.integers(0, 5, count - 1) * 0.75))
        schedule = Schedule(trees, thresholds, EntropyEstimator.window(4))
        merged = schedule.merged()
        assert all(a != b for a, b in zip(merged.trees, merged.trees[1:], strict=False))
        assert all(a < b for a, b in zip(merged.thresholds, merged.thresholds[1:], strict=False))
        probes = np.concatenate([thresholds, rng.uniform(-1, 5, 50)])
        for estimate in probes.tolist():
            assert merged.tree_for(estimate) == schedule.tree_for(estimate)


def test_merged_drops_a_never_chosen_tree_between_equal_thresholds():
    schedule = Schedule((CHAIN[1], CHAIN[2], CHAIN[1], CHAIN[3]), (1.0, 1.0, 2.0))
    assert schedule.merged() == Schedule((CHAIN[1], CHAIN[3]), (2.0,))


def test_json_round_trip():
    schedule = Schedule((CHAIN[0], CHAIN[2], CHAIN[4]), (0.5, 2.25), EntropyEstimator.ema(0.1))
    again = Schedule.from_json(json.loads(json.dumps(schedule.to_json())))
    assert again == schedule


def test_from_json_rejects_missing_fields():
    with pytest.raises(EntmtpError, match="thresholds"):
        Schedule.from_json({"estimator": {"kind": "last"}, "trees": [[[0]]]})


def test_as_schedule_wraps_a_tree_and_rejects_other_things():
    assert as_schedule(CHAIN[2]) == Schedule.static(CHAIN[2])
    with pytest.raises(EntmtpError, match="Schedule or a Tree"):
        as_schedule([[0]])


def test_signal_is_checked_and_round_trips():
    trees = (Tree.from_paths([[0]]), Tree.from_paths([[0], [0, 0]]))
    draft = Schedule(trees, (0.5,), EntropyEstimator.last(), "draft_entropy")
    assert Schedule.from_json(draft.to_json()) == draft
    assert draft.merged().signal == "draft_entropy"
    old = draft.to_json()
    del old["signal"]  # schedules written before signals existed estimate the base entropy
    assert Schedule.from_json(old).signal == "base_entropy"
    with pytest.raises(EntmtpError, match="signal 'logit_gap' is unknown"):
        Schedule(trees, (0.5,), EntropyEstimator.last(), "logit_gap")
    with pytest.raises(EntmtpError, match="use the 'last' estimator"):
        Schedule(trees, (0.5,), EntropyEstimator.ema(0.5), "draft_entropy")
