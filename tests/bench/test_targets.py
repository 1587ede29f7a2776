"""bench/targets.py as `entmtp bench --targets` judges a bundle's prediction check: per task, per
head type and each goal's direction, on synthetic prediction checks (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from entmtp.calibrate import TASKS
from entmtp.cli import _bench

TARGETS = _bench.load_targets(Path(__file__).resolve().parents[2] / "bench" / "targets.py")
HYDRA_REF, MEDUSA_REF = "speedup_vs_hydra-mc_sim_7b_63", "speedup_vs_medusa-mc_sim_7b_63"


def prediction(heads: str, **values) -> dict:
    """A prediction check's JSON where every target passes, but for ``values``."""
    return {"heads": heads, "schedule_is_best_static": False, HYDRA_REF: 2.0, MEDUSA_REF: 2.0,
            "speedup_vs_best_static": 1.1, "speedup_vs_autoregressive": 2.0,
            "fraction_of_oracle": 0.95, "accept_length_ratio": 1.0,
            "tokens_per_second_ratio": 1.0, "lossless": True, **values}


def verdicts(task: str, checked: dict) -> dict:
    return {name: check["pass"] for name, check in
            _bench.target_checks(TARGETS, checked, task).items()}


@pytest.mark.parametrize(("speedup", "math", "code"), [
    (1.5, True, True), (1.4999, False, True), (1.25, False, True), (1.2499, False, False)])
def test_autoregressive_targets_judge_their_own_task_only(speedup, math, code):
    for heads in ("medusa", "hydra"):
        checked = prediction(heads, speedup_vs_autoregressive=speedup)
        by_task = {task: verdicts(task, checked) for task in TASKS}
        assert by_task["math"]["speedup_vs_autoregressive@math"] is math
        assert by_task["code"]["speedup_vs_autoregressive@code"] is code
        assert by_task["math"]["speedup_vs_autoregressive@code"] is None
        assert by_task["code"]["speedup_vs_autoregressive@math"] is None
        for task in set(TASKS) - {"math", "code"}:
            assert by_task[task]["speedup_vs_autoregressive@math"] is None
            assert by_task[task]["speedup_vs_autoregressive@code"] is None
            # every other target is judged on every task
            assert all(v is True for name, v in by_task[task].items()
                       if not name.startswith("speedup_vs_autoregressive")
                       and name != (MEDUSA_REF if heads == "hydra" else HYDRA_REF))


@pytest.mark.parametrize(("heads", "own", "bound", "other"), [
    ("hydra", HYDRA_REF, 1.15, MEDUSA_REF), ("medusa", MEDUSA_REF, 1.36, HYDRA_REF)])
def test_a_bundle_is_judged_against_its_own_heads_with_mc_sim_only(heads, own, bound, other):
    for task in TASKS:
        # far below the other type's bound: n/a, not MISS
        met = verdicts(task, prediction(heads, **{own: bound, other: 0.5}))
        assert met[own] is True and met[other] is None
        missed = verdicts(task, prediction(heads, **{own: bound - 1e-4, other: 9.0}))
        assert missed[own] is False and missed[other] is None


def test_every_at_least_target_passes_at_its_bound_and_misses_below_it():
    for target in TARGETS:
        if target.at_least is None:
            continue
        task = target.tasks[0] if target.tasks else "chat"
        heads = target.heads or "hydra"
        assert target.verdict(task, prediction(heads, **{target.key: target.at_least})) is True
        below = prediction(heads, **{target.key: target.at_least * 0.999})
        assert target.verdict(task, below) is False, target.name
        assert target.verdict(task, prediction(heads, **{target.key: None})) is None


def test_the_static_target_is_na_for_a_bundle_that_is_its_best_static_tree():
    slower = prediction("medusa", speedup_vs_best_static=0.9)
    assert verdicts("chat", slower)["speedup_vs_best_static"] is False
    itself = {**slower, "schedule_is_best_static": True}
    assert verdicts("chat", itself)["speedup_vs_best_static"] is None


def test_target_names_are_distinct_and_the_report_keys():
    names = [t.name for t in TARGETS]
    assert len(set(names)) == len(names)
    assert list(verdicts("math", prediction("hydra"))) == names
