"""Acceptance models: exact replay, empirical prefix probabilities, entropy-bucketed rank tables,
and Medusa's per-head independence model (to measure how far it is from the empirical one).

A step at position ``t`` accepts the base model's own token plus the longest tree path whose
ranks equal the true ranks ``(r_1(t), ..., r_d(t))``: ``accepted = 1 + d*``. Over a set of
positions the expected accepted length of a tree ``T`` is ``1 + sum_{v in T} P(prefix(r) == v)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from entmtp.core import EntmtpError

from ._tree import Path, Tree

ACCEPTANCE_TABLE_FORMAT = "entmtp-acceptance-table"


# -- exact replay --------------------------------------------------------------------------
def _child_table(tree: Tree, depth: int) -> np.ndarray:
    """children[node, rank] = node index of ``path(node) + (rank,)`` in ``tree``, or -1."""
    widest = max((p[-1] for p in tree.paths if len(p) <= depth), default=0) + 1
    children = np.full((tree.num_nodes + 1, widest), -1, dtype=np.int64)
    for i, path in enumerate(tree.paths, start=1):
        if len(path) <= depth:
            parent = tree.index(path[:-1]) if len(path) > 1 else 0
            children[parent, path[-1]] = i
    return children


def accept_lengths(tree: Tree, ranks: np.ndarray) -> np.ndarray:
    """Tokens accepted by a step at each position: ``1 + d*`` as an int64 array [positions]."""
    ranks = np.asarray(ranks)
    if ranks.ndim != 2:
        raise EntmtpError(f"ranks must be a 2-D array [positions, heads], got shape {ranks.shape}")
    positions = ranks.shape[0]
    depth = min(tree.depth, ranks.shape[1])
    accepted = np.ones(positions, dtype=np.int64)
    if depth == 0 or positions == 0:
        return accepted
    children = _child_table(tree, depth)
    widest = children.shape[1]
    # Walk every position down the tree at once; node -1 means the walk stopped.
    node = np.zeros(positions, dtype=np.int64)
    for d in range(depth):
        rank = ranks[:, d].astype(np.int64)
        live = (node >= 0) & (rank >= 0) & (rank < widest)
        nxt = np.full(positions, -1, dtype=np.int64)
        nxt[live] = children[node[live], rank[live]]
        node = nxt
        accepted += node >= 0
    return accepted


def expected_accept_length(tree: Tree, ranks: np.ndarray) -> float:
    """Mean accepted tokens per step over the positions of ``ranks`` (empirical prefix model)."""
    ranks = np.asarray(ranks)
    if ranks.shape[0] == 0:
        return 1.0
    return float(accept_lengths(tree, ranks).mean())


# -- empirical prefix probabilities ---------------------------------------------------------
def _per_depth_limits(topk: int | Sequence[int] | None, depth: int) -> np.ndarray | None:
    if topk is None:
        return None
    if isinstance(topk, (int, np.integer)):
        ks = [int(topk)] * depth
    else:
        ks = [int(k) for k in topk]
        if len(ks) < depth:
            raise EntmtpError(
                f"topk lists {len(ks)} heads but {depth} are used: give one top-k per head"
            )
    if any(k < 1 for k in ks[:depth]):
        raise EntmtpError(f"topk must be >= 1, got {topk}")
    return np.asarray(ks[:depth], dtype=np.int64)


def _check_ranks(ranks: np.ndarray) -> np.ndarray:
    ranks = np.asarray(ranks)
    if ranks.ndim != 2:
        raise EntmtpError(f"ranks must be a 2-D array [positions, heads], got shape {ranks.shape}")
    if ranks.size and not np.issubdtype(ranks.dtype, np.integer):
        raise EntmtpError(f"ranks must be integers (-1 = miss), got dtype {ranks.dtype}")
    return ranks.astype(np.int64, copy=False)


@dataclass(frozen=True)
class PrefixTable:
    """Every rank prefix observed at least once, in greedy order.

    Rows are sorted by (count descending, depth, lexicographic path). Because a prefix is never
    more frequent than its parent, every parent comes before its children, so the first ``n``
    rows of the table are a prefix-closed tree: the most probable ``n``-node tree.
    """

    paths: np.ndarray  # [m, max_depth] int64: rank path, padded with -1 past its depth
    depths: np.ndarray  # [m] int64: path length (1..max_depth)
    counts: np.ndarray  # [m] int64: positions whose true rank prefix equals the path
    parents: np.ndarray  # [m] int64: row of the parent prefix, -1 at depth 1
    num_positions: int  # positions the counts are out of (misses included)

    @property
    def num_prefixes(self) -> int:
        return int(len(self.counts))

    @property
    def max_depth(self) -> int:
        return int(self.paths.shape[1])

    @property
    def probabilities(self) -> np.ndarray:
        """[m] float64: P(true prefix == path)."""
        return self.counts / max(self.num_positions, 1)

    def path(self, row: int) -> Path:
        return tuple(int(r) for r in self.paths[row, : self.depths[row]])

    def expected_accept_length(self, rows: np.ndarray | Sequence[int]) -> float:
        """``1 + sum P(v)`` over the given rows (which must form a prefix-closed tree).

        Computed as (positions + integer total) / positions so that every route to the same tree
        gives the same float.
        """
        if self.num_positions == 0:
            return 1.0
        total = int(self.counts[np.asarray(rows, dtype=np.int64)].sum())
        return (self.num_positions + total) / self.num_positions

    def as_dict(self) -> dict[Path, float]:
        probs = self.probabilities
        return {self.path(i): float(probs[i]) for i in range(self.num_prefixes)}


def prefix_table(
    ranks: np.ndarray,
    *,
    max_depth: int | None = None,
    topk: int | Sequence[int] | None = None,
) -> PrefixTable:
    """Count every observed rank prefix of ``ranks`` [positions, heads] (-1 = miss).

    ``max_depth`` caps the prefix length (default: all heads); ``topk`` (one int or one per head)
    treats ranks at or beyond it as misses, as a head that drafts only its top-k would.
    """
    ranks = _check_ranks(ranks)
    positions, heads = ranks.shape
    depth = heads if max_depth is None else min(int(max_depth), heads)
    if depth < 0:
        raise EntmtpError(f"max_depth must be >= 0, got {max_depth}")
    ranks = ranks[:, :depth]
    valid = ranks >= 0
    limits = _per_depth_limits(topk, depth)
    if limits is not None:
        valid &= ranks < limits
    alive = np.logical_and.accumulate(valid, axis=1) if depth else valid
    width = int(ranks.max(initial=0)) + 1

    level_paths, level_counts, level_parents = [], [], []
    offset = 0
    previous_offset = -1
    group = np.zeros(positions, dtype=np.int64)  # index of each position's prefix at depth d-1
    prev_paths = np.zeros((1, 0), dtype=np.int64)
    for d in range(depth):
        live = alive[:, d]
        # Group ids stay below the number of positions, so this key never overflows.
        key = group[live] * width + ranks[live, d]
        unique, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        parent_local, rank = np.divmod(unique, width)
        paths = np.concatenate([prev_paths[parent_local], rank[:, None]], axis=1)
        level_paths.append(paths)
        level_counts.append(counts)
        level_parents.append(parent_local + previous_offset if d else np.full(len(unique), -1))
        group = np.zeros(positions, dtype=np.int64)
        group[live] = inverse
        prev_paths = paths
        previous_offset = offset
        offset += len(unique)

    padded = np.full((offset, depth), -1, dtype=np.int64)
    depths = np.zeros(offset, dtype=np.int64)
    start = 0
    for d, paths in enumerate(level_paths):
        padded[start : start + len(paths), : d + 1] = paths
        depths[start : start + len(paths)] = d + 1
        start += len(paths)
    counts = np.concatenate(level_counts) if level_counts else np.zeros(0, dtype=np.int64)
    parents = np.concatenate(level_parents) if level_parents else np.zeros(0, dtype=np.int64)
    # Rows are already in (depth, lexicographic) order, so a stable sort on -count finishes it.
    order = np.argsort(-counts, kind="stable")
    new_row = np.empty(offset, dtype=np.int64)
    new_row[order] = np.arange(offset)
    parents = parents[order]
    parents = np.where(parents >= 0, new_row[np.maximum(parents, 0)], -1)
    return PrefixTable(
        paths=padded[order],
        depths=depths[order],
        counts=counts[order].astype(np.int64),
        parents=parents.astype(np.int64),
        num_positions=int(positions),
    )


def prefix_probabilities(
    ranks: np.ndarray,
    *,
    max_depth: int | None = None,
    topk: int | Sequence[int] | None = None,
) -> dict[Path, float]:
    """P(true rank prefix == path) for every observed path; see ``prefix_table`` (compact form)."""
    return prefix_table(ranks, max_depth=max_depth, topk=topk).as_dict()


# -- entropy buckets -----------------------------------------------------------------------
def entropy_bucket_edges(entropy: np.ndarray, num_buckets: int) -> np.ndarray:
    """Quantile edges that split ``entropy`` into ``num_buckets`` buckets of similar size.

    Edges are observed entropy values (so no bucket is empty), strictly increasing, and greater
    than the minimum (so bucket 0 is not empty). With many tied values, fewer than
    ``num_buckets - 1`` edges come back.
    """
    if int(num_buckets) < 1:
        raise EntmtpError(f"num_buckets must be >= 1, got {num_buckets}")
    entropy = np.asarray(entropy, dtype=np.float64).ravel()
    if entropy.size == 0:
        raise EntmtpError("no entropies to split into buckets: the profile is empty")
    if not np.all(np.isfinite(entropy)):
        raise EntmtpError("entropy contains NaN or infinite values: re-run the profiler")
    quantiles = np.arange(1, int(num_buckets)) / int(num_buckets)
    edges = np.unique(np.quantile(entropy, quantiles, method="higher"))
    return edges[edges > entropy.min()]


def bucket_of(entropy: np.ndarray | float, edges: np.ndarray | Sequence[float]) -> np.ndarray:
    """Bucket index of each entropy: bucket ``i`` holds ``[edges[i-1], edges[i])``."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), entropy, side="right")


