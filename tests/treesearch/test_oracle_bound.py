"""The hindsight oracle bounds every schedule and static tree over its trees, whatever the latency
model: random profiles and random (non-monotone, adversarial) latency models, by hypothesis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel, with_padding
from entmtp.treesearch._profile import Profile, ProfileMeta, Trace
from entmtp.treesearch._replay import Replayer, oracle_replay, replay
from entmtp.treesearch._schedule import Schedule
from entmtp.treesearch._tree import Tree

HEADS, TOPK = 3, 3
ALL_PATHS = sorted(p for d in range(1, HEADS + 1) for p in itertools.product(range(TOPK), repeat=d))


def make_profile(seed: int, *, num_traces: int, max_positions: int) -> Profile:
    rng = np.random.default_rng(seed)
    traces = []
    for t in range(num_traces):
        n = int(rng.integers(0, max_positions + 1))
        hit = rng.random((n, HEADS)) < rng.uniform(0.2, 0.95)
        ranks = np.where(hit, rng.integers(0, TOPK, (n, HEADS)), -1)
        ranks[np.arange(n)[:, None] + np.arange(1, HEADS + 1)[None, :] >= n] = -1
        entropy = rng.exponential(1.0, n)
        traces.append(Trace(t, f"p{t}", entropy, ranks, draft_entropy=rng.exponential(1.0, n)))
    return Profile(ProfileMeta(num_heads=HEADS, topk=TOPK), traces)


def make_trees(rng: np.random.Generator, count: int) -> list[Tree]:
    trees = [Tree.from_paths([])]  # the search always offers the plain step
    for _ in range(count - 1):
        chosen = [p for p in ALL_PATHS if rng.random() < rng.uniform(0.05, 0.5)]
        trees.append(Tree.from_paths(chosen, implied_prefixes=True))
    return trees


def make_latency(rng: np.random.Generator) -> LatencyModel:
    """Any non-negative figures: step time may fall as trees grow, a fused empty step may cost
    less than a plain one (a noisy measurement), prepare costs may fall with depth; half of them
    verify trees at padded widths; half are the static engine's, whose one-tree schedules skip
    the entropy readout (any sign of verify_ms[0] - autoregressive_ms)."""
    nodes = (0, *sorted(rng.choice(np.arange(1, 40), size=int(rng.integers(0, 6)),
                                   replace=False).tolist()))
    verify = tuple(rng.uniform(1.0, 100.0, len(nodes)).tolist())
    fused = rng.random() < 0.7
    by_depth = rng.random() < 0.5
    model = LatencyModel(
        nodes, verify, autoregressive_ms=float(rng.uniform(1.0, 100.0)),
        depth_ms=float(rng.choice([0.0, rng.uniform(0.0, 20.0)])),
        prepare_ms=float(rng.uniform(0.0, 30.0)) if not by_depth else 0.0,
        fused_empty_ms=float(rng.uniform(0.0, 120.0)) if fused and not by_depth else None,
        prepare_ms_by_depth=tuple(rng.uniform(0.0, 30.0, HEADS).tolist()) if by_depth else (),
        fused_empty_ms_by_depth=(tuple(rng.uniform(0.0, 120.0, HEADS).tolist())
                                 if by_depth and fused else ()),
        hardware={"engine": "static"} if rng.random() < 0.5 else {},
    )
    return with_padding(model) if rng.random() < 0.5 else model  # trees priced padded too


def random_schedule(rng: np.random.Generator, trees: list[Tree], signal: str) -> Schedule:
    count = int(rng.integers(1, 5))
    picks = rng.integers(0, len(trees), count)
    thresholds = tuple(np.sort(rng.uniform(0, 2.5, count - 1)))
    if signal == "draft_entropy":
        estimator = EntropyEstimator.last()
    else:
        estimator = [EntropyEstimator.last(), EntropyEstimator.ema(0.3),
                     EntropyEstimator.window(3)][int(rng.integers(0, 3))]
    return Schedule(tuple(trees[k] for k in picks), thresholds, estimator, signal)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_oracle_bounds_every_schedule_and_static_tree(seed):
    rng = np.random.default_rng(seed)
    profile = make_profile(seed, num_traces=int(rng.integers(1, 5)), max_positions=40)
    if profile.num_positions == 0:
        return
    trees = make_trees(rng, int(rng.integers(1, 6)))
    latency = make_latency(rng)
    oracle = oracle_replay(profile, trees, latency)
    slack = 1e-9 * max(oracle.time_ms, 1.0)
    for tree in trees:
        assert oracle.time_ms <= replay(profile, tree, latency).time_ms + slack
    for _ in range(12):
        signal = "draft_entropy" if rng.random() < 0.6 else "base_entropy"
        schedule = random_schedule(rng, trees, signal)
        assert oracle.time_ms <= replay(profile, schedule, latency).time_ms + slack
    # its walk is one the replay charges the same: the recorded steps replay to its time
    replayer = Replayer(profile, trees, latency)
    assert oracle.tokens == replayer.num_tokens == int(oracle.step_accept.sum())
    assert oracle.tokens_per_second >= max(
        replay(profile, tree, latency).tokens_per_second for tree in trees) * (1 - 1e-9)


def test_oracle_prices_fused_empty_steps_like_the_schedule():
    """The issue's 138%: a noisy latency model whose fused empty step (38.8 ms) is cheaper than
    the plain step (69.9 ms). A head-1-entropy schedule that drafts nothing pays fused steps;
    an oracle priced without them was slower than that schedule."""
    profile = make_profile(5, num_traces=4, max_positions=40)
    empty, one = Tree.from_paths([]), Tree.from_paths([[0]])
    latency = LatencyModel((0, 1), (69.9, 150.0), autoregressive_ms=49.0, prepare_ms=5.0,
                           fused_empty_ms=38.8)
    schedule = Schedule((empty, one), (1e9,), EntropyEstimator.last(), "draft_entropy")
    replayed = replay(profile, schedule, latency)
    oracle = oracle_replay(profile, [empty, one], latency)
    assert replayed.tokens_per_second > replay(profile, empty, latency).tokens_per_second
    assert oracle.tokens_per_second >= replayed.tokens_per_second
    assert replayed.tokens_per_second / oracle.tokens_per_second <= 1.0


@pytest.mark.parametrize("seed", range(4))
def test_oracle_equals_brute_force_over_regimes(seed):
    """On tiny traces: the oracle's time is the least over every signal and draft depth and
    every assignment of trees to positions, charged by the replay itself."""
    rng = np.random.default_rng(70 + seed)
    profile = make_profile(seed, num_traces=2, max_positions=6)
    trees = make_trees(rng, 3)
    latency = make_latency(rng)
    replayer = Replayer(profile, trees, latency)
    best = np.inf
    for signal, depth, allowed in replayer.cost_regimes():
        usable = np.flatnonzero(allowed).tolist()
        total = 0.0
        for start, end in zip(replayer.starts.tolist(), replayer.ends.tolist(), strict=True):
            if end - start < 2:
                continue
            trace_best = np.inf
            for assignment in itertools.product(usable, repeat=end - start):
                tree_at = np.zeros(replayer.num_positions, dtype=np.int64)
                tree_at[start:end] = assignment
                steps = replayer.step_starts(tree_at)
                mine = steps[(steps >= start) & (steps < end)]
                cost = replayer.step_ms(mine, tree_at, signal, depth).sum()
                trace_best = min(trace_best, cost)
            total += trace_best
        best = min(best, total)
    assert replayer.oracle().time_ms == pytest.approx(best, rel=1e-9, abs=1e-9)
