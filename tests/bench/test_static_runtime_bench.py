"""bench/bench_static_runtime.py on a tiny random model: both runtimes side by side per dtype."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_static_runtime.py"


@pytest.mark.parametrize(("dtype", "torch_name"), [("fp32", "float32"),
                                                   ("bf16", "bfloat16")])
def test_both_runtimes_decode_the_same_and_the_ratios_are_their_steps(tmp_path, dtype,
                                                                      torch_name):
    out = tmp_path / "static.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--rounds", "2", "--prompts", "2",
         "--max-new-tokens", "8", "--nodes", "0", "3", "--threads", "1", "--dtype", dtype,
         "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["meta"]["dtype"] == torch_name and report["meta"]["rounds"] == 2
    arms = [row["arm"] for row in report["rows"]]
    assert arms[0] == "autoregressive" and "hydra mc_sim_7b_63" in arms and len(arms) == 7
    for row in report["rows"]:
        assert row["eager_step_ms"] > 0 and row["static_step_ms"] > 0
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
        if dtype == "fp32":
            assert row["identical"], row["arm"]  # the same greedy tokens, exactly
