"""The engine interface the decoding loop runs (``_loop.decode``), and which entropies a
scheduler reads.

An engine decodes one generation at a time: ``begin`` sets it up (untimed), ``prefill`` runs the
prompt, then every step: ``prepare_draft`` and ``draft_entropy`` (draft-entropy schedules
only), ``step_for`` the chosen tree, ``run`` it (draft, verify, accept; read back), ``commit``
what the loop kept and ``base_entropies`` of the kept path (base-entropy schedules only).
``phase_times`` splits the step's time as the engine attributes it, from the loop's clock reads
(``now``) and the phases the step timed itself.
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
    def begin(self, prompt: torch.Tensor | Sequence[int], scheduler: Scheduler,
              max_new_tokens: int) -> None:
        """Get ready to decode up to ``max_new_tokens`` after ``prompt`` with ``scheduler``'s
        trees (outside the prefill's time)."""

    def now(self) -> float:
        """The engine's clock, ms."""

    def prefill(self, prompt: torch.Tensor | Sequence[int]) -> Prefilled:
        """Run the prompt; the first token and, where the schedule reads it, its entropy."""

    def prepare_draft(self) -> None:
        """Have the heads' first results at the state ready (counted as the step's draft)."""

    def draft_entropy(self) -> float:
        """Head 1's entropy at the state."""

    def step_for(self, tree: Tree) -> StepT:
        """The step that verifies ``tree``."""

    def run(self, step: StepT) -> StepRun:
        """Draft, verify and accept ``step``'s tree from the state; read the result back."""

    def commit(self, kept: int) -> None:
        """Move the state past the first ``kept`` nodes of the last run's accepted path."""

    def base_entropies(self, kept: int) -> list[float]:
        """Base entropies of the logits at the first ``kept`` nodes of the accepted path."""

    def phase_times(self, marks: StepMarks, run: StepRun) -> PhaseTimes:
        """The step's draft / verify / bookkeeping time."""
