"""Fitting draft heads on cached trajectories (Medusa-1 style; Hydra teacher-forced): the loss
of a batch, the base model's top-k as a distillation target, the learning-rate schedule and the
fit loop.

Head ``d`` learns the token ``d`` steps after each position by cross-entropy (the examples are
``_head_examples``'s). The loss is the cross-entropy over the full vocabulary by default
(``softmax_vocab="full"``; its memory is batch x vocab floats per head, 0.8 GB for 4096
positions of a 49k vocabulary, so it fits any GPU and a CPU). On a CPU the vocabulary
projection dominates the time (49k x hidden per example and head), so ``softmax_vocab="batch"``
normalises over a subset instead: the most frequent tokens of the trajectories, each batch's
targets and uniformly sampled negatives. Evaluation (``_accuracy``) always ranks over the full
vocabulary.

With ``distill_topk`` > 0 the target is the base model's own distribution at the target
position instead of its one token (a teacher-distillation objective, as Hydra++ trains with):
the softmax of the shared lm_head over the cached final-norm hidden state there, cut to its
top-k tokens and renormalised, precomputed once for every position.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from entmtp.core import EntmtpError
from entmtp.model import DraftHeads

from ._head_examples import _Examples, _examples, _prefixes, _target_positions
from ._trajectories import Progress, Trajectory, _report


def fit_heads(
    heads: DraftHeads,
    trajectories: Sequence[Trajectory],
    *,
    epochs: int = 3,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    weight_decay: float = 0.0,
    softmax_vocab: str = "full",
    frequent_tokens: int = 1024,
    random_negatives: int = 4096,
    distill_topk: int = 0,
    progress: Progress | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    plan: FitPlan | None = None,
) -> list[float]:
    """Train ``heads`` in place on cached trajectories; returns the mean loss of each epoch.

    ``deadline`` (a ``clock()`` value; None: none): the training ends by then. Once a few steps
    have timed the step, a schedule that would not fit is shortened to the steps that do (the
    learning rate still warms up and decays to zero, over fewer steps), leaving a twentieth of
    the time left for what follows (held-out accuracy, saving). ``plan`` (optional) receives the
    planned and the taken step counts.

    AdamW with 5 % linear warm-up then cosine decay; the loss is the sum over heads of the
    cross-entropy on the token ``d`` steps after the root. ``softmax_vocab`` is the vocabulary
    the softmax is normalised over: "batch" (the ``frequent_tokens`` most frequent tokens of the
    trajectories, the batch's targets and ``random_negatives`` tokens drawn uniformly afresh for
    each batch, so that no token escapes the push-down: cheapest), "seen" (every token of the
    trajectories) or "full". ``distill_topk`` > 0 trains on the base model's top-k distribution
    at each target position (``teacher_topk``; its tokens join a "batch" vocabulary) instead of
    the one token.

    The heads train, and stay, in float32 whatever the base model's dtype (they are cast in
    place): AdamW's steps are far below a bf16 weight's resolution (8 significant bits, so a
    step under 1/256 of the weight rounds away) and often below fp16's, so low-precision head
    weights would stop learning. The heads are small next to the base, whose forward (cached
    in the trajectories) and shared lm_head / embedding stay in its own dtype; saving stores
    the float32 weights in the precision asked for.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise EntmtpError("training needs epochs >= 1, batch_size >= 1 and lr > 0")
    if distill_topk < 0:
        raise EntmtpError(f"distill_topk must be 0 (no distillation) or more, got {distill_topk}")
    if distill_topk and softmax_vocab == "seen":
        raise EntmtpError("distillation's targets are any tokens of the vocabulary: use the "
                          "'batch' or 'full' softmax with it, not 'seen'")
    heads.float()
    examples = _examples(trajectories, heads.num_heads)
    teacher = (teacher_topk(heads, examples.hidden, distill_topk, progress=progress)
               if distill_topk else None)
    vocab_ids, targets = _softmax_vocab(examples, heads.vocab_size, softmax_vocab)
    frequent = _frequent_tokens(examples, frequent_tokens) if softmax_vocab == "batch" else None
    parameters = [p for p in heads.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    count = len(examples.rows)
    plan = plan if plan is not None else FitPlan()
    plan.planned = plan.total = epochs * math.ceil(count / batch_size)
    plan.taken, plan.timed_from = 0, None
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(plan.total)(step))
    device, dtype = heads.device, heads.dtype
    heads.train()
    losses: list[float] = []
    _report(progress, "train", 0, plan.total)
    try:
        for _ in range(epochs):
            if plan.taken >= plan.total:
                break
            order = torch.randperm(count, generator=generator)
            epoch_loss, epoch_batches = 0.0, 0
            for start in range(0, count, batch_size):
                if plan.taken >= plan.total:
                    break
                picked = order[start:start + batch_size]
                rows = examples.rows[picked]
                hidden = examples.hidden[rows].to(device, dtype)
                loss = batch_loss(heads, examples, rows, hidden, targets[picked],
                                  vocab_ids=vocab_ids, teacher=teacher, frequent=frequent,
                                  random_negatives=random_negatives, generator=generator)
                epoch_loss += optimizer_step(loss, optimizer, scheduler, parameters)
                epoch_batches += 1
                plan.taken += 1
                if deadline is not None:
                    plan.fit_to(deadline, clock())
                _report(progress, "train", plan.taken, plan.total)
            losses.append(epoch_loss / max(1, epoch_batches))
    finally:
        heads.eval()
    return losses


