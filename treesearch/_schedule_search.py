"""Calibrate an entropy schedule over candidate trees with Optuna, scored by exact replay.

Each trial proposes the parts that are not additive (see docs/design.md):

- the number of buckets ``B`` in ``1..max_buckets``;
- the signal, when the profile has head-1 entropies: ``base_entropy`` or ``draft_entropy``
  (the latter with the ``last`` estimator: see ``_schedule``);
- for the base signal, the estimator: ``ema`` (alpha on a log scale), ``window`` (size on a log
  scale) or ``last``;
- ``B - 1`` quantile levels in [0, 1] of the calibration estimates under that estimator, turned
  into thresholds halfway between the quantile's estimate and the next larger one (so an
  estimate never sits on a threshold, and float noise in a live estimate rarely flips a bucket).

The tree per bucket is not sampled: given the buckets, it is chosen by coordinate ascent on the
exact replayed time. Start with the best static tree in every bucket; for each bucket in turn try
every candidate and keep it if the whole profile replays strictly faster; sweep until a sweep
changes nothing. Replay is exact and cheap, and every trial starts from the best static tree
and only keeps improvements, so no trial scores below it. The trial's value is replayed
tokens/s on the given profile: decode tokens (each trajectory's length less its prefill token,
the same for every schedule) over total step time, so it is maximal at minimal total time.

The final schedule is the best trial's, with adjacent buckets that share a tree merged, and it
is replayed once more in full; if it is not strictly faster than the best static tree, the
static tree is returned instead. It can never beat the hindsight oracle over the candidates,
which is returned alongside.

Thresholds fitted to a few thousand positions can win by noise: a schedule 1% faster than the
static tree on the calibration traces may be slower on new text. With ``validation_folds`` K >=
2 a switching schedule must also win out of sample: the prompts are split into K folds, the
whole search runs again on every K - 1 of them, and its schedule and its best static tree are
replayed on the fold left out. Unless the schedules' summed held-out time is below the static
trees', by a gain beyond the latency model's noise (below), the best static tree is shipped
(``ScheduleSearchResult.validation`` says why).

A gain that small can also come from the latency model's own noise: trees whose measured step
times sit a little low look like a win. So a switching schedule must also gain more over the best
static tree, on the calibration traces, than ``LatencyModel.noise_gain_bound`` (the gain the
model's measured spread alone could produce; see ``_latency``); otherwise the best static tree is
shipped (``ScheduleSearchResult.noise`` says why). The held-out gain is held to the same bound:
a schedule that wins on the calibration traces by more than noise but out of sample by less has
not shown it generalizes. A model without a measured spread cannot apply it (``bound`` None).

``storage``: None (in memory), an Optuna database URL, or ``journal:PATH`` (a journal file that
several processes can share; give each process its own ``seed``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entmtp.core import EntmtpError

from ._estimator import EntropyEstimator
from ._latency import LatencyModel
from ._profile import Profile
from ._replay import Replayer, ReplayResult, best_static_of, replay
from ._schedule import BASE_ENTROPY, DRAFT_ENTROPY, Schedule
from ._storage import JOURNAL_PREFIX, import_optuna, open_storage  # noqa: F401 - re-exported
from ._tree import Tree

DEFAULT_STUDY_NAME = "entmtp-schedule"
ALPHA_RANGE = (0.005, 1.0)
WINDOW_RANGE = (2, 64)
_FINGERPRINT_ATTR = "entmtp_schedule_fingerprint"


@dataclass(frozen=True)
class StudySummary:
    study_name: str
    storage: str | None  # None: in memory
    n_trials: int  # completed trials in the study, from every process that shared it
    best_trial: int | None  # number of the trial the schedule came from; None: static fallback
    best_value: float  # the best trial's replayed tokens/s


@dataclass(frozen=True)
class Validation:
    """K-fold check of the search: each fold replayed with the schedule and the best static tree
    searched on the other folds."""

    folds: int
    schedule_ms: float  # summed over the held-out folds
    static_ms: float
    bound: float | None = None  # LatencyModel.noise_gain_bound(); None: no spread measured

    @property
    def gain(self) -> float:
        """Held-out schedule tokens/s over held-out static tokens/s."""
        return self.static_ms / self.schedule_ms if self.schedule_ms > 0 else 1.0

    @property
    def passed(self) -> bool:
        """Faster on the held-out folds, by more than the latency model's noise could make it."""
        return self.schedule_ms < self.static_ms and NoiseCheck(self.gain, self.bound).passed


