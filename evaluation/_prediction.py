"""The prediction check of a bundle on live runs: its schedule, best static tree and the
hindsight oracle over its trees, replayed on the profile of the live greedy trajectories with
the bundle's latency model, against what was measured.

``check_prediction`` returns a ``PredictionCheck``; ``PredictionCheck.to_json`` is the one place
that writes it (``entmtp bench --json``'s ``predictions``). Which of its numbers count as
targets, and what they must reach, is the caller's (``bench/targets.py`` for the benchmark).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from entmtp.treesearch import Bundle, Profile, ReplayResult, Tree, oracle_replay, replay

from ._validation import (
    MethodRuns,
    StepComparison,
    TreeStepTime,
    accept_only_latency,
    compare_steps,
    ratio,
    step_times_by_tree,
)

# Measured autoregressive speed further than this (relative) from the latency model's: the
# machine drifted since the model was measured, and every replayed tokens/s is off by as much.
DRIFT_LIMIT = 0.10


def drift_warning(measured_over_modelled: float | None) -> str | None:
    """What to do when measured autoregressive decoding runs far from the latency model's."""
    if measured_over_modelled is None or not math.isfinite(measured_over_modelled):
        return None
    if abs(measured_over_modelled - 1.0) <= DRIFT_LIMIT:
        return None
    way = "slower" if measured_over_modelled < 1.0 else "faster"
    return (f"autoregressive decoding ran at {measured_over_modelled:.2f}x the latency model's "
            f"speed (more than {DRIFT_LIMIT:.0%} {way} than when it was measured): every "
            "replayed tokens/s is off by about as much, and the trees may no longer be the best "
            "here; re-measure with `entmtp latency --random-weights --device ... --out FILE` on "
            "this machine while it is quiet, then `entmtp retarget RUN_DIR --latency FILE`")


@dataclass(frozen=True)
class Rates:
    mean_accept_length: float  # decode tokens per step
    tokens_per_second: float | None  # decode tokens per second; None: not timed

    def to_json(self) -> dict[str, Any]:
        return {"mean_accept_length": self.mean_accept_length,
                "tokens_per_second": self.tokens_per_second}


@dataclass(frozen=True)
class ReplayedRates(Rates):
    decode_tokens: int
    steps: int

    @classmethod
    def of(cls, result: ReplayResult, timed: bool) -> ReplayedRates:
        return cls(result.mean_accept_length, result.tokens_per_second if timed else None,
                   result.tokens, result.steps)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "decode_tokens": self.decode_tokens, "steps": self.steps}


def measured_rates(runs: MethodRuns) -> Rates:
    return Rates(runs.mean_accept_length, runs.tokens_per_second)


@dataclass(frozen=True)
class OracleBound:
    """The hindsight bound over the bundle's trees (a bound, not measured)."""

    name: str  # its row name
    source: str  # where the bound comes from (a replay here, or the bundle's prediction)
    tokens_per_second: float
    # the rest only for a replay with the bundle's latency model (None: the bundle's prediction)
    replayed: ReplayedRates | None = None
    speedup_vs_autoregressive: float | None = None
    entmtp_replayed_tokens_per_second: float | None = None
    entmtp_fraction_of_oracle: float | None = None  # the replayed schedule over the bound
    # that fraction applied to the measured schedule: an estimate in measured units
    estimated_measured_tokens_per_second: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "measured": False, "source": self.source,
                               "tokens_per_second": self.tokens_per_second}
        if self.replayed is not None:
            out.update({
                "mean_accept_length": self.replayed.mean_accept_length,
                "decode_tokens": self.replayed.decode_tokens,
                "steps": self.replayed.steps,
                "speedup": {"autoregressive": self.speedup_vs_autoregressive},
                "entmtp_replayed_tokens_per_second": self.entmtp_replayed_tokens_per_second,
                "entmtp_fraction_of_oracle": self.entmtp_fraction_of_oracle,
                "estimated_measured_tokens_per_second":
                    self.estimated_measured_tokens_per_second,
            })
        return out


@dataclass(frozen=True)
class StaticCheck:
    """The bundle's best static tree: measured against replayed."""

    row: str
    measured: Rates
    replayed: ReplayedRates
    accept_length_ratio: float  # measured over replayed
    tokens_per_second_ratio: float | None  # measured over replayed; None: not timed
    step_time_by_tree: tuple[TreeStepTime, ...] | None  # None: not timed

    def to_json(self) -> dict[str, Any]:
        out = {"row": self.row, "measured": self.measured.to_json(),
               "replayed": self.replayed.to_json(),
               "accept_length_ratio": self.accept_length_ratio,
               "tokens_per_second_ratio": self.tokens_per_second_ratio}
        if self.step_time_by_tree is not None:
            out["step_time_by_tree"] = [t.to_json() for t in self.step_time_by_tree]
        return out


