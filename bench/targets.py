"""The project's targets for `entmtp bench`'s prediction check, marked PASS / MISS per bundle:

    entmtp bench --task code --bundle runs/code-medusa --bundle runs/code-hydra \
        --targets bench/targets.py

Each target names a field of the prediction check (``PredictionCheck.to_json``'s keys) and what
it must reach, optionally only on some tasks or for one head type's bundle (n/a elsewhere).
``entmtp bench --targets FILE`` loads ``TARGETS`` from any such file and judges each bundle with
``Target.verdict``; a report lists the verdicts by ``Target.name``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from entmtp.evaluation import DRIFT_LIMIT, REFERENCE_TREE


@dataclass(frozen=True)
class Target:
    """One target for an entmtp row: ``value >= at_least``, or a ratio within ``within`` of 1
    (relative), or (neither) a flag that must be true."""

    key: str  # the prediction's field it checks
    label: str
    at_least: float | None = None
    within: float | None = None
    not_applicable_when: str | None = None  # a prediction flag that makes this target n/a
    tasks: tuple[str, ...] | None = None  # the tasks it holds on (None: every task)
    heads: str | None = None  # the bundles' head type it holds for (None: every type)

    @property
    def name(self) -> str:
        """Its key among a report's targets: two targets may check one field on other tasks."""
        return self.key if self.tasks is None else f"{self.key}@{'+'.join(self.tasks)}"

    def applies(self, task: str, prediction: Mapping[str, Any]) -> bool:
        """Whether it judges this bundle's prediction check (its JSON) on this task."""
        if self.tasks is not None and task not in self.tasks:
            return False
        if self.heads is not None and prediction.get("heads") != self.heads:
            return False
        return not (self.not_applicable_when and prediction.get(self.not_applicable_when))

    def verdict(self, task: str, prediction: Mapping[str, Any]) -> bool | None:
        """PASS / MISS of this bundle on this task; None: n/a (not applicable or not measured)."""
        return self.passes(prediction.get(self.key)) if self.applies(task, prediction) else None

    def passes(self, value: Any) -> bool | None:
        """PASS / MISS; None when the value could not be measured (e.g. no such row)."""
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return None
        if self.within is not None:
            return abs(float(value) - 1.0) <= self.within
        if self.at_least is not None:
            return float(value) >= self.at_least
        return bool(value)

    def goal(self) -> str:
        if self.within is not None:
            return f"1 ± {self.within:.0%}"
        if self.at_least is not None:
            return (f">= {self.at_least:.0%}" if self.key == "fraction_of_oracle"
                    else f">= {self.at_least:.2f}x")
        return "yes"


TARGETS: tuple[Target, ...] = (
    # each bundle against its own head type's heads with mc_sim_7b_63
    Target(f"speedup_vs_hydra-{REFERENCE_TREE}", "vs hydra", at_least=1.15, heads="hydra"),
    Target(f"speedup_vs_medusa-{REFERENCE_TREE}", "vs medusa", at_least=1.36, heads="medusa"),
    # a one-tree bundle that is its best static tree is timed against itself
    Target("speedup_vs_best_static", "vs static", at_least=1.0,
           not_applicable_when="schedule_is_best_static"),
    Target("speedup_vs_autoregressive", "vs AR (math)", at_least=1.5, tasks=("math",)),
    Target("speedup_vs_autoregressive", "vs AR (code)", at_least=1.25, tasks=("code",)),
    Target("fraction_of_oracle", "of oracle", at_least=0.90),
    Target("accept_length_ratio", "accept meas/replay", within=0.01),
    # the tolerance past which the prediction check warns of a drifted machine: such a drift
    # misses this target by itself
    Target("tokens_per_second_ratio", "tok/s meas/replay", within=DRIFT_LIMIT),
    Target("lossless", "lossless"),
)
