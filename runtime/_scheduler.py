"""Which tree each decoding step verifies.

Entropy bookkeeping (the same as the offline replay): before the first step the scheduler has
seen ``H_0``, the entropy of the prefill's last logits. A step that accepts the path
root..leaf of depth ``d*`` then feeds the entropies of the logits at root, node 1, ..., leaf
(``d* + 1`` values) in order, so before drafting at the step whose pending token came from a
distribution with entropy ``H_i`` the estimator has consumed ``H_0 .. H_i``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from entmtp.treesearch._tree import Tree

if TYPE_CHECKING:
    from entmtp.treesearch._bundle import Bundle
    from entmtp.treesearch._schedule import Schedule


@dataclass(frozen=True)
class TreeChoice:
    index: int  # index of the tree in the scheduler's tree list
    tree: Tree
    estimate: float  # entropy estimate the choice was made from (nan for a static tree)


class Scheduler(Protocol):
    trees: tuple[Tree, ...]

    def reset(self) -> None: ...

    def observe(self, entropies: Sequence[float]) -> None: ...

    def choose(self) -> TreeChoice: ...


class StaticScheduler:
    """The same tree at every step."""

    def __init__(self, tree: Tree) -> None:
        self.trees = (tree,)
        self._choice = TreeChoice(0, tree, math.nan)

    def reset(self) -> None:
        pass

    def observe(self, entropies: Sequence[float]) -> None:
        pass

    def choose(self) -> TreeChoice:
        return self._choice


class BundleScheduler:
    """Entropy-switched trees: ``schedule.tree_index(estimate)`` picks from ``schedule.trees``.

    ``schedule`` is a treesearch ``Schedule`` (trees, thresholds in nats, estimator); its
    estimator's ``new_state()`` is used as is, so the live estimate is the one the offline replay
    computes from the same entropies (nats, as ``entropy_from_logits`` measures them).
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.trees = tuple(
            t if isinstance(t, Tree) else Tree.from_paths(t) for t in schedule.trees
        )
        self._state = None

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> BundleScheduler:
        """The schedule a treesearch ``Bundle`` ships: ``bundle.schedule()``, in nats."""
        return cls(bundle.schedule())

    def reset(self) -> None:
        self._state = self.schedule.estimator.new_state()

    def observe(self, entropies: Sequence[float]) -> None:
        if self._state is None:
            self.reset()
        self._state.update(entropies)

    def choose(self) -> TreeChoice:
        if self._state is None:
            self.reset()
        estimate = float(self._state.value)
        index = int(self.schedule.tree_index(estimate))
        return TreeChoice(index, self.trees[index], estimate)
