"""Exports of a bundle's trees to runtimes that take one static tree, checked against their rules.

Medusa, TensorRT-LLM and vLLM each verify a single fixed tree, so an export writes one tree of
the bundle: ``tree_index`` when given, else the bundle's recorded best static tree when it
has nodes, else its largest tree (most nodes; the first of equals). The ``entmtp`` format
writes the whole bundle; ``vllm-chain`` writes the best chain searched on the bundle's profile.
A tree a runtime would misread is refused with one line naming the path and the limit; nothing
is written then.

Each runtime's rules, from its source (the tests re-derive each rule independently):

- ``medusa`` (FasterDecoding/Medusa main @ e2a5d20, ``medusa/model/utils.py``):
  ``generate_medusa_buffers`` sorts the choices by (length, path) and gives the node of rank
  ``r`` at depth ``i + 1`` the candidate index ``r + TOPK * i + 1`` in ``[root, head 1 top-10,
  head 2 top-10, ...]`` with the module constant ``TOPK=10``: a rank of 10 or more silently
  verifies a candidate of the next head, so ranks must stay below 10. A ``.py`` target gets a
  ``mc_entmtp = [...]`` constant to paste into ``medusa/model/medusa_choices.py``; any other
  suffix gets the JSON list of lists.
- ``trtllm`` (NVIDIA/TensorRT-LLM main @ 04a2cacb: ``cpp/tensorrt_llm/runtime/utils/
  speculativeChoicesUtils.cpp`` ``initTensorsFromChoices``, the constants in
  ``cpp/include/tensorrt_llm/runtime/utils/speculativeChoicesUtils.h``, and
  ``cpp/include/tensorrt_llm/runtime/speculativeDecodingModule.h``): each node is keyed by its
  path packed 4 bits per rank into a 64-bit prefix (``PREFIX_CHUNK_SIZE_BITS = 4``); a rank
  above ``PREFIX_MAX_VALUE = 16`` aborts ("too large node degree"), and a rank of exactly 16
  overflows into the parent's chunk (``[0, 16]`` and ``[1, 0]`` get the same key, so the
  engine builds another tree). Ranks must therefore be below 16; and as each rank is shifted
  as a 32-bit ``SizeType32`` before it joins the 64-bit prefix, depth at most 32 / 4 = 8.
  The attention mask of a step is packed in ``ceil(max_draft_len / 32)`` 32-bit words per row
  while the tree writes columns ``0..num_nodes`` (column 0 is the root), and the engine takes
  at most ``max_draft_len`` nodes: a tree of ``n`` nodes needs ``max_draft_len >= n`` and
  ``32 * ceil(max_draft_len / 32) >= n + 1``, i.e. ``n + 1`` when ``n`` is a multiple of 32
  (128 nodes: 129), else ``n``. ``trtllm-bench --medusa_choices FILE`` reads the YAML list with
  ``yaml.SafeLoader`` (``tensorrt_llm/bench/benchmark/low_latency.py``), so ``#`` comments are
  free (a ``.json`` target gets the plain list, which YAML reads too, and a sidecar). The
  older Python runtime (``tensorrt_llm/runtime/medusa_utils.py`` @ 249d93d5,
  ``get_medusa_tree``) drafts ranks ``0..max`` at depth 1 whatever the tree lists, so gaps
  there cost extra tokens (``[[0]..[7], [9]]``: 10 tokens for 9 nodes); the export says so.
- ``vllm`` (vllm-project/vllm 0.20.2: ``vllm/config/speculative.py``,
  ``vllm/v1/spec_decode/llm_base_proposer.py``, ``vllm/v1/attention/backends/tree_attn.py``):
  ``speculative_token_tree`` is a Python literal string such as ``"[(0,), (1,), (0, 0)]"``,
  sorted breadth-first by (length, path), with ``num_speculative_tokens`` equal to its length,
  run by the EAGLE / MTP / draft-model proposers with the ``TREE_ATTN`` attention backend.
  The proposer drafts one child count per level, ``nodes at level l // nodes at level l - 1``,
  and gives every node of the previous level its top-``c`` candidates, so vLLM can only run
  *level-regular* trees: every node at depth ``l - 1`` has exactly the children of ranks
  ``0..c_l - 1``. vLLM PR #42121 ("Remove tree attention") removed the field and the backend:
  0.21.0 and later reject the key. vLLM's Medusa proposer never drafted trees (top-1 per head).
- ``vllm-chain``: current vLLM drafts a chain of ``num_speculative_tokens`` tokens. Its
  ``medusa`` method (``vllm/v1/spec_decode/medusa.py``, 0.20.2 to 0.32.0) takes the top-1 of
  the first ``num_speculative_tokens`` heads (``MedusaConfig.num_lookahead_tokens`` sets the
  head count), which is the chain ``[0], [0, 0], ...``; 0.33.0 and later (0.34.0 checked) have
  no ``medusa`` method, and ``num_speculative_tokens`` is then what an MTP / EAGLE chain
  drafter takes. The export searches the chain length on the bundle's profile under its latency
  model (``_chain.best_chain``) and states the predicted accept length.

Headers: every file names the bundle, the tree, its node count and what the format was checked
against. YAML and Python files carry it as ``#`` comments. vLLM's ``SpeculativeConfig`` forbids
unknown keys (``vllm/config/utils.py``: ``ConfigDict(extra="forbid")``, 0.20.2 and 0.34.0) and
a Medusa choices list has nowhere to put a field, so JSON targets get the header in a sidecar
``FILE.entmtp.json`` beside them. vLLM targets ending in ``.yaml``/``.yml`` are written as a
``vllm serve --config FILE`` file (``speculative-config:`` nested, comments allowed:
``FlexibleArgumentParser.load_config_file``, 0.20.2 and 0.34.0) and need no sidecar. The
``entmtp`` format is the bundle itself, whose ``format``/``format_version`` say what it is.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entmtp.core import EntmtpError, atomic_write_text

from ._bundle import Bundle, save_bundle
from ._chain import ChainChoice, best_chain
from ._greedy import best_tree
from ._latency import LatencyModel
from ._profile import Profile
from ._tree import Tree

EXPORT_FORMATS = ("entmtp", "medusa", "trtllm", "vllm", "vllm-chain")
TREE_FORMATS = ("medusa", "trtllm", "vllm")

MEDUSA_TOPK = 10  # FasterDecoding/Medusa medusa/model/utils.py: TOPK=10
MEDUSA_CONSTANT = "mc_entmtp"

TRTLLM_PREFIX_BITS = 4  # speculativeChoicesUtils.h: PREFIX_CHUNK_SIZE_BITS
TRTLLM_RANK_LIMIT = 1 << TRTLLM_PREFIX_BITS  # ranks 0..15 fit a chunk; 16 overflows, 17+ abort
# The prefix is a uint64_t, but each rank is shifted as a 32-bit int before it is widened
# (computePrefix: ``vec[ci] << 4 * (len - 1 - ci)`` on SizeType32), so only 8 levels pack.
TRTLLM_MAX_DEPTH = 32 // TRTLLM_PREFIX_BITS
TRTLLM_MASK_WORD_BITS = 32  # speculativeDecodingModule.h: divUp(maxDecodingDraftTokens, 32)

CHECKED_AGAINST = {
    "medusa": "FasterDecoding/Medusa main @ e2a5d20 (medusa/model/utils.py, TOPK=10)",
    "trtllm": "TensorRT-LLM main @ 04a2cacb (C++ initTensorsFromChoices, trtllm-bench "
              "--medusa_choices) and its Python runtime medusa_utils.py @ 249d93d5",
    "vllm": "vLLM 0.20.2 (speculative_token_tree, TREE_ATTN backend); vLLM 0.21.0 and later "
            "have no tree (PR #42121)",
    "vllm-chain": "vLLM 0.20.2 and 0.32.0 (method medusa); vLLM 0.33.0 and later (0.34.0 "
                  "checked) have no medusa method: num_speculative_tokens of a chain drafter",
}
SIDECAR_SUFFIX = ".entmtp.json"
_YAML_SUFFIXES = (".yaml", ".yml")


# -- records ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportHeader:
    """What an exported file is: written as comments, or into a JSON sidecar."""

    bundle: str  # the bundle's file, or what it is when exported from memory
    tree: str  # which tree: "tree 2", "the best static tree", "the best chain", ...
    num_nodes: int
    fmt: str
    notes: tuple[str, ...] = ()  # what the runtime needs, or misreads, for this tree

    @property
    def checked_against(self) -> str:
        return CHECKED_AGAINST[self.fmt]

    def comment(self) -> str:
        lines = [
            f"entmtp export ({self.fmt}) of {self.bundle}: {self.tree}, {self.num_nodes} nodes",
            f"checked against {self.checked_against}",
            *self.notes,
        ]
        return "".join(f"# {line}\n" for line in lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "entmtp_export": {
                "format": self.fmt,
                "bundle": self.bundle,
                "tree": self.tree,
                "num_nodes": self.num_nodes,
                "checked_against": self.checked_against,
                "notes": list(self.notes),
            }
        }


@dataclass(frozen=True)
class ExportResult:
    path: Path
    header: ExportHeader | None  # None for the entmtp format: the bundle says what it is
    sidecar: Path | None = None  # the header beside a JSON file its runtime reads strictly
    warnings: tuple[str, ...] = ()  # what the runtime misreads or what would be faster


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
    return chosen_tree(bundle, tree_index)[0]


def chosen_tree(bundle: Bundle, tree_index: int | None = None) -> tuple[Tree, str]:
    """The tree to export and a phrase saying which it is."""
    if tree_index is None:
        return default_tree(bundle)
    valid = isinstance(tree_index, int) and not isinstance(tree_index, bool)
    if not valid or not 0 <= tree_index < len(bundle.trees):
        raise EntmtpError(
            f"--tree {tree_index} is out of range: the bundle has {len(bundle.trees)} trees "
            f"(0..{len(bundle.trees) - 1})"
        )
    return bundle.trees[tree_index], f"tree {tree_index}"


def _write(path: str | os.PathLike, text: str) -> Path:
    try:
        return atomic_write_text(path, text)
    except OSError as err:
        raise EntmtpError(f"cannot write {path}: {err.strerror or err}") from err


def sidecar_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _write_with_sidecar(path: str | os.PathLike, text: str, header: ExportHeader) -> Path:
    """``text`` to ``path`` and the header beside it; neither stays when either write fails."""
    sidecar = sidecar_path(path)
    _write(sidecar, json.dumps(header.to_json(), indent=2) + "\n")
    try:
        _write(path, text)
    except BaseException:
        sidecar.unlink(missing_ok=True)
        raise
    return sidecar


def _is_yaml(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in _YAML_SUFFIXES


def _no_nodes(runtime: str) -> str:
    return (f"the tree to export has no nodes, which {runtime} cannot run: choose another "
            "with --tree")


def _require_nodes(tree: Tree, runtime: str) -> None:
    if tree.num_nodes == 0:
        raise EntmtpError(_no_nodes(runtime))


def _first_rank_at_or_above(tree: Tree, limit: int) -> tuple[int, ...] | None:
    return next((path for path in tree.paths if max(path) >= limit), None)


def refit_ranks(tree: Tree, profile: Profile, limit: int) -> Tree:
    """The best tree of ``tree``'s size on ``profile`` whose ranks stay below ``limit``.

    Greedy over the profile's rank prefixes (optimal for a node budget, ``_greedy``); fewer
    nodes when fewer prefixes with ranks below ``limit`` were observed.
    """
    return best_tree(profile.ranks(), tree.num_nodes, topk=limit)


# -- medusa -----------------------------------------------------------------------------------
def medusa_problem(tree: Tree, *, topk: int = MEDUSA_TOPK) -> str | None:
    """Why Medusa's reference runtime would misread ``tree`` (None when it reads it right)."""
    if tree.num_nodes == 0:
        return _no_nodes("Medusa")
    path = _first_rank_at_or_above(tree, topk)
    if path is not None:
        return (
            f"tree path {list(path)} uses rank {max(path)} but Medusa's runtime drafts only "
            f"top-{topk} per head (TOPK in medusa/model/utils.py): raise TOPK there, pick another "
            f"tree with --tree, or re-search it with --refit-ranks"
        )
    return None


