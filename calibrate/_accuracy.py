"""How well heads predict: where the true future token ranks in each head at every position of
cached trajectories (over the full vocabulary, or the heads' draft vocabulary; Hydra fed the
true prefix), and the top-1 / top-5 accuracy and replayed accept length those ranks give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from entmtp.core import EntmtpError
from entmtp.model import DraftHeads, topk_ranks
from entmtp.treesearch import Tree, expected_accept_length

from ._head_examples import _examples, _prefixes
from ._trajectories import Trajectory


@dataclass
class HeadAccuracy:
    depth: int  # head d predicts the token d steps after the root
    top1: float
    top5: float
    positions: int


def accuracy_table(rows: dict[str, list[HeadAccuracy]]) -> str:
    """Markdown table: one row per label, top-1 / top-5 per head."""
    depths = sorted({acc.depth for accs in rows.values() for acc in accs})
    header = "| data | positions | " + " | ".join(f"head {d} top-1 / top-5" for d in depths) + " |"
    lines = [header, "|" + "---|" * (len(depths) + 2)]
    for label, accs in rows.items():
        by_depth = {acc.depth: acc for acc in accs}
        cells = [
            f"{by_depth[d].top1:.3f} / {by_depth[d].top5:.3f}" if d in by_depth else "-"
            for d in depths
        ]
        positions = by_depth[depths[0]].positions if depths and depths[0] in by_depth else 0
        lines.append(f"| {label} | {positions} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class HeadRanks:
    """Where the true future token ranks in each head, at every scored position."""

    ranks: np.ndarray  # [positions, num_heads] int16: rank in the head's top-k, -1 outside it
    scored: np.ndarray  # [positions, num_heads] bool: the token d steps after the root exists
    topk: int  # how deep each head's ranking went

    @staticmethod
    def concat(parts: Sequence[HeadRanks]) -> HeadRanks:
        return HeadRanks(np.concatenate([p.ranks for p in parts]),
                         np.concatenate([p.scored for p in parts]),
                         min(p.topk for p in parts))

    def accuracy(self) -> list[HeadAccuracy]:
        """Top-1 / top-5 of each head over its scored positions."""
        if self.topk < 5:
            raise EntmtpError(f"top-5 accuracy needs ranks to top-5, these go to top-{self.topk}")
        result = []
        for d in range(self.ranks.shape[1]):
            ranks = self.ranks[self.scored[:, d], d]
            total = len(ranks)
            result.append(HeadAccuracy(
                depth=d + 1,
                top1=float((ranks == 0).sum()) / total if total else float("nan"),
                top5=float(((ranks >= 0) & (ranks < 5)).sum()) / total if total else float("nan"),
                positions=total,
            ))
        return result

    def accept_length(self, tree: Tree) -> float:
        """The tree's mean accept length replayed on these positions (tokens per step)."""
        if tree.min_topk > self.topk:
            raise EntmtpError(f"ranks were taken to top-{self.topk}, the tree needs "
                              f"top-{tree.min_topk}: rank again with a larger topk")
        return expected_accept_length(tree, self.ranks)


@torch.inference_mode()
def head_ranks(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    topk: int = 5,
    batch_size: int = 512,
) -> HeadRanks:
    """Rank of the true token ``d`` steps after the root in head ``d``'s top-k over its draft
    vocabulary (the whole vocabulary without one; Hydra fed the true prefix), at every position
    with at least one future token: the ranks a profile records, so that a tree's accept length
    replays on them (``treesearch.expected_accept_length``)."""
    examples = _examples(trajectories, heads.num_heads)
    device, dtype = heads.device, heads.dtype
    ranks = torch.full(examples.targets.shape, -1, dtype=torch.int16)
    for start in range(0, len(examples.rows), batch_size):
        rows = examples.rows[start:start + batch_size]
        hidden = examples.hidden[rows].to(device, dtype)
        for depth in range(1, heads.num_heads + 1):
            target = examples.targets[start:start + batch_size, depth - 1]
            valid = target >= 0
            if not bool(valid.any()):
                continue
            prefix = _prefixes(examples, rows[valid], depth).to(device)
            logits = heads.head_logits(depth, hidden[valid], prefix)
            columns = heads.draft_columns(target[valid].to(device))
            found = topk_ranks(logits, columns, topk).cpu().to(torch.int16)
            ranks[start + torch.nonzero(valid)[:, 0], depth - 1] = found
    return HeadRanks(ranks.numpy(), (examples.targets >= 0).numpy(), topk)


def head_accuracy(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    batch_size: int = 512,
) -> list[HeadAccuracy]:
    """Per-head top-1 / top-5 accuracy over the full vocabulary (Hydra: true prefix)."""
    return head_ranks(heads, trajectories, topk=5, batch_size=batch_size).accuracy()