@dataclass
class FitPlan:
    """Optimizer steps of a training: planned (epochs x batches), the schedule's length (the
    planned count, or fewer to meet a deadline) and taken."""

    planned: int = 0
    total: int = 0
    taken: int = 0
    timed_from: float | None = None  # clock() after the warm-up steps

    WARMUP_STEPS = 3  # steps not timed (allocation, kernel selection)
    TIMED_STEPS = 2  # steps timed before the schedule may be shortened

    def fit_to(self, deadline: float, now: float) -> None:
        """After a step: stop at once past ``deadline``; else shorten the schedule to the steps
        that end by then with a twentieth of the time left to spare, judged by the mean step
        since the warm-up steps. The schedule only ever shortens."""
        if now >= deadline:
            self.total = self.taken
            return
        if self.taken == self.WARMUP_STEPS:
            self.timed_from = now
        if self.timed_from is None or self.taken < self.WARMUP_STEPS + self.TIMED_STEPS:
            return
        per_step = (now - self.timed_from) / (self.taken - self.WARMUP_STEPS)
        if per_step <= 0:
            return
        remaining = int((deadline - now) * 0.95 / per_step)
        floor = min(self.taken + 1, self.total)  # the step the deadline still leaves room for
        self.total = max(floor, min(self.total, self.taken + remaining))


