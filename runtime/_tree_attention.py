"""Per-tree torch index tensors and the 4D attention mask of one verification forward.

A ``TreePlan`` is built once per (tree, top-k, device) and cached, so a decoding step does no
Python work per node: drafting, masking and acceptance all index these tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from entmtp.treesearch import Tree


@dataclass(frozen=True)
class TreePlan:
    """Index tensors for one tree over ``q = num_nodes + 1`` tokens (node 0 is the root)."""

    topk: tuple[int, ...]  # candidates drafted per depth 1..depth (the tree's ranks are below)
    max_topk: int
    num_nodes: int
    depth: int
    tree_mask: torch.Tensor  # [q, q] bool: node attends to itself and its ancestors
    depths: torch.Tensor  # [q] int64: node depth (add the root's position for position ids)
    parents: torch.Tensor  # [q] int64: parent node, 0 for the root (masked out by `ok[0]`)
    ranks: torch.Tensor  # [q] int64: last rank of each node's path, 0 for the root
    tree_indices: torch.Tensor  # [q] int64: index into [root, head1 top-k, head2 top-k, ...]
    node_head: torch.Tensor  # [q-1] int64: 0-based head (depth - 1) of nodes 1..n
    node_rank: torch.Tensor  # [q-1] int64: rank of nodes 1..n in their head's top-k
    ancestors: torch.Tensor  # [q, depth+1] int64: ancestor at each depth up to self, then 0
    retrieve: torch.Tensor  # [leaves, depth+1] int64: root-to-leaf node rows, padding -> 0
    retrieve_valid: torch.Tensor  # [leaves, depth+1] bool: False on padding
    level_nodes: tuple[torch.Tensor, ...]  # [depth+1] of [n_d] int64: nodes at each depth
    expand_nodes: tuple[torch.Tensor, ...]  # [depth] of [u_d] int64: depth-d nodes with children
    parent_slot: tuple[torch.Tensor, ...]  # [depth] of [n_{d+1}]: parent's row in expand_nodes[d]
    children: torch.Tensor  # [q, max_children] int64: children in rank order, -1 padding
    _masks: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        return self.num_nodes + 1

    def padded_tree_mask(self, width: int | None = None) -> torch.Tensor:
        """[w, w] bool: the tree mask padded to ``width`` >= q rows (None: q, the tree mask).

        Padding rows ``q..w-1`` attend to themselves only (and, through the cache, to the
        past); no tree row attends to a padding row, so padding changes no tree row's result.
        """
        width = self.size if width is None else int(width)
        if width == self.size:
            return self.tree_mask
        if width < self.size:
            raise ValueError(f"a tree of {self.size} tokens cannot run at width {width}")
        mask = self._masks.get(("bool", width))
        if mask is None:
            mask = torch.eye(width, dtype=torch.bool, device=self.tree_mask.device)
            mask[: self.size, : self.size] = self.tree_mask
            self._masks[("bool", width)] = mask
        return mask

    def float_tree_mask(self, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
        """[w, w] additive mask (``padded_tree_mask``; w = q by default): 0 where attention is
        allowed, dtype-min where it is blocked."""
        width = self.size if width is None else int(width)
        mask = self._masks.get((dtype, width))
        if mask is None:
            allowed = self.padded_tree_mask(width)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            mask.masked_fill_(~allowed, torch.finfo(dtype).min)
            self._masks[(dtype, width)] = mask
        return mask

    def attention_mask(self, past_len: int, dtype: torch.dtype, width: int | None = None
                       ) -> torch.Tensor:
        """[1, 1, w, past_len + w] additive mask (w = q by default, else the padded width):
        every past position allowed, tree part = ``float_tree_mask``."""
        tree_part = self.float_tree_mask(dtype, width)
        rows = tree_part.shape[0]
        mask = torch.zeros((1, 1, rows, past_len + rows), dtype=dtype, device=tree_part.device)
        mask[0, 0, :, past_len:] = tree_part
        return mask


def _build_plan(tree: Tree, topk: tuple[int, ...], device: torch.device) -> TreePlan:
    per_depth = topk * tree.depth if len(topk) == 1 else topk[: tree.depth]
    buffers = tree.buffers(list(per_depth) if tree.depth else 1)
    q = tree.num_nodes + 1
    depth = tree.depth
    parents = buffers.parents.copy()
    depths = buffers.depths
    ranks = buffers.ranks.copy()
    parents[0] = 0
    ranks[0] = 0

    # Canonical order lists parents first, so ancestors fill level by level from the parent row.
    ancestors = np.zeros((q, depth + 1), dtype=np.int64)
    for level in range(1, depth + 1):
        nodes = np.flatnonzero(depths == level)
        ancestors[nodes] = ancestors[parents[nodes]]
        ancestors[nodes, level] = nodes

    retrieve = buffers.retrieve_indices
    valid = retrieve >= 0
    level_nodes = [np.flatnonzero(depths == level) for level in range(depth + 1)]
    expand_nodes, parent_slot = [], []
    for level in range(depth):
        child_parents = parents[level_nodes[level + 1]]
        unique, slot = np.unique(child_parents, return_inverse=True)
        expand_nodes.append(unique)
        parent_slot.append(slot.astype(np.int64))

    counts = np.bincount(parents[1:], minlength=q) if q > 1 else np.zeros(q, dtype=np.int64)
    max_children = int(counts.max(initial=0))
    children = np.full((q, max(max_children, 1)), -1, dtype=np.int64)
    if q > 1:
        # Siblings appear in rank order within a level (canonical order is lexicographic).
        child_ids = np.arange(1, q)
        order = np.lexsort((ranks[1:], parents[1:]))
        sorted_parents = parents[1:][order]
        first = np.searchsorted(sorted_parents, sorted_parents, side="left")
        slots = np.arange(len(order)) - first
        children[sorted_parents, slots] = child_ids[order]

    def t(array: np.ndarray, dtype=torch.int64) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array), dtype=dtype, device=device)

    return TreePlan(
        topk=tuple(per_depth),
        max_topk=max(per_depth, default=1),
        num_nodes=tree.num_nodes,
        depth=depth,
        tree_mask=t(buffers.attention_mask, torch.bool),
        depths=t(depths),
        parents=t(parents),
        ranks=t(ranks),
        tree_indices=t(buffers.tree_indices),
        node_head=t(depths[1:] - 1),
        node_rank=t(ranks[1:]),
        ancestors=t(ancestors),
        retrieve=t(np.where(valid, retrieve, 0)),
        retrieve_valid=t(valid, torch.bool),
        level_nodes=tuple(t(nodes) for nodes in level_nodes),
        expand_nodes=tuple(t(nodes) for nodes in expand_nodes),
        parent_slot=tuple(t(slot) for slot in parent_slot),
        children=t(children),
    )


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tree_plan(
    tree: Tree, topk: int | Sequence[int], device: torch.device | str = "cpu"
) -> TreePlan:
    """The cached plan of ``tree`` for ``topk`` candidates per head (one int, or one per head)
    on ``device``. Raises ``EntmtpError`` if a rank of the tree is not below its head's top-k.

    Plans live as long as the tree object does (the cache holds the tree weakly).
    """
    device = torch.device(device)
    per_tree = _PLANS.get(tree)
    if per_tree is None:
        per_tree = {}
        _PLANS[tree] = per_tree
    ks = (int(topk),) if isinstance(topk, (int, np.integer)) else tuple(int(k) for k in topk)
    key = (ks, str(device))
    plan = per_tree.get(key)
    if plan is None:
        plan = _build_plan(tree, ks, device)
        per_tree[key] = plan
    return plan
