"""Draft trees as prefix-closed sets of rank paths, and the buffers a runtime needs.

A path ``(r_1, ..., r_d)`` names the node at depth ``d`` whose token is head ``j``'s
rank-``r_j`` candidate at each depth ``j`` along the way (Medusa's ``medusa_choices`` notation).
The root (depth 0) is the base model's own pending token and is not listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from entmtp.core import EntmtpError, parse_json

Path = tuple[int, ...]


def _canonical_key(path: Path) -> tuple[int, Path]:
    return (len(path), path)


def check_paths(
    paths: object,
    *,
    topk: int | Sequence[int] | None = None,
    num_heads: int | None = None,
    prefix_closed: bool = True,
    where: str = "tree paths",
) -> list[Path]:
    """``paths`` as rank tuples, in their given order, if they can make a draft tree.

    Each path is a non-empty list of integer ranks >= 0, listed once, no deeper than
    ``num_heads`` and each rank below its head's ``topk`` (when given), with every ancestor
    listed too when ``prefix_closed``. Otherwise one ``EntmtpError`` line
    ``"{where}[j]: <problem>: <fix>"`` naming the first bad path by its index in ``paths``; a
    file reader passes its file and field as ``where``.
    """
    bound = _topk_bound(topk)
    _check_num_heads(num_heads)
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
        raise EntmtpError(f"{where}: must be a list of lists of ranks, got {paths!r}")
    seen: dict[Path, int] = {}
    for j, raw in enumerate(paths):
        path = _as_path(raw, f"{where}[{j}]")
        problem = _fit_problem(path, bound, num_heads)
        if problem is not None:
            raise EntmtpError(f"{where}[{j}]: {problem}")
        if path in seen:
            raise EntmtpError(
                f"{where}[{j}]: {list(path)} repeats paths[{seen[path]}]: remove duplicates"
            )
        seen[path] = j
    if prefix_closed:
        for path, j in seen.items():
            for d in range(1, len(path)):
                if path[:d] not in seen:
                    raise EntmtpError(
                        f"{where}[{j}]: {list(path)} misses its ancestor {list(path[:d])}: "
                        "trees must be prefix-closed, add it"
                    )
    return list(seen)


def _as_path(raw: object, where: str) -> Path:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable):
        raise EntmtpError(f"{where}: {raw!r} is not a list of ranks")
    path = []
    for rank in raw:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise EntmtpError(f"{where}: {raw!r} has rank {rank!r}: ranks must be integers")
        path.append(int(rank))
    if not path:
        raise EntmtpError(f"{where}: [] is empty: the root is implied, list only nodes")
    if any(r < 0 for r in path):
        raise EntmtpError(f"{where}: {path} has a negative rank: ranks count from 0")
    return tuple(path)


def _fit_problem(path: Path, topk: int | list[int] | None, num_heads: int | None) -> str | None:
    """What keeps the heads from drafting ``path``, or None. ``topk`` as ``_topk_bound``."""
    if num_heads is not None and len(path) > num_heads:
        return f"{list(path)} has depth {len(path)} but there are only {num_heads} heads"
    if topk is None:
        return None
    if isinstance(topk, list) and len(path) > len(topk):
        return (
            f"{list(path)} has depth {len(path)} but topk lists only {len(topk)} heads: give "
            "one top-k per head"
        )
    for depth, rank in enumerate(path):
        k = topk if isinstance(topk, int) else topk[depth]
        if rank >= k:
            return (
                f"rank {rank} >= top-k {k} in {list(path)} (head {depth + 1} drafts only its "
                f"top-{k})"
            )
    return None


def _topk_bound(topk: int | Sequence[int] | None) -> int | list[int] | None:
    """``topk`` checked (each >= 1): one int for every head, or a list with one per head."""
    if topk is None:
        return None
    if isinstance(topk, (int, np.integer)):
        if topk < 1:
            raise EntmtpError(f"topk must be >= 1, got {topk}")
        return int(topk)
    ks = [int(k) for k in topk]
    if any(k < 1 for k in ks):
        raise EntmtpError(f"every head's topk must be >= 1, got {ks}")
    return ks


def _check_num_heads(num_heads: int | None) -> None:
    if num_heads is not None and num_heads < 0:
        raise EntmtpError(f"num_heads must be >= 0, got {num_heads}")


@dataclass(frozen=True)
class TreeBuffers:
    """Index tensors for one verification step over ``num_nodes + 1`` tokens (root first).

    Row/column 0 is the root; rows follow the tree's canonical node order.
    """

    attention_mask: np.ndarray  # [n+1, n+1] bool: node attends to itself and its ancestors
    position_ids: np.ndarray  # [n+1] int64: depth of each node (add the root's position)
    tree_indices: np.ndarray  # [n+1] int64: index into [root, head1 top-k, head2 top-k, ...]
    retrieve_indices: np.ndarray  # [leaves, depth+1] int64: root-to-leaf rows, padded with -1
    parents: np.ndarray  # [n+1] int64: parent node index, -1 for the root
    depths: np.ndarray  # [n+1] int64: same values as position_ids
    ranks: np.ndarray  # [n+1] int64: last rank of each node's path, -1 for the root


@dataclass(frozen=True)
class Tree:
    """An immutable, validated, canonically ordered draft tree."""

    paths: tuple[Path, ...]
    _index: dict[Path, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {p: i + 1 for i, p in enumerate(self.paths)})

    @classmethod
    def from_paths(
        cls,
        paths: Iterable[Sequence[int]],
        *,
        implied_prefixes: bool = False,
        topk: int | Sequence[int] | None = None,
        num_heads: int | None = None,
        where: str = "tree paths",
    ) -> Tree:
        """Validate ``paths`` and return the tree in canonical (depth, lexicographic) order.

        ``implied_prefixes=True`` adds missing ancestors (as TensorRT-LLM accepts); otherwise a
        missing ancestor is an error. ``topk`` (one int, or one per head) and ``num_heads`` bound
        the ranks and the depth when given. ``where`` names the paths in error messages (a
        reader passes its file and field); see ``check_paths``.
        """
        seen = set(
            check_paths(paths, topk=topk, num_heads=num_heads,
                        prefix_closed=not implied_prefixes, where=where)
        )
        if implied_prefixes:
            seen.update(path[:d] for path in list(seen) for d in range(1, len(path)))
        return cls(tuple(sorted(seen, key=_canonical_key)))

    def check_fits(
        self, *, topk: int | Sequence[int] | None = None, num_heads: int | None = None
    ) -> None:
        """Raise ``EntmtpError`` if the tree is deeper than ``num_heads`` or a rank >= top-k."""
        bound = _topk_bound(topk)
        _check_num_heads(num_heads)
        for j, path in enumerate(self.paths):
            problem = _fit_problem(path, bound, num_heads)
            if problem is not None:
                raise EntmtpError(f"tree paths[{j}]: {problem}")

    # -- shape ---------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def widths(self) -> tuple[int, ...]:
        """Number of nodes at each depth 1..depth."""
        counts = [0] * self.depth
        for path in self.paths:
            counts[len(path) - 1] += 1
        return tuple(counts)

    @property
    def min_topk(self) -> int:
        """The top-k every head must return to draft this tree: its largest rank + 1."""
        return max((p[-1] + 1 for p in self.paths), default=0)

    def index(self, path: Sequence[int]) -> int:
        """Node index of ``path`` (1-based; 0 is the root)."""
        return self._index[tuple(path)]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, (tuple, list)) and tuple(path) in self._index

    def __len__(self) -> int:
        return len(self.paths)

    # -- serialization ---------------------------------------------------------------------
    def to_json(self) -> list[list[int]]:
        return [list(p) for p in self.paths]

    @classmethod
    def from_json(cls, obj: object, **kwargs) -> Tree:
        if isinstance(obj, str):
            obj = parse_json(obj, source="tree JSON", expect=(list, dict),
                             fix="give a JSON list of paths such as [[0], [0, 1], [1]]")
        if isinstance(obj, dict):
            obj = obj.get("paths", obj.get("medusa_choices"))
        return cls.from_paths(obj, **kwargs)  # type: ignore[arg-type]

    # -- runtime buffers -------------------------------------------------------------------
    @cached_property
    def _structure(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = self.num_nodes
        parents = np.full(n + 1, -1, dtype=np.int64)
        depths = np.zeros(n + 1, dtype=np.int64)
        ranks = np.full(n + 1, -1, dtype=np.int64)
        for i, path in enumerate(self.paths, start=1):
            parents[i] = self._index[path[:-1]] if len(path) > 1 else 0
            depths[i] = len(path)
            ranks[i] = path[-1]
        return parents, depths, ranks

    def buffers(self, topk: int | Sequence[int]) -> TreeBuffers:
        """Attention mask, position ids, tree indices and retrieve indices for a runtime.

        ``topk`` is the number of candidates each head drafts (one int, or one per head); it sets
        the layout of the flat candidate list ``[root, head1 top-k, head2 top-k, ...]``.
        """
        self.check_fits(topk=topk)
        parents, depths, ranks = self._structure
        n = self.num_nodes
        mask = np.zeros((n + 1, n + 1), dtype=bool)
        mask[0, 0] = True
        # Canonical order lists every parent before its children: copy the parent's row, add self.
        for level in range(1, self.depth + 1):
            nodes = np.flatnonzero(depths == level)
            mask[nodes] = mask[parents[nodes]]
            mask[nodes, nodes] = True
        ks = _per_depth_topk(topk, self.depth)
        offsets = np.concatenate([[1], 1 + np.cumsum(ks)]).astype(np.int64)
        tree_indices = np.zeros(n + 1, dtype=np.int64)
        tree_indices[1:] = offsets[depths[1:] - 1] + ranks[1:]
        has_child = np.zeros(n + 1, dtype=bool)
        has_child[parents[1:]] = True
        leaves = np.flatnonzero(~has_child)
        retrieve = np.full((len(leaves), self.depth + 1), -1, dtype=np.int64)
        # Walk all leaves up at once: column d holds the ancestor at depth d.
        current = leaves.copy()
        for level in range(self.depth, -1, -1):
            at_level = depths[current] == level
            retrieve[at_level, level] = current[at_level]
            current = np.where(at_level & (current > 0), parents[current], current)
        return TreeBuffers(
            attention_mask=mask,
            position_ids=depths.copy(),
            tree_indices=tree_indices,
            retrieve_indices=retrieve,
            parents=parents.copy(),
            depths=depths.copy(),
            ranks=ranks.copy(),
        )

    def __repr__(self) -> str:
        return f"Tree(num_nodes={self.num_nodes}, depth={self.depth}, widths={list(self.widths)})"


def _per_depth_topk(topk: int | Sequence[int], depth: int) -> list[int]:
    """Top-k of heads 1..depth (or more), for a tree that ``check_fits(topk=topk)``."""
    bound = _topk_bound(topk)
    return [bound] * depth if isinstance(bound, int) else list(bound or ())
