"""`entmtp demo`: the whole offline search on a synthetic profile, no model needed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from entmtp.treesearch import LatencyModel, Profile, SearchSettings, synthetic_profile

from ._errors import user_errors
from ._model_setup import FORCE_OPTION
from ._runs import RunDir, check_run_outputs, removed_on_failure, search_stage
from .app import app

SYNTHETIC_MODEL = "synthetic"  # the model name a demo profile carries


@app.command()
@user_errors
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Run folder to write."),
    seed: int = typer.Option(0, "--seed"),
    schedule_trials: int = typer.Option(100, "--schedule-trials"),
    latency: str = typer.Option("cpu", "--latency", help="Synthetic latency: cpu or gpu."),
    force: bool = FORCE_OPTION,
) -> None:
    """Search trees and an entropy schedule on a synthetic regime-switching profile.

    Example: entmtp demo --out runs/demo && entmtp pareto runs/demo --plot runs/demo/pareto.png
    """
    from entmtp.treesearch import EntmtpError

    if latency not in ("cpu", "gpu"):
        raise EntmtpError(f"--latency {latency!r}: use cpu or gpu")
    if seed < 0:
        raise EntmtpError(f"--seed {seed}: use a seed of 0 or more")
    if schedule_trials < 1:
        raise EntmtpError(f"--schedule-trials {schedule_trials}: use 1 or more")
    console = Console()
    run = RunDir(out)
    check_demo_folder(run)
    check_run_outputs(run)
    with removed_on_failure(run.root):  # a half-made demo run helps nobody
        try:
            run.root.mkdir(parents=True, exist_ok=True)
            if not run.profile.exists():
                profile = synthetic_profile(seed=seed)
                # A synthetic profile has no model: mark it so the bundle cannot pass for a
                # real one.
                profile.meta.model, profile.meta.vocab_size, profile.meta.hidden_size = (
                    SYNTHETIC_MODEL, 1, 1)
                profile.save(run.profile)
            model = LatencyModel.cpu_like() if latency == "cpu" else LatencyModel.gpu_like()
            if not run.latency.exists() or LatencyModel.load(run.latency) != model:
                model.save(run.latency)
            settings = SearchSettings(schedule_trials=schedule_trials, seed=seed)
            search_stage(run, settings, console=console, task="synthetic")
        except OSError as err:
            raise EntmtpError(f"cannot write the demo run {run.root}: {err.strerror or err}: "
                              "choose a writable --out") from err
    console.print(f"wrote {run.bundle} and {run.report}")


def check_demo_folder(run: RunDir) -> None:
    """``--out`` must be a new folder or an earlier demo run: never a real calibration run."""
    from entmtp.treesearch import EntmtpError

    if run.root.is_symlink() or (run.root.exists() and not run.root.is_dir()):
        raise EntmtpError(f"--out {run.root} exists and is not a folder: choose a new folder")
    if not run.root.exists():
        return
    if run.profile.exists():
        made_by = Profile.load(run.profile).meta.model
        if made_by != SYNTHETIC_MODEL:
            raise EntmtpError(f"--out {run.root} is a calibration run of {made_by}: demo writes "
                              "only synthetic runs; choose a new folder")
    if run.latency.exists():
        kind = LatencyModel.load(run.latency).hardware.get("kind", "")
        if not str(kind).startswith("synthetic"):
            raise EntmtpError(f"--out {run.root} holds a measured latency.json: demo would "
                              "overwrite it with a synthetic one; choose a new folder")