@dataclass(frozen=True)
class PredictionCheck:
    """A bundle's schedule measured live against its replay on the same trajectories."""

    bundle: str  # where the bundle was read
    heads: str  # its head type
    row: str  # the measured schedule's row name
    latency_model: dict[str, Any] | None  # the latency model's hardware; None: the bundle has none
    measured: Rates
    replayed: ReplayedRates
    calibration_predicted: Rates  # the bundle's own prediction (its calibration split)
    accept_length_ratio: float  # measured over replayed
    tokens_per_second_ratio: float | None  # measured over replayed; None: not timed
    replay_steps: StepComparison  # live steps against the replay's
    lossless: bool  # every output equals autoregressive decoding's
    oracle: OracleBound
    step_time_by_tree: tuple[TreeStepTime, ...] | None  # None: not timed
    fraction_of_oracle: float | None  # replayed over the bound; None: one tree or not timed
    best_static: StaticCheck | None  # None: no best-static row measured
    # the bundle is one tree, its best static one: the best-static row runs the same steps, so
    # the speedup over it measures only noise
    schedule_is_best_static: bool
    # (row name, speedup over it) of each reference row (None: not measured)
    speedup_vs_references: tuple[tuple[str, float | None], ...]
    speedup_vs_best_static: float | None
    speedup_vs_best_static_ci95: list[float] | None  # 95% paired interval over prompts
    # the latency model's schedule-over-static gain on these trajectories (None: not timed or
    # no best-static row)
    replayed_speedup_vs_best_static: float | None
    # measured autoregressive tokens/s over the latency model's (None: not timed)
    autoregressive_measured_over_modelled: float | None
    warnings: tuple[str, ...]
    speedup_vs_autoregressive: float | None

    @staticmethod
    def scalar_keys(reference_rows: Sequence[str]) -> tuple[str, ...]:
        """The JSON keys whose value is one number or flag (what a target can check)."""
        return ("accept_length_ratio", "tokens_per_second_ratio", "replay_step_agreement",
                "lossless", "fraction_of_oracle", *(f"speedup_vs_{r}" for r in reference_rows),
                "speedup_vs_best_static", "replayed_speedup_vs_best_static",
                "autoregressive_measured_over_modelled", "speedup_vs_autoregressive")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bundle": self.bundle,
            "heads": self.heads,
            "row": self.row,
            "latency_model": self.latency_model,
            "measured": self.measured.to_json(),
            "replayed": self.replayed.to_json(),
            "calibration_predicted": self.calibration_predicted.to_json(),
            "accept_length_ratio": self.accept_length_ratio,
            "tokens_per_second_ratio": self.tokens_per_second_ratio,
            "replay_step_agreement": self.replay_steps.agreement,
            "replay_steps_equal": self.replay_steps.steps_equal,
            "replay_steps_compared": self.replay_steps.steps_compared,
            "lossless": self.lossless,
            "oracle": self.oracle.to_json(),
        }
        if self.step_time_by_tree is not None:
            out["step_time_by_tree"] = [t.to_json() for t in self.step_time_by_tree]
        out["fraction_of_oracle"] = self.fraction_of_oracle
        out["schedule_is_best_static"] = self.schedule_is_best_static
        if self.best_static is not None:
            out["best_static"] = self.best_static.to_json()
        for name, speedup in self.speedup_vs_references:
            out[f"speedup_vs_{name}"] = speedup
        out["speedup_vs_best_static"] = self.speedup_vs_best_static
        out["speedup_vs_best_static_ci95"] = self.speedup_vs_best_static_ci95
        if self.replayed_speedup_vs_best_static is not None:
            out["replayed_speedup_vs_best_static"] = self.replayed_speedup_vs_best_static
        if self.autoregressive_measured_over_modelled is not None:
            out["autoregressive_measured_over_modelled"] = (
                self.autoregressive_measured_over_modelled)
        out["warnings"] = list(self.warnings)
        out["speedup_vs_autoregressive"] = self.speedup_vs_autoregressive
        return out


