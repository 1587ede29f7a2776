"""report.md in words: the latency model's machine, the estimator and the trees' ranges, never a
Python dict, list or ``-inf``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from entmtp.treesearch import EntropyEstimator, LatencyModel, synthetic_profile
from entmtp.treesearch._hardware_words import hardware_lines
from entmtp.treesearch._run import SearchSettings, report_markdown, search, served_range

SHIPPED = Path(__file__).resolve().parents[2] / "trees" / "latency"
PYTHON = (r"\{'", r"'\w+': ", r"\[-inf", r"inf\)", r"\[\d+(, \d+)*\]", r"\bNone\b",
          r"\bTrue\b", r"\bFalse\b", r"ema\(", r"window\(")


def _python_in(text: str) -> list[str]:
    return [pattern for pattern in PYTHON if re.search(pattern, text)]


@pytest.fixture(scope="module")
def report():
    """A report of a search under a latency model with a full measured hardware record (the
    record of a shipped latency file)."""
    record = json.loads((SHIPPED / "cpu2-hydra-smollm2-135m.json").read_text())["hardware"]
    latency = replace(LatencyModel.cpu_like(), hardware=record)
    profile = synthetic_profile(num_traces=8, positions=96, seed=1)
    outcome = search(profile, latency, SearchSettings(max_nodes=8, schedule_trials=10,
                                                      max_candidates=8, validation_folds=0))
    return report_markdown(outcome, task="t", latency=latency, ranks=profile.ranks(),
                           topk=profile.meta.topk)


def test_the_report_names_the_machine_in_words(report):
    section = report[report.index("## Replayed on the calibration traces"):]
    assert "- machine: AMD EPYC (AuthenticAMD family 26 model 2 stepping 1), 2 CPU cores, " \
           "2 torch threads" in section
    assert "- model: SmolLM2-135M-Instruct.Q4_1 with random weights, float32, 4 hydra heads" \
        in section
    assert "measured on 2026-12-05" in section
    assert "Plain (autoregressive) decoding:" in section


def test_the_report_holds_no_python_values(report):
    # the acceptance table's bucket headers are its own format (checked elsewhere)
    body = report[report.index("## Pareto front"):]
    assert _python_in(body) == [], [line for line in body.splitlines() if _python_in(line)]
    assert "estimate: " in body


@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED.glob("*.json")))
def test_every_shipped_latency_record_reads_as_words(name):
    record = json.loads((SHIPPED / name).read_text())["hardware"]
    lines = hardware_lines(record)
    assert lines and all(line.startswith("- ") for line in lines)
    assert _python_in("\n".join(lines)) == []
    assert record["device_name"] in lines[0]
    assert len("\n".join(lines)) < 600  # the record itself runs to 1,500 characters


def test_synthetic_empty_and_imported_records():
    assert hardware_lines({"kind": "synthetic-gpu"}) == [
        "- a synthetic GPU-like model (synthetic, not measured)"]
    assert "unspecified" in hardware_lines({})[0]
    imported = hardware_lines({"kind": "imported", "source": "vllm.csv",
                               "device_name": "H100, vLLM 0.11"})
    assert imported[0] == "- source: step times imported from vllm.csv, timed in another runtime"
    assert imported[1] == "- machine: H100, vLLM 0.11"


def test_estimators_and_ranges_in_words():
    assert EntropyEstimator.ema(0.25).describe() == "exponential moving average (alpha 0.25)"
    assert EntropyEstimator.window(4).describe() == "mean of the last 4 values"
    assert EntropyEstimator.last().describe() == "the last value (no smoothing)"
    assert served_range([0.5, 1.25, 1.25], 0) == "below 0.500"
    assert served_range([0.5, 1.25, 1.25], 1) == "0.500 to 1.250"
    assert served_range([0.5, 1.25, 1.25], 2) == "none (both thresholds 1.250)"
    assert served_range([0.5, 1.25, 1.25], 3) == "1.250 and above"
    assert served_range([], 0) == "all"
