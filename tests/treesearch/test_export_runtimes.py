"""Exports against each runtime's own rules, modelled from its source in tests/export_runtimes.py:
the rules themselves, a table of edge-case trees through `entmtp export`, and every shipped
bundle. An export is either read back by the runtime's rules as the same tree, or refused by
entmtp with one line, exit code 2 and no file written."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path

import pytest
import yaml
from export_runtimes import (
    RuntimeRefusal,
    medusa_reads,
    trtllm_cpp_reads,
    trtllm_prefix,
    trtllm_python_tokens,
    vllm_0_20_2_reads,
    vllm_config_file_args,
    vllm_medusa_chain_reads,
)
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.core import EntmtpError
from entmtp.treesearch import load_bundle, save_bundle, synthetic_profile
from entmtp.treesearch._bundle import (
    Bundle,
    CreatedBy,
    EntropyInfo,
    HeadsInfo,
    ModelInfo,
    Predicted,
    TreeStats,
)
from entmtp.treesearch._estimator import EntropyEstimator
from entmtp.treesearch._exports import (
    CHECKED_AGAINST,
    SIDECAR_SUFFIX,
    TRTLLM_MAX_DEPTH,
    export_bundle,
    is_level_regular,
    largest_regular_subtree,
    medusa_problem,
    regular_tree,
    trtllm_max_draft_len,
    trtllm_problem,
    trtllm_python_runtime_gap,
)
from entmtp.treesearch._tree import Tree

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "trees" / "bundles").glob("*.json"))
runner = CliRunner()


def chain(length: int) -> Tree:
    return Tree.from_paths([[0] * d for d in range(1, length + 1)])


def bfs_tree(num_nodes: int, branching: int = 10) -> Tree:
    """The first ``num_nodes`` nodes of a complete ``branching``-ary tree, breadth first."""
    paths: list[list[int]] = []
    level: list[list[int]] = [[]]
    while len(paths) < num_nodes:
        level = [p + [r] for p in level for r in range(branching)]
        paths += level[: num_nodes - len(paths)]
    return Tree.from_paths(paths)


def small_trees(max_rank: int, max_depth: int) -> list[Tree]:
    """Every prefix-closed tree with ranks < max_rank and depth <= max_depth."""

    def subtrees(prefix: tuple[int, ...]) -> list[frozenset]:
        if len(prefix) == max_depth:
            return [frozenset()]
        options = []
        for r in range(max_rank):
            child = prefix + (r,)
            options.append([frozenset()] + [frozenset({child}) | s for s in subtrees(child)])
        return [frozenset().union(*combo) for combo in itertools.product(*options)]

    return [Tree.from_paths(sorted(s)) for s in subtrees(())]


# -- TensorRT-LLM ------------------------------------------------------------------------------
def test_trtllm_packs_each_rank_in_4_bits():
    """NVIDIA/TensorRT-LLM main @ 04a2cacb, cpp/include/tensorrt_llm/runtime/utils/
    speculativeChoicesUtils.h (PREFIX_CHUNK_SIZE_BITS = 4, PREFIX_MAX_VALUE = 16) and
    speculativeChoicesUtils.cpp computePrefix: ranks 0..15 give every node of a level its own
    key, 16 passes the check but lands in the parent's chunk, 17 aborts."""
    keys = {trtllm_prefix([a, b], 2) for a in range(16) for b in range(16)}
    assert len(keys) == 256  # injective below 16
    assert trtllm_prefix([0, 16], 2) == trtllm_prefix([1, 0], 2)
    assert trtllm_prefix([15, 16], 2) == trtllm_prefix([15, 0], 2)  # OR, not add
    with pytest.raises(RuntimeRefusal, match=r"too large node degree \(17\)"):
        trtllm_prefix([0, 17], 2)
    # The collision leaves [1, 0, 0] under whichever of [0, 16] and [1, 0] sorts last.
    collide = [[0], [1], [0, 16], [1, 0], [1, 0, 0]]
    with pytest.raises(RuntimeRefusal, match=r"parent of \[1, 0, 0\] shares its key"):
        trtllm_cpp_reads(collide, 16)
    # entmtp refuses any rank >= 16 and accepts 15.
    assert "rank 16" in trtllm_problem(Tree.from_paths(collide))
    assert trtllm_problem(regular_tree([16])) is None
    assert "rank 16" in trtllm_problem(regular_tree([17]))


