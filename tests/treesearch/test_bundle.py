"""Bundle format v1: round trips, one test per rejection (with the field named), atomic saves."""

from __future__ import annotations

import bisect
import copy
import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from entmtp.core import EntmtpError
from entmtp.treesearch._bundle import (
    BestStatic,
    Bundle,
    CreatedBy,
    EntropyInfo,
    HeadsInfo,
    ModelInfo,
    Predicted,
    TreeStats,
    bundle_from_json,
    bundle_schema,
    bundle_to_json,
    load_bundle,
    parse_bundle,
    save_bundle,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._schedule import Schedule
from entmtp.treesearch._tree import Tree

SHA = "0123456789abcdef" * 4


def sample_bundle(**overrides) -> Bundle:
    trees = [
        Tree.from_paths([[0], [0, 0], [0, 0, 0], [1]]),
        Tree.from_paths([[0], [1], [2], [0, 0], [1, 0], [0, 1]]),
        Tree.from_paths([]),
    ]
    fields = dict(
        model=ModelInfo("tiny-llama", 128, 32),
        heads=HeadsInfo("medusa", 4, 10, SHA),
        task="code",
        entropy=EntropyInfo("base_entropy", "nats", EntropyEstimator.ema(0.3)),
        thresholds=[0.75, 2.5],
        trees=trees,
        tree_stats=[TreeStats(2.4, 21.5), TreeStats(1.9, 22.25), TreeStats(1.0, 20.0)],
        predicted=Predicted(2.1, 95.5, 1.8, 110.0),
        hardware={"device": "cpu", "cpu_count": 2, "torch": "2.13.0"},
        created_by=CreatedBy("0.1.0", "entmtp calibrate --task code", {"created_at": "now"}),
        best_static=BestStatic(trees[1], 90.0, 1),
        latency=LatencyModel.cpu_like(depth_ms=0.5),
    )
    fields.update(overrides)
    return Bundle(**fields)


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"best_static": None, "latency": None},
        {"heads": HeadsInfo("hydra", 4, (10, 8, 6, 4), SHA)},
        {"entropy": EntropyInfo("base_entropy", "bits", EntropyEstimator.window(5))},
        {"entropy": EntropyInfo("base_entropy", "nats", EntropyEstimator.last())},
        {"best_static": BestStatic(Tree.from_paths([[0], [0, 0]]), 80.0)},
    ],
    ids=["full", "minimal", "per-head-topk", "window", "last", "best-static-paths"],
)
def test_save_load_round_trip(tmp_path, overrides):
    bundle = sample_bundle(**overrides)
    path = save_bundle(bundle, tmp_path / "b.json")
    assert load_bundle(path) == bundle
    assert bundle_from_json(json.loads(path.read_text())) == bundle
    assert leftovers(tmp_path) == []


def test_round_trip_of_single_tree_bundle(tmp_path):
    tree = Tree.from_paths([[0], [0, 0]])
    bundle = sample_bundle(
        thresholds=[], trees=[tree], tree_stats=[TreeStats(1.5, 20.0)], best_static=None
    )
    assert load_bundle(save_bundle(bundle, tmp_path / "one.json")) == bundle


def test_paths_load_in_any_order(tmp_path):
    obj = bundle_to_json(sample_bundle())
    obj["trees"][1]["paths"] = list(reversed(obj["trees"][1]["paths"]))
    loaded = load_bundle(write_json(tmp_path / "b.json", obj))
    assert loaded.trees[1] == sample_bundle().trees[1]


def test_numpy_scalars_are_saved_as_plain_json(tmp_path):
    bundle = sample_bundle(
        model=ModelInfo("m", np.int64(128), np.int64(32)),
        tree_stats=[TreeStats(np.float64(1.0), np.float32(21.5))] * 3,
        thresholds=np.array([0.5, 1.5]),
    )
    loaded = load_bundle(save_bundle(bundle, tmp_path / "b.json"))
    assert loaded.model.vocab_size == 128 and type(loaded.model.vocab_size) is int
    assert loaded.thresholds == [0.5, 1.5]


