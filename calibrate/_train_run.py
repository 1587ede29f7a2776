"""A training run on base-model trajectories: generate or teacher-force them (``train_heads``)
or take them ready (``train_on_trajectories``), hold a seeded share out, fit the heads on the
rest and report their held-out accuracy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from entmtp.core import EntmtpError
from entmtp.model import DraftHeads

from ._accuracy import HeadAccuracy, accuracy_table, head_accuracy
from ._train import FitPlan, fit_heads
from ._trajectories import Progress, Trajectory, generate_trajectories, text_trajectories

TRAIN_MODES = ("self-distill", "text")


@dataclass
class TrainReport:
    head_type: str
    num_heads: int
    mode: str
    epochs: int
    lr: float
    batch_size: int
    seed: int
    max_new_tokens: int
    train_trajectories: int
    train_positions: int
    heldout_trajectories: int
    heldout_positions: int
    softmax_vocab: str
    distill_topk: int = 0
    epoch_losses: list[float] = field(default_factory=list)
    heldout: list[HeadAccuracy] = field(default_factory=list)
    generation_seconds: float = 0.0
    training_seconds: float = 0.0
    planned_steps: int = 0  # epochs x batches per epoch
    steps: int = 0  # optimizer steps taken: fewer when a deadline shortened the schedule

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        return accuracy_table({"heldout": self.heldout})


def split_heldout(
    trajectories: Sequence[Trajectory], *, fraction: float, seed: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, heldout): a seeded random ``fraction`` of whole trajectories is held out."""
    if not 0 <= fraction < 1:
        raise EntmtpError(f"heldout fraction must be in [0, 1), got {fraction}")
    order = torch.randperm(len(trajectories), generator=torch.Generator().manual_seed(seed))
    held = int(round(fraction * len(trajectories)))
    if fraction > 0 and len(trajectories) > 1:
        held = max(held, 1)
    heldout = sorted(order[:held].tolist())
    keep = sorted(order[held:].tolist())
    return [trajectories[i] for i in keep], [trajectories[i] for i in heldout]


def train_heads(
    base: Any,
    heads: DraftHeads,
    *,
    texts_or_prompts: Sequence[Any],
    mode: str = "self-distill",
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    max_new_tokens: int = 128,
    progress: Progress | None = None,
    heldout_fraction: float = 0.1,
    generation_batch_size: int = 16,
    max_length: int = 512,
    softmax_vocab: str = "full",
    distill_topk: int = 0,
    deadline: float | None = None,
) -> TrainReport:
    """Train ``heads`` in place (in float32: see ``fit_heads``) on ``base`` (frozen, in its own
    dtype and device) and report held-out accuracy per head. ``deadline``: a
    ``time.monotonic()`` value the training ends by (``fit_heads``).

    mode "self-distill": ``texts_or_prompts`` are prompts (text, TaskPrompt-like or token ids)
    whose greedy continuations are the targets; "text": the texts themselves, teacher-forced.
    A seeded ``heldout_fraction`` of the trajectories is held out for the report.
    """
    if mode not in TRAIN_MODES:
        raise EntmtpError(f"mode must be one of {', '.join(TRAIN_MODES)}, got {mode!r}")
    started = time.perf_counter()
    if mode == "self-distill":
        trajectories = generate_trajectories(
            base,
            texts_or_prompts,
            max_new_tokens=max_new_tokens,
            batch_size=generation_batch_size,
            progress=progress,
        )
    else:
        trajectories = text_trajectories(
            base, texts_or_prompts, max_length=max_length, progress=progress
        )
    report = train_on_trajectories(
        heads, trajectories, mode=mode, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
        max_new_tokens=max_new_tokens, progress=progress, heldout_fraction=heldout_fraction,
        softmax_vocab=softmax_vocab, distill_topk=distill_topk, deadline=deadline,
    )
    report.generation_seconds = time.perf_counter() - started - report.training_seconds
    return report


def train_on_trajectories(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    mode: str,
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    max_new_tokens: int = 0,
    progress: Progress | None = None,
    heldout_fraction: float = 0.1,
    softmax_vocab: str = "full",
    frequent_tokens: int = 1024,
    random_negatives: int = 4096,
    distill_topk: int = 0,
    deadline: float | None = None,
) -> TrainReport:
    """Train ``heads`` in place on ready trajectories (in memory or read from head data) and
    report held-out accuracy on a seeded ``heldout_fraction`` of them (0: train on all, in
    order). ``deadline``: a ``time.monotonic()`` value the training ends by; ``softmax_vocab``,
    ``frequent_tokens``, ``random_negatives``, ``distill_topk``: the loss (``fit_heads``)."""
    started = time.perf_counter()
    train, heldout = split_heldout(trajectories, fraction=heldout_fraction, seed=seed)
    plan = FitPlan()
    losses = fit_heads(
        heads,
        train,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        softmax_vocab=softmax_vocab,
        frequent_tokens=frequent_tokens,
        random_negatives=random_negatives,
        distill_topk=distill_topk,
        progress=progress,
        deadline=deadline,
        plan=plan,
    )
    trained = time.perf_counter()
    accuracy = head_accuracy(heads, heldout) if heldout else []
    return TrainReport(
        head_type=heads.head_type,
        num_heads=heads.num_heads,
        mode=mode,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        max_new_tokens=max_new_tokens,
        train_trajectories=len(train),
        train_positions=sum(len(t) for t in train),
        heldout_trajectories=len(heldout),
        heldout_positions=sum(len(t) for t in heldout),
        softmax_vocab=softmax_vocab,
        distill_topk=distill_topk,
        epoch_losses=losses,
        heldout=accuracy,
        training_seconds=trained - started,
        planned_steps=plan.planned,
        steps=plan.taken,
    )