def warmup_cosine(total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor of each step: 5 % linear warm-up, then cosine decay to 0."""
    warmup = max(1, total_steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    return factor


def optimizer_step(loss: Tensor, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler,
                   parameters: Sequence[Tensor]) -> float:
    """Back-propagate ``loss``, clip the gradients to norm 1, step; returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    scheduler.step()
    return float(loss.detach())


def batch_loss(
    heads: DraftHeads,
    examples: _Examples,
    rows: Tensor,
    hidden: Tensor,
    targets: Tensor,
    *,
    vocab_ids: Tensor | None,
    teacher: TeacherTopK | None,
    frequent: Tensor | None,
    random_negatives: int,
    generator: torch.Generator,
) -> Tensor:
    """The training loss of one batch: the sum over heads of the cross-entropy of head ``d``
    on the token ``d`` steps after each of ``rows`` (positions of ``examples``), or on the
    teacher's top-k there. hidden: [n, H] the heads' input at ``rows``; targets: [n, heads]
    indexed in ``vocab_ids`` (None: token ids); ``frequent`` (not None: the "batch" softmax)
    joins the batch's targets, the teacher's tokens and ``random_negatives`` uniform tokens.
    """
    device = hidden.device
    batch_vocab = vocab_ids
    soft = None
    if teacher is not None:
        at = _target_positions(rows, heads.num_heads, len(examples.tokens))
        soft = (teacher.ids[at].long(), teacher.probs[at])  # [n, heads, k] each
    if frequent is not None:
        negatives = torch.randint(0, heads.vocab_size, (random_negatives,), generator=generator)
        always = [frequent, negatives]
        if soft is not None:
            always.append(soft[0][targets >= 0].reshape(-1))
        batch_vocab, targets = _batch_vocab(torch.cat(always), targets)
        if soft is not None:
            soft = (torch.searchsorted(batch_vocab, soft[0]), soft[1])
    loss = torch.zeros((), device=device)
    for depth in range(1, heads.num_heads + 1):
        target = targets[:, depth - 1]
        valid = target >= 0
        if not bool(valid.any()):
            continue
        prefix = _prefixes(examples, rows[valid], depth).to(device)
        features = heads.head_features(depth, hidden[valid], prefix)
        logits = heads.project(
            depth, features, None if batch_vocab is None else batch_vocab.to(device)
        )
        if soft is None:
            loss = loss + F.cross_entropy(logits.float(), target[valid].to(device))
            continue
        log_probs = F.log_softmax(logits.float(), dim=-1)
        columns = soft[0][valid, depth - 1].to(device)
        weights = soft[1][valid, depth - 1].to(device)
        loss = loss - (weights * log_probs.gather(1, columns)).sum(-1).mean()
    return loss


@dataclass
class TeacherTopK:
    """The base model's next-token distribution at every position, cut to its top-k."""

    ids: Tensor  # [M, k] int32 token ids, most likely first
    probs: Tensor  # [M, k] float32, renormalised over the k tokens (rows sum to 1)


@torch.no_grad()
def teacher_topk(heads: DraftHeads, hidden: Tensor, k: int, *, batch_size: int = 4096,
                 progress: Progress | None = None) -> TeacherTopK:
    """Top-``k`` of softmax(lm_head(hidden)) for each row of ``hidden`` [M, H] (final-norm
    states: the base model's own distribution), through the heads' shared lm_head; reports the
    rows done as stage "teacher" (a full-vocabulary projection of every row: minutes on a CPU)."""
    if not heads.shared_lm_head:
        raise EntmtpError("distillation reads the base model's distribution through the lm_head "
                          "the heads share; these heads have their own projections")
    weight, bias = heads.projection_weight(1)
    k = min(int(k), weight.shape[0])
    rows = hidden.shape[0]
    ids = torch.empty((rows, k), dtype=torch.int32)
    probs = torch.empty((rows, k), dtype=torch.float32)
    _report(progress, "teacher", 0, rows)
    for start in range(0, rows, batch_size):
        chunk = hidden[start:start + batch_size].to(weight.device, weight.dtype)
        logits = F.linear(chunk, weight, bias).float()
        top = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        ids[start:start + batch_size] = top.indices.to(torch.int32).cpu()
        probs[start:start + batch_size] = (top.values / top.values.sum(-1, keepdim=True)).cpu()
        _report(progress, "teacher", min(start + batch_size, rows), rows)
    return TeacherTopK(ids=ids, probs=probs)


def _softmax_vocab(
    examples: _Examples, vocab_size: int, mode: str
) -> tuple[Tensor | None, Tensor]:
    """(vocabulary subset or None, targets indexed in it) for the "seen" and "full" modes."""
    if mode in ("full", "batch"):
        return None, examples.targets
    if mode != "seen":
        raise EntmtpError(
            f"softmax_vocab must be 'batch', 'seen' or 'full', got {mode!r}"
        )
    vocab_ids = torch.unique(examples.tokens)
    lookup = torch.full((vocab_size,), -1, dtype=torch.int64)
    lookup[vocab_ids] = torch.arange(len(vocab_ids))
    targets = torch.where(examples.targets >= 0, lookup[examples.targets.clamp(min=0)], -1)
    return vocab_ids, targets


def _frequent_tokens(examples: _Examples, count: int) -> Tensor:
    """The ``count`` most frequent tokens of the trajectories (always-present negatives)."""
    values, counts = torch.unique(examples.tokens, return_counts=True)
    return values[counts.argsort(descending=True)[:count]]


def _batch_vocab(frequent: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Vocabulary of one batch: the frequent tokens plus the batch's targets, and the targets
    re-indexed into it (-1 stays -1)."""
    vocab = torch.unique(torch.cat([frequent, targets[targets >= 0]]))
    index = torch.searchsorted(vocab, targets.clamp(min=0))
    return vocab, torch.where(targets >= 0, index, -1)

