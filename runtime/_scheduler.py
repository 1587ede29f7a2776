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
from typing import Any, Protocol

from entmtp.treesearch._errors import EntmtpError
from entmtp.treesearch._tree import Tree


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

    ``schedule`` is a treesearch ``Schedule`` (trees, thresholds, estimator); its estimator's
    ``new_state()`` is used as is, so the live estimate is the one the offline replay computes.
    ``entropy_scale`` multiplies every entropy (nats) before it is fed, e.g. ``1 / ln 2`` for a
    schedule calibrated in bits.
    """

    def __init__(self, schedule: Any, *, entropy_scale: float = 1.0) -> None:
        self.schedule = schedule
        self.trees = tuple(
            t if isinstance(t, Tree) else Tree.from_paths(t) for t in schedule.trees
        )
        self.entropy_scale = float(entropy_scale)
        self._state = None

    @classmethod
    def from_bundle(cls, bundle: Any) -> BundleScheduler:
        """The schedule a treesearch ``Bundle`` ships (its trees, thresholds and estimator)."""
        unit = bundle.entropy.unit
        if unit not in ("nats", "bits"):
            raise EntmtpError(f"bundle entropy unit {unit!r} is unknown: use nats or bits")
        scale = 1.0 if unit == "nats" else 1.0 / math.log(2.0)
        return cls(_BundleSchedule(bundle), entropy_scale=scale)

    def reset(self) -> None:
        self._state = self.schedule.estimator.new_state()

    def observe(self, entropies: Sequence[float]) -> None:
        if self._state is None:
            self.reset()
        if self.entropy_scale != 1.0:
            entropies = [float(h) * self.entropy_scale for h in entropies]
        self._state.update(entropies)

    def choose(self) -> TreeChoice:
        if self._state is None:
            self.reset()
        estimate = float(self._state.value)
        index = int(self.schedule.tree_index(estimate))
        return TreeChoice(index, self.trees[index], estimate)


class _BundleSchedule:
    """A bundle seen as a schedule (bundles allow repeated thresholds; ``Schedule`` does not)."""

    def __init__(self, bundle: Any) -> None:
        self.trees = tuple(bundle.trees)
        self.thresholds = tuple(bundle.thresholds)
        self.estimator = bundle.entropy.estimator
        self.tree_index = bundle.tree_index_for
