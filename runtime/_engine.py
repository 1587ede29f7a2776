"""The engine interface the decoding loop runs (``_loop.decode_batch``), and which entropies a
scheduler reads.

An engine decodes a batch of generations (rows; an engine may take only one): ``begin`` sets it
up (untimed), ``prefill`` runs the prompts, then every step: ``prepare_draft`` and
``draft_entropy`` (draft-entropy schedules only), ``step_for`` the chosen tree, ``run`` it for
every row (draft, verify, accept; read back), ``commit`` what the loop kept of each row and
``base_entropies`` of the kept paths (base-entropy schedules only); ``finish`` masks out rows
that are done. ``phase_times`` splits the step's time as the engine attributes it, from the
loop's clock reads (``now``) and the phases the step timed itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from ._records import PhaseTimes, Prefilled, StepMarks, StepRun

if TYPE_CHECKING:
    import torch

    from entmtp.treesearch import Tree

    from ._scheduler import Scheduler

StepT = TypeVar("StepT")


def reads_draft_entropy(scheduler: Scheduler) -> bool:
    """Whether each step's tree is chosen from head 1's entropy at the step's state."""
    return bool(getattr(scheduler, "needs_draft_entropy", False))


def reads_base_entropy(scheduler: Scheduler) -> bool:
    """Whether ``scheduler`` observes the base entropies of the prefill and the accepted paths
    (a one-tree scheduler reads none: steps skip computing them)."""
    return not reads_draft_entropy(scheduler) and bool(getattr(scheduler, "reads_entropy", True))


class Engine(Protocol[StepT]):
    def begin(self, prompts: Sequence[torch.Tensor | Sequence[int]], scheduler: Scheduler,
              max_new_tokens: int) -> None:
        """Get ready to decode up to ``max_new_tokens`` after each of ``prompts`` (one row
        each) with ``scheduler``'s trees (outside the prefill's time)."""

    def now(self) -> float:
        """The engine's clock, ms."""

    def prefill(self, prompts: Sequence[torch.Tensor | Sequence[int]]) -> list[Prefilled]:
        """Run the prompts; each row's first token and, where the schedule reads it, its
        entropy."""

    def prepare_draft(self) -> None:
        """Have the heads' first results at every row's state ready (counted as the step's
        draft)."""

    def draft_entropy(self) -> list[float]:
        """Head 1's entropy at each row's state."""

    def step_for(self, tree: Tree) -> StepT:
        """The step that verifies ``tree`` (for every row)."""

    def run(self, step: StepT) -> list[StepRun]:
        """Draft, verify and accept ``step``'s tree from every row's state; read the results
        back (one per row; a finished row's is never read)."""

    def commit(self, kept: Sequence[int]) -> None:
        """Move each live row's state past the first ``kept[row]`` nodes of its accepted
        path."""

    def base_entropies(self, kept: Sequence[int]) -> list[list[float]]:
        """Per row, base entropies of the logits at the first ``kept[row]`` nodes of its
        accepted path."""

    def finish(self, rows: Sequence[int]) -> None:
        """``rows`` are done: their state stops moving (later steps may still compute them)."""

    def phase_times(self, marks: StepMarks, runs: Sequence[StepRun]) -> PhaseTimes:
        """The step's draft / verify / bookkeeping time."""
