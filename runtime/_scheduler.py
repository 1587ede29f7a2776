"""Which tree each decoding step verifies.

Entropy bookkeeping (the same as the offline replay): before the first step the scheduler has
seen ``H_0``, the entropy of the prefill's last logits. A step that accepts the path
root..leaf of depth ``d*`` then feeds the entropies of the logits at root, node 1, ..., leaf
(``d* + 1`` values) in order, so before drafting at the step whose pending token came from a
distribution with entropy ``H_i`` the estimator has consumed ``H_0 .. H_i``.

A batch of sequences keeps one scheduler per row (``row_schedulers``), each observing its own
row's entropies, and verifies one tree per step for every row: each live row's scheduler gives
its estimate and the batch's tree is the one at their mean (``choose_for_rows``, treesearch's
``batch_estimate``). With one row that is the row's own choice.

A schedule on the ``draft_entropy`` signal instead chooses from head 1's entropy at the step's
own state, used as is: the decoder prepares the draft first and hands that value to
``observe_draft`` before every ``choose`` (``needs_draft_entropy`` says so); base entropies fed
to ``observe`` are then ignored.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from entmtp.core import EntmtpError
from entmtp.treesearch import BASE_ENTROPY, DRAFT_ENTROPY, Tree, batch_estimate

if TYPE_CHECKING:
    from entmtp.treesearch import Schedule


@dataclass(frozen=True)
class TreeChoice:
    index: int  # index of the tree in the scheduler's tree list
    tree: Tree
    estimate: float  # entropy estimate the choice was made from (nan for a static tree)


class Scheduler(Protocol):
    trees: tuple[Tree, ...]
    signal: str  # BASE_ENTROPY or DRAFT_ENTROPY
    needs_draft_entropy: bool  # True: call observe_draft before every choose
    reads_entropy: bool  # False: one tree, so steps need not compute any entropy

    def reset(self) -> None: ...

    def observe(self, entropies: Sequence[float]) -> None: ...

    def observe_draft(self, entropy: float) -> None: ...

    def choose(self) -> TreeChoice: ...

    def choice_at(self, estimate: float) -> TreeChoice:
        """The tree that serves ``estimate`` (a batch's mean), no state read or changed."""
        ...


class StaticScheduler:
    """The same tree at every step."""

    signal = BASE_ENTROPY
    needs_draft_entropy = False
    reads_entropy = False

    def __init__(self, tree: Tree) -> None:
        self.trees = (tree,)
        self._choice = TreeChoice(0, tree, math.nan)

    def reset(self) -> None:
        pass

    def observe(self, entropies: Sequence[float]) -> None:
        pass

    def observe_draft(self, entropy: float) -> None:
        pass

    def choose(self) -> TreeChoice:
        return self._choice

    def choice_at(self, estimate: float) -> TreeChoice:
        return self._choice


class BundleScheduler:
    """Entropy-switched trees: ``schedule.tree_index(estimate)`` picks from ``schedule.trees``.

    ``schedule`` is a treesearch ``Schedule`` (trees, thresholds in nats, estimator, signal); a
    bundle's is ``bundle.schedule()``.
    On ``base_entropy`` its estimator's ``new_state()`` is used as is, so the live estimate is
    the one the offline replay computes from the same entropies (nats, as
    ``entropy_from_logits`` measures them). On ``draft_entropy`` the estimate is the value given
    to ``observe_draft`` for this step, as the replay takes the profile's draft entropy there.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.signal = schedule.signal
        self.trees = schedule.trees
        # one tree (a bundle that ships its static tree): as StaticScheduler, as the replay
        self.reads_entropy = len(self.trees) > 1
        self.needs_draft_entropy = self.signal == DRAFT_ENTROPY and self.reads_entropy
        self._state = None
        self._draft: float | None = None  # this step's draft entropy, until choose uses it

    def reset(self) -> None:
        self._state = self.schedule.estimator.new_state()
        self._draft = None

    def observe(self, entropies: Sequence[float]) -> None:
        if self.needs_draft_entropy:
            return
        if self._state is None:
            self.reset()
        self._state.update(entropies)

    def observe_draft(self, entropy: float) -> None:
        self._draft = float(entropy)

    def choose(self) -> TreeChoice:
        if not self.reads_entropy:
            return TreeChoice(0, self.trees[0], math.nan)
        if self.needs_draft_entropy:
            estimate = self._take_draft()
        else:
            if self._state is None:
                self.reset()
            estimate = float(self._state.value)
        return self.choice_at(estimate)

    def choice_at(self, estimate: float) -> TreeChoice:
        """The tree that serves ``estimate`` (no state read or changed)."""
        index = int(self.schedule.tree_index(estimate))
        return TreeChoice(index, self.trees[index], estimate)

    def _take_draft(self) -> float:
        # One value per step: a stale one from an earlier step must never choose a tree.
        if self._draft is None:
            raise EntmtpError(
                "this schedule switches on the draft_entropy signal: call observe_draft(head 1's "
                "entropy at the step) before every choose()"
            )
        estimate, self._draft = self._draft, None
        return estimate


def row_schedulers(scheduler: Scheduler, rows: int) -> list[Scheduler]:
    """One scheduler per row of a batch: ``scheduler`` itself for one row, else shallow copies
    (the trees and schedule shared, each with its own estimator state after ``reset``)."""
    if rows < 1:
        raise EntmtpError(f"a batch needs at least one row, got {rows}")
    return [scheduler] if rows == 1 else [copy.copy(scheduler) for _ in range(rows)]


def choose_for_rows(schedulers: Sequence[Scheduler]) -> TreeChoice:
    """The one tree a batch step verifies, from the live rows' ``schedulers``: one row's own
    choice; for several, the tree at ``batch_estimate`` of their estimates (each row's
    ``choose`` is called once, so a draft-entropy row consumes its value)."""
    choices = [scheduler.choose() for scheduler in schedulers]
    if len(choices) == 1 or not getattr(schedulers[0], "reads_entropy", True):
        return choices[0]
    return schedulers[0].choice_at(batch_estimate([c.estimate for c in choices]))
