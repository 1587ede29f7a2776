"""The schedule per batch size, its ranges, and bundles that carry them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._batch_replay import batch_replay
from entmtp.treesearch._batch_search import (
    BATCH_ONE,
    BEST_STATIC,
    NO_DRAFTING,
    batch_ranges,
    bundle_batch_ranges,
    choose_for_batch,
    search_by_batch,
)
from entmtp.treesearch._bundle import (
    BatchRange,
    bundle_to_json,
    load_bundle,
    parse_bundle,
    save_bundle,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._replay import Replayer
from entmtp.treesearch._run import SearchSettings, make_bundle, search
from entmtp.treesearch._schedule import BASE_ENTROPY, Schedule
from entmtp.treesearch._synthetic import synthetic_profile
from entmtp.treesearch._tree import Tree

EMPTY = Tree.from_paths([])
CHAIN = Tree.from_paths([[0], [0, 0], [0, 0, 0]])
WIDE = Tree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]])


def _latency(per_node_ms: float, base_ms: float = 40.0) -> LatencyModel:
    """A step that costs ``per_node_ms`` more per drafted node (a batch verifies B rows each)."""
    nodes = (0, 3, 7, 15, 63)
    return LatencyModel(nodes, tuple(base_ms + per_node_ms * n for n in nodes),
                        autoregressive_ms=base_ms, hardware={"kind": "synthetic-cpu"})


# At batch 1 a node costs little; at 16 drafting costs more than it gains.
LATENCIES = {1: _latency(0.3), 2: _latency(0.6), 4: _latency(2.0), 8: _latency(12.0),
             16: _latency(40.0)}


@pytest.fixture(scope="module")
def profile():
    made = synthetic_profile(num_traces=10, positions=80, num_heads=3, topk=3, seed=2)
    made.meta.model, made.meta.vocab_size, made.meta.hidden_size = "synthetic", 1, 1
    return made


def _batch_one() -> Schedule:
    return Schedule((WIDE, CHAIN, EMPTY), (0.5, 2.0), EntropyEstimator.ema(0.5), BASE_ENTROPY)


def _search_at(size, latency):
    """A stand-in for the whole search: the batch-1 schedule and the chain (cheap, exact)."""
    return _batch_one(), CHAIN


def test_every_size_is_at_least_as_fast_as_plain_decoding_and_the_batch_one_schedule(profile):
    choices = search_by_batch(profile, LATENCIES, batch_one=_batch_one(), search_at=_search_at)
    assert [c.batch_size for c in choices] == [1, 2, 4, 8, 16]
    for choice in choices:
        replays = choice.replays
        assert choice.tokens_per_second == max(r.tokens_per_second for r in replays.values())
        assert choice.tokens_per_second >= choice.autoregressive_tokens_per_second
        assert choice.tokens_per_second >= choice.batch_one_tokens_per_second
        # what was chosen is what the batched replay of its schedule gives
        again = batch_replay(Replayer(profile, choice.schedule.trees, LATENCIES[choice.batch_size]),
                             choice.schedule, choice.batch_size)
        assert again.tokens_per_second == pytest.approx(choice.tokens_per_second)
    assert choices[-1].source == NO_DRAFTING  # 40 ms a node: drafting never pays
    assert choices[0].source != NO_DRAFTING


def test_ties_go_to_the_simplest_candidate(profile):
    flat = _latency(0.0)
    choice = choose_for_batch(profile, flat, 2, searched=Schedule.static(CHAIN),
                              best_static_tree=CHAIN, batch_one=Schedule.static(CHAIN))
    assert choice.source == BEST_STATIC  # the searched and batch-1 schedules are the same tree


def test_ranges_cover_every_size_from_one_and_merge_equal_neighbours(profile):
    choices = search_by_batch(profile, LATENCIES, batch_one=_batch_one(), search_at=_search_at)
    ranges = batch_ranges(choices)
    assert ranges[0].min_batch_size == 1 and ranges[-1].max_batch_size == 16
    for before, after in zip(ranges, ranges[1:], strict=False):
        assert after.min_batch_size == before.max_batch_size + 1
        assert after.schedule != before.schedule
    assert sum(len(r.choices) for r in ranges) == len(choices)
    for merged in ranges:
        assert all(c.schedule == merged.schedule for c in merged.choices)
        assert merged.max_batch_size == merged.choices[-1].batch_size


def _bundle(profile, tmp_path):
    outcome = search(profile, LATENCIES[1], SearchSettings(schedule_trials=5, max_nodes=8))
    return make_bundle(outcome, profile, LATENCIES[1], command="test", version="0")


def test_a_bundle_with_ranges_round_trips_as_version_2_and_picks_by_batch_size(profile,
                                                                               tmp_path):
    bundle = _bundle(profile, tmp_path)
    plain = bundle_to_json(bundle)
    assert plain["format_version"] == 1 and "batch_ranges" not in plain
    choices = search_by_batch(profile, LATENCIES, batch_one=bundle.schedule(),
                              search_at=_search_at)
    bundle.batch_ranges = bundle_batch_ranges(choices)
    path = save_bundle(bundle, tmp_path / "b.json")
    assert json.loads(path.read_text())["format_version"] == 2
    loaded = load_bundle(path)
    assert bundle_to_json(loaded) == bundle_to_json(bundle)
    assert loaded.batch_sizes == (1, 2, 4, 8, 16)
    for choice in choices:
        assert loaded.schedule(choice.batch_size) == choice.schedule
    assert loaded.schedule(3) == loaded.schedule(4)  # the next measured size up
    assert loaded.schedule(1000) == loaded.schedule(16)  # past the last range: the last
    assert not loaded.batch_range(16).drafts
    assert loaded.schedule() == bundle.schedule()  # the top level: batch 1


def _ranges_json(bundle) -> dict:
    obj = bundle_to_json(bundle)
    obj["format_version"] = 2
    empty = {"paths": [], "num_nodes": 0, "depth": 0}
    prediction = {"batch_size": 1, "chosen": BATCH_ONE, "tokens_per_second": 10.0,
                  "mean_accept_length": 1.0, "autoregressive_tokens_per_second": 10.0,
                  "best_static_tokens_per_second": 10.0, "batch_one_tokens_per_second": 10.0}
    obj["batch_ranges"] = [
        {"min_batch_size": 1, "max_batch_size": 2, "entropy": obj["entropy"],
         "thresholds": [], "trees": [empty], "predicted": [prediction]},
        {"min_batch_size": 3, "max_batch_size": 4, "entropy": obj["entropy"],
         "thresholds": [], "trees": [empty], "predicted": [{**prediction, "batch_size": 4}]},
    ]
    return obj


@pytest.mark.parametrize(("change", "words"), [
    (lambda o: o["batch_ranges"][1].update(min_batch_size=4), "expected 3"),
    (lambda o: o["batch_ranges"][0].update(min_batch_size=2), "expected 1"),
    (lambda o: o["batch_ranges"][1].update(max_batch_size=2), "below its min_batch_size"),
    (lambda o: o["batch_ranges"][1]["predicted"][0].update(batch_size=9), "inside 3..4"),
    (lambda o: o["batch_ranges"][0].update(thresholds=[1.0]), "1 values for 1 trees"),
    (lambda o: o["batch_ranges"][0]["trees"][0].update(num_nodes=3), "paths give 0"),
    (lambda o: o.update(format_version=1), "format_version"),
    (lambda o: o["batch_ranges"][0]["predicted"][0].update(chosen="magic"), "chosen"),
])
def test_bad_batch_ranges_are_one_line_naming_the_field(profile, tmp_path, change, words):
    obj = _ranges_json(_bundle(profile, tmp_path))
    parse_bundle(json.dumps(obj))  # the unchanged one is valid
    change(obj)
    with pytest.raises(EntmtpError, match="batch_ranges|format_version") as err:
        parse_bundle(json.dumps(obj), source="bundle x.json")
    message = str(err.value)
    assert words in message and "\n" not in message and message.startswith("bundle x.json")


def test_a_bundle_without_ranges_is_a_batch_one_bundle(profile, tmp_path):
    bundle = _bundle(profile, tmp_path)
    assert bundle.batch_range(8) is None and bundle.batch_sizes == ()
    assert bundle.schedule(8) == bundle.schedule()
    with pytest.raises(EntmtpError, match="batch size 0"):
        bundle.schedule(0)
    broken = dataclasses.replace(bundle)
    with pytest.raises(EntmtpError, match="consecutively"):
        broken.batch_ranges = [BatchRange(2, 4, bundle.entropy, [], [EMPTY], [])]
        broken.__post_init__()
    assert np.isfinite(bundle.predicted.tokens_per_second)