def to_medusa_choices(tree: Tree, *, topk: int = MEDUSA_TOPK) -> list[list[int]]:
    """``medusa_choices`` for Medusa's reference runtime (ranks below its ``TOPK``)."""
    problem = medusa_problem(tree, topk=topk)
    if problem is not None:
        raise EntmtpError(problem)
    return tree.to_json()


def medusa_python_text(
    tree: Tree,
    *,
    name: str = MEDUSA_CONSTANT,
    topk: int = MEDUSA_TOPK,
    header: ExportHeader | None = None,
) -> str:
    if not name.isidentifier():
        raise EntmtpError(f"{name!r} is not a Python identifier: choose another constant name")
    choices = to_medusa_choices(tree, topk=topk)
    return (
        (header.comment() if header is not None else "")
        + f"# {tree.num_nodes}-node draft tree exported by entmtp; paste into Medusa's\n"
        f"# medusa/model/medusa_choices.py and pass medusa_choices={name}.\n"
        f"{name} = {json.dumps(choices)}\n"
    )


def write_medusa_choices(
    tree: Tree,
    path: str | os.PathLike,
    *,
    name: str = MEDUSA_CONSTANT,
    topk: int = MEDUSA_TOPK,
    header: ExportHeader | None = None,
) -> Path:
    """``.py``: a ``name = [[0], ...]`` constant; anything else: a JSON list of lists (with the
    header, when given, in a sidecar)."""
    if Path(path).suffix == ".py":
        return _write(path, medusa_python_text(tree, name=name, topk=topk, header=header))
    text = json.dumps(to_medusa_choices(tree, topk=topk)) + "\n"
    if header is None:
        return _write(path, text)
    _write_with_sidecar(path, text, header)
    return Path(path)