@dataclass(frozen=True)
class NoiseCheck:
    """The switching schedule's replayed gain over the best static tree against what the
    latency model's noise could produce."""

    gain: float  # schedule tokens/s over the best static tree's, calibration traces
    bound: float | None  # LatencyModel.noise_gain_bound(); None: no spread measured

    @property
    def passed(self) -> bool:
        return self.bound is None or self.gain > self.bound


@dataclass(frozen=True, eq=False)
class ScheduleSearchResult:
    schedule: Schedule
    result: ReplayResult  # exact replay of ``schedule`` on the calibration profile
    candidates: tuple[Tree, ...]
    bucket_candidates: tuple[int, ...]  # index into ``candidates`` of each schedule tree
    best_static_index: int  # index into ``candidates``
    best_static: ReplayResult
    oracle: ReplayResult  # best candidate per step in hindsight: the bound for any schedule
    study: StudySummary
    validation: Validation | None = None  # None: not run (off, too few prompts, or static won)
    noise: NoiseCheck | None = None  # None: no switching schedule beat the static tree
    validation_folds: int = 0  # folds asked for (0: the check is off)

    @property
    def gain_over_static(self) -> float:
        """Schedule tokens/s over the best static tree's (>= 1)."""
        return self.result.tokens_per_second / self.best_static.tokens_per_second

    @property
    def fraction_of_oracle(self) -> float:
        """Schedule tokens/s over the oracle's (<= 1)."""
        return self.result.tokens_per_second / self.oracle.tokens_per_second


def thresholds_from_levels(estimates: np.ndarray, levels: Sequence[float]) -> tuple[float, ...]:
    """Thresholds for quantile ``levels`` of ``estimates``: strictly ascending, deduplicated.

    Each lies halfway between the estimate at that quantile and the next larger distinct
    estimate; a level at or above the largest estimate gives no threshold.
    """
    distinct = np.unique(np.asarray(estimates, dtype=np.float64))
    if len(distinct) < 2 or len(levels) == 0:
        return ()
    values = np.quantile(estimates, np.clip(np.asarray(levels, dtype=np.float64), 0, 1),
                         method="inverted_cdf")
    above = np.searchsorted(distinct, values, side="right")
    above = above[above < len(distinct)]
    mids = (distinct[above - 1] + distinct[above]) / 2.0
    return tuple(float(t) for t in np.unique(mids))


def _fingerprint(profile: Profile, candidates: Sequence[Tree], latency: LatencyModel) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([t.to_json() for t in candidates]).encode())
    digest.update(json.dumps([latency.nodes, latency.verify_ms, latency.depth_ms,
                              latency.prepare_ms, latency.fused_empty_ms,
                              latency.prepare_ms_by_depth,
                              latency.fused_empty_ms_by_depth,
                              # only when set: unpadded models keep their earlier fingerprints
                              *([latency.padded_nodes] if latency.padded_nodes else [])]).encode())
    digest.update(np.ascontiguousarray(profile.entropy()).tobytes())
    digest.update(np.ascontiguousarray(profile.ranks()).tobytes())
    return digest.hexdigest()[:16]


