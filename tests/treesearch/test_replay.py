"""Exact replay, the hindsight oracle and the best static tree, against plain references."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile, ProfileMeta, Trace
from entmtp.treesearch._replay import Replayer, best_static, oracle_replay, replay
from entmtp.treesearch._schedule import Schedule
from entmtp.treesearch._tree import Tree

LATENCIES = [
    LatencyModel.cpu_like(),
    LatencyModel.cpu_like(depth_ms=7.0),
    LatencyModel.gpu_like(),
]


def random_profile(
    seed: int, *, num_traces: int = 5, max_positions: int = 60, heads: int = 3, topk: int = 3,
    draft: bool = False,
) -> Profile:
    """Random entropies and ranks; rank j at position i is -1 once i + j + 1 passes the end."""
    rng = np.random.default_rng(seed)
    traces = []
    for t in range(num_traces):
        n = int(rng.integers(0, max_positions + 1)) if t else max_positions
        hit = rng.random((n, heads)) < rng.uniform(0.3, 0.9)
        ranks = np.where(hit, rng.integers(0, topk, (n, heads)), -1)
        ranks[np.arange(n)[:, None] + np.arange(1, heads + 1)[None, :] >= n] = -1
        entropy = rng.exponential(1.0, n) * rng.choice([0.1, 2.0], n)
        draft_entropy = rng.exponential(1.5, n) if draft else None
        traces.append(Trace(t, f"p{t}", entropy, ranks, draft_entropy=draft_entropy))
    return Profile(ProfileMeta(num_heads=heads, topk=topk), traces)


def random_tree(rng: np.random.Generator, *, heads: int = 3, topk: int = 3) -> Tree:
    paths = {p for p in itertools.product(range(topk), repeat=1)}
    for depth in range(2, heads + 1):
        paths |= {p for p in itertools.product(range(topk), repeat=depth)}
    chosen = [p for p in sorted(paths) if rng.random() < 0.35]
    return Tree.from_paths(chosen, implied_prefixes=True)


def random_estimator(rng: np.random.Generator) -> EntropyEstimator:
    kind = rng.choice(["ema", "window", "last"])
    if kind == "ema":
        return EntropyEstimator.ema(float(rng.uniform(0.01, 1.0)))
    if kind == "window":
        return EntropyEstimator.window(int(rng.integers(1, 12)))
    return EntropyEstimator.last()


def random_schedule(rng: np.random.Generator, profile: Profile) -> Schedule:
    count = int(rng.integers(1, 5))
    trees = tuple(random_tree(rng) for _ in range(count))
    entropy = profile.entropy()
    thresholds = tuple(np.sort(rng.uniform(0, max(float(entropy.max()), 1.0), count - 1)))
    return Schedule(trees, thresholds, random_estimator(rng))


def hand_estimate(estimator: EntropyEstimator, seen: list[float]) -> float:
    if estimator.kind == "ema":
        value = seen[0]
        for h in seen[1:]:
            value = estimator.alpha * h + (1 - estimator.alpha) * value
        return value
    if estimator.kind == "window":
        recent = seen[-estimator.size :]
        return math.fsum(recent) / len(recent)
    return seen[-1]


def hand_accept(tree: Tree, ranks_row: np.ndarray) -> int:
    depth = 0
    while depth < len(ranks_row) and tuple(int(r) for r in ranks_row[: depth + 1]) in tree:
        depth += 1
    return 1 + depth


def reference_replay(profile: Profile, schedule: Schedule, latency: LatencyModel):
    """Walk each trace as the live decoder does: token 0 comes from the prefill; a step at
    position i (estimate over entropies 0..i, bucket, path membership) emits tokens
    i+1 .. i+a, cut at the trace's last token G-1, and steps run while i < G-1."""
    draft = schedule.signal == "draft_entropy"
    fused = draft and latency.fused_empty_ms is not None
    # the heads are prepared for the schedule's deepest tree
    depth = min(max(max(t.depth for t in schedule.trees), 1), 4)
    prepare_ms = (latency.prepare_ms_by_depth[min(depth, len(latency.prepare_ms_by_depth)) - 1]
                  if latency.prepare_ms_by_depth else latency.prepare_ms)
    fused_ms = (latency.fused_empty_ms_by_depth[min(depth, len(latency.fused_empty_ms_by_depth))
                                                - 1]
                if latency.fused_empty_ms_by_depth else latency.fused_empty_ms)
    # a drafted step prepares the schedule's depth where the profiled step drafts its own:
    # the extra rows at the least-squares slope of the by-depth figures
    rows = (latency.prepare_ms_by_depth if any(latency.prepare_ms_by_depth)
            else latency.fused_empty_ms_by_depth)
    row_ms = (max(float(np.polyfit(np.arange(1, len(rows) + 1), rows, 1)[0]), 0.0)
              if len(rows) >= 2 else 0.0)
    # one tree: the live scheduler reads no entropy, so its steps skip the readout the profiled
    # steps paid (on the static engine), never below the plain step
    readout = (max(latency.verify_ms[0] - latency.autoregressive_ms, 0.0)
               if len(schedule.trees) == 1 and latency.hardware.get("engine") == "static"
               else 0.0)
    steps = []
    for j, trace in enumerate(profile.traces):
        entropy = [float(h) for h in trace.entropy]
        last = trace.num_positions - 1
        i = 0
        previous_empty = False  # the prefill does not fuse: a trajectory's first step prepares
        while i < last:
            if schedule.signal == "draft_entropy":  # head 1's entropy at the step itself
                estimate = float(trace.draft_entropy[i])
            else:
                estimate = hand_estimate(schedule.estimator, entropy[: i + 1])
            k = sum(1 for t in schedule.thresholds if t <= estimate)
            tree = schedule.trees[k]
            accepted = min(hand_accept(tree, trace.ranks[i]), last - i)
            cost = latency.tree_ms(tree)
            if len(schedule.trees) == 1:
                cost = max(cost - readout, min(cost, latency.autoregressive_ms))
                draft = fused = False
            if draft and tree.num_nodes > 0:
                cost += row_ms * (max(t.depth for t in schedule.trees) - tree.depth)
            if fused and tree.num_nodes == 0:
                # one projection: this step's logits and the next step's heads
                cost = fused_ms
                if not previous_empty:  # no earlier fused step prepared this one
                    cost += prepare_ms
            elif draft and tree.num_nodes == 0:
                cost += prepare_ms  # the heads ran for the choice; nothing reuses them
            elif fused and previous_empty:  # drafts from the heads that step already projected
                cost = max(cost - prepare_ms, 0.0)
            steps.append((j, i, k, accepted, cost))
            previous_empty = tree.num_nodes == 0
            i += accepted
    return steps