def test_trtllm_depth_limit_from_the_32_bit_shift():
    """speculativeChoicesUtils.cpp @ 04a2cacb, computePrefix shifts ``vec[ci]`` (SizeType32) by
    4 * (len - 1 - ci) before widening to uint64: past 8 levels the shift is undefined."""
    deep8 = [15] * 8
    assert trtllm_prefix(deep8, 8) != trtllm_prefix([14] + [15] * 7, 8)
    with pytest.raises(RuntimeRefusal, match="undefined"):
        trtllm_prefix([0] * 9, 9)
    assert TRTLLM_MAX_DEPTH == 8
    assert trtllm_problem(chain(8)) is None
    assert "depth 9" in trtllm_problem(chain(9))


@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 160, 200])
def test_trtllm_max_draft_len_is_the_least_that_fits_the_packed_mask(num_nodes):
    """speculativeDecodingModule.h @ 3585984b: divUp(maxDecodingDraftTokens, 32) mask words per
    row; speculativeChoicesUtils.cpp @ 04a2cacb: numChoices <= maxDecodingDraftTokens and
    setOnePackedMask on columns 0..numChoices (the root is column 0)."""
    tree = bfs_tree(num_nodes)
    choices = tree.to_json()
    need = trtllm_max_draft_len(num_nodes)
    assert trtllm_cpp_reads(choices, need) == set(tree.paths)
    with pytest.raises(RuntimeRefusal):
        trtllm_cpp_reads(choices, need - 1)
    assert need == (num_nodes + 1 if num_nodes % 32 == 0 else num_nodes)


def test_trtllm_128_nodes_need_max_draft_len_129():
    """The AddressSanitizer report of issue 22: 128 nodes overflow at 128 and are clean at 129."""
    assert trtllm_max_draft_len(128) == 129
    with pytest.raises(RuntimeRefusal, match="overflow"):
        trtllm_cpp_reads(bfs_tree(128).to_json(), 128)


def test_trtllm_python_runtime_gap_warning_matches_its_token_count():
    """tensorrt_llm/runtime/medusa_utils.py @ 249d93d5, get_medusa_topks / get_medusa_tree:
    depth 1 drafts ranks 0..max; deeper levels one token per node."""
    for tree in small_trees(3, 2):
        if tree.num_nodes == 0:
            continue
        misread = trtllm_python_tokens(tree.to_json()) != tree.num_nodes
        assert (trtllm_python_runtime_gap(tree) is not None) == misread, tree.paths
    gap = Tree.from_paths([[r] for r in (0, 1, 2, 3, 4, 5, 6, 7, 9)])
    assert trtllm_python_tokens(gap.to_json()) == 10
    assert "10 tokens for these 9 nodes" in trtllm_python_runtime_gap(gap)


# -- Medusa ------------------------------------------------------------------------------------
def test_medusa_reads_ranks_below_its_topk_10_only():
    """FasterDecoding/Medusa main @ e2a5d20, medusa/model/utils.py: TOPK=10 and tree index
    ``rank + TOPK * depth_index + 1``; rank 10 verifies the next head's rank 0."""
    cases = [regular_tree([10]), regular_tree([11]), Tree.from_paths([[0], [0, 10]]),
             Tree.from_paths([[9], [9, 9], [9, 9, 9]]), Tree.from_paths([[0], [12]])]
    for tree in cases + [t for t in small_trees(3, 2) if t.num_nodes]:
        try:
            same = medusa_reads(tree.to_json()) == set(tree.paths)
        except RuntimeRefusal:
            same = False
        assert (medusa_problem(tree) is None) == same, tree.paths


# -- vLLM --------------------------------------------------------------------------------------
def test_vllm_level_regular_rule_matches_its_proposer():
    """vLLM 0.20.2, vllm/v1/spec_decode/llm_base_proposer.py (child_drafts_per_level = nodes at
    level l // nodes at level l-1, topk per node in propose_tree) and config/speculative.py
    (breadth-first sort): the exported tree is drafted as verified iff it is level-regular."""
    for tree in small_trees(3, 2) + [t for t in small_trees(2, 3) if t.depth == 3]:
        if tree.num_nodes == 0:
            continue
        config = {"num_speculative_tokens": tree.num_nodes,
                  "speculative_token_tree": str([tuple(p) for p in tree.paths])}
        try:
            runs = vllm_0_20_2_reads(config) == set(tree.paths)
        except RuntimeRefusal:
            runs = False
        assert is_level_regular(tree) == runs, tree.paths


