"""Exact replay of batched greedy decoding: ``B`` trajectories decoded together, one tree per
step for the whole batch, as the static runtime's batched steps run them.

**Batches.** The profile's trajectories, in order, are cut into batches of ``B`` rows
(``batch_rows``); the last batch is filled by wrapping around to the first trajectories, so
every batch has ``B`` rows and every step is priced at the batch size the runtime runs (a batch
of fewer prompts would run a smaller, cheaper step). A trajectory shorter than the others
finishes first; its row stays in the batch, masked out (the runtime computes it and drops its
results), so the batch's steps keep their price until its longest row finishes.

**Steps.** At each step every live row (one that has not emitted its last token) sits at its own
position with its own entropy estimate (the one the per-sequence replay computes there: each row
observes its own accepted path). The step's tree is the schedule's tree at the mean of the live
rows' estimates (``batch_estimate``; a one-tree schedule reads none), every live row accepts its
own path of that tree exactly as the per-sequence replay does (greedy acceptance is per sequence)
and moves on by it. The step costs what ``Replayer.cost_table`` charges that tree at this batch
size's latency model (the column after an empty-tree step when the batch's previous step was
one). Greedy outputs do not depend on the trees, so a batch decodes the same tokens under every
schedule; rates are the batch's decode tokens over its steps' time. With ``B = 1`` this is the
per-sequence replay exactly (``Replayer.run_schedule``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from entmtp.core import EntmtpError

from ._replay import NO_SIGNAL, Replayer
from ._schedule import Schedule, batch_estimate


@dataclass(frozen=True)
class BatchReplayResult:
    """Totals of a batched replay over every batch."""

    batch_size: int
    batches: int
    tokens: int  # decode tokens of every row of every batch (wrapped rows counted again)
    steps: int  # batch steps
    row_steps: int  # steps summed over the live rows of each
    time_ms: float  # the batch steps' modelled time
    autoregressive_ms: float  # the same batches decoded by plain steps of this batch size
    tree_steps: tuple[int, ...]  # batch steps per tree of the schedule

    @property
    def tokens_per_second(self) -> float:
        """The batch's throughput: every row's decode tokens over the steps' time."""
        return 1000.0 * self.tokens / self.time_ms if self.time_ms > 0 else 0.0

    @property
    def autoregressive_tokens_per_second(self) -> float:
        return 1000.0 * self.tokens / self.autoregressive_ms if self.autoregressive_ms > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens per row-step: what a live row gains from one batch step."""
        return self.tokens / self.row_steps if self.row_steps else 0.0

    @property
    def speedup_vs_autoregressive(self) -> float:
        return self.autoregressive_ms / self.time_ms if self.time_ms > 0 else 1.0


def batch_rows(num_traces: int, batch_size: int) -> list[list[int]]:
    """Trajectory indices of each batch: consecutive runs of ``batch_size``, the last filled by
    wrapping around to the first trajectories (module doc)."""
    if batch_size < 1:
        raise EntmtpError(f"batch size {batch_size}: give 1 or more sequences per step")
    if num_traces < 1:
        raise EntmtpError("no trajectories to batch: profile some prompts first")
    batches = -(-num_traces // batch_size)
    return [[(b * batch_size + r) % num_traces for r in range(batch_size)]
            for b in range(batches)]


def batch_replay(
    replayer: Replayer, schedule: Schedule, batch_size: int, *,
    rule: Callable[[Sequence[float]], float] = batch_estimate,
) -> BatchReplayResult:
    """Replay ``schedule`` (whose trees are ``replayer.trees``, in order) on batches of
    ``batch_size`` of ``replayer.profile``'s trajectories, priced by ``replayer.latency`` (the
    model of this batch size). ``rule``: the one estimate a step chooses from, of the live
    rows' (the runtime's ``batch_estimate``; others for comparing rules)."""
    if tuple(schedule.trees) != tuple(replayer.trees):
        raise EntmtpError("batch replay: the schedule's trees must be the replayer's, in order")
    one_tree = len(schedule.trees) == 1
    signal = NO_SIGNAL if one_tree else schedule.signal
    estimates = None if one_tree else replayer.estimates(schedule.estimator, schedule.signal)
    costs = replayer.cost_table(signal, replayer.draft_depth(range(len(replayer.trees))))
    empty = np.array([tree.num_nodes == 0 for tree in replayer.trees])
    thresholds = np.asarray(schedule.thresholds, dtype=np.float64)
    autoregressive_ms = replayer.latency.autoregressive_ms
    tokens = steps = row_steps = 0
    step_ms: list[float] = []
    tree_steps = np.zeros(len(replayer.trees), dtype=np.int64)
    ar_time = 0.0
    rows_of = batch_rows(len(replayer.starts), batch_size)
    for rows in rows_of:
        position = replayer.starts[rows].copy()  # [B] global positions
        last = replayer.ends[rows] - 1  # [B] a row is live while position < last
        tokens += int(replayer.trace_tokens[rows].sum())
        ar_time += int(replayer.trace_tokens[rows].max(initial=0)) * autoregressive_ms
        after_empty = 0
        live = position < last
        while live.any():
            if one_tree:
                tree = 0
            else:
                mean = rule(estimates[position[live]].tolist())
                tree = int(np.searchsorted(thresholds, mean, side="right"))
            step_ms.append(float(costs[tree, after_empty]))
            tree_steps[tree] += 1
            steps += 1
            row_steps += int(live.sum())
            position[live] += replayer.accept[tree, position[live]]
            after_empty = int(empty[tree])
            live = position < last
    return BatchReplayResult(
        batch_size=int(batch_size), batches=len(rows_of), tokens=tokens, steps=steps,
        row_steps=row_steps, time_ms=math.fsum(step_ms), autoregressive_ms=ar_time,
        tree_steps=tuple(int(n) for n in tree_steps))


def batch_replay_of(profile, schedule: Schedule, latency, batch_size: int) -> BatchReplayResult:
    """``batch_replay`` of ``schedule`` on ``profile`` with a fresh ``Replayer``."""
    return batch_replay(Replayer(profile, schedule.trees, latency), schedule, batch_size)

