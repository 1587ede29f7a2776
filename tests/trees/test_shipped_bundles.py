"""The shipped CPU bundles: one per task and head type, each consistent with the shipped heads
and latency model it was calibrated with (trees/bundles/README.md)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from entmtp.treesearch import LatencyModel, load_bundle

TASKS = ("code", "chat", "math", "lit")
HEAD_TYPES = ("medusa", "hydra")


def shipped(*parts: str) -> Path:
    return Path(str(resources.files("entmtp.trees").joinpath(*parts)))


@pytest.mark.parametrize("head_type", HEAD_TYPES)
@pytest.mark.parametrize("task", TASKS)
def test_shipped_bundle_matches_its_heads_and_latency_model(task, head_type):
    bundle = load_bundle(shipped("bundles", f"{task}-{head_type}-cpu2.json"))
    heads_config = json.loads(
        shipped("heads", f"smollm2-135m-{head_type}", "config.json").read_text())
    latency = LatencyModel.load(shipped("latency", f"cpu2-{head_type}-smollm2-135m.json"))

    assert bundle.task == task
    assert bundle.heads.type == head_type
    assert bundle.heads.sha256 == heads_config["sha256"]
    assert bundle.heads.num_heads == heads_config["num_heads"]
    assert bundle.latency == latency  # searched with the shipped latency model, unchanged since
    assert bundle.hardware["torch_threads"] == 2
    assert f"--latency trees/latency/cpu2-{head_type}-smollm2-135m.json" in (
        bundle.created_by.command)
    # The schedule and its prediction are what the reports beside the bundles show.
    assert len(bundle.thresholds) == len(bundle.trees) - 1
    assert all(tree.depth <= bundle.heads.num_heads for tree in bundle.trees)
    assert bundle.best_static is not None
    assert bundle.predicted.tokens_per_second >= bundle.best_static.tokens_per_second
    assert bundle.predicted.oracle_tokens_per_second >= bundle.predicted.tokens_per_second
    report = shipped("bundles", f"{task}-{head_type}-cpu2.report.md").read_text()
    assert f"# entmtp calibration report: task `{task}`" in report
    assert f"`{bundle.entropy.signal}`" in report


def test_every_shipped_bundle_is_listed_in_the_bundles_readme():
    readme = shipped("bundles", "README.md").read_text()
    names = sorted(p.name for p in shipped("bundles").iterdir() if p.suffix == ".json")
    assert names == sorted(f"{t}-{h}-cpu2.json" for t in TASKS for h in HEAD_TYPES)
    for name in names:
        assert f"`{name}`" in readme