def test_schema_is_valid_draft_2020_12_package_data():
    from importlib.resources import files

    from jsonschema import Draft202012Validator

    shipped = json.loads(files("entmtp.treesearch").joinpath("bundle.schema.json").read_text())
    assert shipped == bundle_schema()
    Draft202012Validator.check_schema(shipped)
    assert Draft202012Validator(shipped).is_valid(bundle_to_json(sample_bundle()))


def test_tree_index_for_matches_half_open_buckets():
    bundle = sample_bundle()
    t = bundle.thresholds
    rng = np.random.default_rng(0)
    for estimate in [*t, *(rng.normal(1.5, 2.0, 200))]:
        expected = sum(1 for threshold in t if threshold <= estimate)  # [t_{i-1}, t_i)
        assert bundle.tree_index_for(estimate) == expected
        assert bundle.tree_for(estimate) is bundle.trees[expected]
    assert bundle.tree_index_for(t[0]) == 1 and bundle.tree_index_for(np.nextafter(t[0], 0)) == 0
    assert bisect.bisect_right(t, -1e9) == bundle.tree_index_for(-1e9) == 0


# -- the schedule -----------------------------------------------------------------------------
def _bits(bundle: Bundle) -> Bundle:
    """The same bundle with its thresholds stored in bits."""
    entropy = EntropyInfo(bundle.entropy.signal, "bits", bundle.entropy.estimator)
    return sample_bundle(entropy=entropy, thresholds=[t / math.log(2) for t in bundle.thresholds])


def test_schedule_of_a_nats_bundle_is_its_trees_thresholds_and_estimator():
    bundle = sample_bundle()
    schedule = bundle.schedule()
    assert schedule == Schedule(tuple(bundle.trees), (0.75, 2.5), bundle.entropy.estimator)


def test_schedule_of_a_bits_bundle_is_in_nats():
    bits = sample_bundle(
        entropy=EntropyInfo("base_entropy", "bits", EntropyEstimator.ema(0.3)), thresholds=[1, 2]
    )
    schedule = bits.schedule()
    assert schedule.thresholds == pytest.approx((math.log(2), 2 * math.log(2)), rel=1e-15)
    assert schedule.trees == tuple(bits.trees) and schedule.estimator == bits.entropy.estimator
    # an entropy of 1.2 nats is 1.73 bits: above the first threshold, below the second
    assert bits.tree_index_for(1.2) == schedule.tree_index(1.2) == 1
    assert bits.tree_index_for(0.69) == 0 and bits.tree_index_for(1.39) == 2


def test_bits_and_nats_bundles_choose_the_same_trees():
    nats = sample_bundle()
    bits = _bits(nats)
    rng = np.random.default_rng(3)
    estimates = rng.gamma(2.0, 0.8, 500)
    expected = [sum(1 for t in nats.thresholds if t <= e) for e in estimates.tolist()]
    assert bits.schedule().tree_indices(estimates).tolist() == expected
    assert nats.schedule().tree_indices(estimates).tolist() == expected
    assert [bits.tree_index_for(e) for e in estimates.tolist()] == expected


def test_equal_thresholds_load_and_leave_a_tree_that_is_never_chosen(tmp_path):
    bundle = load_bundle(save_bundle(sample_bundle(thresholds=[1.0, 1.0]), tmp_path / "b.json"))
    assert bundle.thresholds == [1.0, 1.0]
    schedule = bundle.schedule()
    estimates = np.concatenate([[1.0, np.nextafter(1.0, 0)], np.linspace(-1, 3, 401)])
    indices = schedule.tree_indices(estimates).tolist()
    assert indices == [0 if e < 1.0 else 2 for e in estimates.tolist()]
    assert 1 not in indices


