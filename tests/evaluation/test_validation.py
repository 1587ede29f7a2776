"""Live validation's pieces on synthetic steps: the live-versus-replay comparison and the step
times by tree (no model: live results are built from a replay, then perturbed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.evaluation._paired import carryover_balanced_orders
from entmtp.evaluation._validation import (
    EncodedPrompt,
    Method,
    compare_steps,
    quartiles,
    run_side_by_side,
    step_spread,
    step_times_by_tree,
    step_tokens,
)
from entmtp.runtime._records import StepLog
from entmtp.treesearch import (
    EntropyEstimator,
    LatencyModel,
    Schedule,
    Tree,
    replay,
    synthetic_profile,
)


def test_step_comparison_finds_every_disagreement():
    profile = synthetic_profile(num_traces=3, positions=40, num_heads=3, seed=1)
    trees = (Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]]), Tree.from_paths([[0]]))
    replayed = replay(profile, Schedule(trees, (1.0,), EntropyEstimator.ema(0.5)),
                      LatencyModel.cpu_like())

    def live_from_replay(*, longer: tuple[int, int] | None = None,
                         tree: tuple[int, int] | None = None):
        """Decode results that step exactly as the replay; ``longer = (trace, step)`` makes that
        step emit one more token (every later step moves on by one), ``tree = (trace, step)``
        switches that step's tree."""
        results = []
        for j, trace in enumerate(profile.traces):
            mine = replayed.step_trace == j
            steps = [list(s) for s in zip(replayed.step_position[mine].tolist(),
                                          replayed.step_tree[mine].tolist(),
                                          replayed.step_estimate[mine].tolist(), strict=True)]
            if longer is not None and longer[0] == j:
                for step in steps[longer[1] + 1:]:
                    step[0] += 1
                steps = [s for s in steps if s[0] < trace.num_positions - 1]
            if tree is not None and tree[0] == j:
                steps[tree[1]][1] = 1 - steps[tree[1]][1]
            log = [StepLog(p, e, k, trees[k].num_nodes, trees[k].depth, 0, 0.0, 0.0, 0.0)
                   for p, k, e in steps]
            results.append(SimpleNamespace(tokens=[0] * trace.num_positions, step_log=log))
        return results

    ids = [t.prompt_id for t in profile.traces]
    exact = live_from_replay()
    same = compare_steps(exact, replayed, ids)
    assert same.agreement == 1.0 and same.mismatches == []
    assert same.steps_compared == replayed.steps == sum(len(r.step_log) for r in exact)
    assert same.max_estimate_difference == 0.0
    assert [a for r in exact for a in step_tokens(r)] == replayed.step_accept.tolist()

    changed = compare_steps(live_from_replay(longer=(1, 2)), replayed, ids)
    assert changed.agreement < 1.0
    first = changed.mismatches[0]
    assert first.prompt_id == ids[1] and first.live_accept == first.replayed_accept + 1
    assert first.live_tree == first.replayed_tree
    assert {m.prompt_id for m in changed.mismatches} == {ids[1]}

    switched = compare_steps(live_from_replay(tree=(2, 1)), replayed, ids)
    assert switched.steps_compared == replayed.steps
    assert switched.steps_equal == replayed.steps - 1
    (only,) = switched.mismatches
    assert only.prompt_id == ids[2] and only.live_accept == only.replayed_accept
    assert only.live_tree == 1 - only.replayed_tree


def test_step_times_by_tree_average_the_matched_steps_only():
    profile = synthetic_profile(num_traces=2, positions=30, num_heads=3, seed=2)
    trees = (Tree.from_paths([[0], [1], [0, 0]]), Tree.from_paths([]))
    replayed = replay(profile, Schedule(trees, (1.0,), EntropyEstimator.ema(0.5)),
                      LatencyModel.cpu_like())
    ids = [t.prompt_id for t in profile.traces]
    # Live steps as replayed, each taking 1.5x its booked time; the first step of trace 0 ran
    # the other tree, so it is left out.
    live, expected = [], {}
    for j in range(len(profile.traces)):
        mine = replayed.step_trace == j
        log = []
        for i, (p, k, ms) in enumerate(zip(replayed.step_position[mine].tolist(),
                                           replayed.step_tree[mine].tolist(),
                                           replayed.step_ms[mine].tolist(), strict=True)):
            if j == 0 and i == 0:
                k = 1 - k
            else:
                expected.setdefault(k, []).append(ms)
            log.append(StepLog(p, 0.0, k, trees[k].num_nodes, trees[k].depth, 1,
                               0.5 * ms, ms, 0.0))
        live.append(SimpleNamespace(step_log=log))
    times = step_times_by_tree(live, replayed, ids, trees)
    assert [t.tree for t in times] == sorted(expected)
    for t in times:
        booked = expected[t.tree]
        assert t.steps == len(booked)
        assert (t.num_nodes, t.depth) == (trees[t.tree].num_nodes, trees[t.tree].depth)
        assert t.modelled_ms == pytest.approx(sum(booked) / len(booked))
        assert t.measured_over_modelled == pytest.approx(1.5)
    assert sum(t.steps for t in times) == replayed.steps - 1


