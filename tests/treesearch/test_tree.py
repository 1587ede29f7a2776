"""Tree validation, canonical order, JSON, and runtime buffers against a plain reference."""

from __future__ import annotations

import json
import re
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entmtp.core import EntmtpError
from entmtp.treesearch._tree import Tree, check_paths


@st.composite
def path_sets(draw, max_heads: int = 4, max_topk: int = 4, max_nodes: int = 15):
    """(paths of a random prefix-closed tree, in random order, its heads and per-head top-k)."""
    heads = draw(st.integers(1, max_heads))
    topk = [draw(st.integers(1, max_topk)) for _ in range(heads)]
    size = draw(st.integers(0, max_nodes))
    chosen: list[tuple[int, ...]] = []
    for _ in range(size):
        frontier = [
            (*p, r)
            for p in [(), *chosen]
            if len(p) < heads
            for r in range(topk[len(p)])
            if (*p, r) not in chosen
        ]
        if not frontier:
            break
        chosen.append(draw(st.sampled_from(frontier)))
    return draw(st.permutations(chosen)), heads, topk


# -- validation ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("paths", "kwargs"),
    [
        ([[0, 1]], {}),  # missing ancestor
        ([[0], [0, 0, 1]], {}),  # missing ancestor two levels up
        ([[0], [-1]], {}),  # negative rank
        ([[0], [0, -2]], {"implied_prefixes": True}),
        ([[0], [3]], {"topk": 3}),  # rank >= topk
        ([[0], [0, 2]], {"topk": [3, 2]}),  # rank >= that head's topk
        ([[0], [0, 0]], {"topk": [3]}),  # fewer top-k values than depth
        ([[0], [0, 0], [0, 0, 0]], {"num_heads": 2}),  # deeper than the heads
        ([[0], [1], [0]], {}),  # duplicate
        ([[0], []], {}),  # empty path
        ([[0], [1.0]], {}),  # non-integer rank
        ([[0], [True]], {}),
        ([[0], "01"], {}),
        ("[[0]]", {}),
        ([[0]], {"topk": 0}),
    ],
)
def test_invalid_trees_are_rejected(paths, kwargs) -> None:
    with pytest.raises(EntmtpError):
        Tree.from_paths(paths, **kwargs)


@settings(max_examples=300, deadline=None)
@given(
    paths=st.lists(st.lists(st.integers(-1, 3), max_size=4), max_size=8),
    topk=st.one_of(st.none(), st.integers(1, 4), st.lists(st.integers(1, 4), max_size=4)),
    num_heads=st.one_of(st.none(), st.integers(0, 4)),
    prefix_closed=st.booleans(),
)
def test_check_paths_names_the_first_path_a_plain_reading_refuses(
    paths, topk, num_heads, prefix_closed
) -> None:
    listed = [tuple(p) for p in paths]

    def drafts(path: tuple[int, ...]) -> bool:  # the heads can draft it, read plainly
        if not path or min(path) < 0 or (num_heads is not None and len(path) > num_heads):
            return False
        ks = [topk] * len(path) if isinstance(topk, int) else topk
        return ks is None or (len(ks) >= len(path) and all(r < ks[d] for d, r in enumerate(path)))

    own = [j for j, p in enumerate(listed) if not drafts(p) or p in listed[:j]]
    orphans = [j for j, p in enumerate(listed)
               if prefix_closed and any(p[:d] not in listed for d in range(1, len(p)))]
    try:
        checked = check_paths(paths, topk=topk, num_heads=num_heads, prefix_closed=prefix_closed,
                              where="file x: trees[2].paths")
    except EntmtpError as err:
        named = re.match(r"file x: trees\[2\]\.paths\[(\d+)\]: ", str(err))
        assert named and "\n" not in str(err), str(err)
        assert int(named.group(1)) == (own or orphans)[0]
    else:
        assert not own and not orphans and checked == listed


def test_implied_prefixes_adds_missing_ancestors() -> None:
    tree = Tree.from_paths([[0, 1, 2], [2]], implied_prefixes=True)
    assert tree.paths == ((0,), (2,), (0, 1), (0, 1, 2))
    assert Tree.from_paths([[0, 1]], implied_prefixes=True, topk=2, num_heads=2).num_nodes == 2


