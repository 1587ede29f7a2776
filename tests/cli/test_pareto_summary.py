"""`entmtp pareto`: the concise summary and --full, the chosen trees marked, words instead of
Python values, and the plot's contents (chosen trees, plain decoding, tokens/s guides, legend
outside the axes, the static-schedule note)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from typer.testing import CliRunner

from entmtp.calibrate import RunDir, load_front
from entmtp.cli import _pareto, _plots
from entmtp.cli._front_summary import STATIC_NOTE, load_view, plot_inputs, summary_rows
from entmtp.cli.app import app
from entmtp.treesearch import (
    LatencyModel,
    Profile,
    Tree,
    expected_accept_length,
    load_bundle,
    save_bundle,
)

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pareto") / "run"
    result = runner.invoke(app, ["demo", "--out", str(out), "--schedule-trials", "8"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def static_run(demo_run, tmp_path_factory):
    """The demo run, its schedule replaced by its best static tree (as a search that found no
    switching schedule beating it beyond the noise ships)."""
    out = tmp_path_factory.mktemp("static") / "run"
    shutil.copytree(demo_run, out)
    front = json.loads((out / "front.json").read_text())
    front["schedule"]["trees"] = [front["best_static"]["paths"]]
    front["schedule"]["thresholds"] = []
    (out / "front.json").write_text(json.dumps(front))
    bundle = load_bundle(out / "bundle.json")
    static = bundle.best_static
    stats = bundle.tree_stats[static.tree_index] if static.tree_index is not None else \
        bundle.tree_stats[0]
    save_bundle(dataclasses.replace(bundle, trees=[static.tree], tree_stats=[stats],
                                    thresholds=[],
                                    best_static=dataclasses.replace(static, tree_index=0)),
                out / "bundle.json")
    assert load_bundle(out / "bundle.json").schedule_is_best_static
    return out


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_pareto_summarizes_the_front_and_marks_the_chosen_trees(demo_run):
    front = json.loads((demo_run / "front.json").read_text())
    result = runner.invoke(app, ["pareto", str(demo_run)])
    assert result.exit_code == 0, result.output
    assert len(_lines(result.output)) <= 30, result.output
    assert len(front["front"]) == 64  # the summary stands for many more rows
    text = result.output
    for i, tree in enumerate(front["schedule"]["trees"]):
        on_front = [c for c in front["front"] if c["paths"] == tree]
        if on_front:  # its row is marked with its index
            row = next(line for line in text.splitlines()
                       if line.split()[:1] == [str(on_front[0]["num_nodes"])])
            assert f"tree {i}" in row, text
    assert "best static" in text and "fastest" in text
    assert "plain decoding" in text and "oracle" in text
    assert STATIC_NOTE not in text  # the demo's schedule switches


def test_pareto_full_prints_every_row_of_every_front(demo_run):
    front = json.loads((demo_run / "front.json").read_text())
    result = runner.invoke(app, ["pareto", str(demo_run), "--full"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.split()[:1]
            and line.split()[0].isdigit() and len(line.split()) >= 5]
    buckets = sum(len(b) for b in front["bucket_fronts"])
    schedule_rows = len(front["schedule"]["trees"])
    assert len(rows) >= len(front["front"]) + buckets + schedule_rows
    no_buckets = runner.invoke(app, ["pareto", str(demo_run), "--full", "--no-buckets"])
    assert len(_lines(no_buckets.output)) < len(_lines(result.output)) - buckets + 5


@pytest.mark.parametrize("argv", [[], ["--full"]])
def test_pareto_prints_no_python_values(demo_run, argv):
    result = runner.invoke(app, ["pareto", str(demo_run), *argv])
    assert result.exit_code == 0, result.output
    for python in ("{'", "'kind'", "[-inf", "inf)", "None", "[0.", "ema(", "window("):
        assert python not in result.output, (python, result.output)


def test_summary_rows_keep_the_ends_the_marked_rows_and_powers_of_two():
    front = [{"num_nodes": n} for n in range(1, 101)]
    rows = summary_rows(front, {41: ["tree 0"]})
    assert [front[i]["num_nodes"] for i in rows] == [1, 2, 4, 8, 16, 32, 42, 64, 100]
    gappy = [{"num_nodes": n} for n in (1, 5, 7, 16, 20, 48, 80, 100, 128, 129)]
    assert [gappy[i]["num_nodes"] for i in summary_rows(gappy, {})] == [1, 5, 7, 16, 48, 80,
                                                                        128, 129]
    assert summary_rows([], {}) == []


def test_pareto_says_when_the_schedule_is_one_static_tree(static_run):
    result = runner.invoke(app, ["pareto", str(static_run)])
    assert result.exit_code == 0, result.output
    assert " ".join(STATIC_NOTE.split()) in " ".join(result.output.split())
    assert "at every step" in result.output


def _drawn(run, monkeypatch, tmp_path) -> dict:
    drawn = {}
    monkeypatch.setattr(_pareto, "plot_fronts", lambda **kwargs: drawn.update(kwargs))
    result = runner.invoke(app, ["pareto", str(run), "--plot", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    return drawn


def test_pareto_plot_draws_each_chosen_tree_on_the_all_positions_scale(demo_run, monkeypatch,
                                                                      tmp_path):
    drawn = _drawn(demo_run, monkeypatch, tmp_path)
    front = json.loads((demo_run / "front.json").read_text())
    trees = [Tree.from_json(paths) for paths in front["schedule"]["trees"]]
    chosen = drawn["chosen"]
    assert len(chosen) == len(trees) and len({c["label"] for c in chosen}) == len(trees)
    ranks = Profile.load(demo_run / "profile.npz").ranks()
    latency = LatencyModel.load(demo_run / "latency.json")
    for i, (pick, tree) in enumerate(zip(chosen, trees, strict=True)):
        assert pick["label"].startswith(f"chosen tree {i}: ")
        assert pick["expected_accept_length"] == pytest.approx(
            expected_accept_length(tree, ranks))
        assert pick["latency_ms"] == pytest.approx(latency.tree_ms(tree))
    ar_rate = front["schedule"]["replayed"]["autoregressive_tokens_per_second"]
    assert drawn["plain"]["latency_ms"] == pytest.approx(1000.0 / ar_rate)
    assert "task synthetic" in drawn["title"] and "tokens/s replayed" in drawn["title"]
    assert STATIC_NOTE not in (drawn["note"] or "")
    assert [s["label"] for s in drawn["series"]][0] == "front, all positions"
    assert all("inf" not in s["label"] for s in drawn["series"])


def test_pareto_plot_without_a_profile_draws_the_trees_on_their_own_positions(
        demo_run, monkeypatch, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    (run / "profile.npz").unlink()
    drawn = _drawn(run, monkeypatch, tmp_path)
    bundle = load_bundle(run / "bundle.json")
    off_front = [c for c in drawn["chosen"] if "on the positions it serves" in c["label"]]
    for pick in off_front:
        stats = bundle.tree_stats[pick["tag"]]
        assert pick["expected_accept_length"] == stats.expected_accept_length


def test_pareto_plot_notes_a_static_schedule(static_run, monkeypatch, tmp_path):
    drawn = _drawn(static_run, monkeypatch, tmp_path)
    assert STATIC_NOTE in drawn["note"]
    assert drawn["chosen"][0]["label"].endswith("= best static tree")


def test_the_fronts_plot_keeps_its_legend_off_the_axes(demo_run, monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(_plots, "_save", lambda fig, path: figures.append(fig))
    view = load_view(RunDir(demo_run), load_front(RunDir(demo_run)), score=True)
    _plots.plot_fronts(path=tmp_path / "f.png", **plot_inputs(view))
    (fig,) = figures
    (ax,) = fig.axes
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend()
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    labels = [t.get_text() for t in legend.get_texts()]
    assert any(label.startswith("plain decoding") for label in labels)
    assert sum(label.startswith("chosen tree") for label in labels) == len(view.chosen)
    guides = [t.get_text() for t in ax.texts if t.get_text().endswith("tokens/s")]
    assert len(guides) >= 2  # equal-tokens/s lines, labelled
    tags = [t.get_text() for t in ax.texts if not t.get_text().endswith("tokens/s")]
    assert sorted(",".join(tags).replace(" ", "").split(",")) == \
        [str(i) for i in range(len(view.chosen))]


def test_chosen_trees_at_one_spot_share_one_tag(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(_plots, "_save", lambda fig, path: figures.append(fig))
    point = {"latency_ms": 30.0, "expected_accept_length": 2.5}
    chosen = [{"label": "a", **point}, {"label": "b", **point},
              {"label": "c", "latency_ms": 60.0, "expected_accept_length": 3.0}]
    _plots.plot_fronts([{"label": "front", "points": [(20.0, 1.5), (60.0, 3.0)]}],
                       tmp_path / "f.png", title="t", chosen=chosen,
                       plain={"label": "plain", "latency_ms": 18.0})
    (ax,) = figures[0].axes
    tags = sorted(t.get_text() for t in ax.texts if not t.get_text().endswith("tokens/s"))
    assert tags == ["0, 1", "2"]


def test_tokens_per_second_levels_are_round_and_span_the_rates():
    levels = _plots.tokens_per_second_levels([12.0, 18.4, 24.8])
    assert len(levels) >= 3
    assert min(levels) <= 15 and max(levels) >= 20
    assert all(float(level).is_integer() for level in levels)
    assert _plots.tokens_per_second_levels([]) == []