def test_bits_thresholds_that_round_to_one_nats_value_still_make_a_schedule():
    low = 0.7213606803401701
    high = float(np.nextafter(low, 1.0))
    assert low * math.log(2) == high * math.log(2)  # the premise: conversion merges them
    bits = sample_bundle(
        entropy=EntropyInfo("base_entropy", "bits", EntropyEstimator.last()),
        thresholds=[low, high],
    )
    schedule = bits.schedule()
    assert schedule.thresholds[0] == schedule.thresholds[1]
    assert schedule.tree_index(schedule.thresholds[0]) == 2


def test_a_draft_signal_bundle_round_trips_into_a_draft_schedule(tmp_path):
    draft = sample_bundle(entropy=EntropyInfo("draft_entropy", "nats", EntropyEstimator.last()))
    loaded = load_bundle(save_bundle(draft, tmp_path / "d.json"))
    assert loaded.entropy.signal == "draft_entropy"
    schedule = loaded.schedule()
    assert schedule.signal == "draft_entropy" and schedule.thresholds == (0.75, 2.5)
    assert sample_bundle().schedule().signal == "base_entropy"


def test_unknown_entropy_unit_is_one_line_error():
    with pytest.raises(EntmtpError, match=r"entropy\.unit: 'bans' is unknown: use one of nats"):
        sample_bundle(entropy=EntropyInfo("base_entropy", "bans", EntropyEstimator.last()))


# -- compatibility ----------------------------------------------------------------------------
def test_check_compatible_accepts_the_same_model_and_skips_none():
    bundle = sample_bundle()
    bundle.check_compatible(
        vocab_size=128, hidden_size=32, head_type="medusa", num_heads=4, heads_sha256=SHA.upper()
    )
    bundle.check_compatible()


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"vocab_size": 49152}, "vocab_size"),
        ({"hidden_size": 576}, "hidden_size"),
        ({"head_type": "hydra"}, "searched for medusa heads but the heads loaded are hydra"),
        ({"num_heads": 3}, "number of heads"),
        ({"heads_sha256": "f" * 64}, "sha256"),
    ],
)
def test_check_compatible_names_the_mismatch(kwargs, named):
    with pytest.raises(EntmtpError, match=named) as info:
        sample_bundle().check_compatible(**kwargs)
    assert "\n" not in str(info.value)


def test_a_synthetic_bundle_decodes_nothing():
    bundle = sample_bundle()
    bundle.model = dataclasses.replace(bundle.model, name="synthetic")
    with pytest.raises(EntmtpError, match="synthetic .*nothing decodes with it"):
        bundle.check_compatible()


# -- rejections -------------------------------------------------------------------------------
def _set(path, value):
    def mutate(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path):
    def mutate(obj):
        target = obj
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _append_path(tree, path):
    def mutate(obj):
        entry = obj["trees"][tree]
        entry["paths"].append(path)
        entry["num_nodes"] += 1
        entry["depth"] = max(entry["depth"], len(path))

    return mutate


