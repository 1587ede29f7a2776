"""Property-based fuzzing of the loaders: any input either loads something valid or raises
EntmtpError, never another exception type."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    bundle_to_json,
    parse_bundle,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._latency import LatencyModel
from entmtp.treesearch._tree import Tree

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def valid_bundle() -> Bundle:
    trees = [Tree.from_paths([[0], [0, 0], [1]]), Tree.from_paths([[0], [1], [2], [0, 0]])]
    return Bundle(
        model=ModelInfo("m", 64, 16),
        heads=HeadsInfo("hydra", 3, (4, 3, 2), "cd" * 32),
        task="math",
        entropy=EntropyInfo("base_entropy", "nats", EntropyEstimator.window(3)),
        thresholds=[1.25],
        trees=trees,
        tree_stats=[TreeStats(1.8, 20.0), TreeStats(1.6, 21.0)],
        predicted=Predicted(1.7, 40.0, 1.1, 45.0),
        hardware={"device": "cpu"},
        created_by=CreatedBy("0.1.0", "fuzz"),
        best_static=BestStatic(trees[0], 39.0, 0),
        latency=LatencyModel.cpu_like(),
    )


VALID = bundle_to_json(valid_bundle())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=12,
)


def check_loaded_or_entmtp_error(load) -> Bundle | None:
    try:
        bundle = load()
    except EntmtpError as err:
        assert "\n" not in str(err)
        return None
    assert isinstance(bundle, Bundle)
    # Whatever loads is self-consistent and survives a round trip.
    assert len(bundle.thresholds) == len(bundle.trees) - 1
    assert bundle_from_json(json.loads(json.dumps(bundle_to_json(bundle)))) == bundle
    return bundle


# -- Tree.from_paths --------------------------------------------------------------------------
rank = st.one_of(st.integers(min_value=-2, max_value=5), st.sampled_from([None, 1.5, "0", True]))
raw_paths = st.one_of(
    st.lists(st.lists(st.integers(min_value=-1, max_value=4), max_size=4), max_size=12),
    st.lists(st.one_of(st.lists(rank, max_size=3), scalars), max_size=6),
    scalars,
)


@FUZZ
@given(
    paths=raw_paths,
    implied=st.booleans(),
    topk=st.one_of(st.none(), st.integers(min_value=-1, max_value=6)),
    num_heads=st.one_of(st.none(), st.integers(min_value=-2, max_value=5)),
)
def test_tree_from_random_paths(paths, implied, topk, num_heads):
    try:
        tree = Tree.from_paths(paths, implied_prefixes=implied, topk=topk, num_heads=num_heads)
    except EntmtpError:
        return
    listed = {tuple(p) for p in tree.paths}
    assert len(listed) == tree.num_nodes  # no duplicates
    assert all(p[:-1] in listed for p in listed if len(p) > 1)  # prefix-closed
    assert list(tree.paths) == sorted(listed, key=lambda p: (len(p), p))
    assert all(r >= 0 for p in listed for r in p)
    if topk is not None:
        assert all(r < topk for p in listed for r in p)
    if num_heads is not None:
        assert tree.depth <= num_heads
    if not implied:
        assert listed == {tuple(p) for p in paths}


# -- bundles ----------------------------------------------------------------------------------
@FUZZ
@given(obj=json_values)
def test_random_json_into_bundle_loader(obj):
    check_loaded_or_entmtp_error(lambda: bundle_from_json(obj))
    try:
        text = json.dumps(obj)  # NaN/Infinity come out as literals the parser must refuse
    except ValueError:
        return
    check_loaded_or_entmtp_error(lambda: parse_bundle(text))


def _locations(obj, where=()):
    yield where
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _locations(value, (*where, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _locations(value, (*where, i))


LOCATIONS = list(_locations(VALID))[1:]


@st.composite
def mutated_bundles(draw):
    obj = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(st.sampled_from(LOCATIONS))
        parent = obj
        try:
            for key in where[:-1]:
                parent = parent[key]
            current = parent[where[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this location
        action = draw(st.sampled_from(["replace", "delete", "nudge", "add-key"]))
        if action == "replace":
            parent[where[-1]] = draw(json_values)
        elif action == "delete":
            del parent[where[-1]]
        elif action == "nudge" and isinstance(current, (int, float)) and not isinstance(
            current, bool
        ):
            parent[where[-1]] = current + draw(st.sampled_from([-2, -1, 1, 0.5, 10]))
        elif action == "add-key" and isinstance(current, dict):
            current[draw(st.text(max_size=6))] = draw(json_values)
    return obj


@FUZZ
@given(obj=mutated_bundles())
def test_mutated_bundle_loads_or_raises_entmtp_error(obj):
    check_loaded_or_entmtp_error(lambda: bundle_from_json(obj))


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(json.dumps(VALID)) - 1))
def test_truncated_bundle_text_raises_entmtp_error(cut):
    with pytest.raises(EntmtpError):
        parse_bundle(json.dumps(VALID)[:cut])


@FUZZ
@given(data=st.binary(max_size=64))
def test_random_bytes_raise_entmtp_error(data):
    with pytest.raises(EntmtpError):
        parse_bundle(data)


@FUZZ
@given(text=st.text(alphabet='{}[],:"0123456789.eE-+ \ntruefalsnNaIiy', max_size=40))
def test_json_like_noise_raises_entmtp_error(text):
    with pytest.raises(EntmtpError):
        parse_bundle(text)


def test_the_fuzzed_bundle_itself_loads():
    assert bundle_from_json(VALID) == valid_bundle()
