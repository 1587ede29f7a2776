"""Training examples: the positions of concatenated trajectories, each with the token ``d``
steps after it for every head ``d`` and the true prefix Hydra's head ``d`` reads there.

Head ``d`` at trajectory position ``s`` reads ``hidden[s]`` (and, for Hydra, the true prefix
``tokens[s : s + d]``: the root then the tokens above it) and learns ``tokens[s + d]``, exactly
the quantity the profiler ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from entmtp.core import EntmtpError

from ._trajectories import Trajectory


@dataclass
class _Examples:
    """Positions of concatenated trajectories with their per-head targets."""

    hidden: Tensor  # [M, H] all positions
    tokens: Tensor  # [M] all positions
    rows: Tensor  # [n] positions with at least one target
    targets: Tensor  # [n, num_heads] token d steps after the root, -1 past the trajectory end


def _examples(trajectories: Sequence[Trajectory], num_heads: int) -> _Examples:
    if not trajectories:
        raise EntmtpError("no trajectories: give prompts or texts to train or evaluate on")
    hidden = torch.cat([t.hidden for t in trajectories])
    tokens = torch.cat([t.tokens for t in trajectories]).long()
    lengths = torch.as_tensor([len(t) for t in trajectories])
    starts = torch.cumsum(lengths, 0) - lengths
    index = torch.arange(len(tokens))
    remaining = torch.repeat_interleave(starts + lengths, lengths) - 1 - index
    rows = index[remaining >= 1]
    depth = torch.arange(1, num_heads + 1)
    gather = _target_positions(rows, num_heads, len(tokens))
    targets = torch.where(depth <= remaining[rows, None], tokens[gather], -1)
    return _Examples(hidden=hidden, tokens=tokens, rows=rows, targets=targets)


def _target_positions(rows: Tensor, num_heads: int, length: int) -> Tensor:
    """[n, num_heads] position ``row + d`` of head d's target, clamped to the last of
    ``length`` positions (a target past its trajectory's end is -1 in ``_Examples.targets``)."""
    return (rows[:, None] + torch.arange(1, num_heads + 1)).clamp(max=length - 1)


def _prefixes(examples: _Examples, rows: Tensor, depth: int) -> Tensor:
    """[n, depth] root then true tokens above it (teacher forcing) for positions ``rows``."""
    return examples.tokens[rows[:, None] + torch.arange(depth)]