# -- TensorRT-LLM -----------------------------------------------------------------------------
def trtllm_problem(tree: Tree) -> str | None:
    """Why TensorRT-LLM's C++ runtime would abort on or misread ``tree`` (None when it reads it
    as written)."""
    if tree.num_nodes == 0:
        return _no_nodes("TensorRT-LLM")
    path = _first_rank_at_or_above(tree, TRTLLM_RANK_LIMIT)
    if path is not None:
        return (
            f"tree path {list(path)} has rank {max(path)} but TensorRT-LLM packs each rank in "
            f"{TRTLLM_PREFIX_BITS} bits (ranks 0..{TRTLLM_RANK_LIMIT - 1}; initTensorsFromChoices "
            "builds another tree or aborts): pick another tree with --tree or re-search it with "
            "--refit-ranks"
        )
    if tree.depth > TRTLLM_MAX_DEPTH:
        deepest = max(tree.paths, key=len)
        return (
            f"tree path {list(deepest)} has depth {len(deepest)} but TensorRT-LLM shifts each "
            f"rank as a 32-bit int, {TRTLLM_MAX_DEPTH} levels at most: pick another tree with "
            "--tree"
        )
    return None


def trtllm_max_draft_len(num_nodes: int) -> int:
    """The smallest engine ``max_draft_len`` that runs a tree of ``num_nodes`` nodes.

    TensorRT-LLM takes at most ``max_draft_len`` nodes, and packs each mask row of the
    ``num_nodes + 1`` tokens (the root included) into ``ceil(max_draft_len / 32)`` 32-bit words.
    """
    if num_nodes < 1:
        raise EntmtpError(f"a TensorRT-LLM tree needs at least one node, got {num_nodes}")
    need = num_nodes
    while TRTLLM_MASK_WORD_BITS * math.ceil(need / TRTLLM_MASK_WORD_BITS) < num_nodes + 1:
        need += 1
    return need