# -- per-bucket, per-head rank tables ------------------------------------------------------
def head_rank_probabilities(ranks: np.ndarray, *, topk: int) -> np.ndarray:
    """[heads, topk] float64: P(rank_j == r) per head over all positions (misses elsewhere)."""
    ranks = _check_ranks(ranks)
    positions, heads = ranks.shape
    probs = np.zeros((heads, int(topk)), dtype=np.float64)
    if positions == 0:
        return probs
    for j in range(heads):
        column = ranks[:, j]
        hit = column[(column >= 0) & (column < topk)]
        probs[j] = np.bincount(hit, minlength=int(topk)) / positions
    return probs


@dataclass(frozen=True)
class AcceptanceTable:
    """Per entropy bucket and head: the distribution of the true token's rank in the top-k."""

    edges: np.ndarray  # [buckets-1] float64: bucket i holds entropies in [edges[i-1], edges[i])
    counts: np.ndarray  # [buckets] int64: positions in each bucket
    rank_probs: np.ndarray  # [buckets, heads, topk] float64: P(rank_j == r); rest is a miss
    mean_entropy: np.ndarray  # [buckets] float64: NaN for an empty bucket

    @property
    def num_buckets(self) -> int:
        return int(len(self.counts))

    @property
    def num_heads(self) -> int:
        return int(self.rank_probs.shape[1])

    @property
    def topk(self) -> int:
        return int(self.rank_probs.shape[2])

    @property
    def topk_acceptance(self) -> np.ndarray:
        """[buckets, heads, topk]: P(rank_j < r + 1), the chance the token is in the top-(r+1)."""
        return np.cumsum(self.rank_probs, axis=2)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ACCEPTANCE_TABLE_FORMAT,
            "edges": [float(e) for e in self.edges],
            "counts": [int(c) for c in self.counts],
            "mean_entropy": [None if np.isnan(m) else float(m) for m in self.mean_entropy],
            "rank_probs": self.rank_probs.tolist(),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AcceptanceTable:
        if not isinstance(obj, dict) or obj.get("format") != ACCEPTANCE_TABLE_FORMAT:
            raise EntmtpError(f"not an entmtp acceptance table (expected format "
                              f"{ACCEPTANCE_TABLE_FORMAT!r})")
        try:
            edges = np.asarray(obj["edges"], dtype=np.float64).reshape(-1)
            counts = np.asarray(obj["counts"], dtype=np.int64).reshape(-1)
            mean = np.asarray(
                [np.nan if m is None else m for m in obj["mean_entropy"]], dtype=np.float64
            )
            probs = np.asarray(obj["rank_probs"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as err:
            raise EntmtpError(
                f"acceptance table JSON is missing or has a bad field: {err}"
            ) from err
        buckets = len(counts)
        if (
            len(edges) != buckets - 1
            or len(mean) != buckets
            or probs.ndim != 3
            or probs.shape[0] != buckets
        ):
            raise EntmtpError("acceptance table JSON has inconsistent bucket counts")
        return cls(edges=edges, counts=counts, rank_probs=probs, mean_entropy=mean)

    def format(self) -> str:
        """A plain-text table: per bucket and head, top-1 / top-3 / top-k acceptance."""
        columns = sorted({1, min(3, self.topk), self.topk})
        cumulative = self.topk_acceptance
        total = max(int(self.counts.sum()), 1)
        lines = []
        for b in range(self.num_buckets):
            low = "-inf" if b == 0 else f"{self.edges[b - 1]:.3f}"
            high = "inf" if b == self.num_buckets - 1 else f"{self.edges[b]:.3f}"
            mean = self.mean_entropy[b]
            mean_text = "-" if np.isnan(mean) else f"{mean:.3f}"
            lines.append(
                f"bucket {b}: entropy [{low}, {high}) nats, {int(self.counts[b])} positions "
                f"({100.0 * self.counts[b] / total:.1f}%), mean entropy {mean_text}"
            )
            header = "  head" + "".join(f"{'top-' + str(k):>9}" for k in columns) + f"{'miss':>9}"
            lines.append(header)
            for j in range(self.num_heads):
                cells = "".join(f"{cumulative[b, j, k - 1]:>9.3f}" for k in columns)
                miss = 1.0 - cumulative[b, j, -1]
                lines.append(f"  {j + 1:>4}{cells}{miss:>9.3f}")
        return "\n".join(lines)


def acceptance_table(
    entropy: np.ndarray,
    ranks: np.ndarray,
    *,
    topk: int,
    edges: np.ndarray | Sequence[float] | None = None,
    num_buckets: int = 4,
) -> AcceptanceTable:
    """Rank distributions per entropy bucket; ``edges`` default to ``num_buckets`` quantiles."""
    entropy = np.asarray(entropy, dtype=np.float64).ravel()
    ranks = _check_ranks(ranks)
    if len(entropy) != len(ranks):
        raise EntmtpError(f"{len(entropy)} entropies but {len(ranks)} rank rows")
    if int(topk) < 1:
        raise EntmtpError(f"topk must be >= 1, got {topk}")
    topk = int(topk)
    if edges is None:
        edges = entropy_bucket_edges(entropy, num_buckets)
    edges = np.asarray(edges, dtype=np.float64).ravel()
    if np.any(np.diff(edges) <= 0):
        raise EntmtpError(f"bucket edges must be strictly increasing, got {edges.tolist()}")
    buckets = len(edges) + 1
    heads = ranks.shape[1]
    which = bucket_of(entropy, edges)
    counts = np.bincount(which, minlength=buckets).astype(np.int64)
    sums = np.bincount(which, weights=entropy, minlength=buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    hits = np.zeros((buckets, heads, topk), dtype=np.float64)
    for j in range(heads):
        column = ranks[:, j]
        keep = (column >= 0) & (column < topk)
        flat = which[keep] * topk + column[keep]
        hits[:, j, :] = np.bincount(flat, minlength=buckets * topk).reshape(buckets, topk)
    probs = hits / np.maximum(counts, 1)[:, None, None]
    return AcceptanceTable(edges=edges, counts=counts, rank_probs=probs, mean_entropy=mean)


# -- Medusa's independence model -----------------------------------------------------------
def independence_expected_accept_length(tree: Tree, rank_probs_per_head: np.ndarray) -> float:
    """``1 + sum_{v in T} prod_j p_j(v_j)``: heads treated as independent (Medusa's builder).

    ``rank_probs_per_head`` is [heads, topk] with ``p_j(r) = P(rank_j == r)``; a rank past its
    width has probability 0.
    """
    probs = np.asarray(rank_probs_per_head, dtype=np.float64)
    if probs.ndim != 2:
        raise EntmtpError("rank_probs_per_head must be a 2-D array [heads, topk]")
    if tree.depth > probs.shape[0]:
        raise EntmtpError(
            f"tree has depth {tree.depth} but rank probabilities cover {probs.shape[0]} heads"
        )
    node_prob: dict[Path, float] = {(): 1.0}
    total = 0.0
    for path in tree.paths:  # canonical order: parents first
        rank = path[-1]
        p = probs[len(path) - 1, rank] if rank < probs.shape[1] else 0.0
        node_prob[path] = node_prob[path[:-1]] * float(p)
        total += node_prob[path]
    return 1.0 + total


def independence_error(tree: Tree, ranks: np.ndarray, topk: int) -> dict[str, float]:
    """Empirical vs independence-model expected accept length of ``tree`` on ``ranks``.

    ``relative_error = (independence - empirical) / empirical``; positive means the
    independence model is optimistic.
    """
    ranks = _check_ranks(ranks)
    clipped = np.where(ranks < topk, ranks, -1)
    empirical = expected_accept_length(tree, clipped)
    independent = independence_expected_accept_length(
        tree, head_rank_probabilities(clipped, topk=topk)
    )
    return {
        "positions": float(len(ranks)),
        "empirical": empirical,
        "independence": independent,
        "absolute_error": independent - empirical,
        "relative_error": (independent - empirical) / empirical,
    }
