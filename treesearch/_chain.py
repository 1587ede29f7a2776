"""The best chain for a runtime that drafts ``num_speculative_tokens`` tokens in a row.

A chain of length ``L`` is the tree ``[0], [0, 0], ..., [0] * L``: every head's top-1 candidate,
each one under the previous. Runtimes without tree attention (current vLLM) draft only such a
chain, so the question is its length: the one whose replay over a profile, every step drafting
the chain, takes the least modelled time under a latency model (ties: the shorter chain).
Plain decoding is replayed too, so callers can say when no chain pays on that hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from entmtp.core import EntmtpError

from ._latency import LatencyModel
from ._profile import Profile
from ._replay import Replayer
from ._tree import Tree


def chain_tree(length: int) -> Tree:
    """``[[0], [0, 0], ...]`` with ``length`` nodes."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise EntmtpError(f"a chain length must be a non-negative integer, got {length!r}")
    return Tree(tuple((0,) * d for d in range(1, length + 1)))


@dataclass(frozen=True)
class ChainChoice:
    length: int  # num_speculative_tokens: nodes of the chain (>= 1)
    mean_accept_length: float  # replayed tokens per step, the base model's own token included
    tokens_per_second: float  # replayed decode rate under the latency model
    speedup_vs_autoregressive: float
    plain_tokens_per_second: float  # the same profile decoded without drafting

    @property
    def tree(self) -> Tree:
        return chain_tree(self.length)

    @property
    def plain_is_faster(self) -> bool:
        return self.plain_tokens_per_second > self.tokens_per_second


def best_chain(
    profile: Profile, latency: LatencyModel, *, max_length: int | None = None
) -> ChainChoice:
    """The chain of 1..``max_length`` nodes (default: one per head) that replays fastest."""
    heads = profile.num_heads
    longest = heads if max_length is None else min(max_length, heads)
    if longest < 1:
        raise EntmtpError(
            f"the profile has {heads} heads and the chain may have at most {max_length} nodes: "
            "a chain needs at least one head and one node"
        )
    trees = [chain_tree(n) for n in range(longest + 1)]  # index n: the chain of n nodes
    replayer = Replayer(profile, trees, latency)
    results = [replayer.static(n) for n in range(longest + 1)]
    length = min(range(1, longest + 1), key=lambda n: (results[n].time_ms, n))
    best = results[length]
    return ChainChoice(
        length=length,
        mean_accept_length=best.mean_accept_length,
        tokens_per_second=best.tokens_per_second,
        speedup_vs_autoregressive=best.speedup_vs_autoregressive,
        plain_tokens_per_second=results[0].tokens_per_second,
    )
