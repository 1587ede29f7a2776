"""`entmtp calibrate` and `entmtp latency` describe one machine in the same words."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.core import describe_machine
from entmtp.core._hardware import MACHINE_KEYS
from entmtp.treesearch import LatencyModel

runner = CliRunner()
# A few quick points: what is compared is the record, not the times.
QUICK = {"node_counts": (0, 1, 3), "depths": (1, 2), "context_lengths": (8, 16), "repeats": 1,
         "warmup": 0, "remeasure": 0}


def test_calibrate_and_latency_write_the_same_machine_record(tiny_model_dir, tiny_medusa_dir,
                                                             tmp_path, monkeypatch):
    import torch

    import entmtp.evaluation._latency_profile as latency_profile

    measure = latency_profile.profile_latency

    def quick_profile_latency(model, heads, **options):
        return measure(model, heads, **{**options, **QUICK})

    monkeypatch.setattr(latency_profile, "profile_latency", quick_profile_latency)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "Hello")))
    run = tmp_path / "run"
    common = ["--model", str(tiny_model_dir), "--heads", str(tiny_medusa_dir)]
    result = runner.invoke(app, ["calibrate", *common, "--data", str(data), "--split", "all",
                                 "--prompts", "2", "--max-new-tokens", "4",
                                 "--schedule-trials", "4", "--validation-folds", "0",
                                 "--out", str(run)])
    assert result.exit_code == 0, result.output
    latency = tmp_path / "latency.json"
    result = runner.invoke(app, ["latency", *common, "--out", str(latency)])
    assert result.exit_code == 0, result.output

    from_calibrate = LatencyModel.load(run / "latency.json").hardware
    from_latency = LatencyModel.load(latency).hardware
    machine = {key: from_latency[key] for key in MACHINE_KEYS}
    assert {key: from_calibrate[key] for key in MACHINE_KEYS} == machine
    assert machine == describe_machine("cpu", torch_threads=torch.get_num_threads())
    for key in ("torch", "transformers", "dtype"):
        assert from_calibrate[key] == from_latency[key]