def decode_tokens(profile: Profile) -> int:
    """Tokens the decoding steps produce: every trace less its prefill token."""
    return sum(max(trace.num_positions - 1, 0) for trace in profile.traces)


def check_against_reference(profile, schedule, latency):
    result = replay(profile, schedule, latency)
    steps = reference_replay(profile, schedule, latency)
    assert result.steps == len(steps)
    assert result.step_trace.tolist() == [s[0] for s in steps]
    assert result.step_position.tolist() == [s[1] for s in steps]
    assert result.step_tree.tolist() == [s[2] for s in steps]
    assert result.step_accept.tolist() == [s[3] for s in steps]
    assert result.time_ms == pytest.approx(sum(s[4] for s in steps), rel=1e-12)
    np.testing.assert_allclose(result.step_ms, [s[4] for s in steps], rtol=1e-12)
    assert result.tokens == decode_tokens(profile) == sum(s[3] for s in steps)
    assert result.autoregressive_ms == pytest.approx(
        decode_tokens(profile) * latency.autoregressive_ms, rel=1e-12
    )
    assert result.tokens_per_second == pytest.approx(1000 * result.tokens / result.time_ms)
    assert result.speedup_vs_autoregressive == pytest.approx(
        result.autoregressive_ms / result.time_ms
    )
    assert result.mean_accept_length == pytest.approx(result.tokens / result.steps)
    for j, trace_result in enumerate(result.traces):
        mine = [s for s in steps if s[0] == j]
        assert trace_result.tokens == max(profile.traces[j].num_positions - 1, 0)
        assert trace_result.tokens == sum(s[3] for s in mine)
        assert trace_result.steps == len(mine)
        assert trace_result.time_ms == pytest.approx(sum(s[4] for s in mine), rel=1e-12)
    return result


