"""Exact offline replay of greedy tree decoding over a profile's trajectories.

The replay books the steps the live decoder runs. Of a trajectory of ``G`` generated tokens,
token 0 comes from the prefill; a step at position ``i`` (its pending token is token ``i``)
uses the tree its schedule picks from the entropy estimate over entropies ``0 .. i``, emits
tokens ``i + 1 .. i + a`` with ``a = min(accept_lengths(tree, ranks)[i], G - 1 - i)`` and the
next step is at ``i + a``. Steps run while ``i < G - 1``, so a trajectory has ``G - 1`` decode
tokens (none when ``G = 1``), every schedule decodes the same tokens, and the fastest schedule
is the one with the least total step time. Rates are decode tokens over step time (the
prefill's token and time are excluded, as in the runtime's ``decode_tokens_per_second``).

A step's time is its tree's modelled latency; a draft-entropy schedule adds the heads' run
before the choice to empty-tree steps (``prepare_ms``), and with fused heads
(``LatencyModel.fused_empty_ms``) an empty-tree step right after another one costs only
``fused_empty_ms``, since the previous step's projection prepared it (``Replayer.step_ms``).
Both are charged for the schedule's *draft depth*, the depth of its deepest tree (the heads a
live step prepares; ``LatencyModel.prepare_cost`` / ``fused_empty_cost``), and a drafted step of
a shallower tree pays the head rows it prepares beyond its own (``LatencyModel.head_row_ms``
each). A one-tree schedule reads no entropies, so its steps cost ``entropy_readout_ms`` less
than the curve's (``NO_SIGNAL``; ``Replayer.static``). ``Replayer.cost_table``
is the one definition of those charges; the oracle reads it too, for every signal and draft
depth a schedule over the same trees can have, so it bounds every schedule and static tree.

``Replayer`` precomputes each tree's accept length at every position once, so replaying one
more schedule costs a gather plus a Python jump loop over the steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entmtp.core import EntmtpError

from ._acceptance import accept_lengths
from ._estimator import EntropyEstimator
from ._latency import LatencyModel
from ._profile import Profile
from ._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule, as_schedule, check_signal
from ._tree import Tree

# The cost regime of a schedule that reads no entropy (one tree): its steps skip the readout.
NO_SIGNAL = "none"


class _Rates:
    """Rates from a record's ``tokens``, ``steps``, ``time_ms`` and ``autoregressive_ms``."""

    tokens: int
    steps: int
    time_ms: float
    autoregressive_ms: float

    @property
    def tokens_per_second(self) -> float:
        return _rate(self.tokens, self.time_ms)

    @property
    def mean_accept_length(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def speedup_vs_autoregressive(self) -> float:
        return self.autoregressive_ms / self.time_ms if self.time_ms > 0 else 1.0


@dataclass(frozen=True)
class TraceReplay(_Rates):
    """One trajectory's replayed totals."""

    prompt_index: int
    prompt_id: str
    tokens: int  # decode tokens: the trajectory's length less the prefill's token
    steps: int
    time_ms: float
    autoregressive_ms: float  # the same tokens decoded one per plain step



@dataclass(frozen=True, eq=False)
class ReplayResult(_Rates):
    """Totals over every trajectory plus one record per step (steps in trajectory order)."""

    tokens: int  # decode tokens: every trajectory's length less its prefill token
    steps: int
    time_ms: float  # sum of the modelled step times (correctly rounded sum)
    autoregressive_ms: float  # the same tokens decoded one per plain step
    tree_ms: tuple[float, ...]  # modelled step ms of each tree that step_tree indexes (with
    #                             fused heads, an empty step right after another costs less:
    #                             step_ms has each step's own)
    traces: tuple[TraceReplay, ...]
    step_trace: np.ndarray  # [steps] int64: index into profile.traces
    step_position: np.ndarray  # [steps] int64: position inside its trajectory
    step_tree: np.ndarray  # [steps] int64: index of the tree used
    step_accept: np.ndarray  # [steps] int64: tokens the step emits (>= 1, cut at the end)
    step_estimate: np.ndarray  # [steps] float64: entropy estimate that chose the tree (nan: oracle)
    step_ms: np.ndarray  # [steps] float64: modelled ms of the step


    @property
    def autoregressive_tokens_per_second(self) -> float:
        return _rate(self.tokens, self.autoregressive_ms)

    def tree_usage(self) -> np.ndarray:
        """Fraction of steps that used each tree: float64 ``[len(tree_ms)]``."""
        counts = np.bincount(self.step_tree, minlength=len(self.tree_ms)).astype(np.float64)
        return counts / max(self.steps, 1)

    def summary(self) -> dict[str, float | int | list[float]]:
        """Plain numbers for reports and bundles."""
        return {
            "tokens": self.tokens,
            "steps": self.steps,
            "time_ms": self.time_ms,
            "mean_accept_length": self.mean_accept_length,
            "tokens_per_second": self.tokens_per_second,
            "autoregressive_tokens_per_second": self.autoregressive_tokens_per_second,
            "speedup_vs_autoregressive": self.speedup_vs_autoregressive,
            "tree_usage": self.tree_usage().tolist(),
        }


def _rate(tokens: int, time_ms: float) -> float:
    return 1000.0 * tokens / time_ms if time_ms > 0 else 0.0


class Replayer:
    """Replays many schedules over one profile and one fixed list of trees, exactly.

    Schedules are given as a tree index per position (``tree_at``); ``schedule_tree_at`` turns
    an estimator, thresholds and one tree index per bucket into that.
    """

    def __init__(self, profile: Profile, trees: Sequence[Tree], latency: LatencyModel) -> None:
        self.trees = tuple(trees)
        if not self.trees:
            raise EntmtpError("no trees to replay: give at least one tree")
        lengths = np.array([t.num_positions for t in profile.traces], dtype=np.int64)
        self.num_positions = int(lengths.sum())
        if self.num_positions == 0:
            raise EntmtpError("the profile has no positions to replay: profile some prompts first")
        self.trace_tokens = np.maximum(lengths - 1, 0)  # [traces] decode tokens per trajectory
        self.num_tokens = int(self.trace_tokens.sum())
        self.profile = profile
        self.latency = latency
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.ends = self.starts + lengths
        self.entropy = profile.entropy()
        self.draft_entropy = profile.draft_entropy() if profile.has_draft_entropy else None
        positions = np.arange(self.num_positions, dtype=np.int64)
        # Tokens after each position: a step there emits at most these.
        left = np.repeat(self.ends, lengths) - 1 - positions
        ranks = profile.ranks()
        distinct: dict[Tree, np.ndarray] = {}
        rows = []
        for tree in self.trees:
            if tree not in distinct:
                distinct[tree] = np.minimum(accept_lengths(tree, ranks), left)
            rows.append(distinct[tree])
        self.accept = np.stack(rows)  # [trees, positions] int64
        self.tree_ms = tuple(latency.tree_ms(t) for t in self.trees)
        self._empty = np.array([t.num_nodes == 0 for t in self.trees])  # [trees] bool
        self._depths = np.array([t.depth for t in self.trees], dtype=np.int64)  # [trees]
        self._trace_start = np.zeros(self.num_positions, dtype=bool)  # [positions] bool
        self._trace_start[self.starts[self.starts < self.num_positions]] = True
        self._positions = positions
        self._estimates: dict[tuple[EntropyEstimator, str], np.ndarray] = {}

    # -- schedules -------------------------------------------------------------------------
    def estimates(self, estimator: EntropyEstimator, signal: str = BASE_ENTROPY) -> np.ndarray:
        """The estimate of ``signal`` at every position (restarting per trajectory), cached."""
        check_signal(signal, estimator)
        key = (estimator, signal)
        if key not in self._estimates:
            if signal == DRAFT_ENTROPY:
                if self.draft_entropy is None:
                    raise EntmtpError(
                        "this profile has no draft (head 1) entropies: re-run `entmtp "
                        "calibrate` to profile them, or use the base_entropy signal"
                    )
                self._estimates[key] = self.draft_entropy.astype(np.float64)
            else:
                self._estimates[key] = estimator.estimates(self.entropy, trace_starts=self.starts)
        return self._estimates[key]

    def schedule_tree_at(
        self,
        estimator: EntropyEstimator,
        thresholds: Sequence[float],
        bucket_trees: Sequence[int],
        signal: str = BASE_ENTROPY,
    ) -> np.ndarray:
        """Tree index at every position for a schedule over ``self.trees``."""
        buckets = np.searchsorted(
            np.asarray(thresholds, dtype=np.float64), self.estimates(estimator, signal),
            side="right",
        )
        return np.asarray(bucket_trees, dtype=np.int64)[buckets]

    # -- replay ----------------------------------------------------------------------------
    def step_starts(self, tree_at: np.ndarray) -> np.ndarray:
        """Global positions where steps start, trajectory by trajectory: int64 ``[steps]``."""
        jump = self.accept[tree_at, self._positions].tolist()
        steps: list[int] = []
        record = steps.append
        for start, end in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            i, last = start, end - 1
            while i < last:
                record(i)
                i += jump[i]
        return np.asarray(steps, dtype=np.int64)

    def fuses(self, signal: str = BASE_ENTROPY) -> bool:
        """Whether an empty-tree step under ``signal`` also prepares the next step's heads."""
        return signal == DRAFT_ENTROPY and self.latency.fused_empty_ms is not None

    def draft_depth(self, tree_indices: Sequence[int] | np.ndarray) -> int:
        """Depth of the deepest of ``self.trees[i]``: the heads a schedule over them prepares."""
        return max((self.trees[int(i)].depth for i in np.unique(tree_indices)), default=0)

    def _schedule_depth(
        self, tree_at: np.ndarray, signal: str, draft_depth: int | None
    ) -> int | None:
        """``draft_depth``, or the deepest tree ``tree_at`` uses when None; only draft-entropy
        schedules prepare heads, so the others skip the scan over every position."""
        if draft_depth is None and signal == DRAFT_ENTROPY:
            return self.draft_depth(tree_at)
        return draft_depth

    def step_costs(self, signal: str = BASE_ENTROPY, draft_depth: int | None = None) -> np.ndarray:
        """Modelled ms of a step with each tree under ``signal`` when the previous step of its
        trajectory was not an empty-tree step: float64 ``[trees]`` (``cost_table``'s column 0).
        """
        return self.cost_table(signal, draft_depth)[:, 0]

    def cost_table(self, signal: str = BASE_ENTROPY, draft_depth: int | None = None) -> np.ndarray:
        """What the replay charges a step with each tree: float64 ``[trees, 2]``; column 1 is a
        step right after an empty-tree step of the same trajectory, column 0 any other step.

        The one place step costs are defined: ``step_ms`` (every schedule and static tree) and
        ``oracle`` read it, so the oracle bounds what the replay charges by construction.

        ``NO_SIGNAL`` (a one-tree schedule): ``tree_ms`` less the entropy readout the profiled
        steps include (``LatencyModel.entropy_readout_ms``), but not under the autoregressive
        step (nor above ``tree_ms``). A base-entropy schedule: ``tree_ms``.
        A draft-entropy schedule runs the heads before choosing; only an empty tree does not
        reuse them, so only its steps pay the latency model's ``prepare_cost``. With fused heads
        (``fuses``) an empty tree's step costs ``fused_empty_cost + prepare_cost``; right after
        another empty-tree step its projection already gave this step's heads' logits, so an
        empty-tree step costs ``fused_empty_cost`` alone and a drafted step saves the heads'
        projection its ``tree_ms`` includes (about ``prepare_cost``). Every drafted step
        prepares the schedule's ``D`` levels where the step ``tree_ms`` prices drafts its tree's
        own ``d``: it pays ``(D - d) * head_row_ms`` more. ``draft_depth`` is the schedule's
        ``D`` (None: the deepest of all ``self.trees``); only a draft-entropy schedule reads it.
        """
        costs = np.asarray(self.tree_ms, dtype=np.float64)
        if signal == NO_SIGNAL:  # no step is cheaper than the plain one (noisy curves may be)
            floor = np.minimum(costs, self.latency.autoregressive_ms)
            costs = np.maximum(costs - self.latency.entropy_readout_ms, floor)
        if signal != DRAFT_ENTROPY:
            return np.stack([costs, costs], axis=1)
        latency = self.latency
        depth = self.draft_depth(range(len(self.trees))) if draft_depth is None else draft_depth
        extra_rows = np.where(self._empty, 0, np.maximum(depth - self._depths, 0))
        costs = costs + latency.head_row_ms * extra_rows
        prepare = latency.prepare_cost(depth)
        if not self.fuses(signal):
            fresh = costs + np.where(self._empty, prepare, 0.0)
            return np.stack([fresh, fresh], axis=1)
        fused = latency.fused_empty_cost(depth)
        fresh = np.where(self._empty, fused + prepare, costs)
        after_empty = np.where(self._empty, fused, np.maximum(costs - prepare, 0.0))
        return np.stack([fresh, after_empty], axis=1)

    def step_ms(
        self, steps: np.ndarray, tree_at: np.ndarray, signal: str = BASE_ENTROPY,
        draft_depth: int | None = None,
    ) -> np.ndarray:
        """Modelled ms of each step (global start positions ``steps``): float64 ``[steps]``,
        from ``cost_table``. ``draft_depth`` None: the deepest tree that ``tree_at`` uses."""
        draft_depth = self._schedule_depth(tree_at, signal, draft_depth)
        step_tree = tree_at[steps]
        table = self.cost_table(signal, draft_depth)
        after_empty = np.zeros(len(steps), dtype=bool)  # the previous step was an empty tree's
        if len(steps) > 1:
            after_empty[1:] = self._empty[step_tree[:-1]]
            after_empty &= ~self._trace_start[steps]
        return table[step_tree, after_empty.astype(np.int64)]

    def time_ms(
        self, tree_at: np.ndarray, signal: str = BASE_ENTROPY, draft_depth: int | None = None
    ) -> float:
        """Total modelled time of the replay (the search's objective; cheaper than ``run``)."""
        steps = self.step_starts(tree_at)
        return float(self.step_ms(steps, tree_at, signal, draft_depth).sum())

    def run(
        self, tree_at: np.ndarray, *, estimates: np.ndarray | None = None,
        signal: str = BASE_ENTROPY, draft_depth: int | None = None,
    ) -> ReplayResult:
        """Full replay record for a tree index per position (``draft_depth`` as in
        ``step_ms``)."""
        tree_at = np.asarray(tree_at, dtype=np.int64)
        draft_depth = self._schedule_depth(tree_at, signal, draft_depth)
        return self._result(self.step_starts(tree_at), tree_at, estimates, signal, draft_depth)

    def run_schedule(
        self,
        estimator: EntropyEstimator,
        thresholds: Sequence[float],
        bucket_trees: Sequence[int],
        signal: str = BASE_ENTROPY,
    ) -> ReplayResult:
        """Replay a schedule; its draft depth is that of its deepest bucket tree (chosen or
        not), as in the live decoder. One bucket: ``static`` (the live scheduler reads no
        entropy)."""
        if len(bucket_trees) == 1:
            return self.static(int(bucket_trees[0]))
        tree_at = self.schedule_tree_at(estimator, thresholds, bucket_trees, signal)
        return self.run(tree_at, estimates=self.estimates(estimator, signal), signal=signal,
                        draft_depth=self.draft_depth(bucket_trees))

    def static(self, index: int) -> ReplayResult:
        """Replay with ``self.trees[index]`` at every step, reading no entropy."""
        return self.run(np.full(self.num_positions, index, dtype=np.int64), signal=NO_SIGNAL)

    def cost_regimes(self) -> list[tuple[str, int | None, np.ndarray]]:
        """Every way a schedule over ``self.trees`` can be charged: ``(signal, draft_depth,
        allowed)`` with ``allowed`` the trees (bool ``[trees]``) such a schedule may use.

        The base signal may use every tree, and so may a schedule that reads no entropy (one
        tree: ``NO_SIGNAL``); a draft-entropy schedule (only when the profile has
        head-1 entropies) is charged for its deepest tree ``d``, so it uses trees of depth
        <= ``d``, for each depth ``d`` of the set.
        """
        everything = np.ones(len(self.trees), dtype=bool)
        regimes: list[tuple[str, int | None, np.ndarray]] = [(BASE_ENTROPY, None, everything),
                                                             (NO_SIGNAL, None, everything)]
        if self.draft_entropy is not None:
            regimes += [(DRAFT_ENTROPY, int(d), self._depths <= d)
                        for d in np.unique(self._depths)]
        return regimes

    def oracle(self) -> ReplayResult:
        """Best tree of the set per step in hindsight, charged exactly as the replay charges:
        an exact DP from each trajectory's end, for every cost regime (``cost_regimes``), and
        the regime with the least total time (ties: the base signal, then the shallowest).

        ``time[i, e] = min_T cost(T, e) + time[i + a_T(i), T is empty]`` with ``time[G - 1] = 0``
        (accept lengths already cut to ``G - 1 - i``; ``e``: the previous step was an empty-tree
        step, ``cost`` from ``cost_table``); ties go to the lowest tree index. Every schedule and
        static tree over ``self.trees`` is one walk of one regime, so none is faster.
        """
        regimes = self.cost_regimes()
        # [regimes, trees, 2]: inf where a regime cannot use a tree
        costs = np.stack([np.where(allowed[:, None], self.cost_table(signal, depth), np.inf)
                          for signal, depth, allowed in regimes])
        empty = self._empty.astype(np.int64)
        num_regimes, num_trees = costs.shape[:2]
        walks: list[tuple[int, int, np.ndarray]] = []  # (start, length, choice[regimes, L, 2])
        totals = np.zeros(num_regimes)
        for start, end in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            length = end - start
            if length < 2:
                continue
            jumps = self.accept[:, start:end]  # [trees, L]
            best_time = np.zeros((num_regimes, length, 2))
            best_tree = np.zeros((num_regimes, length, 2), dtype=np.int64)
            for i in range(length - 2, -1, -1):
                after = best_time[:, i + jumps[:, i], empty]  # [regimes, trees]
                candidate = costs + after[:, :, None]  # [regimes, trees, 2]
                pick = candidate.argmin(axis=1)  # [regimes, 2]
                best_tree[:, i] = pick
                best_time[:, i] = np.take_along_axis(candidate, pick[:, None, :], axis=1)[:, 0]
            totals += best_time[:, 0, 0]
            walks.append((start, length, best_tree))
        regime = int(np.argmin(totals))
        choice = np.zeros(self.num_positions, dtype=np.int64)
        for start, length, best_tree in walks:
            i, after_empty = 0, 0
            while i < length - 1:
                k = int(best_tree[regime, i, after_empty])
                choice[start + i] = k
                i += int(self.accept[k, start + i])
                after_empty = int(self._empty[k])
        signal, depth, _ = regimes[regime]
        return self.run(choice, signal=signal, draft_depth=depth)

    def _result(
        self, steps: np.ndarray, tree_at: np.ndarray, estimates: np.ndarray | None,
        signal: str, draft_depth: int | None,
    ) -> ReplayResult:
        step_tree = tree_at[steps]
        step_accept = self.accept[step_tree, steps]
        costs = self.step_costs(signal, draft_depth)
        step_ms = self.step_ms(steps, tree_at, signal, draft_depth)
        # The step's trajectory: the last one starting at or before it (empty ones are skipped).
        step_trace = np.searchsorted(self.starts, steps, side="right").astype(np.int64) - 1
        num_traces = len(self.starts)
        trace_steps = np.bincount(step_trace, minlength=num_traces)
        trace_ms = np.bincount(step_trace, weights=step_ms, minlength=num_traces)
        ar_ms = self.latency.autoregressive_ms
        trace_tokens = self.trace_tokens.tolist()
        traces = tuple(
            TraceReplay(
                prompt_index=trace.prompt_index,
                prompt_id=trace.prompt_id,
                tokens=trace_tokens[j],
                steps=int(trace_steps[j]),
                time_ms=float(trace_ms[j]),
                autoregressive_ms=trace_tokens[j] * ar_ms,
            )
            for j, trace in enumerate(self.profile.traces)
        )
        step_estimate = (
            np.full(len(steps), np.nan) if estimates is None else estimates[steps].copy()
        )
        return ReplayResult(
            tokens=self.num_tokens,
            steps=len(steps),
            time_ms=math.fsum(step_ms.tolist()),
            autoregressive_ms=self.num_tokens * ar_ms,
            tree_ms=tuple(costs.tolist()),
            traces=traces,
            step_trace=step_trace,
            step_position=steps - self.starts[step_trace],
            step_tree=step_tree,
            step_accept=step_accept,
            step_estimate=step_estimate,
            step_ms=step_ms,
        )


def replay(
    profile: Profile, schedule_or_tree: Schedule | Tree, latency: LatencyModel
) -> ReplayResult:
    """Exact greedy replay of a schedule (or one static tree) over every trajectory."""
    schedule = as_schedule(schedule_or_tree)
    replayer = Replayer(profile, schedule.trees, latency)
    return replayer.run_schedule(
        schedule.estimator, schedule.thresholds, range(schedule.num_buckets), schedule.signal
    )


def oracle_replay(
    profile: Profile, trees: Sequence[Tree], latency: LatencyModel
) -> ReplayResult:
    """The best tree of ``trees`` at every step in hindsight: an upper bound on any schedule."""
    return Replayer(profile, trees, latency).oracle()


def best_static(
    profile: Profile, trees: Sequence[Tree], latency: LatencyModel
) -> tuple[int, ReplayResult]:
    """The single tree with the highest replayed tokens/s (ties: the lowest index)."""
    replayer = Replayer(profile, trees, latency)
    return best_static_of(replayer)


def best_static_of(replayer: Replayer) -> tuple[int, ReplayResult]:
    best_index, best_result = 0, replayer.static(0)
    for index in range(1, len(replayer.trees)):
        result = replayer.static(index)
        if result.time_ms < best_result.time_ms:
            best_index, best_result = index, result
    return best_index, best_result
