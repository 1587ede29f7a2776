"""Exports of a bundle's trees to runtimes that take one static tree.

Medusa, TensorRT-LLM and vLLM each verify a single fixed tree, so an export writes one tree of
the bundle: ``tree_index`` when given, else the bundle's recorded best static tree when it
has nodes, else its largest tree (most nodes; the first of equals). The ``entmtp`` format
writes the whole bundle.

Formats (the sources name where each runtime reads the file):
- ``medusa``: ``medusa_choices``, a list of rank paths. FasterDecoding/Medusa,
  ``medusa/model/medusa_choices.py`` defines trees as module constants
  (``mc_sim_7b_63 = [[0], [0, 0], ...]``) and ``medusa/model/utils.py``
  (``generate_medusa_buffers``) sorts them by (length, path) and hard-codes ``TOPK=10``, so
  ranks must stay below 10. A ``.py`` target gets a ``mc_entmtp = [...]`` constant to paste
  there; any other suffix gets the JSON list of lists.
- ``trtllm``: NVIDIA/TensorRT-LLM ``tensorrt_llm/bench/benchmark/low_latency.py`` reads
  ``trtllm-bench ... --medusa_choices FILE`` with ``yaml.load(f, Loader=yaml.SafeLoader)`` into
  ``decoding_config["medusa_choices"]``: a YAML list of lists of ranks. The engine must be built
  with ``max_draft_len`` >= the tree's node count and at least ``depth`` Medusa heads.
- ``vllm``: vllm-project/vllm ``SpeculativeConfig.speculative_token_tree``
  (``vllm/config/speculative.py``) is a Python literal string, e.g. ``"[(0,), (1,), (0, 0)]"``,
  sorted breadth-first by (length, path); ``num_speculative_tokens`` must equal its length.
  ``vllm/v1/spec_decode/eagle.py`` (``EagleProposer.propose_tree``) drafts one child count
  per level, ``child_drafts_per_level[l] = nodes at level l // nodes at level l-1``, and gives
  every node of the previous level the top-``c`` candidates (``torch.topk``). So vLLM can only
  run *level-regular* trees: every node at depth ``l-1`` has exactly the children of ranks
  ``0..c_l-1``. The export writes ``{"num_speculative_tokens": N, "speculative_token_tree":
  "..."}``, the part of ``--speculative-config`` the tree decides. (vLLM drafts trees with
  its EAGLE/MTP proposers; its Medusa proposer drafts a top-1 chain.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from ._atomic import atomic_write_text
from ._bundle import Bundle, save_bundle
from ._errors import EntmtpError
from ._tree import Tree

EXPORT_FORMATS = ("entmtp", "medusa", "trtllm", "vllm")
MEDUSA_TOPK = 10  # FasterDecoding/Medusa medusa/model/utils.py: TOPK=10
MEDUSA_CONSTANT = "mc_entmtp"


# -- which tree -------------------------------------------------------------------------------
def default_tree(bundle: Bundle) -> tuple[Tree, str]:
    """The tree an export writes without ``tree_index``, and a phrase saying which it is.

    A best static tree without nodes (plain decoding was fastest on the bundle's hardware) is
    no tree a speculative runtime can run, so the largest tree stands in for it then.
    """
    best = bundle.best_static
    if best is not None and best.tree.num_nodes > 0:
        index = best.tree_index
        what = "the best static tree" + (f" (tree {index})" if index is not None else "")
        return best.tree, what
    index = max(range(len(bundle.trees)), key=lambda i: (bundle.trees[i].num_nodes, -i))
    what = f"the largest tree (tree {index})"
    if best is not None:
        what += "; the best static tree has no nodes: plain decoding on the bundle's hardware"
    return bundle.trees[index], what


def select_tree(bundle: Bundle, tree_index: int | None = None) -> Tree:
    if tree_index is None:
        return default_tree(bundle)[0]
    valid = isinstance(tree_index, int) and not isinstance(tree_index, bool)
    if not valid or not 0 <= tree_index < len(bundle.trees):
        raise EntmtpError(
            f"--tree {tree_index} is out of range: the bundle has {len(bundle.trees)} trees "
            f"(0..{len(bundle.trees) - 1})"
        )
    return bundle.trees[tree_index]


def _write(path: str | os.PathLike, text: str) -> Path:
    try:
        return atomic_write_text(path, text)
    except OSError as err:
        raise EntmtpError(f"cannot write {path}: {err.strerror or err}") from err


def _require_nodes(tree: Tree, fmt: str) -> None:
    if tree.num_nodes == 0:
        raise EntmtpError(
            f"the tree to export has no nodes, which {fmt} cannot run: choose another with --tree"
        )


# -- medusa -----------------------------------------------------------------------------------
def to_medusa_choices(tree: Tree, *, topk: int = MEDUSA_TOPK) -> list[list[int]]:
    """``medusa_choices`` for Medusa's reference runtime (ranks below its ``TOPK``)."""
    _require_nodes(tree, "Medusa")
    for path in tree.paths:
        if max(path) >= topk:
            raise EntmtpError(
                f"tree path {list(path)} uses rank {max(path)} but Medusa's runtime drafts only "
                f"top-{topk} per head (TOPK in medusa/model/utils.py): raise TOPK there or search "
                f"with top-k {topk}"
            )
    return tree.to_json()


def medusa_python_text(tree: Tree, *, name: str = MEDUSA_CONSTANT, topk: int = MEDUSA_TOPK) -> str:
    if not name.isidentifier():
        raise EntmtpError(f"{name!r} is not a Python identifier: choose another constant name")
    choices = to_medusa_choices(tree, topk=topk)
    return (
        f"# {tree.num_nodes}-node draft tree exported by entmtp; paste into Medusa's\n"
        f"# medusa/model/medusa_choices.py and pass medusa_choices={name}.\n"
        f"{name} = {json.dumps(choices)}\n"
    )


def write_medusa_choices(
    tree: Tree, path: str | os.PathLike, *, name: str = MEDUSA_CONSTANT, topk: int = MEDUSA_TOPK
) -> Path:
    """``.py``: a ``name = [[0], ...]`` constant; anything else: a JSON list of lists."""
    if Path(path).suffix == ".py":
        text = medusa_python_text(tree, name=name, topk=topk)
    else:
        text = json.dumps(to_medusa_choices(tree, topk=topk)) + "\n"
    return _write(path, text)


# -- TensorRT-LLM -----------------------------------------------------------------------------
def to_trtllm_choices(tree: Tree) -> list[list[int]]:
    """``medusa_choices`` as TensorRT-LLM's MedusaDecodingConfig / trtllm-bench take it."""
    _require_nodes(tree, "TensorRT-LLM")
    return tree.to_json()


def trtllm_yaml_text(tree: Tree) -> str:
    lines = [f"# {tree.num_nodes}-node Medusa tree exported by entmtp: trtllm-bench "
             "--medusa_choices THIS_FILE (engine max_draft_len >= "
             f"{tree.num_nodes}, >= {tree.depth} heads)"]
    lines += [f"- {json.dumps(path)}" for path in to_trtllm_choices(tree)]
    return "\n".join(lines) + "\n"


def write_trtllm_choices(tree: Tree, path: str | os.PathLike) -> Path:
    return _write(path, trtllm_yaml_text(tree))


# -- vLLM -------------------------------------------------------------------------------------
def level_regular_violation(tree: Tree) -> str | None:
    """Why vLLM cannot run ``tree`` as it is (None when it can)."""
    children: dict[tuple[int, ...], list[int]] = {(): []}
    for path in tree.paths:
        children.setdefault(path[:-1], []).append(path[-1])
        children.setdefault(path, [])
    level = [()]
    for depth in range(1, tree.depth + 1):
        count = tree.widths[depth - 1]
        if count % len(level):
            return (
                f"depth {depth} has {count} nodes under {len(level)} parents, but vLLM gives "
                "every node of a level the same number of children"
            )
        per_parent = count // len(level)
        for parent in level:
            ranks = sorted(children[parent])
            if ranks != list(range(per_parent)):
                return (
                    f"node {list(parent) or 'root'} has children of ranks {ranks}, but vLLM gives "
                    f"every node at depth {depth - 1} the children of ranks 0..{per_parent - 1}"
                )
        level = [parent + (r,) for parent in level for r in range(per_parent)]
    return None


def is_level_regular(tree: Tree) -> bool:
    return level_regular_violation(tree) is None


def regular_tree(widths: Sequence[int]) -> Tree:
    """The level-regular tree whose depth-``l`` nodes each have ``widths[l]`` children."""
    level: list[tuple[int, ...]] = [()]
    paths: list[tuple[int, ...]] = []
    for width in widths:
        level = [parent + (r,) for parent in level for r in range(width)]
        paths.extend(level)
    return Tree.from_paths(paths)


def largest_regular_subtree(tree: Tree) -> Tree:
    """The level-regular subtree of ``tree`` with the most nodes.

    Ties go to the deeper tree, then to the wider first levels. A regular subtree is fixed by
    its per-level child counts, and shrinking any count keeps it inside ``tree``, so a
    depth-first search over the counts that stops at the first count that leaves ``tree`` visits
    every candidate.
    """
    members = set(tree.paths)
    best: tuple[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = ((0, 0, ()), ())

    def extend(widths: tuple[int, ...], level: list[tuple[int, ...]], nodes: int) -> None:
        nonlocal best
        key = (nodes, len(widths), widths)
        if key > best[0]:
            best = (key, widths)
        width = 0
        while True:
            new = [parent + (width,) for parent in level]
            if not all(p in members for p in new):
                break
            width += 1
            next_level = [parent + (r,) for parent in level for r in range(width)]
            extend((*widths, width), next_level, nodes + len(next_level))

    extend((), [()], 0)
    return regular_tree(best[1])


def _vllm_ready(tree: Tree, *, largest_regular_subtree: bool) -> Tree:
    if largest_regular_subtree:
        _require_nodes(tree, "vLLM")
        tree = _largest_regular_subtree(tree)
        if tree.num_nodes == 0:
            raise EntmtpError(
                "the tree has no level-regular subtree for vLLM: it lacks the rank-0 node [0]"
            )
    _require_nodes(tree, "vLLM")
    problem = level_regular_violation(tree)
    if problem is not None:
        raise EntmtpError(
            f"the tree is not level-regular, which vLLM's tree drafting needs: {problem}; export "
            "the largest regular subtree instead (--largest-regular-subtree)"
        )
    return tree


_largest_regular_subtree = largest_regular_subtree  # keyword arguments below shadow the name


def to_vllm_tree(tree: Tree, *, largest_regular_subtree: bool = False) -> str:
    """``speculative_token_tree`` for vLLM's SpeculativeConfig (breadth-first sorted)."""
    tree = _vllm_ready(tree, largest_regular_subtree=largest_regular_subtree)
    return str([tuple(path) for path in tree.paths])


def vllm_config(tree: Tree, *, largest_regular_subtree: bool = False) -> dict[str, int | str]:
    """The tree's part of vLLM's ``--speculative-config``."""
    tree = _vllm_ready(tree, largest_regular_subtree=largest_regular_subtree)
    return {
        "num_speculative_tokens": tree.num_nodes,
        "speculative_token_tree": str([tuple(path) for path in tree.paths]),
    }


def write_vllm_config(
    tree: Tree, path: str | os.PathLike, *, largest_regular_subtree: bool = False
) -> Path:
    config = vllm_config(tree, largest_regular_subtree=largest_regular_subtree)
    return _write(path, json.dumps(config, indent=2) + "\n")


# -- dispatcher -------------------------------------------------------------------------------
def write_tree(
    tree: Tree, fmt: str, out_path: str | os.PathLike, *, largest_regular_subtree: bool = False
) -> Path:
    """Write one tree in a runtime's format (medusa, trtllm or vllm)."""
    if fmt == "medusa":
        return write_medusa_choices(tree, out_path)
    if fmt == "trtllm":
        return write_trtllm_choices(tree, out_path)
    if fmt == "vllm":
        return write_vllm_config(tree, out_path, largest_regular_subtree=largest_regular_subtree)
    raise EntmtpError(
        f"unknown tree export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS[1:])}"
    )


def export(
    bundle: Bundle,
    fmt: str,
    out_path: str | os.PathLike,
    *,
    tree_index: int | None = None,
    largest_regular_subtree: bool = False,
) -> Path:
    """Write ``bundle`` (``entmtp``) or one of its trees (``medusa``, ``trtllm``, ``vllm``)."""
    if fmt not in EXPORT_FORMATS:
        raise EntmtpError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if fmt == "entmtp":
        if tree_index is not None or largest_regular_subtree:
            raise EntmtpError(
                "the entmtp format writes the whole bundle: --tree and --largest-regular-subtree "
                "apply to medusa, trtllm and vllm"
            )
        return save_bundle(bundle, out_path)
    if largest_regular_subtree and fmt != "vllm":
        raise EntmtpError("--largest-regular-subtree applies to the vllm format only")
    tree = select_tree(bundle, tree_index)
    return write_tree(tree, fmt, out_path, largest_regular_subtree=largest_regular_subtree)