@pytest.mark.parametrize("seed", range(12))
def test_replay_matches_the_step_by_step_reference(seed):
    rng = np.random.default_rng(100 + seed)
    profile = random_profile(seed)
    latency = LATENCIES[seed % len(LATENCIES)]
    for _ in range(4):
        check_against_reference(profile, random_schedule(rng, profile), latency)


def test_step_estimates_are_the_online_estimates():
    rng = np.random.default_rng(5)
    profile = random_profile(5)
    schedule = Schedule(
        (random_tree(rng), random_tree(rng)), (1.0,), EntropyEstimator.ema(0.2)
    )
    result = replay(profile, schedule, LatencyModel.cpu_like())
    for trace_index, position, estimate in zip(
        result.step_trace.tolist(), result.step_position.tolist(), result.step_estimate.tolist(),
        strict=True,
    ):
        state = schedule.estimator.new_state()
        state.update(profile.traces[trace_index].entropy[: position + 1])
        assert abs(state.value - estimate) <= 1e-12


def test_a_tree_replays_like_its_static_schedule():
    profile = random_profile(7)
    tree = random_tree(np.random.default_rng(7))
    latency = LatencyModel.cpu_like()
    direct = replay(profile, tree, latency)
    scheduled = replay(profile, Schedule.static(tree, estimator=EntropyEstimator.ema(0.3)), latency)
    assert direct.time_ms == scheduled.time_ms
    assert direct.step_position.tolist() == scheduled.step_position.tolist()


def test_empty_tree_takes_one_step_per_token():
    profile = random_profile(3)
    latency = LatencyModel.cpu_like()
    result = replay(profile, Tree.from_paths([]), latency)
    assert result.steps == result.tokens == decode_tokens(profile)
    assert result.time_ms == pytest.approx(result.tokens * latency.step_ms(0, 0))
    assert set(result.step_accept.tolist()) == {1}


def test_traces_of_one_token_have_no_step():
    """The prefill emits a trace's first token: a one-token trace decodes nothing."""
    traces = [Trace(0, "p0", np.ones(1), np.zeros((1, 3))),
              Trace(1, "p1", np.zeros(0), np.zeros((0, 3))),
              Trace(2, "p2", np.ones(1), -np.ones((1, 3)))]
    result = replay(Profile(ProfileMeta(num_heads=3), traces), Tree.from_paths([[0]]),
                    LatencyModel.cpu_like())
    assert result.steps == result.tokens == 0 and result.time_ms == 0.0
    assert result.tokens_per_second == 0.0 and result.mean_accept_length == 0.0
    assert [t.steps for t in result.traces] == [0, 0, 0]


def test_a_perfect_draft_stops_at_the_last_token():
    """Every draft right: steps of depth + 1 tokens, the last one cut to the tokens left."""
    heads, tree = 3, Tree.from_paths([[0], [0, 0], [0, 0, 0]])
    for n in range(1, 12):
        ranks = np.zeros((n, heads), dtype=np.int64)
        ranks[np.arange(n)[:, None] + np.arange(1, heads + 1)[None, :] >= n] = -1
        profile = Profile(ProfileMeta(num_heads=heads), [Trace(0, "p", np.ones(n), ranks)])
        result = replay(profile, tree, LatencyModel.cpu_like())
        full, rest = divmod(n - 1, heads + 1)
        assert result.step_accept.tolist() == [heads + 1] * full + ([rest] if rest else [])
        assert result.step_position.tolist() == list(range(0, n - 1, heads + 1))


def test_replay_rejects_an_empty_profile():
    empty = Profile(ProfileMeta(num_heads=3), [Trace(0, "p0", np.zeros(0), np.zeros((0, 3)))])
    with pytest.raises(EntmtpError, match="no positions"):
        replay(empty, Tree.from_paths([[0]]), LatencyModel.cpu_like())