class _Objective:
    """Trial -> replayed tokens/s, with the tree per bucket chosen by coordinate ascent."""

    def __init__(self, replayer: Replayer, start: int, max_buckets: int) -> None:
        self.replayer = replayer
        self.start = start
        self.max_buckets = max_buckets
        self.tokens = replayer.num_tokens  # decode tokens: the same for every schedule
        self.static_ms = replayer.time_ms(np.full(replayer.num_positions, start, dtype=np.int64))
        self._times: dict[tuple, float] = {}

    def suggest(self, trial) -> tuple[str, EntropyEstimator, tuple[float, ...]]:
        num_buckets = trial.suggest_int("num_buckets", 1, self.max_buckets)
        signals = [BASE_ENTROPY]
        if self.replayer.draft_entropy is not None:
            signals.append(DRAFT_ENTROPY)
        signal = trial.suggest_categorical("signal", signals)
        if signal == DRAFT_ENTROPY:
            estimator = EntropyEstimator.last()
        else:
            kind = trial.suggest_categorical("estimator", ["ema", "window", "last"])
            if kind == "ema":
                alpha = trial.suggest_float("alpha", *ALPHA_RANGE, log=True)
                estimator = EntropyEstimator.ema(alpha)
            elif kind == "window":
                size = trial.suggest_int("window", *WINDOW_RANGE, log=True)
                estimator = EntropyEstimator.window(size)
            else:
                estimator = EntropyEstimator.last()
        levels = [trial.suggest_float(f"level{b}", 0.0, 1.0) for b in range(num_buckets - 1)]
        estimates = self.replayer.estimates(estimator, signal)
        return signal, estimator, thresholds_from_levels(estimates, levels)

    def __call__(self, trial) -> float:
        signal, estimator, thresholds = self.suggest(trial)
        bucket_trees, time_ms = self.assign_trees(estimator, thresholds, signal)
        trial.set_user_attr("signal", signal)
        trial.set_user_attr("estimator", estimator.to_json())
        trial.set_user_attr("thresholds", list(thresholds))
        trial.set_user_attr("bucket_trees", bucket_trees)
        return 1000.0 * self.tokens / time_ms if time_ms > 0 else 0.0

    def assign_trees(
        self, estimator: EntropyEstimator, thresholds: tuple[float, ...],
        signal: str = BASE_ENTROPY,
    ) -> tuple[list[int], float]:
        """Coordinate ascent on replayed time from the best static tree in every bucket."""
        num_buckets = len(thresholds) + 1
        choice = [self.start] * num_buckets
        if num_buckets == 1:
            return choice, self.static_ms
        buckets = np.searchsorted(
            np.asarray(thresholds), self.replayer.estimates(estimator, signal), side="right"
        )
        occupied = np.bincount(buckets, minlength=num_buckets) > 0
        trees = self.replayer.trees

        def time_of(assignment: list[int]) -> float:
            key = (signal, estimator, thresholds, tuple(assignment))
            if key not in self._times:
                tree_at = np.asarray(assignment, dtype=np.int64)[buckets]
                # the live decoder prepares heads for every tree of the schedule, used or not
                self._times[key] = self.replayer.time_ms(
                    tree_at, signal, self.replayer.draft_depth(assignment)
                )
            return self._times[key]

        # A draft-entropy schedule that serves one tree everywhere costs at least the static
        # tree (more, if that tree is empty): start from what this signal really costs.
        best = time_of(choice)
        changed = True
        while changed:
            changed = False
            for b in np.flatnonzero(occupied).tolist():
                for c in range(len(trees)):
                    if trees[c] == trees[choice[b]]:
                        continue
                    proposal = choice.copy()
                    proposal[b] = c
                    time_ms = time_of(proposal)
                    if time_ms < best:
                        best, choice, changed = time_ms, proposal, True
        return choice, best


def _merge_buckets(
    candidates: Sequence[Tree], bucket_trees: Sequence[int], thresholds: Sequence[float]
) -> tuple[list[int], list[float]]:
    """Drop thresholds between adjacent buckets that use the same tree."""
    kept_trees, kept_thresholds = [bucket_trees[0]], []
    for threshold, index in zip(thresholds, bucket_trees[1:], strict=True):
        if candidates[index] == candidates[kept_trees[-1]]:
            continue
        kept_trees.append(index)
        kept_thresholds.append(threshold)
    return kept_trees, kept_thresholds


