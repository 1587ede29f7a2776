"""Schedulers feed the estimator exactly as the offline replay does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.treesearch._errors import EntmtpError
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._schedule import Schedule
from entmtp.treesearch._tree import Tree

TREES = (Tree.from_paths([[0]]), Tree.from_paths([[0], [1], [0, 0]]), Tree.from_paths([]))


@pytest.mark.parametrize(
    "estimator", [EntropyEstimator.ema(0.3), EntropyEstimator.window(4), EntropyEstimator.last()]
)
def test_bundle_scheduler_estimate_equals_offline_estimates(estimator):
    rng = np.random.default_rng(0)
    entropy = rng.gamma(2.0, 0.7, size=60)
    schedule = Schedule(TREES, (0.8, 1.9), estimator)
    offline = estimator.estimates(entropy)
    scheduler = BundleScheduler(schedule)
    scheduler.reset()
    scheduler.observe(entropy[:1].tolist())
    position = 0
    while position < len(entropy) - 1:
        choice = scheduler.choose()
        assert choice.estimate == pytest.approx(offline[position], abs=1e-12)
        assert choice.index == schedule.tree_index(offline[position])
        assert choice.tree is scheduler.trees[choice.index]
        step = int(rng.integers(1, 5))  # a step accepting step tokens reveals step entropies
        chunk = entropy[position + 1 : position + 1 + step]
        scheduler.observe(chunk.tolist())
        position += len(chunk)
    scheduler.reset()  # a new prompt starts from scratch
    scheduler.observe([entropy[5]])
    assert scheduler.choose().estimate == entropy[5]


def test_static_scheduler_always_serves_its_tree():
    scheduler = StaticScheduler(TREES[1])
    scheduler.reset()
    scheduler.observe([1.0, 2.0])
    choice = scheduler.choose()
    assert choice.tree is TREES[1] and choice.index == 0 and math.isnan(choice.estimate)


class _Entropy:
    def __init__(self, unit):
        self.unit, self.estimator = unit, EntropyEstimator.last()


class _Bundle:
    def __init__(self, unit):
        self.trees, self.thresholds, self.entropy = list(TREES), [1.0, 1.0], _Entropy(unit)

    def tree_index_for(self, estimate):
        import bisect

        return bisect.bisect_right(self.thresholds, estimate)


def test_from_bundle_converts_units_and_allows_equal_thresholds():
    nats = BundleScheduler.from_bundle(_Bundle("nats"))
    nats.observe([0.9])
    assert nats.choose().index == 0
    bits = BundleScheduler.from_bundle(_Bundle("bits"))
    bits.observe([0.9])  # 0.9 nats = 1.3 bits
    choice = bits.choose()
    assert choice.estimate == pytest.approx(0.9 / math.log(2)) and choice.index == 2
    with pytest.raises(EntmtpError, match="unit"):
        BundleScheduler.from_bundle(_Bundle("bans"))