def brute_force_best_time(profile: Profile, trees: list[Tree], latency: LatencyModel) -> float:
    """Minimum total time over every assignment of a tree to every position."""
    total = 0.0
    for trace in profile.traces:
        n = trace.num_positions
        accepts = [[min(hand_accept(t, trace.ranks[i]), n - 1 - i) for i in range(n)]
                   for t in trees]
        best = math.inf
        for assignment in itertools.product(range(len(trees)), repeat=n):
            time, i = 0.0, 0
            while i < n - 1:
                time += latency.tree_ms(trees[assignment[i]])
                i += accepts[assignment[i]][i]
            best = min(best, time)
        total += best if n else 0.0
    return total


@pytest.mark.parametrize("seed", range(8))
def test_oracle_matches_brute_force_on_tiny_traces(seed):
    rng = np.random.default_rng(200 + seed)
    profile = random_profile(seed, num_traces=3, max_positions=6)
    trees = [random_tree(rng) for _ in range(3)]
    latency = LATENCIES[seed % len(LATENCIES)]
    oracle = oracle_replay(profile, trees, latency)
    brute = brute_force_best_time(profile, trees, latency)
    assert oracle.time_ms == pytest.approx(brute, rel=1e-12)
    assert oracle.tokens == decode_tokens(profile) == int(oracle.step_accept.sum())
    # The oracle's recorded steps are a legal walk with the recorded trees.
    replayer = Replayer(profile, trees, latency)
    assert oracle.time_ms == replayer.run(_tree_at_from_steps(replayer, oracle)).time_ms


def _tree_at_from_steps(replayer: Replayer, result) -> np.ndarray:
    tree_at = np.zeros(replayer.num_positions, dtype=np.int64)
    starts = replayer.starts[result.step_trace] + result.step_position
    tree_at[starts] = result.step_tree
    return tree_at


@pytest.mark.parametrize("seed", range(6))
def test_oracle_bounds_every_schedule_over_its_trees(seed):
    rng = np.random.default_rng(300 + seed)
    profile = random_profile(seed, num_traces=6, max_positions=80)
    trees = [random_tree(rng) for _ in range(4)]
    latency = LATENCIES[seed % len(LATENCIES)]
    oracle = oracle_replay(profile, trees, latency)
    for _ in range(10):
        count = int(rng.integers(1, 5))
        picks = rng.integers(0, len(trees), count)
        thresholds = tuple(np.sort(rng.uniform(0, 2, count - 1)))
        schedule = Schedule(tuple(trees[k] for k in picks), thresholds, random_estimator(rng))
        assert oracle.time_ms <= replay(profile, schedule, latency).time_ms * (1 + 1e-12)
        assert oracle.tokens_per_second >= replay(profile, schedule, latency).tokens_per_second * (
            1 - 1e-12
        )


@pytest.mark.parametrize("seed", range(4))
def test_best_static_is_the_fastest_single_tree(seed):
    rng = np.random.default_rng(400 + seed)
    profile = random_profile(seed)
    trees = [random_tree(rng) for _ in range(5)]
    latency = LATENCIES[seed % len(LATENCIES)]
    index, result = best_static(profile, trees, latency)
    speeds = [replay(profile, t, latency).tokens_per_second for t in trees]
    assert result.tokens_per_second == max(speeds)
    assert index == speeds.index(max(speeds))
    assert set(result.step_tree.tolist()) == {index}


