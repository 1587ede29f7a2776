"""`entmtp export --format vllm-chain` and `--refit-ranks` find the run's profile and latency."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch import BatchLatency, LatencyModel, Profile, load_bundle, save_bundle
from entmtp.treesearch._chain import best_chain

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    result = runner.invoke(app, ["demo", "--out", str(out), "--schedule-trials", "8"])
    assert result.exit_code == 0, result.output
    return out


def chain_length(path) -> int:
    return yaml.safe_load(path.read_text())["speculative-config"]["num_speculative_tokens"]


def test_vllm_chain_reads_the_run_folders_profile(demo_run, tmp_path):
    out = tmp_path / "chain.yaml"
    result = runner.invoke(app, ["export", str(demo_run), "--format", "vllm-chain",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(demo_run / "bundle.json")
    latency = bundle.latency or LatencyModel.load(demo_run / "latency.json")
    choice = best_chain(Profile.load(demo_run / "profile.npz"), latency)
    assert chain_length(out) == choice.length
    assert f"predicted accept length {choice.mean_accept_length:.3f}" in result.output
    # A bundle file with --profile gives the same chain.
    again = tmp_path / "again.yaml"
    result = runner.invoke(app, ["export", str(demo_run / "bundle.json"), "--format",
                                 "vllm-chain", "--profile", str(demo_run / "profile.npz"),
                                 "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert chain_length(again) == choice.length


def test_vllm_chain_falls_back_to_the_runs_latency_file(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    bundle = load_bundle(run / "bundle.json")
    save_bundle(dataclasses.replace(bundle, latency=None), run / "bundle.json")
    out = tmp_path / "chain.yaml"
    result = runner.invoke(app, ["export", str(run), "--format", "vllm-chain", "--out", str(out)])
    assert result.exit_code == 0, result.output
    choice = best_chain(Profile.load(run / "profile.npz"), LatencyModel.load(run / "latency.json"))
    assert chain_length(out) == choice.length
    (run / "latency.json").unlink()
    result = runner.invoke(app, ["export", str(run), "--format", "vllm-chain",
                                 "--out", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "latency" in result.output
    assert not (tmp_path / "none.yaml").exists()


def test_a_profile_of_other_heads_is_refused(demo_run, tmp_path):
    from entmtp.treesearch import synthetic_profile

    other = synthetic_profile(num_traces=2, positions=64, num_heads=3, seed=0)
    other.save(tmp_path / "other.npz")
    result = runner.invoke(app, ["export", str(demo_run / "bundle.json"), "--format",
                                 "vllm-chain", "--profile", str(tmp_path / "other.npz"),
                                 "--out", str(tmp_path / "c.json")])
    assert result.exit_code == 2 and "3 heads" in result.output
    assert not (tmp_path / "c.json").exists()


def batch_latency_file(path):
    """Batch 1 where a chain pays (flat GPU-like curve), batch 64 where every drafted node
    costs a whole plain step (drafting never pays)."""
    flat = LatencyModel.gpu_like()
    steep = LatencyModel((0, 1, 4, 8), (40.0, 80.0, 200.0, 360.0), autoregressive_ms=40.0)
    return BatchLatency({1: flat, 64: steep}).save(path)


@pytest.mark.parametrize("runtime", ["vllm", "trtllm"])
def test_batch_schedules_are_the_best_chain_per_batch_size(demo_run, tmp_path, runtime):
    bundle = load_bundle(demo_run / "bundle.json")
    hydra = save_bundle(dataclasses.replace(bundle, heads=dataclasses.replace(
        bundle.heads, type="hydra")), tmp_path / "hydra.json")
    latency = batch_latency_file(tmp_path / "batched.json")
    profile = demo_run / "profile.npz"
    out = tmp_path / "schedule.yaml"
    result = runner.invoke(app, ["export", str(hydra), "--format", f"{runtime}-batch",
                                 "--profile", str(profile), "--latency", str(latency),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    best = best_chain(Profile.load(profile), LatencyModel.gpu_like()).length
    assert best >= 1
    config = yaml.safe_load(out.read_text())
    if runtime == "vllm":
        settings = config["speculative-config"]
        assert settings["num_speculative_tokens"] == best
        assert settings["num_speculative_tokens_per_batch_size"] == [[1, 1, best], [2, 64, 0]]
    else:
        settings = next(iter(config.values()))
        assert settings["draft_len_schedule"] == {1: best, 64: 0}
        assert settings["max_draft_len"] == best
    assert out.read_text().startswith("# ")


def test_medusa_heads_get_no_batch_schedule_and_one_batch_size_is_refused(demo_run, tmp_path):
    bundle = load_bundle(demo_run / "bundle.json")
    medusa = save_bundle(dataclasses.replace(bundle, heads=dataclasses.replace(
        bundle.heads, type="medusa")), tmp_path / "medusa.json")
    out = tmp_path / "schedule.yaml"
    common = ["--profile", str(demo_run / "profile.npz"), "--out", str(out)]
    result = runner.invoke(app, ["export", str(medusa), "--format", "vllm-batch", "--latency",
                                 str(batch_latency_file(tmp_path / "b.json")), *common])
    assert result.exit_code == 2 and "--format vllm-chain" in result.output
    one = LatencyModel.gpu_like().save(tmp_path / "one.json")
    result = runner.invoke(app, ["export", str(demo_run / "bundle.json"), "--format",
                                 "trtllm-batch", "--latency", str(one), *common])
    assert result.exit_code == 2 and "several batch sizes" in result.output
    result = runner.invoke(app, ["export", str(demo_run / "bundle.json"), "--format",
                                 "vllm-batch", "--out", str(out)])
    assert result.exit_code == 2 and "--profile PROFILE.npz" in result.output
    assert not out.exists()


def test_a_mistyped_bundle_name_gets_the_closest_one(tmp_path):
    folder = tmp_path / "bundles"
    folder.mkdir()
    for name in ("code-medusa-cpu2-zen4.json", "code-hydra-cpu2-zen4.json", "notes.md"):
        (folder / name).write_text("{}")
    result = runner.invoke(app, ["decode", str(folder / "code-medusa-cpu2-zen.json"),
                                 "--prompt", "x"])
    assert result.exit_code == 2
    assert f"(did you mean {folder / 'code-medusa-cpu2-zen4.json'}?)" in " ".join(
        result.output.split())
    result = runner.invoke(app, ["export", str(folder / "something-else.json"), "--out",
                                 str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "did you mean" not in result.output
