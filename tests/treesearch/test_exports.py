"""Exports: outputs parse back to the same paths; vLLM's level-regular rule against a simulation
of how vLLM drafts; the largest regular subtree against brute force."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path

import pytest
import yaml

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
    load_bundle,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._exports import (
    EXPORT_FORMATS,
    default_tree,
    export,
    is_level_regular,
    largest_regular_subtree,
    level_regular_violation,
    regular_tree,
    to_medusa_choices,
    to_trtllm_choices,
    to_vllm_tree,
    vllm_config,
    write_medusa_choices,
    write_tree,
)
from entmtp.treesearch._tree import Tree

REPO = Path(__file__).resolve().parents[2]
MC_SIM_7B_63 = Tree.from_paths(
    json.loads((REPO / "trees" / "mc_sim_7b_63.json").read_text())["paths"]
)


def make_bundle(trees: list[Tree], *, best_static: BestStatic | None = None) -> Bundle:
    return Bundle(
        model=ModelInfo("tiny", 128, 32),
        heads=HeadsInfo("medusa", 4, 10, "ab" * 32),
        task="chat",
        entropy=EntropyInfo("base_entropy", "nats", EntropyEstimator.ema(0.5)),
        thresholds=[float(i) for i in range(1, len(trees))],
        trees=trees,
        tree_stats=[TreeStats(1.0 + 0.5 * min(t.depth, 1), 20.0) for t in trees],
        predicted=Predicted(1.5, 50.0, 1.2, 60.0),
        hardware={},
        created_by=CreatedBy("0.1.0", "test"),
        best_static=best_static,
    )


def paths_of(tree: Tree) -> list[list[int]]:
    return [list(p) for p in tree.paths]


def read_medusa_python(path: Path) -> tuple[str, list[list[int]]]:
    module = ast.parse(path.read_text())
    (assign,) = [node for node in module.body if isinstance(node, ast.Assign)]
    return assign.targets[0].id, ast.literal_eval(assign.value)


# -- every format parses back to the same tree ------------------------------------------------
SMALL = Tree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


@pytest.mark.parametrize("tree", [SMALL, MC_SIM_7B_63], ids=["small", "mc_sim_7b_63"])
def test_medusa_exports_parse_back(tmp_path, tree):
    assert to_medusa_choices(tree) == paths_of(tree)
    name, choices = read_medusa_python(write_medusa_choices(tree, tmp_path / "choices.py"))
    assert name == "mc_entmtp" and Tree.from_paths(choices) == tree
    assert json.loads(write_medusa_choices(tree, tmp_path / "c.json").read_text()) == paths_of(tree)
    # Medusa sorts choices by (length, path) itself; the export is already in that order.
    assert choices == sorted(choices, key=lambda p: (len(p), p))


def test_medusa_refuses_ranks_beyond_its_hardcoded_topk():
    wide = Tree.from_paths([[0], [10]])
    with pytest.raises(EntmtpError, match="TOPK"):
        to_medusa_choices(wide)
    assert to_medusa_choices(wide, topk=11) == [[0], [10]]


@pytest.mark.parametrize("tree", [SMALL, MC_SIM_7B_63], ids=["small", "mc_sim_7b_63"])
def test_trtllm_yaml_parses_back(tmp_path, tree):
    out = write_tree(tree, "trtllm", tmp_path / "choices.yaml")
    loaded = yaml.safe_load(out.read_text())
    assert loaded == to_trtllm_choices(tree) == paths_of(tree)


def test_vllm_string_parses_back_sorted_breadth_first(tmp_path):
    tree = regular_tree([2, 3, 1])
    spec = to_vllm_tree(tree)
    parsed = ast.literal_eval(spec)
    assert all(isinstance(p, tuple) for p in parsed)
    assert parsed == sorted(parsed, key=lambda t: (len(t), t))  # vLLM's own sort key
    assert Tree.from_paths(parsed) == tree
    config = json.loads(write_tree(tree, "vllm", tmp_path / "spec.json").read_text())
    assert config == vllm_config(tree)
    assert config["num_speculative_tokens"] == len(parsed) == tree.num_nodes == 2 + 6 + 6


# -- vLLM's level-regular rule ----------------------------------------------------------------
def vllm_drafted_tree(tree: Tree) -> set[tuple[int, ...]]:
    """The tree vLLM 0.20.2 actually drafts for ``speculative_token_tree = tree``
    (vllm/v1/spec_decode/llm_base_proposer.py, ``__init__`` and ``propose_tree``): child counts
    per level by integer division, then every node of a level gets the top-c."""
    widths = tree.widths
    if not widths:
        return set()
    children = [widths[0]] + [widths[i] // widths[i - 1] for i in range(1, len(widths))]
    level, drafted = [()], set()
    for c in children:
        level = [parent + (r,) for parent in level for r in range(c)]
        drafted.update(level)
    return drafted


def all_trees(max_rank: int, max_depth: int) -> list[Tree]:
    """Every prefix-closed tree with ranks < max_rank and depth <= max_depth."""

    def subtrees(prefix: tuple[int, ...]) -> list[frozenset]:
        if len(prefix) == max_depth:
            return [frozenset()]
        options_per_child = []
        for r in range(max_rank):
            child = prefix + (r,)
            options_per_child.append(
                [frozenset()] + [frozenset({child}) | sub for sub in subtrees(child)]
            )
        return [frozenset().union(*combo) for combo in itertools.product(*options_per_child)]

    return [Tree.from_paths(sorted(s)) for s in subtrees(())]


ALL_SMALL_TREES = all_trees(3, 2) + [t for t in all_trees(2, 3) if t.depth == 3]


def count_trees(max_rank: int, max_depth: int) -> int:
    """g(0) = 1, g(d) = (1 + g(d-1)) ** max_rank: each child is absent or roots a subtree."""
    return 1 if max_depth == 0 else (1 + count_trees(max_rank, max_depth - 1)) ** max_rank


def test_enumeration_is_complete():
    assert len(all_trees(3, 2)) == count_trees(3, 2) == 729
    assert len(all_trees(2, 3)) == count_trees(2, 3) == 676
    assert len({t.paths for t in ALL_SMALL_TREES}) == len(ALL_SMALL_TREES)


def test_level_regular_matches_what_vllm_drafts():
    regular = 0
    for tree in ALL_SMALL_TREES:
        if tree.num_nodes == 0:
            continue
        runs_as_is = vllm_drafted_tree(tree) == set(tree.paths)
        assert is_level_regular(tree) == runs_as_is, tree.paths
        assert (level_regular_violation(tree) is None) == runs_as_is
        regular += runs_as_is
    assert regular > 10


def test_largest_regular_subtree_is_maximal_by_brute_force():
    candidates = [t for t in ALL_SMALL_TREES if is_level_regular(t)]
    for tree in ALL_SMALL_TREES:
        members = set(tree.paths)
        sub = largest_regular_subtree(tree)
        assert set(sub.paths) <= members
        assert Tree.from_paths(sub.paths) == sub  # prefix-closed without implied prefixes
        assert is_level_regular(sub) and vllm_drafted_tree(sub) == set(sub.paths)
        best = max(c.num_nodes for c in candidates if set(c.paths) <= members)
        assert sub.num_nodes == best, (tree.paths, sub.paths)


def test_mc_sim_7b_63_is_not_level_regular_and_the_error_says_why(tmp_path):
    assert not is_level_regular(MC_SIM_7B_63)
    with pytest.raises(EntmtpError, match="not level-regular.*--largest-regular-subtree") as info:
        to_vllm_tree(MC_SIM_7B_63)
    assert "\n" not in str(info.value)
    out = write_tree(MC_SIM_7B_63, "vllm", tmp_path / "v.json", largest_regular_subtree=True)
    parsed = ast.literal_eval(json.loads(out.read_text())["speculative_token_tree"])
    sub = Tree.from_paths(parsed)
    assert set(sub.paths) <= set(MC_SIM_7B_63.paths) and is_level_regular(sub)
    assert sub == largest_regular_subtree(MC_SIM_7B_63)


def test_tree_without_a_regular_part_is_a_clear_error():
    with pytest.raises(EntmtpError, match=r"no level-regular subtree.*\[0\]"):
        to_vllm_tree(Tree.from_paths([[1]]), largest_regular_subtree=True)


# -- which tree, and the dispatcher -----------------------------------------------------------
def test_default_tree_prefers_best_static_then_the_largest():
    small, big, other = SMALL, MC_SIM_7B_63, regular_tree([3, 2])
    assert default_tree(make_bundle([small, big, other]))[0] == big
    tied = make_bundle([regular_tree([2]), Tree.from_paths([[0], [0, 0]])])
    assert default_tree(tied)[0] == tied.trees[0]
    by_index = make_bundle([small, big], best_static=BestStatic(small, 10.0, 0))
    assert default_tree(by_index)[0] == small
    by_paths = make_bundle([small, big], best_static=BestStatic(other, 10.0))
    assert default_tree(by_paths)[0] == other


def test_default_tree_skips_a_best_static_tree_without_nodes():
    # Plain decoding won on the bundle's hardware: a static-tree runtime gets the largest tree.
    empty = Tree.from_paths([])
    bundle = make_bundle([empty, SMALL, MC_SIM_7B_63], best_static=BestStatic(empty, 10.0, 0))
    tree, what = default_tree(bundle)
    assert tree == MC_SIM_7B_63
    assert "tree 2" in what and "no nodes" in what


def test_mc_sim_7b_63_bundle_exports_to_every_format(tmp_path):
    bundle = make_bundle([SMALL, MC_SIM_7B_63])
    assert load_bundle(export(bundle, "entmtp", tmp_path / "b.json")) == bundle
    _, choices = read_medusa_python(export(bundle, "medusa", tmp_path / "mc.py"))
    assert Tree.from_paths(choices) == MC_SIM_7B_63
    assert yaml.safe_load(export(bundle, "trtllm", tmp_path / "t.yaml").read_text()) == paths_of(
        MC_SIM_7B_63
    )
    with pytest.raises(EntmtpError, match="not level-regular"):
        export(bundle, "vllm", tmp_path / "v.json")
    config = json.loads(
        export(bundle, "vllm", tmp_path / "v.json", largest_regular_subtree=True).read_text()
    )
    assert config["num_speculative_tokens"] == largest_regular_subtree(MC_SIM_7B_63).num_nodes
    small = json.loads(export(bundle, "medusa", tmp_path / "s.json", tree_index=0).read_text())
    assert small == paths_of(SMALL)
    # JSON targets carry their header in a sidecar; the .py and .yaml ones in comments.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b.json", "mc.py", "s.json", "s.json.entmtp.json", "t.yaml", "v.json",
        "v.json.entmtp.json"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fmt": "onnx"}, "entmtp, medusa, trtllm, vllm, vllm-chain"),
        ({"fmt": "vllm-chain"}, "--profile PROFILE.npz"),
        ({"fmt": "vllm-chain", "tree_index": 0}, "drop --tree"),
        ({"fmt": "vllm", "refit": True}, "medusa and trtllm formats only"),
        ({"fmt": "entmtp", "refit": True}, "whole bundle"),
        ({"fmt": "medusa", "tree_index": 5}, "out of range"),
        ({"fmt": "medusa", "tree_index": -1}, "out of range"),
        ({"fmt": "entmtp", "tree_index": 0}, "whole bundle"),
        ({"fmt": "trtllm", "largest_regular_subtree": True}, "vllm format only"),
        ({"fmt": "trtllm", "tree_index": 1}, "no nodes"),
    ],
)
def test_export_errors_are_one_line(tmp_path, kwargs, message):
    bundle = make_bundle([SMALL, Tree.from_paths([])])
    fmt = kwargs.pop("fmt")
    with pytest.raises(EntmtpError, match=message) as info:
        export(bundle, fmt, tmp_path / "out", **kwargs)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    assert set(EXPORT_FORMATS) == {"entmtp", "medusa", "trtllm", "vllm", "vllm-chain"}


def test_export_onto_a_folder_fails_cleanly(tmp_path):
    (tmp_path / "taken").mkdir()
    from entmtp.treesearch import LatencyModel, synthetic_profile

    chain_inputs = {"profile": synthetic_profile(num_traces=2, positions=64, seed=1),
                    "latency": LatencyModel.gpu_like()}
    for fmt in EXPORT_FORMATS:
        with pytest.raises(EntmtpError, match="cannot write"):
            export(make_bundle([regular_tree([2, 1])]), fmt, tmp_path / "taken",
                   **(chain_inputs if fmt == "vllm-chain" else {}))
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
