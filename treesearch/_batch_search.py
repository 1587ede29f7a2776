"""The search per batch size: from one profile, the schedule each batch size decodes with, and
the batch-size ranges a bundle holds.

Greedy acceptance is per sequence, so a profile's trajectories say what every tree accepts at
every position whatever the batch; only the step's price changes with the batch size (the
latency model of that size, ``BatchLatency``). For each measured batch size ``B`` the whole
search runs again under ``B``'s model (fronts, schedule, best static tree: ``search``), and four
candidates are replayed together as the batched runtime runs them (``batch_replay``: batches of
``B`` trajectories, one tree per step at the mean of the live rows' estimates): that search's
schedule, its best static tree, plain decoding (the empty tree: "do not draft") and the batch-1
schedule. The fastest is ``B``'s schedule (ties: the simpler, in that order reversed: plain
decoding, then the static tree), so at every measured size it is at least as fast, in the
replay, as plain decoding and as the batch-1 bundle run at ``B``.

A size between two measured ones runs the schedule of the next measured size up (its step costs
at least as much: ``BatchLatency.for_batch``), so measured size ``B_k`` serves the sizes
``B_{k-1} + 1 .. B_k``; neighbouring sizes whose schedules are equal merge into one range.
Past the largest measured size the last range's schedule runs (``Bundle.schedule``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from entmtp.core import EntmtpError

from ._batch_replay import BatchReplayResult, batch_replay
from ._bundle import BatchPrediction, BatchRange, EntropyInfo
from ._latency import LatencyModel
from ._profile import Profile
from ._replay import Replayer
from ._schedule import Schedule
from ._tree import Tree

SEARCHED, BEST_STATIC, NO_DRAFTING, BATCH_ONE = (
    "searched schedule", "best static tree", "plain decoding", "batch-1 schedule")
# Ties go to the first of this order: the simplest schedule that is as fast.
CANDIDATE_ORDER = (NO_DRAFTING, BEST_STATIC, SEARCHED, BATCH_ONE)


@dataclass(frozen=True)
class BatchChoice:
    """The schedule one measured batch size decodes with, and what it was chosen over."""

    batch_size: int
    source: str  # which candidate: one of CANDIDATE_ORDER
    schedule: Schedule
    replays: dict[str, BatchReplayResult]  # every candidate's batched replay, by source
    best_static_tree: Tree

    @property
    def result(self) -> BatchReplayResult:
        return self.replays[self.source]

    @property
    def tokens_per_second(self) -> float:
        return self.result.tokens_per_second

    @property
    def autoregressive_tokens_per_second(self) -> float:
        return self.replays[NO_DRAFTING].tokens_per_second

    @property
    def best_static_tokens_per_second(self) -> float:
        return self.replays[BEST_STATIC].tokens_per_second

    @property
    def batch_one_tokens_per_second(self) -> float:
        return self.replays[BATCH_ONE].tokens_per_second


@dataclass(frozen=True)
class BatchRangeChoice:
    """Batch sizes ``min_batch_size .. max_batch_size`` decode with ``schedule``; ``choices``
    are the measured sizes inside (their predictions)."""

    min_batch_size: int
    max_batch_size: int
    schedule: Schedule
    choices: tuple[BatchChoice, ...]


def choose_for_batch(
    profile: Profile, latency: LatencyModel, batch_size: int, *, searched: Schedule,
    best_static_tree: Tree, batch_one: Schedule,
) -> BatchChoice:
    """Replay the four candidates at ``batch_size`` (``latency``: that size's model) and keep
    the fastest (module doc)."""
    candidates = {
        NO_DRAFTING: Schedule.static(Tree.from_paths([])),
        BEST_STATIC: Schedule.static(best_static_tree),
        SEARCHED: searched,
        BATCH_ONE: batch_one,
    }
    replays = {
        source: batch_replay(Replayer(profile, schedule.trees, latency), schedule, batch_size)
        for source, schedule in candidates.items()
    }
    best = min(CANDIDATE_ORDER, key=lambda s: (replays[s].time_ms, CANDIDATE_ORDER.index(s)))
    return BatchChoice(int(batch_size), best, candidates[best], replays, best_static_tree)


def search_by_batch(
    profile: Profile, latencies: Mapping[int, LatencyModel], *, batch_one: Schedule,
    search_at: Callable[[int, LatencyModel], tuple[Schedule, Tree]],
) -> list[BatchChoice]:
    """The choice of every measured batch size in ``latencies`` (ascending): ``search_at(B,
    model)`` runs the search under ``B``'s model and gives its schedule and best static tree;
    ``batch_one`` is the batch-1 bundle's schedule."""
    if not latencies:
        raise EntmtpError("a search per batch size needs the latency model of one size at least")
    choices = []
    for size in sorted(latencies):
        latency = latencies[size]
        searched, static_tree = search_at(size, latency)
        choices.append(choose_for_batch(profile, latency, size, searched=searched,
                                        best_static_tree=static_tree, batch_one=batch_one))
    return choices


def batch_ranges(choices: list[BatchChoice]) -> list[BatchRangeChoice]:
    """Consecutive ranges of batch sizes: measured size ``B_k`` serves ``B_{k-1} + 1 .. B_k``
    (from 1), neighbours with equal schedules merged."""
    ranges: list[BatchRangeChoice] = []
    low = 1
    for choice in sorted(choices, key=lambda c: c.batch_size):
        if ranges and ranges[-1].schedule == choice.schedule:
            last = ranges[-1]
            ranges[-1] = BatchRangeChoice(last.min_batch_size, choice.batch_size, last.schedule,
                                          (*last.choices, choice))
        else:
            ranges.append(BatchRangeChoice(low, choice.batch_size, choice.schedule, (choice,)))
        low = choice.batch_size + 1
    return ranges


def bundle_batch_ranges(choices: list[BatchChoice]) -> list[BatchRange]:
    """``batch_ranges(choices)`` as a bundle's ``batch_ranges`` (entropies in nats)."""
    out = []
    for merged in batch_ranges(choices):
        schedule = merged.schedule
        out.append(BatchRange(
            merged.min_batch_size, merged.max_batch_size,
            EntropyInfo(schedule.signal, "nats", schedule.estimator),
            list(schedule.thresholds), list(schedule.trees),
            [BatchPrediction(c.batch_size, c.source, c.tokens_per_second,
                             c.result.mean_accept_length, c.autoregressive_tokens_per_second,
                             c.best_static_tokens_per_second, c.batch_one_tokens_per_second)
             for c in merged.choices]))
    return out
