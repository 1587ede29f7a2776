"""Padded verify widths in the latency model: a tree is priced (and run) at the cheapest larger
measured width beyond noise, so the effective curve never falls as the tree grows."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.treesearch._latency import (
    NOISE_SIGMAS,
    LatencyModel,
    LatencyPoint,
    padding_table,
    raw_verify_error_ms,
    raw_verify_ms,
    with_padding,
)

EPYC = Path(__file__).resolve().parents[2] / "bench/results/latency-static-cpu2-epyc-medusa.json"


def _points(nodes, verify, iqrs, rounds=10) -> tuple[LatencyPoint, ...]:
    return tuple(LatencyPoint("tree", 128, ms=v, median_ms=v, iqr_ms=iqr, rounds=rounds,
                              nodes=n, depth=1)
                 for n, v, iqr in zip(nodes, verify, iqrs, strict=True))


@st.composite
def latency_models(draw) -> LatencyModel:
    """Any curve of drafted trees: dips, plateaus, noisy and quiet knots, with or without a
    spread. The empty tree (never padded: it is the autoregressive step) costs least."""
    count = draw(st.integers(1, 9))
    nodes = [0, *sorted(draw(st.sets(st.integers(1, 60), min_size=count - 1,
                                     max_size=count - 1)))]
    # a few values only, so ties and plateaus are common
    verify = [draw(st.sampled_from([5.0, 10.0, 20.0, 21.0, 40.0, 80.0])) +
              draw(st.floats(0.0, 3.0)) * draw(st.integers(0, 1)) for _ in nodes]
    verify[0] = min(verify)
    spread = draw(st.booleans())
    points = _points(nodes, verify, [draw(st.floats(0.0, 8.0)) for _ in nodes]) if spread \
        else ()
    return LatencyModel(tuple(nodes), tuple(verify), autoregressive_ms=verify[0],
                        depth_ms=draw(st.sampled_from([0.0, 0.5])), points=points,
                        hardware={"kind": "synthetic-test"})


def _brute_force_pad(model: LatencyModel, n: int) -> int:
    """Plain loops: the measured count m > n whose step is cheaper than n's beyond noise and
    cheapest among those, the smallest on ties; n itself when none is."""
    raw = float(raw_verify_ms(model, n))
    error = float(raw_verify_error_ms(model, n))
    best = n
    best_ms = raw
    for m, ms in zip(model.nodes, model.verify_ms, strict=True):
        se = model.figure_error_ms("tree", nodes=m)
        if m > n and raw - ms > NOISE_SIGMAS * math.hypot(error, se) and (
                best == n or ms < best_ms):
            best, best_ms = m, ms
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=latency_models())
def test_padding_properties(model):
    padded = with_padding(model)
    table = padded.padding
    counts = np.arange(0, model.nodes[-1] + 20)
    raw = raw_verify_ms(model, counts)
    effective = padded.step_ms(counts, 0)
    pad = padded.padded_count(counts)
    assert np.all(pad >= counts)
    assert np.all(effective <= raw + 1e-12)  # never above the raw curve
    assert 0 not in table and all(m in model.nodes and m > n for n, m in table.items())
    for n in range(1, model.nodes[-1] + 20):
        assert table.get(n, n) == _brute_force_pad(model, n), n
    # the effective curve never falls beyond noise between measured counts (where the noise
    # is measured; without a spread the next test shows it never falls at all)
    knots = np.asarray(model.nodes)
    at_knots = padded.step_ms(knots, 0)
    error = [model.figure_error_ms("tree", nodes=int(m)) for m in padded.padded_count(knots)]
    for i in range(len(knots)):
        for j in range(i + 1, len(knots)):
            tolerance = NOISE_SIGMAS * math.hypot(error[i], error[j])
            assert at_knots[i] - at_knots[j] <= tolerance + 1e-9, (knots[i], knots[j])
    # ... so its monotonicity check passes (the raw curve's may not)
    assert not any("falls as the tree grows" in w for w in padded.warnings)
    # the table is what the file keeps
    assert LatencyModel.from_json(json.loads(json.dumps(padded.to_json()))) == padded


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=latency_models())
def test_without_a_spread_padding_is_the_exact_cheapest_larger_width(model):
    """No spread: a strict saving pads, so the effective step at n is the minimum of the raw
    curve over every count m >= n (measured, interpolated or extrapolated)."""
    model = replace(model, points=())
    padded = with_padding(model)
    top = model.nodes[-1] + 30
    raw = raw_verify_ms(model, np.arange(top + 1))
    effective = padded.step_ms(np.arange(1, top + 1), 0)
    for n in range(1, top + 1):
        assert float(effective[n - 1]) == pytest.approx(float(raw[n:].min()))
    assert np.all(np.diff(effective) >= -1e-12)  # non-decreasing


def test_a_dip_pads_smaller_trees_to_the_cheaper_larger_one():
    nodes = (0, 4, 8, 11, 12, 13, 14, 15, 16, 32)
    verify = (20.0, 35.0, 53.0, 77.0, 94.0, 95.0, 117.0, 69.0, 87.0, 117.0)
    quiet = _points(nodes, verify, [1.0] * len(nodes))
    model = LatencyModel(nodes, verify, autoregressive_ms=20.0, points=quiet)
    assert any("falls as the tree grows" in w for w in model.warnings)
    table = padding_table(model)
    # 10 nodes interpolate to 69 ms: no saving; 16 ms past the dip grow again
    assert {n: table[n] for n in range(9, 17) if n in table} == {11: 15, 12: 15, 13: 15, 14: 15}
    assert not [n for n in table if n >= 15]
    padded = with_padding(model)
    assert padded.step_ms(12, 2) == pytest.approx(69.0 + 2 * padded.depth_ms)
    assert not any("falls" in w for w in padded.warnings)
    assert padded.verify_ms == model.verify_ms  # the raw curve stays
    # a noisy 15-node point (its spread covers the fall) is no padding target; 16 still is
    noisy = replace(model, points=_points(nodes, verify, [1.0] * 7 + [200.0] + [1.0] * 2))
    assert padding_table(noisy) == {12: 16, 13: 16, 14: 16}


def test_the_measured_epyc_dip_is_unreachable_once_padded():
    """The lead's EPYC curve (11-14 nodes 77-117 ms, 15 nodes 69 ms): the padded model verifies
    them at 15 nodes and passes the monotonicity check the raw one fails."""
    model = LatencyModel.load(EPYC)
    assert any("falls as the tree grows" in w for w in model.warnings)
    padded = with_padding(model)
    assert all(padded.padding.get(n) == 15 for n in range(11, 15))
    assert not any("falls as the tree grows" in w for w in padded.warnings)
    assert padded.step_ms(12, 2) == pytest.approx(model.step_ms(15, 2))


def test_padded_nodes_in_the_file(tmp_path):
    model = LatencyModel((0, 4, 8), (10.0, 30.0, 20.0), autoregressive_ms=10.0)
    assert "padded_nodes" not in model.to_json()  # optional: files without stay as they were
    padded = with_padding(model)
    # 2 nodes interpolate to 20 ms, as 8 do: no strict saving
    assert padded.to_json()["padded_nodes"] == {str(n): 8 for n in range(3, 8)}
    path = padded.save(tmp_path / "latency.json")
    assert LatencyModel.load(path) == padded
    for bad, message in (({"4": 2}, "pads 4 nodes to 2"), ({"4": 6}, "pads 4 nodes to 6"),
                         ({"x": 8}, "padded_nodes"), ({"4": 8.5}, "padded_nodes"),
                         ({"0": 4}, "pads 0 nodes")):
        obj = model.to_json() | {"padded_nodes": bad}
        with pytest.raises(EntmtpError, match=message):
            LatencyModel.from_json(obj)
    with pytest.raises(EntmtpError, match="padded_nodes"):
        LatencyModel.from_json(model.to_json() | {"padded_nodes": [[4, 8]]})


def test_the_search_prices_a_padded_tree_at_the_larger_width():
    """Greedy candidates and the replay price a 12-node tree at the 15-node step (plus its own
    depth term) under a dip, so the front never holds a tree that the dip makes slower."""
    from entmtp.treesearch._pareto import greedy_candidates, pareto_front
    from entmtp.treesearch._replay import Replayer
    from entmtp.treesearch._synthetic import synthetic_profile

    nodes = (0, 4, 8, 11, 12, 13, 14, 15, 16, 32)
    verify = (20.0, 35.0, 53.0, 77.0, 94.0, 95.0, 117.0, 69.0, 87.0, 117.0)
    raw = LatencyModel(nodes, verify, autoregressive_ms=20.0, depth_ms=0.5,
                       points=_points(nodes, verify, [1.0] * len(nodes)))
    padded = with_padding(raw)
    profile = synthetic_profile(num_traces=4, positions=200, num_heads=3, topk=4, seed=3)
    ranks = profile.ranks()
    candidates = {c.tree.num_nodes: c for c in greedy_candidates(ranks, padded, max_nodes=16)}
    twelve, fifteen = candidates[12], candidates[15]
    assert twelve.latency_ms == pytest.approx(69.0 + 0.5 * twelve.tree.depth)
    assert fifteen.latency_ms == pytest.approx(69.0 + 0.5 * fifteen.tree.depth)
    assert twelve.latency_ms < float(raw.step_ms(12, twelve.tree.depth))
    replayer = Replayer(profile, [twelve.tree, fifteen.tree], padded)
    assert replayer.tree_ms[0] == pytest.approx(twelve.latency_ms)
    # at one price the larger tree accepts at least as much: 12..14 leave the front unless a
    # deeper tree pays more depth terms than it gains
    front = {c.tree.num_nodes: c for c in pareto_front(candidates.values())}
    for n in (12, 13, 14):
        if n in front:
            assert front[n].latency_ms < fifteen.latency_ms


def test_the_bundle_schema_takes_a_padded_latency_model():
    from jsonschema import Draft202012Validator

    from entmtp.treesearch._bundle import bundle_schema

    nodes, verify = (0, 4, 8), (10.0, 30.0, 20.0)
    points = (*_points(nodes, verify, [1.0] * 3),
              LatencyPoint("tree", 128, 21.0, 21.0, 1.0, 10, nodes=4, depth=1, padded_to=8))
    padded = with_padding(LatencyModel(nodes, verify, autoregressive_ms=10.0, points=points))
    obj = padded.to_json()
    assert obj["padded_nodes"] and obj["noise"]["points"][-1]["padded_to"] == 8
    assert "padded_to" not in obj["noise"]["points"][0]
    validator = Draft202012Validator(bundle_schema()["properties"]["latency"])
    assert validator.is_valid(obj)
    assert not validator.is_valid(obj | {"padded_nodes": {"x": 8}})


def test_a_padded_model_is_another_search_input_and_the_report_says_it_pads():
    from entmtp.treesearch._run import latency_lines
    from entmtp.treesearch._schedule_search import _fingerprint
    from entmtp.treesearch._synthetic import synthetic_profile
    from entmtp.treesearch._tree import Tree

    nodes, verify = (0, 4, 8), (10.0, 30.0, 20.0)
    points = (*_points(nodes, verify, [1.0] * 3),
              LatencyPoint("tree", 128, 99.0, 99.0, 50.0, 10, nodes=4, depth=1, padded_to=8))
    raw = LatencyModel(nodes, verify, autoregressive_ms=10.0, points=points)
    padded = with_padding(raw)
    profile = synthetic_profile(num_traces=2, positions=40, num_heads=3, topk=4, seed=1)
    trees = [Tree.from_paths([]), Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])]
    # a study searched under raw prices is not resumed under padded ones
    assert _fingerprint(profile, trees, raw) != _fingerprint(profile, trees, padded)
    text = "\n".join(latency_lines(padded))
    assert "padded widths (cheaper beyond noise): 3-7->8 nodes" in text
    assert "| step, 4 nodes | 30.00 | 1 |" in text  # the padded step's point is not the knot's
    assert "padded widths" not in "\n".join(latency_lines(raw))