def trtllm_python_runtime_gap(tree: Tree) -> str | None:
    """What TensorRT-LLM's older Python runtime drafts instead of ``tree`` (None: the same)."""
    first = sorted(path[0] for path in tree.paths if len(path) == 1)
    if not first or first == list(range(len(first))):
        return None
    drafted = first[-1] + 1 + (tree.num_nodes - len(first))
    missing = sorted(set(range(first[-1] + 1)) - set(first))
    return (
        f"depth-1 ranks skip {missing}: TensorRT-LLM's older Python runtime "
        f"(tensorrt_llm/runtime/medusa_utils.py) drafts ranks 0..{first[-1]} there, "
        f"{drafted} tokens for these {tree.num_nodes} nodes; its C++ runtime reads the tree as "
        "written"
    )


def to_trtllm_choices(tree: Tree) -> list[list[int]]:
    """``medusa_choices`` as TensorRT-LLM's MedusaDecodingConfig / trtllm-bench take it."""
    problem = trtllm_problem(tree)
    if problem is not None:
        raise EntmtpError(problem)
    return tree.to_json()


def trtllm_notes(tree: Tree) -> tuple[str, ...]:
    """What the engine needs for ``tree`` and what the Python runtime misreads (header lines)."""
    notes = [
        f"engine: max_draft_len >= {trtllm_max_draft_len(tree.num_nodes)} and >= {tree.depth} "
        f"Medusa heads (a mask row has ceil(max_draft_len / 32) 32-bit words for the "
        f"{tree.num_nodes} + 1 tokens, root included)",
        "use: trtllm-bench ... --medusa_choices THIS_FILE",
    ]
    gap = trtllm_python_runtime_gap(tree)
    if gap is not None:
        notes.append(f"warning: {gap}")
    return tuple(notes)