def calibrate_schedule(
    profile: Profile,
    candidates: Sequence[Tree],
    latency: LatencyModel,
    *,
    n_trials: int = 200,
    seed: int = 0,
    max_buckets: int = 4,
    storage: str | None = None,
    study_name: str | None = None,
    show_progress: bool = False,
    validation_folds: int = 0,
) -> ScheduleSearchResult:
    """Search buckets, thresholds, estimator and tree per bucket for the best replayed tokens/s.

    Never returns a schedule slower than the best single candidate on ``profile``; see the module
    doc for the search space, the coordinate ascent that picks each bucket's tree and the
    ``validation_folds`` check.
    """
    candidates = tuple(candidates)
    if not candidates:
        raise EntmtpError("no candidate trees to schedule: build a Pareto front first")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0:
        raise EntmtpError(f"n_trials must be a non-negative integer, got {n_trials!r}")
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 1:
        raise EntmtpError(f"max_buckets must be an integer >= 1, got {max_buckets!r}")
    if (isinstance(validation_folds, bool) or not isinstance(validation_folds, int)
            or validation_folds < 0 or validation_folds == 1):
        raise EntmtpError(f"validation_folds must be 0 (off) or an integer >= 2, got "
                          f"{validation_folds!r}")
    optuna = import_optuna()
    replayer = Replayer(profile, candidates, latency)
    static_index, static_result = best_static_of(replayer)
    oracle = replayer.oracle()
    objective = _Objective(replayer, static_index, max_buckets)

    name = study_name or DEFAULT_STUDY_NAME
    opened = open_storage(storage)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        try:
            study = optuna.create_study(
                storage=opened,
                study_name=name,
                direction="maximize",
                sampler=optuna.samplers.TPESampler(seed=seed),
                load_if_exists=True,
            )
        except Exception as err:  # noqa: BLE001 - storage backends raise many kinds
            raise EntmtpError(
                f"cannot create or load study {name!r} in {storage!r} ({type(err).__name__}: "
                f"{err}); check the storage or choose another --study-name"
            ) from err
        fingerprint = _fingerprint(profile, candidates, latency)
        existing = study.user_attrs.get(_FINGERPRINT_ATTR)
        if existing is None:
            study.set_user_attr(_FINGERPRINT_ATTR, fingerprint)
        elif existing != fingerprint:
            raise EntmtpError(
                f"study {name!r} was run on another profile, candidate set or latency model: "
                "choose a new study name"
            )
        if n_trials:
            study.optimize(objective, n_trials=n_trials, show_progress_bar=show_progress)
    finally:
        optuna.logging.set_verbosity(verbosity)

    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    schedule = Schedule.static(candidates[static_index])
    bucket_candidates = [static_index]
    best_trial, best_value = None, static_result.tokens_per_second
    result = static_result
    if completed:
        best = study.best_trial
        best_value = float(best.value)
        merged_trees, merged_thresholds = _merge_buckets(
            candidates, best.user_attrs["bucket_trees"], best.user_attrs["thresholds"]
        )
        if len(merged_trees) > 1:
            proposal = Schedule(
                tuple(candidates[i] for i in merged_trees),
                tuple(merged_thresholds),
                EntropyEstimator.from_json(best.user_attrs["estimator"]),
                best.user_attrs.get("signal", BASE_ENTROPY),
            )
            proposal_result = replay(profile, proposal, latency)
            if proposal_result.time_ms < static_result.time_ms:
                schedule, result = proposal, proposal_result
                bucket_candidates, best_trial = merged_trees, best.number
    validation = noise = None
    if best_trial is not None:
        noise = NoiseCheck(static_result.time_ms / result.time_ms, latency.noise_gain_bound())
        if not noise.passed:
            schedule, result = Schedule.static(candidates[static_index]), static_result
            bucket_candidates, best_trial = [static_index], None
    if best_trial is not None and validation_folds >= 2:
        validation = cross_validate(profile, candidates, latency, folds=validation_folds,
                                    n_trials=n_trials, seed=seed, max_buckets=max_buckets)
        if validation is not None and not validation.passed:
            schedule, result = Schedule.static(candidates[static_index]), static_result
            bucket_candidates, best_trial = [static_index], None
    summary = StudySummary(
        study_name=name,
        storage=storage,
        n_trials=len(completed),
        best_trial=best_trial,
        best_value=best_value if math.isfinite(best_value) else 0.0,
    )
    return ScheduleSearchResult(
        schedule=schedule,
        result=result,
        candidates=candidates,
        bucket_candidates=tuple(bucket_candidates),
        best_static_index=static_index,
        best_static=static_result,
        oracle=oracle,
        study=summary,
        validation=validation,
        noise=noise,
        validation_folds=validation_folds,
    )


def fold_of_prompts(prompt_indices: Sequence[int], folds: int, seed: int) -> dict[int, int]:
    """A seeded, balanced split of prompts into ``folds`` folds: prompt index -> fold."""
    ordered = sorted(set(int(p) for p in prompt_indices))
    order = np.random.default_rng(seed).permutation(len(ordered))
    return {ordered[int(i)]: rank % folds for rank, i in enumerate(order)}


def cross_validate(
    profile: Profile, candidates: Sequence[Tree], latency: LatencyModel, *, folds: int,
    n_trials: int, seed: int, max_buckets: int,
) -> Validation | None:
    """Search on all folds but one, replay the one left out, for every fold (see the module doc).

    None when fewer prompts with a decoding step than ``folds`` (nothing to hold out).
    """
    usable = [t.prompt_index for t in profile.traces if t.num_positions >= 2]
    if len(set(usable)) < folds:
        return None
    fold = fold_of_prompts(usable, folds, seed)
    schedule_ms = static_ms = 0.0
    for k in range(folds):
        train = profile.subset(p for p, f in fold.items() if f != k)
        test = profile.subset(p for p, f in fold.items() if f == k)
        searched = calibrate_schedule(train, candidates, latency, n_trials=n_trials, seed=seed,
                                      max_buckets=max_buckets)
        held_out = replay(test, searched.schedule, latency)
        static = replay(test, candidates[searched.best_static_index], latency)
        schedule_ms += held_out.time_ms
        static_ms += static.time_ms
    return Validation(folds, schedule_ms, static_ms, latency.noise_gain_bound())