def test_tree_usage_sums_to_one_and_counts_steps():
    rng = np.random.default_rng(9)
    profile = random_profile(9)
    schedule = random_schedule(rng, profile)
    result = replay(profile, schedule, LatencyModel.cpu_like())
    usage = result.tree_usage()
    assert usage.sum() == pytest.approx(1.0)
    assert (usage * result.steps).round().astype(int).tolist() == np.bincount(
        result.step_tree, minlength=schedule.num_buckets
    ).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_draft_signal_replay_matches_the_step_by_step_reference(seed):
    rng = np.random.default_rng(100 + seed)
    profile = random_profile(seed, draft=True)
    base = random_schedule(rng, profile)
    thresholds = tuple(np.sort(rng.uniform(0.0, 3.0, len(base.trees) - 1)))
    trees = (Tree.from_paths([]), *base.trees[1:]) if seed % 2 else base.trees
    schedule = Schedule(trees, thresholds, EntropyEstimator.last(), "draft_entropy")
    latency = dataclasses.replace(LATENCIES[seed % len(LATENCIES)], prepare_ms=3.25)
    result = check_against_reference(profile, schedule, latency)
    empty_steps = sum(1 for k in result.step_tree.tolist() if trees[k].num_nodes == 0)
    assert result.time_ms == pytest.approx(
        sum(latency.tree_ms(trees[k]) for k in result.step_tree.tolist()) + 3.25 * empty_steps)
    if seed % 2:
        assert empty_steps > 0
    base_signal = replay(profile, Schedule(trees, thresholds, EntropyEstimator.last()), latency)
    assert all(c == latency.tree_ms(t) for c, t in zip(base_signal.tree_ms, trees, strict=True))
    steps = result.step_position + np.asarray([0, *np.cumsum(
        [t.num_positions for t in profile.traces])[:-1]])[result.step_trace]
    np.testing.assert_array_equal(result.step_estimate, profile.draft_entropy()[steps])


def _fused(latency: LatencyModel, *, by_depth: bool | str = False) -> LatencyModel:
    """``by_depth`` True: per-depth prepare and fused figures; "unprepared": the static
    engine's (no preparation timed, zeros; noisy, non-monotone fused figures)."""
    plain = latency.tree_ms(Tree.from_paths([]))
    fused = dataclasses.replace(latency, prepare_ms=3.25, fused_empty_ms=plain + 0.5)
    if not by_depth:
        return fused
    if by_depth == "unprepared":
        return dataclasses.replace(latency, prepare_ms_by_depth=(0.0, 0.0, 0.0, 0.0),
                                   fused_empty_ms_by_depth=(plain + 0.7, plain + 1.2,
                                                            plain + 0.7, plain + 1.8))
    # shallower schedules prepare fewer heads: cheaper (the deepest value is the scalar)
    return dataclasses.replace(fused, prepare_ms_by_depth=(0.5, 1.25, 2.0, 3.25),
                               fused_empty_ms_by_depth=(plain + 0.05, plain + 0.2,
                                                        plain + 0.3, plain + 0.5))


@pytest.mark.parametrize("by_depth", [False, True, "unprepared"])
@pytest.mark.parametrize("seed", range(10))
def test_fused_draft_signal_replay_matches_the_step_by_step_reference(seed, by_depth):
    """Empty-tree steps right after an empty-tree step skip prepare_ms; others pay it."""
    rng = np.random.default_rng(500 + seed)
    profile = random_profile(seed, num_traces=8, draft=True)
    latency = _fused(LATENCIES[seed % len(LATENCIES)], by_depth=by_depth)
    empty = Tree.from_paths([])
    runs = first_empty = after_drafted = 0
    for _ in range(5):
        count = int(rng.integers(2, 5))
        trees = [random_tree(rng) for _ in range(count)]
        trees[int(rng.integers(0, count))] = empty
        thresholds = tuple(np.sort(rng.uniform(0.0, 3.0, count - 1)))
        schedule = Schedule(tuple(trees), thresholds, EntropyEstimator.last(), "draft_entropy")
        result = check_against_reference(profile, schedule, latency)
        is_empty = np.array([trees[k].num_nodes == 0 for k in result.step_tree.tolist()])
        first = result.step_position == 0
        previous = np.concatenate([[False], is_empty[:-1]]) & ~first
        runs += int((is_empty & previous).sum())
        first_empty += int((is_empty & first).sum())
        after_drafted += int((is_empty & ~previous & ~first).sum())
        # the same schedule on the base signal ignores fusion (and prepare_ms)
        base = replay(profile, Schedule(tuple(trees), thresholds, EntropyEstimator.last()),
                      latency)
        assert base.tree_ms == tuple(latency.tree_ms(t) for t in trees)
        replayer = Replayer(profile, trees, latency)
        tree_at = replayer.schedule_tree_at(EntropyEstimator.last(), thresholds, range(count),
                                            "draft_entropy")
        assert replayer.time_ms(tree_at, "draft_entropy") == pytest.approx(result.time_ms,
                                                                         rel=1e-12)
    assert runs > 0 and first_empty > 0 and after_drafted > 0  # every case was exercised