# -- the edge-case table through the CLI -------------------------------------------------------
def edge_bundle(tree: Tree) -> Bundle:
    return Bundle(
        model=ModelInfo("tiny", 128, 32),
        heads=HeadsInfo("medusa", 9, 20, "ab" * 32),
        task="chat",
        entropy=EntropyInfo("base_entropy", "nats", EntropyEstimator.ema(0.5)),
        thresholds=[],
        trees=[tree],
        tree_stats=[TreeStats(1.0, 20.0)],
        predicted=Predicted(1.0, 50.0, 1.0, 60.0),
        hardware={},
        created_by=CreatedBy("0.1.0", "test"),
    )


NOT_REGULAR = Tree.from_paths([[0], [1], [0, 0]])
GAP = Tree.from_paths([[r] for r in (0, 1, 2, 3, 4, 5, 6, 7, 9)])
COLLIDE = Tree.from_paths([[0], [1], [0, 16], [1, 0], [1, 0, 0]])
EDGE_TREES = {
    "empty": Tree.from_paths([]),
    "single": chain(1),
    "depth-5": chain(5),
    "rank-10": regular_tree([11]),
    "rank-15": regular_tree([16]),
    "rank-16": regular_tree([17]),
    "rank-17": regular_tree([18]),
    "rank-16-collision": COLLIDE,
    "128-nodes": regular_tree([2, 7, 8]),
    "not-level-regular": NOT_REGULAR,
    "depth-1-gap": GAP,
    "depth-9": chain(9),
}
OK = "ok"
# (tree, format) -> "ok" or a phrase of the one-line refusal
EXPECTED = {
    "empty": {"medusa": "no nodes", "trtllm": "no nodes", "vllm": "no nodes"},
    "single": {"medusa": OK, "trtllm": OK, "vllm": OK},
    "depth-5": {"medusa": OK, "trtllm": OK, "vllm": OK},
    "rank-10": {"medusa": "TOPK", "trtllm": OK, "vllm": OK},
    "rank-15": {"medusa": "TOPK", "trtllm": OK, "vllm": OK},
    "rank-16": {"medusa": "TOPK", "trtllm": "rank 16", "vllm": OK},
    "rank-17": {"medusa": "TOPK", "trtllm": "ranks 0..15", "vllm": OK},
    "rank-16-collision": {"medusa": "TOPK", "trtllm": "rank 16", "vllm": "not level-regular"},
    "128-nodes": {"medusa": OK, "trtllm": OK, "vllm": OK},
    "not-level-regular": {"medusa": OK, "trtllm": OK, "vllm": "not level-regular"},
    "depth-1-gap": {"medusa": OK, "trtllm": OK, "vllm": "not level-regular"},
    "depth-9": {"medusa": OK, "trtllm": "depth 9", "vllm": OK},
}
SUFFIX = {"medusa": ".py", "trtllm": ".yaml", "vllm": ".yaml"}


def read_back(fmt: str, out: Path, tree: Tree) -> set[tuple[int, ...]]:
    """The tree the runtime's rules read from ``out``."""
    text = out.read_text()
    if fmt == "medusa":
        (assign,) = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)]
        return medusa_reads(ast.literal_eval(assign.value), num_heads=max(tree.depth, 5))
    if fmt == "trtllm":
        choices = yaml.load(text, Loader=yaml.SafeLoader)  # low_latency.py's reader
        max_draft_len = int(text.split("max_draft_len >= ")[1].split()[0])
        return trtllm_cpp_reads(choices, max_draft_len)
    args = vllm_config_file_args(yaml.safe_load(text))
    assert args["attention-backend"] == "TREE_ATTN"
    return vllm_0_20_2_reads(args["speculative-config"])


