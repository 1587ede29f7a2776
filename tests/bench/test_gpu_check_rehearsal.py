"""bench/gpu_rehearsal.py (`bench/gpu_check.sh rehearse`), offline: a rehearsed device call
holds only what the call sends, runs with the rehearsal's Python and none of this machine's, is
refused when the device tool would refuse it, and the stages' artefacts are checked in what the
calls bring back. The whole rehearsal (minutes, a venv) is not run here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from support import load_bench_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rehearsal():
    return load_bench_script("gpu_rehearsal")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def workspace(tmp_path) -> dict:
    """An operator's checkout after `prepare` and `lean`: the heads ignored, parts in .gpu/."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    checkout = tmp_path / "checkout"
    files = {"bench/gpu_check.sh": "script", "README.md": "top", "notes.txt": "untracked",
             "trees/heads/a/heads.safetensors": "weights", ".gpu/part1/model.part-00": "one",
             ".gpu/part2/model.part-01": "two", "runs/scratch.json": "ignored"}
    for path, text in files.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    git(checkout, "init", "-q")
    (checkout / ".gitignore").write_text("/runs/\n")
    git(checkout, "add", "bench", "README.md", ".gitignore")
    git(checkout, "commit", "-q", "-m", "init")
    (checkout / ".git" / "info" / "exclude").write_text("/.gpu/\n/trees/heads/\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    workdir = tmp_path / "work"
    (workdir / "logs").mkdir(parents=True)
    return {"checkout": checkout, "venv": venv, "workdir": workdir}


def listing_call(rehearsal, *carry: str):
    """A device call that lists what it finds, and its environment, under $OUT."""
    command = ('find . -type f | sort > "$OUT/files.txt"; '
               'printf "%s\\n" "$PATH" "${VIRTUAL_ENV:-none}" "$DRY_RUN" "$DEVICE" '
               '"$HF_HUB_OFFLINE" "$STAGE" > "$OUT/env.txt"')
    return rehearsal.gpu_plan.Call(command, carry, 60)


def test_a_device_call_holds_what_it_sends_and_nothing_else(rehearsal, workspace):
    checkout, workdir, venv = workspace["checkout"], workspace["workdir"], workspace["venv"]
    outcome = rehearsal.device_call(listing_call(rehearsal, ".gpu/part1", "trees/heads"), 2,
                                    checkout, workdir, venv)
    assert outcome.returncode == 0, outcome.log.read_text()
    found = (workdir / "out" / "call2" / "files.txt").read_text().split()
    assert found == ["./.gitignore", "./.gpu/part1/model.part-00", "./README.md",
                     "./bench/gpu_check.sh", "./notes.txt", "./trees/heads/a/heads.safetensors"]
    path, virtual_env, dry_run, device, offline, stage = (
        (workdir / "out" / "call2" / "env.txt").read_text().splitlines())
    assert path.split(":")[0] == str(venv / "bin")
    assert str(ROOT / ".venv" / "bin") not in path.split(":")
    assert (virtual_env, dry_run, device, offline) == ("none", "1", "cpu", "1")
    assert Path(stage).is_relative_to(workdir)  # the device's /tmp: kept from call to call

    # the next call starts from a fresh folder: what the first carried is gone
    outcome = rehearsal.device_call(listing_call(rehearsal, ".gpu/part2"), 3, checkout,
                                    workdir, venv)
    found = (workdir / "out" / "call3" / "files.txt").read_text().split()
    assert "./.gpu/part2/model.part-01" in found
    assert not any(f.startswith(("./trees/heads", "./.gpu/part1")) for f in found)


def test_a_call_is_refused_where_the_device_tool_refuses_it(rehearsal, workspace, monkeypatch):
    checkout, workdir, venv = workspace["checkout"], workspace["workdir"], workspace["venv"]
    outcome = rehearsal.device_call(listing_call(rehearsal, ".gpu/part9"), 1, checkout,
                                    workdir, venv)
    assert outcome.returncode == 2 and ".gpu/part9" in outcome.log.read_text()
    monkeypatch.setattr(rehearsal, "CALL_BYTES", 20)  # the checkout alone is more
    outcome = rehearsal.device_call(listing_call(rehearsal, ".gpu/part1"), 1, checkout,
                                    workdir, venv)
    assert outcome.returncode == 2 and "at most 20" in outcome.log.read_text()
    assert not (workdir / "out" / "call1" / "files.txt").exists()


def test_the_artefacts_are_checked_in_what_came_back(rehearsal, tmp_path):
    results = tmp_path / "stage" / "results"
    for path in ("selftest.json", "latency/medusa.json", "latency/hydra.json",
                 "latency/curves.png", "runs/code-medusa/bundle.json", "static_check.json"):
        (results / path).parent.mkdir(parents=True, exist_ok=True)
        (results / path).write_text("{}")
    out = tmp_path / "out" / "call2"
    out.mkdir(parents=True)
    with tarfile.open(out / "gpu-check-first.tgz", "w:gz") as tar:
        tar.add(results, arcname="results")
    returned = rehearsal.returned_results(tmp_path)
    assert set(returned) == {"first"}
    absent = rehearsal.missing_artefacts(returned, ROOT)
    assert absent["retarget"] == ["runs/code-hydra/bundle.json"]
    assert "selftest" not in absent and "latency" not in absent
    # `run` brought nothing back: all of its stages' artefacts are missing
    assert absent["bench"] == ["bench/code.json", "bench/code.png", "bench/summary.txt"]
    assert absent["low-precision"] == ["low-precision.json"]


def test_the_venv_installs_from_the_local_sources_pip_names(rehearsal, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    listed = (f"global.extra-index-url='https://example.invalid/simple "
              f"file:///mirror/simple file:///more/simple'\n"
              f"global.find-links='{wheels}'\n:env:.find-links='{wheels}'\n"
              f"global.index-url='https://example.invalid/simple'\n"
              f"global.find-links='/no/such/folder'\n")
    assert rehearsal.pip_sources(listed) == [
        "--index-url", "file:///mirror/simple", "--extra-index-url", "file:///more/simple",
        "--find-links", str(wheels)]
    assert rehearsal.pip_sources(f"global.find-links='{wheels}'\n") == [
        "--no-index", "--find-links", str(wheels)]
    assert rehearsal.pip_sources("global.cert='/etc/ssl/cert.pem'\n") == []  # pip's index


def test_the_rehearsal_runs_every_stage_small_and_without_a_deadline(rehearsal):
    sizes = rehearsal.SIZES
    assert sizes["DRY_RUN"] == "1" and sizes["DEVICE"] == "cpu"
    assert set(sizes["HEAD_TYPES"].split()) == {"medusa", "hydra"}
    for task in sizes["TASKS"].split():
        for head_type in sizes["HEAD_TYPES"].split():
            assert (ROOT / "trees" / "profiles" / f"{task}-{head_type}").is_dir()
    script = (ROOT / "bench" / "gpu_check.sh").read_text()
    for knob in sizes:  # every knob is one the script reads
        assert f"{knob}=${{{knob}:-" in script or f"${{{knob}:-}}" in script, knob


def test_the_rehearsal_is_a_mode_of_the_script():
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "rehearse", "--help"],
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr
    assert "--workdir" in run.stdout and "--fresh-venv" in run.stdout
