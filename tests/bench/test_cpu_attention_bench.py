"""bench/bench_cpu_attention.py on a tiny random model: the ways of grouped-query attention side
by side per tree step and per batched greedy step, SDPA's grouped heads writing the repeat's
bits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entmtp.model import GROUPED_KV_WAYS

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_cpu_attention.py"


def _run(tmp_path: Path, *arguments: str) -> tuple[dict, str]:
    out = tmp_path / "attention.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--rounds", "3", "--contexts", "16", "24",
         "--threads", "1", "--json", str(out), *arguments],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text()), run.stdout


def _check_row(row: dict) -> None:
    default = row["default"]
    assert default in GROUPED_KV_WAYS
    assert set(row["ms"]) == set(GROUPED_KV_WAYS) and min(row["ms"].values()) > 0
    assert set(row["ratios"]) == {f"{default}/{way}" for way in GROUPED_KV_WAYS
                                  if way != default}
    for ratio in row["ratios"].values():
        assert ratio["q1"] <= ratio["median"] <= ratio["q3"]
    assert row["same_bits_as_repeat"]["repeat"] and row["same_bits_as_repeat"]["sdpa"], row


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_tree_and_context_gets_a_row_of_every_way(tmp_path, dtype):
    report, stdout = _run(tmp_path, "--nodes", "0", "3", "--dtype", dtype)
    assert report["meta"]["tiny"] and report["meta"]["rounds"] == 3
    assert report["meta"]["batch"] == 0
    assert [(row["step"], row["context"]) for row in report["rows"]] == [
        ("0 nodes", 16), ("3 nodes", 16), ("0 nodes", 24), ("3 nodes", 24)]
    for row in report["rows"]:
        _check_row(row)
    assert "same bits as repeat" in stdout


def test_a_batch_gets_a_row_per_context(tmp_path):
    report, _ = _run(tmp_path, "--batch", "5")
    assert report["meta"]["batch"] == 5
    assert [(row["step"], row["context"]) for row in report["rows"]] == [
        ("batch 5", 16), ("batch 5", 24)]
    for row in report["rows"]:
        _check_row(row)