@pytest.mark.parametrize("fmt", ["medusa", "trtllm", "vllm"])
@pytest.mark.parametrize("name", list(EDGE_TREES))
def test_edge_trees_are_read_as_written_or_refused_in_one_line(tmp_path, name, fmt):
    tree = EDGE_TREES[name]
    bundle_path = tmp_path / "edge.json"
    save_bundle(edge_bundle(tree), bundle_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / f"tree{SUFFIX[fmt]}"
    result = runner.invoke(app, ["export", str(bundle_path), "--format", fmt, "--tree", "0",
                                 "--out", str(out)])
    expected = EXPECTED[name][fmt]
    if expected == OK:
        assert result.exit_code == 0, result.output
        assert read_back(fmt, out, tree) == set(tree.paths)
        assert f"{tree.num_nodes} nodes" in out.read_text().splitlines()[0]
    else:
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("entmtp: error:"), result.output
        assert expected in lines[0]
        assert list(out_dir.iterdir()) == []


def test_edge_table_covers_every_runtime_verdict():
    assert set(EXPECTED) == set(EDGE_TREES)
    verdicts = {v for row in EXPECTED.values() for v in row.values()}
    assert OK in verdicts and len(verdicts) > 4


def test_trtllm_gap_export_warns_on_stderr_and_in_the_yaml(tmp_path):
    bundle_path = tmp_path / "edge.json"
    save_bundle(edge_bundle(GAP), bundle_path)
    out = tmp_path / "gap.yaml"
    result = runner.invoke(app, ["export", str(bundle_path), "--format", "trtllm",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "entmtp: warning: depth-1 ranks skip [8]" in result.output
    assert "# warning: depth-1 ranks skip [8]" in out.read_text()


def test_refit_ranks_re_searches_under_the_runtime_limit(tmp_path):
    profile = synthetic_profile(num_traces=4, positions=256, num_heads=4, topk=20, seed=5)
    wide = regular_tree([17])
    bundle = edge_bundle(wide)
    bundle.heads = HeadsInfo("medusa", 4, 20, "ab" * 32)
    for fmt, limit, suffix in (("trtllm", 16, ".yaml"), ("medusa", 10, ".py")):
        with pytest.raises(EntmtpError, match="--refit-ranks"):
            export_bundle(bundle, fmt, tmp_path / f"x{suffix}")
        result = export_bundle(bundle, fmt, tmp_path / f"x{suffix}", refit=True, profile=profile)
        text = result.path.read_text()
        if fmt == "trtllm":
            read = trtllm_cpp_reads(yaml.safe_load(text), trtllm_max_draft_len(17))
        else:
            (assign,) = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)]
            read = medusa_reads(ast.literal_eval(assign.value))
        assert max(max(p) for p in read) < limit
        assert 0 < len(read) <= wide.num_nodes
        assert f"ranks below {limit}" in result.header.tree
    with pytest.raises(EntmtpError, match="profile"):
        export_bundle(bundle, "trtllm", tmp_path / "y.yaml", refit=True)
    assert not (tmp_path / "y.yaml").exists()


# -- headers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, suffix, sidecar", [
    ("medusa", ".py", False), ("medusa", ".json", True), ("trtllm", ".yaml", False),
    ("trtllm", ".json", True),
    ("vllm", ".yaml", False), ("vllm", ".json", True), ("vllm-chain", ".yaml", False),
    ("vllm-chain", ".json", True),
])
def test_every_export_names_bundle_tree_nodes_and_runtime_versions(tmp_path, fmt, suffix, sidecar):
    tree = regular_tree([2, 1])
    bundle = edge_bundle(tree)
    bundle.heads = HeadsInfo("medusa", 4, 10, "ab" * 32)
    profile = synthetic_profile(num_traces=3, positions=128, num_heads=4, seed=1)
    from entmtp.treesearch import LatencyModel

    out = tmp_path / f"export{suffix}"
    result = export_bundle(bundle, fmt, out, tree_index=None if fmt == "vllm-chain" else 0,
                           profile=profile, latency=LatencyModel.gpu_like(),
                           bundle_name="my-bundle.json")
    if sidecar:
        assert result.sidecar == tmp_path / f"export{suffix}{SIDECAR_SUFFIX}"
        header = json.loads(result.sidecar.read_text())["entmtp_export"]
        text = json.dumps(header)
        config = json.loads(out.read_text())
        if fmt == "trtllm":  # trtllm-bench's reader takes the JSON list as YAML
            assert yaml.load(out.read_text(), Loader=yaml.SafeLoader) == tree.to_json()
        if fmt.startswith("vllm"):  # vLLM's SpeculativeConfig forbids unknown keys
            assert set(config) <= {"method", "num_speculative_tokens", "speculative_token_tree"}
    else:
        assert result.sidecar is None
        text = out.read_text()
        assert text.startswith("# entmtp export")
    nodes = result.header.num_nodes
    for part in ("my-bundle.json", f"{nodes} nodes" if not sidecar else str(nodes),
                 CHECKED_AGAINST[fmt]):
        assert part in text
    assert ("tree 0" if fmt != "vllm-chain" else "best chain") in text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name] + ([out.name + SIDECAR_SUFFIX] if sidecar else []))