def test_fused_empty_steps_cost_prepare_once_per_run():
    """All-empty draft schedule: each trajectory pays prepare_ms once, then fused steps."""
    profile = random_profile(2, draft=True)
    latency = _fused(LatencyModel.cpu_like())
    schedule = Schedule((Tree.from_paths([]), Tree.from_paths([])), (1.0,),
                        EntropyEstimator.last(), "draft_entropy")
    result = check_against_reference(profile, schedule, latency)
    walked = sum(1 for t in profile.traces if t.num_positions > 1)
    assert result.steps == decode_tokens(profile)
    assert result.time_ms == pytest.approx(
        result.steps * latency.fused_empty_ms + walked * latency.prepare_ms, rel=1e-12)
    unfused = dataclasses.replace(latency, fused_empty_ms=None)
    assert replay(profile, schedule, unfused).time_ms == pytest.approx(
        result.steps * (latency.tree_ms(Tree.from_paths([])) + latency.prepare_ms), rel=1e-12)


def test_draft_schedules_pay_the_heads_of_their_deepest_tree_used_or_not():
    """Per-depth prepare/fused costs: a schedule whose trees are at most 1 deep pays the
    depth-1 cost; adding a deeper tree that no step uses still raises every empty step's cost
    (the live decoder prepares heads for every tree of the schedule)."""
    profile = random_profile(3, num_traces=6, draft=True)
    latency = _fused(LATENCIES[0], by_depth=True)
    empty, one = Tree.from_paths([]), Tree.from_paths([[0]])
    deep = Tree.from_paths([[0], [0, 0], [0, 0, 0]])
    shallow = Schedule((one, empty), (1.0,), EntropyEstimator.last(), "draft_entropy")
    result = check_against_reference(profile, shallow, latency)
    assert set(result.step_tree.tolist()) == {0, 1}
    estimates = profile.draft_entropy()
    never = float(estimates.max()) + 1.0  # the deep tree's bucket is above every estimate
    padded = Schedule((one, empty, deep), (1.0, never), EntropyEstimator.last(),
                      "draft_entropy")
    padded_result = check_against_reference(profile, padded, latency)
    assert padded_result.step_tree.tolist() == result.step_tree.tolist()
    assert padded_result.time_ms > result.time_ms
    replayer = Replayer(profile, (one, empty, deep), latency)
    assert replayer.draft_depth([0, 1]) == 1 and replayer.draft_depth([0, 1, 2]) == 3
    assert replayer.step_costs("draft_entropy", 1)[1] == pytest.approx(0.5 + plain_ms(latency)
                                                                        + 0.05)
    assert replayer.step_costs("draft_entropy", 3)[1] == pytest.approx(2.0 + plain_ms(latency)
                                                                        + 0.3)
    # the base signal never prepares heads: depth does not matter
    assert replayer.step_costs("base_entropy", 1).tolist() == replayer.step_costs(
        "base_entropy", 3).tolist()