REJECTIONS = {
    # tree structure, checked with the topk / num_heads bounds
    "missing-ancestor": (_append_path(0, [2, 0]), "trees[0].paths[4]", "ancestor [2]"),
    "negative-rank": (_set(("trees", 0, "paths", 1), [0, -1]), "trees[0].paths[1][1]", "-1"),
    "rank-at-topk": (_append_path(1, [0, 12]), "trees[1].paths[6]", "rank 12 >= top-k 10"),
    "depth-over-heads": (
        _set(("trees", 0, "paths"), [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]),
        "trees[0].paths[4]",
        "4 heads",
    ),
    "duplicate-path": (_append_path(1, [1, 0]), "trees[1].paths[6]", "repeats paths[5]"),
    "empty-path": (_set(("trees", 1, "paths", 0), []), "trees[1].paths[0]", "fewer items"),
    "rank-not-integer": (_set(("trees", 1, "paths", 0), [0.5]), "trees[1].paths[0][0]", "integer"),
    "per-head-topk": (
        _set(("heads", "topk"), [10, 1, 10, 10]),
        "trees[1].paths[4]",
        "rank 1 >= top-k 1",
    ),
    "topk-count": (_set(("heads", "topk"), [10, 10]), "heads.topk", "2 values for 4 heads"),
    # counts that must match the paths
    "num-nodes": (_set(("trees", 1, "num_nodes"), 7), "trees[1].num_nodes", "paths give 6"),
    "depth": (_set(("trees", 0, "depth"), 2), "trees[0].depth", "paths give 3"),
    "accept-over-depth": (
        _set(("trees", 2, "expected_accept_length"), 1.5),
        "trees[2].expected_accept_length",
        "depth + 1",
    ),
    # thresholds
    "thresholds-count": (_set(("thresholds",), [0.5]), "thresholds", "1 values for 3 trees"),
    "thresholds-descend": (_set(("thresholds",), [2.0, 1.0]), "thresholds[1]", "ascend"),
    # the signal the thresholds apply to
    "unknown-signal": (_set(("entropy", "signal"), "logit_gap"), "entropy.signal", "unknown"),
    "smoothed-draft-signal": (_set(("entropy", "signal"), "draft_entropy"), "entropy.signal",
                              "use the 'last' estimator"),
    # header and required fields
    "wrong-format": (_set(("format",), "medusa-tree"), "format", "not an entmtp bundle"),
    "missing-format": (_delete(("format",)), "format: missing", "not an entmtp bundle"),
    "newer-version": (_set(("format_version",), 3), "format_version 3", "upgrade entmtp"),
    "version-2-without-ranges": (_set(("format_version",), 2), "(top level)",
                                 "'batch_ranges' is a required"),
    "version-zero": (_set(("format_version",), 0), "format_version", "expected 1"),
    "version-string": (_set(("format_version",), "1"), "format_version", "integer"),
    "missing-field": (_delete(("predicted",)), "(top level)", "'predicted' is a required"),
    "unknown-field": (_set(("extra",), 1), "(top level)", "'extra' was unexpected"),
    "head-type": (_set(("heads", "type"), "eagle"), "heads.type", "eagle"),
    "sha256": (_set(("heads", "sha256"), "xyz"), "heads.sha256", "pattern"),
    "vocab-size": (_set(("model", "vocab_size"), 0), "model.vocab_size", "minimum"),
    "unit": (_set(("entropy", "unit"), "bans"), "entropy.unit", "bans"),
    "hardware-type": (_set(("hardware",), []), "hardware", "object"),
    # estimator parameters
    "ema-alpha-zero": (
        _set(("entropy", "estimator"), {"kind": "ema", "alpha": 0}),
        "entropy.estimator.alpha",
        "must be above 0",
    ),
    "ema-alpha-big": (
        _set(("entropy", "estimator"), {"kind": "ema", "alpha": 1.5}),
        "entropy.estimator.alpha",
        "maximum",
    ),
    "window-size": (
        _set(("entropy", "estimator"), {"kind": "window", "size": 0}),
        "entropy.estimator.size",
        "minimum",
    ),
    "window-wrong-param": (
        _set(("entropy", "estimator"), {"kind": "window", "alpha": 0.5}),
        "entropy.estimator",
        "size",
    ),
    "last-with-param": (
        _set(("entropy", "estimator"), {"kind": "last", "alpha": 0.5}),
        "entropy.estimator",
        "alpha",
    ),
    "estimator-kind": (
        _set(("entropy", "estimator"), {"kind": "median"}),
        "entropy.estimator.kind",
        "median",
    ),
    # optional fields
    "best-static-index": (_set(("best_static", "tree_index"), 3), "best_static.tree_index", "0..2"),
    "best-static-both": (
        _set(("best_static", "paths"), [[0]]),
        "best_static",
        "exactly one of tree_index and paths",
    ),
    "best-static-paths": (
        lambda obj: obj.__setitem__("best_static", {"paths": [[0, 0]], "tokens_per_second": 1.0}),
        "best_static.paths[0]",
        "ancestor [0]",
    ),
    "latency-nodes": (
        _set(("latency",), {"nodes": [3, 7], "verify_ms": [1.0, 2.0], "autoregressive_ms": 1.0}),
        "latency",
        "start at 0",
    ),
    "latency-lengths": (_set(("latency", "verify_ms"), [1.0]), "latency", "verify_ms"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejection_names_the_field(tmp_path, case):
    mutate, field, detail = REJECTIONS[case]
    obj = bundle_to_json(sample_bundle())
    mutate(obj)
    path = write_json(tmp_path / "x.json", obj)
    with pytest.raises(EntmtpError) as info:
        load_bundle(path)
    message = str(info.value)
    assert message.startswith(f"bundle {path}: "), message
    assert field in message and detail in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "literal, field",
    [
        ("NaN", "thresholds[0]: NaN"),
        ("Infinity", "thresholds[0]: Infinity"),
        ("-Infinity", "thresholds[0]: -Infinity"),
        ("1e999", "thresholds[0]: inf"),
    ],
)
def test_non_finite_numbers_are_rejected_with_their_field(tmp_path, literal, field):
    text = json.dumps(bundle_to_json(sample_bundle()))
    text = text.replace('"thresholds": [0.75', f'"thresholds": [{literal}', 1)
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(EntmtpError, match="finite") as info:
        load_bundle(path)
    assert field in str(info.value)


def test_non_finite_deep_inside_hardware_is_rejected(tmp_path):
    obj = bundle_to_json(sample_bundle())
    obj["hardware"] = {"gpus": [{"clock": "X"}]}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(obj).replace('"X"', "NaN"))
    with pytest.raises(EntmtpError, match=r"hardware\.gpus\[0\]\.clock: NaN"):
        load_bundle(path)