def check_prediction(
    bundle: Bundle,
    profile: Profile,
    live: MethodRuns,
    *,
    autoregressive: MethodRuns,
    best_static: MethodRuns | None,
    speedups: Mapping[str, float],
    speedup_intervals: Mapping[str, list[float] | None],
    reference_rows: Sequence[str],
    prompt_ids: Sequence[str],
    bundle_path: str,
    oracle_name: str,
) -> PredictionCheck:
    """The bundle's prediction check on these prompts.

    ``profile``: the bundle's heads' profile of ``autoregressive``'s outputs; ``live``: the runs
    of the bundle's schedule (``best_static``: of its best static tree) on the same prompts, in
    the profile's trace order; ``speedups`` / ``speedup_intervals``: ``live``'s speedup over
    each baseline row by name (with its 95% interval over prompts).
    """
    timed = bundle.latency is not None
    latency = bundle.latency or accept_only_latency()
    schedule_spec = bundle.schedule()
    schedule = replay(profile, schedule_spec, latency)
    trees = list(bundle.trees)
    if bundle.best_static is not None and bundle.best_static.tree not in trees:
        trees.append(bundle.best_static.tree)
    one_tree = len(trees) == 1  # the schedule and its best static tree are one tree
    oracle = _oracle(bundle, profile, trees, schedule, live, oracle_name)
    static = None
    if best_static is not None:
        static = _static_check(bundle.best_static.tree, profile, best_static, latency, timed,
                               prompt_ids)
    replayed_over_static = None
    if static is not None and timed:
        # What the latency model says the schedule gains over the static tree on these very
        # trajectories: the live ratio's noise-free counterpart.
        replayed_over_static = ratio(schedule.tokens_per_second,
                                     static.replayed.tokens_per_second)
    # Above 1: the machine ran faster than when its latency model was measured, which moves
    # every row's measured/replayed tokens/s alike.
    drift = (ratio(autoregressive.tokens_per_second, 1000.0 / latency.autoregressive_ms)
             if timed else None)
    warning = drift_warning(drift)
    warnings = ([warning] if warning else []) + [
        f"the bundle's latency model fails a check: {w}" for w in
        (bundle.latency.warnings if bundle.latency is not None else [])]
    static_name = best_static.name if best_static is not None else None
    return PredictionCheck(
        bundle=bundle_path,
        heads=bundle.heads.type,
        row=live.name,
        latency_model=dict(latency.hardware) if timed else None,
        measured=measured_rates(live),
        replayed=ReplayedRates.of(schedule, timed),
        calibration_predicted=Rates(bundle.predicted.mean_accept_length,
                                    bundle.predicted.tokens_per_second),
        accept_length_ratio=ratio(live.mean_accept_length, schedule.mean_accept_length),
        tokens_per_second_ratio=(ratio(live.tokens_per_second, schedule.tokens_per_second)
                                 if timed else None),
        replay_steps=compare_steps(live.results, schedule, prompt_ids),
        lossless=not live.identical_to(autoregressive),
        oracle=oracle,
        step_time_by_tree=(tuple(step_times_by_tree(live.results, schedule, prompt_ids,
                                                    schedule_spec.trees)) if timed else None),
        # Over one tree the hindsight bound is that tree: a one-tree bundle (the search found no
        # switching that held up out of sample) has no schedule for the bound to measure.
        fraction_of_oracle=oracle.entmtp_fraction_of_oracle if not one_tree else None,
        best_static=static,
        schedule_is_best_static=bundle.schedule_is_best_static,
        speedup_vs_references=tuple((name, speedups.get(name)) for name in reference_rows),
        speedup_vs_best_static=speedups.get(static_name) if static_name else None,
        speedup_vs_best_static_ci95=(speedup_intervals.get(static_name) if static_name
                                     else None),
        replayed_speedup_vs_best_static=replayed_over_static,
        autoregressive_measured_over_modelled=drift,
        warnings=tuple(warnings),
        speedup_vs_autoregressive=speedups.get(autoregressive.name),
    )


def _static_check(tree: Tree, profile: Profile, runs: MethodRuns, latency, timed: bool,
                  prompt_ids: Sequence[str]) -> StaticCheck:
    static = replay(profile, tree, latency)
    return StaticCheck(
        row=runs.name,
        measured=measured_rates(runs),
        replayed=ReplayedRates.of(static, timed),
        accept_length_ratio=ratio(runs.mean_accept_length, static.mean_accept_length),
        tokens_per_second_ratio=(ratio(runs.tokens_per_second, static.tokens_per_second)
                                 if timed else None),
        step_time_by_tree=(tuple(step_times_by_tree(runs.results, static, prompt_ids, [tree]))
                           if timed else None),
    )


def _oracle(bundle: Bundle, profile: Profile, trees: Sequence[Tree], schedule: ReplayResult,
            live: MethodRuns, name: str) -> OracleBound:
    """The hindsight bound over the bundle's trees replayed on these prompts with its latency
    model (without one: the bundle's own calibration-split prediction)."""
    if bundle.latency is None:
        return OracleBound(name, "bundle prediction", bundle.predicted.oracle_tokens_per_second)
    bound = oracle_replay(profile, trees, bundle.latency)
    return OracleBound(
        name, "replay on these prompts, bundle latency model", bound.tokens_per_second,
        replayed=ReplayedRates.of(bound, True),
        speedup_vs_autoregressive=bound.speedup_vs_autoregressive,
        entmtp_replayed_tokens_per_second=schedule.tokens_per_second,
        entmtp_fraction_of_oracle=ratio(schedule.tokens_per_second, bound.tokens_per_second),
        estimated_measured_tokens_per_second=ratio(
            live.tokens_per_second * bound.tokens_per_second, schedule.tokens_per_second),
    )