@pytest.mark.parametrize("by_depth", [True, "unprepared"])
def test_drafted_steps_pay_the_head_rows_their_schedule_prepares_beyond_their_own(by_depth):
    """A depth-d tree in a depth-D draft-entropy schedule projects D - d head rows more than
    its profiled step: (D - d) * head_row_ms more, in both columns; empty trees and the base
    signal pay nothing for it."""
    profile = random_profile(4, num_traces=4, draft=True)
    latency = _fused(LATENCIES[0], by_depth=by_depth)
    assert latency.head_row_ms > 0
    empty, one = Tree.from_paths([]), Tree.from_paths([[0]])
    two, deep = Tree.from_paths([[0], [0, 0]]), Tree.from_paths([[0], [0, 0], [0, 0, 0]])
    replayer = Replayer(profile, (empty, one, two, deep), latency)
    for depth in (1, 2, 3):
        table = replayer.cost_table("draft_entropy", depth)
        own = replayer.cost_table("draft_entropy", 1)
        for index, tree in enumerate((one, two, deep)[:depth], start=1):
            rows = depth - tree.depth
            expected = replayer.tree_ms[index] + rows * latency.head_row_ms
            assert table[index, 0] == pytest.approx(expected, rel=1e-12)
            if tree.depth == 1:
                assert table[index, 0] - own[index, 0] == pytest.approx(
                    (depth - 1) * latency.head_row_ms, rel=1e-12)
            # right after an empty step: the same, less the preparation that step did
            assert table[index, 1] == pytest.approx(
                max(expected - latency.prepare_cost(depth), 0.0), rel=1e-12)
        assert table[0].tolist() == replayer.cost_table("draft_entropy", depth)[0].tolist()
    np.testing.assert_array_equal(replayer.cost_table("base_entropy", 3)[:, 0],
                                  replayer.tree_ms)


def plain_ms(latency: LatencyModel) -> float:
    return latency.tree_ms(Tree.from_paths([]))


def test_draft_signal_needs_a_profile_that_has_it():
    profile = random_profile(0)
    schedule = Schedule((Tree.from_paths([[0]]), Tree.from_paths([])), (1.0,),
                        EntropyEstimator.last(), "draft_entropy")
    with pytest.raises(EntmtpError, match="no draft"):
        replay(profile, schedule, LATENCIES[0])


def _static_engine(latency: LatencyModel, readout: float) -> LatencyModel:
    """``latency`` as the static engine's, its empty-tree step ``readout`` ms over the plain one."""
    verify = (latency.autoregressive_ms + readout, *latency.verify_ms[1:])
    return dataclasses.replace(latency, verify_ms=verify, hardware={"engine": "static"})


@pytest.mark.parametrize("seed", range(6))
def test_one_tree_schedules_skip_the_entropy_readout_the_profiled_steps_paid(seed):
    """On the static engine a static tree's step is the profiled one less the entropy readout
    (the empty tree's: exactly the autoregressive step), on either signal; a switching schedule
    pays the profiled steps; other engines' files charge no readout."""
    rng = np.random.default_rng(900 + seed)
    profile = random_profile(seed, num_traces=6, draft=True)
    base = LATENCIES[seed % len(LATENCIES)]
    latency = _static_engine(base, readout=float(rng.uniform(0.1, 2.0)))
    assert latency.entropy_readout_ms == pytest.approx(latency.verify_ms[0]
                                                       - latency.autoregressive_ms)
    empty = Tree.from_paths([])
    trees = [empty] + [random_tree(rng) for _ in range(3)]
    replayer = Replayer(profile, trees, latency)
    for index, tree in enumerate(trees):
        result = replayer.static(index)
        expected = max(latency.tree_ms(tree) - latency.entropy_readout_ms,
                       min(latency.tree_ms(tree), latency.autoregressive_ms))
        np.testing.assert_allclose(result.step_ms, expected, rtol=1e-12)
        for signal in ("base_entropy", "draft_entropy"):
            one = Schedule((tree,), (), EntropyEstimator.last(), signal)
            assert check_against_reference(profile, one, latency).time_ms == pytest.approx(
                result.time_ms, rel=1e-12)
    assert replayer.static(0).time_ms == pytest.approx(replayer.static(0).autoregressive_ms,
                                                      rel=1e-12)
    switching = Schedule(tuple(trees[:2]), (1.0,), EntropyEstimator.last())
    switched = check_against_reference(profile, switching, latency)
    assert switched.tree_ms == tuple(latency.tree_ms(t) for t in trees[:2])
    eager = dataclasses.replace(latency, hardware={"engine": "eager"})
    assert eager.entropy_readout_ms == 0.0
    assert Replayer(profile, trees, eager).static(1).tree_ms[1] == latency.tree_ms(trees[1])