def trtllm_yaml_text(tree: Tree, header: ExportHeader | None = None) -> str:
    choices = to_trtllm_choices(tree)
    if header is None:
        header = ExportHeader("a bundle", "a tree", tree.num_nodes, "trtllm", trtllm_notes(tree))
    return header.comment() + "".join(f"- {json.dumps(path)}\n" for path in choices)


def write_trtllm_choices(
    tree: Tree, path: str | os.PathLike, header: ExportHeader | None = None
) -> Path:
    """A commented YAML list; a ``.json`` target gets the plain JSON list (YAML reads it too)
    with the header in a sidecar."""
    if Path(path).suffix.lower() == ".json" and header is not None:
        _write_with_sidecar(path, json.dumps(to_trtllm_choices(tree)) + "\n", header)
        return Path(path)
    return _write(path, trtllm_yaml_text(tree, header))


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
    """The tree's part of vLLM's ``--speculative-config`` (vLLM 0.20.2 and earlier)."""
    tree = _vllm_ready(tree, largest_regular_subtree=largest_regular_subtree)
    return {
        "num_speculative_tokens": tree.num_nodes,
        "speculative_token_tree": str([tuple(path) for path in tree.paths]),
    }


def _vllm_yaml(config: dict[str, Any], header: ExportHeader, *, tree: bool) -> str:
    """A ``vllm serve MODEL --config THIS_FILE`` file: the settings nested under their flags."""
    lines = []
    if tree:
        lines.append("attention-backend: TREE_ATTN")
    lines.append("speculative-config:")
    lines += [f"  {key}: {json.dumps(value)}" for key, value in config.items()]
    return header.comment() + "\n".join(lines) + "\n"


def _write_vllm(
    path: str | os.PathLike, config: dict[str, Any], header: ExportHeader, *, tree: bool
) -> tuple[Path, Path | None]:
    if _is_yaml(path):
        return _write(path, _vllm_yaml(config, header, tree=tree)), None
    sidecar = _write_with_sidecar(path, json.dumps(config, indent=2) + "\n", header)
    return Path(path), sidecar


def write_vllm_config(
    tree: Tree, path: str | os.PathLike, *, largest_regular_subtree: bool = False,
    header: ExportHeader | None = None,
) -> Path:
    """``.yaml``/``.yml``: a ``vllm serve --config`` file; else the ``--speculative-config``
    JSON (with the header, when given, in a sidecar)."""
    config = vllm_config(tree, largest_regular_subtree=largest_regular_subtree)
    if header is None:
        if _is_yaml(path):
            header = ExportHeader("a bundle", "a tree", config["num_speculative_tokens"], "vllm")
        else:
            return _write(path, json.dumps(config, indent=2) + "\n")
    return _write_vllm(path, config, header, tree=True)[0]


def vllm_tree_notes() -> tuple[str, ...]:
    return (
        "use: vllm serve MODEL --config THIS_FILE (YAML) or --speculative-config (JSON), with "
        "method and model of your EAGLE/MTP drafter added under speculative-config, vLLM 0.20.2 "
        "or earlier, attention backend TREE_ATTN",
    )


