"""Hints that name the right fix: pareto, show-tree and export take a run folder or a bundle,
and what they refuse (a folder of bundles, a shipped profile, a bare bundle, a profile the
export needs) says what to give instead, never a folder entmtp ships as an output."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entmtp.calibrate import demo_run
from entmtp.cli.app import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
MEDUSA = "trees/bundles/code-medusa-cpu2.json"
HYDRA = "trees/bundles/code-hydra-cpu2.json"


@pytest.fixture(autouse=True)
def in_the_repository(monkeypatch):
    """Paths as a user of a clone types them (trees/...); nothing here writes into it."""
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    return demo_run(tmp_path_factory.mktemp("run") / "code", schedule_trials=10).root


def refused(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("entmtp: error: "), result.output
    assert not re.search(r"--out \S*trees", lines[0]), lines[0]  # never a shipped output
    return lines[0]


# -- pareto -----------------------------------------------------------------------------------
def test_pareto_of_the_shipped_bundles_folder_asks_for_one_of_them():
    line = refused("pareto", "trees/bundles")
    assert "trees/bundles holds bundles, not a calibration run" in line
    assert "trees/bundles/" in line and "entmtp bundles" in line


def test_pareto_of_a_shipped_profile_says_to_retarget_it_into_a_run_of_ones_own():
    line = refused("pareto", "trees/profiles/code-medusa")
    assert "holds a profile and its search settings, not a searched front" in line
    assert "`entmtp retarget trees/profiles/code-medusa --latency LATENCY.json --out runs/NAME`" \
        in line
    assert "delete" not in line


def test_pareto_of_a_shipped_bundle_names_its_profile_and_latency_file():
    line = refused("pareto", MEDUSA)
    assert "is a bundle without its run folder" in line
    assert ("`entmtp retarget trees/profiles/code-medusa --latency "
            "trees/latency/cpu2-medusa-smollm2-135m.json --out runs/code-medusa-cpu2`, then "
            "`entmtp pareto runs/code-medusa-cpu2`") in line
    assert f"`entmtp show-tree {MEDUSA} --out tree.png`" in line


def test_pareto_of_another_shipped_folder_calibrates_elsewhere():
    line = refused("pareto", "trees/latency")
    assert "ships with entmtp" in line and "--out runs/NAME" in line


def test_pareto_of_a_missing_folder_names_the_run_to_make(tmp_path):
    line = refused("pareto", str(tmp_path / "code"))
    assert line.endswith(f"run `entmtp calibrate --out {tmp_path / 'code'}`")


def test_pareto_takes_a_runs_bundle_as_the_run(finished_run):
    result = runner.invoke(app, ["pareto", str(finished_run / "bundle.json")])
    assert result.exit_code == 0, result.output
    assert "Pareto front" in result.output


def test_pareto_of_a_file_that_is_no_bundle(finished_run):
    line = refused("pareto", str(finished_run / "report.md"))
    assert "is a file, not a run folder or a bundle" in line


# -- show-tree --------------------------------------------------------------------------------
def test_show_tree_takes_a_run_folder(finished_run, tmp_path):
    out = tmp_path / "tree.png"
    result = runner.invoke(app, ["show-tree", str(finished_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_show_tree_of_folders_without_a_bundle(tmp_path):
    plot = str(tmp_path / "t.png")
    assert "holds bundles" in refused("show-tree", "trees/bundles", "--out", plot)
    line = refused("show-tree", "trees/profiles/code-medusa", "--out", plot)
    assert "is a shipped profile, not a run: give a bundle searched from it (e.g. " \
           "trees/bundles/code-medusa-" in line
    assert not (tmp_path / "t.png").exists()


# -- export -----------------------------------------------------------------------------------
def test_vllm_chain_of_a_shipped_bundle_names_its_shipped_profile(tmp_path):
    out = tmp_path / "chain.yaml"
    line = refused("export", MEDUSA, "--format", "vllm-chain", "--out", str(out))
    assert line.endswith("give --profile trees/profiles/code-medusa/profile.npz (the shipped "
                         "profile it was searched on)")
    # and that profile is the one it takes
    result = runner.invoke(app, ["export", MEDUSA, "--format", "vllm-chain", "--out", str(out),
                                 "--profile", "trees/profiles/code-medusa/profile.npz"])
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_a_bundle_without_a_shipped_profile_asks_for_the_run_folder(finished_run, tmp_path):
    line = refused("export", str(finished_run / "bundle.json"), "--format", "vllm-chain",
                   "--out", str(tmp_path / "c.yaml"))
    assert line.endswith("give the run folder (with profile.npz) or --profile PROFILE.npz")


@pytest.mark.parametrize("fmt, runtime", [("trtllm", "TensorRT-LLM"),
                                          ("medusa", "FasterDecoding/Medusa")])
def test_a_hydra_bundle_in_a_medusa_runtime_format_says_it_has_no_hydra_heads(
        fmt, runtime, tmp_path):
    out = tmp_path / "tree.json"
    result = runner.invoke(app, ["export", HYDRA, "--format", fmt, "--out", str(out)])
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if line.startswith("entmtp: warning")]
    assert warning == [f"entmtp: warning: {runtime} has no Hydra heads, only Medusa heads: this "
                       "tree was chosen for Hydra heads' acceptance, not for the Medusa heads it "
                       f"would draft with there; export a medusa bundle for {runtime} (`entmtp "
                       "bundles` lists them)"]
    assert out.is_file()
    medusa = runner.invoke(app, ["export", MEDUSA, "--format", fmt, "--out", str(out)])
    assert medusa.exit_code == 0 and "warning" not in medusa.output


def test_export_of_shipped_folders_never_calibrates_into_them(tmp_path):
    out = str(tmp_path / "x.json")
    assert "holds bundles" in refused("export", "trees/bundles", "--out", out)
    line = refused("export", "trees/profiles/code-medusa", "--out", out)
    assert "--out runs/code-medusa`" in line
    assert "ships with entmtp" in refused("export", "trees/latency", "--out", out)


def test_export_of_an_empty_folder_calibrates_into_it(tmp_path):
    line = refused("export", str(tmp_path), "--out", str(tmp_path / "x.json"))
    assert line.endswith(f"has no bundle.json: run `entmtp calibrate --out {tmp_path}`")


def test_a_mistyped_bundle_gets_the_close_name(tmp_path):
    line = refused("export", "trees/bundles/code-medusa-cpu3.json", "--out",
                   str(tmp_path / "x.json"))
    assert "(did you mean trees/bundles/code-medusa-cpu2.json?)" in line


def test_a_copied_shipped_profile_is_no_longer_shipped(tmp_path):
    """Outside trees/ a profile folder is the user's: the hint retargets it all the same."""
    folder = tmp_path / "code-medusa"
    shutil.copytree(REPO / "trees/profiles/code-medusa", folder)
    line = refused("pareto", str(folder))
    assert f"`entmtp retarget {folder} --latency LATENCY.json --out runs/NAME`" in line


