"""bench/gpu_static_check.py on a tiny model on the CPU: every arm, written as it goes, and the
ways of grouped-query attention side by side."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from entmtp.model import GROUPED_KV_WAYS

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_static_check.py"
ARMS = 11
AR, MEDUSA_64, HYDRA_64 = "autoregressive", "medusa 64 nodes", "hydra 64 nodes"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_static_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


STATIC_CHECK = load_script()


def check(tmp_path: Path, budget: float) -> dict:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--rounds",
                          "1", "--new-tokens", "6", "--prompts", "2", "--out", str(out),
                          "--budget-s", str(budget)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert not (out / "static_check.json.tmp").exists()
    return json.loads((out / "static_check.json").read_text())


def test_every_arm_decodes_the_same_with_and_without_graphs(tmp_path):
    report = check(tmp_path, 0)
    arms = [row["arm"] for row in report["arms"]]
    assert arms[:3] == ["autoregressive", "medusa 64 nodes", "hydra 64 nodes"]  # targets first
    assert len(arms) == len(set(arms)) == ARMS and report["skipped_arms"] == []
    assert all(row["graphs_equal_no_graphs"] and row["static_equals_eager"]
               for row in report["arms"])  # float32: exact
    assert {arm: set(by_key) for arm, by_key in report["targets"].items()} == {
        AR: {"step_over_bare_forward", "speedup"}, MEDUSA_64: {"step_over_bare_forward"},
        HYDRA_64: {"step_over_bare_forward"}}
    rows = {row["arm"]: row for row in report["arms"]}
    for arm, by_key in report["targets"].items():
        for key, verdict in by_key.items():
            assert verdict["value"] == rows[arm][key] and verdict["pass"] in (True, False)
    assert rows[AR]["speedup"] == rows[AR]["eager_step_ms"] / rows[AR]["static_graph_step_ms"]
    assert all(row["eager_step_ms"] > 0 and row["static_graph_step_ms"] > 0
               for row in report["arms"])
    ways = report["grouped_kv_ways"]
    assert [row["q"] for row in ways] == [1, 17, 65, 129]
    for row in ways:
        assert set(row["ms"]) == set(GROUPED_KV_WAYS) and min(row["ms"].values()) > 0
        assert set(row["ratios"]) == {f"{row['default']}/{w}" for w in GROUPED_KV_WAYS
                                      if w != row["default"]}


def test_a_budget_skips_the_arms_that_would_not_finish_and_still_writes(tmp_path):
    report = check(tmp_path, 1e-6)  # less than building the model took
    assert report["arms"] == [] and len(report["skipped_arms"]) == ARMS
    assert report["targets"] == {} and "grouped_kv_ways" not in report


def test_the_targets_are_the_issues():
    assert {(t.arm, t.key): (t.bound, t.at_most) for t in STATIC_CHECK.TARGETS} == {
        (AR, "step_over_bare_forward"): (1.25, True),
        (MEDUSA_64, "step_over_bare_forward"): (1.15, True),
        (HYDRA_64, "step_over_bare_forward"): (1.15, True),
        (AR, "speedup"): (4.0, False),
    }


def verdicts(ar_step: float | None, ar_speedup: float, tree_step: float) -> dict:
    rows = [{"arm": AR, "step_over_bare_forward": ar_step, "speedup": ar_speedup},
            {"arm": MEDUSA_64, "step_over_bare_forward": tree_step, "speedup": 1.0},
            {"arm": HYDRA_64, "step_over_bare_forward": tree_step, "speedup": 1.0},
            {"arm": "medusa chain4", "speedup": 0.1}]
    judged = STATIC_CHECK.judge_targets(rows)
    return {(arm, key): verdict["pass"] for arm, by_key in judged.items()
            for key, verdict in by_key.items()}


@pytest.mark.parametrize(("ar_step", "ar_speedup", "tree_step", "passes"), [
    (1.25, 4.0, 1.15, True),  # at the bounds
    (0.9, 40.0, 1.0, True),  # well inside them
    (1.2501, 3.999, 1.1501, False),  # just past them
    (3.0, 1.0, 2.0, False),  # far past them
])
def test_each_target_passes_on_its_side_of_the_bound_and_misses_past_it(ar_step, ar_speedup,
                                                                       tree_step, passes):
    assert verdicts(ar_step, ar_speedup, tree_step) == {
        (AR, "step_over_bare_forward"): passes, (AR, "speedup"): passes,
        (MEDUSA_64, "step_over_bare_forward"): passes,
        (HYDRA_64, "step_over_bare_forward"): passes}


def test_each_target_is_judged_on_its_own_value():
    judged = verdicts(ar_step=1.3, ar_speedup=5.0, tree_step=1.1)
    assert judged[AR, "step_over_bare_forward"] is False and judged[AR, "speedup"] is True
    judged = verdicts(ar_step=1.1, ar_speedup=3.0, tree_step=1.2)
    assert judged[AR, "step_over_bare_forward"] is True and judged[AR, "speedup"] is False
    assert judged[MEDUSA_64, "step_over_bare_forward"] is False


def test_an_unmeasured_value_is_na_and_a_missing_arm_has_no_verdict():
    assert verdicts(ar_step=None, ar_speedup=5.0, tree_step=1.0)[AR, "step_over_bare_forward"] \
        is None
    judged = STATIC_CHECK.judge_targets([{"arm": AR, "step_over_bare_forward": 1.1,
                                          "speedup": 5.0}])
    assert set(judged) == {AR}
    lines = STATIC_CHECK.target_lines(judged)
    assert lines == ["target autoregressive: graph step / bare captured forward 1.100 "
                     "(at most 1.25) PASS",
                     "target autoregressive: tokens/s with graphs / eager (eager step ms / graph "
                     "step ms) 5.000 (at least 4.0) PASS"]
