"""bench/bench_batch_greedy.py on a tiny random model: both loops side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_batch_greedy.py"


def test_both_loops_generate_the_same_and_the_ratio_is_their_times(tmp_path):
    out = tmp_path / "batch.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--rounds", "2", "--prompts", "12",
         "--batch", "5", "--max-new-tokens", "6", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())["result"]
    assert result["rows"] == 12 and result["identical_rows"] == 12  # fp32: the same tokens
    assert result["positions"] == {"transformers": 72, "static": 72}  # no EOS: 12 x 6
    ratios = [s / t for s, t in zip(result["seconds"]["static"],
                                    result["seconds"]["transformers"], strict=True)]
    assert result["ratio_min"] == min(ratios) and result["ratio_max"] == max(ratios)
    assert "static / transformers time" in run.stdout


def test_the_model_run_needs_its_prompts():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "--data" in run.stderr