def test_a_failed_write_leaves_neither_file(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(EntmtpError, match="cannot write"):
        export_bundle(edge_bundle(chain(2)), "vllm", tmp_path / "taken", tree_index=0)
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


# -- vllm-chain --------------------------------------------------------------------------------
def test_vllm_chain_is_read_by_vllm_medusa_as_the_searched_chain(tmp_path):
    from entmtp.treesearch import LatencyModel
    from entmtp.treesearch._chain import best_chain

    profile = synthetic_profile(num_traces=4, positions=256, num_heads=4, seed=2)
    bundle = edge_bundle(chain(1))
    bundle.heads = HeadsInfo("medusa", 4, 10, "ab" * 32)
    bundle.latency = LatencyModel.gpu_like()
    result = export_bundle(bundle, "vllm-chain", tmp_path / "c.yaml", profile=profile)
    args = vllm_config_file_args(yaml.safe_load(result.path.read_text()))
    config = dict(args["speculative-config"], model="heads/")  # the user adds the heads
    choice = best_chain(profile, bundle.latency)
    assert vllm_medusa_chain_reads(config, num_heads=4) == set(choice.tree.paths)
    assert config["method"] == "medusa"
    assert f"predicted accept length {choice.mean_accept_length:.3f}" in result.path.read_text()


def test_vllm_chain_needs_the_profile_and_says_so(tmp_path):
    bundle_path = tmp_path / "b.json"
    save_bundle(edge_bundle(chain(1)), bundle_path)
    out = tmp_path / "c.json"
    result = runner.invoke(app, ["export", str(bundle_path), "--format", "vllm-chain",
                                 "--out", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--profile PROFILE.npz" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


# -- every shipped bundle ----------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_bundles_export_to_every_runtime(tmp_path, path):
    bundle = load_bundle(path)
    run = lambda *args: runner.invoke(app, ["export", str(path), *args])  # noqa: E731
    for fmt in ("medusa", "trtllm", "vllm"):
        out = tmp_path / f"{fmt}{SUFFIX[fmt]}"
        result = run("--format", fmt, "--out", str(out))
        from entmtp.treesearch._exports import default_tree

        tree = default_tree(bundle)[0]
        if fmt == "vllm" and not is_level_regular(tree):
            assert result.exit_code == 2 and "not level-regular" in result.output
            assert not out.exists()
            result = run("--format", fmt, "--out", str(out), "--largest-regular-subtree")
            tree = largest_regular_subtree(tree)
        assert result.exit_code == 0, result.output
        assert read_back(fmt, out, tree) == set(tree.paths)
    # vllm-chain searches the bundle's profile, which is not shipped: a one-line refusal ...
    result = run("--format", "vllm-chain", "--out", str(tmp_path / "chain.json"))
    assert result.exit_code == 2 and "profile" in result.output
    assert not (tmp_path / "chain.json").exists()
    # ... and with a profile of the same heads, the chain under the bundle's own latency model.
    profile = synthetic_profile(num_traces=3, positions=128, num_heads=bundle.heads.num_heads,
                                seed=4)
    chained = export_bundle(bundle, "vllm-chain", tmp_path / "chain.yaml", profile=profile)
    config = vllm_config_file_args(yaml.safe_load(chained.path.read_text()))["speculative-config"]
    reads = (vllm_medusa_chain_reads(dict(config, model="heads/"), bundle.heads.num_heads)
             if bundle.heads.type == "medusa" else None)
    assert 1 <= config["num_speculative_tokens"] <= bundle.heads.num_heads
    assert reads is None or len(reads) == config["num_speculative_tokens"]
