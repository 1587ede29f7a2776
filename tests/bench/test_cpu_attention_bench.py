"""bench/bench_cpu_attention.py on a tiny random model: grouped and repeated attention side by
side per tree step, the same cache bits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_cpu_attention.py"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_tree_and_context_gets_a_row_with_the_same_bits(tmp_path, dtype):
    out = tmp_path / "attention.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--rounds", "3", "--nodes", "0", "3",
         "--contexts", "16", "24", "--threads", "1", "--dtype", dtype, "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["meta"]["tiny"] and report["meta"]["rounds"] == 3
    assert [(row["step"], row["context"]) for row in report["rows"]] == [
        ("0 nodes", 16), ("3 nodes", 16), ("0 nodes", 24), ("3 nodes", 24)]
    for row in report["rows"]:
        assert row["grouped_ms"] > 0 and row["repeated_ms"] > 0
        assert row["ratio_q1"] <= row["ratio_median"] <= row["ratio_q3"]
        assert row["same_bits"], row
    assert "grouped/repeated" in run.stdout
