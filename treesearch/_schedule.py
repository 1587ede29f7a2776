"""An entropy schedule: trees, the ascending thresholds that switch between them, an estimator,
and the signal it estimates.

Signals:
- ``base_entropy``: the base model's entropy at each position, smoothed by the estimator over
  the positions decoded so far (every emitted position is verified, so the live decoder sees
  them all);
- ``draft_entropy``: head 1's entropy at the step's own state, computed by the drafter before
  the tree is chosen. Only step positions have one, so it is used as is (the ``last``
  estimator): smoothing it would depend on where earlier steps landed.

A batch of sequences verifies one tree per step (every row the same tree, so the step keeps one
shape): the tree of the mean of the estimates of the rows still decoding (``batch_estimate``).
The mean is each row's estimator's value, unweighted: a row near the end of its generation
counts as much as one at its start.

Tree ``i`` serves estimates in ``[t_{i-1}, t_i)`` (``t_{-1} = -inf``, ``t_{len} = +inf``), i.e.
``tree_index(e) = bisect_right(thresholds, e)``. Thresholds may repeat: ``t_{i-1} == t_i`` is an
empty interval, so tree ``i`` is never chosen (a bundle may say so, and converting a bundle's
thresholds from bits to nats can round two close ones to one value).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from entmtp.core import EntmtpError

from ._estimator import EntropyEstimator
from ._tree import Tree

BASE_ENTROPY = "base_entropy"
DRAFT_ENTROPY = "draft_entropy"
SIGNALS = (BASE_ENTROPY, DRAFT_ENTROPY)


def check_signal(signal: str, estimator: EntropyEstimator) -> None:
    """One-line error for an unknown signal or a draft signal with a smoothing estimator."""
    if signal not in SIGNALS:
        raise EntmtpError(f"entropy signal {signal!r} is unknown: use one of {', '.join(SIGNALS)}")
    if signal == DRAFT_ENTROPY and estimator.kind != "last":
        raise EntmtpError(
            f"the draft_entropy signal is seen once per step, so it cannot be smoothed (given: "
            f"{estimator.describe()}): use the 'last' estimator"
        )


def check_thresholds(
    thresholds: object, num_trees: int, *, context: str = ""
) -> tuple[float, ...]:
    """``thresholds`` as floats if they can switch ``num_trees`` (>= 1) trees: exactly one fewer,
    finite, ascending (repeats allowed). Otherwise one ``EntmtpError`` line that starts with
    ``context`` (e.g. ``"bundle x.json: "``) and names the element, e.g. ``thresholds[1]``.

    The one threshold check: schedules, bundles and the bundle reader all use it.
    """
    try:
        values = list(thresholds)  # type: ignore[call-overload]
    except TypeError:
        raise EntmtpError(f"{context}thresholds: {thresholds!r} is not a list of numbers") from None
    if len(values) != num_trees - 1:
        raise EntmtpError(
            f"{context}thresholds: {len(values)} values for {num_trees} trees: give exactly "
            f"{num_trees - 1} (tree i serves estimates in [t(i-1), t(i)))"
        )
    out: list[float] = []
    for i, raw in enumerate(values):
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise EntmtpError(f"{context}thresholds[{i}]: {raw!r} is not a number") from None
        if not math.isfinite(value):
            raise EntmtpError(
                f"{context}thresholds[{i}]: {value} is not finite: give a finite entropy"
            )
        if out and value < out[-1]:
            raise EntmtpError(
                f"{context}thresholds[{i}]: {value} is below thresholds[{i - 1}] = {out[-1]}: "
                "thresholds must be ascending (sort them)"
            )
        out.append(value)
    return tuple(out)


def batch_estimate(estimates: Sequence[float]) -> float:
    """The estimate a batch's step chooses its one tree from: the mean of its live rows'
    estimates (one row: its own, exactly)."""
    if len(estimates) == 0:
        raise EntmtpError("a batch step needs the estimate of at least one live row")
    if len(estimates) == 1:
        return float(estimates[0])
    return math.fsum(float(e) for e in estimates) / len(estimates)


@dataclass(frozen=True)
class Schedule:
    trees: tuple[Tree, ...]
    thresholds: tuple[float, ...] = ()  # ascending (repeats allowed), len(trees) - 1
    estimator: EntropyEstimator = field(default_factory=EntropyEstimator.last)
    signal: str = BASE_ENTROPY

    def __post_init__(self) -> None:
        trees = tuple(self.trees)
        if not trees:
            raise EntmtpError("schedule trees is empty: a schedule needs at least one tree")
        for i, tree in enumerate(trees):
            if not isinstance(tree, Tree):
                raise EntmtpError(f"schedule trees[{i}] is {type(tree).__name__}, not a Tree")
        thresholds = check_thresholds(self.thresholds, len(trees), context="schedule ")
        if not isinstance(self.estimator, EntropyEstimator):
            raise EntmtpError("schedule estimator must be an EntropyEstimator")
        check_signal(self.signal, self.estimator)
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
        return Schedule(tuple(trees), tuple(thresholds), self.estimator, self.signal)

    # -- serialization ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
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
            str(obj.get("signal", BASE_ENTROPY)),
        )


def as_schedule(schedule_or_tree: Schedule | Tree) -> Schedule:
    if isinstance(schedule_or_tree, Schedule):
        return schedule_or_tree
    if isinstance(schedule_or_tree, Tree):
        return Schedule.static(schedule_or_tree)
    raise EntmtpError(
        f"expected a Schedule or a Tree, got {type(schedule_or_tree).__name__}"
    )
