"""Schedulers feed the estimator exactly as the offline replay does; a bundle schedules in nats
whatever unit it stores, the same way live and in replay."""

from __future__ import annotations

import json
import math
from bisect import bisect_right

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.runtime._scheduler import BundleScheduler, StaticScheduler
from entmtp.treesearch._bundle import (
    Bundle,
    CreatedBy,
    EntropyInfo,
    HeadsInfo,
    ModelInfo,
    Predicted,
    TreeStats,
    bundle_to_json,
    parse_bundle,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile, ProfileMeta, Trace
from entmtp.treesearch._replay import replay
from entmtp.treesearch._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
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


def _bundle(unit: str, thresholds, estimator: EntropyEstimator,
            signal: str = BASE_ENTROPY, trees=TREES) -> Bundle:
    return Bundle(
        model=ModelInfo("tiny", 128, 32),
        heads=HeadsInfo("medusa", 2, 2, "0" * 64),
        task="code",
        entropy=EntropyInfo(signal, unit, estimator),
        thresholds=list(thresholds),
        trees=list(trees),
        tree_stats=[TreeStats(1.0, 20.0)] * len(trees),
        predicted=Predicted(1.0, 50.0, 1.0, 50.0),
        hardware={},
        created_by=CreatedBy("0", "test"),
    )


def _profile(seed: int) -> Profile:
    """Random nats entropies and head ranks (heads 2, top-2) for a few trajectories."""
    rng = np.random.default_rng(seed)
    traces = []
    for t in range(4):
        n = int(rng.integers(20, 60))
        ranks = np.where(rng.random((n, 2)) < 0.6, rng.integers(0, 2, (n, 2)), -1)
        traces.append(Trace(t, f"p{t}", rng.gamma(2.0, 0.7, n), ranks))
    return Profile(ProfileMeta(num_heads=2, topk=2), traces)


def _accept(tree: Tree, ranks_row) -> int:
    depth = 0
    while depth < len(ranks_row) and tuple(int(r) for r in ranks_row[: depth + 1]) in tree:
        depth += 1
    return 1 + depth


def _hand_estimate(estimator: EntropyEstimator, seen: list[float]) -> float:
    if estimator.kind == "ema":
        value = seen[0]
        for h in seen[1:]:
            value = estimator.alpha * h + (1 - estimator.alpha) * value
        return value
    if estimator.kind == "window":
        return math.fsum(seen[-estimator.size :]) / len(seen[-estimator.size :])
    return seen[-1]


def _walk(profile: Profile, choose_index) -> list[tuple[int, int, int]]:
    """(trace, position, tree index) of every step; ``choose_index(trace, position, entropies
    seen)`` picks the tree, the step then reveals the entropies of what it accepted."""
    steps = []
    for j, trace in enumerate(profile.traces):
        entropy = [float(h) for h in trace.entropy]
        last, i = len(entropy) - 1, 0
        while i < last:
            k = choose_index(j, i, entropy[: i + 1])
            steps.append((j, i, k))
            i += min(_accept(TREES[k], trace.ranks[i]), last - i)
    return steps


def _live_steps(profile: Profile, scheduler: BundleScheduler) -> list[tuple[int, int, int]]:
    """The live decoder's bookkeeping: H_0 before the first step, then each step's entropies."""
    fed: dict[int, int] = {}

    def choose(j: int, i: int, seen: list[float]) -> int:
        if fed.get(j) is None:
            scheduler.reset()
            fed[j] = 0
        scheduler.observe(seen[fed[j] :])
        fed[j] = len(seen)
        return scheduler.choose().index

    return _walk(profile, choose)


def _replay_steps(profile: Profile, schedule: Schedule) -> list[tuple[int, int, int]]:
    result = replay(profile, schedule, LatencyModel.cpu_like())
    return list(zip(result.step_trace.tolist(), result.step_position.tolist(),
                    result.step_tree.tolist(), strict=True))


@pytest.mark.parametrize(
    "estimator", [EntropyEstimator.ema(0.4), EntropyEstimator.window(3), EntropyEstimator.last()]
)
def test_bits_and_nats_bundles_choose_the_same_trees_live_and_in_replay(estimator):
    profile = _profile(7)
    nats_thresholds = (1.0, 1.9)
    nats = _bundle("nats", nats_thresholds, estimator)
    bits = _bundle("bits", [t / math.log(2) for t in nats_thresholds], estimator)

    def reference(j: int, i: int, seen: list[float]) -> int:  # thresholds in bits, by hand
        estimate_bits = _hand_estimate(estimator, seen) / math.log(2)
        return sum(1 for t in bits.thresholds if t <= estimate_bits)

    expected = _walk(profile, reference)
    assert len({k for _, _, k in expected}) == 3  # every tree serves some steps
    for bundle in (nats, bits):
        assert _replay_steps(profile, bundle.schedule()) == expected
        assert _live_steps(profile, BundleScheduler(bundle.schedule())) == expected


def test_a_bundles_schedule_runs_in_nats_and_reports_nats_estimates():
    bits = _bundle("bits", [1.0, 2.0], EntropyEstimator.last())
    scheduler = BundleScheduler(bits.schedule())
    assert scheduler.schedule == bits.schedule() and scheduler.trees == TREES
    scheduler.observe([0.9])  # 0.9 nats = 1.30 bits: between the thresholds
    choice = scheduler.choose()
    assert choice.estimate == 0.9 and choice.index == 1 and choice.tree is TREES[1]


def test_equal_thresholds_never_choose_the_tree_between_them():
    profile = _profile(8)
    bundle = _bundle("nats", [1.2, 1.2], EntropyEstimator.ema(0.5))

    def reference(j: int, i: int, seen: list[float]) -> int:
        return 0 if _hand_estimate(bundle.entropy.estimator, seen) < 1.2 else 2

    expected = _walk(profile, reference)
    assert {k for _, _, k in expected} == {0, 2}
    assert _replay_steps(profile, bundle.schedule()) == expected
    assert _live_steps(profile, BundleScheduler(bundle.schedule())) == expected


def test_a_bundle_of_an_unknown_unit_has_no_schedule():
    bundle = _bundle("nats", [1.0, 2.0], EntropyEstimator.last())
    bundle.entropy = EntropyInfo("base_entropy", "bans", EntropyEstimator.last())
    with pytest.raises(EntmtpError, match="unit"):
        BundleScheduler(bundle.schedule())


def _draft_profile(seed: int) -> Profile:
    """``_profile`` plus head 1 entropies unrelated to the base ones."""
    rng = np.random.default_rng(seed + 100)
    profile = _profile(seed)
    traces = [Trace(t.prompt_index, t.prompt_id, t.entropy, t.ranks,
                    draft_entropy=rng.gamma(2.0, 0.7, t.num_positions))
              for t in profile.traces]
    return Profile(profile.meta, traces)


def test_static_scheduler_never_needs_the_draft_entropy():
    scheduler = StaticScheduler(TREES[1])
    assert not scheduler.needs_draft_entropy and scheduler.signal == BASE_ENTROPY
    scheduler.observe_draft(3.0)
    assert scheduler.choose().tree is TREES[1]


@pytest.mark.parametrize("signal", [BASE_ENTROPY, DRAFT_ENTROPY])
def test_a_one_tree_bundle_reads_no_entropy_like_a_static_tree(signal):
    """A bundle that ships its static tree runs the step without entropies, as the replay
    prices it (``NO_SIGNAL``); its steps' step options say so."""
    from entmtp.runtime._static_step import StepOptions

    one = BundleScheduler(Schedule((TREES[1],), (), EntropyEstimator.last(), signal))
    assert not one.reads_entropy and not one.needs_draft_entropy
    one.reset()
    assert one.choose().tree is TREES[1] and math.isnan(one.choose().estimate)  # no observe
    for scheduler in (one, StaticScheduler(TREES[1])):
        options = StepOptions.of(scheduler, fuses_empty=True)
        assert (options.base_entropy, options.prepare_depth, options.fuse_empty) == (
            False, 0, False)
    switching = BundleScheduler(Schedule(TREES, (0.8, 1.9), EntropyEstimator.last(), signal))
    assert switching.reads_entropy
    options = StepOptions.of(switching, fuses_empty=True)
    assert options.base_entropy == (signal == BASE_ENTROPY)
    assert options.prepare_depth == (2 if signal == DRAFT_ENTROPY else 0)


def test_draft_signal_scheduler_chooses_from_the_observed_draft_entropy():
    schedule = Schedule(TREES, (0.8, 1.9), EntropyEstimator.last(), DRAFT_ENTROPY)
    scheduler = BundleScheduler(schedule)
    assert scheduler.needs_draft_entropy and scheduler.signal == DRAFT_ENTROPY
    assert not BundleScheduler(Schedule(TREES, (0.8, 1.9))).needs_draft_entropy
    scheduler.reset()
    scheduler.observe([5.0])  # a base entropy: ignored by a draft-signal choice
    scheduler.observe_draft(1.0)
    choice = scheduler.choose()
    assert (choice.estimate, choice.index) == (1.0, 1)
    scheduler.observe([0.1, 0.2])
    scheduler.observe_draft(2.5)
    choice = scheduler.choose()
    assert (choice.estimate, choice.index) == (2.5, 2)
    with pytest.raises(EntmtpError, match="observe_draft"):
        scheduler.choose()  # the value of the step before is never reused


def test_draft_signal_bundle_chooses_the_replayed_trees():
    profile = _draft_profile(9)
    nats_thresholds = (1.0, 1.9)
    for bundle in (_bundle("nats", nats_thresholds, EntropyEstimator.last(), DRAFT_ENTROPY),
                   _bundle("bits", [t / math.log(2) for t in nats_thresholds],
                           EntropyEstimator.last(), DRAFT_ENTROPY)):
        scheduler = BundleScheduler(bundle.schedule())
        assert scheduler.needs_draft_entropy

        def live(j: int, i: int, seen: list[float], scheduler=scheduler) -> int:
            if i == 0:
                scheduler.reset()
            scheduler.observe(seen[-1:])  # base entropies still arrive; they must not matter
            scheduler.observe_draft(float(profile.traces[j].draft_entropy[i]))
            return scheduler.choose().index

        def reference(j: int, i: int, seen: list[float]) -> int:
            h = float(profile.traces[j].draft_entropy[i])
            return sum(1 for t in nats_thresholds if t <= h)

        expected = _walk(profile, reference)
        assert len({k for _, _, k in expected}) == 3
        assert _walk(profile, live) == expected == _replay_steps(profile, bundle.schedule())


# Trees two heads of top-2 can draft (the heads of ``_bundle``); a bundle may list one twice.
TREE_POOL = (*TREES, Tree.from_paths([[1]]), Tree.from_paths([[0], [1], [0, 1], [1, 1]]))


@st.composite
def random_bundles(draw) -> tuple[Bundle, list[float]]:
    """(a random bundle as ``load_bundle`` reads it back, its thresholds converted to nats by
    hand). Thresholds repeat now and then: the tree between two equal ones is never chosen."""
    count = draw(st.integers(1, 6))
    unit = draw(st.sampled_from(["nats", "bits"]))
    signal = draw(st.sampled_from([BASE_ENTROPY, DRAFT_ENTROPY]))
    grid = st.one_of(st.floats(0.0, 8.0), st.sampled_from([0.5, 1.0, 2.0]))
    thresholds = sorted(draw(st.lists(grid, min_size=count - 1, max_size=count - 1)))
    estimator = (EntropyEstimator.last() if signal == DRAFT_ENTROPY else
                 draw(st.sampled_from([EntropyEstimator.last(), EntropyEstimator.ema(0.5)])))
    trees = [draw(st.sampled_from(TREE_POOL)) for _ in range(count)]
    bundle = _bundle(unit, thresholds, estimator, signal, trees)
    loaded = parse_bundle(json.dumps(bundle_to_json(bundle)))
    assert loaded == bundle
    scale = math.log(2.0) if unit == "bits" else 1.0
    return loaded, [t * scale for t in thresholds]


@settings(max_examples=150, deadline=None)
@given(sample=random_bundles(), data=st.data())
def test_the_scheduler_a_bundle_runs_picks_bisect_right_of_its_nats_thresholds(sample, data):
    bundle, nats = sample
    near = [v for t in nats for v in (t, float(np.nextafter(t, -np.inf)))]  # both sides
    entropy = st.one_of(st.floats(-1.0, 12.0), *([st.sampled_from(near)] if near else []))
    entropies = data.draw(st.lists(entropy, min_size=1, max_size=12))
    scheduler = BundleScheduler(bundle.schedule())
    scheduler.reset()
    seen: list[float] = []
    for e in entropies:
        if scheduler.needs_draft_entropy:
            scheduler.observe([0.0])  # base entropies arrive too; they must not matter
            scheduler.observe_draft(e)
        else:
            scheduler.observe([e])
        seen.append(e)
        choice = scheduler.choose()
        if len(bundle.trees) == 1:  # reads nothing: no estimate
            assert not scheduler.reads_entropy and math.isnan(choice.estimate)
            assert choice.tree == bundle.trees[0]
            continue
        if bundle.entropy.estimator.kind == "last":  # the entropy itself picks the tree
            assert choice.estimate == e
        else:
            assert choice.estimate == pytest.approx(
                _hand_estimate(bundle.entropy.estimator, seen), rel=1e-12, abs=1e-12)
        assert choice.index == bisect_right(nats, choice.estimate)
        assert choice.tree == bundle.trees[choice.index]
