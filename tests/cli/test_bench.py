"""`entmtp bench` with a Medusa and a Hydra bundle at once, through Typer's CliRunner on a tiny
random Llama (its untied random lm_head gives varied continuations and entropies, so the
calibrated schedules switch between trees).

Both bundles are calibrated on every prompt (``--split all``) with a latency model that records
1 torch thread; a bench over the same prompts and token budget replays on the calibration's own
trajectories, so each bundle's calibration-split prediction is the reference for the replay.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from entmtp.cli import _bench
from entmtp.cli._live import read_bundle
from entmtp.cli.app import app
from entmtp.evaluation._prediction import DRIFT_LIMIT, drift_warning
from entmtp.treesearch import (
    LatencyModel,
    Profile,
    Tree,
    load_bundle,
    oracle_replay,
    save_bundle,
)

runner = CliRunner()

PROMPTS = ["def add(a, b):", "Once upon a time", "The quick brown fox", "x = [1, 2, 3]",
           "import numpy as np", "Dear Sir or Madam,"]
MAX_NEW_TOKENS = 20
BUNDLE_THREADS = 1
AR, MEDUSA_REF, HYDRA_REF = "autoregressive", "medusa-mc_sim_7b_63", "hydra-mc_sim_7b_63"
TARGETS_FILE = Path(__file__).resolve().parents[2] / "bench" / "targets.py"
TARGETS = _bench.load_targets(TARGETS_FILE)
Target = type(TARGETS[0])


def invoke(args: list) -> object:
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # before the error, at most the line that says the model is loading
    assert all(line.startswith("loading model ") for line in lines[:-1]), result.output
    assert lines[-1].startswith("entmtp: error:"), result.output
    for needle in needles:
        assert needle in lines[-1], result.output


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> SimpleNamespace:
    """A tiny model, Medusa and Hydra heads for it and a calibrated bundle for each."""
    from entmtp.model import new_heads, save_heads
    from support import save_untied_tiny_llama

    root = tmp_path_factory.mktemp("bench")
    model = save_untied_tiny_llama(root / "model")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    latency = dataclasses.replace(
        LatencyModel.cpu_like(),
        hardware={"kind": "measured", "device": "cpu", "torch_threads": BUNDLE_THREADS},
    ).save(root / "latency.json")
    ns = SimpleNamespace(root=root, model=root / "model", data=data)
    for head_type in ("medusa", "hydra"):
        heads = save_heads(new_heads(model, head_type=head_type, num_heads=3),
                           root / head_type, dtype=None)
        run = root / f"run-{head_type}"
        result = invoke(["calibrate", "--model", ns.model, "--heads", heads, "--data", data,
                         "--split", "all", "--prompts", len(PROMPTS), "--max-new-tokens",
                         MAX_NEW_TOKENS, "--schedule-trials", 8, "--latency", latency,
                         "--out", run])
        assert result.exit_code == 0, result.output
        setattr(ns, f"{head_type}_heads", heads)
        setattr(ns, f"{head_type}_run", run)
    return ns


def bench_args(two, *extra) -> list:
    return ["bench", "--model", two.model, "--heads", two.medusa_heads, "--heads",
            two.hydra_heads, "--data", two.data, "--split", "all", *extra]


@pytest.fixture
def spy(monkeypatch) -> SimpleNamespace:
    """Records torch's thread count while the methods run and the rows the plot gets."""
    seen = SimpleNamespace(threads=[], plotted=None)
    measure, plot = _bench.run_side_by_side, _bench.plot_bench

    def run_side_by_side(*args, **kwargs):
        seen.threads.append(torch.get_num_threads())
        return measure(*args, **kwargs)

    def plot_bench(rows, path, **kwargs):
        seen.plotted = [row["name"] for row in rows]
        return plot(rows, path, **kwargs)

    monkeypatch.setattr(_bench, "run_side_by_side", run_side_by_side)
    monkeypatch.setattr(_bench, "plot_bench", plot_bench)
    return seen


