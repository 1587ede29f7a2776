"""An entropy schedule: trees, the ascending thresholds that switch between them, an estimator.

Tree ``i`` serves estimates in ``[t_{i-1}, t_i)`` (``t_{-1} = -inf``, ``t_{len} = +inf``), i.e.
``tree_index(e) = bisect_right(thresholds, e)``. Thresholds may repeat: ``t_{i-1} == t_i`` is an
empty interval, so tree ``i`` is never chosen (a bundle may say so, and converting a bundle's
thresholds from bits to nats can round two close ones to one value).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import EntmtpError
from ._estimator import EntropyEstimator
from ._tree import Tree


@dataclass(frozen=True)
class Schedule:
    trees: tuple[Tree, ...]
    thresholds: tuple[float, ...] = ()  # ascending (repeats allowed), len(trees) - 1
    estimator: EntropyEstimator = field(default_factory=EntropyEstimator.last)

    def __post_init__(self) -> None:
        trees = tuple(self.trees)
        if not trees:
            raise EntmtpError("schedule trees is empty: a schedule needs at least one tree")
        for i, tree in enumerate(trees):
            if not isinstance(tree, Tree):
                raise EntmtpError(f"schedule trees[{i}] is {type(tree).__name__}, not a Tree")
        try:
            thresholds = tuple(float(t) for t in self.thresholds)
        except (TypeError, ValueError) as err:
            raise EntmtpError(f"schedule thresholds must be numbers: {err}") from err
        if len(thresholds) != len(trees) - 1:
            raise EntmtpError(
                f"schedule thresholds has {len(thresholds)} values for {len(trees)} trees: "
                "give exactly one fewer threshold than trees"
            )
        if not all(math.isfinite(t) for t in thresholds):
            raise EntmtpError(f"schedule thresholds {list(thresholds)} must all be finite")
        if any(b < a for a, b in zip(thresholds, thresholds[1:], strict=False)):
            raise EntmtpError(
                f"schedule thresholds {list(thresholds)} must be ascending: sort them"
            )
        if not isinstance(self.estimator, EntropyEstimator):
            raise EntmtpError("schedule estimator must be an EntropyEstimator")
        object.__setattr__(self, "trees", trees)
        object.__setattr__(self, "thresholds", thresholds)

    @classmethod
    def static(cls, tree: Tree, *, estimator: EntropyEstimator | None = None) -> Schedule:
        """One tree for every estimate."""
        return cls((tree,), (), estimator or EntropyEstimator.last())

    @property
    def num_buckets(self) -> int:
        return len(self.trees)

    def tree_index(self, estimate: float) -> int:
        return bisect_right(self.thresholds, estimate)

    def tree_indices(self, estimates: np.ndarray) -> np.ndarray:
        """Vectorized ``tree_index``: int64 ``[positions]``."""
        return np.searchsorted(
            np.asarray(self.thresholds, dtype=np.float64),
            np.asarray(estimates, dtype=np.float64),
            side="right",
        ).astype(np.int64)

    def tree_for(self, estimate: float) -> Tree:
        return self.trees[self.tree_index(estimate)]

    def merged(self) -> Schedule:
        """The same mapping from estimates to trees, without never-chosen trees (empty
        intervals) and with adjacent equal trees merged: thresholds strictly ascending."""
        bounds = (-math.inf, *self.thresholds, math.inf)
        trees: list[Tree] = []
        thresholds: list[float] = []
        for i, tree in enumerate(self.trees):
            lower, upper = bounds[i], bounds[i + 1]
            if lower == upper or (trees and tree == trees[-1]):
                continue
            if trees:
                thresholds.append(lower)
            trees.append(tree)
        return Schedule(tuple(trees), tuple(thresholds), self.estimator)

    # -- serialization ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_json(),
            "thresholds": list(self.thresholds),
            "trees": [tree.to_json() for tree in self.trees],
        }

    @classmethod
    def from_json(cls, obj: object) -> Schedule:
        if not isinstance(obj, dict):
            raise EntmtpError("schedule JSON must be an object with estimator, thresholds, trees")
        missing = [k for k in ("estimator", "thresholds", "trees") if k not in obj]
        if missing:
            raise EntmtpError(f"schedule JSON misses {', '.join(missing)}")
        trees = obj["trees"]
        if not isinstance(trees, list):
            raise EntmtpError("schedule trees must be a list of trees")
        thresholds = obj["thresholds"]
        if not isinstance(thresholds, list):
            raise EntmtpError("schedule thresholds must be a list of numbers")
        return cls(
            tuple(Tree.from_json(t) for t in trees),
            tuple(thresholds),
            EntropyEstimator.from_json(obj["estimator"]),
        )


def as_schedule(schedule_or_tree: Schedule | Tree) -> Schedule:
    if isinstance(schedule_or_tree, Schedule):
        return schedule_or_tree
    if isinstance(schedule_or_tree, Tree):
        return Schedule.static(schedule_or_tree)
    raise EntmtpError(
        f"expected a Schedule or a Tree, got {type(schedule_or_tree).__name__}"
    )
