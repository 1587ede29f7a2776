"""bench/gpu_static_check.py on a tiny model on the CPU: every arm, written as it goes, and the
ways of grouped-query attention side by side."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> dict:
    """The report of a run with no budget (every arm), shared by the tests that read it."""
    return check(tmp_path_factory.mktemp("check"), 0)


def test_every_arm_decodes_the_same_with_and_without_graphs(full_report):
    report = full_report
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


STEP = "step_over_bare_forward"
EVENTS = STATIC_CHECK.STEP_EVENTS


def test_the_step_targets_judge_the_cuda_event_ratio_where_it_was_measured():
    """A ratio the host clock misses (its launch and readback overhead) but the CUDA events
    pass is a PASS, and the verdict and its line name the clock; without an event figure the
    host clock's is judged; the speedup target always reads the host clock."""
    rows = [{"arm": AR, STEP: 1.6, EVENTS: 1.1, "speedup": 5.0},
            {"arm": MEDUSA_64, STEP: 1.1, EVENTS: 1.3, "speedup": 1.0},
            {"arm": HYDRA_64, STEP: 1.1, EVENTS: None, "speedup": 1.0}]
    judged = STATIC_CHECK.judge_targets(rows)
    assert {(arm, key): (v["judged"], v["clock"], v["value"], v["pass"])
            for arm, by_key in judged.items() for key, v in by_key.items()} == {
        (AR, STEP): (EVENTS, "CUDA events", 1.1, True),
        (AR, "speedup"): ("speedup", "host clock", 5.0, True),
        (MEDUSA_64, STEP): (EVENTS, "CUDA events", 1.3, False),
        (HYDRA_64, STEP): (STEP, "host clock", 1.1, True),
    }
    lines = STATIC_CHECK.target_lines(judged)
    assert lines[0] == ("target autoregressive: graph step / bare captured forward by CUDA "
                        "events 1.100 (at most 1.25) PASS")
    assert lines[-1] == ("target hydra 64 nodes: graph step / bare captured forward 1.100 "
                         "(at most 1.15) PASS")
    assert {t.key: t.event_key for t in STATIC_CHECK.TARGETS} == {STEP: EVENTS, "speedup": None}
    nan_events = STATIC_CHECK.judge_targets([{"arm": AR, STEP: 1.2, EVENTS: float("nan")}])
    assert nan_events[AR][STEP]["clock"] == "host clock"


def test_step_timings_drop_the_first_run_and_keep_both_clocks():
    from entmtp.runtime._static_step import StepTiming

    class Engine:
        past_len = torch.tensor(17)

        def __init__(self, device):
            self.runs = iter([StepTiming(100.0, 50.0 if device else None)]
                             + [StepTiming(2.0 + i, (1.0 + i) if device else None)
                                for i in range(5)])
            self.pasts = []

        def timed_run(self, step, past, clock):
            assert clock is STATIC_CHECK.synced_ms
            self.pasts.append(past)
            return next(self.runs)

    engine = Engine(device=True)
    assert STATIC_CHECK.step_timings(engine, "step", 5) == (4.0, 3.0)
    assert engine.pasts == [17] * 6
    assert STATIC_CHECK.step_timings(Engine(device=False), "step", 5) == (4.0, None)


def test_on_the_cpu_the_rows_keep_the_host_clock_and_report_no_failed_capture(full_report):
    report = full_report
    rows = {row["arm"]: row for row in report["arms"]}
    for arm in (AR, MEDUSA_64, HYDRA_64):
        row = rows[arm]
        assert row["graph_step_timed_ms"] > 0 and row["bare_forward_ms"] > 0
        assert row["graph_step_event_ms"] is None and row["bare_forward_event_ms"] is None
        assert row[EVENTS] is None and row["bare_forward_capture_error"] is None
        assert report["targets"][arm][STEP]["clock"] == "host clock"
    assert all(row["capture_failures"] == [] and row["graph_memory_bytes"] == 0
               for row in report["arms"])