def vllm_chain_config(choice: ChainChoice, head_type: str) -> dict[str, int | str]:
    """The ``--speculative-config`` keys the chain decides (``method`` for Medusa heads)."""
    config: dict[str, int | str] = {}
    if head_type == "medusa":
        config["method"] = "medusa"
    config["num_speculative_tokens"] = choice.length
    return config


def vllm_chain_notes(choice: ChainChoice, head_type: str) -> tuple[str, ...]:
    notes = [
        f"predicted accept length {choice.mean_accept_length:.3f} tokens per step "
        f"({choice.tokens_per_second:.2f} tokens/s, {choice.speedup_vs_autoregressive:.3f}x "
        "plain decoding, replayed on the bundle's profile under its latency model)",
    ]
    if head_type == "medusa":
        notes.append(
            "use: vllm serve MODEL --config THIS_FILE (YAML) or --speculative-config (JSON) with "
            "model: the Medusa heads' folder added under speculative-config (vLLM 0.32.0 or "
            "earlier; later releases have no medusa method)"
        )
    else:
        notes.append(
            f"vLLM has no {head_type} drafter: num_speculative_tokens is the chain length for "
            "the chain drafter (method, model) that serves these heads"
        )
    return tuple(notes)


# -- dispatcher -------------------------------------------------------------------------------
def write_tree(
    tree: Tree, fmt: str, out_path: str | os.PathLike, *, largest_regular_subtree: bool = False
) -> Path:
    """Write one tree in a runtime's format (medusa, trtllm or vllm), without a header."""
    if fmt == "medusa":
        return write_medusa_choices(tree, out_path)
    if fmt == "trtllm":
        return write_trtllm_choices(tree, out_path)
    if fmt == "vllm":
        return write_vllm_config(tree, out_path, largest_regular_subtree=largest_regular_subtree)
    raise EntmtpError(
        f"unknown tree export format {fmt!r}: use one of {', '.join(TREE_FORMATS)}"
    )


def _check_profile(bundle: Bundle, profile: Profile) -> None:
    if profile.num_heads != bundle.heads.num_heads:
        raise EntmtpError(
            f"the profile has {profile.num_heads} heads but the bundle {bundle.heads.num_heads}: "
            "give the profile of the bundle's run"
        )
    sha = profile.meta.heads_sha256
    if sha and bundle.heads.sha256 and sha.lower() != bundle.heads.sha256:
        raise EntmtpError(
            f"the profile was made with heads {sha.lower()[:12]}... but the bundle with "
            f"{bundle.heads.sha256[:12]}...: give the profile of the bundle's run"
        )


def _needs_profile(what: str, profile: Profile | None) -> Profile:
    if profile is None:
        raise EntmtpError(
            f"{what} on the bundle's profile: give the run folder (with profile.npz) or "
            "--profile PROFILE.npz"
        )
    return profile