def test_step_spread_is_the_median_and_interquartile_range_of_every_step():
    rng = np.random.default_rng(3)
    results, times = [], []
    for steps in (5, 0, 11):
        ms = rng.uniform(1.0, 9.0, size=(steps, 3))  # draft, verify, bookkeeping
        times += ms.sum(axis=1).tolist()
        results.append(SimpleNamespace(step_log=[
            StepLog(i, 0.0, 0, 1, 1, 1, float(d), float(v), float(b))
            for i, (d, v, b) in enumerate(ms)]))
    spread = step_spread(results)
    ordered = sorted(times)

    def percentile(q: float) -> float:  # linear interpolation between order statistics
        rank = q * (len(ordered) - 1)
        low = int(rank)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (rank - low) * (ordered[high] - ordered[low])

    assert spread.steps == len(times) == 16
    assert spread.median_ms == pytest.approx(percentile(0.5))
    assert spread.iqr_ms == pytest.approx(percentile(0.75) - percentile(0.25))
    assert spread.to_json() == {"steps": 16, "median_ms": spread.median_ms,
                                "iqr_ms": spread.iqr_ms}
    empty = step_spread([SimpleNamespace(step_log=[])])
    assert empty.steps == 0 and np.isnan(empty.median_ms) and np.isnan(empty.iqr_ms)
    assert all(np.isnan(q) for q in quartiles([]))


def test_side_by_side_runs_each_prompt_in_a_balanced_order():
    calls: list[tuple[str, int, int]] = []

    def method(name: str) -> Method:
        def run(ids, max_new_tokens):
            calls.append((name, ids[0], max_new_tokens))
            return SimpleNamespace(tokens=[1] * max_new_tokens, prefill_ms=1.0, decode_ms=2.0)
        return Method(name, run)

    methods = [method(name) for name in "abc"]
    prompts = [EncodedPrompt(index=p, prompt_id=str(p), ids=[100 + p]) for p in range(8)]
    runs = run_side_by_side(methods, prompts, max_new_tokens=5)
    warm, measured = calls[:3], calls[3:]
    assert [name for name, _, _ in warm] == ["a", "b", "c"]
    orders = carryover_balanced_orders(3)
    for p in range(8):
        ran = measured[3 * p:3 * p + 3]
        assert [name for name, _, _ in ran] == ["abc"[m] for m in orders[p % len(orders)]]
        assert all(first == 100 + p and count == 5 for _, first, count in ran)
    assert [len(run.results) for run in runs] == [8, 8, 8]


def test_a_method_that_decodes_as_another_shares_its_runs_and_is_never_run():
    calls: list[str] = []

    def method(name: str, same_as: str | None = None) -> Method:
        def run(ids, max_new_tokens):
            calls.append(name)
            return SimpleNamespace(tokens=[ids[0]] * max_new_tokens, prefill_ms=1.0,
                                   decode_ms=float(len(calls)))
        return Method(name, run, same_as=same_as)

    methods = [method("a"), method("b"), method("b-again", same_as="b"), method("c")]
    prompts = [EncodedPrompt(index=p, prompt_id=str(p), ids=[100 + p]) for p in range(4)]
    runs = run_side_by_side(methods, prompts, max_new_tokens=3)
    assert "b-again" not in calls and len(calls) == 3 + 3 * 4  # warm-ups, then 3 per prompt
    orders = carryover_balanced_orders(3)  # the design of the measured methods only
    for p in range(4):
        assert calls[3 + 3 * p: 6 + 3 * p] == ["abc"[m] for m in orders[p % len(orders)]]
    assert runs[2].name == "b-again" and runs[2].results == runs[1].results
    assert [r.tokens[0] for r in runs[2].results] == [100, 101, 102, 103]


@pytest.mark.parametrize("same_as", ["missing", "b-again"])
def test_sharing_the_runs_of_no_measured_method_is_one_line(same_as):
    methods = [Method("a", lambda ids, n: None), Method("b-again", lambda ids, n: None,
                                                        same_as="a"),
               Method("c", lambda ids, n: None, same_as=same_as)]
    with pytest.raises(EntmtpError, match=r"^method c shares the runs of .*, which is not a "
                                          r"measured method of the same run$"):
        run_side_by_side(methods, [EncodedPrompt(index=0, prompt_id="0", ids=[1])],
                         max_new_tokens=1)
