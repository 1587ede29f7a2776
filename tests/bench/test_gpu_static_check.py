"""bench/gpu_static_check.py on a tiny model on the CPU: every arm, written as it goes, and the
ways of grouped-query attention side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from entmtp.runtime import GROUPED_KV_WAYS

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_static_check.py"
ARMS = 11


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
    assert set(report["targets"]) == {"autoregressive", "medusa 64 nodes", "hydra 64 nodes"}
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
