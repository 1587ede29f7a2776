"""The model-free commands through Typer's CliRunner: demo, pareto, show-tree, export."""

from __future__ import annotations

import json
import struct

import pytest
import yaml
from typer.testing import CliRunner

from entmtp.cli.app import app
from entmtp.treesearch import LatencyModel, Profile, load_bundle, replay

runner = CliRunner()


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    result = runner.invoke(app, ["demo", "--out", str(out), "--schedule-trials", "8"])
    assert result.exit_code == 0, result.output
    return out


def test_demo_writes_a_consistent_run(demo_run):
    for name in ("profile.npz", "latency.json", "front.json", "bundle.json", "report.md"):
        assert (demo_run / name).is_file(), name
    bundle = load_bundle(demo_run / "bundle.json")
    profile = Profile.load(demo_run / "profile.npz")
    latency = LatencyModel.load(demo_run / "latency.json")
    # The bundle's prediction is the exact replay of its own schedule on the profile.
    from entmtp.treesearch import Schedule

    schedule = Schedule(tuple(bundle.trees), tuple(bundle.thresholds), bundle.entropy.estimator)
    replayed = replay(profile, schedule, latency)
    assert replayed.tokens_per_second == pytest.approx(bundle.predicted.tokens_per_second)
    assert bundle.predicted.tokens_per_second <= bundle.predicted.oracle_tokens_per_second
    assert bundle.best_static.tokens_per_second <= bundle.predicted.tokens_per_second
    assert "## Pareto front" in (demo_run / "report.md").read_text()


def test_demo_rerun_reuses_the_finished_search(demo_run):
    before = (demo_run / "bundle.json").stat().st_mtime_ns
    result = runner.invoke(app, ["demo", "--out", str(demo_run), "--schedule-trials", "8"])
    assert result.exit_code == 0, result.output
    assert "reusing" in result.output
    assert (demo_run / "bundle.json").stat().st_mtime_ns == before


def test_pareto_prints_and_plots(demo_run, tmp_path):
    plot, curves = tmp_path / "front.png", tmp_path / "acc.png"
    result = runner.invoke(app, ["pareto", str(demo_run), "--plot", str(plot),
                                 "--acceptance-plot", str(curves)])
    assert result.exit_code == 0, result.output
    front = json.loads((demo_run / "front.json").read_text())
    assert "Pareto front" in result.output
    assert str(front["front"][-1]["num_nodes"]) in result.output
    for png in (plot, curves):
        width, height = _png_size(png)
        assert width > 200 and height > 200


def test_show_tree_draws_reference_and_bundle_trees(demo_run, tmp_path):
    from importlib import resources

    from entmtp.treesearch._run import (  # noqa: F401 - shipped data is importable
        reference_tree,
    )

    ref = resources.files("entmtp.trees").joinpath("mc_sim_7b_63.json")
    out = tmp_path / "ref.png"
    result = runner.invoke(app, ["show-tree", str(ref), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _png_size(out)[0] > 100
    result = runner.invoke(app, ["show-tree", str(demo_run / "bundle.json"), "--tree", "99",
                                 "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "out of range" in result.output
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("name", "magic"), [("t.png", b"\x89PNG"), ("t.PDF", b"%PDF"),
                                           ("t.svg", b"<?xml")])
def test_a_plot_is_written_in_the_format_its_suffix_names(demo_run, tmp_path, name, magic):
    out = tmp_path / name
    result = runner.invoke(app, ["show-tree", str(demo_run / "bundle.json"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["t.xyz", "t", "t.jpg"])
def test_a_plot_of_no_known_format_is_refused_before_any_work(demo_run, tmp_path, name):
    for argv in (["show-tree", str(demo_run / "bundle.json"), "--out"],
                 ["pareto", str(demo_run), "--plot"],
                 ["plot-latency", str(demo_run / "latency.json"), "--out"]):
        result = runner.invoke(app, [*argv, str(tmp_path / name)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and ".png, .pdf or .svg" in lines[0], result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["entmtp", "medusa", "trtllm"])
def test_export_formats_round_trip(demo_run, tmp_path, fmt):
    out = tmp_path / f"out.{fmt}"
    result = runner.invoke(app, ["export", str(demo_run), "--format", fmt, "--out", str(out)])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(demo_run / "bundle.json")
    if fmt == "entmtp":
        assert load_bundle(out).trees == bundle.trees
    elif fmt == "trtllm":
        assert yaml.safe_load(out.read_text()) is not None


def test_user_errors_are_one_line(tmp_path):
    cases = [
        ["pareto", str(tmp_path / "missing")],
        ["export", str(tmp_path / "missing.json"), "--format", "medusa", "--out", "x"],
        ["show-tree", str(tmp_path / "none.json"), "--out", str(tmp_path / "t.png")],
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "entmtp-bundle", "format_version": 1')
    cases.append(["export", str(bad), "--format", "entmtp", "--out", str(tmp_path / "o.json")])
    for args in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("entmtp: error:"), result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "o.json").exists()


def test_pareto_runs_the_search_when_only_profile_and_latency_exist(tmp_path):
    from entmtp.treesearch import synthetic_profile

    profile = synthetic_profile(num_traces=6, positions=128, seed=3)
    profile.meta.model, profile.meta.vocab_size, profile.meta.hidden_size = "synthetic", 1, 1
    profile.save(tmp_path / "profile.npz")
    LatencyModel.cpu_like().save(tmp_path / "latency.json")
    result = runner.invoke(app, ["pareto", str(tmp_path), "--schedule-trials", "4"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "front.json").is_file() and (tmp_path / "bundle.json").is_file()
    report = (tmp_path / "report.md").read_text()
    assert "Independence model" in report and "mc_sim_7b_63" in report


def test_a_changed_latency_model_is_searched_again(tmp_path):
    out = tmp_path / "run"
    args = ["demo", "--out", str(out), "--schedule-trials", "4"]
    assert runner.invoke(app, args).exit_code == 0
    first = load_bundle(out / "bundle.json")
    # Same command, other hardware: the stage must not be reused with the old latency model.
    args_gpu = [*args, "--latency", "gpu"]
    result = runner.invoke(app, args_gpu)
    assert result.exit_code == 0, result.output
    assert "reusing" not in result.output
    second = load_bundle(out / "bundle.json")
    assert second.latency == LatencyModel.gpu_like()
    assert first.latency == LatencyModel.cpu_like()


def test_show_tree_titles_a_bundle_tree_with_the_entropies_it_serves():
    from entmtp.cli._pareto import entropy_range
    from entmtp.treesearch import Schedule, Tree

    trees = tuple(Tree.from_paths([[i] for i in range(k)])
                  for k in (1, 2, 3, 4))
    schedule = Schedule(trees, (0.5, 1.25, 1.25), signal="draft_entropy")
    assert entropy_range(schedule, 0) == "draft entropy < 0.50 nats"
    assert entropy_range(schedule, 1) == "0.50 <= draft entropy < 1.25 nats"
    assert entropy_range(schedule, 2) == "never chosen (draft entropy thresholds 1.25 = 1.25 nats)"
    assert entropy_range(schedule, 3) == "draft entropy >= 1.25 nats"
    assert entropy_range(Schedule(trees[:1]), 0) == "every step"