@settings(max_examples=80, deadline=None)
@given(sample=path_sets())
def test_canonical_order_shape_and_lookup(sample) -> None:
    paths, heads, topk = sample
    tree = Tree.from_paths(paths, topk=topk, num_heads=heads)
    assert tree.paths == tuple(sorted(map(tuple, paths), key=lambda p: (len(p), p)))
    assert tree == Tree.from_paths(list(reversed(paths)))
    assert hash(tree) == hash(Tree.from_paths(list(reversed(paths))))
    assert len(tree) == tree.num_nodes == len(paths)
    assert tree.depth == max((len(p) for p in paths), default=0)
    assert list(tree.widths) == [sum(len(p) == d for p in paths) for d in range(1, tree.depth + 1)]
    assert tree.min_topk == max((max(p) + 1 for p in paths), default=0)
    if paths:
        tree.check_fits(topk=tree.min_topk)
    if tree.min_topk > 1:
        with pytest.raises(EntmtpError):
            tree.check_fits(topk=tree.min_topk - 1)
    for i, path in enumerate(tree.paths, start=1):
        assert tree.index(path) == i and list(path) in tree
    assert (99,) not in tree


@settings(max_examples=60, deadline=None)
@given(sample=path_sets())
def test_json_round_trip(sample) -> None:
    paths, _, _ = sample
    tree = Tree.from_paths(paths)
    assert Tree.from_json(tree.to_json()) == tree
    assert Tree.from_json(json.dumps(tree.to_json())) == tree
    assert Tree.from_json({"paths": tree.to_json()}) == tree
    assert Tree.from_json({"medusa_choices": tree.to_json()}) == tree


def test_malformed_json_is_rejected() -> None:
    with pytest.raises(EntmtpError):
        Tree.from_json("[[0], [0, 1")
    with pytest.raises(EntmtpError):
        Tree.from_json({"nodes": [[0]]})


# -- buffers -------------------------------------------------------------------------------
def reference_buffers(tree: Tree, topk: list[int]):
    nodes = [(), *tree.paths]
    n = len(nodes)
    mask = np.array(
        [[nodes[i][: len(nodes[j])] == nodes[j] for j in range(n)] for i in range(n)]
    )
    position_ids = [len(p) for p in nodes]
    tree_indices = [0] + [1 + sum(topk[: len(p) - 1]) + p[-1] for p in tree.paths]
    leaves = [p for p in nodes if not any(q[:-1] == p for q in tree.paths)]
    width = tree.depth + 1
    retrieve = {
        tuple(nodes.index(p[:d]) for d in range(len(p) + 1)) + (-1,) * (width - len(p) - 1)
        for p in leaves
    }
    return mask, position_ids, tree_indices, retrieve, len(leaves)


@settings(max_examples=80, deadline=None)
@given(sample=path_sets(), extra=st.integers(0, 3))
def test_buffers_match_reference(sample, extra: int) -> None:
    paths, heads, topk = sample
    tree = Tree.from_paths(paths)
    ks = [k + extra for k in topk]
    buffers = tree.buffers(ks)
    mask, position_ids, tree_indices, retrieve, leaves = reference_buffers(tree, ks)
    np.testing.assert_array_equal(buffers.attention_mask, mask)
    assert buffers.position_ids.tolist() == position_ids
    assert buffers.depths.tolist() == position_ids
    assert buffers.tree_indices.tolist() == tree_indices
    assert buffers.retrieve_indices.shape == (leaves, tree.depth + 1)
    assert {tuple(row) for row in buffers.retrieve_indices.tolist()} == retrieve
    for i, path in enumerate(tree.paths, start=1):
        parent = tree.index(path[:-1]) if len(path) > 1 else 0
        assert buffers.parents[i] == parent and buffers.ranks[i] == path[-1]
    assert buffers.parents[0] == -1 and buffers.ranks[0] == -1
    if len(set(ks)) == 1 and len(ks) >= tree.depth:
        np.testing.assert_array_equal(tree.buffers(ks[0]).tree_indices, buffers.tree_indices)


def test_buffers_reject_a_topk_the_tree_does_not_fit() -> None:
    tree = Tree.from_paths([[0], [4]])
    with pytest.raises(EntmtpError):
        tree.buffers(4)
    with pytest.raises(EntmtpError):
        Tree.from_paths([[0], [0, 0]]).buffers([5])


# -- shipped reference tree ----------------------------------------------------------------
def test_shipped_medusa_default_tree_loads() -> None:
    text = resources.files("entmtp.trees").joinpath("mc_sim_7b_63.json").read_text()
    data = json.loads(text)
    tree = Tree.from_json(data, topk=data["topk"], num_heads=data["num_heads"])
    assert tree.num_nodes == 63 == data["num_nodes"]
    assert tree.depth == 4 and data["num_heads"] == 4
    assert data["topk"] == 10
    assert max(max(p) for p in tree.paths) < 10
    buffers = tree.buffers(10)
    assert buffers.attention_mask.shape == (64, 64)
    assert buffers.retrieve_indices.shape[1] == 5