def test_two_bundles_give_per_type_rows_ratios_and_prediction_checks(two, spy, tmp_path):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    torch.set_num_threads(2)  # the bundles' count wins over whatever torch runs with
    result = invoke([*bench_args(two), "--bundle", two.medusa_run, "--bundle", two.hydra_run,
                     "--prompts", len(PROMPTS), "--max-new-tokens", MAX_NEW_TOKENS,
                     "--json", out, "--plot", plot, "--targets", TARGETS_FILE])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == [AR, MEDUSA_REF, HYDRA_REF, "best-static[medusa]", "entmtp[medusa]",
                          "best-static[hydra]", "entmtp[hydra]"]
    assert [row["heads"] for row in rows.values()] == [None, "medusa", "hydra", "medusa",
                                                     "medusa", "hydra", "hydra"]
    for name, row in rows.items():
        assert row["lossless"] is True, name
        for base, value in row["speedup"].items():
            assert value == row["tokens_per_second"] / rows[base]["tokens_per_second"]
            low, high = row["speedup_ci95"][base]
            assert low <= value * (1 + 1e-9) and value <= high * (1 + 1e-9)
        assert set(row["speedup_ci95"]) == set(row["speedup"])
        # Per-prompt figures add up to the row's totals.
        assert len(row["per_prompt"]["decode_ms"]) == len(PROMPTS)
        assert sum(row["per_prompt"]["decode_tokens"]) == row["decode_tokens"]
        assert sum(row["per_prompt"]["steps"]) == row["steps"]
        # the spread of its measured step times
        assert row["step_ms"]["steps"] == row["steps"]
        assert row["step_ms"]["median_ms"] > 0 and row["step_ms"]["iqr_ms"] >= 0
    # Each entmtp row against AR, both reference rows and its own type's best static only.
    for kind, other in (("medusa", "hydra"), ("hydra", "medusa")):
        assert set(rows[f"entmtp[{kind}]"]["speedup"]) == {
            AR, MEDUSA_REF, HYDRA_REF, f"best-static[{kind}]"}
        assert f"best-static[{other}]" not in rows[f"{kind}-mc_sim_7b_63"]["speedup"]

    assert set(report["predictions"]) == {"medusa", "hydra"}
    for kind, p in report["predictions"].items():
        bundle = load_bundle(getattr(two, f"{kind}_run") / "bundle.json")
        row = rows[f"entmtp[{kind}]"]
        assert p["row"] == f"entmtp[{kind}]" and p["heads"] == kind
        # The replay books the live decoder's steps exactly.
        assert p["replay_step_agreement"] == 1.0
        assert p["replayed"]["steps"] == row["steps"]
        assert p["replayed"]["mean_accept_length"] == p["measured"]["mean_accept_length"]
        assert p["measured"]["mean_accept_length"] == row["mean_accept_length"]
        assert p["accept_length_ratio"] == 1.0
        # Same prompts and budget as the calibration: the replay is the bundle's prediction.
        assert p["calibration_predicted"] == {
            "mean_accept_length": bundle.predicted.mean_accept_length,
            "tokens_per_second": bundle.predicted.tokens_per_second}
        assert p["replayed"]["mean_accept_length"] == bundle.predicted.mean_accept_length
        assert p["replayed"]["tokens_per_second"] == pytest.approx(
            bundle.predicted.tokens_per_second, rel=1e-12)
        # The oracle over the bundle's trees (the calibration's bound is over all candidates).
        trees = [*bundle.trees, bundle.best_static.tree]
        profile = Profile.load(getattr(two, f"{kind}_run") / "profile.npz")
        oracle = oracle_replay(profile, trees, bundle.latency).tokens_per_second
        assert p["oracle"]["tokens_per_second"] == pytest.approx(oracle, rel=1e-12)
        assert oracle <= bundle.predicted.oracle_tokens_per_second * (1 + 1e-12)
        assert p["tokens_per_second_ratio"] == (row["tokens_per_second"]
                                                / p["replayed"]["tokens_per_second"])
        fraction = p["replayed"]["tokens_per_second"] / p["oracle"]["tokens_per_second"]
        assert p["oracle"]["entmtp_fraction_of_oracle"] == fraction
        assert 0 < fraction <= 1
        # One tree (no switching survived): the bound is that tree, so no fraction is claimed.
        distinct = len(bundle.trees) + (bundle.best_static.tree not in bundle.trees)
        assert p["fraction_of_oracle"] == (fraction if distinct > 1 else None)
        assert p["best_static"]["accept_length_ratio"] == 1.0
        # Every live step was booked with the same tree: the per-tree times cover them all.
        for record, measured_row in ((p, row),
                                     (p["best_static"], rows[f"best-static[{kind}]"])):
            by_tree = record["step_time_by_tree"]
            assert sum(t["steps"] for t in by_tree) == measured_row["steps"]
            booked = sum(t["modelled_ms"] * t["steps"] for t in by_tree)
            assert booked == pytest.approx(1000.0 * record["replayed"]["decode_tokens"]
                                           / record["replayed"]["tokens_per_second"])
            for t in by_tree:
                assert t["measured_over_modelled"] == t["measured_ms"] / t["modelled_ms"]
        assert p["speedup_vs_best_static"] == row["speedup"][f"best-static[{kind}]"]
        assert p["speedup_vs_best_static_ci95"] == row["speedup_ci95"][f"best-static[{kind}]"]
        assert p["replayed_speedup_vs_best_static"] == (
            p["replayed"]["tokens_per_second"]
            / p["best_static"]["replayed"]["tokens_per_second"])
        assert p["autoregressive_measured_over_modelled"] == pytest.approx(
            rows[AR]["tokens_per_second"] * bundle.latency.autoregressive_ms / 1000.0)
        # the tiny model decodes far faster than the 83 ms of its (synthetic CPU) latency
        # model: a drifted machine, said on stderr with what to do
        assert p["autoregressive_measured_over_modelled"] > 1 + DRIFT_LIMIT
        assert p["warnings"] and "re-measure with `entmtp latency" in p["warnings"][0]
        expected = f"entmtp: warning: bench row 'entmtp[{kind}]': autoregressive decoding ran at"
        assert expected in result.stderr
        for t in p["step_time_by_tree"]:
            assert t["measured_iqr_ms"] >= 0
        assert p[f"speedup_vs_{HYDRA_REF}"] == row["speedup"][HYDRA_REF]
        assert p[f"speedup_vs_{MEDUSA_REF}"] == row["speedup"][MEDUSA_REF]
        assert list(p["targets"]) == [t.name for t in TARGETS]
        for target in TARGETS:
            check = p["targets"][target.name]
            assert check["value"] == p[target.key]
            assert check["pass"] is target.verdict(report["task"], p)
        # judged against its own head type's heads with mc_sim_7b_63 only, and against
        # autoregressive decoding by the target of the bench's task only
        other = "hydra" if kind == "medusa" else "medusa"
        own_ref, other_ref = f"speedup_vs_{kind}-mc_sim_7b_63", f"speedup_vs_{other}-mc_sim_7b_63"
        assert p["targets"][own_ref]["pass"] is (p[own_ref] >= {"medusa": 1.36,
                                                                 "hydra": 1.15}[kind])
        assert p["targets"][other_ref]["pass"] is None and p[other_ref] is not None
        assert report["task"] == "code"
        ar = p["speedup_vs_autoregressive"]
        assert p["targets"]["speedup_vs_autoregressive@code"]["pass"] is (ar >= 1.25)
        assert p["targets"]["speedup_vs_autoregressive@math"]["pass"] is None
        one_tree = {"speedup_vs_best_static", "fraction_of_oracle"} if distinct == 1 else set()
        assert {name for name, check in p["targets"].items() if check["pass"] is None} == {
            other_ref, "speedup_vs_autoregressive@math", *one_tree}
        assert p["schedule_is_best_static"] is (distinct == 1)
        assert p["targets"]["accept_length_ratio"]["pass"] is True
        assert p["targets"]["lossless"]["pass"] is True
        line = next(li for li in result.output.splitlines() if li.startswith(f"entmtp[{kind}]:"))
        verdicts = [w for w in line.replace(",", " ").split() if w in ("PASS", "MISS", "n/a")]
        assert verdicts == [{True: "PASS", False: "MISS", None: "n/a"}[p["targets"][t.name]["pass"]]
                            for t in TARGETS]
    assert "oracle" not in report  # one per head type: predictions[type]["oracle"]

    assert report["threads"] == {"torch_threads": BUNDLE_THREADS,
                                 "source": "bundle latency model", "cpu": True}
    assert spy.threads == [BUNDLE_THREADS]
    assert torch.get_num_threads() == 2  # restored
    machine = report["machine"]
    assert machine["torch"] == torch.__version__ and machine["cpu_count"] == os.cpu_count()
    assert machine["torch_threads"] == BUNDLE_THREADS and machine["device"] == "cpu"
    assert machine["cpu_name"] and machine["date"].endswith("UTC")
    assert report["command"].startswith("entmtp")
    assert report["heads_sha256"] == {
        kind: read_bundle(Path(path))[1].heads.sha256
        for kind, path in zip(("medusa", "hydra"), report["bundles"], strict=True)}
    check_results_table(out, report)
    assert spy.plotted == [*rows, "oracle[medusa] (est.)", "oracle[hydra] (est.)"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_bundle_keeps_the_plain_row_names(two, spy, tmp_path):
    """A bundle without a latency model: accept lengths are still replayed, tokens/s checks are
    n/a, and the thread count comes from the bundle's hardware."""
    bundle = load_bundle(two.hydra_run / "bundle.json")
    assert bundle.hardware["torch_threads"] == BUNDLE_THREADS
    untimed = save_bundle(dataclasses.replace(bundle, latency=None), tmp_path / "hydra.json")
    out = tmp_path / "bench.json"
    torch.set_num_threads(2)
    result = invoke(["bench", "--model", two.model, "--heads", two.hydra_heads, "--data",
                     two.data, "--task", "math", "--split", "all", "--bundle", untimed,
                     "--prompts", 2, "--max-new-tokens", 6, "--json", out, "--targets",
                     TARGETS_FILE])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["task"] == "math"
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == [AR, HYDRA_REF, "best-static", "entmtp"]
    assert rows["entmtp"]["heads"] == "hydra"
    assert set(rows["entmtp"]["speedup"]) == {AR, HYDRA_REF, "best-static"}
    assert list(report["predictions"]) == ["hydra"]
    p = report["predictions"]["hydra"]
    assert p["replayed"]["mean_accept_length"] == rows["entmtp"]["mean_accept_length"]
    assert p["replayed"]["tokens_per_second"] is None and p["tokens_per_second_ratio"] is None
    assert p["oracle"]["source"] == "bundle prediction"
    for key in ("tokens_per_second_ratio", "fraction_of_oracle", f"speedup_vs_{MEDUSA_REF}"):
        assert p["targets"][key]["pass"] is None, key
    # --task math labels the prompts: the math target against autoregressive decoding holds
    assert p["targets"]["speedup_vs_autoregressive@math"]["pass"] is (
        p["speedup_vs_autoregressive"] >= 1.5)
    assert p["targets"]["speedup_vs_autoregressive@code"]["pass"] is None
    line = next(li for li in result.output.splitlines() if li.startswith("entmtp:"))
    assert "tok/s meas/replay - n/a" in line and "accept meas/replay 1.000 PASS" in line
    assert report["threads"]["torch_threads"] == BUNDLE_THREADS == spy.threads[0]


def test_a_one_tree_bundle_has_no_oracle_fraction(two, spy, tmp_path):
    """Over one tree the hindsight bound is that tree: a bundle that ships its best static tree
    (no switching held up out of sample) gets n/a, not a trivial 100%."""
    bundle = load_bundle(two.medusa_run / "bundle.json")
    static = bundle.best_static
    one_tree = dataclasses.replace(
        bundle, trees=[static.tree], thresholds=[], tree_stats=bundle.tree_stats[:1],
        best_static=dataclasses.replace(static, tree_index=0))
    path = save_bundle(one_tree, tmp_path / "static.json")
    out = tmp_path / "bench.json"
    result = invoke(["bench", "--model", two.model, "--heads", two.medusa_heads, "--data",
                     two.data, "--split", "all", "--bundle", path, "--prompts", 2,
                     "--max-new-tokens", 6, "--json", out, "--targets", TARGETS_FILE])
    assert result.exit_code == 0, result.output
    p = json.loads(out.read_text())["predictions"]["medusa"]
    assert p["oracle"]["entmtp_fraction_of_oracle"] == pytest.approx(1.0)
    assert p["fraction_of_oracle"] is None
    assert p["targets"]["fraction_of_oracle"]["pass"] is None
    # timed against itself: the speedup is reported, the target is not applicable
    assert p["schedule_is_best_static"] is True
    assert p["speedup_vs_best_static"] is not None
    assert p["targets"]["speedup_vs_best_static"]["pass"] is None
    line = next(li for li in result.output.splitlines() if li.startswith("entmtp:"))
    assert "of oracle - n/a" in line
    assert re.search(r"vs static [0-9.]+x \[[0-9.-]+\] n/a", line), line
    # decoded on the best-static row's steps: measured once, the row shares those runs
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["entmtp"]["same_runs_as"] == "best-static"
    assert rows["entmtp"]["per_prompt"] == rows["best-static"]["per_prompt"]
    assert rows["entmtp"]["speedup"]["best-static"] == 1.0
    assert "best-static and entmtp: one tree on the same steps, measured once" in result.output
    assert "bench (3 methods)" in result.output


def test_only_a_one_tree_bundle_of_its_best_static_tree_is_its_best_static_schedule(two):
    bundle = load_bundle(two.medusa_run / "bundle.json")
    static = bundle.best_static
    one_tree = dataclasses.replace(
        bundle, trees=[static.tree], thresholds=[], tree_stats=bundle.tree_stats[:1],
        best_static=dataclasses.replace(static, tree_index=0))
    assert one_tree.schedule_is_best_static
    other = Tree.from_paths([[0]]) if static.tree != Tree.from_paths([[0]]) else \
        Tree.from_paths([[0], [1]])
    assert not dataclasses.replace(one_tree, trees=[other]).schedule_is_best_static
    assert not dataclasses.replace(one_tree, best_static=None).schedule_is_best_static
    if len(bundle.trees) > 1:
        assert not bundle.schedule_is_best_static


def test_two_bundles_of_one_head_type_is_a_one_line_error(two, tmp_path):
    copy = tmp_path / "copy.json"
    copy.write_bytes((two.medusa_run / "bundle.json").read_bytes())
    assert_one_line_error(invoke([*bench_args(two), "--bundle", two.medusa_run,
                                  "--bundle", copy]), "medusa", "one bundle per head type")


def test_two_heads_folders_of_one_type_is_a_one_line_error(two):
    assert_one_line_error(invoke(["bench", "--model", two.model, "--heads", two.medusa_heads,
                                  "--heads", two.medusa_heads, "--data", two.data, "--split",
                                  "all", "--prompts", 1, "--max-new-tokens", 2]),
                          "--heads", "medusa")


def test_bundles_measured_with_other_thread_counts_need_threads(two, spy, tmp_path):
    bundle = load_bundle(two.hydra_run / "bundle.json")
    two_threads = {**bundle.latency.hardware, "torch_threads": 2}
    hydra = save_bundle(dataclasses.replace(
        bundle, hardware=two_threads,
        latency=dataclasses.replace(bundle.latency, hardware=two_threads)),
        tmp_path / "hydra.json")
    args = [*bench_args(two), "--bundle", two.medusa_run, "--bundle", hydra, "--prompts", 1,
            "--max-new-tokens", 4]
    assert_one_line_error(invoke(args), "torch thread", "--threads")
    assert_one_line_error(invoke([*args, "--threads", 0]), "--threads")
    assert spy.threads == []

    out = tmp_path / "bench.json"
    torch.set_num_threads(2)  # the override wins over whatever torch runs with
    result = invoke([*args, "--threads", 1, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["threads"] == {"torch_threads": 1, "source": "--threads", "cpu": True}
    # without --targets: the prediction checks, no verdicts
    assert report["targets"] == {} and set(report["predictions"]) == {"medusa", "hydra"}
    assert all(p["targets"] == {} for p in report["predictions"].values())
    assert "PASS" not in result.output and "MISS" not in result.output
    assert spy.threads == [1]
    assert torch.get_num_threads() == 2


def test_without_a_bundle_torch_keeps_its_thread_count(two, spy, tmp_path):
    out = tmp_path / "bench.json"
    torch.set_num_threads(2)
    result = invoke([*bench_args(two), "--prompts", 1, "--max-new-tokens", 4, "--json", out])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [row["name"] for row in report["rows"]] == [AR, MEDUSA_REF, HYDRA_REF]
    assert report["predictions"] == {} and "oracle" not in report
    assert report["threads"] == {"torch_threads": 2, "source": "torch default", "cpu": True}
    assert spy.threads == [2]


def test_a_bad_targets_file_is_a_one_line_error_before_any_decoding(two, spy, tmp_path):
    args = [*bench_args(two), "--prompts", 1, "--max-new-tokens", 2, "--targets"]
    assert_one_line_error(invoke([*args, tmp_path / "none.py"]), "--targets", "no such")
    as_json = tmp_path / "targets.json"
    as_json.write_text("{}")
    assert_one_line_error(invoke([*args, as_json]), "--targets", "not a Python file")
    broken = tmp_path / "broken.py"
    broken.write_text("TARGETS = (\n")
    assert_one_line_error(invoke([*args, broken]), "--targets", "cannot load")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    assert_one_line_error(invoke([*args, empty]), "--targets", "no TARGETS")
    typo = tmp_path / "typo.py"
    typo.write_text(TARGETS_FILE.read_text().replace('"fraction_of_oracle", "of oracle"',
                                                     '"fraction_of_orcale", "of oracle"'))
    assert_one_line_error(invoke([*args, typo]), "fraction_of_orcale", "not a field")
    twice = tmp_path / "twice.py"
    twice.write_text(TARGETS_FILE.read_text().replace('tasks=("math",)', 'tasks=("code",)'))
    assert_one_line_error(invoke([*args, twice]), "speedup_vs_autoregressive@code",
                          "different tasks")
    assert spy.threads == []


def test_targets_are_the_issues_and_pass_as_stated():
    goals = {t.name: (t.key, t.at_least, t.within, t.tasks, t.heads) for t in TARGETS}
    assert goals == {
        "speedup_vs_hydra-mc_sim_7b_63": ("speedup_vs_hydra-mc_sim_7b_63", 1.15, None, None,
                                          "hydra"),
        "speedup_vs_medusa-mc_sim_7b_63": ("speedup_vs_medusa-mc_sim_7b_63", 1.36, None, None,
                                           "medusa"),
        "speedup_vs_best_static": ("speedup_vs_best_static", 1.0, None, None, None),
        "speedup_vs_autoregressive@math": ("speedup_vs_autoregressive", 1.5, None, ("math",),
                                           None),
        "speedup_vs_autoregressive@code": ("speedup_vs_autoregressive", 1.25, None, ("code",),
                                           None),
        "fraction_of_oracle": ("fraction_of_oracle", 0.90, None, None, None),
        "accept_length_ratio": ("accept_length_ratio", None, 0.01, None, None),
        "tokens_per_second_ratio": ("tokens_per_second_ratio", None, 0.10, None, None),
        "lossless": ("lossless", None, None, None, None),
    }
    at_least, within, flag = Target("a", "a", at_least=1.15), Target("b", "b", within=0.1), \
        Target("c", "c")
    assert at_least.passes(1.15) and not at_least.passes(1.149)
    assert within.passes(0.91) and within.passes(1.09) and not within.passes(1.11)
    assert not within.passes(0.89)
    assert flag.passes(True) and not flag.passes(False)
    for target in (at_least, within, flag):
        assert target.passes(None) is None and target.passes(float("nan")) is None


def load_results_table():
    """bench/results_table.py, the script that renders the results tables (README, docs/results)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "results_table.py"
    spec = importlib.util.spec_from_file_location("results_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_results_table(path: Path, report: dict) -> None:
    table = load_results_table()
    rows = {row["name"]: row for row in report["rows"]}
    rendered = table.table_rows(report)
    assert [cells[:2] for cells in rendered] == [[report["task"], "medusa"],
                                                 [report["task"], "hydra"]]
    for cells in rendered:
        kind = cells[1]
        cell = dict(zip(table.COLUMNS, cells, strict=True))
        entmtp, static = rows[f"entmtp[{kind}]"], rows[f"best-static[{kind}]"]
        assert cell["entmtp tok/s"] == f"{entmtp['tokens_per_second']:.2f}"
        reference = rows[f"{kind}-mc_sim_7b_63"]
        assert cell["mc_sim_7b_63 tok/s"] == f"{reference['tokens_per_second']:.2f}"
        assert cell["best static tok/s (nodes)"] == (
            f"{static['tokens_per_second']:.2f} ({static['num_nodes']})")
        low, high = entmtp["speedup_ci95"][f"best-static[{kind}]"]
        assert cell["vs best static [95% CI]"] == (
            f"{entmtp['tokens_per_second'] / static['tokens_per_second']:.2f}x "
            f"[{low:.2f}-{high:.2f}]")
        prediction = report["predictions"][kind]
        assert cell["replayed vs best static"] == (
            f"{prediction['replayed_speedup_vs_best_static']:.3f}")
        assert cell["AR meas/model"] == (
            f"{prediction['autoregressive_measured_over_modelled']:.3f}")
        assert cell["vs Hydra+mc_sim"] == f"{entmtp['speedup'][HYDRA_REF]:.2f}x"
        assert cell["lossless"] == "yes"
        targets = report["predictions"][kind]["targets"]
        missed = [key for key, check in targets.items() if check["pass"] is False]
        assert cell["targets missed"] == (", ".join(missed) or "none")
    text = table.markdown([(str(path), report)])
    assert text.startswith("| task | heads |")
    assert text.count("\n| ") == len(rendered)  # data rows; the rule below the header is "|---"
    assert report["machine"]["date"] in text and report["command"] in text
    for kind, sha in report.get("heads_sha256", {}).items():
        assert f"{kind} {sha[:12]}" in text


def test_drift_warning_names_the_way_and_the_fix():
    assert drift_warning(1.0) is None
    assert drift_warning(1.0 + 0.99 * DRIFT_LIMIT) is None
    assert drift_warning(None) is None and drift_warning(float("nan")) is None
    slow = drift_warning(0.8)
    assert "0.80x" in slow and "slower" in slow and "entmtp latency" in slow
    assert "entmtp retarget" in slow
    assert "faster" in drift_warning(1.3)


def test_a_bundle_timed_on_another_device_or_dtype_is_named_with_the_fix():
    from types import SimpleNamespace

    from entmtp.cli._live import latency_mismatch

    def bundle(**hardware):
        return SimpleNamespace(latency=SimpleNamespace(hardware=hardware))

    cpu_fp32 = torch.zeros(1)
    cpu_bf16 = torch.zeros(1, dtype=torch.bfloat16)
    meta_bf16 = torch.zeros(1, dtype=torch.bfloat16, device="meta")
    timed = bundle(kind="measured", device="cpu", dtype="float32")
    assert latency_mismatch(timed, cpu_fp32) is None
    text = latency_mismatch(timed, cpu_bf16)
    assert "float32 steps on cpu" in text and "bfloat16 on cpu" in text and "retarget" in text
    gpu = bundle(kind="measured", device="cuda:0", dtype="bfloat16")
    assert latency_mismatch(gpu, cpu_bf16) is not None
    assert "on meta" in latency_mismatch(gpu, meta_bf16)
    # untimed, synthetic or pre-field bundles: nothing to compare (files without a dtype
    # timed float32 on the CPU)
    assert latency_mismatch(SimpleNamespace(latency=None), cpu_bf16) is None
    assert latency_mismatch(bundle(kind="synthetic-gpu"), cpu_bf16) is None
    assert latency_mismatch(bundle(kind="measured"), cpu_fp32) is None


def test_step_time_table_shows_each_trees_drift_against_autoregressive_decoding():
    """drift = the tree's measured/modelled step time times autoregressive decoding's measured
    over modelled speed in the same run: 1 when the step moved with the machine."""
    from types import SimpleNamespace

    from rich.console import Console

    from entmtp.cli._bench import _step_time_table

    def tree(index, measured, modelled):
        return SimpleNamespace(tree=index, num_nodes=3, depth=1, steps=10, measured_ms=measured,
                               measured_iqr_ms=0.5, modelled_ms=modelled,
                               measured_over_modelled=measured / modelled)

    static = SimpleNamespace(row="best-static[medusa]", step_time_by_tree=[tree(0, 29.5, 29.3)])
    check = SimpleNamespace(row="entmtp[medusa]", step_time_by_tree=[tree(2, 30.7, 29.1)],
                            best_static=static, autoregressive_measured_over_modelled=0.936)
    console = Console(width=200, record=True)
    console.print(_step_time_table([check]))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if line.lstrip().startswith("row"))
    assert header.split()[-1] == "drift"
    by_row = {line.split()[0]: line.split() for line in lines if "[medusa]" in line}
    assert by_row["entmtp[medusa]"][-1] == f"{30.7 / 29.1 * 0.936:.3f}"
    assert by_row["best-static[medusa]"][-1] == f"{29.5 / 29.3 * 0.936:.3f}"


def test_a_bundle_timed_on_another_cpu_model_is_named_with_the_fix():
    from types import SimpleNamespace

    from entmtp.cli._live import cpu_mismatch
    from entmtp.core import CpuInfo

    def bundle(**hardware):
        return SimpleNamespace(latency=SimpleNamespace(hardware=hardware))

    xeon = bundle(kind="measured", device="cpu", cpu_name="Intel(R) Xeon(R) Processor",
                  cpu_signature="GenuineIntel family 6 model 167 stepping 1")
    epyc = CpuInfo(name="AMD EPYC", signature="AuthenticAMD family 25 model 17 stepping 1")
    text = cpu_mismatch(xeon, "cpu", epyc)
    assert "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167 stepping 1)" in text
    assert "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)" in text
    assert "entmtp latency" in text and "retarget" in text
    same_model = CpuInfo(name="Intel Xeon", signature="GenuineIntel family 6 model 167 stepping 4")
    assert cpu_mismatch(xeon, "cpu", same_model) is None  # another stepping of the same model
    # nothing to compare: a GPU run, a GPU-timed or untimed bundle, an unrecorded CPU
    assert cpu_mismatch(xeon, "cuda", epyc) is None
    assert cpu_mismatch(bundle(kind="measured", device="cuda:0", cpu_signature="x"), "cpu",
                        epyc) is None
    assert cpu_mismatch(SimpleNamespace(latency=None), "cpu", epyc) is None
    assert cpu_mismatch(bundle(kind="measured", device="cpu"), "cpu", epyc) is None
    assert cpu_mismatch(xeon, "cpu", CpuInfo(name="unknown", signature=None)) is None


def test_the_batch_sweep_writes_a_lossless_table_per_batch_size(two, tmp_path):
    """--batch-sizes: one table per size, plain decoding / batch-1 bundle / entmtp rows, every
    row lossless and its accept length the batched replay's; the JSON holds every size."""
    out = tmp_path / "sweep.json"
    result = invoke(["bench", "--model", two.model, "--heads", two.medusa_heads, "--data",
                     two.data, "--split", "all", "--bundle", two.medusa_run, "--prompts", 4,
                     "--max-new-tokens", 10, "--batch-sizes", "1,3", "--threads", 1,
                     "--json", out])
    assert result.exit_code == 0, result.output
    assert "batch size 1 (4 batches)" in result.output
    assert "batch size 3 (2 batches)" in result.output
    report = json.loads(out.read_text())
    assert [at["batch_size"] for at in report["sweep"]] == [1, 3]
    for at in report["sweep"]:
        assert [row["name"] for row in at["rows"]] == ["autoregressive", "batch-1 bundle",
                                                       "entmtp"]
        for row in at["rows"]:
            assert row["lossless"]
            assert row["accept_over_predicted"] == pytest.approx(1.0, abs=0.01)
    assert not any("accept length" in line or "not lossless" in line
                   for line in report["findings"])


def test_the_batch_sweep_refuses_in_one_line_what_it_cannot_run(two, tmp_path):
    args = [*bench_args(two), "--prompts", 2, "--max-new-tokens", 4]
    assert_one_line_error(invoke([*args, "--bundle", two.medusa_run, "--bundle", two.hydra_run,
                                  "--batch-sizes", "1,2"]), "one bundle")
    assert_one_line_error(invoke([*args, "--bundle", two.medusa_run, "--batch-sizes", "0,2"]),
                          "--batch-sizes")
    assert_one_line_error(invoke([*args, "--bundle", two.medusa_run, "--batch-sizes", "2",
                                  "--batch-size", "2"]), "--batch-size")
    assert_one_line_error(invoke([*args, "--bundle", two.medusa_run, "--batch-size", "2",
                                  "--plot", tmp_path / "x.png"]), "--plot")