# -- retarget ---------------------------------------------------------------------------------
def test_retarget_of_a_shipped_profile_writes_under_runs_by_default(tmp_path, monkeypatch):
    """Not beside the shipped profile (trees/profiles/code-medusa-<hardware>): the search is
    stood in for by copying the bundle it makes."""
    def search(run, settings, **_):
        shutil.copy(REPO / MEDUSA, run.bundle)
        run.report.write_text("report\n")

    monkeypatch.setattr("entmtp.calibrate._pipeline.search_stage", search)
    monkeypatch.chdir(tmp_path)
    latency = REPO / "trees/latency/cpu2-medusa-smollm2-135m.json"
    result = runner.invoke(app, ["retarget", str(REPO / "trees/profiles/code-medusa"),
                                 "--latency", str(latency)])
    assert result.exit_code == 0, result.output
    made = list((tmp_path / "runs").glob("code-medusa-*/bundle.json"))
    assert len(made) == 1
    assert not list((REPO / "trees/profiles").glob("code-medusa-*"))


def test_retarget_hints_never_calibrate_into_shipped_folders():
    latency = "trees/latency/cpu2-medusa-smollm2-135m.json"
    line = refused("retarget", "trees/bundles", "--latency", latency)
    assert "ships with entmtp" in line
    line = refused("retarget", MEDUSA, "--latency", latency)
    assert "retarget the shipped profile it was searched on instead (`entmtp retarget " \
           "trees/profiles/TASK-TYPE --latency FILE --out runs/NAME`)" in line
