"""Batched replay against a plain row-by-row reference, and against the per-sequence replay at
one row."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._acceptance import accept_lengths
from entmtp.treesearch._batch_replay import batch_replay, batch_rows
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._profile import Profile, ProfileMeta, Trace
from entmtp.treesearch._replay import Replayer
from entmtp.treesearch._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from entmtp.treesearch._tree import Tree

EMPTY = Tree.from_paths([])
CHAIN = Tree.from_paths([[0], [0, 0], [0, 0, 0]])
WIDE = Tree.from_paths([[0], [1], [2], [0, 0], [1, 0]])
LATENCIES = [LatencyModel.cpu_like(), LatencyModel.gpu_like(),
             dataclasses.replace(LatencyModel.cpu_like(), fused_empty_ms=86.0, prepare_ms=4.0)]


def _profile(seed: int, *, num_traces: int = 7) -> Profile:
    """Trajectories of different lengths (one of one position), with draft entropies."""
    rng = np.random.default_rng(seed)
    traces = []
    for t in range(num_traces):
        n = 1 if t == 3 else int(rng.integers(2, 50))
        hit = rng.random((n, 3)) < 0.6
        ranks = np.where(hit, rng.integers(0, 3, (n, 3)), -1)
        ranks[np.arange(n)[:, None] + np.arange(1, 4)[None, :] >= n] = -1
        traces.append(Trace(t, f"p{t}", rng.exponential(1.0, n), ranks,
                            draft_entropy=rng.exponential(1.5, n)))
    return Profile(ProfileMeta(num_heads=3, topk=3), traces)


def _schedules() -> list[Schedule]:
    return [
        Schedule.static(CHAIN),
        Schedule.static(EMPTY),
        Schedule((WIDE, CHAIN, EMPTY), (0.4, 1.2), EntropyEstimator.ema(0.5), BASE_ENTROPY),
        Schedule((CHAIN, WIDE), (0.8,), EntropyEstimator.window(3), BASE_ENTROPY),
        Schedule((CHAIN, EMPTY), (1.0,), EntropyEstimator.last(), DRAFT_ENTROPY),
    ]


def _reference(profile: Profile, schedule: Schedule, latency: LatencyModel, size: int):
    """Row by row in plain Python: (tokens, batch steps, row steps, time)."""
    replayer = Replayer(profile, schedule.trees, latency)
    one_tree = len(schedule.trees) == 1
    signal = "none" if one_tree else schedule.signal
    table = replayer.cost_table(signal, max(t.depth for t in schedule.trees))
    traces = profile.traces
    tokens = steps = row_steps = 0
    time = []
    for rows in batch_rows(len(traces), size):
        accepts = []
        estimates = []
        for r in rows:
            trace = traces[r]
            n = trace.num_positions
            left = np.arange(n)[::-1]  # tokens after each position
            accepts.append([np.minimum(accept_lengths(tree, trace.ranks), left)
                            for tree in schedule.trees])
            if not one_tree:
                if schedule.signal == DRAFT_ENTROPY:
                    estimates.append([float(e) for e in trace.draft_entropy])
                else:
                    state = schedule.estimator.new_state()
                    values = []
                    for e in trace.entropy:
                        state.update([float(e)])
                        values.append(float(state.value))
                    estimates.append(values)
            tokens += max(n - 1, 0)
        position = [0] * len(rows)
        after_empty = 0
        while True:
            live = [k for k, r in enumerate(rows) if position[k] < traces[r].num_positions - 1]
            if not live:
                break
            if one_tree:
                tree = 0
            else:
                mean = math.fsum(estimates[k][position[k]] for k in live) / len(live)
                tree = schedule.tree_index(mean)
            time.append(float(table[tree, after_empty]))
            steps += 1
            row_steps += len(live)
            for k in live:
                position[k] += int(accepts[k][tree][position[k]])
            after_empty = int(schedule.trees[tree].num_nodes == 0)
    return tokens, steps, row_steps, math.fsum(time)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 10])
def test_batch_replay_equals_the_row_by_row_reference(size):
    for seed in range(3):
        profile = _profile(seed)
        for latency in LATENCIES:
            for schedule in _schedules():
                result = batch_replay(Replayer(profile, schedule.trees, latency), schedule, size)
                tokens, steps, row_steps, time = _reference(profile, schedule, latency, size)
                assert (result.tokens, result.steps, result.row_steps) == \
                    (tokens, steps, row_steps), (seed, schedule)
                assert result.time_ms == pytest.approx(time, rel=1e-12)
                assert sum(result.tree_steps) == result.steps


def test_one_row_is_the_per_sequence_replay():
    for seed in range(3):
        profile = _profile(seed)
        for latency in LATENCIES:
            for schedule in _schedules():
                replayer = Replayer(profile, schedule.trees, latency)
                alone = replayer.run_schedule(schedule.estimator, schedule.thresholds,
                                              range(len(schedule.trees)), schedule.signal)
                batched = batch_replay(replayer, schedule, 1)
                assert (batched.tokens, batched.steps, batched.row_steps) == \
                    (alone.tokens, alone.steps, alone.steps)
                assert batched.time_ms == pytest.approx(alone.time_ms, rel=1e-12)
                assert batched.tokens_per_second == pytest.approx(alone.tokens_per_second)
                assert batched.autoregressive_ms == pytest.approx(alone.autoregressive_ms)


def test_a_static_tree_accepts_per_row_as_alone_and_pays_for_the_longest_row():
    profile = _profile(4)
    latency = LatencyModel.cpu_like()
    schedule = Schedule.static(CHAIN)
    replayer = Replayer(profile, schedule.trees, latency)
    alone = replayer.static(0)
    steps_alone = {t.prompt_index: t.steps for t in alone.traces}
    result = batch_replay(replayer, schedule, 3)
    rows = batch_rows(len(profile.traces), 3)
    assert result.row_steps == sum(steps_alone[r] for batch in rows for r in batch)
    assert result.steps == sum(max(steps_alone[r] for r in batch) for batch in rows)
    plain = batch_replay(Replayer(profile, (EMPTY,), latency), Schedule.static(EMPTY), 3)
    assert plain.mean_accept_length == 1.0
    assert plain.steps * latency.autoregressive_ms == pytest.approx(plain.autoregressive_ms)


def test_batches_wrap_around_to_fill_the_last():
    assert batch_rows(5, 2) == [[0, 1], [2, 3], [4, 0]]
    assert batch_rows(2, 4) == [[0, 1, 0, 1]]
    assert batch_rows(3, 1) == [[0], [1], [2]]
    with pytest.raises(EntmtpError, match="batch size 0"):
        batch_rows(3, 0)