def export_bundle(
    bundle: Bundle,
    fmt: str,
    out_path: str | os.PathLike,
    *,
    tree_index: int | None = None,
    largest_regular_subtree: bool = False,
    refit: bool = False,
    profile: Profile | None = None,
    latency: LatencyModel | None = None,
    bundle_name: str | None = None,
) -> ExportResult:
    """Write ``bundle`` (``entmtp``), one of its trees (``medusa``, ``trtllm``, ``vllm``) or its
    best chain (``vllm-chain``), each tree format with its header.

    ``refit`` (medusa, trtllm): a tree whose ranks the runtime cannot hold is re-searched on
    ``profile`` with ranks below the runtime's limit instead of refused. ``vllm-chain`` needs
    ``profile`` and a latency model (``latency``, else the bundle's own).
    """
    if fmt not in EXPORT_FORMATS:
        raise EntmtpError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if fmt == "entmtp":
        if tree_index is not None or largest_regular_subtree or refit:
            raise EntmtpError(
                "the entmtp format writes the whole bundle: --tree, --largest-regular-subtree "
                "and --refit-ranks apply to one tree"
            )
        return ExportResult(save_bundle(bundle, out_path), None)
    if largest_regular_subtree and fmt != "vllm":
        raise EntmtpError("--largest-regular-subtree applies to the vllm format only")
    if refit and fmt not in ("medusa", "trtllm"):
        raise EntmtpError("--refit-ranks applies to the medusa and trtllm formats only")
    name = bundle_name or f"a {bundle.heads.type} bundle for {bundle.model.name} ({bundle.task})"
    if profile is not None:
        _check_profile(bundle, profile)
    if fmt == "vllm-chain":
        return _export_chain(bundle, out_path, tree_index, profile, latency, name)

    tree, which = chosen_tree(bundle, tree_index)
    if refit:
        limit = MEDUSA_TOPK if fmt == "medusa" else TRTLLM_RANK_LIMIT
        if tree.num_nodes and _first_rank_at_or_above(tree, limit) is not None:
            profile = _needs_profile("--refit-ranks re-searches the tree", profile)
            tree = refit_ranks(tree, profile, limit)
            which += f", re-searched on the bundle's profile with ranks below {limit}"
    if fmt == "medusa":
        problem = medusa_problem(tree)
        if problem is not None:
            raise EntmtpError(problem)
        header = ExportHeader(name, which, tree.num_nodes, fmt)
        path = write_medusa_choices(tree, out_path, header=header)
        sidecar = None if Path(out_path).suffix == ".py" else sidecar_path(out_path)
        return ExportResult(path, header, sidecar)
    if fmt == "trtllm":
        problem = trtllm_problem(tree)
        if problem is not None:
            raise EntmtpError(problem)
        header = ExportHeader(name, which, tree.num_nodes, fmt, trtllm_notes(tree))
        gap = trtllm_python_runtime_gap(tree)
        path = write_trtllm_choices(tree, out_path, header)
        sidecar = sidecar_path(out_path) if Path(out_path).suffix.lower() == ".json" else None
        return ExportResult(path, header, sidecar, () if gap is None else (gap,))
    tree_to_write = _vllm_ready(tree, largest_regular_subtree=largest_regular_subtree)
    if tree_to_write != tree:
        which += ", cut to its largest level-regular subtree"
    header = ExportHeader(name, which, tree_to_write.num_nodes, fmt, vllm_tree_notes())
    path, sidecar = _write_vllm(out_path, vllm_config(tree_to_write), header, tree=True)
    return ExportResult(path, header, sidecar)


def _export_chain(
    bundle: Bundle,
    out_path: str | os.PathLike,
    tree_index: int | None,
    profile: Profile | None,
    latency: LatencyModel | None,
    name: str,
) -> ExportResult:
    if tree_index is not None:
        raise EntmtpError("vllm-chain searches its own chain on the profile: drop --tree")
    profile = _needs_profile("vllm-chain searches the best chain", profile)
    latency = latency if latency is not None else bundle.latency
    if latency is None:
        raise EntmtpError(
            "vllm-chain replays chains under the bundle's latency model, which this bundle does "
            "not record: give the run folder (with latency.json)"
        )
    choice = best_chain(profile, latency)
    which = (f"the best chain for the bundle's profile and latency model "
             f"({choice.length} of {profile.num_heads} heads' top-1)")
    header = ExportHeader(name, which, choice.length, "vllm-chain",
                          vllm_chain_notes(choice, bundle.heads.type))
    warnings = ()
    if choice.plain_is_faster:
        warnings = (
            f"plain decoding ({choice.plain_tokens_per_second:.2f} tokens/s) beats every chain "
            f"on the bundle's latency model (best: {choice.tokens_per_second:.2f} tokens/s with "
            f"{choice.length}); serve without --speculative-config on that hardware",
        )
        header = ExportHeader(name, which, choice.length, "vllm-chain",
                              (*header.notes, f"warning: {warnings[0]}"))
    config = vllm_chain_config(choice, bundle.heads.type)
    path, sidecar = _write_vllm(out_path, config, header, tree=False)
    return ExportResult(path, header, sidecar, warnings)


def export(bundle: Bundle, fmt: str, out_path: str | os.PathLike, **options: Any) -> Path:
    """``export_bundle`` (same options) returning only the written file's path."""
    return export_bundle(bundle, fmt, out_path, **options).path