def test_malformed_json_reports_line_and_column(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{\n  "format": "entmtp-bundle",\n  "format_version": 1,,\n}')
    with pytest.raises(EntmtpError, match=r"not valid JSON: .* at line 3 column 23"):
        load_bundle(path)


def test_truncated_json_reports_where_it_stops(tmp_path):
    text = json.dumps(bundle_to_json(sample_bundle()), indent=2)
    path = tmp_path / "x.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(EntmtpError, match=r"not valid JSON: .* at line \d+ column \d+"):
        load_bundle(path)


@pytest.mark.parametrize(
    "content, detail",
    [
        (b"", "empty"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "top level is a list"),
        (b'"entmtp-bundle"', "top level is a str"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"format": "entmtp-bundle", "format_version": ' + b"9" * 5000 + b"}", "not a valid"),
    ],
    ids=["empty", "binary", "list", "string", "deep", "huge-int"],
)
def test_unreadable_content_is_one_line_error(tmp_path, content, detail):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(EntmtpError, match=detail) as info:
        load_bundle(path)
    assert "\n" not in str(info.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(EntmtpError, match="does not exist"):
        load_bundle(tmp_path / "nope.json")
    with pytest.raises(EntmtpError, match="is a folder"):
        load_bundle(tmp_path)


def test_parse_bundle_accepts_text_and_bytes():
    text = json.dumps(bundle_to_json(sample_bundle()))
    assert parse_bundle(text) == parse_bundle(text.encode()) == sample_bundle()


def _message(call) -> str:
    with pytest.raises(EntmtpError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("thresholds", [[0.5], [2.0, 1.0], [0.5, 1.0, 2.0], [1.0, 1.5, 0.5]])
def test_schedules_bundles_and_files_share_one_threshold_message(tmp_path, thresholds):
    """One check: only the context before the message differs."""
    trees = sample_bundle().trees
    obj = bundle_to_json(sample_bundle(best_static=None))
    obj["thresholds"] = thresholds
    path = write_json(tmp_path / "x.json", obj)
    from_file = _message(lambda: load_bundle(path))
    in_memory = _message(lambda: sample_bundle(thresholds=thresholds))
    schedule = _message(lambda: Schedule(tuple(trees), tuple(thresholds)))
    assert from_file.startswith(f"bundle {path}: thresholds")
    tail = from_file.removeprefix(f"bundle {path}: ")
    assert in_memory == f"bundle: {tail}" and schedule == f"schedule {tail}"


@pytest.mark.parametrize(
    "paths",
    [[[0], [2, 0]], [[0], [0, 12]], [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]],
     [[0], [1], [1]]],
    ids=["missing-ancestor", "rank-at-topk", "depth-over-heads", "duplicate"],
)
def test_trees_and_files_share_one_path_message(tmp_path, paths):
    obj = bundle_to_json(sample_bundle())
    obj["trees"][0].update(paths=paths, num_nodes=len(paths), depth=max(map(len, paths)))
    path = write_json(tmp_path / "x.json", obj)
    from_file = _message(lambda: load_bundle(path))
    tree = _message(lambda: Tree.from_paths(paths, topk=10, num_heads=4))
    assert from_file.startswith(f"bundle {path}: trees[0].paths[")
    assert from_file.removeprefix(f"bundle {path}: trees[0].") == tree.removeprefix("tree ")


# -- in-memory construction and saving --------------------------------------------------------
def test_bundle_rejects_inconsistent_counts():
    with pytest.raises(EntmtpError, match="thresholds"):
        sample_bundle(thresholds=[1.0])
    with pytest.raises(EntmtpError, match="tree_stats"):
        sample_bundle(tree_stats=[TreeStats(1.0, 1.0)])
    with pytest.raises(EntmtpError, match="ascend"):
        sample_bundle(thresholds=[2.0, 1.0])
    with pytest.raises(EntmtpError, match="at least one tree"):
        sample_bundle(trees=[], tree_stats=[], thresholds=[], best_static=None)


def test_save_refuses_an_invalid_bundle_and_keeps_the_old_file(tmp_path):
    path = save_bundle(sample_bundle(), tmp_path / "b.json")
    before = path.read_bytes()
    wide = Tree.from_paths([[0], [11]])  # rank 11 with top-k 10
    bad = sample_bundle(trees=[wide, *sample_bundle().trees[1:]], best_static=None)
    with pytest.raises(EntmtpError, match=r"trees\[0\]\.paths\[1\]: rank 11 >= top-k 10"):
        save_bundle(bad, path)
    nan = sample_bundle(predicted=Predicted(float("nan"), 1.0, 1.0, 1.0))
    with pytest.raises(EntmtpError, match=r"predicted\.mean_accept_length: nan"):
        save_bundle(nan, path)
    unserializable = sample_bundle(hardware={"when": object()})
    with pytest.raises(EntmtpError, match="cannot be written as JSON"):
        save_bundle(unserializable, path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_save_onto_a_folder_fails_cleanly(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(EntmtpError, match="cannot write"):
        save_bundle(sample_bundle(), tmp_path / "taken")
    assert leftovers(tmp_path) == []


def test_save_into_unwritable_folder_leaves_nothing(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes here")
        with pytest.raises(EntmtpError, match="cannot write"):
            save_bundle(sample_bundle(), folder / "b.json")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_saved_text_is_canonical_and_stable(tmp_path):
    a = save_bundle(sample_bundle(), tmp_path / "a.json")
    b = save_bundle(load_bundle(a), tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()
    obj = json.loads(a.read_text())
    paths = obj["trees"][1]["paths"]
    assert paths == sorted(paths, key=lambda p: (len(p), p))
    assert copy.deepcopy(obj) == bundle_to_json(load_bundle(a))
